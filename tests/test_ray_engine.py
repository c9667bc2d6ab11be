"""The Ray engine on the session's Ray instance: same results as run_local whatever the actors, shards and mode;
shards reject and count malformed and duplicate messages without changing state; the stress job at small scale."""

import numpy as np
import pandas as pd
import pytest

from ldpfed.algorithms import REGISTRY, make_algorithm
from ldpfed.config import RunConfig
from ldpfed.engine import run_local
from ldpfed.engine.core import simulate_population
from ldpfed.engine.ray_shard import LatencyHistogram, ShardCore, make_plan
from ldpfed.envs import make_env
from ldpfed.util.errors import ConfigError
from ldpfed.util.rng import derive

LDP = [name for name in ("ldp-ols", "ldp-sgd") if name in REGISTRY]


def small(algorithm, **changes):
    base = dict(env="linear", users=600, round_size=60, populations=5, seed=7, env_params={"d": 3, "K": 4})
    return RunConfig(algorithm, **{**base, **changes})


def run_ray_unreserved(config, **options):
    """The Ray engine without a placement group (placement "none"). These tests are about what the rounds compute:
    such runs reuse any idle actor process of their kind whatever their shape, where a placement group's processes
    serve only runs of its own shape (tests/test_ray_placement.py tests the groups; tests/test_faults.py recovers
    through them)."""
    from ldpfed.engine.ray_engine import run_ray

    return run_ray(config, **{"placement": "none", **options})


def assert_same(local, remote):
    pd.testing.assert_frame_equal(local.table, remote.table, check_exact=True)
    assert local.summary["final_regret"] == remote.summary["final_regret"]
    for key in ("users_sending",):
        assert [row[key] for row in local.ledger] == [row[key] for row in remote.ledger]


@pytest.mark.parametrize("algorithm", LDP)
def test_equals_single_process_for_any_shards_actors_and_mode(ray_session, algorithm):
    config = small(algorithm)
    local = run_local(config)
    for actors, shards, mode, layout in [(2, 1, "pre-aggregated", None), (2, 4, "pre-aggregated", None),
                                         (3, 4, "per-user", None), (1, 1, "per-user", None),
                                         (2, 3, "per-user", "block")]:
        remote = run_ray_unreserved(config, actors=actors, shards=shards, mode=mode, layout=layout)
        assert_same(local, remote)
        s = remote.summary
        assert (s["engine"], s["actors"], s["shards"], s["mode"]) == ("ray", actors, shards, mode)
        assert (s["transport"], s["transport_fallback"]) == ("direct", None)    # the default for flat rounds
        assert s["groups"] == actors                  # few actors: flat by default
        assert s["rejected_messages"] == 0
        assert s["messages"] == config.users          # every user sent one privatized message
        # every (population, round) message folded once per shard that owns some of its keys
        per_round = config.populations if s["shard_layout"] == "population" else config.populations * min(
            shards, sum(int(np.prod(v)) for v in make_algorithm(make_env(config), config).message_spec().values()))
        assert s["shard_messages"] == config.rounds * per_round
        assert s["fold_latency_p50_ms"] > 0 and s["fold_latency_p99_ms"] >= s["fold_latency_p50_ms"]
        assert s["nodes"] == 1 and set(s["population_nodes"]) == set(range(config.populations))
    algo = make_algorithm(make_env(config), config)
    np.testing.assert_array_equal(algo.estimate(local.state), algo.estimate(remote.state))


