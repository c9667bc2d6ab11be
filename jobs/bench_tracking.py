#!/usr/bin/env python3
"""What logging a sweep's runs costs, apart from simulating them: the local folder and the MLflow copy in the
embedded store (SQLite), per run, for a sweep of N finished runs.

    python jobs/bench_tracking.py                 # 100 runs of a small ldp-ols run, into a fresh temporary store
    python jobs/bench_tracking.py --runs 300 --users 20000

The runs are simulated first (one real run, its result copied with other seeds: every run has the same table
size), then logged through `Tracker.sweep(...).log_result` exactly as a sweep logs them; each phase is timed
with the simulation outside the clock, each sweep into a fresh store, --repeats times (this kind of machine's
speed wanders by a quarter within minutes: the medians are printed, and each sweep's rate). Printed, for the local
folder alone (tracking off) and for the local folder and MLflow: per run, what `log_result` costs (the run's
local files and its MLflow child run), and the whole sweep, which adds what a sweep does once at its start and end
(the parent run; the plots, the report and the aggregates on the parent run); --parts and --profile tell where
one run's time goes. Target: >= 20 runs/s to the embedded store, judged per run and printed for both.
"""
from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path


def results(n: int, users: int, round_size: int):
    from ldpfed.config import RunConfig
    from ldpfed.engine import run

    base = run(RunConfig("ldp-ols", users=users, round_size=round_size, eps=1.0, seed=0))
    return [dataclasses.replace(base, config=base.config.replace(seed=seed)) for seed in range(n)]


def log_all(runs, folder: Path, tracking: bool, profile: bool = False, max_points=None,
            uri: str | None = None) -> tuple[float, float, str]:
    """(the whole sweep's seconds, seconds per run of log_result alone, the profile's text)"""
    from ldpfed.tracking import Tracker

    folder.mkdir(parents=True, exist_ok=True)
    uri = uri or f"sqlite:///{folder / 'mlflow.db'}"
    extra = {} if max_points is None else {"max_points": max_points}
    tracker = Tracker("bench-tracking", tracking_uri=uri, out_dir=folder / "out", enabled=tracking, **extra)
    profiler = cProfile.Profile() if profile else None
    started = time.perf_counter()
    with tracker.sweep("bench", params={"runs": len(runs)}) as sweep:
        if profiler:
            profiler.enable()
        first = time.perf_counter()
        for result in runs:
            sweep.log_result(result)
        per_run = (time.perf_counter() - first) / len(runs)
        if profiler:
            profiler.disable()
    elapsed = time.perf_counter() - started
    text = ""
    if profiler:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(18)
        text = out.getvalue()
    return elapsed, per_run, text


def time_client_calls() -> dict:
    """Time MlflowClient's per-run calls from now on: {call: seconds}, reset when the timed sweep starts."""
    from mlflow import MlflowClient

    spent = {name: 0.0 for name in ("create_run", "log_batch", "set_terminated")}

    def timed(name, call):
        def wrapper(*args, **kwargs):
            began = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - began
        return wrapper

    for name in spent:
        setattr(MlflowClient, name, timed(name, getattr(MlflowClient, name)))
    return spent


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--round-size", type=int, default=100)
    parser.add_argument("--max-points", type=int, default=None, help="points per MLflow curve (default: the Tracker's)")
    parser.add_argument("--repeats", type=int, default=3, help="timed sweeps of each kind (the medians are printed)")
    parser.add_argument("--profile", action="store_true", help="print where one sweep's logging spends its time")
    parser.add_argument("--parts", action="store_true", help="print ms per run of each MLflow client call")
    parser.add_argument("--tracking-uri", default=None,
                        help="log to this store instead of a fresh embedded one (e.g. http://127.0.0.1:5000, a "
                             "tracking server started beside the benchmark)")
    args = parser.parse_args(argv)
    # MLflow's asynchronous logging off unless asked: with it on, the SQLite store's writers contend (measured: 1.0
    # runs/s against 12.5 without, same command)
    os.environ.setdefault("MLFLOW_ENABLE_ASYNC_LOGGING", "false")
    calls = time_client_calls() if args.parts else None
    runs = results(args.runs, args.users, args.round_size)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        store = "SQLite" if args.tracking_uri is None else args.tracking_uri
        for label, tracking in (("local folder only", False), (f"local folder + MLflow ({store})", True)):
            folder = Path(tmp) / label.split()[0] / str(tracking)
            folder.mkdir(parents=True)
            log_all(runs[:3], folder / "warm", tracking, uri=args.tracking_uri)   # imports, the store's schema
            if calls is not None:
                calls.update(dict.fromkeys(calls, 0.0))
            timed = []
            for repeat in range(args.repeats):      # each into a fresh store; the median of each column
                elapsed, per_run, text = log_all(runs, folder / f"timed-{repeat}", tracking,
                                                 profile=args.profile and tracking and repeat == 0,
                                                 max_points=args.max_points, uri=args.tracking_uri)
                timed.append((elapsed, per_run))
                if text:
                    print(text)
            rows.append((label, statistics.median(e for e, _ in timed), statistics.median(p for _, p in timed),
                         [len(runs) / e for e, _ in timed]))
    print(f"{args.runs} runs of ldp-ols (T = {args.users:,}, B = {args.round_size}: "
          f"{-(-args.users // args.round_size)} rounds a run), logged as a sweep logs them, {args.repeats} times "
          f"(medians); python {sys.version.split()[0]}")
    print(f"{'':34s} {'ms/run':>7s} {'runs/s':>7s}   {'sweep s':>7s} {'runs/s':>7s}  {'start+end s':>11s}  each sweep, runs/s")
    for label, elapsed, per_run, rates in rows:
        print(f"{label:34s} {1000 * per_run:7.1f} {1 / per_run:7.1f}   {elapsed:7.2f} {args.runs / elapsed:7.1f}  "
              f"{elapsed - per_run * args.runs:11.2f}  {', '.join(f'{r:.1f}' for r in rates)}")
    if calls is not None:
        print("MLflow client calls, ms per run: " + ", ".join(
            f"{name} {1000 * spent / (args.runs * args.repeats):.1f}" for name, spent in calls.items()))
    _, elapsed, per_run, _ = rows[-1]
    where = "the embedded store" if args.tracking_uri is None else args.tracking_uri
    print(f"target: >= 20 runs/s to {where}: per run (log_result: the local files and the MLflow child run) "
          f"{'met' if 1 / per_run >= 20 else 'NOT met'} ({1 / per_run:.1f}); the whole sweep of {args.runs} runs "
          f"{'met' if args.runs / elapsed >= 20 else 'NOT met'} ({args.runs / elapsed:.1f}: its start and end, once "
          f"a sweep, are the parent run, the plots and the report)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
