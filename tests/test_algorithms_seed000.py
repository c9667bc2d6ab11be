"""Seed 000 (Han, Liang, Wang, Zhang 2021): ldp-ols, ldp-sgd, ldp-ols-multi, ldp-sgd-multi and the non-private
ols, ols-multi. Reduced horizons (T = 2e4, rounds of 10 users: the batched variant) so that each test takes a few
seconds; B = 1 (the paper's sequential algorithm) is checked against a plain loop; the claims that need many seeds
run at B = 1 and T = 1e5 on the compiled sequential engine."""
import math

import numpy as np
import pytest
from scipy import special, stats

from ldpfed.algorithms import make_algorithm
from ldpfed.config import RunConfig
from ldpfed.engine import run as run_engine
from ldpfed.engine import run_local
from ldpfed.envs import make_env
from ldpfed.mechanisms import gaussian_sigma
from ldpfed.testing import record_inputs
from ldpfed.util.errors import ConfigError
from ldpfed.util.normals import standard_normals
from ldpfed.util.rng import derive

T, B = 20_000, 10
SINGLE = {"env": "linear", "eps": 1.0, "delta": 0.01}                         # the paper's d=2, K=10
# Multi parameter: d = 2, K = 3 so that something is learnable in 2e4 users (the paper's d = 20 is not: see
# test_ldp_ols_multi_beats_uniform_at_small_noise).
MULTI = {"env": "linear-multi", "eps": 1.0, "delta": 0.1, "env_params": {"d": 2, "K": 3}}

_cache: dict = {}


def run(algorithm, setting, seed=0, users=T, round_size=B, **changes):
    """engine.run (at B = 1 the compiled sequential engine where it applies, else run_local), memoized within this
    module (several tests compare the same runs)."""
    setting = {**setting, **changes}
    key = (algorithm, repr(sorted(setting.items())), seed, users, round_size)
    if key not in _cache:
        params = setting.pop("params", {}) if algorithm != "uniform" else {}
        setting.pop("params", None)
        _cache[key] = run_engine(RunConfig(algorithm, users=users, round_size=round_size, seed=seed,
                                           params=params, **setting))
    return _cache[key]


def assert_clearly_beats_uniform(result, uniform):
    """'Clearly' = at most half of uniform's regret, over the whole run AND over its second half (so the learner
    is still far better at the end, not just lucky early). Uniform's regret is a sum of T independent per-user
    regrets, so its sampling std is sqrt(T) * sd(per-user) ~ 1% of its mean here: a factor 2 is far outside noise,
    which we check too (the factor-2 gap exceeds 10 sampling std of uniform's total)."""
    u, a = uniform.table, result.table
    half = len(u) // 2
    sd_uniform = math.sqrt(len(u) * u["regret"].var())          # std of the sum of the per-round regrets
    assert uniform.summary["final_regret"] / 2 > 10 * sd_uniform
    assert result.summary["final_regret"] <= 0.5 * uniform.summary["final_regret"]
    assert a["regret"].iloc[half:].sum() <= 0.5 * u["regret"].iloc[half:].sum()


# ---------------------------------------------------------------------------------------------------------------
# Learning
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ["ldp-ols", "ldp-sgd", "ols"])
def test_single_parameter_beats_uniform(algorithm):
    assert_clearly_beats_uniform(run(algorithm, SINGLE), run("uniform", SINGLE))


@pytest.mark.parametrize("algorithm,env", [("ldp-sgd", "logistic"), ("ldp-ols", "poisson"), ("ols", "logistic")])
def test_single_parameter_learns_glm(algorithm, env):
    setting = {**SINGLE, "env": env}
    assert_clearly_beats_uniform(run(algorithm, setting), run("uniform", setting))


@pytest.mark.parametrize("algorithm", ["ols-multi"])
def test_multi_parameter_beats_uniform(algorithm):
    assert_clearly_beats_uniform(run(algorithm, MULTI), run("uniform", MULTI))


