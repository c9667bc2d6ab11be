"""A local `mlflow server` for drills and tests: 127.0.0.1 only, SQLite and artifacts under one folder, in its own
process group (so a caller can signal the server and its workers, and only them). Used by jobs/fault_drill.py and
tests/test_tracking.py."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


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


def wait_healthy(proc: subprocess.Popen, root: Path, port: int, timeout: float) -> None:
    """Return once the server answers /health; RuntimeError (with the log's tail) if it exits or stays silent for
    `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited ({proc.returncode}):\n{_log_tail(root)}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"mlflow server did not answer in {timeout:g} s:\n{_log_tail(root)}")
        time.sleep(0.25)


def _log_tail(root: Path) -> str:
    return (root / "server.log").read_text(errors="replace")[-3000:]
