"""A server that trusts no client: every message field of every algorithm has an output domain, honest messages lie
in it, and the attacks below (built as an attacker would, from genuine messages) are rejected and counted by
a shard, with its state unchanged, in per-user and pre-aggregated mode, in process and over Ray."""
import numpy as np
import pytest

from ldpfed.algorithms import REGISTRY, make_algorithm
from ldpfed.config import RunConfig
from ldpfed.engine.core import add_sums, population_users, simulate_population
from ldpfed.engine.ray_shard import ShardCore, make_plan
from ldpfed.envs import make_env
from ldpfed.mechanisms import (Domain, GaussianMechanism, L2BallMechanism, LaplaceMechanism, RandomizedResponse,
                               SymmetricGaussianMechanism, gaussian_tail_z)
from ldpfed.mechanisms.domains import FIELD_TAIL_PROB
from ldpfed.util.rng import derive


# ---- mechanisms state their output domains ------------------------------------------------------------------

def test_mechanism_output_domains_hold_for_honest_outputs_and_exclude_the_rest():
    rng = np.random.default_rng(0)
    users = np.arange(2000)
    l2 = L2BallMechanism(2.0, 1.0, 5)
    g = rng.standard_normal((2000, 5))
    g *= 2.0 / np.linalg.norm(g, axis=1, keepdims=True) * rng.random((2000, 1))
    Z = l2.privatize(g, rng)
    sphere = l2.output_domain((5,))
    assert sphere.reason(Z, users) is None
    assert sphere.reason(Z * (1 + 1e-6), users) == "not on the sphere"     # inside the ball is not an output
    assert sphere.reason(Z * 0.5, users) == "not on the sphere"

    rr = RandomizedResponse(1.0)
    bits = rr.privatize(rng.integers(0, 2, size=2000), rng)
    assert rr.output_domain(()).reason(bits, users) is None
    assert rr.output_domain(()).reason(np.where(users == 3, 7, bits), users) is not None
    assert rr.output_domain(()).reason(np.where(users == 3, 0.5, bits), users) is not None

    # Gaussian: data in [-1, 1] plus noise; the tail bound is the one stated (union bound over the coordinates)
    gauss = GaussianMechanism(2.0, 1.0, 0.01)
    dom = gauss.output_domain((4,), 1.0)
    z = gaussian_tail_z(4)
    assert 2 * 4 * 0.5 * __import__("math").erfc(z / 2 ** 0.5) == pytest.approx(FIELD_TAIL_PROB, rel=1e-6)
    np.testing.assert_allclose(dom.high, 1.0 + z * gauss.sigma)
    y = gauss.privatize(np.clip(rng.standard_normal((2000, 4)), -1, 1), rng)
    assert dom.reason(y, users) is None
    assert dom.reason(np.where(users[:, None] == 5, 1.0 + 1.01 * z * gauss.sigma, y), users) == "outside the bounds"

    sym = SymmetricGaussianMechanism(1.0, 1.0, 0.01)
    M = sym.privatize(np.zeros((50, 3, 3)), rng)
    sdom = sym.output_domain((3, 3), 1.0)
    assert sdom.reason(M, users[:50]) is None
    assert sdom.sum_bounds(users[:50]).reason(M.sum(axis=0).reshape(-1)) is None
    M[0, 0, 1] += 1e-3      # symmetry is checked on aggregates (a skew part must cancel to change nothing)
    assert sdom.sum_bounds(users[:50]).reason(M.sum(axis=0).reshape(-1)) == "not symmetric"

    lap = LaplaceMechanism(1.0, 1.0)
    ldom = lap.output_domain((3,), 1.0)
    assert ldom.reason(lap.privatize(np.zeros((2000, 3)), rng), users) is None
    assert ldom.reason(np.full((1, 3), 1e9), users[:1]) == "outside the bounds"


def test_gaussian_sum_bound_is_the_tail_of_a_sum():
    gauss = GaussianMechanism(2.0, 1.0, 0.01)
    dom = gauss.output_domain((2,), 1.0)
    bounds = dom.sum_bounds(np.arange(100))
    z = gaussian_tail_z(2)
    np.testing.assert_allclose(bounds.high, 100 * 1.0 + z * gauss.sigma * 10.0)
    assert bounds.reason(np.array([0.0, 100 + z * gauss.sigma * 10.0 * 1.001])) is not None
    assert bounds.reason(np.array([0.0, 100 + z * gauss.sigma * 10.0 * 0.999])) is None


