"""The registry of algorithms: every class registered under the entry point group `ldpfed.algorithms`, ldpfed's
built-ins (pyproject.toml) and any installed plugin's alike, plus LDPFED_PLUGINS (see ldpfed/plugins.py)."""
from ldpfed.algorithms.base import Algorithm
from ldpfed.algorithms.contract import check_class, check_instance
from ldpfed.trust import trust_model
from ldpfed.plugins import ALGORITHM_GROUP, Registry

REGISTRY: Registry = Registry(ALGORITHM_GROUP, "algorithm", lambda: Algorithm, check_class)


def make_algorithm(env, config) -> Algorithm:
    """The run's algorithm, handed only the env's public description (no ground truth), its contract checked."""
    cls, world = REGISTRY[config.algorithm], env.public()
    # where the noise goes: the trust model builds the algorithm at its users' budget and attaches its state
    algo = trust_model(config).build(cls, world, config)
    check_instance(algo)
    return algo


__all__ = ["REGISTRY", "Algorithm", "make_algorithm"]
