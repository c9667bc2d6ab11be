"""The registry of algorithms: every class registered under the entry point group `ldpfed.algorithms`, ldpfed's
built-ins (pyproject.toml) and any installed plugin's alike, plus LDPFED_PLUGINS (see ldpfed/plugins.py)."""
from ldpfed.algorithms.base import Algorithm
from ldpfed.algorithms.contract import check_class, check_instance
from ldpfed.algorithms.trust import central_twins, check_shuffled, local_config
from ldpfed.plugins import ALGORITHM_GROUP, Registry

REGISTRY: Registry = Registry(ALGORITHM_GROUP, "algorithm", lambda: Algorithm, check_class)


def make_algorithm(env, config) -> Algorithm:
    """The run's algorithm, handed only the env's public description (no ground truth), its contract checked."""
    cls, world = REGISTRY[config.algorithm], env.public()
    local, plan = local_config(config, cls, world)       # the trust model's local budget (ldpfed.algorithms.trust)
    algo = cls(world, local)
    algo.shuffle = plan
    if plan is not None:
        check_shuffled(algo)
    if config.trust == "central":
        algo.central = central_twins(algo)
    check_instance(algo)
    return algo


__all__ = ["REGISTRY", "Algorithm", "make_algorithm"]
