"""The example env plugin drifting-linear: found through its entry point, passes the env kit, and runs ldpfed's
built-in linear algorithms (ldp-ols, ldp-sgd) with no change to them, because it declares the kind "linear".

Run from the repository's top folder (`.venv/bin/python -m pytest examples/drifting-linear/tests`) or from
examples/drifting-linear (`python -m pytest`); the package must be installed (`pip install -e
examples/drifting-linear`).
"""
import math
import subprocess
import sys

import numpy as np
import pytest

from drifting_linear import DriftingLinear
from ldpfed.algorithms import REGISTRY
from ldpfed.config import RunConfig
from ldpfed.engine import run_local
from ldpfed.envs import ENVS, build_env
from ldpfed.sweep_spec import build
from ldpfed.testing import ENV_CHECKS, check_env
from ldpfed.util.errors import ConfigError


def test_found_through_its_entry_point():
    assert ENVS["drifting-linear"] is DriftingLinear
    assert ENVS.source("drifting-linear") == "ldpfed-drifting-linear"
    assert DriftingLinear.kinds_of() == ("drifting-linear", "linear")


def test_passes_the_env_kit():
    # every check, the kind's contract included; and at the two ends of the drift's range
    for drift in (0.0, math.pi / 2, math.pi):
        report = check_env("drifting-linear", env_params={"drift": drift, "d": 3}, users=300, samples=500)
        assert report == {check: "passed" for check in ENV_CHECKS}, (drift, report)


def test_every_algorithm_of_kind_linear_runs_on_it():
    runs = {name for name, cls in REGISTRY.items() if cls.runs_on("drifting-linear")}
    assert runs == {name for name, cls in REGISTRY.items() if cls.runs_on("linear")}
    assert {"ldp-ols", "ldp-sgd", "ols", "ldp-ucb", "linucb", "uniform"} <= runs


@pytest.mark.parametrize("algorithm", ["ldp-ols", "ldp-sgd"])
def test_builtin_algorithms_run_on_it_unchanged(algorithm):
    """No patching: RunConfig accepts the pair, and at drift 0 the world is "linear" itself, bit for bit (the same
    truth, contexts and noise), on the round loop and on the compiled sequential loop (round size 1)."""
    for round_size in (10, 1):
        common = dict(users=600, round_size=round_size, seed=4)
        drifting = run_local(RunConfig(algorithm, env="drifting-linear", env_params={"drift": 0.0}, **common))
        linear = run_local(RunConfig(algorithm, env="linear", **common))
        assert drifting.table["cumulative_regret"].tolist() == linear.table["cumulative_regret"].tolist()
        assert drifting.summary["engine"] == linear.summary["engine"]
        moving = run_local(RunConfig(algorithm, env="drifting-linear", env_params={"drift": math.pi}, **common))
        assert moving.table["users"].iloc[-1] == 600 and np.isfinite(moving.summary["final_regret"])
        assert moving.summary["final_regret"] != linear.summary["final_regret"]


def test_the_parameter_turns_by_drift_over_the_horizon():
    env = build_env("drifting-linear", 1000, seed=2, env_params={"d": 4, "drift": math.pi / 2, "noise_std": 0.0})
    theta = env.theta_at([0, 500, 1000])
    assert np.allclose(np.linalg.norm(theta, axis=1), 1.0)
    angles = np.arccos(np.clip(theta @ env.u, -1, 1))
    assert np.allclose(angles, [0.0, math.pi / 4, math.pi / 2])
    # noiseless rewards are the means under each user's own theta_t
    users = np.array([0, 250, 999])
    rng = np.random.default_rng(0)
    contexts = env.contexts(users, rng)
    actions = np.array([3, 0, 7])
    rewards, regret = env.step(contexts, actions, users, rng)
    means = np.einsum("nkd,nd->nk", contexts, env.theta_at(users))
    assert np.allclose(rewards, means[np.arange(3), actions], atol=1e-12)
    assert np.allclose(regret, means.max(axis=1) - means[np.arange(3), actions], atol=1e-12)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), "inf", -0.1, 4.0, True])
def test_bad_drift_is_refused_before_any_work(value):
    with pytest.raises(ConfigError) as info:
        RunConfig("ldp-ols", env="drifting-linear", users=100, env_params={"drift": value})
    assert info.value.field == "env_params.drift"


def test_a_sweep_file_checks_its_options_before_any_run():
    sweep = build({"name": "drift", "algorithms": ["ldp-ols", "ldp-sgd"], "envs": ["drifting-linear"],
                   "env_params": {"drifting-linear": {"drift": 1.0}}})
    assert sweep.env_params == {"drifting-linear": {"drift": 1.0}}
    with pytest.raises(ConfigError) as info:
        build({"name": "drift", "envs": ["drifting-linear"], "env_params": {"drifting-linear": {"drfit": 1.0}}})
    assert info.value.field.endswith("env_params.drifting-linear.drfit") and "did you mean 'drift'" in info.value.reason


def test_describe_shows_its_options_and_algorithms():
    done = subprocess.run([sys.executable, "-m", "ldpfed", "describe", "drifting-linear"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "kinds:          drifting-linear, linear" in done.stdout and "(plugin)" in done.stdout
    assert "drift" in done.stdout and "a finite number in [0, 3.14159" in done.stdout
    assert "ldp-ols" in done.stdout and "ldp-sgd" in done.stdout
