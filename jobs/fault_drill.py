#!/usr/bin/env python
"""Fault drill: inject each fault into a real run and measure the time to detect it and to recover.

    python jobs/fault_drill.py                       # ldp-ols, d=10, K=10, 2e5 users in rounds of 2,000
    python jobs/fault_drill.py --users 2000000       # 2e6 users, rounds of 2,000

Scenarios (each run is compared, table bit for bit, with an undisturbed run of the same config):
* population actor SIGKILLed, shard actor SIGKILLed (Ray engine, 2 actors, 2 shards): detect = from the kill to
  the engine noticing; recover = from then to the recreated actor being ready (the round is then redone).
* with --shufflers S: a shuffler actor SIGKILLed and frozen, in a run under --trust shuffle with S shufflers
  (per-user mode), compared with its own undisturbed run.
* actor frozen with SIGSTOP (SIGCONT later), default timeout (10x the slowest recent round, >= 5 s) or
  --round-timeout: detect = from the SIGSTOP to the timeout firing.
* a worker node killed (its raylet and workers) or frozen (SIGSTOP on all of them), on a 3-node local cluster of
  the job's own (ray.cluster_utils), the node hosting a population actor and a shard: the replacements go to the
  other nodes (Ray marks the node dead only later).
* driver SIGKILLed (a subprocess running `python -m ldpfed run --checkpoint-dir`): detect is whoever restarts
  it; recover = from the restart to the resumed run passing the round it was killed at; lost = rounds redone.
Only processes this job started are ever signalled (the actors of its own Ray, by the pids the engine reports).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from ldpfed.config import RunConfig
from ldpfed.engine import run_local
from ldpfed.ops.drills import actor_fault, driver_kill, mlflow_outage, node_fault


def _actor_row(name: str, out: dict, reference) -> tuple:
    same = out["result"].table.equals(reference.table)
    print(f"  {name}: detected in {out['detect_s']:.2f} s, recovered in {out['recover_s']:.2f} s "
          f"(+ the round redone), run {out['wall_s']:.1f} s, identical table: {same}", flush=True)
    return name, out["detect_s"], out["recover_s"], out["wall_s"], same


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithm", default="ldp-ols")
    parser.add_argument("--users", type=int, default=200_000)
    parser.add_argument("--round-size", type=int, default=2000)
    parser.add_argument("--populations", type=int, default=4)
    parser.add_argument("--d", type=int, default=10)
    parser.add_argument("--K", type=int, default=10)
    parser.add_argument("--round-timeout", type=float, default=None, help="fixed round timeout (default: derived)")
    parser.add_argument("--at-round", type=int, default=None, help="round after which to inject (default: T/B/3)")
    parser.add_argument("--skip-actors", action="store_true")
    parser.add_argument("--shufflers", type=int, default=0,
                        help="also kill and freeze a shuffler actor of a --trust shuffle run with this many shufflers")
    parser.add_argument("--skip-nodes", action="store_true")
    parser.add_argument("--skip-driver", action="store_true")
    parser.add_argument("--skip-mlflow", action="store_true")
    args = parser.parse_args(argv)
    config = RunConfig(args.algorithm, env="linear", users=args.users, round_size=args.round_size,
                       populations=args.populations, env_params={"d": args.d, "K": args.K})
    at_round = args.at_round if args.at_round is not None else config.rounds // 3
    from ldpfed.engine.ray_engine import ensure_ray
    import ray

    print(f"fault drill: {config.algorithm} d={args.d} K={args.K} T={config.users:,} B={config.round_size} "
          f"({config.rounds} rounds), fault after round {at_round}; load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs (shared machine)", flush=True)
    t0, c0 = time.perf_counter(), time.process_time()
    reference = run_local(config)
    print(f"undisturbed single-process run: {time.perf_counter() - t0:.1f} s wall, "
          f"{time.process_time() - c0:.1f} s CPU", flush=True)
    options = {"actors": 2, "shards": 2}
    if args.round_timeout is not None:
        options["round_timeout"] = args.round_timeout
    rows = []
    ensure_ray(None)
    try:
        for name, kind, how, spares in () if args.skip_actors else (
                ("population actor killed", "population", "kill", 0),
                ("shard actor killed", "shard", "kill", 0),
                ("population actor frozen", "population", "freeze", 0),
                ("shard actor frozen", "shard", "freeze", 0),
                ("population actor killed, 1 spare", "population", "kill", 1),
                ("shard actor killed, 1 spare", "shard", "kill", 1)):
            rows.append(_actor_row(name, actor_fault(config, kind, how, at_round, {**options, "spares": spares}),
                                   reference))
        if args.shufflers:
            shuffled = config.replace(trust="shuffle", trust_options={"shufflers": args.shufflers})
            shuffled_reference = run_local(shuffled)
            for how in ("kill", "freeze"):
                name = f"shuffler actor {'killed' if how == 'kill' else 'frozen'} ({args.shufflers} shufflers)"
                rows.append(_actor_row(name, actor_fault(shuffled, "shuffler", how, at_round,
                                                         {**options, "mode": "per-user"}), shuffled_reference))
    finally:
        ray.shutdown()
    if not args.skip_nodes:        # a cluster of its own: after the Ray instance above is shut down
        node_config = config.replace(populations=max(config.populations, 6))
        node_reference = run_local(node_config) if node_config != config else reference
        for how in ("kill", "freeze"):
            out = node_fault(node_config, how, at_round, {k: v for k, v in options.items() if k != "shards"})
            same = out["result"].table.equals(node_reference.table)
            name = f"worker node {'killed' if how == 'kill' else 'frozen'} (a population actor and a shard on it)"
            rows.append((name, out["detect_s"], out["recover_s"], out["wall_s"], same))
            print(f"  {name}: detected in {out['detect_s']:.2f} s, recovered in {out['recover_s']:.2f} s, actors "
                  f"moved {out['moved']}, identical table: {same}", flush=True)
    if not args.skip_driver:
        driver_config = config.replace(round_size=max(config.populations, config.round_size // 10))
        out = driver_kill(driver_config)
        same = out["table"].equals(run_local(driver_config).table)
        rows.append((f"driver SIGKILLed (B={driver_config.round_size}), `--resume`", None, out["recover_s"],
                     out["wall_s"], same))
        print(f"  driver killed after checkpoint round {out['resumed_from']} of {driver_config.rounds}: the resumed "
              f"run took {out['recover_s']:.1f} s (a whole run {out['whole_s']:.1f} s, both with interpreter start), "
              f"identical table: {same}", flush=True)
    if not args.skip_mlflow:
        for how in ("kill", "freeze"):
            with tempfile.TemporaryDirectory(prefix="ldpfed-drill-mlflow-") as tmp:
                out = mlflow_outage(Path(tmp), how)
            same = out["parent_status"] == "FINISHED" and len(out["children"]) == out["runs"] and all(
                status == "FINISHED" for _, status in out["children"]) and out["local_report"]
            rows.append((f"MLflow server {'killed' if how == 'kill' else 'frozen'} (sync after restart)",
                         out["detect_s"], out["sync_s"], None, same))
    print("\n| scenario | time to detect (s) | time to recover (s) | run wall (s) | identical to undisturbed |")
    print("|---|---|---|---|---|")
    for name, detect, recover, wall, same in rows:
        d = "-" if detect is None else f"{detect:.2f}"
        w = "-" if wall is None else f"{wall:.1f}"
        print(f"| {name} | {d} | {recover:.2f} | {w} | {same} |")
    return 0 if all(row[-1] for row in rows) else 1


if __name__ == "__main__":
    from ldpfed.util.signals import exit_status, interruptible

    try:
        with interruptible():      # SIGTERM too runs the `finally`s: Ray and the MLflow servers stop with the job
            sys.exit(main())
    except KeyboardInterrupt as stop:
        sys.exit(exit_status(stop))
