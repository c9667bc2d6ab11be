#!/usr/bin/env python3
"""The README's MLflow screenshots, made from a finished sweep: what a user sees when opening the links the sweep
printed (the sweep's runs, its report, one run), served by `mlflow ui` on loopback and photographed by headless
Chromium (Debian: apt-get install chromium).

    python jobs/run_all.py                                  # the main job: results/run_all/quick and ./mlflow.db
    python jobs/screenshots.py                              # -> docs/screenshots/mlflow_{runs,report,run}.png
    python jobs/screenshots.py --sweep results/run_all/my-sweep --out /tmp/shots

The pages are the ones the sweep printed (ldpfed.tracking.links): the runs of the sweep (filtered to it, sorted by
regret over uniform play's), the parent run's report/report.html, and the child run with the lowest such regret.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
# a closed network: no background connections, no first-run pages (they stall headless Chromium here)
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--disable-quic",
                  "--no-first-run", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"mlflow ui did not answer on port {port} within {timeout:.0f} s")


def shoot(browser: str, url: str, path: Path, size: str, budget_ms: int) -> None:
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={size}",
                        f"--virtual-time-budget={budget_ms}", f"--screenshot={path}", url],
                       check=True, capture_output=True, timeout=180)
    if not path.exists() or path.stat().st_size == 0:
        raise SystemExit(f"no screenshot of {url}")
    print(f"{path}  <- {url}")


def main(argv=None) -> int:
    from ldpfed.tracking import links

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep", type=Path, default=Path("results/run_all/quick"),
                        help="a finished sweep's folder (its sweep.json names its MLflow store and runs)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    parser.add_argument("--size", default="1500,900", help="window size W,H")
    # The report page (1.4 MB of embedded plots, loaded into the artifact viewer's frame) is sometimes still blank
    # when the picture is taken, at 20 s as at 180 s of virtual time: look at mlflow_report.png and run again if so
    parser.add_argument("--budget-ms", type=int, default=90_000, help="virtual time the page gets to render")
    args = parser.parse_args(argv)
    browser = next((shutil.which(name) for name in BROWSERS if shutil.which(name)), None)
    if browser is None:
        parser.exit(2, "no Chromium found (Debian: apt-get install chromium)\n")
    try:
        index = json.loads((args.sweep / "sweep.json").read_text())
    except (OSError, ValueError) as error:
        parser.exit(2, f"{args.sweep}: not a finished sweep folder ({error})\n")
    uri, experiment, parent = index.get("tracking_uri"), index.get("experiment_id"), index.get("parent_run_id")
    if not (uri and experiment and parent):
        parser.exit(2, f"{args.sweep}: this sweep was not logged to MLflow (run it without --no-tracking)\n")
    import pandas as pd

    table = pd.read_parquet(args.sweep / "summary" / "summary.parquet")
    best = table[(table["status"] == "FINISHED") & table["run_id"].notna()].sort_values("regret_vs_uniform")
    args.out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    command = links.ui_command(uri, port)
    if command is None:                        # a tracking server: its own address serves the UI
        address, server = links.ui_address(uri), None
    else:
        address = links.ui_address(uri, port)
        server = subprocess.Popen(command, shell=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True)
        wait_for(port, 120)
    try:
        pages = [("mlflow_runs.png", links.runs_url(address, experiment, parent)),
                 ("mlflow_report.png", links.artifact_url(address, experiment, parent, "report/report.html"))]
        if not best.empty:
            pages.append(("mlflow_run.png", links.run_url(address, experiment, best["run_id"].iloc[0])))
        for name, url in pages:
            shoot(browser, url, args.out / name, args.size, args.budget_ms)
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
