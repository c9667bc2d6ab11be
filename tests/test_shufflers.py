"""Shuffler actors: under --trust shuffle the Ray engine's populations send their users' messages
to S shufflers, which permute each round's share (ldpfed.trust.shuffling) and forward anonymous chunks to the
shards; run_local sums the same permuted chunks, so the engines agree bit for bit."""
from __future__ import annotations

import os
import signal

import numpy as np
import pandas as pd
import pytest

from ldpfed.algorithms import make_algorithm
from ldpfed.trust.shuffling import CHUNK_MESSAGES, chunk_bounds, permutation, share_bounds, shuffle_share
from ldpfed.config import RunConfig
from ldpfed.engine.local import run_local
from ldpfed.engine.ray_shard import ShardCore, ShuffledChunk, WireMessage, make_plan
from ldpfed.envs import make_env
from ldpfed.util.errors import ConfigError


# Algorithms whose public schedule sets a few users apart (their groups amplify nothing at these sizes): they run
# unamplified here, which keeps every shuffler and shard step (tests/test_shuffle_groups.py checks the accounting).
SCHEDULED = ("ldp-mab-ucb", "ldp-sgd-multi")


def shuffled(algorithm="ldp-sgd", **changes):
    # 3000 users per round: with S = 2 each shuffler forwards two chunks (1024 + 476), so chunk order matters
    options = {"small_groups": "no-amplification" if algorithm in SCHEDULED else "refuse"}
    options.update({key: changes.pop(key) for key in ("shufflers", "small_groups") if key in changes})
    base = dict(users=6000, round_size=3000, populations=3, eps=1.0, delta=1e-6, seed=3, trust="shuffle")
    if changes.get("trust", "shuffle") != "shuffle":      # another model: only the options given
        options.pop("small_groups")
    return RunConfig(algorithm, **{**base, **changes}, trust_options=options)


def assert_same(a, b):
    pd.testing.assert_frame_equal(a.table, b.table, check_exact=True)
    for key in a.state:
        assert np.array_equal(a.state[key], b.state[key]), key


# ---- the plan: pure functions of (seed, round, shuffler) -------------------------------------------------------
def test_the_permutation_is_deterministic_and_differs_across_rounds_and_shufflers():
    first = permutation(7, 2, 1, 500)
    assert np.array_equal(first, permutation(7, 2, 1, 500)) and sorted(first) == list(range(500))
    others = [permutation(7, 3, 1, 500), permutation(7, 2, 0, 500), permutation(8, 2, 1, 500)]
    assert all(not np.array_equal(first, other) for other in others)


def test_shares_cover_the_round_and_chunks_have_the_fixed_size():
    for n, S in ((3000, 2), (10, 3), (1001, 4)):
        bounds = [share_bounds(n, s, S) for s in range(S)]
        assert bounds[0][0] == 0 and bounds[-1][1] == n and all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
        assert {hi - lo for lo, hi in bounds} <= {n // S, n // S + 1}
    sizes = [hi - lo for lo, hi in chunk_bounds(2500)]
    assert sizes == [CHUNK_MESSAGES, CHUNK_MESSAGES, 2500 - 2 * CHUNK_MESSAGES]
    messages = {"Z": np.arange(2500.0)[:, None]}
    chunks = shuffle_share(1, 0, 0, messages)
    assert sorted(np.concatenate([c["Z"][:, 0] for c in chunks])) == list(range(2500))    # a permutation


# ---- options and accounting ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [0, -1, 1.5, True, "2"])
def test_bad_shufflers_are_refused_naming_the_option(value):
    with pytest.raises(ConfigError, match="shufflers"):
        shuffled(shufflers=value)


def test_shufflers_need_the_shuffle_trust_model():
    with pytest.raises(ConfigError, match="trust_options.shufflers.*only the shuffle trust model takes it"):
        shuffled(trust="local", shufflers=2)


def test_the_batch_is_a_shufflers_share_and_too_small_a_share_is_refused():
    s = run_local(shuffled(shufflers=3, users=3000)).summary
    assert s["privacy_shuffle_batch"] == 1000
    with pytest.raises(ConfigError, match="round_size.*1500 shufflers.*lower --shufflers"):
        run_local(shuffled(shufflers=1500, users=3000))


# ---- the engines agree ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm,shufflers,shards,changes", [
    ("ldp-sgd", 1, 1, {}), ("ldp-sgd", 2, 2, {}), ("ldp-mab-ucb", 3, 2, {}),
    # amplified, with warm-up groups of 100 users per share: the shuffler actors check the groups' public counts
    ("ldp-sgd-multi", 2, 2, {"users": 30_000, "round_size": 15_000, "small_groups": "refuse"})])
