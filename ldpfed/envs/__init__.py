"""The simulated worlds, by name. Each module contributes its `ENVS`."""
from ldpfed.envs import classification, convex, glm, mab, sparse
from ldpfed.envs.base import Env
from ldpfed.rng import derive

ENVS: dict[str, type[Env]] = {}
for _module in (glm, mab, convex, sparse, classification):
    ENVS.update(_module.ENVS)


def make_env(config) -> Env:
    """The world of a run; its ground truth depends only on the run's seed. The profile sets option defaults."""
    cls = ENVS[config.env]
    params = {**cls.profile_defaults.get(config.profile, {}), **config.env_params}
    return cls(derive(config.seed, "env"), config.users, **params)


__all__ = ["ENVS", "Env", "make_env"]
