"""Seed 004 (Gajane 2023): sw-klucb-cf, klucb-cf and their non-private baselines sw-klucb, klucb.

Comparisons run 5 fixed seeds (each seed: its own world, the same world for every algorithm: paired runs) and use
the exact one-sided sign test: if two algorithms were equally good, each paired difference would be positive with
probability 1/2, so "A below B on all 5 seeds" has probability 2^-5 = 0.031 under that null (level 5%). They also
compare the medians. Uniform play is compared through its exact expected regret, sum_t (max_a mu_a(t) -
mean_a mu_a(t)), computed from the world's means.

To keep each test a few seconds the comparisons use rounds of B = 8 users (the batched variant, B << w, the
window then holds the rounds with the last w users); B = 1 is pinned to a plain sequential loop of Algorithm 1
by test_b1_equals_sequential_loop.
"""
import math
from functools import lru_cache

import numpy as np
import pytest
from scipy.optimize import brentq

from ldpfed.algorithms import REGISTRY, make_algorithm
from ldpfed.algorithms.klucb import (HALVINGS, exploration, kl_bernoulli, klucb_upper, paper_window)
from ldpfed.config import RunConfig
from ldpfed.engine import run_local
from ldpfed.envs import make_env
from ldpfed.mechanisms import RandomizedResponse
from ldpfed.util.errors import ConfigError
from ldpfed.util.rng import derive

SEEDS = range(5)
SIGN_TEST_LEVEL = 0.5 ** len(SEEDS)     # 0.031: all 5 pairs in the same direction under "no difference"
T, B = 8000, 8
# Changing world: 2 arms, 5 changes (6 segments of 1333 users). The window only pays off once w is large against
# the K f(w) / kl(gap) pulls a window needs to tell the arms apart; at this T (w = 94) that takes few arms and a
# mild privacy level (eps = 4: RR keeps the bit with probability 0.98). Stationary world: 5 arms.
CHANGING = ("piecewise-bernoulli", (("K", 2), ("breakpoints", 5)))
STATIONARY = ("bernoulli", (("K", 5),))


@lru_cache(maxsize=None)
def regrets(name: str, world: tuple, eps: float) -> np.ndarray:
    env, params = world
    return np.array([run_local(RunConfig(name, env=env, users=T, round_size=B, seed=s, eps=eps,
                                         env_params=dict(params))).summary["final_regret"] for s in SEEDS])


@lru_cache(maxsize=None)
def uniform_expected(world: tuple) -> np.ndarray:
    env, params = world
    out = []
    for s in SEEDS:
        truth = make_env(RunConfig("uniform", env=env, users=T, seed=s, env_params=dict(params)))
        means = truth.means_at(np.arange(T))
        out.append(float((means.max(axis=1) - means.mean(axis=1)).sum()))
    return np.array(out)


def assert_below(a: np.ndarray, b: np.ndarray, what: str):
    """One-sided sign test over the paired seeds (p = 2^-5 when all pairs agree) and medians."""
    assert np.all(a < b), f"{what}: {a.round().tolist()} vs {b.round().tolist()} (sign test needs 5 of 5)"
    assert np.median(a) < np.median(b)


# ---- the index --------------------------------------------------------------------------------

def reference_upper(p: float, n: float, f: float) -> float:
    """max{q in [p, 1] : n kl(p, q) <= f}, scalar, by scipy's brentq."""
    if n == 0 or p >= 1.0:
        return 1.0
    h = lambda q: n * kl_bernoulli(p, q) - f  # noqa: E731
    if h(1.0 - 1e-15) <= 0:
        return 1.0
    return brentq(h, p, 1.0 - 1e-15, xtol=1e-15, maxiter=500)


