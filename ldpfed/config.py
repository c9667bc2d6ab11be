"""The one validated description of a run: what every entry point (CLI, jobs, Ray engine) builds first."""
from __future__ import annotations

import difflib
import math
from dataclasses import asdict, dataclass, field

from ldpfed.plugins import PROFILES
from ldpfed.util import memory
from ldpfed.util.errors import ConfigError, integer

# Trust models are objects found by name (ldpfed.trust.TRUST_MODELS, the entry point group ldpfed.trust_models),
# each with its own options (RunConfig.trust_options): "local", the papers' local DP, is the default.
DEFAULT_TRUST = "local"
# Federation models likewise (ldpfed.federation.FEDERATIONS, the group ldpfed.federations), with their options
# (RunConfig.federation_options): "ideal", every user of every round answers, is the default.
DEFAULT_FEDERATION = "ideal"


def did_you_mean(name, known) -> str:
    """' (did you mean X?)' for the closest of `known` names to a misspelled `name`, else ''."""
    close = difflib.get_close_matches(str(name), [str(k) for k in known], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


@dataclass(frozen=True)
class RunConfig:
    algorithm: str
    env: str | None = None            # None: the algorithm's paper setting
    users: int = 10_000               # T, the number of users (one arrival each)
    round_size: int = 1               # B, users per round; 1 is the paper's sequential algorithm
    populations: int = 1              # logical populations; a round's users are split among them
    eps: float = 1.0
    delta: float = 0.01
    seed: int = 0
    env_params: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)   # algorithm options, validated by the algorithm
    profile: str = "paper"            # one of PROFILES: sets the defaults of env_params and params
    trust: str = DEFAULT_TRUST        # a trust model's name: where the noise is added (ldpfed.trust)
    trust_options: dict = field(default_factory=dict)   # the trust model's own options, validated by the model
    federation: str = DEFAULT_FEDERATION   # a federation model's name: which of a round's users take part
    federation_options: dict = field(default_factory=dict)   # the federation model's options, validated by it

    def __post_init__(self):
        from ldpfed.algorithms import REGISTRY
        from ldpfed.envs import ENVS

        if self.algorithm not in REGISTRY:
            raise ConfigError("algorithm", self.algorithm, f"unknown{did_you_mean(self.algorithm, REGISTRY)}; choose "
                              f"from {sorted(REGISTRY)} (or install a plugin package: docs/writing-an-algorithm.md)")
        algo = REGISTRY[self.algorithm]
        if self.env is None:
            object.__setattr__(self, "env", algo.default_env)
        if self.env not in ENVS:
            raise ConfigError("env", self.env, f"unknown{did_you_mean(self.env, ENVS)}; choose from {sorted(ENVS)}")
        if not algo.runs_on(self.env):
            raise ConfigError("env", self.env, f"{self.algorithm} runs on {algo.envs()} (envs of the kinds "
                                               f"{list(algo.env_kinds)}; Env.kinds)")
        for name, minimum in (("users", 1), ("round_size", 1), ("populations", 1), ("seed", 0)):
            object.__setattr__(self, name, integer(name, getattr(self, name), minimum))
        if self.populations > self.round_size:
            raise ConfigError("populations", self.populations, f"more populations than users per round ({self.round_size})")
        if not (isinstance(self.eps, (int, float)) and math.isfinite(self.eps) and self.eps > 0):
            raise ConfigError("eps", self.eps, "must be a finite number > 0")
        if not (isinstance(self.delta, (int, float)) and 0 < self.delta < 1):
            raise ConfigError("delta", self.delta, "must be in (0, 1)")
        if self.profile not in PROFILES:
            raise ConfigError("profile", self.profile, f"unknown; choose from {list(PROFILES)}")
        from ldpfed.trust import TRUST_MODELS

        if self.trust not in TRUST_MODELS:
            raise ConfigError("trust", self.trust, f"unknown{did_you_mean(self.trust, TRUST_MODELS)}; choose from "
                                                   f"{sorted(TRUST_MODELS)}")
        # every option of the run's trust model, validated, the ones not given at their defaults (recorded so)
        object.__setattr__(self, "trust_options", TRUST_MODELS[self.trust].checked_options(self.trust_options))
        TRUST_MODELS[self.trust]().check(self)
        self._check_federation(TRUST_MODELS[self.trust])
        for name in ("env_params", "params"):
            if not isinstance(getattr(self, name), dict):
                raise ConfigError(name, getattr(self, name), "must be a mapping")
        algo.checked_params(self.params, self.profile)     # a bad option stops the run before any work
        ENVS[self.env].checked_params(self.env_params, self.profile, self.users)     # and so does a bad env option
        check_memory(self, ENVS[self.env], algo)

    def _check_federation(self, trust_cls) -> None:
        from ldpfed.algorithms import REGISTRY
        from ldpfed.federation import FEDERATIONS

        if self.federation not in FEDERATIONS:
            raise ConfigError("federation", self.federation, f"unknown{did_you_mean(self.federation, FEDERATIONS)}; "
                                                             f"choose from {sorted(FEDERATIONS)}")
        model = FEDERATIONS[self.federation]
        object.__setattr__(self, "federation_options", model.checked_options(self.federation_options))
        federation = model.of(self)
        federation.check(self)
        algo = REGISTRY[self.algorithm]
        if federation.late and not algo.late_messages:
            raise ConfigError("federation", self.federation,
                              f"its messages can arrive rounds late, and {self.algorithm}'s server reads a round's "
                              f"messages through the model it published for that round (importance weights): a "
                              f"late message would be misread; run it under a federation without delays")
        why = trust_cls().federation_refusal(federation)
        if why:
            raise ConfigError("federation", self.federation, f"the {self.trust} trust model: {why}")

    @property
    def shufflers(self) -> int:
        """The shufflers a round goes through (a trust model's option "shufflers"; 1 when it takes none): the
        engines' shuffler plumbing reads it."""
        return int(self.trust_options.get("shufflers", 1))

    @property
    def small_groups(self) -> str:
        """The shuffle trust model's option "small_groups" ("refuse" when the model takes none)."""
        return self.trust_options.get("small_groups", "refuse")

    @property
    def rounds(self) -> int:
        return -(-self.users // self.round_size)

    def to_dict(self) -> dict:
        return asdict(self)

    def replace(self, **changes) -> "RunConfig":
        """A copy with `changes`; another trust (federation) model starts from its own default options unless
        given."""
        if changes.get("trust", self.trust) != self.trust:
            changes.setdefault("trust_options", {})
        if changes.get("federation", self.federation) != self.federation:
            changes.setdefault("federation_options", {})
        return RunConfig(**{**self.to_dict(), **changes})


# ---- memory: refuse what cannot fit, before anything is allocated (ldpfed/util/memory.py) ----------------------------
SIZE_OPTIONS = ("env_params.d", "env_params.K", "env_params.pool")   # env options that size arrays


def _sizes(config, env_cls, given: bool = True) -> dict | None:
    """users, round_size and the env's array sizes: as given (else the profile's or the env's defaults), or with
    given=False all at their defaults. None when a size is not an integer (the env then rejects it, naming it)."""
    defaults = {**env_cls.defaults, **env_cls.profile_defaults.get(config.profile, {})}
    sizes = ({"users": config.users, "round_size": config.round_size} if given else
             {name: RunConfig.__dataclass_fields__[name].default for name in ("users", "round_size")})
    for option in SIZE_OPTIONS:
        key = option.split(".", 1)[1]
        value = config.env_params.get(key, defaults.get(key, 0)) if given else defaults.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return None
        sizes[option] = value
    return sizes


def estimate_memory(sizes: dict, multi: bool, gram_messages: bool = True) -> int:
    """Bytes of a run's largest arrays (a coarse upper bound, see ldpfed/util/memory.py): per round the contexts
    (B x K x d) and messages (LDP: at most a noisy (d+1)^2 Gram matrix per arm slot, one slot per arm on
    multi-parameter envs; otherwise a (d+1)-vector; plus a K-vector); the server state ((d+1)^2 per slot, times
    the tree depth for the tree mechanisms); the env's arm pool; one result-table row per round."""
    users, d, K = sizes["users"], sizes["env_params.d"], sizes["env_params.K"]
    batch = min(sizes["round_size"], users)
    rounds = -(-users // batch)
    slots = K if multi else 1
    per_user = K * max(d, 1) + (slots * (d + 1) ** 2 if gram_messages else d + 1) + K
    state = memory.STATE_COPIES * slots * (d + 1) ** 2 * max(1, rounds.bit_length())
    floats = memory.ROUND_COPIES * batch * per_user + state + sizes["env_params.pool"] * d
    return floats * memory.FLOAT + rounds * memory.BYTES_PER_ROUND


def check_memory(config, env_cls, algo_cls) -> None:
    """ConfigError naming the option that makes the run too large for this machine: of the size options, the one
    whose reset to its default shrinks the estimate most."""
    sizes = _sizes(config, env_cls)
    if sizes is None:
        return
    gram = algo_cls.privacy_model == "ldp"      # only LDP clients send noisy Gram matrices
    need = estimate_memory(sizes, env_cls.multi, gram)
    if need <= memory.memory_limit():
        return
    defaults = _sizes(config, env_cls, given=False)
    blame = min(sizes, key=lambda option: estimate_memory({**sizes, option: min(sizes[option], defaults[option])},
                                                          env_cls.multi, gram))
    memory.check_allocation(blame, sizes[blame], need, f"{config.algorithm} on {config.env} at this size")