# ---- every algorithm: every field declared, honest messages inside ------------------------------------------

def honest_config(name):
    # delta 0.05 as the registry-wide engine test; 10 rounds of 30 users so the multi-parameter warm-up ends inside
    return RunConfig(name, users=300, round_size=30, populations=3, seed=2, delta=0.05)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_field_declares_a_domain_and_honest_messages_pass(name):
    config = honest_config(name)
    env = make_env(config)
    algo = make_algorithm(env, config)
    domains = algo.message_domains()
    spec = algo.message_spec()
    assert set(domains) == set(spec)
    for field, domain in domains.items():
        assert isinstance(domain, Domain) and domain.shape == tuple(spec[field]) and domain.source, field
        if algo.privacy_model == "ldp" and field not in algo.public_fields:
            assert field in algo.mechanisms, f"{field}: a private field's domain comes from its mechanism"
    state = algo.initial_state(derive(config.seed, "init"))
    for r in range(config.rounds):
        model = algo.publish(state)
        start, stop = r * config.round_size, (r + 1) * config.round_size
        total = None
        for p in range(config.populations):
            users = population_users(start, stop, p, config.populations)
            messages, _, _ = simulate_population(algo, env, model, config.seed, r, p, users, pre_aggregate=False)
            for field, value in messages.items():
                assert domains[field].reason(np.asarray(value), users) is None, (r, p, field)
            sums = algo.aggregate(messages, users)
            bounds = algo.aggregate_bounds(users)
            assert set(bounds) == set(sums)
            for field, value in sums.items():
                assert bounds[field].reason(np.asarray(value, dtype=float).reshape(-1)) is None, (r, p, field)
            total = add_sums(total, sums)
        state = algo.update(state, total or {}, start, stop, derive(config.seed, "server", r))


# ---- the attacks: forged messages built from genuine ones ------------------------------------------------------

def _set(field, index, value):
    def attack(m, users, algo):
        m[field][index] = value
    return attack


def _scale_row(field, factor):
    def attack(m, users, algo):
        m[field][0] = m[field][0] * factor
    return attack


def _other_arm(m, users, algo):       # the last user pulls an arm that is not the round's scheduled one
    m["arm"][-1] = (m["arm"][-1] + 1) % algo.K


def _all_other_arm(m, users, algo):   # every user past the first K on one arm, not the one the server published
    late = np.asarray(users) >= algo.K
    m["arm"][late] = (m["arm"][late] + 1) % algo.K


def _all_pulls_other_arm(m, users, algo):
    late = np.flatnonzero(np.asarray(users) >= algo.K)
    m["pulls"][late] = np.roll(m["pulls"][late], 1, axis=1)
    m["feedback"][late] = np.roll(m["feedback"][late], 1, axis=1)


def _pulls_other_arm(m, users, algo):
    arm = int(np.argmax(m["pulls"][-1]))
    m["pulls"][-1] = 0.0
    m["pulls"][-1, (arm + 1) % algo.K] = 1.0
    m["feedback"][-1] = 0.0


def _feedback_every_slot(m, users, algo):   # every user (so that the population's sum shows it too)
    m["feedback"][:] = 1.0


def _bit(m, users, algo):
    m["feedback"][0, int(np.argmax(m["pulls"][0]))] = 7.0


def _not_symmetric(m, users, algo):
    m["M"][0, 0, 1] += 1.0


def _x_too_long(m, users, algo):
    m["z"][0, :-1] *= 2.0 / np.linalg.norm(m["z"][0, :-1])