def test_vectorized_bisection_equals_brentq():
    rng = np.random.default_rng(7)
    m = 400
    p = rng.random(m)
    p[:20], p[20:40], p[40:60] = 0.0, 1.0, rng.random(20) * 1e-3       # edges
    n = rng.integers(1, 20_000, m).astype(float)
    n[60:80] = 0.0                                                   # no pull: no constraint
    n[80:100] = rng.integers(1, 4, 20)                               # tiny counts: the bracket is [p, 1]
    f = rng.uniform(0.0, 25.0, m)
    got = klucb_upper(p, n, f)
    ref = np.array([reference_upper(*args) for args in zip(p, n, f)])
    # bisection keeps the feasible end of a bracket of width <= 2^-HALVINGS
    np.testing.assert_allclose(got, ref, rtol=0, atol=2.0 ** -HALVINGS + 1e-13)
    assert np.all(got <= ref + 1e-13)
    pulled = n > 0
    assert np.all(n[pulled] * kl_bernoulli(p[pulled], got[pulled]) <= f[pulled] * (1 + 1e-12) + 1e-12)
    # an arm's value does not depend on which arms are solved with it (bit for bit)
    alone = np.array([klucb_upper(p[i:i + 1], n[i:i + 1], f[i:i + 1])[0] for i in range(0, m, 7)])
    np.testing.assert_array_equal(alone, got[::7])


def test_published_index_is_debiased_klucb_bound():
    """Index_a = g^{-1}(max{q : N kl(lambda_hat, q) <= f(min(t, w))}), g the feedback mean of RR."""
    config = RunConfig("sw-klucb-cf", users=10_000, eps=0.7)
    algo = make_algorithm(make_env(config), config)
    rr = RandomizedResponse(0.7)
    state = algo.initial_state(derive(0, "init"))
    n = np.array([0.0, 3.0, 40.0, 200.0, 55.0])
    s = np.array([0.0, 3.0, 10.0, 131.0, 0.0])
    for t in (50, algo.w + 500):                                    # before and after the window fills
        state.update(t=t, n=n.copy(), s=s.copy())
        f = exploration(min(t, algo.w))
        lam = np.where(n > 0, s / np.maximum(n, 1), 0.0)
        expected = rr.debias(np.array([reference_upper(*a) for a in zip(lam, n, [f] * 5)]))
        index = algo.index(state)                                    # the index update publishes for (t, n, s)
        np.testing.assert_allclose(index, expected, rtol=0, atol=1e-9)
        assert index[0] == pytest.approx(rr.debias(1.0))             # unpulled arm: the largest possible index
        assert index[0] > 1.0                                        # g^{-1}(1) > 1: pulled first
    fresh = algo.initial_state(derive(0, "init"))                   # published: the index of the state's (t, n, s)
    for state in (fresh, algo.update(fresh, {"pulls": np.eye(5)[2], "feedback": np.eye(5)[2]}, 0, 1,
                                     derive(0, "server", 0))):
        np.testing.assert_array_equal(algo.publish(state)["index"], algo.index(state))


def test_exploration_function_and_window():
    for x in (3.0, 10.0, 1e3, 1e6):
        assert exploration(x) == pytest.approx(np.log(x) + 3 * np.log(np.log(x)))
    assert exploration(1.0) == 0.0 and exploration(2.0) == pytest.approx(np.log(2.0))   # guard below e
    assert paper_window(10**5, 5) == int(np.ceil(np.sqrt(4 * np.e * 1e5 / 9)))          # 348
    # L_T defaults to the env's change points + 1 (the paper counts t = 1 as the first breakpoint)
    config = RunConfig("sw-klucb-cf", users=10**5, env_params={"K": 5, "breakpoints": 4})
    algo = make_algorithm(make_env(config), config)
    assert (algo.L_T, algo.w) == (5, 348)
    config = config.replace(params={"L_T": 1})
    assert make_algorithm(make_env(config), config).w == int(np.ceil(np.sqrt(4 * np.e * 1e5 / 5)))
    config = config.replace(params={"window": 77})
    assert make_algorithm(make_env(config), config).w == 77


def test_rounds_long_against_the_window_carry_a_caveat_in_the_summary():
    """At T = 1e5 the paper's window is 348 users: rounds of 34 (a tenth of it) keep the paper's behaviour and say
    nothing; rounds of 35 to 347 carry the partial caveat; rounds of 348 or more, the one saying the window holds
    only the last round. Without a window (klucb-cf) there is nothing to say at any round size. The run's summary
    carries the sentence the report shows."""
    config = RunConfig("sw-klucb-cf", users=10**5, env_params={"K": 5, "breakpoints": 4})

    def caveat(cfg):
        return make_algorithm(make_env(cfg), cfg).round_size_caveat()

    assert caveat(config.replace(round_size=34)) is None
    assert "more than a tenth of its window of 348 users" in caveat(config.replace(round_size=35))
    assert "more than a tenth" in caveat(config.replace(round_size=347))
    for B in (348, 5000):
        assert caveat(config.replace(round_size=B)).startswith(
            f"rounds of {B:,} users are no shorter than its window of 348 users")
    assert caveat(config.replace(algorithm="klucb-cf", round_size=5000)) is None
    small = RunConfig("sw-klucb", users=2000, round_size=500, env_params={"K": 5, "breakpoints": 4})
    assert "no shorter than its window" in run_local(small).summary["round_size_caveat"]
    assert "round_size_caveat" not in run_local(small.replace(round_size=1)).summary


