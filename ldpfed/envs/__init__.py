"""The registry of simulated worlds: every class registered under the entry point group `ldpfed.envs`, ldpfed's
built-ins (pyproject.toml) and any installed plugin's alike, plus LDPFED_PLUGINS (see ldpfed/plugins.py)."""
from ldpfed.envs.base import Env, check_env_class
from ldpfed.plugins import ENV_GROUP, Registry
from ldpfed.util.rng import derive

ENVS: Registry = Registry(ENV_GROUP, "env", lambda: Env, check_env_class)


def make_env(config) -> Env:
    """The world of a run; its ground truth depends only on the run's seed. The profile sets option defaults."""
    cls = ENVS[config.env]
    params = {**cls.profile_defaults.get(config.profile, {}), **config.env_params}
    return cls(derive(config.seed, "env"), config.users, **params)


__all__ = ["ENVS", "Env", "make_env"]
