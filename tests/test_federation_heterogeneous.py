"""Heterogeneous populations (docs/federation.md): each population has its own size and its own world drawn around
the run's (Env.varied), the algorithm one public world; spread 0 with equal sizes is the ideal run; the worlds are
a function of the seed, the same on both engines and after a resume."""
import numpy as np
import pandas as pd
import pytest

from ldpfed.algorithms import make_algorithm
from ldpfed.config import RunConfig
from ldpfed.engine import run_local
from ldpfed.engine.core import population_users, round_bounds, round_users, simulate_population
from ldpfed.envs import ENVS, Env, make_env
from ldpfed.envs.glm import Linear
from ldpfed.federation import federation_model
from ldpfed.util.errors import ConfigError
from ldpfed.util.rng import derive


def config(algorithm="ldp-sgd", **options):
    return RunConfig(algorithm, users=600, round_size=60, populations=3, seed=4, federation="heterogeneous",
                     federation_options=options)


def assert_same(expected, got):
    pd.testing.assert_frame_equal(expected.table, got.table, check_exact=True)


@pytest.mark.parametrize("algorithm", ["ldp-sgd", "ldp-mab-ucb"])
def test_spread_zero_with_equal_sizes_is_the_ideal_run(algorithm):
    ideal = run_local(RunConfig(algorithm, users=600, round_size=60, populations=3, seed=4))
    zero = run_local(config(algorithm, spread=0.0))
    # the whole table, bit for bit, but the count of users served (a model other than ideal adds it: all of them)
    assert (zero.table["users_served"] == zero.table["users"].diff().fillna(zero.table["users"])).all()
    pd.testing.assert_frame_equal(ideal.table, zero.table.drop(columns=["users_served"]), check_exact=True)
    assert ideal.summary["final_regret"] == zero.summary["final_regret"]
    assert zero.summary["federation"] == "heterogeneous" and zero.summary["federation_spread"] == 0.0


@pytest.mark.parametrize("algorithm, truth", [("ldp-sgd", "theta"), ("ldp-mab-ucb", "segment_means"),
                                              ("ldp-ols-multi", "theta"), ("private-lasso", "theta")])
def test_each_population_has_its_own_world_and_the_public_one_is_the_runs(algorithm, truth):
    run = config(algorithm, spread=0.5)
    env = make_env(run)
    federation = federation_model(run)
    worlds = [federation.world(env, p) for p in range(3)]
    values = [getattr(world, truth) for world in worlds]
    assert all(not np.array_equal(values[0], v) for v in values[1:])          # the populations differ
    assert all(not np.array_equal(getattr(env, truth), v) for v in values)    # and differ from the run's world
    assert all(world.public() == env.public() for world in worlds)
    again = [federation_model(run).world(make_env(run), p) for p in range(3)]  # a function of the seed
    assert all(np.array_equal(a, getattr(w, truth)) for a, w in zip(values, again))
    if truth == "theta":     # bounds kept: the norm of theta (of each arm's)
        assert np.allclose(np.linalg.norm(values[1], axis=-1), np.linalg.norm(getattr(env, truth), axis=-1))
        if algorithm == "private-lasso":    # the support, so the sparsity, is kept
            assert np.array_equal(np.flatnonzero(values[1]), np.flatnonzero(env.theta))
    else:
        assert ((values[1] >= 0) & (values[1] <= 1)).all()


def test_the_populations_have_their_sizes():
    sized = federation_model(config(sizes=[1.0, 2.0, 3.0]))
    assert [len(population_users(0, 600, p, 3, sized.shares())) for p in range(3)] == [100, 200, 300]
    # every round's users are cut so: population p gets its share of each round of 60
    for r in range(10):
        start, stop = round_bounds(r, 60, 600)
        users = [round_users(sized, r, start, stop, p, 3) for p in range(3)]
        assert [len(u) for u in users] == [10, 20, 30]
        assert np.array_equal(np.concatenate(users), np.arange(start, stop))       # every user, once, in order
    drawn = federation_model(config(size_alpha=0.5)).shares()
    assert drawn.shape == (3,) and np.isclose(drawn.sum(), 1.0) and np.array_equal(
        drawn, federation_model(config(size_alpha=0.5)).shares())                   # a function of the seed
    assert not np.array_equal(drawn, federation_model(config(size_alpha=0.5).replace(seed=5)).shares())
    alpha = federation_model(config(size_alpha=0.5))
    counts = [len(round_users(alpha, 0, 0, 60, p, 3)) for p in range(3)]
    assert sum(counts) == 60 and all(abs(c - 60 * share) <= 1 for c, share in zip(counts, drawn))
    table = run_local(config(sizes=[1.0, 2.0, 3.0])).table
    assert (table["users_served"] == 60).all()


def test_a_population_sees_its_own_contexts_on_the_sphere():
    # GLM worlds: a population's contexts are shifted towards its own centre, still on the unit sphere
    run = config(spread=0.5)
    env = make_env(run)
    world = federation_model(run).world(env, 1)
    users = np.arange(4000)
    seen = world.contexts(users, np.random.default_rng(0))
    assert np.allclose(np.linalg.norm(seen, axis=-1), 1.0)
    runs = env.contexts(users, np.random.default_rng(0))
    # the run's contexts average 0 (uniform on the sphere: each coordinate has variance 1/d, so the mean of the
    # 40,000 has standard error sqrt(1/(2 * 40,000)) = 0.0035); the population's are pulled towards its centre
    assert np.abs(runs.reshape(-1, 2).mean(axis=0)).max() < 5 * 0.0036
    direction = world.context_centre / np.linalg.norm(world.context_centre)
    assert seen.reshape(-1, 2).mean(axis=0) @ direction > 5 * 0.0036
    assert env.context_centre is None


