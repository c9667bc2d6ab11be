#!/usr/bin/env python
"""Chaos soak: a long run on a 3-node local cluster while a seeded schedule kills an actor or a node every N s.

    python jobs/chaos_soak.py                                   # 1e8 users of ldp-sgd, a fault every 30 s
    python jobs/chaos_soak.py --users 1e7 --every 10            # minutes
    python jobs/chaos_soak.py --mode per-user --users 6e8        # every user's message through the object store

The cluster is the job's own (ray.cluster_utils: a head and 2 worker nodes, one CPU each, on loopback). Every
--every seconds the schedule (seeded by --seed) SIGKILLs a random actor of the run, or with probability
--node-share kills a random worker node and adds a new one --every/2 s later (a lost machine replaced). At the
end the run's table is compared, bit for bit, with `run_local` of the same config, and the faults, the
recoveries (time to detect and to recover) and the run's rate are printed.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from ldpfed.config import RunConfig
from ldpfed.engine import run_local
from ldpfed.ops.drills import chaos_soak
from ldpfed.util.progress import Progress


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithm", default="ldp-sgd")
    parser.add_argument("--users", type=lambda t: int(float(t)), default=10**8)
    parser.add_argument("--round-size", type=lambda t: int(float(t)), default=100_000)
    parser.add_argument("--populations", type=int, default=6)
    parser.add_argument("--every", type=float, default=30.0, help="seconds between faults")
    parser.add_argument("--node-share", type=float, default=0.3, help="share of the faults that kill a node")
    parser.add_argument("--seed", type=int, default=0, help="the fault schedule's seed (the run's seed is 0)")
    parser.add_argument("--round-timeout", type=float, default=None)
    parser.add_argument("--transport", default=None, choices=["ray", "direct"],
                        help="the Ray engine's transport (default: the engine's, direct for these flat rounds)")
    parser.add_argument("--mode", default="pre-aggregated", choices=["pre-aggregated", "per-user"],
                        help="per-user: the shards get, check and sum every user's message (the harder soak, and the "
                             "cheaper comparison: the single-process run takes a fraction of the soak's time)")
    args = parser.parse_args(argv)
    config = RunConfig(args.algorithm, env="linear", users=args.users, round_size=args.round_size,
                       populations=args.populations, env_params={"d": 10, "K": 10})
    print(f"chaos soak: {config.algorithm} T={config.users:,} B={config.round_size:,} ({args.mode}), a fault every "
          f"{args.every:g} s (nodes {args.node_share:.0%}); load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs", flush=True)
    options = {"mode": args.mode, "transport": args.transport,
               **({} if args.round_timeout is None else {"round_timeout": args.round_timeout})}
    bar = Progress(config.users, label="soak")
    out = chaos_soak(config, args.every, args.seed, options, args.node_share, progress=bar)
    bar.close()
    result = out["result"]
    print(f"soak: {out['wall_s']:,.0f} s, {config.users / out['wall_s']:,.0f} users/s, {len(out['faults'])} faults, "
          f"{len(out['recoveries'])} recoveries, {len(result.summary['rebalances'])} population actors moved onto "
          f"nodes that joined; transport {result.summary['transport']}", flush=True)
    t0 = time.perf_counter()
    same = result.table.equals(run_local(config).table)
    print(f"undisturbed single-process run: {time.perf_counter() - t0:,.0f} s; identical table: {same}")
    print("\n| fault | time |\n|---|---|")
    start = out["faults"][0]["at"] if out["faults"] else 0.0
    for fault in out["faults"]:
        print(f"| {fault['fault']} | +{fault['at'] - start:,.0f} s |")
    detect = [e["detect_s"] for e in out["recoveries"]]
    recover = [e["recover_s"] for e in out["recoveries"]]
    if detect:
        print(f"\nrecoveries: {len(detect)}; detect median {np.median(detect):.1f} s (max {max(detect):.1f}), "
              f"recover median {np.median(recover):.1f} s (max {max(recover):.1f}); actors replaced: "
              f"{sum(len(e['actors']) for e in out['recoveries'])}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
