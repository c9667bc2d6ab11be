"""The main job's sweeps (jobs/run_all.py and `python -m ldpfed sweep` run the same executor), at toy scale: a
sweep file with command-line overrides, non-private algorithms once per seed, uniform play on each world, the
grouped table, a failing run reported without losing the others."""
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pandas as pd
import pytest

from ldpfed import cli
from ldpfed import sweep_runner
from ldpfed import sweep_spec as sweeps
from ldpfed.util.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def sweep_main(argv):
    """jobs/run_all.py's command line, run in process through the package's `ldpfed sweep` (the job's --sweep FILE
    is the command's FILE argument); `test_the_job_itself_runs_a_sweep_file` runs the job."""
    argv = list(argv)
    if "--sweep" in argv:
        at = argv.index("--sweep")
        argv[at:at + 2] = [argv[at + 1]]
    return cli.main(["sweep", *argv])


SWEEP = """
name = "toy"
description = "a toy sweep"
algorithms = ["uniform", "ldp-sgd", "klucb-cf", "ols"]
eps = [0.5, 2.0]
seeds = "0-1"
users = 400
round_size = 20
engine = "local"
"""


def test_sweep_file_runs_each_private_algorithm_per_eps_and_the_others_once_per_seed(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "toy.toml").write_text(SWEEP)
    assert sweep_main(["--sweep", "toy.toml", "--out", "out", "--no-tracking"]) == 0
    folder = tmp_path / "out" / "toy"
    summary = pd.read_parquet(folder / "summary" / "summary.parquet")
    runs = summary.groupby("algorithm").size().to_dict()
    # private: 2 eps x 2 seeds; ols: 2 seeds; uniform: 2 seeds on linear and on piecewise-bernoulli
    assert runs == {"ldp-sgd": 4, "klucb-cf": 4, "ols": 2, "uniform": 4}
    assert summary.loc[summary["algorithm"].isin(["ols", "uniform"]), "eps"].isna().all()
    # the grouped table: a section per env, uniform first, a privacy column, regret relative to uniform
    table = (folder / "report" / "regret_table.md").read_text()
    linear = table[table.index("### linear"):]
    rows = [line for line in linear.splitlines() if line.startswith("| ") and "algorithm" not in line][:4]
    assert [r.split(" | ")[0][2:] for r in rows] == ["uniform", "ols", "ldp-sgd", "ldp-sgd"]
    assert rows[0].startswith("| uniform | none | - | 2 |") and "1 (reference)" in rows[0]
    assert rows[2].startswith("| ldp-sgd | ldp | 0.5 | 2 |")
    uniform = summary[(summary["algorithm"] == "uniform") & (summary["env"] == "linear")]["final_regret"].median()
    sgd = summary[(summary["algorithm"] == "ldp-sgd") & (summary["eps"] == 0.5)]["final_regret"]
    assert f"| {sgd.median() / uniform:,.3f} |" in rows[2]
    assert "<table>" in (folder / "report" / "report.html").read_text()
    # the sweep as run is kept, and reads back as the same sweep
    kept = sweeps.build(tomllib.loads((folder / "sweep.toml").read_text()), "kept")
    assert kept == sweeps.build(tomllib.loads(SWEEP), "toy")
    out = capsys.readouterr()
    assert "### piecewise-bernoulli" in out.out and "14/14" in out.err       # the sweep bar counts runs

    # a custom sweep of the same name leaves the first folder alone
    assert sweep_main(["--sweep", "toy.toml", "--algorithms", "ols", "--seeds", "3", "--name", "toy",
                         "--out", "out", "--no-tracking"]) == 0
    assert len(pd.read_parquet(folder / "summary" / "summary.parquet")) == 14
    again = pd.read_parquet(tmp_path / "out" / "toy-2" / "summary" / "summary.parquet")
    assert again["seed"].tolist() == [3]


