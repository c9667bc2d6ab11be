"""Seed 003 (Shukla 2024): PrivateThresholdLASSO (`private-lasso`) and its noise-free twin (`lasso-bandit`)."""
import math

import numpy as np
import pytest
from sklearn.linear_model import Lasso

from ldpfed.algorithms import make_algorithm
from ldpfed.algorithms.private_lasso import episodes, lasso_gram, wishart_bartlett
from ldpfed.config import RunConfig
from ldpfed.engine import run_local
from ldpfed.engine.sequential import run_sequential
from ldpfed.envs import make_env
from ldpfed.mechanisms import WishartMechanism
from ldpfed.util.errors import ConfigError


def config(name, users, round_size=16, eps=1.0, seed=0, env_params=None, **params):
    return RunConfig(name, env="sparse-linear", users=users, round_size=round_size, eps=eps, delta=0.1, seed=seed,
                     env_params=env_params or {}, params=params)


# ---- the world -------------------------------------------------------------------------------------------
def test_sparse_world():
    env = make_env(config("lasso-bandit", 100))
    assert env.d == 1000 and env.K == 10 and env.sparsity == 5
    assert np.count_nonzero(env.theta) == 5 and np.array_equal(np.flatnonzero(env.theta), env.support)
    assert abs(np.linalg.norm(env.theta) - 1) < 1e-12 and np.all(np.abs(env.theta[env.support]) > 0.5 / math.sqrt(5))
    x = env.contexts(np.arange(400), np.random.default_rng(0))
    assert x.shape == (400, 10, 1000) and np.abs(x).max() <= 1.0
    # E[x x^T] = I/3: 4000 rows, so a diagonal entry has mean 1/3 and sd sqrt(4/45/4000) ~ 0.0047
    second = np.einsum("nki,nki->i", x, x) / 4000
    assert np.all(np.abs(second - 1 / 3) < 6 * math.sqrt(4 / 45 / 4000))
    means = env.means(x)
    np.testing.assert_allclose(means, x @ env.theta, atol=1e-12)
    assert np.abs(means).max() <= env.reward_bound


# ---- building blocks ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [30, 600])
def test_lasso_gram_solves_the_lasso(n):
    rng = np.random.default_rng(n)
    d = 300
    X = rng.uniform(-1, 1, (n, d))
    theta = np.zeros(d)
    theta[[3, 70, 150, 220, 290]] = [0.5, -0.4, 0.45, 0.4, -0.5]
    y = X @ theta + 0.1 * rng.standard_normal(n)
    lam = 0.05 * math.sqrt(2 * math.log(n) * math.log(d) / n)
    ours = lasso_gram(X.T @ X, X.T @ y, n, lam)
    # sklearn minimizes (1/(2n)) ||y - Xw||^2 + alpha ||w||_1: the same problem with alpha = lam / 2
    ref = Lasso(alpha=lam / 2, fit_intercept=False, tol=1e-12, max_iter=200_000).fit(X, y).coef_
    objective = lambda w: np.mean((y - X @ w) ** 2) + lam * np.abs(w).sum()  # noqa: E731
    assert objective(ours) <= objective(ref) * (1 + 1e-9)
    np.testing.assert_allclose(ours, ref, atol=1e-5)


def test_bartlett_draws_have_the_wishart_moments():
    """Same law as WishartMechanism.sample: E W = k s^2 I, Var W_ii = 2 k s^4, Var W_ij = k s^4."""
    mech = WishartMechanism(3, 2.0, 0.1, sensitivity=1.5)
    k, s2, N = mech.k, 1.5 ** 2, 4000
    rng = np.random.default_rng(0)
    ours = np.array([wishart_bartlett(mech, rng) for _ in range(N)])
    theirs = np.array([mech.sample(rng) for _ in range(N)])
    for draws in (ours, theirs):
        assert np.all(np.linalg.eigvalsh(draws)[:, 0] > 0)
        mean = draws.mean(axis=0)
        # standard errors of the mean: sqrt(Var / N); 5 of them
        se = np.sqrt(np.where(np.eye(3, dtype=bool), 2 * k, k) * s2 ** 2 / N)
        assert np.all(np.abs(mean - k * s2 * np.eye(3)) < 5 * se)
        var = draws.var(axis=0)
        expected = np.where(np.eye(3, dtype=bool), 2 * k, k) * s2 ** 2
        # a sample variance of N near-normal values has relative sd sqrt(2 / N) ~ 2.2%: allow 5 sd (+ excess kurtosis)
        assert np.all(np.abs(var / expected - 1) < 0.15)