def test_eps_aware_window():
    """window_rule="eps-aware": Theorem 1's window divided by tanh(eps/2), the factor randomized response shrinks
    every feedback gap by (see klucb.py); the paper's window stays the default, the non-private sw-klucb ignores
    the rule (its gaps are not shrunk), and the window never exceeds T."""
    config = RunConfig("sw-klucb-cf", users=10**5, eps=1.0, env_params={"K": 5, "breakpoints": 4})
    assert make_algorithm(make_env(config), config).w == 348                             # the paper's, default
    aware = config.replace(params={"window_rule": "eps-aware"})
    w = make_algorithm(make_env(aware), aware).w
    assert w == int(np.ceil(np.sqrt(4 * np.e * 1e5 / 9) / np.tanh(0.5)))                # 753
    for eps in (0.25, 0.5, 2.0):
        cfg = aware.replace(eps=eps)
        assert make_algorithm(make_env(cfg), cfg).w == int(np.ceil(np.sqrt(4 * np.e * 1e5 / 9) / np.tanh(eps / 2)))
    plain = aware.replace(algorithm="sw-klucb")
    assert make_algorithm(make_env(plain), plain).w == 348
    tiny = aware.replace(users=50, eps=0.01, env_params={"K": 5, "breakpoints": 1})
    assert make_algorithm(make_env(tiny), tiny).w == 50
    with pytest.raises(ConfigError):
        bad = config.replace(params={"window_rule": "long"})
        make_algorithm(make_env(bad), bad)
    # the longer window runs (its ring buffer holds the rounds of the last w users) and learns
    env, params = CHANGING
    run = RunConfig("sw-klucb-cf", env=env, users=T, round_size=B, eps=4.0, seed=0, env_params=dict(params),
                    params={"window_rule": "eps-aware"})
    assert run_local(run).summary["final_regret"] < 0.5 * uniform_expected(CHANGING)[0]


@pytest.mark.parametrize("name,params", [
    ("sw-klucb-cf", {"L_T": 0}), ("sw-klucb-cf", {"L_T": 2.5}), ("sw-klucb-cf", {"window": -3}),
    ("sw-klucb-cf", {"window": True}), ("klucb-cf", {"window": 100}), ("klucb", {"L_T": 3}),
    ("sw-klucb", {"horizon": 3}),
])
def test_bad_options_are_rejected(name, params):
    with pytest.raises(ConfigError) as err:
        config = RunConfig(name, users=1000, params=params)
        make_algorithm(make_env(config), config)       # options checked against the world (klucb-cf's window)
    assert err.value.field == f"params.{next(iter(params))}"


# ---- the protocol -----------------------------------------------------------------------------

