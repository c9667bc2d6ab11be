"""An algorithm in two halves.

Client half (runs inside a population, vectorized over the users of a round): `act` chooses the arms from the
published model, `encode` builds each user's message and privatizes it with the algorithm's local randomizer.
Server half: `initial_state`, `update` (fold one round's aggregated messages into the state) and `publish`
(the model the next round's users see). `aggregate` sums messages; it is post-processing of privatized values,
so it may run in a population (pre-aggregated mode) or in a server shard (per-user mode) with the same result.

Messages are dicts of arrays whose leading axis is the user. Under local DP every field that is not listed in
`public_fields` must be the output of a mechanism: nothing raw leaves the client half.
"""
from __future__ import annotations

import numpy as np

from ldpfed.errors import ConfigError
from ldpfed.mechanisms.accounting import noise_fields

ONE_MESSAGE = "one output per user: each user arrives once and sends this field once"
ONE_RELEASE = ("one mechanism per run: every release of the run is covered by this one guarantee (a user is in "
               "one element of the stream)")


class Algorithm:
    name: str = ""
    paper: str = ""                  # which seed and algorithm of it
    privacy_model: str = "none"      # "ldp", "central" or "none"
    env_kinds: tuple = ()            # env names it runs on
    default_env: str = ""            # its paper's setting
    defaults: dict = {}              # options with the paper's values
    public_fields: frozenset = frozenset()  # message fields that the protocol makes public (e.g. a public arm)
    # The paper's experiment, for jobs/: RunConfig fields, e.g. {"env_params": {...}, "users": 10**5, "eps": 1.0,
    # "delta": 0.01, "params": {...}}; the env is `default_env`.
    paper_setting: dict = {}
    # Options whose default differs under RunConfig.profile="authors-code" (the public code's choices), e.g.
    # {"authors-code": {"step": 5.0}}; every key must be in `defaults`. No entry: identical under both profiles.
    profile_defaults: dict = {}

    def __init__(self, world, config):
        """world: the env's PublicWorld (ldpfed.envs.base), never the env itself: an algorithm sees only what its
        paper assumes public, no ground truth (tests/test_public_world.py walks every algorithm to check)."""
        unknown = set(config.params) - set(self.defaults)
        if unknown:
            name = sorted(unknown)[0]
            raise ConfigError(f"params.{name}", config.params[name],
                              f"unknown option of {self.name}; known: {sorted(self.defaults)}")
        self.world = world
        self.config = config
        self.profile = config.profile
        self.params = {**self.defaults, **self.profile_defaults.get(self.profile, {}), **config.params}
        self.eps, self.delta, self.T = float(config.eps), float(config.delta), int(config.users)
        self.d, self.K = world.d, world.K
        self.mechanisms: dict = {}   # message field (or release) -> mechanism; the ledger is built from these
        self.setup()

    def setup(self) -> None:
        """Validate options and build the mechanisms."""

    # ---- server half -------------------------------------------------------------------------
    def initial_state(self, rng: np.random.Generator):
        raise NotImplementedError

    def publish(self, state):
        """The model every user of the next round sees (must not contain raw user data)."""
        return state

    def update(self, state, sums: dict, start: int, stop: int, rng: np.random.Generator):
        """Fold the aggregated messages of users [start, stop) into the state; return the new state."""
        raise NotImplementedError

    def estimate(self, state):
        """The parameter estimate compared with the env's truth, or None."""
        return None

    # ---- client half -------------------------------------------------------------------------
    def act(self, model, contexts, users: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError

    def encode(self, model, contexts, actions, rewards, users: np.ndarray, rng: np.random.Generator):
        """(messages, metrics): privatized per-user messages, and simulation counters (e.g. clipped users)
        that go to the metrics channel, never to the server."""
        raise NotImplementedError

    def message_spec(self) -> dict:
        """Per-user shape of every message field, e.g. {"M": (d, d), "u": (d,)}: the same for every user whatever
        their data (so a message's shape reveals nothing); server shards reject messages that do not match."""
        raise NotImplementedError

    def aggregate(self, messages: dict, users: np.ndarray) -> dict:
        """Sum of the users' messages; override for per-user weights (e.g. SGD step sizes), which are public."""
        return {key: value.sum(axis=0) for key, value in messages.items()}

    # ---- what the server accepts: it trusts no client (ldpfed.mechanisms.domains) ------------------
    def message_domains(self) -> dict:
        """Per message field, the Domain every honest client's values lie in: the output domain of the mechanism
        that made the field, or the public schedule/bounds for the fields no mechanism made. Default: the
        mechanisms whose output domain needs no public input bound (l2-ball, randomized response); algorithms
        declare every other field."""
        domains = {}
        for field, shape in self.message_spec().items():
            try:
                domains[field] = self.mechanisms[field].output_domain(shape)
            except (KeyError, TypeError, AttributeError):
                raise NotImplementedError(f"{self.name}: message field {field!r} declares no domain") from None
        return domains

    def aggregate_bounds(self, users: np.ndarray) -> dict:
        """Per aggregated field, the SumBounds of what these honest users' `aggregate` can be. Default (plain
        sums): each field's domain summed over the users; algorithms with a weighted `aggregate` override."""
        if type(self).aggregate is not Algorithm.aggregate:
            raise NotImplementedError(f"{self.name}: aggregate is not a plain sum; declare aggregate_bounds")
        return {field: domain.sum_bounds(users) for field, domain in self.cached_domains().items()}

    def cached_domains(self) -> dict:
        """message_domains(), built once (a server shard checks every message against them)."""
        if "_domains" not in self.__dict__:
            self._domains = self.message_domains()
        return self._domains

    # ---- description -------------------------------------------------------------------------
    def ledger(self) -> list[dict]:
        """What the mechanisms of this run guarantee, one row per message field or release, with the noise they
        draw and how many of their outputs one user's data can change (`per_user`, and why: `composition`), which
        the privacy accountant (ldpfed.mechanisms.accounting) composes. Override to change `per_user`."""
        reason = (ONE_MESSAGE if self.privacy_model == "ldp" else ONE_RELEASE)
        return [{"message": key, **mech.guarantee.as_dict(), **noise_fields(mech), "per_user": 1,
                 "composition": reason} for key, mech in self.mechanisms.items()]

    @classmethod
    def describe(cls) -> dict:
        return {"algorithm": cls.name, "paper": cls.paper, "privacy_model": cls.privacy_model,
                "envs": list(cls.env_kinds), "default_env": cls.default_env}


def clip_norm(x: np.ndarray, bound: float) -> tuple[np.ndarray, int]:
    """Rows of x scaled down to norm <= bound, and how many were clipped."""
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    over = norms > bound
    return np.where(over, x * (bound / np.maximum(norms, 1e-300)), x), int(over.sum())


def clip_abs(r: np.ndarray, bound: float) -> tuple[np.ndarray, int]:
    """Values clipped to [-bound, bound], and how many were clipped."""
    return np.clip(r, -bound, bound), int((np.abs(r) > bound).sum())
