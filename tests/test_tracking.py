"""ldpfed.tracking against a real `mlflow server` on loopback, the embedded SQLite default, and failures.

The server test starts `mlflow server` on 127.0.0.1 (a free port, SQLite backend and proxied artifacts in a tmp
folder), logs a small sweep, and reads everything back through the MLflow client.
"""
from __future__ import annotations

import http.server
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import matplotlib.image
import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient  # a required dependency: a failed import must fail these tests, not skip them

from ldpfed.algorithms import REGISTRY
from ldpfed.config import RunConfig
from ldpfed.engine.local import run_local
from ldpfed.tracking import BOOKKEEPING_POINTS, MAX_POINTS, Tracker, TrackingUnavailable, local_server, metric_curves, run_params
from ldpfed.util.waits import WaitFailed, wait_until


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
EPS = (0.5, 2.0)
SEEDS = (0, 1)


@pytest.fixture(autouse=True)
def _no_ambient_tracking(monkeypatch):
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT",
                 "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"):
        monkeypatch.delenv(name, raising=False)


def sweep_algorithms() -> list[str]:
    """uniform, plus the first registered LDP and central-DP algorithms (whichever exist), for a small sweep."""
    names = ["uniform"]
    for model in ("ldp", "central"):
        found = sorted(n for n, cls in REGISTRY.items() if cls.privacy_model == model)
        if found:
            names.append(found[0])
    return names


def small_results(algorithms, users=400, round_size=10):
    """Private algorithms once per (eps, seed), non-private ones once per seed (as a sweep runs them)."""
    return [run_local(RunConfig(name, users=users, round_size=round_size, eps=eps, seed=seed))
            for name in algorithms
            for eps in (EPS if REGISTRY[name].privacy_model != "none" else EPS[:1]) for seed in SEEDS]


def assert_png(path: Path):
    data = Path(path).read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    image = matplotlib.image.imread(str(path))
    assert image.ndim == 3 and image.shape[0] >= 200 and image.shape[1] >= 300, image.shape


# ---------------------------------------------------------------------------------------- real server
@pytest.fixture(scope="module", autouse=True)
def _server_process(tmp_path_factory):
    """Start `mlflow server` when the module starts, so its start-up overlaps the tests that need no server."""
    root = tmp_path_factory.mktemp("mlflow_server")
    port = local_server.free_port()
    proc = local_server.spawn(root, port)
    try:
        yield {"proc": proc, "port": port, "uri": f"http://127.0.0.1:{port}", "root": root,
               "artifacts": root / "artifacts"}
    finally:
        stop_group(proc)


@pytest.fixture(scope="module")
def mlflow_server(_server_process):
    """The real `mlflow server` on 127.0.0.1, once it answers /health."""
    try:
        # bounds only a hang (ldpfed.util.waits.HANG_S): a loaded machine's start takes minutes
        local_server.wait_healthy(_server_process["proc"], _server_process["root"], _server_process["port"])
    except RuntimeError as error:
        pytest.fail(str(error))
    return _server_process


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the server's own process group (uvicorn workers included), SIGKILL what is left after 2 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        proc.poll()
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=5)


def test_a_wait_for_a_start_names_what_it_waited_for_and_how_long(tmp_path):
    """A server whose process exits is given up at once, its log in the message; a wait that reaches its bound (a
    hang) names what it waited for and the seconds waited; a process that got there and then exited, between two
    looks, got there."""
    (tmp_path / "server.log").write_text("address already in use\n")
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    port = local_server.free_port()
    with pytest.raises(WaitFailed, match=rf"(?s)^waited \d+ s for mlflow server on 127.0.0.1:{port} to answer "
                                         r"/health: its process exited \(3\):\naddress already in use"):
        local_server.wait_healthy(proc, tmp_path, port)
    with pytest.raises(WaitFailed, match=r"^waited 0 s for nothing to come \(the bound: 0.2 s\)$"):
        wait_until(lambda: False, "nothing to come", 0.2, every=0.05)
    looks = iter([False, True])
    assert wait_until(lambda: next(looks), "a file", 0.2, exited=lambda: 0) < 0.2