def test_ray_with_shufflers_is_bit_identical_to_run_local(ray_session, algorithm, shufflers, shards, changes):
    from test_ray_engine import run_ray_unreserved

    config = shuffled(algorithm, shufflers=shufflers, **changes)
    local = run_local(config)
    ray_result = run_ray_unreserved(config, actors=2, shards=shards, mode="per-user", group_size=2)
    assert_same(local, ray_result)
    s = ray_result.summary
    assert s["groups"] == 2         # the shuffle trust model keeps the flat shape, whatever group_size says
    assert s["shufflers"] == shufflers and s["shard_layout"] == "shuffled" and s["rejected_messages"] == 0
    assert s["shuffler_messages"] == config.users and s["shard_messages"] == sum(
        len(chunk_bounds(hi - lo)) * config.rounds for lo, hi in (share_bounds(config.round_size, k, shufflers)
                                                                 for k in range(shufflers)))


def test_pre_aggregated_mode_is_refused_under_shuffle(ray_session):
    from test_ray_engine import run_ray_unreserved

    with pytest.raises(ConfigError, match="mode.*per-user"):
        run_ray_unreserved(shuffled(), actors=1, shards=1, mode="pre-aggregated")


def test_a_killed_shuffler_is_recreated_and_the_result_is_undisturbed(ray_session):
    from ldpfed.engine.driver import drive
    from ldpfed.engine.ray_engine import RayBackend

    config = shuffled(shufflers=2, users=9000)
    # recovery without a placement group (placement "none"; tests/test_faults.py recovers through groups)
    backend, killed = RayBackend(actors=2, shards=2, mode="per-user", placement="none"), []

    def kill_after_the_first_round(done, regret):
        if done == 3000 and not killed:
            killed.append(backend.pids()["shuffler"][-1])
            os.kill(killed[0], signal.SIGKILL)

    try:
        result = drive(config, backend, progress=kill_after_the_first_round)
    finally:
        backend.release(reuse=False)
    assert killed and result.summary["recoveries"] == 1
    assert [e["kind"] for e in result.summary["recovery_events"][0]["actors"]] == ["shuffler"]
    assert_same(run_local(config), result)


# ---- what a shard sees --------------------------------------------------------------------------------------------
def _shard(config, shards=1):
    algo = make_algorithm(make_env(config), config)
    plan = make_plan(algo, config, shards, "per-user")
    return algo, plan, ShardCore(plan, 0, algo)


def _chunks(config, algo, plan, shuffler=0):
    """The real chunks of shuffler `shuffler` in round 0 (what a ShufflerActor forwards)."""
    from ldpfed.engine.core import simulate_population
    env = make_env(config)
    users = plan.share_users(0, shuffler)
    model = algo.publish(algo.initial_state(np.random.default_rng(0)))
    messages, _, _ = simulate_population(algo, env, model, config.seed, 0, 0, users, pre_aggregate=False)
    return [ShuffledChunk(config.algorithm, 0, shuffler, c, chunk)
            for c, chunk in enumerate(shuffle_share(config.seed, 0, shuffler, messages))]


def test_a_shard_sees_chunks_without_population_or_user_and_checks_them():
    config = shuffled(shufflers=2)
    algo, plan, core = _shard(config)
    chunks = _chunks(config, algo, plan)
    assert plan.layout == "shuffled" and ShuffledChunk._fields == ("algorithm", "round", "shuffler", "chunk",
                                                                     "payload")
    assert set(chunks[0].payload) == set(algo.message_spec())       # the messages' fields only: no user, no index
    assert core.fold(chunks) == (2, 0)
    assert core.fold(chunks[:1]) == (0, 1) and core.stats()["rejected_by_reason"] == {"duplicate": 1}
    # a population's message (the unshuffled wire format) is not accepted by a shuffled shard
    assert core.fold([WireMessage(config.algorithm, 0, 0, chunks[0].payload)]) == (0, 1)
    bad = chunks[1].payload["Z"].copy()
    bad[0] *= 2.0                                                   # off the l2-ball's sphere
    assert core.fold([ShuffledChunk(config.algorithm, 0, 0, 5, chunks[1].payload)]) == (0, 1)   # no such chunk
    _, _, fresh = _shard(config)
    assert fresh.fold([chunks[0], chunks[1]._replace(payload={"Z": bad})]) == (1, 1)
    assert "out of domain (Z): not on the sphere" in fresh.stats()["rejected_by_reason"]