@pytest.mark.parametrize("algorithm", LDP)
def test_tree_shape_equals_single_process_in_both_modes(ray_session, algorithm):
    # groups that do not divide the actors (3 + 3 + 1, 2 + 2 + 1): the shards fold the same objects in the same order
    config = small(algorithm, populations=7)
    local = run_local(config)
    shapes = [(7, 3, 1, "pre-aggregated"), (5, 2, 2, "pre-aggregated"), (7, 3, 2, "per-user"), (5, 2, 1, "per-user")]
    if algorithm != "ldp-sgd":      # both modes once more, on 5 actors: 7 more processes loading its kernels cost ~25 s
        shapes = shapes[1::2]
    for actors, group_size, shards, mode in shapes:
        remote = run_ray_unreserved(config, actors=actors, shards=shards, mode=mode, group_size=group_size)
        assert_same(local, remote)
        assert remote.summary["groups"] == -(-actors // group_size)
        for key in local.state:
            np.testing.assert_array_equal(local.state[key], remote.state[key])
    # max_in_flight bounds the driver's calls: the groups'
    assert_same(local, run_ray_unreserved(config, actors=7, shards=2, group_size=3, max_in_flight=1))


def test_auto_group_size():
    from ldpfed.engine.ray_engine import TREE_FROM_ACTORS, auto_group_size

    assert auto_group_size(TREE_FROM_ACTORS - 1) == 1 and auto_group_size(TREE_FROM_ACTORS) > 1
    assert [auto_group_size(a) for a in (100, 101, 1000)] == [10, 11, 32]


@pytest.mark.parametrize("algorithm", sorted(REGISTRY))
def test_every_registered_algorithm_equals_single_process_in_both_modes(ray_session, algorithm):
    config = RunConfig(algorithm, users=150, round_size=30, populations=3, seed=2, delta=0.05)
    local = run_local(config)
    for mode in ("pre-aggregated", "per-user"):
        assert_same(local, run_ray_unreserved(config, actors=2, shards=2, mode=mode))


def test_model_by_value_or_through_the_object_store_same_result(ray_session, monkeypatch):
    # a small model travels inside the population calls, a large one is put once per round: same rounds either way
    import ray

    from ldpfed.engine import ray_engine, ray_rounds
    from ldpfed.engine.ray_engine import _model_bytes

    assert _model_bytes({"theta": np.zeros(10), "beta": 1.5, "name": "ab"}) == (5 + 80) + (4 + 8) + (4 + 2)    # keys and values
    assert _model_bytes({"x": np.array([None], dtype=object)}) == float("inf")     # what an object array holds
    assert _model_bytes({"x": object()}) == float("inf")
    config = small(LDP[0] if LDP else "uniform")
    local = run_local(config)
    puts = []
    real_put = ray.put
    monkeypatch.setattr(ray_engine.ray, "put", lambda value, **kw: puts.append(1) or real_put(value, **kw))
    assert_same(local, run_ray_unreserved(config, actors=2, transport="ray"))    # the Ray transport's calls carry the model
    assert puts == []                                     # d = 3: by value
    monkeypatch.setattr(ray_rounds, "INLINE_MODEL_BYTES", 0)     # where the rounds read it
    assert_same(local, run_ray_unreserved(config, actors=2, transport="ray"))
    assert len(puts) == config.rounds                     # one put per round
    assert_same(local, run_ray_unreserved(config, actors=3, group_size=2))      # the leaders pass the ref on to their members
    assert len(puts) == 2 * config.rounds


def test_last_round_smaller_than_populations_and_no_message_algorithm(ray_session):
    # T=103, B=25, P=4: the last round has 3 users, so one population is empty there
    for algorithm in LDP[:1] + ["uniform"]:
        config = small(algorithm, users=103, round_size=25, populations=4)
        assert_same(run_local(config), run_ray_unreserved(config, actors=3, shards=2))


def test_fewer_populations_than_actors_warns_and_uses_one_actor_per_population(ray_session):
    config = small(LDP[0], populations=2)
    with pytest.warns(RuntimeWarning, match="populations=2 < actors=3: the run uses 2 population actors"):
        remote = run_ray_unreserved(config, actors=3)
    assert remote.summary["actors"] == 2
    assert_same(run_local(config), remote)


def test_which_population_actors_move_onto_joined_nodes():
    from ldpfed.engine.ray_engine import moves_onto

    pop, shard = ("population", 0), ("shard", 0)
    # the head held population 0 and the shard, a worker population 1: population 0 moves to the joined node
    assert moves_onto(["new"], {pop: "head", ("population", 1): "w1", shard: "head"}) == {pop: "new"}
    # balanced already (one actor per node): nothing moves; nothing joined: nothing moves
    assert moves_onto(["new"], {pop: "head", ("population", 1): "w1"}) == {}
    assert moves_onto([], {("population", a): "head" for a in range(4)}) == {}
    # after a node loss the head held 4 population actors and the shard: the highest indices move first, each to
    # the joined node with the fewest, until the head has at most one more than them: head 2 (population 0 and the
    # shard, which never moves), b 2, a 1
    where = {**{("population", a): "head" for a in range(4)}, shard: "head"}
    assert moves_onto(["b", "a"], where) == {("population", 3): "b", ("population", 2): "a", ("population", 1): "b"}
    assert moves_onto(["new"], {shard: "head", ("shard", 1): "head", ("shard", 2): "head"}) == {}


def test_progress_and_bad_options(ray_session):
    seen = []
    config = small("uniform", users=120, round_size=40, populations=2)
    # rebalance_every=0: a look for joined nodes before every round; on one node none joins, nothing moves
    remote = run_ray_unreserved(config, actors=2, progress=lambda done, regret: seen.append(done), rebalance_every=0)
    assert seen == [0, 40, 80, 120]        # 0: the engine starts the clock of its rate
    assert remote.summary["rebalances"] == []
    for options, field in [({"actors": 0}, "actors"), ({"shards": -1}, "shards"), ({"mode": "batch"}, "mode"),
                           ({"max_in_flight": 0}, "max_in_flight"), ({"group_size": -1}, "group_size"),
                           ({"group_size": 2.5}, "group_size"), ({"group_size": True}, "group_size"),
                           ({"rebalance_every": -1}, "rebalance_every"),
                           ({"rebalance_every": "30"}, "rebalance_every")]:
        with pytest.raises(ConfigError) as error:
            run_ray_unreserved(config, **options)
        assert error.value.field == field


def test_max_in_flight_bounds_calls_and_keeps_the_result(ray_session):
    config = small(LDP[0] if LDP else "uniform", populations=4)
    assert_same(run_local(config), run_ray_unreserved(config, actors=4, shards=2, max_in_flight=1, transport="ray"))


# ---- malformed and duplicate messages ---------------------------------------------------------------------

def shard_setup(mode, shards=2, algorithm=None, layout=None):
    algorithm = algorithm or (LDP[0] if LDP else None)
    if algorithm is None:
        pytest.skip("no LDP algorithm registered yet")
    config = small(algorithm, users=40, round_size=20, populations=4)
    algo = make_algorithm(make_env(config), config)
    plan = make_plan(algo, config, shards, mode, layout)
    return config, algo, plan


def good_messages(config, algo, plan, round_index, population, shard):
    """A genuine message (the client half's, from the initial model): shards check the output domains."""
    users = plan.users_of(round_index, population)
    model = algo.publish(algo.initial_state(derive(config.seed, "init")))
    messages, _, _ = simulate_population(algo, make_env(config), model, config.seed, round_index, population, users,
                                         pre_aggregate=False)
    payload = algo.aggregate(messages, users) if plan.mode == "pre-aggregated" else messages
    return (config.algorithm, round_index, population, plan.split(payload, len(users), population)[shard])


def malformed_variants(config, plan, good):
    algorithm, r, p, payload = good
    field = sorted(payload)[0]
    def with_value(value):
        return (algorithm, r, p, {**payload, field: value})
    nan = payload[field].copy()
    nan.reshape(-1)[0] = np.nan
    inf = payload[field].copy()
    inf.reshape(-1)[-1] = np.inf
    return {
        "wrong shape": with_value(payload[field][..., :-1].copy() if payload[field].shape[-1] > 1
                                  else np.zeros(payload[field].shape + (2,))),
        "wrong dtype": with_value(payload[field].astype(np.float32)),
        "wrong dtype (object)": with_value(payload[field].astype(object)),
        "non-finite (nan)": with_value(nan),
        "non-finite (inf)": with_value(inf),
        "wrong fields": (algorithm, r, p, {**payload, "extra": np.zeros(1)}),
        "missing field": (algorithm, r, p, {k: v for k, v in payload.items() if k != field}),
        "unknown algorithm": ("no-such-algorithm", r, p, payload),
        "unknown round": (algorithm, r + 1, p, payload),
        "round out of the run": (algorithm, 10**6, p, payload),
        "negative round": (algorithm, -1, p, payload),
        "unknown population": (algorithm, r, config.populations, payload),
        "not a tuple": [algorithm, r, p, payload],
        "short tuple": (algorithm, r, p),
        "payload not a dict": (algorithm, r, p, list(payload.values())),
    }


@pytest.mark.parametrize("mode,shards,layout", [("pre-aggregated", 2, None), ("per-user", 2, "population"),
                                               ("per-user", 3, "block")])
def test_shard_rejects_and_counts_malformed_and_duplicates_state_unchanged(mode, shards, layout):
    config, algo, plan = shard_setup(mode, shards, layout=layout)
    shard = 0
    mine = plan.populations_of(0, shard)          # the populations that send to this shard in round 0
    assert len(mine) >= 2
    core = ShardCore(plan, shard, algo)
    good = good_messages(config, algo, plan, 0, mine[0], shard)
    assert core.fold([good]) == (1, 0)
    before = core.peek(0)
    bad = malformed_variants(config, plan, good_messages(config, algo, plan, 0, mine[1], shard))
    bad["duplicate"] = good
    if plan.layout == "population":   # a population that belongs to another shard
        other = next(p for p in range(config.populations) if not plan.sends_to(p, shard))
        bad["population of another shard"] = good_messages(config, algo, plan, 0, other, other % shards)
    for name, message in bad.items():
        assert core.fold([message]) == (0, 1), name
        after = core.peek(0)
        assert after["seen"] == before["seen"] and after["folded"] == before["folded"], name
        for field, value in before["totals"].items():
            np.testing.assert_array_equal(after["totals"][field], value, err_msg=name)
    assert core.rejected == len(bad) and core.accepted == 1
    assert core.rejected_by_reason["duplicate"] == 1
    assert core.rejected_by_reason["non-finite"] == 2 and core.rejected_by_reason["wrong dtype"] == 2
    # the genuine messages are still accepted after all that, and the round completes
    assert core.fold([good_messages(config, algo, plan, 0, p, shard) for p in mine[1:]]) == (len(mine) - 1, 0)
    totals = core.collect(0)
    if plan.layout == "population":
        assert [p for p, _ in totals["populations"]] == mine
    else:
        assert set(totals) == {seg.field for seg in plan.segments[shard]}
    # a late copy of a collected round is rejected too
    assert core.fold([good]) == (0, 1) and core.rejected_by_reason["closed round"] == 1


def test_shard_folds_in_population_order_whatever_the_arrival_order():
    config, algo, plan = shard_setup("pre-aggregated", shards=1)
    config = config.replace(populations=5, round_size=20)
    plan = make_plan(algo, config, 1, "pre-aggregated")
    messages = [good_messages(config, algo, plan, 0, p, 0) for p in range(5)]
    in_order, shuffled = ShardCore(plan, 0, algo), ShardCore(plan, 0, algo)
    in_order.fold(messages)
    shuffled.fold([messages[i] for i in (3, 1, 4, 0, 2)])
    a, b = in_order.collect(0), shuffled.collect(0)
    for field in a:
        np.testing.assert_array_equal(a[field], b[field])
    with pytest.raises(RuntimeError, match="incomplete"):
        ShardCore(plan, 0, algo).collect(0)


def test_shard_actor_rejects_over_ray(ray_session):
    from ldpfed.engine.ray_engine import RemoteShard

    config, algo, plan = shard_setup("per-user", shards=1)
    config = config.replace(populations=2)
    plan = make_plan(algo, config, 1, "per-user")
    actor = RemoteShard.options(num_cpus=0).remote(config, plan, 0)
    ray = ray_session
    good = good_messages(config, algo, plan, 0, 0, 0)
    bad = malformed_variants(config, plan, good_messages(config, algo, plan, 0, 1, 0))
    assert ray.get(actor.fold.remote([good])) == (1, 0)
    before = ray.get(actor.peek.remote(0))
    assert ray.get(actor.fold.remote(list(bad.values()) + [good])) == (0, len(bad) + 1)
    after = ray.get(actor.peek.remote(0))
    assert after["seen"] == before["seen"]
    stats = ray.get(actor.stats.remote())
    assert stats["rejected"] == len(bad) + 1 and stats["accepted"] == 1
    ray.kill(actor)


def test_latency_histogram_quantiles():
    h = LatencyHistogram()
    for ms in range(1, 101):
        h.add(ms / 1000)
    assert 0.049 <= h.quantile(0.5) <= 0.0515
    assert 0.098 <= h.quantile(0.99) <= 0.102
    assert LatencyHistogram().quantile(0.5) is None


# ---- the stress job, small ----------------------------------------------------------------------------------

@pytest.mark.skipif(not LDP, reason="no LDP algorithm registered yet")
def test_stress_small_no_loss_no_double_count(ray_session):
    from ldpfed.stress.exactness import run_stress

    lines = []
    ok, rows = run_stress(LDP[0], d=3, K=4, shard_counts=(1, 3), populations=4, users_per_message=6, rounds=4,
                          senders=2, batch=3, max_in_flight=2, inject=2, max_seconds=120, log=lines.append)
    assert ok, lines
    assert [row["shards"] for row in rows] == [1, 3]
    for row in rows:
        assert row["errors"] == [] and row["rejected"] == 2 * 2 * 2    # 2 senders x (2 duplicates + 2 corrupted)
        assert row["user_messages"] == 4 * 6 * 4 and row["messages_per_s"] > 0
        assert row["fold_p99_ms"] >= row["fold_p50_ms"] > 0


@pytest.mark.skipif(not LDP, reason="no LDP algorithm registered yet")
def test_stress_check_catches_a_lost_and_a_double_counted_message():
    from ldpfed.stress.exactness import check, recompute

    config = RunConfig(LDP[0], env="linear", users=2 * 2 * 3, round_size=2 * 3, populations=2, seed=0,
                       env_params={"d": 3, "K": 4})
    algo = make_algorithm(make_env(config), config)
    plan = make_plan(algo, config, 1, "per-user")
    expected = recompute(config)

    def run(messages):
        core = ShardCore(plan, 0, algo, max_open_rounds=config.rounds)
        core.fold(messages)
        totals = []
        for r in range(config.rounds):
            try:
                totals.append([core.collect(r)])
            except RuntimeError:
                core.next_round += 1
                totals.append([{f: np.zeros(int(np.prod(s))) for f, s in plan.sum_spec.items()}])
        return check(config, plan, expected, totals, [core.stats()], [len(messages)], 0)[1]

    from ldpfed.engine.core import simulate_population
    from ldpfed.util.rng import derive
    env = make_env(config)
    model = algo.publish(algo.initial_state(derive(config.seed, "init")))
    messages = []
    for r in range(config.rounds):
        for p in range(config.populations):
            users = plan.users_of(r, p)
            payload, _, _ = simulate_population(algo, env, model, config.seed, r, p, users, pre_aggregate=False)
            messages.append((config.algorithm, r, p, plan.split(payload, len(users), p)[0]))
    assert run(messages) == []
    assert run(messages[1:])          # one lost
    twice = ShardCore(plan, 0, algo, max_open_rounds=config.rounds)
    twice.fold(messages + messages[:1])
    assert twice.rejected == 1        # the copy is refused, not folded twice
