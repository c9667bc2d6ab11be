"""A local `mlflow server` for drills and tests: 127.0.0.1 only, SQLite and artifacts under one folder, in its own
process group (so a caller can signal the server and its workers, and only them). Used by jobs/fault_drill.py and
tests/test_tracking.py."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

from ldpfed.util.waits import HANG_S, wait_until


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spawn(root: Path, port: int) -> subprocess.Popen:
    """Start `mlflow server` on 127.0.0.1:port (store root/server.db, artifacts root/artifacts, log root/server.log);
    returns at once: `wait_healthy` waits for it to answer."""
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    env.pop("MLFLOW_TRACKING_URI", None)
    with open(root / "server.log", "a") as log:     # the child keeps its own descriptor
        return subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
                                 f"sqlite:///{root / 'server.db'}", "--artifacts-destination", str(root / "artifacts"),
                                 "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                                cwd=root, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def wait_healthy(proc: subprocess.Popen, root: Path, port: int, timeout: float = HANG_S) -> None:
    """Return once the server answers /health; WaitFailed (a RuntimeError; the log's tail in its message) if it
    exits first or stays silent for `timeout` seconds (default: a bound on a hang only, ldpfed.util.waits)."""
    wait_until(lambda: _healthy(port), f"mlflow server on 127.0.0.1:{port} to answer /health", timeout,
               exited=proc.poll, detail=lambda: _log_tail(root))


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _log_tail(root: Path) -> str:
    return (root / "server.log").read_text(errors="replace")[-3000:]
