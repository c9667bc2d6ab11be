"""`ldpfed.sweep(...)`: keyword arguments in, the results table as a DataFrame out; bad input refused before any
work; a parallel sweep as Ray tasks on a local Ray (the session's, 2 CPUs) equals the same sweep in one process, run
for run and bit for bit; Ctrl-C during a parallel sweep keeps the finished runs and `resume` completes it to the
same results."""
import json
import os
import subprocess
import sys

import pandas as pd
import pytest

import ldpfed
from ldpfed import sweep_runner
from ldpfed.util.errors import ConfigError

SWEEP = dict(algorithms=["ldp-sgd", "ols", "uniform"], eps=[1.0], seeds=range(3), users=400, round_size=20,
             engine="local", tracking=False, progress=False, verbose=False)
# What a run's bits decide; the rest of a row says where and how fast it ran.
SAME = ["key", "algorithm", "env", "eps", "seed", "status", "users", "final_regret", "final_estimation_error"]


def _tables_equal(a, b):
    """The two sweeps' rows, run for run, and every run's per-round table, bit for bit."""
    left, right = a.table.set_index("key"), b.table.set_index("key")
    assert sorted(left.index) == sorted(right.index)
    columns = [c for c in SAME if c != "key" and c in left.columns]
    pd.testing.assert_frame_equal(left.loc[sorted(left.index), columns], right.loc[sorted(left.index), columns],
                                  check_exact=True)
    for key in left.index:
        pd.testing.assert_frame_equal(pd.read_parquet(a.folder / "runs" / key / "table.parquet"),
                                      pd.read_parquet(b.folder / "runs" / key / "table.parquet"), check_exact=True)


def test_keyword_arguments_give_the_results_table(tmp_path):
    result = ldpfed.sweep(name="api", out=tmp_path, **SWEEP)
    assert isinstance(result, ldpfed.SweepResult) and result.ok and result.parent_run_id is None
    table = result.table
    # ldp-sgd: one eps x 3 seeds; ols and uniform, not private: once per seed
    assert table.groupby("algorithm").size().to_dict() == {"ldp-sgd": 3, "ols": 3, "uniform": 3}
    assert (table["status"] == "FINISHED").all() and set(table["seed"]) == {0, 1, 2}
    assert {"key", "final_regret", "regret_vs_uniform", "node"} <= set(table.columns)
    assert table["final_regret"].gt(0).all()
    # the same table as the local store's, in the sweep's folder
    assert result.folder == tmp_path / "api"
    stored = pd.read_parquet(result.folder / "summary" / "summary.parquet")
    assert stored["key"].tolist() == table["key"].tolist()
    assert stored["final_regret"].tolist() == table["final_regret"].tolist()
    grouped = result.grouped()
    assert grouped.set_index("algorithm").loc["uniform", "regret_vs_uniform"] == 1.0
    assert result.runs_per_node().sum() == 9


@pytest.mark.parametrize("options, error, message", [
    ({"eps": [-1]}, ConfigError, "eps"),
    ({"seeds": "3-1"}, ConfigError, "empty range"),
    ({"algorithms": ["nope"]}, ConfigError, "nope"),
    ({"engine": "spark"}, ConfigError, "engine"),
    ({"workers": 0}, ConfigError, "workers"),
    ({"users": 0}, ConfigError, "users"),
    ({"checkpoint_every_s": -1}, ValueError, "checkpoint_every_s"),
    ({"algorithms": ["ldp-sgd"], "envs": ["bernoulli"]}, ConfigError, "ldp-sgd.*runs on none of the listed envs"),
    ({"resume": "nowhere"}, ValueError, "not the folder of a sweep"),
    ({"engine": "ray", "placement": "strict"}, ConfigError, "ray.placement"),      # the Ray engine's own checks
    ({"engine": "ray", "shards": 0}, ConfigError, "ray.shards"),
    ({"address": "http://127.0.0.1:8265"}, ConfigError, "address=.*HTTP address.*GCS address"),  # a dashboard's
    ({"address": " "}, ConfigError, "address"),
])
def test_bad_input_raises_one_line_before_any_work(tmp_path, monkeypatch, options, error, message):
    monkeypatch.setattr(sweep_runner, "run", lambda *a, **k: pytest.fail("a run started"))
    with pytest.raises(error, match=message) as raised:
        ldpfed.sweep(**{**SWEEP, "out": tmp_path / "out", **options})
    assert "\n" not in str(raised.value)
    assert not (tmp_path / "out").exists()           # no folder, no MLflow run, no Ray