def test_svt_margin_rejects_a_coordinate_at_the_screen_threshold():
    """Reconstructed threshold: a coordinate exactly at the non-private screen (4 lambda_n) passes the noisy
    test with probability P(Lap(2 xi) - Lap(xi) >= 2 xi ln(1/delta1)) = (4 delta1 - delta1^2) / 6 (s_bar = 1,
    gap = 2), which keeps the screen's leak within the delta of the sparse vector pass."""
    cfg = config("private-lasso", 4096, s_bar=1.0)
    algo = make_algorithm(make_env(cfg), cfg)
    n = 1000
    svt = algo.support_svt(n)
    screen = 4 * algo.lambda_at(n)
    assert svt.threshold == pytest.approx(screen + 2 * svt.threshold_scale * math.log(1 / algo.delta1))
    N = 400_000
    passed = (svt.select_batch(np.full((N, 1), screen), np.random.default_rng(1))[:, 0] >= 0).sum()
    p = (4 * algo.delta1 - algo.delta1 ** 2) / 6
    assert abs(passed - N * p) < 5 * math.sqrt(N * p * (1 - p))


def test_budget_split_and_ledger():
    cfg = config("private-lasso", 100_000, eps=2.0)
    algo = make_algorithm(make_env(cfg), cfg)
    E = math.ceil(math.log2(100_000))
    assert algo.episodes == E == 17
    assert algo.delta1 == algo.delta2 == pytest.approx(0.1 / (2 * E))
    assert algo.eps1 == algo.eps2 == pytest.approx(2.0 / (2 * E * math.log(1 / algo.delta2)))
    # the per-node budget of the episode trees (Section 3)
    L = algo.tree_depth
    assert algo.eps_node == pytest.approx(algo.eps2 / math.sqrt(8 * L * math.log(2 / algo.delta2)))
    assert algo.delta_node == pytest.approx(algo.delta2 / (2 * L))
    rows = {row["message"]: row for row in algo.ledger()}
    assert set(rows) == {"support", "gram"}
    assert rows["support"]["mechanism"] == "sparse-vector" and rows["gram"]["mechanism"] == "wishart"
    for row in rows.values():
        assert row["model"] == "central" and row["releases"] == E and row["eps"] == pytest.approx(algo.eps1)
    assert make_algorithm(make_env(cfg), cfg.replace(algorithm="lasso-bandit")).ledger() == []


@pytest.mark.parametrize("name, params, field", [
    ("private-lasso", {"s0": 0}, "params.s0"),
    ("private-lasso", {"lambda_0": -1.0}, "params.lambda_0"),
    ("private-lasso", {"debias": "yes"}, "params.debias"),
    ("lasso-bandit", {"gap": -1}, "params.gap"),
    ("lasso-bandit", {"s_bar": 0.5}, "params.s_bar"),
    ("lasso-bandit", {"alpha": 1}, "params.alpha"),
])
def test_bad_options_name_the_field(name, params, field):
    with pytest.raises(ConfigError) as info:      # RunConfig checks the options; the world-dependent ones at build
        cfg = config(name, 100, **params)
        make_algorithm(make_env(cfg), cfg)
    assert info.value.field == field


# ---- the protocol ----------------------------------------------------------------------------------------
def test_episodes_start_at_two_to_the_k_minus_one():
    result = run_local(config("lasso-bandit", 100, round_size=1, env_params={"d": 50}))
    assert [e["users"] for e in episodes(result.state)] == [2, 6, 14, 30, 62]
    batched = run_local(config("lasso-bandit", 100, round_size=10, env_params={"d": 50}))
    # with rounds of 10 an episode starts at the first round boundary at or before t = 2^k - 1
    assert [e["users"] for e in episodes(batched.state)] == [10, 30, 60]


