"""Profiles: RunConfig(profile=...) is validated, reaches envs and algorithms, and the CLI and run_all pass it on."""
import subprocess
import sys

import pytest

from ldpfed.algorithms import REGISTRY, make_algorithm
from ldpfed.config import PROFILES, RunConfig
from ldpfed.envs import ENVS, make_env
from ldpfed.util.errors import ConfigError


def test_profile_defaults_to_paper_and_is_validated():
    assert RunConfig("ldp-sgd").profile == "paper"
    assert RunConfig("ldp-sgd", profile="authors-code").profile == "authors-code"
    for bad in ("authors", "", None, "Paper"):
        with pytest.raises(ConfigError) as error:
            RunConfig("ldp-sgd", profile=bad)
        assert error.value.field == "profile"


def test_profile_defaults_name_known_options():
    """A profile may only change the default of an option the class declares (else it would be a silent no-op)."""
    for cls in [*REGISTRY.values(), *ENVS.values()]:
        for profile, options in cls.profile_defaults.items():
            assert profile in PROFILES, (cls, profile)
            assert set(options) <= set(cls.defaults), (cls, set(options) - set(cls.defaults))


def test_profile_reaches_env_and_algorithm_and_user_options_win():
    config = RunConfig("ldp-sgd", users=100, profile="authors-code")
    env = make_env(config)
    assert env.noise_std == 0.0                         # the authors' noiseless rewards
    assert make_algorithm(env, config).profile == "authors-code"
    env = make_env(config.replace(env_params={"noise_std": 0.2}))
    assert env.noise_std == 0.2                         # an explicit option beats the profile's default
    multi = make_env(RunConfig("ldp-sgd-multi", users=100, profile="authors-code"))
    assert multi.gaussian_contexts and multi.noise_std == 0.05
    assert not make_env(RunConfig("ldp-sgd-multi", users=100)).gaussian_contexts


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "ldpfed", *args], capture_output=True, text=True, timeout=120)


def test_cli_profile_option():
    done = _cli("run", "ldp-sgd", "--users", "500", "--round-size", "10", "--profile", "authors-code", "--quiet")
    assert done.returncode == 0, done.stderr
    assert "profile=authors-code" in done.stdout
    bad = _cli("run", "ldp-sgd", "--users", "500", "--profile", "nope")
    assert bad.returncode == 2 and "--profile" in bad.stderr


def test_a_sweep_passes_the_profile():
    from ldpfed import sweep_spec as sweeps
    from ldpfed.cli import build_parser

    args = build_parser().parse_args(["sweep", "quick", "--profile", "authors-code", "--algorithms", "ldp-sgd,uniform",
                                      "--users", "100"])
    sweep, _ = sweeps.from_args(args, sweeps.locate(args.sweep))
    configs = sweeps.configs(sweep)
    assert configs and all(c.profile == "authors-code" for c in configs)


# ---------------------------------------------------------------------------------------------------------------
# Seed 000 and its baselines under profile="authors-code" (the public code liangzp/LDP-Bandit, Scheme1/)
# ---------------------------------------------------------------------------------------------------------------
import math  # noqa: E402

import numpy as np  # noqa: E402

from ldpfed.engine import run_local  # noqa: E402
from ldpfed.util.rng import derive  # noqa: E402


def _algo(name, profile, **changes):
    config = RunConfig(name, profile=profile, **changes)
    return make_algorithm(make_env(config), config)


def test_ledger_voids_the_claim_for_unclipped_contexts():
    """The authors' multi-parameter code privatizes raw N(0, I_d) contexts (norm ~ sqrt(d)) with noise calibrated
    for ||x|| <= 1: the ledger must say the claim is void, not claim eps. The paper profile clips and claims eps."""
    for name in ("ldp-ols-multi", "ldp-sgd-multi"):
        config = RunConfig(name, profile="authors-code", delta=0.1)
        env = make_env(config)
        authors = make_algorithm(env, config)
        rows = authors.ledger()
        assert rows and all("inputs are not clipped" in row["claim_void"] for row in rows), name
        assert not any("claim_void" in row for row in _algo(name, "paper", delta=0.1).ledger()), name
        # and the client really does not clip: its counter sees contexts beyond the bound
        users = np.arange(authors.warm, authors.warm + 50)
        contexts = env.contexts(users, derive(0, "context", 0, 0))
        state = authors.initial_state(derive(0, "init"))
        model = authors.publish(state)
        actions = authors.act(model, contexts, users, derive(0, "privatize", 0, 0))
        rewards, _ = env.step(contexts, actions, users, derive(0, "context", 0, 0))
        _, metrics = authors.encode(model, contexts, actions, rewards, users, derive(0, "privatize", 0, 0))
        assert metrics["unclipped_context_over_bound"] == 50          # ||x|| > 1 for N(0, I_20) (P ~ 1 - 1e-20)


