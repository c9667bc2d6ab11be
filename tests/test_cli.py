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
    assert "2,000/2,000 users" in done.stderr  # progress display


@pytest.mark.parametrize("args,option", [
    (["run", "ldp-sgd", "--eps", "-1"], "--eps"),
    (["run", "ldp-sgd", "--delta", "2"], "--delta"),
    (["run", "ldp-sgd", "--users", "abc"], "--users"),
    (["run", "ldp-sgd", "--users", "0"], "--users"),
    (["run", "no-such-algorithm"], "ALGORITHM"),
    (["run", "ldp-sgd", "--env", "bernoulli"], "--env"),
    (["run", "ldp-sgd", "--param", "step=-1"], "--param step"),
    (["run", "ldp-sgd", "--env-param", "dd=3"], "--env-param dd"),
])
def test_bad_input_exits_2_naming_the_option(args, option):
    done = cli(*args)
    assert done.returncode == 2
    assert option in done.stderr, done.stderr