@pytest.mark.parametrize("options, field, message", [
    ({"env_params": {"linear": {"foo": 1}}}, "env_params.linear.foo", "unknown option of env linear"),
    ({"env_params": {"linear": {"noise_sdt": 0.1}}}, "env_params.linear.noise_sdt", "did you mean 'noise_std'"),
    ({"env_params": {"linear": {"noise_std": float("nan")}}}, "env_params.linear.noise_std", "finite number"),
    ({"env_params": {"linear": {"d": float("inf")}}}, "env_params.linear.d", "integer"),
    ({"env_params": {"linear": {"d": "inf"}}}, "env_params.linear.d", "integer"),
    # a table of an env no listed algorithm runs on is checked too
    ({"env_params": {"bernoulli": {"K": 1}}}, "env_params.bernoulli.K", "integer in \\[2, inf\\)"),
    ({"algorithms": ["ldp-sgd", "ucb"], "envs": ["linear"]}, "algorithms", "ucb.*runs on none of the listed envs"),
])
def test_bad_env_options_and_envs_in_a_sweep_spec_are_one_line_before_any_run(tmp_path, monkeypatch, options, field,
                                                                               message):
    """Every run would fail on them: the sweep refuses them before any run, naming the table and the option."""
    monkeypatch.setattr(sweep_runner, "run", lambda *a, **k: pytest.fail("a run started"))
    with pytest.raises(ConfigError, match=message) as raised:
        ldpfed.sweep(**{**SWEEP, "out": tmp_path / "out", **options})
    assert raised.value.field.endswith(field) and "\n" not in str(raised.value)
    assert not (tmp_path / "out").exists()


def test_a_ray_address_in_the_environment_is_checked_when_the_sweep_needs_ray(tmp_path, monkeypatch):
    """RAY_ADDRESS set to a dashboard's HTTP address (the env.sh of cluster/local_cluster.py sets one for `ray job
    submit`), which ray.init rejects with a traceback: refused in one line before any work when the sweep would
    start or join Ray; a sweep in this process without Ray does not read it. The engines' own entry to Ray
    (ensure_ray) refuses it the same way."""
    monkeypatch.setenv("RAY_ADDRESS", "http://127.0.0.1:8265")
    monkeypatch.setattr(sweep_runner, "run", lambda *a, **k: pytest.fail("a run started"))
    for keys, workers in (({**SWEEP_KEYS, "engine": "ray"}, None), (SWEEP_KEYS, 2)):
        with pytest.raises(ConfigError, match="RAY_ADDRESS=.*HTTP address") as raised:
            sweep_runner.prepare(keys, workers=workers, tracking=False, out=tmp_path / "out")
        assert "\n" not in str(raised.value)
    sweep_runner.prepare(SWEEP_KEYS, tracking=False, out=tmp_path / "out")      # in this process: no Ray
    assert not (tmp_path / "out").exists()
    # a single run on the Ray engine meets the same check where it joins Ray: one line, exit status 2
    done = subprocess.run([sys.executable, "-m", "ldpfed", "run", "ols", "--users", "100", "--round-size", "10",
                           "--engine", "ray"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "RAY_ADDRESS": "http://127.0.0.1:8265"})
    assert done.returncode == 2, done.stderr[-2000:]
    assert "RAY_ADDRESS: 'http://127.0.0.1:8265': an HTTP address" in done.stderr
    assert "Traceback" not in done.stderr


SWEEP_KEYS = {"algorithms": ["ols"], "users": 100, "round_size": 10, "engine": "local"}


