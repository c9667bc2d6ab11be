"""The trust-model door: what a trust model says and does, for the built-ins and a plugin's alike.

A trust model is where the noise goes, not a different algorithm: the same algorithm class runs under every model
that reaches it. A model declares (class attributes) and implements (methods with defaults here):

* `name`, `about` (one line: the CLI's --trust help and `list`), `options` ({name: Option}: the model's own
  options, given as `--trust-option K=V`, a sweep file's `[trust_options]` table or `RunConfig.trust_options`;
  validated before any work by `checked_options`, recorded in the config, checkpoints, the summary and MLflow);
* the noise protocol: `noise_at` ("user": each user's local randomizer; "server": a trusted server adds it once to
  a round's aggregate; "shares": each user adds a share of it inside its message, so only the securely summed
  aggregate carries it whole; "none"), and the hooks an algorithm's batched steps call around its own code
  (ldpfed.algorithms.compiled.CompiledAlgorithm): `client_rows` (what a user makes of its clipped data row),
  `seal` (the privatized, post-processed row before it leaves the user), `client_weighs` (the aggregate is then a
  plain sum: the users applied the public weights), `server_noise` and `decode` (the server's half around the
  summed row), `field_domain` (what the shards can check of one message), `noise` (the FieldNoise the server
  half reads: kind, variance, per, entries);
* the accounting: `noise_makers` (which objects' guarantee and dp_event make the ledger rows), `label_rows` (the
  rows' `trust` and `scope`), `summary`, `ledger_rows`, `describe`;
* the reach: `refusal(algo)`, why the model cannot run an algorithm, decided on the algorithm built under local
  (`reach`); a sweep runs the algorithms out of reach under local;
* the server's view for the engines and the server-view audit: `shuffles`, `server_view`.
"""
from __future__ import annotations

import numpy as np

from ldpfed.mechanisms import accounting
from ldpfed.mechanisms.noise import local_noise
from ldpfed.util.errors import ConfigError
from ldpfed.util.options import checked_model_options, option_rows

LOCAL = "local"             # the model every algorithm is written for (the papers' local DP)
NOISE_AT = ("user", "server", "shares", "none")
# what the server receives: "messages" (each user's privatized message, by user), "shuffled" (a shuffler's share
# as a multiset, no user), "aggregate" (a round's sum with the server's own noise, trusted server), "masked"
# (each user's message masked so that only the round's sum can be read: secure aggregation)
SERVER_VIEWS = ("messages", "shuffled", "aggregate", "masked")