# per-user attacks: (name, how a genuine message is changed)
PER_USER = {
    "ldp-sgd": [("Z row of norm 1.4e12", _scale_row("Z", 1.4e12)), ("Z inside the ball", _scale_row("Z", 0.5))],
    "ldp-ols": [("u entries 1e6", _set("u", 0, 1e6)), ("M entries 1e150", _set("M", 0, 1e150)),
                ("M not symmetric", _not_symmetric)],
    "sw-klucb-cf": [("randomized-response bit of 7", _bit), ("feedback 1 in every arm slot (every user)", _feedback_every_slot),
                    ("pulls = -3", _set("pulls", (0, 0), -3.0)), ("pulls not the scheduled arm", _pulls_other_arm),
                    ("every user's pulls on an arm the server did not publish", _all_pulls_other_arm)],
    "ldp-mab-ucb": [("noisy reward 1e9", _set("reward", 0, 1e9)), ("arm not the scheduled arm", _other_arm),
                    ("every user on an arm the server did not publish", _all_other_arm),
                    ("arm 99", _set("arm", 0, 99)), ("arm -1", _set("arm", 0, -1))],
    "ldp-ols-multi": [("public count n = 1e6", _set("n", (0, 0), 1e6))],
    "ldp-bco-one-point": [("unit direction of norm 1.4e8", _scale_row("u", 1.4e8))],
    "linucb-dgs": [("||x|| = 2 > C_B", _x_too_long), ("|r| > c_r", _set("z", (0, -1), 1e3))],
    "private-lasso": [("|x_i| > C_X", _set("z", (0, 0), 5.0))],
}


def _sum_set(field, index, value):
    def attack(s, users, algo):
        s[field].reshape(-1)[index] = value
    return attack


def _count_moved(s, users, algo):      # one post-initialization user counted on another arm
    arm = int(np.argmax(s["count"]))
    s["count"][arm] -= 1
    s["count"][(arm + 1) % algo.K] += 1


# pre-aggregated attacks: (name, how a genuine population sum is changed); plus every per-user attack aggregated
PRE_AGGREGATED = {
    "ldp-sgd": [("population sum 1e12", _sum_set("Z", 0, 1e12))],
    "ldp-ols": [("u sum 1.7e308", _sum_set("u", 0, 1.7e308)), ("M sum 1e150", _sum_set("M", 0, 1e150))],
    "sw-klucb-cf": [("summed feedback 1e9", _sum_set("feedback", 0, 1e9)), ("pulls sum -3", _sum_set("pulls", 0, -3)),
                    ("feedback sum 0.5", _sum_set("feedback", 0, 0.5))],
    "ldp-mab-ucb": [("reward sum 1e9", _sum_set("reward", 0, 1e9)), ("counts off the schedule", _count_moved)],
    "ldp-ols-multi": [("public count n = 1e6", _sum_set("n", 0, 1e6))],
    "ldp-bco-one-point": [("grad sum (the u slot) 1e12", _sum_set("u", 0, 1e12)),
                          ("folded loss slot not 0", _sum_set("loss", 0, 0.5))],
    "linucb-dgs": [("a row at a slot of no user of the population", _sum_set("Z", 0, 0.5))],
}
# aggregating these per-user attacks gives a sum honest users can produce (a bit of 7 among 20 users, one user's
# arm moved, an asymmetric M, a ball point), or none (an arm out of range): only per-user mode sees them
PER_USER_ONLY = {"Z inside the ball", "randomized-response bit of 7", "M not symmetric", "arm not the scheduled arm",
                 "pulls not the scheduled arm", "arm 99", "arm -1"}


def attack_setup(name, mode, shards=1):
    # round 0 of 2 populations x 20 users (population 1: users 20..39, past the initialization pulls t < K)
    config = RunConfig(name, users=80, round_size=40, populations=2, seed=3, delta=0.05)
    env = make_env(config)
    algo = make_algorithm(env, config)
    plan = make_plan(algo, config, shards, mode)
    model = algo.publish(algo.initial_state(derive(config.seed, "init")))
    genuine = {}
    for p in range(config.populations):
        users = plan.users_of(0, p)
        messages, _, _ = simulate_population(algo, env, model, config.seed, 0, p, users, pre_aggregate=False)
        genuine[p] = (users, {f: np.array(v) for f, v in messages.items()})
    return config, algo, plan, genuine


def published_model(config, algo):
    return algo.publish(algo.initial_state(derive(config.seed, "init")))