def test_a_preset_or_a_file_with_keyword_overrides(tmp_path):
    with pytest.raises(ConfigError, match="not a preset"):
        ldpfed.sweep("no-such-preset", out=tmp_path)
    plan = sweep_runner.prepare("quick", overrides={"users": 500, "algorithms": "ols"}, tracking=False, out=tmp_path)
    assert plan.sweep.name == "quick+users500+algorithmsols"         # the preset's, and what overrides it
    assert plan.sweep.users == 500 and plan.sweep.algorithms == ("ols",)
    assert plan.source == "quick.toml" and {c.algorithm for c in plan.configs} == {"ols"}
    plan = sweep_runner.prepare({"engine": "ray", "algorithms": "ols", "ray": {"placement": "pack"}},
                                ray={"placement": "none", "actors": None}, tracking=False, out=tmp_path)
    assert plan.sweep.ray == {"placement": "none"}                   # the keyword over the [ray] table
    with pytest.raises(ConfigError, match="known: actors, shards, mode, placement"):
        sweep_runner.prepare({"ray": {"spares": 1}}, tracking=False, out=tmp_path)


def test_a_round_size_per_env_sets_every_run_on_that_env_and_the_command_line_round_size_sets_all(tmp_path):
    """[env_round_size]: every run on a listed env (uniform play's too) at its size, the others at round_size; the
    report's section says the size; `--round-size` (round_size among the overrides) means every run; the table
    survives the sweep.toml written with the results; a bad entry is refused naming it."""
    from ldpfed.sweep_spec import build, to_toml
    from ldpfed.tracking.report import markdown_table
    import tomllib

    plan = sweep_runner.prepare("quick", tracking=False, out=tmp_path)
    sizes = {(c.env, c.round_size) for c in plan.configs}
    assert ("piecewise-bernoulli", 10) in sizes and ("linear", 500) in sizes
    assert {b for env, b in sizes if env == "piecewise-bernoulli"} == {10}
    assert build(tomllib.loads(to_toml(plan.sweep))) == plan.sweep
    plan = sweep_runner.prepare("quick", overrides={"round_size": 100}, tracking=False, out=tmp_path)
    assert {c.round_size for c in plan.configs} == {100} and plan.sweep.env_round_size == {}
    result = ldpfed.sweep(name="per-env", out=tmp_path, **{**SWEEP, "env_round_size": {"linear": 40}})
    assert set(result.table["round_size"]) == {40}
    assert "### linear (T = 400 users, rounds of 40)" in markdown_table(result.table)
    for table, message in (({"nowhere": 3}, "env_round_size.nowhere"), ({"linear": 0}, "env_round_size.linear")):
        with pytest.raises(ConfigError, match=message):
            sweep_runner.prepare({"env_round_size": table}, tracking=False, out=tmp_path)


def test_the_runs_go_one_algorithm_after_another_in_turn_so_the_first_to_finish_sample_them_all():
    """The order runs go in (the progress bar's ETA is the finished runs' average): one run of each algorithm in
    turn, each algorithm's runs in the sweep's order; every run exactly once."""
    from ldpfed.sweep_runner import in_turn

    plan = sweep_runner.prepare("quick", tracking=False, out="unused")
    order = in_turn(plan.configs)
    assert sorted(map(repr, order)) == sorted(map(repr, plan.configs))
    algorithms = sorted({c.algorithm for c in plan.configs})
    assert sorted(c.algorithm for c in order[:len(algorithms)]) == algorithms
    for name in algorithms:
        assert [c for c in order if c.algorithm == name] == [c for c in plan.configs if c.algorithm == name]
    assert [c.algorithm for c in in_turn([_C("a"), _C("a"), _C("a"), _C("b"), _C("c"), _C("c")])] == \
        ["a", "b", "c", "a", "c", "a"]
    assert in_turn([]) == []


class _C:
    def __init__(self, algorithm):
        self.algorithm = algorithm


