"""`python -m ldpfed ui`: the MLflow UI on 127.0.0.1 for a local store, and the link to the sweep to look at.

The store is named by a sweep's results folder (its sweep.json records the store and the sweep's parent run), a
folder of sweep folders (the newest), an MLflow SQLite file or a tracking URI; by default MLFLOW_TRACKING_URI, else
./mlflow.db, where the jobs log. Without a results folder the sweep is the store's latest. The links are
links.py's, pointed at the port the UI is served on. A server URI is its own UI: nothing is started.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ldpfed.tracking import links as ui_links, local_server, records
from ldpfed.tracking.links import UI_PORT
from ldpfed.tracking.store import TrackingUnavailable, is_http, resolve_tracking_uri, sqlite_path
from ldpfed.tracking.tracker import Tracker
from ldpfed.util.errors import ConfigError
from ldpfed.util.signals import exit_status, interruptible
from ldpfed.util.waits import HANG_S

WHERE = "RESULTS_OR_DB"        # the command line's name of the argument, for errors
# a first start migrates a new database: ~10 s on 2 idle cores, minutes on loaded ones; a UI that exits is
# reported at once, so this bounds only a hang
START_TIMEOUT_S = HANG_S


@dataclass
class Store:
    uri: str
    sweep: dict | None = None     # the sweep.json of the results folder named, if one was


def find_store(target: str | None = None) -> Store:
    """The store (and the sweep, for a results folder) that `target` names; ConfigError if it names none."""
    if target is None:
        uri = resolve_tracking_uri(None)
    elif Path(target).is_dir():
        index = _sweep_index(Path(target))
        if not index.get("tracking_uri"):
            raise ConfigError(WHERE, target, "this sweep was not logged to MLflow (--no-tracking); upload it with "
                                             "`python -m ldpfed sync FOLDER --tracking-uri URI`")
        return Store(resolve_tracking_uri(index["tracking_uri"]), index)
    elif "://" in target:
        uri = resolve_tracking_uri(target)
    else:
        uri = resolve_tracking_uri(f"sqlite:///{Path(target).expanduser().resolve()}")
    path = sqlite_path(uri)
    if path is not None and not path.is_file():
        raise ConfigError(WHERE, str(target or path), f"no MLflow store at {path}: run a sweep first (`python -m "
                                                      "ldpfed sweep quick`), or name a results folder or a .db file")
    return Store(uri)


def _sweep_index(folder: Path) -> dict:
    """The sweep.json of `folder`, or of its newest sweep subfolder."""
    found = [folder / "sweep.json"] if (folder / "sweep.json").is_file() else list(folder.glob("*/sweep.json"))
    if not found:
        raise ConfigError(WHERE, str(folder), "no sweep.json in this folder or its subfolders (not a sweep's "
                                              "results folder)")
    newest = max(found, key=lambda path: path.stat().st_mtime)
    try:
        return records.read_json(newest)
    except (OSError, ValueError) as error:
        raise ConfigError(WHERE, str(newest), f"unreadable ({error})") from None


def latest_sweep(uri: str) -> tuple[str, str, str] | None:
    """(experiment name, parent run id, sweep name) of the store's most recently started sweep, or None."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiments = {e.experiment_id: e.name for e in client.search_experiments()}
    if not experiments:
        return None
    runs = client.search_runs(list(experiments), "tags.`ldpfed.kind` = 'sweep'", max_results=1,
                              order_by=["attributes.start_time DESC"])
    if not runs:
        return None
    run = runs[0]
    return experiments[run.info.experiment_id], run.info.run_id, run.data.tags.get("ldpfed.sweep", run.info.run_name)


def links(store: Store, port: int) -> list[tuple[str, str]]:
    """What to print once the UI answers: (label, text) pairs, the sweep's runs and report among them."""
    if store.sweep is not None and store.sweep.get("parent_run_id"):
        found = (store.sweep.get("experiment"), store.sweep["parent_run_id"], store.sweep.get("sweep"))
    else:
        found = latest_sweep(store.uri)
    if found is None:
        return [("No sweep", "in this store yet: `python -m ldpfed sweep quick` runs one")]
    experiment, parent, name = found
    tracker = Tracker(experiment=experiment, tracking_uri=store.uri)
    address = ui_links.ui_address(store.uri, port)
    return [("Sweep", f"{name} (experiment {experiment!r}, parent run {parent})"),
            ("Its runs", ui_links.runs_url(address, tracker.experiment_id, parent)),
            ("Its report", ui_links.artifact_url(address, tracker.experiment_id, parent, "report/report.html"))]


def _check_port_free(port: int) -> None:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            raise ConfigError("--port", port, "in use on 127.0.0.1 (another MLflow UI?); choose another") from None


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the UI's process group (the UI and its workers: ours alone), SIGKILL if it lingers."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=15)
            return
        except subprocess.TimeoutExpired:
            continue


def serve(target: str | None = None, port: int = UI_PORT) -> int:
    """Start `mlflow ui` for the store `target` names on 127.0.0.1:port, print the links once it answers, and
    serve until Ctrl-C or SIGTERM (exit 130/143) or until the UI exits (its status)."""
    store = find_store(target)
    if is_http(store.uri):
        print(f"{store.uri} is an MLflow server: it is its own UI, nothing to start")
        for label, text in links(store, port):
            print(f"{label + ':':<12} {text}")
        return 0
    _check_port_free(port)
    address = f"http://127.0.0.1:{port}"
    print(f"Starting the MLflow UI for {store.uri} at {address} (loopback only) ...", flush=True)
    folder = sqlite_path(store.uri).parent if sqlite_path(store.uri) else Path.cwd()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with tempfile.TemporaryDirectory(prefix="ldpfed-ui-") as root:
        with open(Path(root) / "server.log", "w") as log:    # a relative artifact root resolves beside the db
            proc = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", store.uri,
                                     "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                                    cwd=folder, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            with interruptible():
                try:
                    local_server.wait_healthy(proc, Path(root), port, START_TIMEOUT_S)
                except RuntimeError as error:
                    raise TrackingUnavailable(store.uri, f"the MLflow UI did not start: {error}") from None
                print(f"MLflow UI:   {address}   (Ctrl-C stops it)")
                for label, text in links(store, port):
                    print(f"{label + ':':<12} {text}")
                sys.stdout.flush()
                code = proc.wait()
                print(f"the MLflow UI exited ({code}):\n{(Path(root) / 'server.log').read_text()[-3000:]}",
                      file=sys.stderr)
                return code or 1
        except KeyboardInterrupt as error:
            return exit_status(error)
        finally:
            _stop(proc)