class TrustModel:
    """Where the noise goes, what each user's budget is, what the server sees and how that is accounted (module
    doc). Found by name through the entry point group `ldpfed.trust_models`; nothing outside a trust model compares
    trust-model names."""

    name: str = ""
    about: str = ""
    options: dict = {}            # {option name: ldpfed.util.options.Option}
    noise_at: str = "user"
    shuffles: bool = False        # the round's messages pass whole through shufflers (per-user mode, Ray calls)
    server_view: str = "messages"
    client_weighs: bool = False   # the users apply the aggregate's public weights: the server sums plainly

    # ---- options -------------------------------------------------------------------------------------------------
    @classmethod
    def checked_options(cls, given) -> dict:
        """Every option of this model, the given ones validated and the rest at their defaults (ConfigError naming
        `trust_options.<name>`: unknown, with the model that takes it or the closest name, or a bad value)."""
        from ldpfed.trust import TRUST_MODELS

        return checked_model_options(cls, given, TRUST_MODELS, "trust_options", "trust model", "--trust")

    @classmethod
    def option_table(cls) -> list[dict]:
        """The options as `describe` prints them (name, default, kind, bounds, doc)."""
        return option_rows(cls.options)

    def federation_refusal(self, federation) -> str | None:
        """Why this model cannot account for a run under `federation` (a federation model: ldpfed.federation), or
        None. Default: none (a user's guarantee does not depend on who else answers, or when)."""
        return None

    def check(self, config) -> None:
        """ConfigError naming a RunConfig field that this model cannot run with (its options are checked first by
        checked_options); none by default."""

    # ---- reach ---------------------------------------------------------------------------------------------------
    def refusal(self, algo) -> str | None:
        """Why this model cannot run `algo` (an algorithm built under local, or by this model), None if it can."""
        return None

    def reach(self, cls, world, config) -> str | None:
        """refusal() of the algorithm of `config` built under local: what a sweep asks to decide whether to run it
        under this model or under local."""
        return self.refusal(cls(world, config.replace(trust=LOCAL, trust_options={})))

    def refuse(self, algo, why: str) -> ConfigError:
        """The error of a run this model cannot carry out, naming `trust` and this model."""
        name = getattr(algo, "name", algo)
        return ConfigError("trust", self.name, f"{name}: {why}")

    def build(self, cls, world, config):
        """The run's algorithm at its users' budget, with this model's state attached (`algo.trust`)."""
        algo = cls(world, config)
        why = self.refusal(algo)
        if why:
            raise self.refuse(algo, why)
        self.attach(algo)
        algo.trust = self
        return algo

    def attach(self, algo) -> None:
        """The model's own state on the algorithm it builds (before `algo.trust` is set); none by default."""

    # ---- the noise protocol: the hooks an algorithm's batched steps call ------------------------------------------
    def client_rows(self, algo, inputs: np.ndarray, users: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """What users make of their clipped data rows (n, width) before post-processing: each field through its
        local mechanism, drawing from `rng` (the users' stream). `inputs` may be overwritten."""
        layout = algo.layout()
        return layout.privatize(inputs, layout.draw(rng, len(users)), overwrite=True)

    def seal(self, algo, rows: np.ndarray, users: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The rows as they leave the users, after the algorithm's post-processing (`finish`); as they are by
        default."""
        return rows

    def server_noise(self, algo, sums: dict, start: int, stop: int, rng: np.random.Generator):
        """The noise the server adds to the summed row of users [start, stop) (an array of the sum layout's width),
        or None (the default: the server adds none)."""
        return None

    def decode(self, algo, joined: np.ndarray, start: int, stop: int) -> np.ndarray:
        """The summed row of users [start, stop) as the algorithm's update reads it (the default: as summed)."""
        return joined

    def sent_fields(self, algo) -> dict | None:
        """{field: per-user shape} of what a user sends when it is not the algorithm's message (the aggregate's
        fields, when the users weigh or fold their own rows); None by default."""
        return None

    def field_domain(self, algo, key: str, declared):
        """The Domain a shard checks one message's field `key` against, or None: the algorithm's own (declared)."""
        return None

    def noise(self, algo) -> dict:
        """{message field: FieldNoise} the server's aggregate carries: by default each field's local noise, per
        user."""
        return local_noise(algo.mechanisms)

    # ---- accounting ----------------------------------------------------------------------------------------------
    def noise_makers(self, algo) -> dict:
        """{ledger row: the object whose `guarantee` and `dp_event()` the row states}: the algorithm's mechanisms
        by default."""
        return algo.mechanisms

    def label_rows(self, algo, rows: list) -> list:
        """The ledger rows as this model states them: each row gets `trust` (this model's name)."""
        return [{**row, "trust": self.name} for row in rows]

    def summary(self, config, algo) -> dict:
        """The run's privacy summary: the ledger composed and checked against the budget (refusing an overspending
        run or a claim its own noise contradicts), with `privacy_trust` and the model's options."""
        composed = accounting.compose(algo.ledger(), config.delta)
        if composed is None:          # a run without privacy: nothing to claim
            return {}
        accounting.check_budget(composed, config.eps, config.delta, config.algorithm)
        return {**composed.summary(), **self.summary_labels(config)}

    def summary_labels(self, config) -> dict:
        """privacy_trust and each option as privacy_trust_<name>."""
        return {"privacy_trust": self.name,
                **{f"privacy_trust_{key}": value for key, value in sorted(config.trust_options.items())}}

    def ledger_rows(self, algo) -> list[dict]:
        """Rows the run's ledger gets besides the noise makers' own."""
        return []

    def describe(self, summary: dict, config) -> str | None:
        """One line for the CLI, or None."""
        return None


def check_trust_class(cls, where: str) -> None:
    """PluginError when a registered trust model breaks the contract (the registry's check)."""
    from ldpfed.plugins import PluginError
    from ldpfed.util.options import Option

    for method in ("build", "summary", "noise"):
        if not callable(getattr(cls, method, None)):
            raise PluginError(f"{where}: a trust model writes {method}", field=f"{cls.name}.{method}")
    if cls.noise_at not in NOISE_AT:
        raise PluginError(f"{where}: noise_at must be one of {NOISE_AT}, not {cls.noise_at!r}",
                          field=f"{cls.name}.noise_at")
    if cls.server_view not in SERVER_VIEWS:
        raise PluginError(f"{where}: server_view must be one of {SERVER_VIEWS}, not {cls.server_view!r}",
                          field=f"{cls.name}.server_view")
    if not isinstance(cls.options, dict) or not all(isinstance(o, Option) for o in cls.options.values()):
        raise PluginError(f"{where}: options must be a dict of ldpfed.util.options.Option", field=f"{cls.name}.options")
