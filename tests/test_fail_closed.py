"""Checks that fail closed: a shard whose domains check a public choice against the round's published model (the
scheduled arm of ldp-mab-ucb and sw-klucb-cf) rejects and counts, state unchanged, every message of a round whose
model it does not hold: never published, a recreated shard, a rewound round, a shuffled chunk, a resumed run, the
direct transport's fold. Once the model is published the honest message folds; and the engine publishes it to
recreated and resumed shards, so honest runs over Ray still equal run_local."""
import os
import signal

import numpy as np
import pytest

from ldpfed.algorithms import make_algorithm
from ldpfed.config import RunConfig
from ldpfed.engine import run_local
from ldpfed.engine.checkpoint import Checkpointer
from ldpfed.engine.core import add_sums, simulate_population
from ldpfed.engine.ray_shard import NO_MODEL, ShardCore, WireMessage, make_plan
from ldpfed.envs import make_env
from ldpfed.util.rng import derive
from test_faults import Interrupt, _run_with_fault, assert_same, interrupt_at
from test_server_domains import (_all_other_arm, _all_pulls_other_arm, as_message, attack_setup,
                                 published_model)
from test_shufflers import _chunks, _shard, shuffled

SCHEDULED = [("ldp-mab-ucb", _all_other_arm), ("sw-klucb-cf", _all_pulls_other_arm)]


def payload_of(algo, plan, users, messages):
    return messages if plan.mode == "per-user" else algo.aggregate(messages, users)


def assert_rejected_unchanged(core, results, rejected):
    """Every fold of `results` rejected with NO_MODEL, counted, nothing folded."""
    assert all(r == (0, 1) for r in results), results
    assert core.rejected == rejected and core.accepted == 0 and core.user_messages == 0
    assert core.rejected_by_reason == {NO_MODEL: rejected}
    assert core.stats()["rejected_by_reason"] == {NO_MODEL: rejected}
    assert core.rounds == {} and core.peek(0) == {}


# ---- no model published ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["per-user", "pre-aggregated"])
@pytest.mark.parametrize("name, attack", SCHEDULED)
def test_without_the_published_model_every_message_is_rejected_then_the_honest_one_folds(name, attack, mode):
    config, algo, plan, genuine = attack_setup(name, mode)
    core = ShardCore(plan, 0, algo)
    users, messages = genuine[1]                  # users past the warm-up: they pull the published arm
    bad = {f: v.copy() for f, v in messages.items()}
    attack(bad, users, algo)                      # they agree on one arm, not the published one
    honest = [as_message(config, plan, p, payload_of(algo, plan, *genuine[p]), len(genuine[p][0])) for p in (0, 1)]
    forged = as_message(config, plan, 1, payload_of(algo, plan, users, bad), len(users))
    assert_rejected_unchanged(core, [core.fold([m]) for m in (*honest, forged)], 3)
    core.publish(0, published_model(config, algo))
    assert core.fold([forged]) == (0, 1)
    assert core.rejected_by_reason[NO_MODEL] == 3 and core.rejected == 4
    assert any(k.endswith("not the published arm") for k in core.rejected_by_reason)
    assert core.fold(honest) == (2, 0)
    got = plan.assemble([core.collect(0)])
    want = None
    for p in (0, 1):
        want = add_sums(want, algo.aggregate(genuine[p][1], genuine[p][0]))
    for field in want:
        np.testing.assert_array_equal(got[field], want[field])


@pytest.mark.parametrize("mode", ["per-user", "pre-aggregated"])
def test_domains_that_need_no_published_model_fold_without_one(mode):
    config, algo, plan, genuine = attack_setup("ldp-sgd", mode)
    core = ShardCore(plan, 0, algo)
    assert core.model_fields == ()
    for p in (0, 1):
        users, messages = genuine[p]
        assert core.fold([as_message(config, plan, p, payload_of(algo, plan, users, messages), len(users))]) == (1, 0)
    assert core.rejected == 0 and core.collect(0)


def test_block_layout_a_whole_scheduled_field_is_checked_and_needs_the_model():
    """Per-user block layout: the shard that holds the whole `pulls` field checks the arms in full (published one
    included), so it needs the model; the shard holding only `feedback` does not."""
    config, algo, plan, genuine = attack_setup("sw-klucb-cf", "per-user")
    plan = make_plan(algo, config, 2, "per-user", "block")
    assert plan.layout == "block"
    users, messages = genuine[1]
    bad = {f: v.copy() for f, v in messages.items()}
    _all_pulls_other_arm(bad, users, algo)
    owner = next(s for s in plan.active_shards() if any(seg.field == "pulls" for seg in plan.segments[s]))
    other = next(s for s in plan.active_shards() if s != owner)
    core = ShardCore(plan, owner, algo)
    assert core.model_fields == ("pulls",)
    assert core.fold([as_message(config, plan, 1, messages, len(users), owner)]) == (0, 1)
    assert core.rejected_by_reason == {NO_MODEL: 1} and core.peek(0) == {}
    core.publish(0, published_model(config, algo))
    assert core.fold([as_message(config, plan, 1, bad, len(users), owner)]) == (0, 1)
    assert core.rejected_by_reason["out of domain (pulls): not the published arm"] == 1
    assert core.fold([as_message(config, plan, 1, messages, len(users), owner)]) == (1, 0)
    free = ShardCore(plan, other, algo)
    assert free.model_fields == ()
    assert free.fold([as_message(config, plan, 1, messages, len(users), other)]) == (1, 0)


