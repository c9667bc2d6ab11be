"""The central trust model: a trusted server. Each user sends its clipped data as its mechanisms' mean (unbiased:
the server's estimator is unchanged), and the server adds each mechanism's central twin's noise once to the
round's aggregate, calibrated to one user's contribution at the run's (eps, delta) (ldpfed.mechanisms.central).
The algorithm is the same class, at the same budget; its confidence widths and shifts still assume the local
noise, which is larger: they are conservative, not wrong.

Under a federation model (ldpfed.federation) a user's message is in exactly one round's aggregate: its own, or the
one it arrives in when late (or none: absent, lost). The noise is calibrated to one user's contribution to one
aggregate, so each user's guarantee is the same whatever the number of users in the round; the summary's
`users_in_aggregates` counts the messages really folded."""
from __future__ import annotations

import numpy as np

from ldpfed.mechanisms.central import central_twin
from ldpfed.mechanisms.noise import FieldNoise
from ldpfed.trust.base import TrustModel
from ldpfed.trust.shuffle import compiled_refusal, void_refusal

CENTRAL_SCOPE = ("central trust model: the user's clipped data goes to a trusted server, which adds this noise once "
                 "to the round's aggregate, calibrated to one user's contribution; each user is in one round's "
                 "aggregate (parallel composition over the rounds)")


def around_steps_refusal(algo, what: str) -> str | None:
    """Why a model that moves the noise away from the users cannot run the algorithm: it must be local-DP, claim a
    guarantee, be written once (its clipped rows are what a user sends; the model works around its steps) and,
    when it weighs or folds its rows, say which aggregate field carries which message field (`central_sources`)."""
    if algo.privacy_model != "ldp":
        return (f"it is not a local-DP algorithm (privacy model {algo.privacy_model!r}): there is no local "
                f"randomizer to {what}")
    why = void_refusal(algo, what) or compiled_refusal(algo, f"the model adds its noise around them")
    if why:
        return why
    if algo.central_sources() is None:
        return ("it weighs or folds its rows into its aggregate without saying which aggregate field carries which "
                "message field, and with what public weight (central_sources)")
    return None


def central_twins(algo) -> dict:
    """{message field: the central twin of its mechanism} (ldpfed.mechanisms.central)."""
    declared = algo._fields or {}
    return {key: central_twin(f.mechanism, f.shape) for key, f in declared.items() if f.mechanism is not None}


class CentralTrust(TrustModel):
    """A trusted server adds each mechanism's central twin's noise once to a round's aggregate (module doc)."""

    name = "central"
    about = "a trusted server gets the users' clipped data and adds the noise once to each round's sum, at --eps/--delta"
    noise_at = "server"
    server_view = "aggregate"

    def refusal(self, algo) -> str | None:
        return around_steps_refusal(algo, "move to the server")

    def attach(self, algo) -> None:
        algo.central = central_twins(algo)

    # ---- the noise protocol ----------------------------------------------------------------------------------------
    def client_rows(self, algo, inputs, users, rng):
        """Each private field's clipped data as its mechanism's mean (ldpfed.mechanisms.central); public fields as
        they are. No random number is drawn."""
        layout, n = algo.layout(), inputs.shape[0]
        rows = np.array(inputs, dtype=float, copy=True)
        for key, twin in algo.central.items():
            part = layout.slices[key]
            rows[:, part] = twin.mean(inputs[:, part].reshape(n, *layout.shapes[key])).reshape(n, -1)
        return rows

    def server_noise(self, algo, sums, start, stop, rng):
        """Each aggregate field that carries a private message field gets that field's twin's noise on the entries
        users can touch (central_touched), scaled by the users' largest public weight on each entry."""
        layout, aggregate = algo.layout(), algo.sum_layout()
        weights = algo.round_weights(start, stop)[0] if algo.weighs() else None
        touched = algo.central_touched(sums, start, stop)
        noise = np.zeros(aggregate.width)
        for target, source in algo.central_sources().items():
            twin = algo.central.get(source)
            if twin is None:        # a public field: nothing to hide
                continue
            shape = aggregate.shapes[target]
            weight = 1.0 if weights is None else weights[layout.slices[source]].reshape(shape)
            noise[aggregate.slices[target]] = (twin.draw(rng, shape, weight) * touched[target]).reshape(-1)
        return noise

    def field_domain(self, algo, key, declared):
        """What a user sends is its mechanism's mean: the twin's output domain."""
        twin = (algo.central or {}).get(key)
        if twin is None:
            return None
        return twin.output_domain(declared.shape, declared.data_bound, **declared.schedule)

    def noise(self, algo) -> dict:
        """Each field's noise, added once per round by the server (the twin's), on the entries users can touch."""
        if algo.central is None:       # asked while build() derives the twins (from setup(), consts(), ...)
            raise RuntimeError(f"{algo.name}: field_noise() is known once the trust model has built the algorithm; "
                               f"read it in initial_state() or update(), not in setup() or consts()")
        found = {}
        for key, twin in algo.central.items():
            variance = twin.scale ** 2 if twin.noise == "gaussian" else 2.0 * twin.scale ** 2
            found[key] = FieldNoise(twin.noise, variance, "round", "touched")
        return found

    # ---- accounting ------------------------------------------------------------------------------------------------
    def noise_makers(self, algo) -> dict:
        """The same per-user budget, spent by the server's noise (the twins) on each round's sum."""
        return algo.central

    def label_rows(self, algo, rows):
        return [{**row, "trust": self.name, "scope": CENTRAL_SCOPE} for row in rows]

    def describe(self, s: dict, config) -> str:
        return (f"privacy (central): clipped data to a trusted server, which adds the noise once per round of up "
                f"to {config.round_size:,} users (each user's data in one round's aggregate, whoever else is there); "
                f"each user's guarantee (eps, delta) = ({s['privacy_eps_composed']:.6g}, "
                f"{s['privacy_delta_composed']:.3g})")