def test_messages_ledger_and_public_arm():
    config = RunConfig("sw-klucb-cf", users=1000, round_size=50, eps=1.0)
    env = make_env(config)
    algo = make_algorithm(env, config)
    (row,) = algo.ledger()
    assert row.items() >= {"message": "feedback", "mechanism": "randomized-response", "model": "ldp", "eps": 1.0,
                           "delta": 0.0, "sensitivity": 1.0, "norm": "none", "per_user": 1}.items()
    assert algo.public_fields == {"pulls"}
    users = np.arange(100, 150)
    model = {"index": np.array([0.1, 0.9, 0.3, 0.2, 0.5])}
    actions = algo.act(model, None, users, derive(0, "act"))
    assert np.all(actions == 1)                                     # the public argmax
    assert np.array_equal(algo.act(model, None, np.arange(3, 8), derive(0, "act")), [3, 4, 1, 1, 1])  # init
    rewards = np.tile([0.0, 1.0], 25)
    msgs, metrics = algo.encode(model, None, actions, rewards, users, derive(0, "privatize"))
    assert metrics == {"clipped": 0}
    assert np.array_equal(msgs["pulls"], np.eye(5)[actions])
    reports = msgs["feedback"].sum(axis=1)
    assert set(np.unique(reports)) <= {0.0, 1.0} and np.all(msgs["feedback"][:, [0, 2, 3, 4]] == 0)
    assert np.any(reports != rewards)                               # randomized (P[no flip in 50] = 1e-7)
    for name in ("sw-klucb", "klucb"):
        base = make_algorithm(env, config.replace(algorithm=name))
        assert base.ledger() == [] and base.privacy_model == "none"
        msgs, _ = base.encode(model, None, actions, rewards, users, derive(0, "privatize"))
        np.testing.assert_array_equal(msgs["feedback"].sum(axis=1), rewards)   # raw bits: noise off
    assert issubclass(REGISTRY["klucb-cf"], REGISTRY["sw-klucb-cf"])
    assert issubclass(REGISTRY["sw-klucb"], REGISTRY["sw-klucb-cf"])
    assert issubclass(REGISTRY["klucb"], REGISTRY["klucb-cf"])