# ---- a recreated shard, a rewound round -------------------------------------------------------------------------
def round_messages(config, plan, r):
    """The model published for round r (the state after rounds < r, as run_local updates it) and its populations'
    genuine per-user messages."""
    env = make_env(config)
    algo = make_algorithm(env, config)
    state = algo.initial_state(derive(config.seed, "init"))
    for k in range(r + 1):
        model = algo.publish(state)
        start, stop = plan.round_bounds(k)
        total, messages = None, {}
        for p in plan.populations_of(k):
            users = plan.users_of(k, p)
            m, _, _ = simulate_population(algo, env, model, config.seed, k, p, users, pre_aggregate=False)
            messages[p] = (users, {f: np.array(v) for f, v in m.items()})
            total = add_sums(total, algo.aggregate(m, users))
        if k < r:
            state = algo.update(state, total or {}, start, stop, derive(config.seed, "server", k))
    return model, messages


@pytest.mark.parametrize("mode", ["per-user", "pre-aggregated"])
def test_a_recreated_shard_rejects_until_the_round_is_published_again(mode):
    # what RayBackend._recover configures: a new shard that starts at the failed round, without its model
    config, algo, plan, _ = attack_setup("ldp-mab-ucb", mode)
    model, messages = round_messages(config, plan, 1)
    core = ShardCore(plan, 0, algo, first_round=1)
    sent = [(config.algorithm, 1, p, plan.split(payload_of(algo, plan, *messages[p]), len(messages[p][0]), p)[0])
            for p in messages]
    results = [core.fold([m]) for m in sent]
    assert all(r == (0, 1) for r in results) and core.rejected_by_reason == {NO_MODEL: len(sent)}
    assert core.accepted == 0 and core.rounds == {}
    core.publish(1, model)
    assert core.fold(sent) == (len(sent), 0) and core.collect(1)


def test_a_rewound_round_needs_its_model_published_again():
    config, algo, plan, genuine = attack_setup("ldp-mab-ucb", "per-user")
    core = ShardCore(plan, 0, algo)
    model = published_model(config, algo)
    sent = [as_message(config, plan, p, genuine[p][1], len(genuine[p][0])) for p in (0, 1)]
    core.publish(0, model)
    assert core.fold(sent) == (2, 0)
    first = core.collect(0)
    core.rewind(0)                     # the round is redone after a fault: its model is forgotten with it
    assert core.fold(sent) == (0, 2) and core.rejected_by_reason == {NO_MODEL: 2} and core.rounds == {}
    core.publish(0, model)
    assert core.fold(sent) == (2, 0)
    again = core.collect(0)
    assert [p for p, _ in again["populations"]] == [p for p, _ in first["populations"]]


def test_a_shard_actor_configured_for_a_later_round_rejects_until_published(ray_session):
    from ldpfed.engine.ray_engine import RemoteShard

    ray = ray_session
    config, algo, plan, _ = attack_setup("ldp-mab-ucb", "per-user")
    model, messages = round_messages(config, plan, 1)
    actor = RemoteShard.options(num_cpus=0).remote(config, plan, 0, 1, 1)      # first_round = 1, as a replacement
    try:
        sent = [WireMessage(config.algorithm, 1, p, messages[p][1]) for p in messages]
        assert ray.get(actor.fold.remote(sent)) == (0, len(sent))
        stats = ray.get(actor.stats.remote())
        assert stats["rejected_by_reason"] == {NO_MODEL: len(sent)} and stats["accepted"] == 0
        ray.get(actor.publish.remote(1, model))
        assert ray.get(actor.fold.remote(sent)) == (len(sent), 0)
    finally:
        ray.kill(actor)


