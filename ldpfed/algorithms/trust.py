"""Trust models: where the noise goes, not a different algorithm.

* "local" (the papers): no one is trusted; each user privatizes its message with the run's (eps, delta).
* "shuffle": each user still privatizes locally, and an anonymizing shuffler mixes each round's messages before the
  server sees them, which amplifies privacy (ldpfed.mechanisms.shuffle: Feldman, McMillan, Talwar, FOCS 2021).
  `--eps`/`--delta` are then the target of the shuffled batch, and the users' randomizers run at the largest eps0
  whose amplified guarantee at the batch size (users per round; the run's smallest round) meets it. The algorithm
  is the same class, built at that local budget (eps0, delta0).

For randomizers that are pure eps0-LDP (every ledger row has delta = 0: the l2-ball, randomized response, Laplace)
the pure bound applies at the whole delta. For approximate (eps0, delta0) randomizers (the Gaussian mechanisms)
FMT's Theorem 3.8 adds (e^eps + 1)(1 + e^-eps0 / 2) n delta0 to delta: half of delta goes to the pure bound, and
delta0 is chosen so that the added term is at most the other half whatever eps0 (e^eps <= e^target and
1 + e^-eps0 / 2 <= 1.5).

* "central": a trusted server. Each user sends its clipped data as its mechanisms' mean (unbiased: the server's
  estimator is unchanged), and the server adds each mechanism's central twin's noise once to the round's aggregate,
  calibrated to one user's contribution at the run's (eps, delta) (ldpfed.mechanisms.central). The algorithm is the
  same class, at the same budget; its confidence widths and shifts still assume the local noise, which is larger:
  they are conservative, not wrong.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np

from ldpfed.algorithms.shuffling import smallest_groups, smallest_share
from ldpfed.mechanisms import accounting, shuffle
from ldpfed.mechanisms.central import central_twin
from ldpfed.plugins import TRUST_GROUP, Registry
from ldpfed.util.errors import ConfigError

SHUFFLE_BOUND = "numerical"       # FMT's numerical bound: the tighter of their two (shuffle.BOUNDS)
# A batch "too small to amplify": its eps0 is less than 5% above the target (shuffling any batch never hurts, so
# eps0 = eps always meets the target; below this gain the run is the local one with a shuffler in the way).
MIN_GAIN = 1.05


@dataclass(frozen=True)
class ShufflePlan:
    """The local budget of a shuffled run and what it buys. A user is hidden only among the users of its shuffler's
    share that run the same randomizer (`Algorithm.randomizer_groups`): the worst-off user is in the smallest such
    group of the run, so eps0 is the largest its group size amplifies to the target."""

    eps0: float            # each user's local randomizer (the algorithm's eps)
    delta0: float          # its delta (0: pure randomizers)
    batch: int             # the smallest randomizer group of any round's share: the worst user's anonymity set
    delta_pure: float      # the part of the target delta spent in the pure bound
    bound: str
    largest: int = 0       # the largest group any user is shuffled in (FMT Thm 3.8's added delta grows with it)
    smallest_round: int = 0                 # the first round whose smallest group is `batch`
    group_runs: tuple = ()                  # (first round, last round, smallest group) for runs of equal rounds
    amplifies: bool = True                  # False: the smallest group amplifies nothing, eps0 is the target

    def amplified(self, eps0: float, delta0: float, n: int | None = None) -> shuffle.Amplified:
        """The guarantee of the worst-off user (a group of n, by default the run's smallest) for (eps0, delta0)-LDP
        messages (the ledger's composed local guarantee). Its delta charges FMT Thm 3.8's term at the largest
        group, which bounds it for every group."""
        n = self.batch if n is None else int(n)
        pure = shuffle.amplify(eps0, n, self.delta_pure, bound=self.bound)
        largest = max(self.largest, n)
        delta = self.delta_pure + (math.exp(pure.eps) + 1.0) * (1.0 + math.exp(-eps0) / 2.0) * largest * delta0
        what = (f"({eps0:g}, {delta0:g})-LDP messages" if delta0 else f"eps0 = {eps0:g}-LDP messages")
        reason = (f"shuffle: the smallest group of users on one randomizer in a shuffler's share is n = {n} {what} "
                  f"(round {self.smallest_round}), {pure.reason.split(' messages, ', 1)[-1].split(';')[0]}; "
                  f"each user sends one message in one batch, so the run's guarantee is its worst user's")
        return shuffle.Amplified(pure.eps, delta, float(eps0), float(delta0), n, self.bound, reason)


def smallest_batch(config) -> int:
    """The fewest users a shuffler mixes: each of the S shufflers mixes its share of a round
    (ldpfed.algorithms.shuffling), so the batch every user is shuffled in is at least the smallest share of the run's
    smallest round (the last one may be short). Users on different randomizers split it further (`shuffle_plan`)."""
    last = config.users - (config.rounds - 1) * config.round_size
    return smallest_share(min(config.round_size, last), config.shufflers)


def _runs(values: np.ndarray) -> tuple:
    """(first, last, value) for each run of equal consecutive values."""
    cuts = np.flatnonzero(np.diff(values)) + 1
    starts, ends = np.concatenate([[0], cuts]), np.concatenate([cuts - 1, [len(values) - 1]])
    return tuple((int(a), int(b), int(values[a])) for a, b in zip(starts, ends))


def shuffle_plan(config, pure: bool, algo=None) -> ShufflePlan:
    """The largest local eps0 (and its delta0) whose worst-off user meets the run's (eps, delta): the user in the
    smallest randomizer group of any round's shuffler share (`algo.randomizer_groups`; without `algo`, every user
    of a round on one randomizer). When that group amplifies too little, `config.small_groups` decides: "refuse"
    (ConfigError naming the algorithm, the round and the group size) or "no-amplification" (eps0 = the target:
    the run's guarantee is the local one, the shuffler changes nothing)."""
    if algo is None:
        smallest = largest = np.full(config.rounds, smallest_batch(config), dtype=np.int64)
    else:
        try:
            smallest, largest = smallest_groups(algo, config.users, config.round_size, config.shufflers)
        except NotImplementedError as error:
            raise ConfigError("trust", "shuffle", f"{error}; the shuffle trust model must know which users a "
                                                  f"shuffled server can tell apart") from None
    r = int(np.argmin(smallest))
    n, top = int(smallest[r]), int(largest.max())
    split = n < smallest_batch(config)      # the schedule, not the round size, made the group small
    base = dict(batch=n, bound=SHUFFLE_BOUND, largest=top, smallest_round=r, group_runs=_runs(smallest))
    delta_pure = config.delta if pure else config.delta / 2.0
    delta0 = 0.0 if pure else (config.delta / 2.0) / ((math.exp(config.eps) + 1.0) * 1.5 * top)

    def too_small(why: str) -> ShufflePlan:
        if config.small_groups == "no-amplification":
            return ShufflePlan(float(config.eps), 0.0 if pure else float(config.delta), delta_pure=config.delta,
                               amplifies=False, **base)
        name = getattr(algo, "name", config.algorithm)
        if split:
            raise ConfigError("small_groups", config.small_groups,
                              f"{name}: round {r} has a group of {n} user{'s' if n != 1 else ''} that the public "
                              f"schedule sets apart from the rest of its batch (a shuffled server tells their "
                              f"messages apart, so only users on the same randomizer hide each other): {why}; "
                              f"--small-groups no-amplification runs every user at the target eps unamplified")
        batch = f"{n} users" if config.shufflers == 1 else \
            f"{n} users (a round split among {config.shufflers} shufflers)"
        fewer = "" if config.shufflers == 1 else " or lower --shufflers"
        raise ConfigError("round_size", config.round_size, f"{name}: round {r}: a shuffled batch of {batch} {why}; "
                                                           f"raise --round-size (or --users){fewer}, or --eps")

    if n < 2:
        return too_small("a batch needs at least 2 users to hide a user among others")
    try:
        eps0 = shuffle.largest_eps0(config.eps, n, delta_pure, bound=SHUFFLE_BOUND)
    except ConfigError as error:
        return too_small(f"cannot reach eps = {config.eps:g} at delta = {config.delta:g} ({error.reason})")
    if eps0 < MIN_GAIN * config.eps:
        return too_small(f"amplifies too little at eps = {config.eps:g}, delta = {config.delta:g}: its largest "
                         f"local eps0 is {eps0:.4g} (less than {MIN_GAIN:g} x eps)")
    return ShufflePlan(eps0, delta0, delta_pure=delta_pure, **base)


def local_config(config, cls, world):
    """Under the shuffle model: (the config the algorithm is built with, the shuffle plan). The algorithm is first
    built at the target to learn whether its randomizers are pure and how a round's users split into randomizer
    groups, then at its local budget (ShuffleTrust.build)."""
    probe = cls(world, config)
    rows = probe.ledger()
    refuse_void(probe, rows, "amplify")
    plan = shuffle_plan(config, pure=all(float(row["delta"]) == 0.0 for row in rows), algo=probe)
    local = config.replace(eps=plan.eps0, delta=plan.delta0 if plan.delta0 else config.delta, trust="local",
                           shufflers=1, small_groups="refuse")
    return local, plan


def check_shuffled(algo) -> None:
    """Under the shuffle model: the server sees each round's messages as a multiset, so the algorithm must be written
    once (its aggregate is then a sum or a fold of the rows) and weigh each row by a public scaling only, which
    the server applies as the round's mean (CompiledAlgorithm.anonymous_sums). ConfigError naming trust otherwise,
    e.g. for the BCO reductions, whose weighted sum multiplies two entries of a message."""
    compiled_steps = getattr(algo, "compiled_steps", None)
    if compiled_steps is None or compiled_steps() is None:
        raise ConfigError("trust", "shuffle", f"{algo.name} is not written as compiled steps "
                                              f"(ldpfed.algorithms.compiled): its aggregate may use who sent what")
    if algo.anonymous_sums():
        weigh, consts, width = algo.steps().weigh, algo.compiled_consts(), algo.layout().width
        for user in (0, max(algo.T - 1, 0)):
            ones, twos = np.ones(width), np.full(width, 2.0)
            weigh(consts, user, ones)
            weigh(consts, user, twos)
            if not np.allclose(twos, 2.0 * ones, rtol=1e-12, atol=0.0):
                raise ConfigError("trust", "shuffle", f"{algo.name} weighs a message by a function of its content "
                                                      f"(not a public scaling): a shuffled server, which cannot "
                                                      f"tell who sent what, cannot apply it")
    # the shuffled server folds with no user index (ldpfed.algorithms.shuffling.UNKNOWN_USER)
    if algo.steps().fold is not None:
        ones = algo.layout().split(np.ones((1, algo.layout().width)))
        sums = [algo.aggregate(ones, np.array([user], dtype=np.int64)) for user in (0, 1, max(algo.T - 1, 0))]
        if any(not all(np.array_equal(other[key], sums[0][key]) for key in sums[0]) for other in sums[1:]):
            raise ConfigError("trust", "shuffle", f"{algo.name} folds a message by its user's index, which a "
                                                  f"shuffled server does not know")


def refuse_void(algo, rows, what: str) -> None:
    """ConfigError naming trust when the algorithm's ledger voids its own claim (nothing to `what`)."""
    if any(row.get("claim_void") for row in rows):
        raise ConfigError("trust", algo.config.trust, f"{algo.name} under profile {algo.config.profile!r} claims no "
                                                      f"guarantee (its ledger is void): nothing to {what}")


def central_twins(algo) -> dict:
    """Under the central trust model: {message field: the central twin of its mechanism} (ldpfed.mechanisms.central).
    The algorithm must be written once (its clipped rows are what a user sends; the twins' means and the server's
    noise are applied around its steps), and an algorithm that folds its rows into an aggregate of other fields
    must say which aggregate field carries which message field (`central_sources`)."""
    refuse_void(algo, algo.ledger(), "move to the server")
    compiled_steps = getattr(algo, "compiled_steps", None)        # a CompiledAlgorithm's
    if compiled_steps is None or compiled_steps() is None:
        raise ConfigError("trust", "central", f"{algo.name} is not written as compiled steps "
                                              f"(ldpfed.algorithms.compiled): the central model adds its noise around "
                                              f"them")
    if algo.central_sources() is None:
        raise ConfigError("trust", "central", f"{algo.name} weighs or folds its rows into its aggregate without "
                                              f"saying which aggregate field carries which message field, and with "
                                              f"what public weight (central_sources)")
    declared = algo._fields or {}
    return {key: central_twin(f.mechanism, f.shape) for key, f in declared.items() if f.mechanism is not None}


# ---- trust models as objects: the one place that knows what each model does -----------------------------------
@dataclass(frozen=True)
class FieldNoise:
    """The noise on one message field that the server's aggregate carries: `variance` per entry (an upper bound
    over the data where it depends on it), added `per` "user" (each user's randomizer) or "round" (once to a
    round's aggregate, by a trusted server). What a server half that corrects for noise should correct for."""

    kind: str              # "gaussian", "laplace", "l2-ball", "randomized-response", or the mechanism's own
    variance: float
    per: str


def mechanism_noise(mech) -> tuple[str, float] | None:
    """(kind, per-entry variance) of what a mechanism adds: its own `noise_variance()` if it offers one, else read
    off its dp_event and output bounds; None when neither says."""
    event = mech.dp_event() or {}
    kind = event.get("noise") or ("l2-ball" if getattr(mech, "output_radius", None) is not None
                                  else type(mech).__name__)
    own = getattr(mech, "noise_variance", None)
    if callable(own):
        return kind, float(own())
    if kind == "gaussian":
        return kind, float(event["noise_std"]) ** 2
    if kind == "laplace":
        return kind, 2.0 * float(event["noise_scale"]) ** 2
    if kind == "randomized-response":
        return kind, 0.25                 # a reported bit: at most 1/4 whatever the true bit's mean
    if kind == "l2-ball":                 # every output row has norm B, so at most B^2 per row
        return kind, float(mech.output_radius) ** 2
    return None


class TrustModel:
    """Where the noise goes, what each user's local budget is, what the server sees and how that is accounted, and
    what the algorithm's server half may know of the noise (`noise`). Found by name through the entry point group
    `ldpfed.trust_models`, like algorithms; nothing outside a trust model compares trust-model names.

    build(cls, world, config) -> the run's algorithm, its budget set and its trust state attached (`algo.trust`,
      and the model's own: the shuffle plan, the central twins);
    summary(config, algo) -> the run's privacy summary (the claim every user gets; refuses an overspending run);
    ledger_rows(algo) -> rows the run's ledger gets besides the mechanisms' own;
    noise(algo) -> {message field: FieldNoise};
    describe(summary, config) -> one line for the CLI, or None.
    shuffles: the round's messages pass whole through shufflers (per-user mode, Ray calls).
    """

    name: str = ""
    shuffles: bool = False
    # what the server receives: "messages" (each user's privatized message, by user), "shuffled" (a shuffler's
    # share as a multiset, no user), "aggregate" (a round's sum with the server's own noise, trusted server)
    server_view: str = "messages"
    options: tuple = ()        # RunConfig fields that only this trust model takes (others must keep their default)

    def applies_to(self, cls) -> bool:
        """Whether an algorithm class can run under this trust model (a sweep runs the others under "local")."""
        return True

    def check(self, config) -> None:
        """ConfigError naming a RunConfig field that this trust model does not take but the config sets."""
        defaults = {option.name: option.default for option in fields(config)}
        for name in ("shufflers", "small_groups"):
            if name not in self.options and getattr(config, name) != defaults[name]:
                option = "--" + name.replace("_", "-")
                raise ConfigError(name, getattr(config, name), f"only the shuffle trust model takes {option} (this "
                                                               f"run's trust is {self.name!r}); use --trust shuffle "
                                                               f"or drop {option}")

    def build(self, cls, world, config):
        algo = cls(world, config)
        algo.trust = self
        return algo

    def summary(self, config, algo) -> dict:
        composed = accounting.compose(algo.ledger(), config.delta)
        accounting.check_budget(composed, config.eps, config.delta, config.algorithm)
        return composed.summary() if composed is not None else {}

    def ledger_rows(self, algo) -> list[dict]:
        return []

    def noise(self, algo) -> dict:
        """Each privatized field's noise, added per user by its local mechanism."""
        found = {}
        for key, mech in algo.mechanisms.items():
            noise = mechanism_noise(mech)
            if noise is not None:
                found[key] = FieldNoise(*noise, "user")
        return found

    def describe(self, summary: dict, config) -> str | None:
        return None


class LocalTrust(TrustModel):
    """The papers' model: no one is trusted; each user privatizes its message with the run's (eps, delta)."""

    name = "local"


class ShuffleTrust(TrustModel):
    """Local randomizers at the largest eps0 whose worst-off user's shuffled group meets the run's (eps, delta)
    (module doc, `shuffle_plan`)."""

    name = "shuffle"
    shuffles = True
    server_view = "shuffled"
    options = ("shufflers", "small_groups")

    def applies_to(self, cls) -> bool:
        return cls.privacy_model == "ldp"      # a local randomizer to shuffle

    def build(self, cls, world, config):
        if not self.applies_to(cls):
            raise ConfigError("trust", config.trust, f"{cls.name} is not a local-DP algorithm (privacy model "
                                                     f"{cls.privacy_model!r}): there is no local randomizer to "
                                                     f"shuffle")
        local, plan = local_config(config, cls, world)
        algo = cls(world, local)
        algo.trust, algo.shuffle = self, plan
        check_shuffled(algo)
        return algo

    def summary(self, config, algo) -> dict:
        plan = algo.shuffle
        local = accounting.compose(algo.ledger(), algo.delta)
        shuffled = {"privacy_trust": self.name, "privacy_eps0": local.eps, "privacy_delta0": local.delta,
                    "privacy_eps0_dp_accounting": local.eps_pld, "privacy_shuffle_batch": plan.batch,
                    "privacy_shuffle_round": plan.smallest_round, "privacy_shuffle_amplified": plan.amplifies,
                    "privacy_shufflers": config.shufflers, "privacy_shuffle_bound": plan.bound}
        if not plan.amplifies:      # the run's randomizers are at the target: the local guarantee, nothing more
            accounting.check_budget(local, config.eps, config.delta, config.algorithm)
            return {**local.summary(), **shuffled}
        accounting.check_budget(local, plan.eps0, algo.delta, config.algorithm)
        amplified = plan.amplified(local.eps, local.delta if plan.delta0 else 0.0)
        accounting.check_budget(accounting.Composition(amplified.eps, amplified.delta, config.delta, None,
                                                       (amplified.reason,)), config.eps, config.delta,
                                config.algorithm)
        return {"privacy_eps_composed": amplified.eps, "privacy_delta_composed": amplified.delta,
                "privacy_eps_dp_accounting": None, **shuffled}

    def ledger_rows(self, algo) -> list[dict]:
        """Per run of rounds with the same smallest randomizer group: that group and its worst-off user's
        (eps, delta)."""
        plan = algo.shuffle
        local = accounting.compose(algo.ledger(), algo.delta)
        rows = []
        for first, last, n in plan.group_runs:
            if plan.amplifies:
                got = plan.amplified(local.eps, local.delta if plan.delta0 else 0.0, n)
                eps, delta = got.eps, got.delta
            else:
                eps, delta = local.eps, local.delta
            rows.append({"message": f"shuffled rounds {first}-{last}", "rounds": [first, last],
                         "smallest_group": n, "eps": eps, "delta": delta, "trust": self.name,
                         "amplified": plan.amplifies,
                         "scope": "the worst-off user of these rounds: the smallest group of users on one "
                                  "randomizer in a shuffler's share"})
        return rows

    def describe(self, s: dict, config) -> str:
        among = "" if s.get("privacy_shufflers", 1) == 1 else f" (a round among {s['privacy_shufflers']} shufflers)"
        smallest = (f"the smallest group of users on one randomizer in a shuffled batch{among}: "
                    f"{s['privacy_shuffle_batch']:,} (round {s['privacy_shuffle_round']})")
        if not s.get("privacy_shuffle_amplified", True):
            return (f"privacy (shuffle): no amplification: {smallest} is too small, so every user's randomizer "
                    f"runs at the target; (eps, delta) = ({s['privacy_eps_composed']:.6g}, "
                    f"{s['privacy_delta_composed']:.3g}), as under --trust local")
        return (f"privacy (shuffle): each user's randomizer at eps0 = {s['privacy_eps0']:.4g} (delta0 = "
                f"{s['privacy_delta0']:.3g}); {smallest} gives the worst-off user (eps, delta) = "
                f"({s['privacy_eps_composed']:.6g}, {s['privacy_delta_composed']:.3g}) "
                f"({s['privacy_shuffle_bound']} bound, Feldman-McMillan-Talwar 2021)")


class CentralTrust(TrustModel):
    """A trusted server adds each mechanism's central twin's noise once to a round's aggregate (module doc)."""

    name = "central"
    server_view = "aggregate"

    def applies_to(self, cls) -> bool:
        return cls.privacy_model == "ldp"      # a local randomizer whose noise can move to the server

    def build(self, cls, world, config):
        if not self.applies_to(cls):
            raise ConfigError("trust", config.trust, f"{cls.name} is not a local-DP algorithm (privacy model "
                                                     f"{cls.privacy_model!r}): there is no local randomizer to "
                                                     f"move to the server")
        algo = cls(world, config)
        algo.trust = self
        algo.central = central_twins(algo)
        return algo

    def summary(self, config, algo) -> dict:
        return {**super().summary(config, algo), "privacy_trust": self.name}

    def noise(self, algo) -> dict:
        """Each field's noise, added once per round by the server (the twin's), not per user."""
        if algo.central is None:       # asked while build() derives the twins (from setup(), consts(), ...)
            raise RuntimeError(f"{algo.name}: field_noise() is known once the trust model has built the algorithm; "
                               f"read it in initial_state() or update(), not in setup() or consts()")
        found = {}
        for key, twin in (algo.central or {}).items():
            variance = twin.scale ** 2 if twin.noise == "gaussian" else 2.0 * twin.scale ** 2
            found[key] = FieldNoise(twin.noise, variance, "round")
        return found

    def describe(self, s: dict, config) -> str:
        return (f"privacy (central): clipped data to a trusted server, which adds the noise once per round of "
                f"{config.round_size:,} users; each user's guarantee (eps, delta) = ({s['privacy_eps_composed']:.6g}, "
                f"{s['privacy_delta_composed']:.3g})")


def _check_trust_class(cls, where: str) -> None:
    from ldpfed.plugins import PluginError

    for method in ("build", "summary", "noise"):
        if not callable(getattr(cls, method, None)):
            raise PluginError(f"{where}: a trust model writes {method}", field=f"{cls.name}.{method}")


TRUST_MODELS = Registry(TRUST_GROUP, "trust model", lambda: TrustModel, _check_trust_class)


def trust_model(config_or_name) -> TrustModel:
    """The trust model of a RunConfig (or by name): a fresh instance of its registered class."""
    name = getattr(config_or_name, "trust", config_or_name)
    if name not in TRUST_MODELS:
        raise ConfigError("trust", name, f"unknown; choose from {sorted(TRUST_MODELS)}")
    return TRUST_MODELS[name]()