def test_authors_code_ledgers_of_the_single_parameter_algorithms():
    """ldp-sgd clips at R = 1 (still eps-LDP); ldp-ols and ldp-ucb use the code's noise std 6 sqrt(2 ln(2.5/delta))/eps,
    more than their calibration needs (claim stands); ldp-gloc's unprojected theta^ leaves u's sensitivity unbounded
    and its gradient noise (sigma, not C_g sigma) too small: void."""
    eps, delta = 1.0, 0.01
    sigma = 6 * math.sqrt(2 * math.log(2.5 / delta)) / eps
    sgd = _algo("ldp-sgd", "authors-code")
    assert sgd.grad_radius == 1.0 and sgd.mech.radius == 1.0 and not any("claim_void" in r for r in sgd.ledger())
    assert _algo("ldp-sgd", "paper").grad_radius == pytest.approx(2 * (1 + 3 * 0.1))        # paper: 2 c_r C_B
    for name in ("ldp-ols", "ldp-ucb"):
        algo = _algo(name, "authors-code")
        assert algo.mechanisms["M"].sigma == pytest.approx(sigma) == algo.mechanisms["u"].sigma
        assert not any("claim_void" in r for r in algo.ledger()), name
    gloc = _algo("ldp-gloc", "authors-code", env="linear")
    assert gloc.mechanisms["grad"].sigma == pytest.approx(6 * math.sqrt(2 * math.log(3.75 / delta)) / eps)
    assert gloc.zeta == pytest.approx(1 / math.sqrt(gloc.T)) and math.isinf(gloc.S)
    assert all("claim_void" in r for r in gloc.ledger())
    assert not any("claim_void" in r for r in _algo("ldp-gloc", "paper", env="linear").ledger())


def test_authors_code_ols_inverts_the_noisy_gram_matrix_without_shift():
    algo = _algo("ldp-ols", "authors-code", users=100)
    rng = np.random.default_rng(1)
    V = rng.standard_normal((2, 2))
    V = V @ V.T + np.eye(2)
    U = rng.standard_normal(2)
    state = algo.update(algo.initial_state(rng), {"M": V, "u": U}, 0, 100, rng)
    np.testing.assert_allclose(state["theta"], np.linalg.solve(V, U))
    paper = _algo("ldp-ols", "paper", users=100)
    shifted = paper.update(paper.initial_state(rng), {"M": V, "u": U}, 0, 100, rng)["theta"]
    np.testing.assert_allclose(shifted, np.linalg.solve(V + paper.c_shift * 10 * np.eye(2), U))


def test_sgd_multi_projection_bounds_the_first_steps():
    """The paper's d = 20, K = 3: the first steps (eta = 5 on l2-ball messages of norm B ~ 59) throw theta to norms
    of hundreds (> 100 here: 5 B = 297 at the first step alone); with project = 1 (the ball of the paper's
    ||theta*|| <= 1) every estimate stays in it."""
    setting = {"env": "linear-multi", "users": 300, "round_size": 10, "delta": 0.1}
    unprojected = run_local(RunConfig("ldp-sgd-multi", **setting, params={"s0": 100}))
    assert np.linalg.norm(unprojected.state["theta"], axis=1).max() > 100
    fixed = run_local(RunConfig("ldp-sgd-multi", **setting, params={"s0": 100, "project": 1.0}))
    assert np.linalg.norm(fixed.state["theta"], axis=1).max() <= 1.0 + 1e-9