def test_the_job_itself_runs_a_sweep_file(tmp_path):
    (tmp_path / "toy.toml").write_text(SWEEP)
    job = [sys.executable, str(ROOT / "jobs" / "run_all.py"), "--sweep", "toy.toml", "--algorithms", "ols", "--seeds",
           "3", "--name", "toy", "--out", "out", "--no-tracking"]
    done = subprocess.run(job, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    summary = pd.read_parquet(tmp_path / "out" / "toy" / "summary" / "summary.parquet")
    assert summary["algorithm"].tolist() == ["ols"] and summary["seed"].tolist() == [3]
    assert "run_all: sweep 'toy', 1 algorithms, 1 runs" in done.stdout


def test_a_failing_run_is_reported_and_the_sweep_goes_on(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    real_run = sweep_runner.run

    def flaky(config, **options):
        if config.algorithm == "ldp-sgd" and config.seed == 1:
            raise RuntimeError("injected failure")
        return real_run(config, **options)

    monkeypatch.setattr(sweep_runner, "run", flaky)
    code = sweep_main(["--engine", "local", "--algorithms", "ldp-sgd", "--users", "200", "--round-size", "20",
                         "--seeds", "0,1", "--eps", "1", "--out", "out", "--no-tracking"])
    assert code == 1
    summary = pd.read_parquet(only_folder(tmp_path / "out") / "summary" / "summary.parquet")
    assert summary.set_index("seed")["status"].to_dict() == {0: "FINISHED", 1: "FAILED"}
    err = capsys.readouterr().err
    assert "FAILED ldp-sgd linear eps=1 seed=1" in err and "failed 1" in err


@pytest.mark.parametrize("args,message", [
    (["--algorithms", "nope"], "nope"),
    (["--seeds", "3-1"], "seeds"),
    (["--eps", "0,1"], "eps"),
    (["--sweep", "missing.toml"], "no such file"),
    (["--workers", "0"], "--workers"),
    (["--workers", "many"], "--workers"),
])
def test_bad_sweeps_exit_2_naming_the_problem(args, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        sweep_main([*args, "--no-tracking"])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_sweep_files_are_validated_key_by_key():
    assert sweeps.parse_seeds("0-4") == (0, 1, 2, 3, 4) and sweeps.parse_seeds([7, 2]) == (7, 2)
    with pytest.raises(ConfigError, match="unknown key"):
        sweeps.build({"name": "x", "seed": [0]}, "f.toml")
    with pytest.raises(ConfigError, match="listed twice"):
        sweeps.build({"name": "x", "seeds": [1, 1]}, "f.toml")
    with pytest.raises(ConfigError, match="engine"):
        sweeps.build({"name": "x", "engine": "spark"}, "f.toml")
    # every shipped sweep file is valid and round-trips through the TOML the job writes
    assert sorted(sweeps.presets()) == ["example", "paper", "quick"]
    for path in sweeps.presets().values():
        sweep = sweeps.build(sweeps.read(path), str(path))
        assert sweeps.build(tomllib.loads(sweeps.to_toml(sweep)), "again") == sweep
        assert sweeps.configs(sweep)


class _Terminal:
    """A stream that says it is a terminal (the bars then redraw in place) and keeps what was written."""

    def __init__(self):
        self.text = ""

    def write(self, text):
        self.text += text

    def flush(self):
        pass

    def isatty(self):
        return True


def test_sweep_bar_names_the_running_run_and_counts_failures():
    from ldpfed.util.progress import SweepProgress

    screen = _Terminal()
    bar = SweepProgress(3, label="sweep t", stream=screen)
    bar.started("ldp-sgd linear eps=1 seed=0")
    assert "running ldp-sgd linear eps=1 seed=0" in screen.text.split("\r")[-1]
    bar.finished("ldp-sgd linear eps=1 seed=0", failed=True)
    bar.started("ols linear seed=0")
    last = screen.text.split("\r")[-1]
    assert "1/3" in last and "failed 1" in last and "running ols linear seed=0" in last
    bar.close()


def test_sweep_eta_counts_each_algorithms_first_run_apart(monkeypatch):
    """A first run of an algorithm pays its compile: the ETA prices the algorithms not yet seen at the first runs'
    average time and the other runs at the others', and shows nothing before one of the others has finished."""
    import re

    from ldpfed.util import progress

    clock = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    screen = _Terminal()
    bar = progress.SweepProgress(6, label="sweep t", stream=screen, algorithms=["a", "b", "c", "a", "b", "c"])

    def finish(algorithm, after_s):
        clock[0] += after_s
        bar.finished(f"{algorithm} run", algorithm=algorithm)

    finish("a", 10.0)
    finish("b", 14.0)                       # two first runs: nothing known of the others yet
    assert bar._rate() is None
    bar.bar.refresh()
    assert "<?" in screen.text.split("\r")[-1]
    assert "ETA after each algorithm's first run (2/3)" in screen.text.split("\r")[-1]
    finish("a", 1.0)                        # 3 left: c's first (12 s, the firsts' average), b and c (1 s each)
    assert bar._rate() == pytest.approx(3 / (12.0 + 2 * 1.0))
    bar.bar.refresh()
    assert re.search(r"<00:14", screen.text.split("\r")[-1])
    assert "ETA after" not in screen.text.split("\r")[-1]
    finish("c", 8.0)
    finish("b", 3.0)                        # 1 left, no algorithm unseen: the others' average, 2 s
    assert bar._rate() == pytest.approx(1 / 2.0)
    bar.close()

    # two at once: two runs finishing together leave a short interval; no ETA until two of the others are in
    clock[0] = 100.0
    bar = progress.SweepProgress(6, label="sweep t", stream=_Terminal(), algorithms=["a", "b"] * 3, at_once=2)
    for algorithm, after_s in (("a", 10.0), ("b", 0.1), ("a", 4.0)):
        finish(algorithm, after_s)
    assert bar._rate() is None
    finish("b", 0.2)                        # 2 left at (4 + 0.2) / 2 s each
    assert bar._rate() == pytest.approx(2 / 4.2)
    bar.close()


def test_run_bar_ends_on_the_summary_rate():
    """The bar's clock starts when the engine calls progress(0) (as the recorder's) and its rate is an average,
    so its final users/s is the summary's (the two clocks differ by microseconds: 10% is ample)."""
    import re

    from ldpfed.config import RunConfig
    from ldpfed.engine import run
    from ldpfed.util.progress import Progress

    import time

    screen = _Terminal()
    bar = Progress(3000, "t", stream=screen)
    time.sleep(1.0)          # set-up before the engine's first round (Ray start, actors) is not the run's time
    result = run(RunConfig("ldp-sgd", users=3000, round_size=10), progress=bar)
    rates = re.findall(r"([\d.]+)users/s", screen.text)
    assert rates and float(rates[-1]) == pytest.approx(result.summary["users_per_s"], rel=0.1)


def test_an_interrupted_sweep_resumes_to_the_same_results(tmp_path, monkeypatch, capsys):
    # Ctrl-C in the middle of the 2nd run (after its round 10): the sweep is KILLED with a checkpoint; --resume
    # keeps the finished run, continues the 2nd from its checkpoint and runs the 3rd; the results equal an
    # uninterrupted sweep's, bit for bit.
    monkeypatch.chdir(tmp_path)
    args = ["--engine", "local", "--algorithms", "ldp-sgd", "--users", "400", "--round-size", "20",
            "--seeds", "0-2", "--eps", "1", "--no-tracking", "--checkpoint-every-s", "1000"]
    assert sweep_main(args + ["--out", "whole"]) == 0
    real_run, calls = sweep_runner.run, []

    def interrupted(config, **options):
        calls.append(config)
        if len(calls) == 2:
            def progress(done, regret):
                if done == 200:
                    raise KeyboardInterrupt
            return real_run(config, progress=progress, **options)
        return real_run(config, **options)

    monkeypatch.setattr(sweep_runner, "run", interrupted)
    assert sweep_main(args + ["--out", "out"]) == 130
    folder = only_folder(tmp_path / "out")
    err = capsys.readouterr().err
    assert "1 of 3 runs finished" in err and f"--resume {folder}" in err
    assert sweeps_status(folder) == "KILLED"
    assert len(list((folder / "checkpoints").glob("*/checkpoint.npz"))) == 1
    monkeypatch.setattr(sweep_runner, "run", real_run)
    assert sweep_main(["--resume", str(folder), "--no-tracking"]) == 0
    assert "1 of 3 runs finished earlier, 2 to run" in capsys.readouterr().out
    assert sweeps_status(folder) == "FINISHED" and not list((folder / "checkpoints").glob("*/checkpoint.npz"))
    whole = pd.read_parquet(only_folder(tmp_path / "whole") / "summary" / "summary.parquet").set_index("key")
    resumed = pd.read_parquet(folder / "summary" / "summary.parquet").set_index("key")
    assert sorted(resumed.index) == sorted(whole.index) and (resumed["status"] == "FINISHED").all()
    assert resumed["final_regret"].to_dict() == whole["final_regret"].to_dict()
    assert resumed["resumed_from_round"].dropna().tolist() == [10]
    for key in whole.index:
        pd.testing.assert_frame_equal(pd.read_parquet(only_folder(tmp_path / "whole") / "runs" / key / "table.parquet"),
                                      pd.read_parquet(folder / "runs" / key / "table.parquet"), check_exact=True)


def sweeps_status(folder):
    import json

    return json.loads((folder / "sweep.json").read_text())["status"]


def only_folder(out):
    """The one sweep folder under `out` (a file's sweep with overrides is named after them)."""
    folders = [path for path in out.iterdir() if path.is_dir()]
    assert len(folders) == 1, folders
    return folders[0]


def test_a_preset_run_with_overrides_is_named_after_them():
    sweep, path, _ = sweeps.load("quick", {"users": 2000, "eps": [0.5, 1.0], "seeds": [0, 1]})
    assert sweep.name == "quick+users2000+eps0.5-1+seeds0-1" and path.name == "quick.toml"
    assert sweeps.load("quick", {"users": 2000}, name="mine")[0].name == "mine"
    assert sweeps.load("quick")[0].name == "quick"


def test_a_runs_bar_leaves_its_first_round_out_of_the_rate_and_eta():
    """A first round that pays a run's start (actors importing, compiled code loading) would make the first lines'
    ETA hours long: the rate counts from the end of the first round, and shows nothing before it."""
    import io
    import time

    from ldpfed.util.progress import Progress

    bar = Progress(10_000, "t", stream=io.StringIO())
    bar(0, 0.0)
    time.sleep(1.0)                          # a slow first round
    bar(100, 1.0)
    assert "<?, ?users/s" in bar.bar.format_meter(**bar.bar.format_dict)   # no rate, no ETA (not the average)
    for k in (2, 3, 4):                      # then fast ones
        time.sleep(0.01)
        bar(100 * k, 1.0)
    whole = 400 / 1.0                        # at most: 400 users in over a second since the start
    assert bar.bar.format_dict["rate"] > 3 * whole
    bar.close()