def test_a_scheduled_arm_is_checked_as_a_multiset_of_the_public_schedule():
    """ldp-mab-ucb's arms follow a public schedule (user t < K pulls arm t, the others the published arm): a
    shuffled chunk must hold each scheduled arm at most as often as the shuffler's users do."""
    config = shuffled("ldp-mab-ucb", users=3000, shufflers=2)
    algo, plan, core = _shard(config)
    chunks = _chunks(config, algo, plan)
    model = algo.publish(algo.initial_state(np.random.default_rng(0)))
    core.publish(0, model)
    domain = algo.cached_domains()["arm"]
    users = plan.share_users(0, 0)
    arms = np.concatenate([c.payload["arm"] for c in chunks])
    assert domain.anonymous_reason(arms, users, model) is None
    twice = arms.copy()
    twice[twice == 0] = 1          # arm 0 is one user's (user 0) and the published arm's: move them to arm 1
    assert "not on the public schedule" in domain.anonymous_reason(twice, users, model)
    # without the published model only the arms' range can be checked: round 0's mixed arms pass, arm K does not
    assert domain.anonymous_reason(twice, users) is None
    assert domain.anonymous_reason(np.append(arms, algo.K), users) is not None
    assert core.fold(chunks) == (2, 0)


def test_public_slots_are_checked_as_a_multiset_of_the_schedule():
    """ldp-sgd-multi: a user t < K s0 sends slot t % K only, later ones every slot (public `sent_slots`); its fields
    Z (slots) and n (exact public counts) are checked per chunk against the shuffler's users as a multiset."""
    config = shuffled("ldp-sgd-multi", users=3000, shufflers=2)
    algo, plan, core = _shard(config)
    chunks = _chunks(config, algo, plan)
    assert core.fold(chunks) == (2, 0)
    domain, users = algo.cached_domains()["n"], plan.share_users(0, 0)
    counts = np.concatenate([c.payload["n"] for c in chunks])
    assert domain.anonymous_reason(counts, users) is None
    warm = int((np.asarray(algo.sent_slots(users)).sum(axis=1) == 1).sum())   # users that send one slot
    assert 0 < warm < len(users)
    tampered = counts.copy()
    every = np.flatnonzero(tampered.sum(axis=1) == algo.K)[:warm + 1]
    tampered[every] = np.eye(algo.K)[0]          # more "slot 0 only" messages than users with that schedule
    assert "not on the public schedule" in domain.anonymous_reason(tampered, users)


def test_a_fold_that_reads_the_users_index_cannot_be_shuffled():
    """The shuffled server folds a chunk with no user index: an aggregate that files a message by its user's index
    (here: arm = user mod K, instead of the message's arm) is refused, naming trust."""
    from numba import njit

    from ldpfed.algorithms.ldp_reductions import LdpMabUcb
    from ldpfed.trust.shuffle import check_shuffled

    @njit
    def fold_by_user(consts, user, row, out):
        K = out.shape[0] // 2
        out[user % K] += 1.0
        out[K + user % K] += row[1]

    class ByUser(LdpMabUcb):
        def steps(self):
            return super().steps()._replace(fold=fold_by_user)

    config = RunConfig("ldp-mab-ucb", users=3000, round_size=1000)
    world = make_env(config).public()
    check_shuffled(LdpMabUcb(world, config))                  # its fold reads the message's arm only
    with pytest.raises(ConfigError, match="trust.*folds a message by its user's index"):
        check_shuffled(ByUser(world, config))


def test_the_shuffler_stage_of_the_stress_job_runs_small(ray_session):
    from ldpfed.stress.shuffler import measure_shufflers, shuffler_table

    row = measure_shufflers("ldp-sgd", d=3, K=4, shufflers=2, round_users=2000, populations=2, seconds=0.3,
                            in_flight=1, log=lambda line: None)     # round 0's chunks checked against the plan
    assert row["share_users"] == 1000 and row["calls"] >= 2 and row["messages_per_s"] > 0
    assert len(shuffler_table([row])) == 3
