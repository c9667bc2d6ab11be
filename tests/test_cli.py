"""The command line: runs, lists, and rejects bad input with exit code 2 and a message naming the option."""
import json
import subprocess
import sys

import pandas as pd
import pytest

from ldpfed.algorithms import REGISTRY


def cli(*args):
    return subprocess.run([sys.executable, "-m", "ldpfed", *args], capture_output=True, text=True, timeout=120)


def test_list_names_every_algorithm():
    out = cli("list").stdout
    for name in REGISTRY:
        assert name in out


def test_run_prints_regret_and_writes_results(tmp_path):
    done = cli("run", "ldp-sgd", "--users", "2e3", "--round-size", "10", "--seed", "1", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "final cumulative regret" in done.stdout
    table = pd.read_parquet(tmp_path / "results.parquet")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert table["users"].iloc[-1] == 2000
    assert summary["final_regret"] == pytest.approx(table["cumulative_regret"].iloc[-1])
    assert summary["ledger"][0]["mechanism"] == "l2-ball"
    assert "2000/2000" in done.stderr and "users/s" in done.stderr  # progress display


def test_help_gives_every_option_a_default_or_an_explanation():
    text = cli("run", "--help").stdout
    for option, shown in [("--eps", "(default: 1.0)"), ("--delta", "(default: 0.01)"), ("--seed", "(default: 0)"),
                          ("--users", "(default: 10000)"), ("--engine", "(default: local)")]:
        assert shown in text.split(option, 2)[2].split("\n  --", 1)[0], option
    assert "describe ALGORITHM" in text


def test_describe_lists_options_envs_privacy_and_paper():
    from ldpfed.envs import ENVS

    done = cli("describe", "ldp-sgd")
    assert done.returncode == 0, done.stderr
    cls = REGISTRY["ldp-sgd"]
    assert f"paper:          {cls.paper}" in done.stdout and "privacy model:  ldp" in done.stdout
    for key, value in cls.defaults.items():
        assert f"{key}" in done.stdout and repr(value) in done.stdout
    for env in cls.envs():
        assert f"  {env}" in done.stdout
    for key in ENVS[cls.default_env].defaults:
        assert f"    {key}" in done.stdout
    unknown = cli("describe", "nope")
    assert unknown.returncode == 2 and "nope" in unknown.stderr


def test_list_names_every_env_with_the_algorithms_that_run_on_it():
    from ldpfed.envs import ENVS

    out = cli("list").stdout
    envs = out.split("envs (python -m ldpfed describe ENV", 1)[1]
    for name, env in ENVS.items():
        line = next(line for line in envs.splitlines() if line.startswith(f"{name} "))
        runs = envs.split(line, 1)[1].splitlines()[1]
        assert runs.strip() == "algorithms: " + ", ".join(sorted(a for a, cls in REGISTRY.items() if cls.runs_on(env)))


def test_describe_env_lists_its_options_with_types_bounds_and_docs():
    from ldpfed.envs import ENVS

    done = cli("describe", "piecewise-bernoulli")
    assert done.returncode == 0, done.stderr
    assert "kinds:          piecewise-bernoulli" in done.stdout and "provided by:    ldpfed (built in)" in done.stdout
    assert "klucb-cf" in done.stdout and "ldp-mab-ucb" in done.stdout
    for row in ENVS["piecewise-bernoulli"].option_table():
        assert f"  {row['name']}" in done.stdout and row["doc"] in done.stdout
    assert "[an integer in [2, inf)]" in done.stdout          # K
    assert f"varies:         {ENVS['piecewise-bernoulli'].varies}" in done.stdout   # its populations' worlds
    typo = cli("describe", "piecewise-bernouli")
    assert typo.returncode == 2 and "did you mean 'piecewise-bernoulli'" in typo.stderr


@pytest.mark.parametrize("value", ["NaN", "Infinity", "inf", "-1", "true", "0.1.2"])
def test_a_bad_env_option_exits_2_naming_it_before_any_work(tmp_path, value):
    done = cli("run", "ldp-sgd", "--env-param", f"noise_std={value}", "--out", str(tmp_path / "out"))
    assert done.returncode == 2 and "--env-param noise_std" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()                    # refused before --out was made


def test_run_track_logs_one_run_to_mlflow(tmp_path):
    from mlflow import MlflowClient

    done = subprocess.run([sys.executable, "-m", "ldpfed", "run", "ucb", "--users", "300", "--round-size", "10",
                           "--track", "--quiet", "--experiment", "cli-test"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.split("MLflow: run ", 1)[1].split()[0]
    run = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params["algorithm"] == "ucb"
    assert run.data.metrics["final_regret"] == pytest.approx(float(done.stdout.split("final cumulative regret: ")[1].split()[0]), abs=0.01)
    assert "mlflow.parentRunId" not in run.data.tags
    assert f"/#/experiments/{run.info.experiment_id}/runs/{run_id}" in done.stdout


def test_run_track_checks_the_store_before_simulating(tmp_path):
    # an unreachable MLflow server is found before the run, not after it: 1e9 users would take hours
    from ldpfed.tracking.local_server import free_port

    done = subprocess.run([sys.executable, "-m", "ldpfed", "run", "ucb", "--users", "1e9", "--round-size", "1000",
                           "--track", "--quiet", "--tracking-uri", f"http://127.0.0.1:{free_port()}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "is unavailable" in done.stderr and "final cumulative regret" not in done.stdout


@pytest.mark.parametrize("args,option", [
    (["run", "ldp-sgd", "--eps", "-1"], "--eps"),
    (["run", "ldp-sgd", "--delta", "2"], "--delta"),
    (["run", "ldp-sgd", "--users", "abc"], "--users"),
    (["run", "ldp-sgd", "--users", "0"], "--users"),
    (["run", "no-such-algorithm"], "ALGORITHM"),
    (["run", "ldp-sgd", "--env", "bernoulli"], "--env"),
    (["run", "ldp-sgd", "--param", "step=-1"], "--param step"),
    (["run", "ldp-sgd", "--env-param", "dd=3"], "--env-param dd"),
    (["run", "ldp-sgd", "--engine", "ray", "--group-size", "-1"], "--group-size"),   # refused before Ray starts
])
def test_bad_input_exits_2_naming_the_option(args, option):
    done = cli(*args)
    assert done.returncode == 2
    assert option in done.stderr, done.stderr


def test_path_picks_the_loop_at_round_size_one(tmp_path):
    """--path rounds runs the round loop (the Ray engine's bits); --path sequential the compiled loop; a loop
    that cannot run the config is an error before any work."""
    from ldpfed.config import RunConfig
    from ldpfed.engine import run

    config = RunConfig("ldp-ols", users=400, round_size=1, seed=3)
    for path, engine, fast in (("rounds", "single-process", False), ("sequential", "sequential", True)):
        done = cli("run", "ldp-ols", "--users", "400", "--seed", "3", "--path", path, "--quiet",
                   "--out", str(tmp_path / path))
        assert done.returncode == 0, done.stderr
        summary = json.loads((tmp_path / path / "summary.json").read_text())
        assert summary["engine"] == engine
        table = pd.read_parquet(tmp_path / path / "results.parquet")
        assert table["cumulative_regret"].tolist() == run(config, fast=fast).table["cumulative_regret"].tolist()
    done = cli("run", "ldp-ols", "--users", "400", "--round-size", "10", "--path", "sequential")
    assert done.returncode == 2 and "round size 10" in done.stderr and "Traceback" not in done.stderr


def test_a_ray_run_of_many_tiny_rounds_warns_before_it_starts(capsys):
    from ldpfed.cli import RAY_ROUNDS_PER_S, SLOW_RUN_S, warn_slow_rounds
    from ldpfed.config import RunConfig

    slow_users = int(2 * SLOW_RUN_S * RAY_ROUNDS_PER_S)
    warn_slow_rounds(RunConfig("ldp-ols", users=slow_users, round_size=1))
    warning = capsys.readouterr().err
    assert f"{slow_users:,} rounds" in warning and "--engine local" in warning and "--round-size" in warning
    warn_slow_rounds(RunConfig("ldp-ols", users=slow_users, round_size=100))
    assert capsys.readouterr().err == ""