def test_ray_tasks_give_the_same_sweep_as_one_process(ray_session, tmp_path):
    """Two runs at once as Ray tasks on the session's local Ray (2 CPUs): run for run, the in-process sweep."""
    alone = ldpfed.sweep(name="alone", out=tmp_path, workers=1, **SWEEP)
    tasks = ldpfed.sweep(name="tasks", out=tmp_path, workers=2, **SWEEP)
    assert alone.ok and tasks.ok
    _tables_equal(alone, tasks)
    # where each ran: the in-process runs on this machine, the tasks on a Ray node (the session's one)
    assert "node_id" not in alone.table or alone.table["node_id"].isna().all()
    assert tasks.table["node_id"].notna().all() and tasks.table["node_id"].nunique() == 1
    assert tasks.runs_per_node().sum() == 9


RAY_SWEEP = {**SWEEP, "algorithms": ["ldp-sgd", "ols"], "seeds": range(2), "engine": "ray", "populations": 2, "actors": 2,
             "shards": 1, "actor_cpus": 0.25, "shard_cpus": 0.5}     # 1 CPU a run: two fit on the session's 2


def test_ray_engine_runs_at_once_give_the_same_sweep_as_one_after_another(ray_session, tmp_path):
    """Ray-engine runs two at once, each a Ray task driving actors of its own in its own placement group: run for
    run, the sweep of one run after another from this process (whose actors the next run reuses)."""
    two_runs = {**RAY_SWEEP, "seeds": range(1)}      # each task starts its run's own actors: 3 processes a run
    alone = ldpfed.sweep(name="alone", out=tmp_path, **two_runs)
    at_once = ldpfed.sweep(name="at-once", out=tmp_path, workers="auto", **two_runs)
    assert alone.ok and at_once.ok and len(at_once.table) == 2
    _tables_equal(alone, at_once)
    assert at_once.table["node_id"].notna().all()        # ran as tasks
    with pytest.raises(ConfigError, match="actor_cpus and shard_cpus"):     # before any run: a run would take
        ldpfed.sweep(name="unset", out=tmp_path, workers=2, **{**RAY_SWEEP, "actor_cpus": None})   # every CPU
    assert not (tmp_path / "unset").exists()


class _CtrlCAfter(sweep_runner._Quiet):
    """A sweep bar that stands for Ctrl-C once `runs` runs have finished."""

    def __init__(self, runs: int):
        self.left = runs

    def finished(self, name, failed=False, algorithm=None):
        self.left -= 1
        if self.left == 0:
            raise KeyboardInterrupt


def test_ctrl_c_during_ray_tasks_keeps_finished_runs_and_resume_completes(ray_session, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sweep_runner, "SweepProgress", lambda *a, **k: _CtrlCAfter(2))
    options = {**SWEEP, "progress": True, "verbose": True, "out": tmp_path, "workers": "auto"}   # 2 CPUs
    with pytest.raises(KeyboardInterrupt):
        ldpfed.sweep(name="stopped", **options)
    folder = tmp_path / "stopped"
    err = capsys.readouterr().err
    assert f"ldpfed.sweep(resume='{folder.resolve()}')" in err
    index = json.loads((folder / "sweep.json").read_text())
    kept = pd.read_parquet(folder / "summary" / "summary.parquet")
    assert index["status"] == "KILLED" and 2 <= len(kept) < 9 and (kept["status"] == "FINISHED").all()
    monkeypatch.setattr(sweep_runner, "SweepProgress", lambda *a, **k: sweep_runner._Quiet())
    resumed = ldpfed.sweep(resume=folder, **{**SWEEP, "workers": 2})
    assert resumed.ok and len(resumed.table) == 9
    whole = ldpfed.sweep(name="whole", out=tmp_path, **SWEEP)
    _tables_equal(whole, resumed)