# ---------------------------------------------------------------------------------------- failures
def test_unreachable_server_fails_fast_and_local_results_survive(tmp_path, _server_process):
    uri = _server_process["uri"]
    while uri == _server_process["uri"]:              # a closed loopback port (not the one the server is taking)
        uri = f"http://127.0.0.1:{local_server.free_port()}"
    started = time.monotonic()
    with pytest.raises(TrackingUnavailable) as caught:
        Tracker("ldpfed-test", tracking_uri=uri, out_dir=tmp_path / "never")
    assert time.monotonic() - started < 10, "must fail fast, not after MLflow's minutes of retries"
    assert uri in str(caught.value) and caught.value.uri == uri and "connection refused" in str(caught.value)
    assert not (tmp_path / "never").exists()

    # the job's pattern: tracking fails before any simulation; results are still written locally
    results = small_results(["uniform", "ldp-sgd"], users=200)
    try:
        tracker = Tracker("ldpfed-test", tracking_uri=uri, out_dir=tmp_path / "out")
    except TrackingUnavailable:
        tracker = Tracker("ldpfed-test", out_dir=tmp_path / "out", enabled=False)
    with tracker.sweep("quick") as sweep:
        for result in results:
            sweep.log_result(result)
    check_local(tmp_path / "out" / "quick", results)

    # or in one step: fallback_local warns and keeps local results only
    with pytest.warns(RuntimeWarning, match="127.0.0.1"):
        tracker = Tracker("ldpfed-test", tracking_uri=uri, out_dir=tmp_path / "fallback", fallback_local=True)
    assert not tracker.enabled
    with tracker.sweep("quick") as sweep:
        for result in results:
            sweep.log_result(result)
    check_local(tmp_path / "fallback" / "quick", results)

    # the plots can be redrawn from the local folder alone
    from ldpfed.tracking.plots import replot

    for png in (tmp_path / "fallback" / "quick" / "plots").glob("*.png"):
        png.unlink()
    assert {p.name for p in replot(tmp_path / "fallback" / "quick")} >= {"regret_curves.png",
                                                                         "final_regret_vs_eps.png"}
    assert_png(tmp_path / "fallback" / "quick" / "plots" / "regret_curves.png")


def test_credentials_in_the_tracking_uri_are_never_written_or_shown(tmp_path, _server_process):
    from ldpfed.tracking.store import redact, scrub

    assert redact("http://alice:s3cret@host:5000") == "http://alice:***@host:5000"
    assert redact("https://tok3n@host/mlflow") == "https://***@host/mlflow"
    assert redact("postgresql://u:pw@db/m?sslmode=require&password=pw2") == \
        "postgresql://u:***@db/m?sslmode=require&password=***"
    assert redact("sqlite:////tmp/a b/mlflow.db") == "sqlite:////tmp/a b/mlflow.db"
    assert scrub("failed: GET http://alice:s3cret@h:1/api?token=t0k&x=1") == \
        "failed: GET http://alice:***@h:1/api?token=***&x=1"
    port = local_server.free_port()
    while f"http://127.0.0.1:{port}" == _server_process["uri"]:
        port = local_server.free_port()
    secret_uri = f"http://alice:s3cret@127.0.0.1:{port}"
    with pytest.raises(TrackingUnavailable) as caught:
        Tracker("x", tracking_uri=secret_uri, out_dir=tmp_path)
    assert "s3cret" not in str(caught.value) and "alice:***@127.0.0.1" in str(caught.value)
    with pytest.warns(RuntimeWarning) as warned:
        tracker = Tracker("x", tracking_uri=secret_uri, out_dir=tmp_path, fallback_local=True)
    assert not any("s3cret" in str(w.message) for w in warned)
    assert "s3cret" not in repr(tracker)
    with tracker.sweep("s") as sweep:
        sweep.log_result(small_results(["uniform"], users=50)[0])
    written = [p.read_bytes() for p in sweep.local_dir.rglob("*") if p.is_file()]
    assert written and not any(b"s3cret" in data for data in written)


def check_local(folder: Path, results):
    summary = pd.read_parquet(folder / "summary" / "summary.parquet")
    assert len(summary) == len(results)
    for result, (_, row) in zip(results, summary.iterrows()):
        pd.testing.assert_frame_equal(pd.read_parquet(folder / row["local_dir"] / "table.parquet"), result.table)
        assert json.loads((folder / row["local_dir"] / "summary.json").read_text())["seed"] == result.config.seed
    assert_png(folder / "plots" / "regret_curves.png")


def test_server_that_never_answers_times_out_fast(tmp_path):
    with socket.socket() as silent:                  # accepts connections (backlog) but never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        uri = f"http://127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(TrackingUnavailable, match="no answer within 1 s"):
            Tracker("ldpfed-test", tracking_uri=uri, out_dir=tmp_path, probe_timeout=1.0)
        assert time.monotonic() - started < 5


