#!/usr/bin/env python3
"""A study's wall time against its simulation: one sweep (the quick preset by default, as the main job runs it),
timed from the command's start to its end, beside the sum of its runs' simulation time (elapsed_s less compile_s)
over the machine's cores. Target: the wall time within 2x of that.

    python jobs/bench_study.py                                  # the quick preset as shipped (Ray engine), no MLflow
    python jobs/bench_study.py --engine local --workers auto    # its runs as Ray tasks on the local engine
    python jobs/bench_study.py --tracking                       # with MLflow's embedded store
    python jobs/bench_study.py --users 50000                    # the same runs with more users each

Each way runs `python -m ldpfed sweep` in a fresh process, so the wall time includes what a user waits for: the
imports, Ray's start, loading compiled code, the driver's logging, the plots and the report. The compile cache is
warmed first by one untimed sweep of the same runs (a first sweep on a machine compiles; see docs/figures.md).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def sweep(args, out: Path, name: str) -> float:
    command = [sys.executable, "-m", "ldpfed", "sweep", args.preset, "--name", name, "--out", str(out)]
    if args.engine:
        command += ["--engine", args.engine]
    if args.workers:
        command += ["--workers", args.workers]
    if args.users:
        command += ["--users", str(args.users)]
    if not args.tracking:
        command += ["--no-tracking"]
    else:
        command += ["--tracking-uri", f"sqlite:///{out / 'mlflow.db'}"]
    began = time.perf_counter()
    subprocess.run(command, check=True, cwd=out, stdout=subprocess.DEVNULL)
    return time.perf_counter() - began


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="quick")
    parser.add_argument("--engine", default=None, help="override the preset's engine (ray, local)")
    parser.add_argument("--workers", default=None, help="runs at once (an integer or auto: Ray tasks)")
    parser.add_argument("--tracking", action="store_true", help="log to MLflow's embedded store (default: off)")
    parser.add_argument("--users", type=int, default=None, help="users per run (default: the preset's)")
    args = parser.parse_args(argv)
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        sweep(args, out, "warm")                      # fills the compile cache: not timed
        wall = sweep(args, out, "timed")
        table = pd.read_parquet(out / "timed" / "summary" / "summary.parquet")
    simulation = float((table["elapsed_s"] - table["compile_s"].fillna(0.0)).sum())
    compile_s = float(table["compile_s"].fillna(0.0).sum())
    floor = simulation / cores
    ways = f"engine {args.engine or 'as the preset says'}, workers {args.workers or 1}, " \
           f"{'MLflow (SQLite)' if args.tracking else 'no MLflow'}" \
           + (f", {args.users:,} users a run" if args.users else "")
    print(f"sweep {args.preset} ({ways}): {len(table)} runs on {cores} cores")
    print(f"  wall time                             {wall:8.1f} s")
    print(f"  runs' simulation (elapsed - compile)  {simulation:8.1f} s   over {cores} cores: {floor:.1f} s")
    print(f"  runs' compile_s (loading, compiling)  {compile_s:8.1f} s")
    ratio = wall / floor if floor else float("inf")
    print(f"  wall / (simulation / cores)           {ratio:8.1f}x   target <= 2x: {'met' if ratio <= 2 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