@pytest.mark.parametrize("name", ["lasso-bandit", "private-lasso"])
def test_support_statistics_are_the_history_plus_tree_noise(name):
    """The episode tree releases the Gram of [x_S; r] over the whole history: exactly without noise; plus a
    sum of Wishart nodes (PSD, trace ~ nodes * k * s^2 * (|S|+1)) with noise."""
    cfg = config(name, 2000, eps=1e6, env_params={"d": 200})
    result = run_local(cfg)
    algo = make_algorithm(make_env(cfg), cfg)
    state = result.state
    cols = state["cols"]
    assert len(cols) > 0 and len(state["support"]) > 0
    algo._flush(state)
    clean = state["gram"][np.ix_(cols, cols)]
    noise = state["tree_prefix"] - clean
    if name == "lasso-bandit":
        np.testing.assert_allclose(noise, 0, atol=1e-8 * np.abs(clean).max())
    else:
        p, mech, nodes = len(cols), algo._wishart(len(state["support"])), bin(int(state["tree_j"][0])).count("1")
        assert np.linalg.eigvalsh(noise)[0] > 0
        # trace of a sum of `nodes` Wishart(k, s^2 I_p) = s^2 chi^2(nodes k p): relative sd sqrt(2 / (nodes k p))
        expected = nodes * mech.k * mech.sensitivity ** 2 * p
        assert abs(np.trace(noise) / expected - 1) < 6 * math.sqrt(2 / (nodes * mech.k * p))


@pytest.mark.parametrize("eps, debias", [(1e4, False), (1e5, True)])
def test_sequential_engine_reproduces_the_rounds_with_a_support(eps, debias):
    """Written once: at B = 1 the compiled sequential loop, fed the round engine's draws, equals run_local bit for
    bit while supports are released (the episode trees' Wishart nodes drawn, the buffer flushed into the Gram)."""
    cfg = config("private-lasso", 1500, round_size=1, eps=eps, env_params={"d": 50, "s0": 3}, debias=debias)
    local, seq = run_local(cfg), run_sequential(cfg, streams="generic")
    assert len(local.state["support"]) > 0 and seq.summary["engine"] == "sequential"
    for column in local.table.columns:
        np.testing.assert_array_equal(local.table[column].to_numpy(), seq.table[column].to_numpy(), err_msg=column)
    for key, value in local.state.items():
        np.testing.assert_array_equal(value, seq.state[key], err_msg=key)


# ---- learning --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def uniform_regret():
    return {T: run_local(config("uniform", T)).summary["final_regret"] for T in (4096, 8192)}


def test_lasso_bandit_beats_uniform_and_finds_the_support(uniform_regret):
    result = run_local(config("lasso-bandit", 4096))
    env = make_env(config("lasso-bandit", 4096))
    assert result.summary["final_regret"] < 0.2 * uniform_regret[4096]
    assert np.array_equal(result.state["support"], env.support)
    assert result.summary["final_estimation_error"] < 0.05


def test_private_lasso_recovers_the_support(uniform_regret):
    """At eps = 1e4 (T = 8192): the paper's budget split gives each episode's sparse vector pass
    eps1 = eps / (2 E ln(1/delta2)) ~ eps / 145, and with Delta_n = c / n the noisy threshold's margin is
    ~2.2e6 / (n eps) (0.06 at n = 4000 when eps = 1e4; 550 at eps = 1). With coefficients of 0.2-0.5, support
    recovery needs n eps >~ 1e7: at eps = 1, about 1e7 users."""
    cfg = config("private-lasso", 8192, eps=1e4)
    result = run_local(cfg)
    env = make_env(cfg)
    last = episodes(result.state)[-1]
    assert set(env.support) <= set(last["S0"])
    assert np.array_equal(np.sort(last["S1"]), env.support)
    assert result.summary["final_regret"] < 0.7 * uniform_regret[8192]
    assert result.summary["final_estimation_error"] < 0.3


def test_private_lasso_at_eps_one_releases_no_support():
    """The calibration at eps = 1: the screen S0 finds the true support, but the margin of the noisy threshold
    (thousands of times the coefficients) makes a coordinate pass with probability <~ delta1 / 1.5 per test."""
    cfg = config("private-lasso", 4096, eps=1.0)
    result = run_local(cfg)
    env = make_env(cfg)
    algo = make_algorithm(env, cfg)
    assert set(env.support) <= set(episodes(result.state)[-1]["S0"])
    assert algo.threshold_at(4080) > 100 * np.abs(env.theta).max()
    assert all(len(e["S1"]) == 0 for e in episodes(result.state))