class _Refuse(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        self.send_response(401)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_refused_credentials_are_reported(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refuse)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        uri = f"http://127.0.0.1:{server.server_address[1]}"
        with pytest.raises(TrackingUnavailable, match="credentials"):
            Tracker("ldpfed-test", tracking_uri=uri, out_dir=tmp_path)
    finally:
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------------------------------- embedded default
def test_embedded_default_needs_no_server(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tracker = Tracker("ldpfed-embedded", out_dir="results/emb")
    assert tracker.tracking_uri == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    assert (tmp_path / "mlflow.db").is_file()
    long_run = run_local(RunConfig("uniform", users=5000, round_size=1))      # 5,000 rounds: down-sampled
    with tracker.sweep("long", params={"users": 5000}) as sweep:
        row = sweep.log_result(long_run)
    client = MlflowClient(tracking_uri=tracker.tracking_uri)
    history = client.get_metric_history(row["run_id"], "cumulative_regret")
    assert len(history) == MAX_POINTS
    steps = [m.step for m in history]
    assert steps[0] == 1 and steps[-1] == 5000 and steps == sorted(set(steps))
    np.testing.assert_allclose([m.value for m in history],
                               long_run.table.set_index("users").loc[steps, "cumulative_regret"])
    run = client.get_run(row["run_id"])
    assert run.data.tags["mlflow.parentRunId"] == sweep.parent_run_id
    assert Path(run.info.artifact_uri.removeprefix("file://")).resolve().is_relative_to(tmp_path.resolve() / "mlruns")
    assert (Path(run.info.artifact_uri.removeprefix("file://")) / "table.parquet").is_file()
    assert_png(tmp_path / "results" / "emb" / "long" / "plots" / "regret_curves.png")
    # a second sweep of the same name leaves the first one's folder where it is and takes the next free name
    with tracker.sweep("long") as again:
        again.log_result(run_local(RunConfig("uniform", users=100, round_size=10)))
    assert again.local_dir.resolve() == tmp_path.resolve() / "results" / "emb" / "long-2"
    first = pd.read_parquet(tmp_path / "results" / "emb" / "long" / "summary" / "summary.parquet")
    assert first["users"].tolist() == [5000]
    # the UI command and the link a job prints
    # this interpreter's mlflow, so the command runs as printed without activating the environment
    mlflow = str(Path(sys.executable).with_name("mlflow"))
    assert tracker.ui_command() == (f"{mlflow} ui --backend-store-uri {tracker.tracking_uri} --host 127.0.0.1 "
                                    "--port 5000 --workers 1")
    assert tracker.runs_url("abc") == (f"http://127.0.0.1:5000/#/experiments/{tracker.experiment_id}/runs?"
                                       "workflowType=machine_learning&searchFilter=tags.%60ldpfed.sweep_id%60"
                                       "%20%3D%20%27abc%27%20and%20tags.%60ldpfed.kind%60%20%3D%20%27run%27"
                                       "&orderByKey=metrics.%60regret_vs_uniform%60&orderByAsc=true")
    # the filter of the link finds exactly the sweep's child runs
    children = client.search_runs([tracker.experiment_id], f"tags.`ldpfed.sweep_id` = '{sweep.parent_run_id}' "
                                  "and tags.`ldpfed.kind` = 'run'")
    assert [r.info.run_id for r in children] == [row["run_id"]]


def test_metric_curves_are_down_sampled_with_ends_kept():
    name = next((n for n, cls in REGISTRY.items() if cls.privacy_model == "ldp"), "uniform")
    result = run_local(RunConfig(name, env=REGISTRY[name].default_env, users=4500, round_size=1))
    curves = metric_curves(result)
    assert "cumulative_regret" in curves
    for key, (steps, values) in curves.items():
        assert len(steps) == len(values) <= MAX_POINTS, key
        assert np.all(np.diff(steps) > 0), key
    steps, values = curves["cumulative_regret"]
    assert len(steps) == MAX_POINTS and steps[0] == 1 and steps[-1] == 4500
    assert values[-1] == pytest.approx(result.summary["final_regret"])
    # a counter's curve is its shape: BOOKKEEPING_POINTS points, the ends kept, the last its total
    counters = {key: curve for key, curve in curves.items() if key.startswith("total_")}
    for key, (steps, values) in counters.items():
        column = key[len("total_"):]
        assert len(steps) == BOOKKEEPING_POINTS and steps[0] == 1 and steps[-1] == 4500, key
        assert values[-1] == result.table[column].sum(), key
    assert counters or name == "uniform"


def test_a_run_folder_has_its_regret_curve_as_an_svg(tmp_path):
    from xml.etree import ElementTree

    from ldpfed.tracking import write_run

    result = run_local(RunConfig("uniform", users=3000, round_size=10))        # 300 rounds
    write_run(tmp_path, result)
    svg = "{http://www.w3.org/2000/svg}"
    root = ElementTree.parse(tmp_path / "regret.svg").getroot()
    assert root.tag == f"{svg}svg"
    title = root.find(f"{svg}text").text
    assert title.startswith("uniform non-private regret=") and f"{result.summary['final_regret']:.1f}" in title
    points = [tuple(map(float, point.split(","))) for point in root.find(f"{svg}polyline").get("points").split()]
    assert len(points) == 200                                                  # down-sampled, the ends kept
    xs, ys = zip(*points)
    assert list(xs) == sorted(xs) and ys[-1] < ys[0]         # regret grows: the line rises (SVG's y points down)
    # every point inside the plot area
    width, height = float(root.get("width")), float(root.get("height"))
    assert all(0 < x < width and 0 < y < height for x, y in points)


def test_the_embedded_store_writes_through_the_write_ahead_log_and_no_other_file_does(tmp_path):
    import sqlite3

    from sqlalchemy import create_engine, text

    def journal(path):
        with sqlite3.connect(path) as connection:
            return connection.execute("PRAGMA journal_mode").fetchone()[0]

    Tracker("wal", tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", out_dir=tmp_path / "out")
    assert journal(tmp_path / "mlflow.db") == "wal"
    other = create_engine(f"sqlite:///{tmp_path / 'other.db'}")      # any other SQLite file keeps its journal
    with other.connect() as connection:
        connection.execute(text("create table t (x integer)"))
        assert connection.execute(text("PRAGMA synchronous")).scalar() == 2        # FULL, SQLite's default
    assert journal(tmp_path / "other.db") == "delete"


def test_tracker_is_driver_only(tmp_path):
    tracker = Tracker("x", out_dir=tmp_path, enabled=False)
    with pytest.raises(TypeError, match="driver-only"):
        pickle.dumps(tracker)


def test_bad_tracker_arguments_are_named(tmp_path):
    with pytest.raises(ValueError, match="experiment"):
        Tracker("", enabled=False)
    with pytest.raises(ValueError, match="max_points"):
        Tracker("x", enabled=False, max_points=5000)
    with pytest.raises(TrackingUnavailable, match="does not exist"):
        Tracker("x", tracking_uri=f"sqlite:///{tmp_path}/missing/dir/mlflow.db")


# ---------------------------------------------------------------------------------------- with the server (last: its start-up overlaps the tests above)
def test_sweep_logged_to_a_real_server_reads_back(mlflow_server, tmp_path):
    algorithms = sweep_algorithms()
    results = small_results(algorithms)
    results += [run_local(RunConfig("uniform", env=REGISTRY[name].default_env, users=400, round_size=10, seed=seed))
                for name in algorithms[1:] for seed in SEEDS]            # the reference on every env
    out = tmp_path / "results"
    tracker = Tracker("ldpfed-test", tracking_uri=mlflow_server["uri"], out_dir=out)
    assert tracker.enabled and tracker.tracking_uri == mlflow_server["uri"]
    sweep_params = {"users": 400, "seeds": list(SEEDS), "grid": {"eps": list(EPS)}}
    with tracker.sweep("quick", params=sweep_params, tags={"job": "test"}) as sweep:
        rows = [sweep.log_result(result) for result in results]
        failed = sweep.log_failure(results[0].config.replace(seed=99), RuntimeError("diverged"))
    assert all(row["run_id"] for row in rows) and failed["run_id"] and not sweep.errors

    client = MlflowClient(tracking_uri=mlflow_server["uri"])
    experiment = client.get_experiment_by_name("ldpfed-test")
    assert experiment is not None and experiment.experiment_id == tracker.experiment_id

    # the parent run: params, tags, artifacts (plots, combined table)
    parent = client.get_run(sweep.parent_run_id)
    assert parent.info.status == "FINISHED" and parent.info.run_name == "quick"
    assert parent.data.params["users"] == "400" and parent.data.params["grid.eps"] == "[0.5, 2.0]"
    assert parent.data.tags["job"] == "test" and parent.data.tags["ldpfed.kind"] == "sweep"
    assert set(parent.data.tags["algorithms"].split(",")) == set(algorithms)
    assert parent.data.metrics["runs"] == len(results) + 1 and parent.data.metrics["failed_runs"] == 1
    # readable in the UI: the experiment opens in the "Model training" view, the parent run's description is
    # the results table grouped by env, the report (Markdown, HTML with the plots) is an artifact
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    note = parent.data.tags["mlflow.note.content"]
    assert "### linear (T = 400 users, rounds of 10)" in note and "| uniform | none | - | 2 |" in note
    assert parent.data.tags["ldpfed.sweep_id"] == sweep.parent_run_id
    report_files = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report/regret_table.md", "report/report.html"} <= report_files
    page = Path(client.download_artifacts(parent.info.run_id, "report/report.html", str(tmp_path / "dl"))).read_text()
    assert page.count("data:image/png;base64,") >= 2 and "<h2>linear (T = 400 users, rounds of 10)</h2>" in page
    learner = algorithms[1]      # the LDP one: a sortable aggregate per (env, algorithm, eps) on the parent
    env = REGISTRY[learner].default_env
    assert f"regret_vs_uniform/{env}/{learner}/eps_{EPS[0]:g}" in parent.data.metrics
    parent_files = {a.path for a in client.list_artifacts(parent.info.run_id, "plots")}
    assert {"plots/regret_curves.png", "plots/final_regret_vs_eps.png"} <= parent_files
    download = tmp_path / "download"
    for name in ("regret_curves.png", "final_regret_vs_eps.png"):
        assert_png(client.download_artifacts(parent.info.run_id, f"plots/{name}", str(download / "parent")))
    combined = pd.read_parquet(client.download_artifacts(parent.info.run_id, "summary/summary.parquet",
                                                         str(download / "parent")))
    assert len(combined) == len(results) + 1
    assert set(combined["run_id"]) == {r["run_id"] for r in rows} | {failed["run_id"]}
    assert combined.set_index("key").loc[failed["key"], "status"] == "FAILED"

    # the children: one per (algorithm, env, eps, seed)
    children = client.search_runs([experiment.experiment_id],
                                  f"tags.mlflow.parentRunId = '{sweep.parent_run_id}'", max_results=100)
    assert len(children) == len(results) + 1
    by_id = {run.info.run_id: run for run in children}
    failed_run = by_id.pop(failed["run_id"])
    assert failed_run.info.status == "FAILED" and failed_run.data.tags["error"] == "diverged"
    assert failed_run.data.params["seed"] == "99"
    children = list(by_id.values())
    assert len({(r.data.params["algorithm"], r.data.params["env"], r.data.params["eps"], r.data.params["seed"])
                for r in children}) == len(results)
    uniform_median = {env: np.median([r.summary["final_regret"] for r in results
                                      if r.config.algorithm == "uniform" and r.config.env == env])
                      for env in {r.config.env for r in results}}
    for result, row in zip(results, rows):
        run = by_id[row["run_id"]]
        config = result.config
        assert run.info.status == "FINISHED"
        params, tags = run.data.params, run.data.tags
        # the runs table shows what tells runs apart before the name is cut: algorithm, eps, regret, vs uniform
        eps_text = f"eps={config.eps:g}" if REGISTRY[config.algorithm].privacy_model != "none" else "non-private"
        head = f"{config.algorithm} {eps_text} regret={result.summary['final_regret']:.1f}"
        assert run.info.run_name.startswith(head), run.info.run_name
        vs_uniform = combined.set_index("key").loc[row["key"], "regret_vs_uniform"]
        assert np.isfinite(vs_uniform) == (f" vs-uniform={vs_uniform:.2f} " in run.info.run_name), run.info.run_name
        assert run.info.run_name.endswith(f"{config.env} seed={config.seed}")
        # params: the full validated config, the env as built, every algorithm option
        assert params["algorithm"] == config.algorithm and params["env"] == config.env
        private = REGISTRY[config.algorithm].privacy_model != "none"
        assert (float(params["eps"]) == config.eps if private else params["eps"] == "n/a")
        assert int(params["seed"]) == config.seed
        assert int(params["users"]) == config.users and int(params["round_size"]) == config.round_size
        assert int(params["rounds"]) == config.rounds
        assert params["world.d"] == str(result.env["d"]) and params["world.K"] == str(result.env["K"])
        assert params == run_params(result)
        assert {f"setting.{k}" for k in REGISTRY[config.algorithm].defaults} <= set(params)
        # MLflow's comparison views pre-select the first differing params in sorted order
        differing = sorted(k for k in params if len({c.data.params.get(k) for c in children}) > 1)
        assert differing[:4] == ["algorithm", "env", "eps", "seed"], differing
        # tags: privacy model, mechanisms from the ledger, engine, code version
        assert tags["privacy_model"] == REGISTRY[config.algorithm].privacy_model
        mechs = sorted({entry["mechanism"] for entry in result.ledger})
        assert tags["mechanisms"] == (",".join(mechs) if mechs else "none")
        assert tags["engine"] == "single-process" and tags["code_version"]
        assert tags["job"] == "test" and tags["ldpfed.sweep"] == "quick"
        assert tags["ldpfed.sweep_id"] == sweep.parent_run_id
        # metrics: step = users processed, at most 2,000 points, equal to the full table at those steps
        table = result.table.set_index("users")
        history = client.get_metric_history(run.info.run_id, "cumulative_regret")
        assert 0 < len(history) <= MAX_POINTS
        steps = [m.step for m in history]
        assert steps == sorted(steps) and steps[-1] == config.users
        np.testing.assert_allclose([m.value for m in history], table.loc[steps, "cumulative_regret"])
        assert run.data.metrics["final_regret"] == pytest.approx(result.summary["final_regret"])
        assert run.data.metrics["users_per_s"] == pytest.approx(result.summary["users_per_s"])
        assert run.data.metrics["regret_vs_uniform"] == pytest.approx(
            result.summary["final_regret"] / uniform_median[config.env])
        # scalars are logged once, not as a curve over users
        assert len(client.get_metric_history(run.info.run_id, "final_regret")) == 1
        # the accountant's composed per-user guarantee, for private runs only
        private = REGISTRY[config.algorithm].privacy_model != "none"
        assert ("privacy_eps_composed" in run.data.metrics) == private
        if private:
            assert run.data.metrics["privacy_eps_composed"] == pytest.approx(result.summary["privacy_eps_composed"])
            assert run.data.metrics["privacy_eps_composed"] <= config.eps * (1 + 1e-9)
        errors = result.table["estimation_error"].dropna()
        if len(errors):
            error_history = client.get_metric_history(run.info.run_id, "estimation_error")
            assert [m.step for m in error_history] == result.table.loc[errors.index, "users"].tolist()
        # artifacts: full table, ledger, config (downloaded for the first run of each algorithm)
        files = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"table.parquet", "ledger.json", "config.json", "summary.json", "regret.svg"} <= files
        if config.eps != EPS[0] or config.seed != SEEDS[0]:
            continue
        assert tracker.runs_url(sweep.parent_run_id).startswith(
            f"{mlflow_server['uri']}/#/experiments/{experiment.experiment_id}/runs?workflowType=machine_learning")
        where = download / row["key"]
        pd.testing.assert_frame_equal(pd.read_parquet(client.download_artifacts(run.info.run_id, "table.parquet",
                                                                                str(where))), result.table)
        ledger = json.loads(Path(client.download_artifacts(run.info.run_id, "ledger.json", str(where))).read_text())
        assert [e["mechanism"] for e in ledger] == [e["mechanism"] for e in result.ledger]
        saved = json.loads(Path(client.download_artifacts(run.info.run_id, "config.json", str(where))).read_text())
        assert saved["config"] == json.loads(json.dumps(config.to_dict()))
    # the artifacts went through the server's proxy into its artifacts destination
    assert list(mlflow_server["artifacts"].rglob("table.parquet"))
    assert list(mlflow_server["artifacts"].rglob("regret_curves.png"))
    # and everything is also local
    local = out / "quick"
    assert len(pd.read_parquet(local / "summary" / "summary.parquet")) == len(results) + 1
    for row in rows:
        assert (local / row["local_dir"] / "table.parquet").is_file()
    assert_png(local / "plots" / "regret_curves.png")


def test_mlflow_failure_mid_sweep_keeps_every_result_local(mlflow_server, tmp_path, monkeypatch):
    results = small_results(["ldp-sgd"], users=200)[:3]
    tracker = Tracker("ldpfed-test", tracking_uri=mlflow_server["uri"], out_dir=tmp_path / "out")
    with pytest.raises(TrackingUnavailable, match="incomplete"):
        with tracker.sweep("quick") as sweep:
            sweep.log_result(results[0])

            def broken(*args, **kwargs):
                raise ConnectionError("server went away")

            monkeypatch.setattr(tracker.client, "create_run", broken)
            with pytest.warns(RuntimeWarning, match="server went away"):
                sweep.log_result(results[1])
            sweep.log_result(results[2])
    check_local(tmp_path / "out" / "quick", results)
    index = json.loads((tmp_path / "out" / "quick" / "sweep.json").read_text())
    assert index["mlflow_errors"] and index["runs"][sweep.summary["key"][0]]
    parent = MlflowClient(tracking_uri=mlflow_server["uri"]).get_run(sweep.parent_run_id)
    assert parent.info.status == "FAILED" and parent.data.tags["ldpfed.incomplete"] == "true"


def test_ray_engine_summary_becomes_tags_and_metrics(tmp_path):
    """A RunResult as the Ray engine returns it (cluster figures, rates, nested layout) is tagged, measured and
    written locally, without Ray."""
    from ldpfed.engine.core import RunResult
    from ldpfed.tracking import run_tags
    from ldpfed.tracking.records import final_metrics

    base = run_local(RunConfig("uniform", users=300, round_size=10))
    table = base.table.assign(rejected_messages=np.arange(len(base.table)) % 2)
    summary = {**base.summary, "engine": "ray", "actors": 4, "shards": 2, "nodes": 2, "mode": "per-user",
               "messages": 300, "messages_per_s": 1234.5, "rejected_messages": 3, "fold_latency_p99_ms": None,
               "population_nodes": {0: "n1", 1: "n2"}, "shard_layout": [[0, 1], [2]]}
    result = RunResult(base.config, table, base.ledger, summary, base.env)
    tags = run_tags(result)
    assert tags["engine"] == "ray" and tags["engine.mode"] == "per-user"
    assert (tags["cluster.actors"], tags["cluster.shards"], tags["cluster.nodes"]) == ("4", "2", "2")
    summary["peak_rss_driver"] = 300 * 2 ** 20
    metrics = final_metrics(result)
    assert metrics["peak_rss_driver_mb"] == 300 and "peak_rss_driver" not in metrics
    assert metrics["messages_per_s"] == 1234.5 and metrics["rejected_messages"] == 3 and metrics["messages"] == 300
    assert "fold_latency_p99_ms" not in metrics and "actors" not in metrics and "eps" not in metrics
    summary.update(privacy_shuffle_amplified=True, privacy_secagg_below_target=np.bool_(False))     # yes/no: 1/0
    metrics = final_metrics(result)
    assert metrics["privacy_shuffle_amplified"] == 1.0 and metrics["privacy_secagg_below_target"] == 0.0
    steps, counts = metric_curves(result)["rejected_messages"]              # a running count, step = users
    assert steps[-1] == 300 and counts[-1] == table["rejected_messages"].sum()
    tracker = Tracker("x", out_dir=tmp_path, enabled=False)
    with tracker.sweep("ray") as sweep:
        row = sweep.log_result(result)
    saved = json.loads((sweep.local_dir / row["local_dir"] / "summary.json").read_text())
    assert saved["population_nodes"] == {"0": "n1", "1": "n2"} and saved["shard_layout"] == [[0, 1], [2]]
    combined = pd.read_parquet(sweep.local_dir / "summary" / "summary.parquet")
    assert combined.loc[0, "engine"] == "ray" and combined.loc[0, "actors"] == 4


def test_a_summarys_yes_no_entries_reach_the_mlflow_run_as_1_or_0(tmp_path):
    """privacy_shuffle_amplified, True in a shuffled run whose rounds amplify and False in one whose rounds are too
    small, is a metric of each run in the embedded store (1 or 0): `metrics.privacy_shuffle_amplified = 1` finds
    the amplified run alone. As for the summary's other entries: a text entry is a tag, a None one is left out."""
    shuffled = dict(users=200, eps=1.0, delta=1e-6, trust="shuffle")
    amplified = run_local(RunConfig("ldp-ols", round_size=100, **shuffled))
    local = run_local(RunConfig("ldp-ols", round_size=10, trust_options={"small_groups": "no-amplification"},
                                **shuffled))
    assert amplified.summary["privacy_shuffle_amplified"] is True
    assert local.summary["privacy_shuffle_amplified"] is False
    tracker = Tracker("yes-no", tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", out_dir=tmp_path / "out")
    with tracker.sweep("shuffled") as sweep:
        yes, no = sweep.log_result(amplified)["run_id"], sweep.log_result(local)["run_id"]
    client = MlflowClient(tracking_uri=tracker.tracking_uri)
    assert client.get_run(yes).data.metrics["privacy_shuffle_amplified"] == 1.0
    assert client.get_run(no).data.metrics["privacy_shuffle_amplified"] == 0.0
    found = client.search_runs([tracker.experiment_id], "metrics.privacy_shuffle_amplified = 1")
    assert [r.info.run_id for r in found] == [yes]
    run = client.get_run(yes)
    assert amplified.summary["privacy_eps_dp_accounting"] is None
    assert "privacy_eps_dp_accounting" not in run.data.metrics
    assert run.data.tags["engine.privacy_trust"] == "shuffle"


def test_a_sweep_killed_between_two_writes_of_its_summary_resumes_every_finished_run(tmp_path, monkeypatch):
    """The combined summary is rewritten at most every COMBINED_EVERY_S while runs go on; a sweep killed hard
    (no exit) before the next write loses no finished run: a resume finds the unlisted ones by their folders."""
    from ldpfed.tracking import local

    results = small_results(["ldp-sgd"])
    tracker = Tracker("kill", enabled=False, out_dir=tmp_path)
    sweep = tracker.sweep("kill")
    sweep.__enter__()
    monkeypatch.setattr(local, "COMBINED_EVERY_S", 3600.0)     # only the first run's row reaches the table
    rows = [sweep.log_result(result) for result in results]     # ... and no __exit__: killed
    folder = sweep.local_dir
    listed = pd.read_parquet(folder / "summary" / "summary.parquet")
    assert len(listed) == 1 < len(results)
    resumed = local.LocalSweep(folder, "kill", max_points=50, resume=True)
    assert resumed.finished_keys == {row["key"] for row in rows}
    by_key = {str(row["key"]): row for row in resumed.rows}
    for result, row in zip(results, rows):
        again = by_key[row["key"]]
        assert again["final_regret"] == result.summary["final_regret"] and again["seed"] == result.config.seed
        assert again["privacy_model"] == row["privacy_model"] and again["local_dir"] == row["local_dir"]


def test_the_report_says_why_a_row_looks_odd():
    """Notes read off the numbers: a private group no better than uniform play, and an algorithm whose runs came
    out the same, seed for seed, at every eps. A row that separates gets none."""
    from ldpfed.tracking.report import grouped_table, markdown_table, notes

    def rows(algorithm, privacy, eps, regrets):
        return [{"env": "bernoulli", "users": 1000, "algorithm": algorithm, "privacy_model": privacy, "eps": eps,
                 "seed": seed, "final_regret": regret, "status": "FINISHED"} for seed, regret in enumerate(regrets)]

    summary = pd.DataFrame(rows("uniform", "none", None, [100.0, 102.0]) + rows("oracle", "none", None, [10.0, 12.0])
                           + rows("learner", "ldp", 0.5, [60.0, 70.0]) + rows("learner", "ldp", 2.0, [30.0, 40.0])
                           + rows("stuck", "ldp", 0.5, [99.0, 103.0]) + rows("stuck", "ldp", 2.0, [50.0, 52.0])
                           + rows("frozen", "ldp", 0.5, [20.0, 25.0]) + rows("frozen", "ldp", 2.0, [20.0, 25.0]))
    table = grouped_table(summary)
    said = notes(table)
    assert len(said) == 2
    assert any(note.startswith("stuck at eps 0.5: regret 1.000 of uniform play's. The best non-private algorithm "
                               "here reaches 0.109 (oracle)") for note in said)
    # where the non-private algorithms do no better, the note says the world, not the privacy, is the reason
    hard = summary.assign(final_regret=summary["final_regret"].where(summary["algorithm"] != "oracle", 99.0))
    assert any("So is the best non-private algorithm here (oracle, 0.980)" in note for note in notes(grouped_table(hard)))
    assert any(note.startswith("frozen: the same final regret, seed for seed, at every eps (0.5, 2)") for note in said)
    assert table.set_index(["algorithm", "eps"]).loc[("frozen", 2.0), "final_regret_by_seed"] == (20.0, 25.0)
    assert "* stuck at eps 0.5" in markdown_table(summary)


def test_a_round_size_caveat_explains_its_rows_instead_of_the_notes_read_off_the_numbers():
    """An algorithm that says its round size changes what it does (Algorithm.round_size_caveat, carried in the
    run's summary) gets that sentence as its note, once, and not the guesses read off its numbers (near uniform
    play, the same regret at every eps); other rows keep theirs."""
    from ldpfed.tracking.report import grouped_table, markdown_table, notes

    def rows(algorithm, privacy, eps, regrets, caveat=None):
        return [{"env": "bernoulli", "users": 1000, "algorithm": algorithm, "privacy_model": privacy, "eps": eps,
                 "seed": seed, "final_regret": regret, "status": "FINISHED", "round_size_caveat": caveat}
                for seed, regret in enumerate(regrets)]

    said_of = "rounds of 500 users are no shorter than its window"
    summary = pd.DataFrame(rows("uniform", "none", None, [100.0, 102.0]) + rows("oracle", "none", None, [10.0, 12.0])
                           + rows("windowed", "ldp", 0.5, [99.0, 103.0], said_of)
                           + rows("windowed", "ldp", 2.0, [99.0, 103.0], said_of)
                           + rows("stuck", "ldp", 0.5, [99.0, 103.0]) + rows("stuck", "ldp", 2.0, [50.0, 52.0]))
    said = notes(grouped_table(summary))
    assert said[0] == f"windowed: {said_of}."
    assert not any(note.startswith("windowed") for note in said[1:])
    assert any(note.startswith("stuck at eps 0.5: regret 1.000 of uniform play's") for note in said)
    assert f"* windowed: {said_of}." in markdown_table(summary)
    # a summary without the column (runs from before it, or no algorithm with a caveat) is read as no caveat
    assert notes(grouped_table(summary.drop(columns="round_size_caveat")))[0].startswith("windowed at eps 0.5")


def test_local_files_are_written_whole_or_not_at_all_with_the_umasks_mode(tmp_path):
    """A run's local files are written through a temporary file and a rename: a write that fails leaves the old
    file as it was and no temporary behind; a new file gets the mode any new file would (0666 less the umask)."""
    from ldpfed.tracking import records

    target = tmp_path / "runs" / "a" / "summary.json"
    old = os.umask(0o027)
    try:
        records.write_json(target, {"final_regret": 1.0})
    finally:
        os.umask(old)
    assert json.loads(target.read_text()) == {"final_regret": 1.0}
    assert target.stat().st_mode & 0o777 == 0o640

    def fails(tmp):
        Path(tmp).write_text('{"final_regret": ')       # half written, then the disk fills
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        records._atomic(target, fails)
    assert json.loads(target.read_text()) == {"final_regret": 1.0}
    assert sorted(p.name for p in target.parent.iterdir()) == ["summary.json"]


def test_mlflow_failing_as_the_sweep_ends_leaves_sweep_json_with_the_sweeps_status(tmp_path, monkeypatch):
    """MLflow fails while the parent run is being finished (every run already logged): the warning says so and
    sweep.json keeps the status the sweep ended with, which `ldpfed sync` gives the parent run later. sweep.json
    once went back to RUNNING here, and sync then left the parent RUNNING for good."""
    from mlflow import MlflowClient as Client

    tracker = Tracker("ldpfed-test", tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", out_dir=tmp_path / "out",
                      strict=False)

    def server_gone(*args, **kwargs):
        raise ConnectionError("the tracking server went away")

    with pytest.warns(RuntimeWarning, match="finishing the sweep's parent run"):
        with tracker.sweep("ends-badly") as sweep:
            sweep.log_result(run_local(RunConfig("uniform", users=100, round_size=10)))
            assert sweep.run_ids                                        # the run itself reached MLflow
            monkeypatch.setattr(Client, "log_artifacts", server_gone)
    index = json.loads((sweep.local_dir / "sweep.json").read_text())
    assert index["status"] == "FINISHED"
    assert any("finishing the sweep's parent run" in error for error in index["mlflow_errors"])
