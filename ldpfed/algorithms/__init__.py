"""The one registry of algorithms. Each module contributes its `ALGORITHMS` list."""
from ldpfed.algorithms import baselines, central_linucb, glm_ldp, klucb, ldp_linear, ldp_reductions, private_lasso
from ldpfed.algorithms.base import Algorithm

REGISTRY: dict[str, type[Algorithm]] = {}
for _module in (glm_ldp, ldp_linear, ldp_reductions, central_linucb, private_lasso, klucb, baselines):
    for _cls in _module.ALGORITHMS:
        assert _cls.name not in REGISTRY, f"duplicate algorithm name {_cls.name}"
        REGISTRY[_cls.name] = _cls


def make_algorithm(env, config) -> Algorithm:
    """The run's algorithm, handed only the env's public description (no ground truth)."""
    return REGISTRY[config.algorithm](env.public(), config)


__all__ = ["REGISTRY", "Algorithm", "make_algorithm"]
