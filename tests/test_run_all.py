"""The main job, at toy scale: every requested algorithm runs, uniform play is added on each world, a failing
run is reported without losing the others, and the regret table is written."""
import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "jobs"))
import run_all  # noqa: E402


def test_toy_sweep_writes_every_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = run_all.main(["--engine", "local", "--algorithms", "uniform,ldp-sgd,klucb-cf", "--users", "400",
                         "--round-size", "20", "--seeds", "2", "--eps", "0.5,2", "--out", "out", "--no-tracking"])
    assert code == 0
    summary = pd.read_parquet(tmp_path / "out" / "quick" / "summary" / "summary.parquet")
    assert len(summary) == 2 * 2 * 4   # ldp-sgd, klucb-cf, uniform on linear and on piecewise-bernoulli
    assert set(summary.loc[summary["algorithm"] == "uniform", "env"]) == {"linear", "piecewise-bernoulli"}
    table = (tmp_path / "out" / "quick" / "regret_table.md").read_text()
    assert "| ldp-sgd | linear | 0.5 |" in table


def test_a_failing_run_is_reported_and_the_sweep_goes_on(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    real_run = run_all.run

    def flaky(config, **options):
        if config.algorithm == "ldp-sgd" and config.seed == 1:
            raise RuntimeError("injected failure")
        return real_run(config, **options)

    monkeypatch.setattr(run_all, "run", flaky)
    code = run_all.main(["--engine", "local", "--algorithms", "ldp-sgd", "--users", "200", "--round-size", "20",
                         "--seeds", "2", "--eps", "1", "--out", "out", "--no-tracking"])
    assert code == 1
    summary = pd.read_parquet(tmp_path / "out" / "quick" / "summary" / "summary.parquet")
    assert (summary["seed"] == 0).sum() == 1 and "final_regret" in summary


def test_bad_algorithm_name_exits_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        run_all.main(["--algorithms", "nope", "--no-tracking"])
    assert exit_.value.code == 2
    assert "nope" in capsys.readouterr().err
