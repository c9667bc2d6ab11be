#!/usr/bin/env python3
"""The same sweep three ways, with its runs per node and runs/s: in one process (one run after another: the
reference, and it fills the compile cache for the others), as Ray tasks on one node (a local Ray with the machine's
cores), and as Ray tasks on a 3-node local cluster (ray.cluster_utils.Cluster, 1 CPU per node, all on this
machine). Every way must give the same runs, bit for bit: the job checks it.

    python jobs/bench_sweep.py                                    # the preset example, 16 runs of 20,000 users
    python jobs/bench_sweep.py --preset paper --users 5000 --eps 1 --seeds 0
    python jobs/bench_sweep.py --nodes 3 --cpus-per-node 1

runs/s is over the sweep itself (from its start to its report, Ray's start left out), and the runs' own time
(their elapsed_s, summed) is printed beside it: the rest is the driver's (logging each run, the plots and report at
the end, scheduling), which bounds runs/s however many nodes run the runs; short runs show that bound, long ones
(--users) the nodes' work. What it can show: that a sweep fills every node it is given, and the same runs bit for
bit. What it cannot show on a machine with fewer cores than the cluster's CPUs: the cluster's speed-up (three
1-CPU nodes on 2 cores share those 2 cores, with whatever else the machine runs). Every Ray here runs its tasks at
this process's niceness.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import ldpfed  # noqa: E402

LOOPBACK = "127.0.0.2"      # 127.0.0.1 would be replaced by the machine's outward address


def same_runs(a, b) -> bool:
    left, right = a.table.set_index("key").sort_index(), b.table.set_index("key").sort_index()
    return (list(left.index) == list(right.index) and left["final_regret"].equals(right["final_regret"])
            and all(pd.read_parquet(a.folder / "runs" / k / "table.parquet").equals(
                pd.read_parquet(b.folder / "runs" / k / "table.parquet")) for k in left.index))


def report(label: str, result, wall: float, reference=None) -> dict:
    runs = len(result.table)
    per_node = ", ".join(f"{node}: {count}" for node, count in result.runs_per_node().items())
    same = "" if reference is None else \
        f"; same runs as in one process: {'yes' if same_runs(reference, result) else 'NO'}"
    # the runs' own time (each run's elapsed_s, summed): the rest of the sweep's time is the driver's logging of
    # each run (its files, the combined table, MLflow when on), the plots and report at the end, and scheduling
    own = float(result.table["elapsed_s"].sum())
    print(f"{label:<28} {runs} runs in {result.elapsed_s:6.1f} s = {runs / result.elapsed_s:5.2f} runs/s "
          f"(wall with Ray's start {wall:5.1f} s){same}\n{'':<28} runs per node: {per_node}; the runs' own "
          f"time, summed: {own:.1f} s", flush=True)
    return {"mode": label, "runs": runs, "seconds": result.elapsed_s, "runs_per_s": runs / result.elapsed_s}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="example")
    parser.add_argument("--users", type=int, default=None, help="default: the preset's")
    parser.add_argument("--eps", default="1,4")
    parser.add_argument("--seeds", default="0-1")
    parser.add_argument("--algorithms", default=None, help="default: the preset's")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--cpus-per-node", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="results folder (default: a temporary one)")
    args = parser.parse_args(argv)
    # every Ray here (the sweep's own, the cluster's nodes) runs its tasks at this process's niceness, as the
    # one-process sweep's runs, not reniced by Ray's default 15 below the machine's other jobs
    os.environ.setdefault("RAY_worker_niceness", "0")      # an increment over the nodes, which have ours
    out = args.out or Path(tempfile.mkdtemp(prefix="bench_sweep-"))
    sweep = dict(users=args.users, eps=args.eps, seeds=args.seeds, algorithms=args.algorithms, tracking=False,
                 progress=False, verbose=False, out=out)
    print(f"bench_sweep: preset {args.preset}, users {args.users or 'as the preset'}, eps {args.eps}, seeds "
          f"{args.seeds}; results under {out}", flush=True)
    rows = []
    wall = time.perf_counter()
    alone = ldpfed.sweep(args.preset, name="one-process", workers=1, **sweep)
    rows.append(report("one process", alone, time.perf_counter() - wall))

    wall = time.perf_counter()
    local = ldpfed.sweep(args.preset, name="one-node", workers="auto", **sweep)     # starts and stops a local Ray
    rows.append(report("Ray tasks, one node", local, time.perf_counter() - wall, alone))

    import ray
    from ray.cluster_utils import Cluster

    wall = time.perf_counter()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": args.cpus_per_node, "include_dashboard": False,
                                                           "node_ip_address": LOOPBACK})
    try:
        for _ in range(args.nodes - 1):
            cluster.add_node(num_cpus=args.cpus_per_node, node_ip_address=LOOPBACK)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, _node_ip_address=LOOPBACK, log_to_driver=False, logging_level="ERROR")
        spread = ldpfed.sweep(args.preset, name="cluster", address=cluster.address, **sweep)
        rows.append(report(f"Ray tasks, {args.nodes}-node cluster", spread, time.perf_counter() - wall, alone))
    finally:
        ray.shutdown()
        cluster.shutdown()
    base = rows[0]["runs_per_s"]
    print("\nruns/s against one process: " + ", ".join(f"{r['mode']} {r['runs_per_s'] / base:.2f}x" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
