"""The registry of simulated worlds: every class registered under the entry point group `ldpfed.envs`, ldpfed's
built-ins (pyproject.toml) and any installed plugin's alike, plus LDPFED_PLUGINS (see ldpfed/plugins.py)."""
from ldpfed.envs.base import Env, check_env_class
from ldpfed.plugins import ENV_GROUP, Registry
from ldpfed.util.rng import derive

ENVS: Registry = Registry(ENV_GROUP, "env", lambda: Env, check_env_class)


def make_env(config) -> Env:
    """The world of a run; its ground truth depends only on the run's seed. The profile sets option defaults."""
    return build_env(config.env, config.users, config.seed, config.env_params, config.profile)


def build_env(name: str, users: int, seed: int = 0, env_params: dict | None = None, profile: str = "paper") -> Env:
    """The env `name` for `users` users as a run of this seed builds it, without a RunConfig (so without an
    algorithm: an env that no algorithm runs on yet can be built and checked, ldpfed.testing.check_env)."""
    cls = ENVS[name]
    params = {**cls.profile_defaults.get(profile, {}), **(env_params or {})}
    return cls(derive(seed, "env"), users, **params)


__all__ = ["ENVS", "Env", "build_env", "make_env"]