def test_ldp_sgd_multi_projected_learns():
    """ldp-sgd-multi with the paper's constant step (5/j) has a heavy tail: its first steps, 5 Z with Z an l2-ball
    output of norm ~17, throw theta far (REPRODUCTION.md, multi parameter, gives the arithmetic at d = 20); projecting
    onto the paper's ||theta_a|| <= 1 (`project=1`, free post-processing) tames it. At the paper's B = 1 and T = 1e5
    (the sequential engine), log(regret / uniform's regret) over 60 other seeds (100-159) had mean -1.17, sd 0.88,
    and was < 0 in 87%; at T = 2e4 and B = 10 only in ~63% of seeds (a 5-seed "below uniform on every seed" held by
    luck before the mechanisms' normals changed stream). Asserted: a one-sided Wilcoxon signed-rank test of the log
    ratio over seeds 0-19 rejects "no better than uniform" at level 0.01 (power 0.998, by resampling those 60 seeds).
    Uniform play runs at B = 1000: its regret's law does not depend on B."""
    log_ratios = [math.log(run("ldp-sgd-multi", {**MULTI, "params": {"project": 1}}, seed=seed, users=100_000,
                               round_size=1).summary["final_regret"]
                           / run("uniform", MULTI, seed=seed, users=100_000, round_size=1000).summary["final_regret"])
                  for seed in range(20)]
    assert stats.wilcoxon(log_ratios, alternative="less").pvalue < 0.01, np.round(np.exp(log_ratios), 2)


def test_ldp_ols_multi_beats_uniform_at_small_noise():
    """ldp-ols-multi's estimate is (V_a + c~ sqrt(n_a) I)^{-1} U_a: the shift (Theorem 4.1) dominates V_a ~ n_a/(K d)
    until sqrt(n_a) ~ K d c~, i.e. n_a ~ 1e7 at eps = 1 even for d = 2, so at eps = 1 and T = 2e4 it is not better
    than uniform (a finding, not a bug). With a small noise (eps = 8, analytic calibration: c~ ~ 8 times smaller)
    the same code learns clearly."""
    setting = {**MULTI, "eps": 8.0, "params": {"calibration": "analytic"}}
    assert_clearly_beats_uniform(run("ldp-ols-multi", setting), run("uniform", setting))


@pytest.mark.parametrize("private,baseline,setting", [("ldp-ols", "ols", SINGLE),
                                                      ("ldp-ols-multi", "ols-multi", MULTI)])
def test_non_private_baseline_beats_private(private, baseline, setting):
    """Same world, same contexts and rewards (same seed): removing the noise must help by a wide margin; 4 times
    is far below what we see (>= 20 times) and far above seed-to-seed noise of the private run's regret."""
    assert run(baseline, setting).summary["final_regret"] * 4 <= run(private, setting).summary["final_regret"]


SEEDS = range(5)


def test_sgd_beats_ols():
    """The paper's ordering LDP-SGD < LDP-OLS (d = 2, K = 10, eps = 1), at its B = 1 and T = 1e5 (the sequential
    engine). Both regrets are heavy-tailed: log(SGD / OLS) on the same seed (same world) over 60 other seeds
    (100-159) had mean -0.71, sd 1.02, and was < 0 in 75% (a median over 5 seeds is a coin with those tails: it held
    by luck before the mechanisms' normals changed stream). Asserted: a one-sided Wilcoxon signed-rank test over
    seeds 0-29 rejects "SGD no better" at level 0.01 (power 0.88, by resampling those 60 seeds)."""
    log_ratios = [math.log(run("ldp-sgd", SINGLE, seed=seed, users=100_000, round_size=1).summary["final_regret"]
                           / run("ldp-ols", SINGLE, seed=seed, users=100_000, round_size=1).summary["final_regret"])
                  for seed in range(30)]
    assert stats.wilcoxon(log_ratios, alternative="less").pvalue < 0.01, np.round(np.exp(log_ratios), 2)