def attacked_payloads(name, algo, plan, users, messages):
    """(attack name, the payload to send) for the mode of the plan."""
    out = []
    for attack_name, attack in PER_USER.get(name, []):
        m = {f: v.copy() for f, v in messages.items()}
        attack(m, users, algo)
        if plan.mode == "per-user":
            out.append((attack_name, m))
        elif attack_name not in PER_USER_ONLY:
            out.append((attack_name, algo.aggregate(m, users)))
    if plan.mode == "pre-aggregated":
        for attack_name, attack in PRE_AGGREGATED.get(name, []):
            s = {f: np.array(v, dtype=float) for f, v in algo.aggregate(messages, users).items()}
            attack(s, users, algo)
            out.append((attack_name, s))
    return out


def as_message(config, plan, population, payload, n_users, shard=0):
    return (config.algorithm, 0, population, plan.split(payload, n_users, population)[shard])


@pytest.mark.parametrize("mode", ["per-user", "pre-aggregated"])
@pytest.mark.parametrize("name", sorted(PER_USER))
def test_every_attack_is_rejected_and_counted_state_unchanged(name, mode):
    config, algo, plan, genuine = attack_setup(name, mode)
    core = ShardCore(plan, 0, algo)
    core.publish(0, published_model(config, algo))      # as the Ray engine does each round
    users, messages = genuine[0]
    payload = messages if mode == "per-user" else algo.aggregate(messages, users)
    assert core.fold([as_message(config, plan, 0, payload, len(users))]) == (1, 0)
    before = core.peek(0)
    users, messages = genuine[1]
    attacks = attacked_payloads(name, algo, plan, users, messages)
    assert len(attacks) >= 1
    for attack_name, bad in attacks:
        rejected_before = dict(core.rejected_by_reason)
        assert core.fold([as_message(config, plan, 1, bad, len(users))]) == (0, 1), attack_name
        new = {k: v - rejected_before.get(k, 0) for k, v in core.rejected_by_reason.items()
               if v != rejected_before.get(k, 0)}
        assert len(new) == 1 and next(iter(new)).startswith(("out of domain", "wrong dtype")), (attack_name, new)
        after = core.peek(0)
        assert after["seen"] == before["seen"] and after["pending"] == before["pending"], attack_name
    assert core.rejected == len(attacks) and core.accepted == 1
    # the genuine message of the attacked population is still accepted, and the round is the honest one
    payload = messages if mode == "per-user" else algo.aggregate(messages, users)
    assert core.fold([as_message(config, plan, 1, payload, len(users))]) == (1, 0)
    got = plan.assemble([core.collect(0)])
    want = None
    for p in (0, 1):
        u, m = genuine[p]
        want = add_sums(want, algo.aggregate(m, u))
    for field in want:
        np.testing.assert_array_equal(got[field], want[field])


def test_two_huge_sums_never_make_the_total_infinite():
    config, algo, plan, genuine = attack_setup("ldp-ols", "pre-aggregated")
    core = ShardCore(plan, 0, algo)
    for p in (0, 1):
        users, messages = genuine[p]
        s = {f: np.array(v, dtype=float) for f, v in algo.aggregate(messages, users).items()}
        s["u"][:] = 1.7e308
        assert core.fold([as_message(config, plan, p, s, len(users))]) == (0, 1)
    assert core.rejected_by_reason == {"out of domain (u): sum outside what the population can send": 2}


def test_running_total_checked_before_adding():
    """With the domain checks off (the stress job's measurement switch), the running total still never leaves the
    finite range: the second of two finite 1.7e308 sums is rejected before it is added."""
    config, algo, plan, genuine = attack_setup("ldp-ols", "pre-aggregated")
    core = ShardCore(plan, 0, algo, check_domains=False)
    results = []
    for p in (0, 1):
        users, messages = genuine[p]
        s = {f: np.array(v, dtype=float) for f, v in algo.aggregate(messages, users).items()}
        s["u"][:] = 1.7e308
        results.append(core.fold([as_message(config, plan, p, s, len(users))]))
    assert results == [(1, 0), (0, 1)] and core.rejected_by_reason == {"total would overflow": 1}


def test_two_shards_pre_aggregated_some_shard_rejects_each_attack():
    for name in sorted(PRE_AGGREGATED):
        config, algo, plan, genuine = attack_setup(name, "pre-aggregated", shards=2)
        users, messages = genuine[1]
        for attack_name, bad in attacked_payloads(name, algo, plan, users, messages):
            rejected = 0
            for shard in plan.active_shards():
                core = ShardCore(plan, shard, algo)
                core.publish(0, published_model(config, algo))
                rejected += core.fold([as_message(config, plan, 1, bad, len(users), shard)])[1]
            assert rejected >= 1, (name, attack_name)