# ---- the direct transport's fold ------------------------------------------------------------------------------
def test_the_direct_transports_fold_without_the_model_fails_the_round_and_counts():
    """ShardActor._fold_round is what a shard's channel loop runs per (round, published model) it is sent."""
    from ldpfed.engine.ray_engine import ShardActor

    config, algo, plan, genuine = attack_setup("ldp-mab-ucb", "per-user")
    actor = ShardActor()
    actor.core = ShardCore(plan, 0, algo)
    batch = [as_message(config, plan, p, genuine[p][1], len(genuine[p][0])) for p in (0, 1)]
    with pytest.raises(RuntimeError, match="incomplete"):
        actor._fold_round(0, iter([batch]), None)
    assert actor.core.rejected_by_reason == {NO_MODEL: 2} and actor.core.accepted == 0
    totals, accepted, rejected = actor._fold_round(0, iter([batch]), published_model(config, algo))
    assert (accepted, rejected) == (2, 0) and [p for p, _ in totals["populations"]] == [0, 1]


# ---- a shuffled chunk -----------------------------------------------------------------------------------------
def test_a_shuffled_chunk_without_the_model_is_rejected_then_folds():
    config = shuffled("ldp-mab-ucb", users=3000, shufflers=2)
    algo, plan, core = _shard(config)
    chunks = _chunks(config, algo, plan)
    assert plan.layout == "shuffled" and len(chunks) == 2
    # without the model a chunk's arms can be checked against their range only, which these pass
    assert algo.cached_domains()["arm"].anonymous_reason(chunks[0].payload["arm"], plan.share_users(0, 0)) is None
    assert core.fold(chunks) == (0, 2) and core.rejected_by_reason == {NO_MODEL: 2} and core.rounds == {}
    core.publish(0, algo.publish(algo.initial_state(np.random.default_rng(0))))    # the model _chunks used
    assert core.fold(chunks) == (2, 0)


# ---- a resumed run --------------------------------------------------------------------------------------------
def mab(**changes):
    return RunConfig("ldp-mab-ucb", **{**dict(users=600, round_size=30, populations=4, seed=3, delta=0.05),
                                       **changes})


def test_a_resumed_shard_rejects_until_the_saved_rounds_model_is_published(tmp_path):
    config = mab()
    with pytest.raises(Interrupt):
        run_local(config, progress=interrupt_at(210), checkpointer=Checkpointer(tmp_path, every_s=None))
    saved = Checkpointer(tmp_path, every_s=None).load(config)
    r = saved["next_round"]
    assert r == 7
    env = make_env(config)
    algo = make_algorithm(env, config)
    plan = make_plan(algo, config, 1, "pre-aggregated")
    model = algo.publish(saved["state"])
    core = ShardCore(plan, 0, algo, first_round=r)    # what RayBackend.open(first_round=r) configures
    sent = []
    for p in plan.populations_of(r):
        users = plan.users_of(r, p)
        sums, _, _ = simulate_population(algo, env, model, config.seed, r, p, users, pre_aggregate=True)
        sent.append((config.algorithm, r, p, plan.split(sums, len(users), p)[0]))
    assert core.fold(sent) == (0, len(sent)) and core.rejected_by_reason == {NO_MODEL: len(sent)}
    assert core.rounds == {}
    core.publish(r, model)
    assert core.fold(sent) == (len(sent), 0) and core.collect(r)


@pytest.mark.parametrize("transport", ["ray", "direct"])
def test_a_run_resumed_on_ray_equals_the_uninterrupted_one(ray_session, tmp_path, transport):
    from test_ray_engine import run_ray_unreserved

    config = mab()
    whole = run_local(config)
    with pytest.raises(Interrupt):
        run_local(config, progress=interrupt_at(210), checkpointer=Checkpointer(tmp_path, every_s=None))
    resumed = run_ray_unreserved(config, actors=2, shards=2, mode="per-user", transport=transport,
                      checkpointer=Checkpointer(tmp_path, every_s=None))
    assert resumed.summary["resumed_from_round"] == 7 and resumed.summary["rejected_messages"] == 0
    assert_same(whole, resumed)


# ---- a recreated shard in a run -------------------------------------------------------------------------------
@pytest.mark.parametrize("mode,transport", [("per-user", "ray"), ("pre-aggregated", "direct")])
def test_a_killed_shard_of_a_scheduled_arm_run_is_replaced_and_the_result_is_undisturbed(ray_session, mode,
                                                                                         transport):
    config = mab()

    def kill(pids):     # shard 0 holds the arms' field in both layouts (pre-aggregated: count, the first keys)
        os.kill(pids["shard"][0], signal.SIGKILL)
        return pids["shard"][0]

    result, pid = _run_with_fault(config, 150, kill, actors=2, shards=2, mode=mode, transport=transport)
    assert_same(run_local(config), result)
    s = result.summary
    assert s["recoveries"] == 1 and s["rejected_messages"] == 0
    assert [(a["kind"], a["old_pid"]) for a in s["recovery_events"][0]["actors"]] == [("shard", pid)]
