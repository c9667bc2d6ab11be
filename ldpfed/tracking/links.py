"""Links into the MLflow UI, all in its "Model training" view: the command that serves the UI for a local store,
its address, and the pages of an experiment's runs, of one run and of one artifact.

Without `workflowType=machine_learning` MLflow 3 opens these pages in its GenAI view, where a run's description
is not shown.
"""
from __future__ import annotations

import shlex
import sys
from pathlib import Path
from urllib.parse import quote

from ldpfed.tracking.store import is_http, redact

UI_PORT = 5000      # where the UI of an embedded store is served (loopback), unless told otherwise
VIEW = "workflowType=machine_learning"


def ui_command(uri: str, port: int = UI_PORT) -> str | None:
    """The shell command that serves the UI of an embedded (SQLite) store; None for a server (its own address
    is the UI)."""
    if is_http(uri):
        return None
    # this interpreter's own mlflow: the command runs as printed whether or not its environment is activated
    mlflow = shlex.quote(str(Path(sys.executable).with_name("mlflow")))
    return f"{mlflow} ui --backend-store-uri {redact(uri)} --host 127.0.0.1 --port {port} --workers 1"


def ui_address(uri: str, port: int = UI_PORT) -> str:
    """Where the UI answers: the tracking server itself, or the address of `ui_command`."""
    return redact(uri).rstrip("/") if is_http(uri) else f"http://127.0.0.1:{port}"


def runs_url(address: str, experiment_id: str, parent_run_id: str | None = None) -> str:
    """The experiment's runs table; with `parent_run_id`, only that sweep's child runs (flat, not folded under the
    parent), best first by regret_vs_uniform."""
    query = VIEW
    if parent_run_id:
        search = f"tags.`ldpfed.sweep_id` = '{parent_run_id}' and tags.`ldpfed.kind` = 'run'"
        query += (f"&searchFilter={quote(search, safe='')}&orderByKey={quote('metrics.`regret_vs_uniform`', safe='')}"
                  "&orderByAsc=true")
    return f"{address}/#/experiments/{experiment_id}/runs?{query}"


def run_url(address: str, experiment_id: str, run_id: str) -> str:
    """One run's page."""
    return f"{address}/#/experiments/{experiment_id}/runs/{run_id}?{VIEW}"


def artifact_url(address: str, experiment_id: str, run_id: str, path: str) -> str:
    """One artifact of a run in the UI's artifact viewer (e.g. a sweep's report/report.html)."""
    return f"{address}/#/experiments/{experiment_id}/runs/{run_id}/artifacts/{path}?{VIEW}"