def test_shard_actor_rejects_attacks_over_ray(ray_session):
    from ldpfed.engine.ray_engine import RemoteShard

    ray = ray_session
    expected = {}
    for mode, name in (("per-user", "ldp-sgd"), ("pre-aggregated", "sw-klucb-cf")):
        if True:
            config, algo, plan, genuine = attack_setup(name, mode)
            actor = RemoteShard.options(num_cpus=0).remote(config, plan, 0)
            ray.get(actor.publish.remote(0, published_model(config, algo)))
            users, messages = genuine[1]
            attacks = attacked_payloads(name, algo, plan, users, messages)
            batch = [as_message(config, plan, 1, bad, len(users)) for _, bad in attacks]
            accepted, rejected = ray.get(actor.fold.remote(batch))
            stats = ray.get(actor.stats.remote())
            assert (accepted, rejected) == (0, len(attacks)), (mode, name)
            assert stats["accepted"] == 0 and stats["rejected"] == len(attacks)
            assert all(k.startswith(("out of domain", "wrong dtype")) for k in stats["rejected_by_reason"])
            expected[name] = stats["rejected_by_reason"]
            ray.kill(actor)
    assert expected["ldp-sgd"] == {"out of domain (Z): not on the sphere": 2}
    assert len(expected["sw-klucb-cf"]) >= 3         # counted by reason


# ---- the stress job: out-of-domain copies under load, in-domain poisoning, the open-loop capacity curve --------

def test_stress_out_of_domain_all_bad_rejected_no_honest_rejected(ray_session):
    from ldpfed.stress.exactness import run_stress
    lines = []
    ok, rows = run_stress("ldp-ols", d=3, K=4, shard_counts=(2,), populations=4, users_per_message=5, rounds=3,
                          senders=2, batch=3, max_in_flight=2, inject=1, max_seconds=120, log=lines.append,
                          attack_fraction=0.5)
    assert ok, lines
    (row,) = rows
    # 2 senders x 6 messages each, half of them copied out of the domain: every copy rejected as out of domain,
    # no honest message rejected, the aggregates equal to the honest recomputation (checked inside: ok)
    assert row["out_of_domain_sent"] == 6 and row["out_of_domain_rejected"] == 6
    assert row["honest_rejected"] == 0 and row["errors"] == []


def test_in_domain_poisoning_is_accepted_and_moves_the_estimate():
    from ldpfed.stress.poisoning import run_in_domain
    ok, rows = run_in_domain(["ldp-sgd"], [0.1], users=2000, round_size=50, seeds=(0,), log=lambda line: None)
    assert ok
    honest, poisoned = rows
    assert honest["fraction"] == 0.0 and honest["estimate_shift"] == 0.0 and honest["regret_ratio"] == 1.0
    # 200 users with eta_t-weighted pushes of norm B each, all in the domain and all accepted
    assert poisoned["rejected"] == 0 and poisoned["attackers"] == 200 and poisoned["estimate_shift"] > 0.1


def test_an_attack_that_leaves_the_domain_is_rejected_and_stops_the_run(monkeypatch):
    from ldpfed.stress import attacks

    def off_the_sphere(algo, env, messages, users, bad):
        messages["Z"][bad] *= 2.0
    monkeypatch.setitem(attacks.IN_DOMAIN_ATTACKS, "ldp-sgd", off_the_sphere)
    run = attacks.poisoned_run("ldp-sgd", 0.5, users=400, round_size=50, seed=0, env_params={"d": 2, "K": 4})
    assert not run["ok"] and run["round"] == 0 and run["rejected"] == 1
    assert run["reasons"] == {"out of domain (Z): not on the sphere": 1} and run["regret"] == 0.0
    with pytest.raises(ValueError, match="no in-domain attack"):
        attacks.poisoned_run("uniform", 0.1, users=100, round_size=10, seed=0)