def test_sgd_estimation_error_shrinks():
    """Theorem 3.1's SGD analysis needs diverse greedy contexts (Assumption 3); with K = 2 the greedy arm is
    diverse enough for eta ~ 5/t to contract every direction, and 1/t-SGD then has error ~ 1/sqrt(t): a factor
    sqrt(10) ~ 3.2 from t = 2e3 to 2e4. Per seed the ratio late/early is noisy: over seeds 0-23 (48 runs, before and
    after the context sampler's stream change) it was <= 0.6 in 79% of runs and < 1 in 83% (above 1 in 8: an early
    error that happened to be small). So over 9 seeds we require a median <= 0.6 and a decrease in a majority: they
    fail with probability 2.4% resp. 1% (binomial, 9 draws at p = 0.79, resp. 0.83). (Earlier: a decrease in every
    one of seeds 0-2, which held by luck.) (With K = 10 the greedy contexts cluster around theta* and the orthogonal
    error shrinks only slowly.)"""
    setting = {**SINGLE, "env_params": {"K": 2}}
    ratios = []
    for seed in range(9):
        table = run("ldp-sgd", setting, seed=seed).table.dropna(subset=["estimation_error"])
        early = table["estimation_error"][table["users"] <= T // 10].iloc[-1]
        late = table["estimation_error"].iloc[-1]
        ratios.append(late / early)
    assert np.median(ratios) <= 0.6
    assert np.count_nonzero(np.array(ratios) < 1) >= 5


# ---------------------------------------------------------------------------------------------------------------
# Exactness: B = 1 is the paper's sequential algorithm
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("env", ["linear", "logistic"])
def test_ldp_sgd_b1_equals_sequential_loop(env):
    users, seed, eps = 400, 11, 1.0
    config = RunConfig("ldp-sgd", env=env, users=users, round_size=1, eps=eps, delta=0.01, seed=seed)
    result = run_local(config)

    world_env = make_env(config)                          # ground truth from derive(seed, "env")
    d, c_r = world_env.d, world_env.reward_bound
    R = 2.0 * c_r * 1.0                                   # R = 2 c_r C_B, C_B = 1
    # the l2-ball mechanism written out here (not the library's): B from Lemma 2.2's closed form, then the
    # library's order of draws (a Gaussian direction, a uniform for the hemisphere, reflection)
    B = R * math.sqrt(math.pi) / math.tanh(eps / 2) * math.exp(math.lgamma((d + 1) / 2) - math.lgamma(d / 2))

    def l2_ball(g, rng):
        v = standard_normals(rng, d)                      # the mechanisms' normals (ldpfed.util.normals)
        v /= np.linalg.norm(v)
        norm = np.linalg.norm(g)
        u = g / norm if norm > 0 else np.eye(d)[0]
        want_pos = rng.random() < 0.5 + min(norm, R) * math.tanh(eps / 2) / (2 * R)
        if (v @ u >= 0) != want_pos:
            v = v - 2 * (v @ u) * u
        return B * v

    mu = (lambda z: z) if env == "linear" else (lambda z: 1.0 / (1.0 + np.exp(-z)))
    init = derive(seed, "init")
    theta = init.standard_normal(d)
    theta /= np.linalg.norm(theta)                        # random unit start
    regrets = []
    for t in range(users):                                # user t: round t of the engine, population 0
        world, client = derive(seed, "context", 0, t), derive(seed, "privatize", 0, t)
        contexts = world_env.contexts(np.array([t]), world)
        a = int(np.argmax(contexts[0] @ theta))
        reward, regret = world_env.step(contexts, np.array([a]), np.array([t]), world)
        x = contexts[0, a]
        x = x / max(1.0, np.linalg.norm(x))
        r = float(np.clip(reward[0], -c_r, c_r))
        g = (mu(x @ theta) - r) * x
        g = g * min(1.0, R / np.linalg.norm(g)) if np.linalg.norm(g) > 0 else g
        theta = theta - 5.0 / (t + 1) * l2_ball(g, client)   # eta_t = 5/(t+1), t 0-based
        regrets.append(regret[0])
    np.testing.assert_allclose(result.table["regret"].to_numpy(), regrets, rtol=0, atol=1e-12)
    np.testing.assert_allclose(result.state["theta"], theta, rtol=1e-10, atol=1e-12)


def test_ldp_sgd_batched_round_applies_each_users_step():
    """B > 1: every user's gradient is taken at the published theta and applied with its own eta_t (aggregate);
    the default step_offset "auto" is B - 1 = 9, so user t's step is 5 / (t + 1 + 9)."""
    config = RunConfig("ldp-sgd", env="linear", users=100, round_size=10, eps=1.0, delta=0.01, seed=2)
    algo = make_algorithm(make_env(config), config)
    Z = np.arange(30.0).reshape(10, 3)[:, :2]
    users = np.arange(20, 30)
    expected = sum(5.0 / (u + 1 + 9) * Z[i] for i, u in enumerate(users))
    np.testing.assert_allclose(algo.aggregate({"Z": Z}, users)["Z"], expected)


# ---------------------------------------------------------------------------------------------------------------
# Privacy: clipping, calibration, ledger
# ---------------------------------------------------------------------------------------------------------------
def test_l2_ball_input_is_clipped_and_counted():
    config = RunConfig("ldp-sgd", env="poisson", users=1000, round_size=10, eps=1.0, delta=0.01, seed=0)
    env = make_env(config)
    algo = make_algorithm(env, config)
    seen = record_inputs(algo)["Z"]                       # what the l2-ball mechanism is given
    users = np.arange(500)
    world = derive(0, "context", 0, 0)
    contexts = env.contexts(users, world)
    model = {"theta": 3.0 * env.theta}                    # over-estimates: exp(x^T theta) often far above c_r
    actions = algo.act(model, contexts, users, world)
    rewards, _ = env.step(contexts, actions, users, world)
    _, metrics = algo.encode(model, contexts, actions, rewards, users, derive(0, "privatize", 0, 0))
    x = contexts[np.arange(len(users)), actions]
    raw = (np.exp(x @ model["theta"]) - np.clip(rewards, -env.reward_bound, env.reward_bound))[:, None] * x
    over = np.linalg.norm(raw, axis=1) > algo.grad_radius
    assert 0 < over.sum() < len(users)
    assert metrics["clipped"] == over.sum()
    assert np.linalg.norm(seen[0], axis=1).max() <= algo.grad_radius * (1 + 1e-12)   # the mechanism never sees more than R

    result = run_local(config)                              # the count reaches the result table
    assert "clipped" in result.table.columns
    assert result.table["clipped"].sum() == result.summary["total_clipped"] > 0


def test_ledger_and_noise_calibration():
    eps, delta = 1.0, 0.01
    config = RunConfig("ldp-ols", env="linear", eps=eps, delta=delta)
    ols = make_algorithm(make_env(config), config)
    rows = {row["message"]: row for row in ols.ledger()}
    assert set(rows) == {"M", "u"}
    for row in rows.values():
        assert (row["eps"], row["delta"], row["model"]) == (eps / 2, delta / 2, "ldp")
    c_r = ols.world.reward_bound
    assert ols.mech_M.sigma == pytest.approx(math.sqrt(2) * math.sqrt(2 * math.log(1.25 / (delta / 2))) / (eps / 2))
    assert ols.mech_u.sigma == pytest.approx(2 * c_r * math.sqrt(2 * math.log(1.25 / (delta / 2))) / (eps / 2))
    T_ = ols.T
    assert ols.c_shift == pytest.approx(2 * ols.mech_M.sigma * (4 * math.sqrt(2) + 2 * math.log(2 * T_ / 0.1)))

    config = RunConfig("ldp-sgd", env="linear", eps=eps)
    sgd = make_algorithm(make_env(config), config)
    (row,) = sgd.ledger()
    assert (row["message"], row["mechanism"], row["eps"], row["delta"]) == ("Z", "l2-ball", eps, 0.0)
    assert row["sensitivity"] == pytest.approx(2 * sgd.world.reward_bound)            # R = 2 c_r C_B

    config = RunConfig("ldp-ols-multi", eps=eps, delta=0.1)
    multi = make_algorithm(make_env(config), config)
    for row in multi.ledger():                  # (eps/2, delta/2) per arm slot, split evenly between M and u
        assert (row["eps"], row["delta"]) == (eps / 4, 0.1 / 4) and "slot" in row["scope"]
    assert multi.mech_M.sigma == pytest.approx(gaussian_sigma(math.sqrt(2), eps / 4, 0.1 / 4))
    config = RunConfig("ldp-sgd-multi", eps=eps, delta=0.1)
    (row,) = make_algorithm(make_env(config), config).ledger()
    assert row["eps"] == eps / 2


@pytest.mark.parametrize("algorithm,params", [
    ("ldp-sgd", {"step": -1.0}), ("ldp-sgd", {"step_offset": -2}), ("ldp-ols", {"alpha": 1.5}),
    ("ldp-ols", {"calibration": "exact"}), ("ldp-ols-multi", {"s0": 0}), ("ldp-sgd-multi", {"h": float("nan")}),
    ("ols", {"ridge": 0.0}), ("ldp-ols", {"context_bound": "1"}), ("ldp-ols", {"ridge": 1.0}),
])
def test_bad_options_are_rejected(algorithm, params):
    with pytest.raises(ConfigError) as info:      # at RunConfig already: before any work
        RunConfig(algorithm, users=100, params=params)
    assert info.value.field == f"params.{next(iter(params))}"


def test_env_kinds():
    with pytest.raises(ConfigError):
        RunConfig("ldp-ols", env="linear-multi")
    with pytest.raises(ConfigError):
        RunConfig("ldp-sgd-multi", env="poisson")


@pytest.mark.parametrize("algorithm", ["ldp-ols", "ols", "ldp-sgd", "ldp-ols-multi", "ols-multi", "ldp-sgd-multi"])
def test_runs_on_every_glm_env(algorithm):
    envs = ("linear-multi", "logistic-multi", "poisson-multi") if "multi" in algorithm else \
        ("linear", "logistic", "poisson")
    for env in envs:
        result = run_local(RunConfig(algorithm, env=env, users=400, round_size=4, seed=1, params={"s0": 20}
                                     if "multi" in algorithm else {}))
        assert np.isfinite(result.summary["final_regret"]) and np.isfinite(result.summary["final_estimation_error"])


# ---------------------------------------------------------------------------------------------------------------
# Multi parameter: warm-up, elimination, and messages that hide the pulled arm
# ---------------------------------------------------------------------------------------------------------------
def _multi_round(algorithm, users, theta_seed=5, **config_changes):
    """One batch of users encoded against a model with random per-arm estimates (so the pulled arm varies)."""
    config = RunConfig(algorithm, **{"eps": 1.0, "delta": 0.1, "users": 100_000, **config_changes})
    env = make_env(config)
    algo = make_algorithm(env, config)
    rng = np.random.default_rng(theta_seed)
    model = {"theta": rng.standard_normal((env.K, env.d)), "theta_warm": rng.standard_normal((env.K, env.d))}
    world = derive(0, "context", 0, 0)
    contexts = env.contexts(users, world)
    actions = algo.act(model, contexts, users, world)
    rewards, _ = env.step(contexts, actions, users, world)
    messages, _ = algo.encode(model, contexts, actions, rewards, users, derive(0, "privatize", 0, 0))
    return algo, env, model, contexts, actions, rewards, messages


def test_warm_up_is_round_robin_and_sends_only_the_public_arm():
    users = np.arange(0, 600)                          # s0 = auto = 333 at T = 1e5, K = 3: warm-up = 999 users
    for algorithm, field in [("ldp-ols-multi", "u"), ("ldp-sgd-multi", "Z")]:
        algo, env, _, _, actions, _, messages = _multi_round(algorithm, users)
        assert algo.warm == 999 and algo.s0 == 333
        np.testing.assert_array_equal(actions, users % env.K)
        onehot = np.eye(env.K)[users % env.K]
        np.testing.assert_array_equal(messages["n"], onehot)
        filled = np.any(messages[field] != 0, axis=-1)
        np.testing.assert_array_equal(filled, onehot.astype(bool))
        assert set(messages) == set(algo.message_spec()) and algo.public_fields == {"n"}


def test_elimination_uses_the_warm_up_estimates():
    users = np.arange(2000, 6000)
    algo, env, model, contexts, actions, _, _ = _multi_round("ldp-ols-multi", users, params={"h": 1.0})
    warm = contexts @ model["theta_warm"].T
    keep = warm > warm.max(axis=1, keepdims=True) - 0.5          # eq. (7) with h = 1
    current = np.where(keep, contexts @ model["theta"].T, -np.inf)
    np.testing.assert_array_equal(actions, current.argmax(axis=1))
    assert 0 < (~keep).sum(), "some arms must be eliminated for this test to have power"
    assert np.any(actions != (contexts @ model["theta"].T).argmax(axis=1))


def _gaussian_argmax_accuracy(shift, K):
    """P(N_0 + shift > max(N_1..N_{K-1})), N_i iid N(0, 1)."""
    z = np.linspace(-10, 10, 20001)
    return float(np.trapezoid(np.exp(-z ** 2 / 2) / math.sqrt(2 * math.pi) * special.ndtr(z + shift) ** (K - 1), z))


def test_ols_multi_messages_hide_the_pulled_arm():
    """After warm-up every arm slot gets a message of the same shapes and the same noise: the residual noise of
    the pulled slot (M - x x^T, u - r x) and the noise of the other slots (psi(0, 0)) have the same std, sigma of
    the mechanism; n is all ones; and guessing the pulled arm from the largest trace(M_a) succeeds no more often
    than the Gaussian calculation for a signal ||x||^2 = 1 under trace noise sigma sqrt(d) allows (~1/K). Without the
    synthetic noise (ols-multi) the same guess is always right."""
    users = np.arange(5000, 7000)
    algo, env, _, contexts, actions, rewards, msg = _multi_round("ldp-ols-multi", users)
    n, K, d = len(users), env.K, env.d
    for field, shape in algo.message_spec().items():
        assert msg[field].shape == (n, *shape)
    np.testing.assert_array_equal(msg["n"], np.ones((n, K)))
    pulled = np.zeros((n, K), dtype=bool)
    pulled[np.arange(n), actions] = True
    assert len(np.unique(actions)) == K
    x, r = contexts, np.clip(rewards, -env.reward_bound, env.reward_bound)
    M_res = msg["M"] - pulled[:, :, None, None] * (x[:, :, None] * x[:, None, :])[:, None]
    u_res = msg["u"] - pulled[:, :, None] * (r[:, None] * x)[:, None]
    iu = np.triu_indices(d)
    for res, sigma in [(M_res[:, :, iu[0], iu[1]], algo.mech_M.sigma), (u_res, algo.mech_u.sigma)]:
        a, b = res[pulled].ravel(), res[~pulled].ravel()
        for sample in (a, b):     # sample variance / sigma^2 - 1 has std sqrt(2/m) for m Gaussian draws
            assert abs(sample.var() / sigma ** 2 - 1) <= 5 * math.sqrt(2 / sample.size)
        assert abs(a.var() / b.var() - 1) <= 5 * math.sqrt(2 / a.size + 2 / b.size)
    assert np.allclose(M_res, np.swapaxes(M_res, -1, -2))               # symmetric noise, full upper triangle

    guess = np.trace(msg["M"], axis1=-2, axis2=-1).argmax(axis=1)
    accuracy = np.mean(guess == actions)
    expected = _gaussian_argmax_accuracy(1.0 / (algo.mech_M.sigma * math.sqrt(d)), K)
    assert expected < 1 / K + 0.01
    assert abs(accuracy - expected) <= 4 * math.sqrt(expected * (1 - expected) / n)

    _, _, _, _, actions_np, _, msg_np = _multi_round("ols-multi", users)
    guess_np = np.trace(msg_np["M"], axis1=-2, axis2=-1).argmax(axis=1)
    assert np.mean(guess_np == actions_np) == 1.0


def test_sgd_multi_messages_hide_the_pulled_arm():
    """Every slot is an l2-ball output: norm exactly B whatever the arm; the psi(0, 0) slots have mean 0."""
    users = np.arange(5000, 9000)
    algo, env, _, _, actions, _, msg = _multi_round("ldp-sgd-multi", users)
    n, K, d = len(users), env.K, env.d
    np.testing.assert_array_equal(msg["n"], np.ones((n, K)))
    np.testing.assert_allclose(np.linalg.norm(msg["Z"], axis=-1), algo.mech.output_radius, rtol=1e-12)
    pulled = np.zeros((n, K), dtype=bool)
    pulled[np.arange(n), actions] = True
    others = msg["Z"][~pulled]                          # uniform on the sphere of radius B: coordinate var B^2/d
    assert np.all(np.abs(others.mean(axis=0)) <= 5 * algo.mech.output_radius / math.sqrt(d * len(others)))


@pytest.mark.parametrize("algorithm", ["ols-multi", "ldp-sgd-multi"])
@pytest.mark.parametrize("round_size", [1, 10])
def test_theta_warm_is_the_estimate_at_the_end_of_the_warm_up(algorithm, round_size):
    """theta_warm (eq. 7's warm-up estimates) follows theta until the round in which the warm-up (K s0 = 15 users)
    ends, and keeps the theta of that round's end afterwards (the first rounds of the runs are the same: nothing
    here depends on T)."""
    setting = {**MULTI, "params": {"s0": 5}}
    end = run_local(RunConfig(algorithm, users=15 if round_size == 1 else 20, round_size=round_size, seed=4,
                              **setting)).state
    np.testing.assert_array_equal(end["theta_warm"], end["theta"])
    later = run_local(RunConfig(algorithm, users=60, round_size=round_size, seed=4, **setting)).state
    np.testing.assert_array_equal(later["theta_warm"], end["theta"])
    assert not np.array_equal(later["theta"], later["theta_warm"])


@pytest.mark.parametrize("algorithm", ["ols-multi", "ldp-ols-multi"])
def test_multi_ols_solves_only_the_arms_whose_statistics_changed(algorithm):
    """After every update theta_a = (V_a + shift_a I)^{-1} U_a for every arm, though ols-multi after the warm-up
    (and both during it) solves only the arms whose slots carried something: the others keep the bits of their
    last solve."""
    from ldpfed.algorithms.glm_ldp import SHIFT_PER_ARM
    result = run(algorithm, MULTI, users=3000, round_size=1)
    state, K = result.state, MULTI["env_params"]["K"]
    algo = make_algorithm(make_env(RunConfig(algorithm, users=3000, **MULTI)), RunConfig(algorithm, users=3000,
                                                                                         **MULTI))
    mode, scale = algo.shift_rule()
    for a in range(K):
        shift = scale * math.sqrt(max(state["n"][a], 1.0)) if mode == SHIFT_PER_ARM else scale
        A = state["V"][a] + shift * np.eye(state["V"].shape[1])
        np.testing.assert_allclose(state["theta"][a], np.linalg.solve(A, state["U"][a]), rtol=1e-10, atol=1e-12)
