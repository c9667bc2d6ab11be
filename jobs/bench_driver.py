#!/usr/bin/env python
"""The coordinator's cost per round against the number of population actors and shards (issue 19 item 3).

    python jobs/bench_driver.py                                    # actors 2..64, shards 1 and 4
    python jobs/bench_driver.py --actors 2,4,8 --shards 1 --rounds 50

Each run: ldp-sgd (d = 10, K = 10) with one population per actor and --users-per-population users in each of
--rounds rounds, so every actor has little work and the round's time is the coordination: the driver's CPU time
per round (`cpu_s_driver` of the run's summary) and the wall time per round, after an untimed warm-up run that
starts the actor processes. Fits: per-round cost = a + b x actors (least squares), per shard count. Each actor is
a process (~150 MB): 64 actors take ~10 GB on this machine; more needs more memory or nodes.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from ldpfed.config import RunConfig


def _ints(text):
    return tuple(int(x) for x in text.split(",") if x.strip())


def measure(actors: int, shards: int, rounds: int, per_population: int, mode: str) -> dict:
    from ldpfed.engine.ray_engine import run_ray

    config = RunConfig("ldp-sgd", env="linear", env_params={"d": 10, "K": 10}, populations=actors,
                       round_size=actors * per_population, users=rounds * actors * per_population)
    run_ray(config.replace(users=2 * config.round_size), actors=actors, shards=shards, mode=mode)   # warm-up
    started = time.perf_counter()
    s = run_ray(config, actors=actors, shards=shards, mode=mode).summary
    wall = time.perf_counter() - started
    return {"actors": actors, "shards": shards, "rounds": rounds, "driver_cpu_ms": 1e3 * s["cpu_s_driver"] / rounds,
            "wall_ms": 1e3 * wall / rounds, "actor_cpu_ms": 1e3 * s["cpu_s_populations"] / rounds,
            "shard_cpu_ms": 1e3 * s["cpu_s_shards"] / rounds}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--actors", type=_ints, default=(2, 4, 8, 16, 32, 64))
    parser.add_argument("--shards", type=_ints, default=(1, 4))
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--users-per-population", type=int, default=10)
    parser.add_argument("--mode", default="pre-aggregated", choices=["pre-aggregated", "per-user"])
    args = parser.parse_args(argv)
    import ray

    from ldpfed.engine.ray_engine import ensure_ray

    ensure_ray(None, num_cpus=os.cpu_count())
    print(f"coordinator cost per round ({args.mode}, {args.users_per_population} users per population, "
          f"{args.rounds} rounds); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
    rows = []
    try:
        for shards in args.shards:
            for actors in args.actors:
                rows.append(measure(actors, shards, args.rounds, args.users_per_population, args.mode))
                r = rows[-1]
                print(f"  actors {actors:>4} shards {shards:>3}: driver CPU {r['driver_cpu_ms']:7.2f} ms/round, "
                      f"wall {r['wall_ms']:7.2f} ms/round, actors' CPU {r['actor_cpu_ms']:7.2f}, shards' CPU "
                      f"{r['shard_cpu_ms']:6.2f}", flush=True)
    finally:
        ray.shutdown()
    print("\n| actors | shards | driver CPU ms/round | wall ms/round | actors' CPU ms/round | shards' CPU ms/round |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['actors']} | {r['shards']} | {r['driver_cpu_ms']:.2f} | {r['wall_ms']:.2f} | "
              f"{r['actor_cpu_ms']:.2f} | {r['shard_cpu_ms']:.2f} |")
    fits = {}
    for shards in args.shards:
        part = [r for r in rows if r["shards"] == shards]
        if len(part) > 1:
            x = np.array([r["actors"] for r in part], dtype=float)
            for key in ("driver_cpu_ms", "wall_ms"):
                b, a = np.polyfit(x, [r[key] for r in part], 1)
                fits[shards, key] = (a, b)
                print(f"fit, {shards} shard(s): {key} = {a:.2f} + {b:.3f} x actors")
    if fits:
        scale_model(fits, floor_rate())
    return 0


def floor_rate() -> float:
    """Users/s of one process's CPU on the benchmark's setting (run_local of ldp-sgd, d = 10, K = 10, B = 1e4): the
    work one population actor does per second of its CPU."""
    from ldpfed.engine import run_local
    config = RunConfig("ldp-sgd", env="linear", env_params={"d": 10, "K": 10}, round_size=10_000, users=10**6)
    run_local(config.replace(users=20_000))
    started = time.process_time()
    run_local(config)
    return config.users / (time.process_time() - started)


def scale_model(fits: dict, rate: float, share: float = 0.10) -> None:
    """docs/scaling.md's model: a round costs the coordinator c(A) = a + b A of CPU (the fit over actors, fewest
    shards) and each of A actors B / (A rate) of work; the coordinator stays under `share` of the round when
    c <= share (B / (A rate) + c), i.e. B >= A rate c (1 - share) / share. One actor per node."""
    shards = min(s for s, key in fits if key == "driver_cpu_ms")
    a, b = fits[shards, "driver_cpu_ms"]
    print(f"\nscale model: one process does {rate:,.0f} users/s of ldp-sgd (d = 10, K = 10); coordinator "
          f"{max(a, 0):.2f} + {b:.3f} ms x actors ({shards} shard(s)); coordinator under {share:.0%} of a round:")
    print("| nodes (one actor each) | coordinator ms/round | smallest round (users) | its wall time (s) |")
    print("|---:|---:|---:|---:|")
    for nodes in (10, 100, 1000):
        coordinator = 1e-3 * (max(a, 0.0) + b * nodes)
        smallest = nodes * rate * coordinator * (1 - share) / share
        print(f"| {nodes:,} | {1e3 * coordinator:,.1f} | {smallest:,.0f} | {smallest / (nodes * rate) + coordinator:.2f} |")


if __name__ == "__main__":
    sys.exit(main())