def test_capacity_open_loop_small_nothing_lost(ray_session):
    from ldpfed.stress.capacity import run_capacity
    lines = []
    ok, rows = run_capacity("ldp-sgd", d=3, K=4, shard_counts=(2,), populations=4, users_per_message=20, senders=2,
                            batch=4, max_in_flight=2, levels=(50, 125), level_seconds=0.2, probe_rounds=10,
                            pool_rounds=2, max_rounds=400, log=lines.append)
    assert ok, lines
    assert [row["level"] for row in rows] == ["probe", "50%", "125%"]
    for row in rows:     # every message folded once, by a shard with its domain checks on, the aggregates exact
        assert row["lost_or_rejected"] == 0 and row["accepted"] == row["population_messages"] > 0
        assert row["aggregates_exact"] and row["errors"] == []
        assert row["check_domains"] is True and row["user_messages_per_s"] > 0
        assert len(row["shard_busy"]) == len(row["shard_cpu"]) == 2 and 0 < row["messages_per_call"] <= 4
    for row in rows[1:]:
        assert row["p99_ms"] >= row["p50_ms"] > 0
        assert row["target_user_messages_per_s"] == pytest.approx(rows[0]["user_messages_per_s"] * float(
            row["level"][:-1]) / 100)


def _drive(batcher, service: float, step: float = 1e-4):
    """Run a Batcher on a simulated clock; each call completes `service` seconds after it leaves. Returns the calls
    as (time sent, shard, message indices) and the largest number in flight seen per shard."""
    now, busy, calls, peak = 0.0, [], [], [0] * batcher.shards
    while not batcher.done() or busy:
        for s, ks in batcher.ready(now):
            calls.append((now, s, list(ks)))
            busy.append((now + service, s))
        for s in range(batcher.shards):
            peak[s] = max(peak[s], batcher.in_flight[s])
        for end, s in [b for b in busy if b[0] <= now]:
            busy.remove((end, s))
            batcher.completed(s)
        deadline = batcher.next_deadline()
        wakes = [end for end, _ in busy] + ([] if deadline is None else [deadline])
        if not wakes:        # nothing in flight and nothing left to send
            assert batcher.done()
            break
        now = max(min(wakes), now + step)
    return calls, peak


@pytest.mark.parametrize("service", [0.0005, 0.05])     # below capacity, and far above it (back-pressure)
def test_batcher_sends_every_message_once_in_order_batched_and_bounded(service):
    from ldpfed.stress.capacity import Batcher
    # shard 0 gets 4 messages in 5 ms (full calls of 4 before the linger ends), shard 1 one (single ones at the linger)
    populations, S, interval, linger = [0, 2, 4, 6, 1], 2, 0.001, 0.006
    shard_of = [populations[k % 5] % S for k in range(200)]
    batcher = Batcher(shard_of, interval, 0.0, max_batch=4, linger=linger, max_in_flight=2)
    calls, peak = _drive(batcher, service)
    sent = [k for _, _, ks in calls for k in ks]
    assert sorted(sent) == list(range(200))                       # every message once
    assert max(peak) <= 2                                          # never more than max_in_flight outstanding
    for t, s, ks in calls:
        assert 1 <= len(ks) <= 4 and all(shard_of[k] == s for k in ks)
        assert t >= ks[-1] * interval                               # nothing leaves before it is due
    for s in range(S):                                             # each shard's messages in schedule order
        mine = [k for _, t, ks in calls if t == s for k in ks]
        assert mine == sorted(mine)
    waits = [t - ks[0] * interval for t, _, ks in calls]
    if service < interval:     # never blocked: a call leaves when full or when its oldest waited `linger`
        assert max(waits) <= linger + 2e-4
        assert any(len(ks) == 4 for _, _, ks in calls) and any(len(ks) < 4 for _, _, ks in calls)
    else:                      # blocked: the backlog waits at the sender and calls are full, but the first
        assert max(waits) > 10 * linger                         # max_in_flight ones and the last one per shard
        assert sum(len(ks) == 4 for _, _, ks in calls) >= len(calls) - 3 * S