def test_batched_window_holds_the_rounds_of_the_last_w_users():
    config = RunConfig("sw-klucb-cf", users=100, round_size=4, params={"window": 10},
                       env_params={"K": 2, "breakpoints": 1})
    algo = make_algorithm(make_env(config), config)
    state = algo.initial_state(derive(0, "init"))
    for r in range(6):                                   # round r: 4 pulls of arm r % 2, 2 reported ones
        pulls = np.zeros(2)
        pulls[r % 2] = 4.0
        state = algo.update(state, {"pulls": pulls, "feedback": pulls / 2}, 4 * r, 4 * r + 4, derive(0, "server", r))
        stop = 4 * r + 4
        held = range(max(0, (stop - 10) // 4), r + 1)    # rounds with stop > stop_now - w: hold a last-10 user
        assert state["n"].sum() == 4 * len(held) and state["s"].sum() == 2 * len(held)
        assert state["n"][0] == 4 * sum(1 for j in held if j % 2 == 0)
        if stop >= 10:
            assert 10 <= state["n"].sum() <= 10 + 4 - 1  # between w and w + B - 1 users
    assert state["t"] == 24


def sequential_loop(config: RunConfig, windowed: bool):
    """Algorithm 1 at B = 1, written plainly: a list of (arm, report), the last w of them, argmax of the index.
    Randomness as the engine draws it (ldpfed/engine/core.py: one population, round t = user t)."""
    env = make_env(config)
    algo = make_algorithm(env, config)
    w = algo.w if windowed else None
    rr = RandomizedResponse(config.eps)
    K, history, regret = env.K, [], []
    for t in range(config.users):
        world = derive(config.seed, "context", 0, t)
        client = derive(config.seed, "privatize", 0, t)
        users = np.array([t])
        contexts = env.contexts(users, world)
        if t < K:
            arm = t
        else:
            window = history[-w:] if windowed else history
            n, s = np.zeros(K), np.zeros(K)
            for a, report in window:
                n[a] += 1
                s[a] += report
            f = exploration(min(t, w) if windowed else t)
            lam = np.where(n > 0, s / np.maximum(n, 1), 0.0)
            arm = int(np.argmax(rr.debias(klucb_upper(lam, n, f))))
        reward, r = env.step(contexts, np.array([arm]), users, world)
        # randomized response written out (not the library's): keep the bit w.p. e^eps / (1 + e^eps)
        keep = client.random() < math.exp(config.eps) / (1 + math.exp(config.eps))
        report = int(reward[0]) if keep else 1 - int(reward[0])
        history.append((arm, report))
        regret.append(r[0])
    return np.array(regret), history


@pytest.mark.parametrize("name,params,users", [
    ("sw-klucb-cf", {}, 2000),                 # the paper's window (w = 106 for T = 2000, L_T = 3)
    ("sw-klucb-cf", {"window": 25}, 1500),     # a short window: arms leave it and come back
    ("klucb-cf", {}, 800),
])
def test_b1_equals_sequential_loop(name, params, users):
    config = RunConfig(name, users=users, round_size=1, seed=11, eps=1.0, params=params,
                       env_params={"K": 3, "breakpoints": 2})
    result = run_local(config)
    regret, history = sequential_loop(config, windowed=(name == "sw-klucb-cf"))
    np.testing.assert_array_equal(result.table["regret"].to_numpy(), regret)
    if name == "sw-klucb-cf":
        history = history[-make_algorithm(make_env(config), config).w:]
    recent = history
    n = np.bincount([a for a, _ in recent], minlength=3)
    s = np.bincount([a for a, _ in recent], weights=[b for _, b in recent], minlength=3)
    np.testing.assert_array_equal(result.state["n"], n)
    np.testing.assert_array_equal(result.state["s"], s)


# ---- the paper's claims -----------------------------------------------------------------------

def test_window_wins_when_means_change():
    """SW-KLUCB-CF forgets the old segments; KLUCB-CF keeps pulling the old best arm after a change."""
    assert_below(regrets("sw-klucb-cf", CHANGING, 4.0), regrets("klucb-cf", CHANGING, 4.0), "SW vs no window")


def test_no_window_not_worse_when_means_do_not_change():
    """Stationary world: the window only throws data away (KLUCB-CF is in fact far better)."""
    assert_below(regrets("klucb-cf", STATIONARY, 4.0), regrets("sw-klucb-cf", STATIONARY, 4.0),
                 "no window vs SW, stationary")


def test_each_beats_uniform():
    runs = {STATIONARY: (("sw-klucb-cf", 4.0), ("klucb-cf", 4.0), ("klucb-cf", 1.0), ("klucb", 1.0)),
            CHANGING: (("sw-klucb-cf", 4.0), ("sw-klucb-cf", 1.0), ("sw-klucb", 1.0))}
    for world, algorithms in runs.items():
        uniform = uniform_expected(world)
        for name, eps in algorithms:
            assert_below(regrets(name, world, eps), uniform, f"{name} eps={eps} vs uniform on {world[0]}")
    # (KLUCB-CF in the changing world can do worse than uniform: that is the paper's point; not asserted.)


def test_nonprivate_beats_private():
    """Same worlds, eps = 1: randomized response shrinks the feedback gaps by tanh(eps/2) = 0.46."""
    assert_below(regrets("sw-klucb", CHANGING, 1.0), regrets("sw-klucb-cf", CHANGING, 1.0), "sw-klucb vs private")
    assert_below(regrets("klucb", STATIONARY, 1.0), regrets("klucb-cf", STATIONARY, 1.0), "klucb vs private")


# ---- a world built against stationary learners --------------------------------------------------

SWAP = ("piecewise-bernoulli", (("K", 2), ("breakpoints", 1), ("means", ((0.9, 0.1), (0.4, 0.6)))))


def test_given_means_are_the_segments():
    env = make_env(RunConfig("klucb", env="piecewise-bernoulli", users=100, seed=0, env_params=dict(SWAP[1])))
    means = env.means_at(np.arange(100))
    assert np.array_equal(means[:50], np.tile([0.9, 0.1], (50, 1)))
    assert np.array_equal(means[50:], np.tile([0.4, 0.6], (50, 1)))


@pytest.mark.parametrize("means", [[[0.9, 0.1]], [[0.9, 0.1, 0.5], [0.4, 0.6, 0.5]], [[0.9, 1.5], [0.4, 0.6]],
                                   [[0.9, float("nan")], [0.4, 0.6]], "high"])
def test_bad_given_means_are_rejected(means):
    with pytest.raises(ConfigError, match="env_params.means"):
        make_env(RunConfig("klucb", env="piecewise-bernoulli", users=100, seed=0,
                           env_params={"K": 2, "breakpoints": 1, "means": means}))


def test_stationary_learner_stays_on_the_fallen_arm():
    """Swap world (the best arm's mean falls from 0.9 to 0.4 half-way, the other rises from 0.1 to 0.6): the
    old arm's long average keeps KLUCB-CF's index on it; SW-KLUCB-CF forgets it within a window."""
    sw, cf = regrets("sw-klucb-cf", SWAP, 4.0), regrets("klucb-cf", SWAP, 4.0)
    assert_below(sw, cf, "SW vs no window, swap world")
    # never switching costs 0.2 per user of the second half; KLUCB-CF pays most of it (> half on every seed)
    assert np.all(cf > 0.5 * 0.2 * (T // 2)), cf.round().tolist()