def test_authors_code_orderings_at_small_T():
    """The reference's ordering on seed 000's setting (d = 2, K = 10, noiseless rewards): LDP-SGD learns fastest and
    LDP-UCB, whose c_t shift swamps its Gram matrix, stays near-linear; every one beats uniform play (~0.95 per user).
    T = 1e4 in rounds of 10, medians over 3 seeds (the seed-to-seed spread of the final regret is large, an order of
    magnitude for SGD, so single runs are not compared). Bounds: uniform's total is a sum of 1e4 per-user regrets,
    its sampling std is ~1% of its mean, so "below 0.8 x uniform" is far outside its noise."""
    setting = {"env": "linear", "users": 10_000, "round_size": 10, "eps": 1.0, "delta": 0.01,
               "profile": "authors-code"}
    median = {}
    for name in ("ldp-sgd", "ldp-ols", "ldp-ucb", "uniform"):
        median[name] = float(np.median([run_local(RunConfig(name, seed=s, **setting)).summary["final_regret"]
                                        for s in range(3)]))
    assert median["ldp-sgd"] < median["ldp-ols"] < median["uniform"] * 0.8
    assert median["ldp-sgd"] < median["ldp-ucb"] < median["uniform"] * 0.8


@pytest.mark.parametrize("algorithm,env", [("ldp-sgd", "linear"), ("ldp-sgd", "logistic"), ("ldp-ols", "linear"),
                                           ("ldp-ucb", "linear"), ("ldp-gloc", "linear"), ("ldp-gloc", "logistic")])
def test_sequential_kernels_mirror_the_authors_code_profile(algorithm, env):
    """The compiled sequential engine runs these under profile authors-code too: fed the generic engine's draws it
    must reproduce run_local (same arms, regret and estimates up to rounding)."""
    from ldpfed.engine.sequential import run_sequential, sequential_unsupported
    from test_sequential import assert_same_run

    config = RunConfig(algorithm, env=env, users=160, seed=5, profile="authors-code")
    assert sequential_unsupported(config) is None
    assert_same_run(run_local(config), run_sequential(config, streams="generic"))


@pytest.mark.parametrize("algorithm,env", [("ldp-sgd-multi", "linear-multi"), ("ldp-ols-multi", "linear-multi"),
                                           # a second env of the same kernel: with the slow tests (the suite's time)
                                           pytest.param("ldp-sgd-multi", "logistic-multi", marks=pytest.mark.slow)])
def test_sequential_kernels_mirror_the_authors_multi_parameter_code(algorithm, env):
    """The authors' multi-parameter code on the compiled sequential engine: fed the generic engine's draws it
    reproduces run_local (unclipped N(0, I_d) contexts, the SGD's OLS warm-up and its one K d-dimensional l2-ball
    message), and its ledger still says the claim is void (its counter sees the contexts beyond the bound)."""
    from ldpfed.engine.sequential import run_sequential, sequential_unsupported
    from test_sequential import assert_same_run

    config = RunConfig(algorithm, env=env, users=160, seed=5, profile="authors-code", delta=0.1,
                       env_params={"d": 4}, params={"s0": 20})
    assert sequential_unsupported(config) is None
    kernel = run_sequential(config, streams="generic")
    assert_same_run(run_local(config), kernel, rtol=0)      # written once: the same functions on the same draws
    assert kernel.ledger and all("inputs are not clipped" in row["claim_void"] for row in kernel.ledger)
    assert kernel.table["unclipped_context_over_bound"].sum() > 100    # ||x|| > 1 for most N(0, I_4) draws
    assert sequential_unsupported(RunConfig(algorithm)) is None


def test_sequential_kernel_projects_the_paper_sgd_multi():
    from ldpfed.engine.sequential import run_sequential, sequential_unsupported
    from test_sequential import assert_same_run

    config = RunConfig("ldp-sgd-multi", users=160, seed=5, delta=0.1, env_params={"d": 4},
                       params={"s0": 20, "project": 1.0})
    assert sequential_unsupported(config) is None
    kernel = run_sequential(config, streams="generic")
    assert_same_run(run_local(config), kernel, rtol=0)
    assert np.linalg.norm(kernel.state["theta"], axis=1).max() <= 1.0 + 1e-9