def test_capacity_check_catches_a_wrong_or_missing_aggregate():
    from ldpfed.stress.capacity import PoolRecomputation
    config = RunConfig("ldp-sgd", env="linear", users=3 * 8, round_size=8, populations=2, seed=0,
                       env_params={"d": 3, "K": 4})
    algo = make_algorithm(make_env(config), config)
    plan = make_plan(algo, config, 1, "per-user", "population")
    recomputation = PoolRecomputation(config, algo)
    populations_of = [[0], [1]]                            # two senders, one population each
    pools = [[(0, 0), (1, 0)], [(0, 1)]]                   # entries made for (round, population)
    sent = [{"pool": pools[a], "entry": np.array([r % len(pools[a]) for r in range(3)])} for a in range(2)]

    def totals(skip=None):
        core = ShardCore(plan, 0, algo, max_open_rounds=3)
        for r in range(3):
            for p in (0, 1):
                if (r, p) != skip:
                    payload = recomputation.payload(pools[p][sent[p]["entry"][r]])
                    assert core.fold([(config.algorithm, r, p, payload)]) == (1, 0)
        out = []
        for r in range(3):
            try:
                out.append(core.collect(r))
            except RuntimeError:     # incomplete round
                core.next_round += 1
                out.append({"populations": []})
        return [out]

    assert recomputation.check(plan, 3, populations_of, sent, totals()) == []
    assert recomputation.check(plan, 3, populations_of, sent, totals(skip=(1, 1)))      # one message lost
    wrong = totals()
    wrong[0][2]["populations"][0][1]["Z"][0] += 1e-12                                    # one sum off by a hair
    assert recomputation.check(plan, 3, populations_of, sent, wrong) == ["round 2: the shards' aggregate differs "
                                                                         "from the recomputation"]
    swapped = [dict(x, entry=x["entry"].copy()) for x in sent]
    swapped[0]["entry"][0] = 1                      # the recomputation follows what each message carried
    assert recomputation.check(plan, 3, populations_of, swapped, totals())


def test_steady_window_stops_at_the_first_shard_out_of_work():
    from ldpfed.stress.capacity import steady_window
    # (start, end, users, CPU so far, fold time so far) per call; shard 0 runs out of work at t = 2, shard 1 at 3
    logs = [[(0.0, 1.0, 10, 0.5, 0.8), (1.0, 2.0, 10, 1.0, 1.6)],
            [(0.5, 1.5, 20, 0.4, 0.9), (1.6, 2.6, 20, 0.8, 1.8), (2.6, 3.0, 20, 1.0, 2.1)]]
    w = steady_window(0.0, logs)
    assert w["seconds"] == 2.0 and w["user_messages"] == 10 + 10 + 20
    assert w["busy"] == [1.0, (1.0 + 0.4) / 2.0]          # shard 1's second call clipped at t = 2
    assert w["cpu"] == [0.5, 0.2] and w["folding"] == [0.8, 0.45]


@pytest.mark.parametrize("mode", ["per-user", "pre-aggregated"])
@pytest.mark.parametrize("name, attack", [("ldp-mab-ucb", _all_other_arm), ("sw-klucb-cf", _all_pulls_other_arm)])
def test_an_arm_the_server_did_not_publish_is_caught_with_the_rounds_model_and_refused_without_it(name, attack, mode):
    """Every user of a message agrees on one arm, but not the published one: with the round's model (the Ray engine
    publishes it to the shards) the message is rejected as such; without it a shard cannot check the arm, so it
    rejects the message for want of the schedule (a check without its input fails closed)."""
    config, algo, plan, genuine = attack_setup(name, mode)
    users, messages = genuine[1]
    m = {f: v.copy() for f, v in messages.items()}
    attack(m, users, algo)
    payload = m if mode == "per-user" else algo.aggregate(m, users)
    blind, told = ShardCore(plan, 0, algo), ShardCore(plan, 0, algo)
    told.publish(0, published_model(config, algo))
    assert blind.fold([as_message(config, plan, 1, payload, len(users))]) == (0, 1)
    assert blind.rejected_by_reason == {"no published schedule": 1} and blind.peek(0) == {}
    assert told.fold([as_message(config, plan, 1, payload, len(users))]) == (0, 1)
    assert list(told.rejected_by_reason) == [f"out of domain ({'arm' if name == 'ldp-mab-ucb' else 'pulls'}): "
                                             f"not the published arm" if mode == "per-user" else
                                             f"out of domain ({'count' if name == 'ldp-mab-ucb' else 'pulls'}): "
                                             f"not the published arm"]