def test_a_run_task_cancelled_inside_an_import_ends_its_worker_process(monkeypatch, tmp_path):
    """Ray cancels a running task by raising KeyboardInterrupt in it, wherever it is. Inside numba's first set-up
    (an import) that left the process unable to compile ("duplicate registration for ... UnicodeType" in every
    later run of a resumed sweep on the same Ray); inside numba's compiler it can too. A run task cancelled inside
    an import or the compiler therefore ends its process (SystemExit 0, which Ray reports to the driver as a
    cancelled task); cancelled elsewhere, it stays."""
    module = tmp_path / "interrupted_while_imported.py"
    module.write_text("raise KeyboardInterrupt\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def importing(*args, **kwargs):
        import interrupted_while_imported  # noqa: F401

    def between_rounds(*args, **kwargs):
        raise KeyboardInterrupt

    # inside numba's compiler (its file): a compile interrupted there left numba unable to compile the next function
    # ("generator raised StopIteration"), reproduced by interrupting a first run's compile in one process
    compiler = tmp_path / "site-packages" / "numba" / "core" / "utils.py"
    compiler.parent.mkdir(parents=True)
    space = {}
    exec(compile("def compiling(*args, **kwargs):\n    raise KeyboardInterrupt\n", str(compiler), "exec"), space)

    config = ldpfed.RunConfig("ldp-sgd", users=100, round_size=10)
    for cancelled_in in (importing, space["compiling"]):
        monkeypatch.setattr(sweep_runner, "run", cancelled_in)
        with pytest.raises(SystemExit) as ended:
            sweep_runner._run_task(config, str(tmp_path), driver_ip="192.0.2.1", every_s=60.0)
        assert ended.value.code == 0
    monkeypatch.setattr(sweep_runner, "run", between_rounds)
    with pytest.raises(KeyboardInterrupt):
        sweep_runner._run_task(config, str(tmp_path), driver_ip="192.0.2.1", every_s=60.0)


@pytest.mark.slow
def test_ctrl_c_during_ray_engine_runs_at_once_keeps_finished_runs_and_resume_completes(ray_session, tmp_path,
                                                                                         monkeypatch):
    """Ray-engine runs two at once, stopped after two have finished: the tasks still out are cancelled (their runs'
    actors ended with them), the finished runs kept; the resumed sweep equals the one run one at a time."""
    monkeypatch.setattr(sweep_runner, "SweepProgress", lambda *a, **k: _CtrlCAfter(2))
    with pytest.raises(KeyboardInterrupt):
        ldpfed.sweep(name="stopped", out=tmp_path, workers=2, **{**RAY_SWEEP, "progress": True})
    folder = tmp_path / "stopped"
    kept = pd.read_parquet(folder / "summary" / "summary.parquet")
    assert json.loads((folder / "sweep.json").read_text())["status"] == "KILLED"
    assert 2 <= len(kept) < 4 and (kept["status"] == "FINISHED").all()
    resumed = ldpfed.sweep(resume=folder, workers=2, **RAY_SWEEP)
    assert resumed.ok and len(resumed.table) == 4
    _tables_equal(ldpfed.sweep(name="alone", out=tmp_path, **RAY_SWEEP), resumed)


def test_sigterm_during_ray_tasks_stops_as_a_termination(ray_session, tmp_path, monkeypatch, capsys):
    """SIGTERM while the driver waits in ray.wait (which Ray turns into a bare KeyboardInterrupt) still ends the
    sweep as terminated: exit status 143 on the command line, the resume line printed."""
    import os
    import signal
    import threading
    import time

    import ray

    from ldpfed.util.signals import Terminated

    real_wait, calls = ray.wait, []
    def sleep(seconds):
        time.sleep(seconds)

    slow = ray.remote(num_cpus=0)(sleep)

    def wait(refs, num_returns=1, timeout=None, **options):
        calls.append(len(refs))
        if len(calls) == 3:      # the signal comes while the driver is inside Ray's wait (for a 5 s sleep)
            threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
            real_wait([slow.remote(5)], timeout=4)
            pytest.fail("the signal did not stop the wait")
        return real_wait(refs, num_returns=num_returns, timeout=timeout, **options)

    monkeypatch.setattr(ray, "wait", wait)
    with pytest.raises(Terminated):
        ldpfed.sweep(name="termed", **{**SWEEP, "verbose": True, "out": tmp_path, "workers": "auto"})
    err = capsys.readouterr().err
    assert "terminated (SIGTERM)" in err and "ldpfed.sweep(resume=" in err
    assert json.loads((tmp_path / "termed" / "sweep.json").read_text())["status"] == "KILLED"