@pytest.mark.parametrize("algorithm", ["ldp-ols", "ldp-mab-ucb"])
def test_regret_is_against_each_populations_own_best_arm(algorithm):
    # round 0 (every population acts on the initial model): the run's regret is the sum, over the populations, of
    # the regret each population's users pay in their own world, which is not what they would pay in the run's
    run = config(algorithm, spread=1.0, sizes=[1.0, 2.0, 3.0])
    table = run_local(run).table
    assert (table["regret"] >= 0).all()
    env, federation = make_env(run), federation_model(run)
    algo = make_algorithm(env, run)
    model = algo.publish(algo.initial_state(derive(run.seed, "init")))
    own = runs = 0.0
    for population in range(3):
        users = round_users(federation, 0, 0, 60, population, 3)
        own += simulate_population(algo, federation.world(env, population), model, run.seed, 0, population, users)[1]
        runs += simulate_population(algo, env, model, run.seed, 0, population, users)[1]
    assert table["regret"].iloc[0] == own and own != runs


class _PromisesToVary(Linear):
    """Says what varies but never writes `_vary`: the model turns the env's error into a ConfigError naming it."""
    name = "test-promises-to-vary"
    kinds = ("linear",)
    _vary = Env._vary


def test_options_and_an_env_that_does_not_vary_are_refused():
    for bad, field in (({"sizes": [1.0, 2.0]}, "federation_options.sizes"),
                       ({"sizes": [1.0, -2.0, 3.0]}, "federation_options.sizes"),
                       ({"sizes": "1,2,3"}, "federation_options.sizes"),
                       ({"sizes": [1.0, 2.0, 3.0], "size_alpha": 1.0}, "federation_options.size_alpha"),
                       ({"size_alpha": 0.0}, "federation_options.size_alpha"),
                       ({"spread": -1.0}, "federation_options.spread"),
                       ({"spread": float("nan")}, "federation_options.spread"),
                       ({"spred": 0.5}, "federation_options.spred")):
        with pytest.raises(ConfigError) as caught:
            config(**bad)
        assert caught.value.field == field, bad
    classification = dict(env="classification", env_params={"d": 8}, users=600, round_size=60, populations=3,
                          federation="heterogeneous")
    with pytest.raises(ConfigError, match="env classification does not say how its world varies") as caught:
        RunConfig("ldp-ols-multi", **classification)
    assert caught.value.field == "env"
    # spread 0 needs no world of its own: populations of their own sizes in the one data set
    result = run_local(RunConfig("ldp-ols-multi", **classification,
                                 federation_options={"spread": 0.0, "sizes": [1.0, 2.0, 3.0]}))
    assert result.summary["total_users_served"] == 600
    ENVS.register(_PromisesToVary)
    try:
        run = RunConfig("ldp-sgd", env=_PromisesToVary.name, users=600, round_size=60, populations=3,
                        federation="heterogeneous")
        with pytest.raises(ConfigError, match="test-promises-to-vary") as caught:
            run_local(run)
        assert caught.value.field == "env"
    finally:
        ENVS.unregister(_PromisesToVary.name)


def test_resume_gives_the_same_bits(interrupted_and_resumed):
    whole, resumed = interrupted_and_resumed(config(spread=0.5, size_alpha=1.0), 300)
    assert_same(whole, resumed)


def test_ray_engine_gives_the_same_bits(ray_session):
    from ldpfed.engine.ray_engine import run_ray

    for algorithm in ("ldp-ols", "ldp-mab-ucb"):
        run = config(algorithm, spread=0.5, sizes=[1.0, 3.0, 2.0])
        local = run_local(run)
        for mode in ("pre-aggregated", "per-user"):
            assert_same(local, run_ray(run, actors=2, shards=2, mode=mode, placement="none"))


def test_ray_engine_gives_the_same_bits_with_a_population_left_empty(ray_session):
    # sizes 1 : 200 : 1 cut a round of 60 into 0, 59 and 1 users: a population with no one in it sends nothing
    from ldpfed.engine.ray_engine import run_ray

    run = config("ldp-mab-ucb", spread=0.5, sizes=[1.0, 200.0, 1.0])
    assert [len(round_users(federation_model(run), 0, 0, 60, p, 3)) for p in range(3)] == [0, 59, 1]
    local = run_local(run)
    assert (local.table["users_served"] == 60).all()
    for mode in ("pre-aggregated", "per-user"):
        assert_same(local, run_ray(run, actors=2, shards=2, mode=mode, placement="none"))


def test_the_sequential_loop_refuses_it():
    # the compiled sequential loop steps the run's one world: populations of their own are the round engines'
    from ldpfed.cli import main

    with pytest.raises(SystemExit) as caught:
        main(["run", "ldp-sgd", "--users", "200", "--federation", "heterogeneous", "--path", "sequential", "--quiet"])
    assert caught.value.code == 2
