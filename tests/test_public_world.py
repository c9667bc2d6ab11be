"""Algorithms see only what is public: `make_algorithm` hands them the env's PublicWorld, never the env.

Two checks: (1) the public description itself holds no ground truth (only scalars, none of them a truth value);
(2) for every registered algorithm on every world it runs on, nothing reachable from the algorithm object (its
attributes, containers, mechanisms, closures of its functions, bound methods) is an Env or a ground-truth array.
"""
import dataclasses

import numpy as np
import pytest

from ldpfed.algorithms import REGISTRY, make_algorithm
from ldpfed.config import RunConfig
from ldpfed.envs import ENVS, build_env, make_env
from ldpfed.envs.base import Env, PublicWorld
from ldpfed.testing import env_arrays, reachable, truth_match

# The ground truth of each world (attribute names on the env object).

# Every (algorithm, env) pair the registry allows (an algorithm runs on every env of its kinds).
PAIRS = sorted((name, env) for name, cls in REGISTRY.items() for env in cls.envs())


def _config(name, env):
    return RunConfig(name, env=env, users=400, round_size=20, eps=1.0, delta=0.05, seed=5)


def _truth_arrays(env):
    """The env's ground truth: every array and non-empty dict it holds besides its options (ldpfed.testing's rule:
    theta, x_star, segment_means, change_points, support, labels, ... whatever the env calls them)."""
    return env_arrays(env)


def _is_truth(obj, truths):
    return truth_match(obj, truths) is not None


@pytest.mark.parametrize("name,env_name", PAIRS)
def test_no_algorithm_reaches_the_truth(name, env_name):
    config = _config(name, env_name)
    env = make_env(config)
    truths = _truth_arrays(env)
    algo = make_algorithm(env, config)
    assert isinstance(algo.world, PublicWorld)
    for obj in reachable(algo):
        assert not isinstance(obj, Env), f"{name} can reach the env object"
        assert not _is_truth(obj, truths), f"{name} can reach a ground-truth value ({type(obj).__name__})"


def test_the_walk_finds_a_leak():
    """The check above can fail: an algorithm that keeps the env (or a copy of theta*) is caught."""
    config = _config("ldp-ucb", "linear")
    env = make_env(config)
    algo = make_algorithm(env, config)
    algo.mechanisms["hidden"] = {"nested": [lambda: env]}          # the env behind a closure in a container
    assert any(isinstance(obj, Env) for obj in reachable(algo))
    algo2 = make_algorithm(env, config)
    algo2.cache = (env.theta.copy(),)                                 # an equal copy of theta*
    assert any(_is_truth(obj, _truth_arrays(env)) for obj in reachable(algo2))


@pytest.mark.parametrize("env_name", sorted(ENVS))
def test_public_description_holds_no_truth(env_name):
    # built without a RunConfig: an installed env that no algorithm runs on yet is checked too
    env = build_env(env_name, 400, seed=5)
    world = env.public()
    assert dataclasses.is_dataclass(world) and type(world).__dataclass_params__.frozen
    with pytest.raises(dataclasses.FrozenInstanceError):
        world.d = 3
    values = [getattr(world, f.name) for f in dataclasses.fields(world)]
    # Scalars only: no array, list or object a truth could hide in.
    assert all(v is None or isinstance(v, (str, int, float, bool)) for v in values), values
    truth_scalars = set()
    for _, truth in _truth_arrays(env):
        if isinstance(truth, np.ndarray) and truth.dtype.kind == "f":
            truth_scalars.update(float(v) for v in truth.ravel() if v != 0)
    floats = [v for v in values if isinstance(v, float) and not isinstance(v, bool)]
    assert not truth_scalars.intersection(floats), "a ground-truth coordinate is in the public description"
    assert world.d == env.d and world.K == env.K and world.horizon == 400
    assert world.reward_bound == env.reward_bound


def test_public_parameters_the_papers_assume_known():
    sparse = make_env(RunConfig("private-lasso", users=400, round_size=20, env_params={"d": 50, "s0": 3}))
    assert sparse.public().sparsity == 3                   # seed 003 assumes s0 known
    pw = make_env(RunConfig("sw-klucb-cf", users=400, round_size=20, env_params={"breakpoints": 4}))
    assert pw.public().segments == 5                       # seed 004's L_T; the change times stay hidden


def test_an_env_no_algorithm_runs_on_is_checked_too():
    """An installed env whose kinds no algorithm lists is built without a RunConfig (no algorithm to pick)."""
    from ldpfed.envs.glm import Linear

    class Unclaimed(Linear):
        name = "unclaimed-linear"

    ENVS.register(Unclaimed)
    try:
        assert not any(cls.runs_on("unclaimed-linear") for cls in REGISTRY.values())
        test_public_description_holds_no_truth("unclaimed-linear")
    finally:
        ENVS.unregister("unclaimed-linear")
