#!/usr/bin/env python
"""The coordinator's cost per round against the number of population actors and shards.

    python jobs/bench_driver.py                                    # actors 2..64, shards 1 and 4
    python jobs/bench_driver.py --actors 2,4,8 --shards 1 --rounds 50
    python jobs/bench_driver.py --actors 2,4,8,16,32 --shards 1 --shape flat,tree     # both shapes of a round
    python jobs/bench_driver.py --actors 2,4,8,16,32,64 --shards 1 --shape flat,tree,direct  # and the direct transport

Each run: ldp-sgd (d = 10, K = 10) with one population per actor and --users-per-population users in each of
--rounds rounds, so every actor has little work and the round's time is the coordination: the driver's CPU time
per round (`cpu_s_driver` of the run's summary) and the wall time per round, after an untimed warm-up run that
starts the actor processes. --shape: flat (the driver calls every actor), tree (groups of ceil(sqrt(actors)), the
driver calls their leaders; see RayBackend's group_size) or a group size, all over Ray calls (transport "ray"); or
direct (a flat round over the direct transport's sockets, the engine's default; ldpfed/engine/channels.py). Fits:
per-round cost = a + b x actors (least squares), and a + b x groups for a tree, per shape and shard count. Each
actor is a process (~150 MB): 64 actors take ~10 GB on this machine; more needs more memory or nodes.
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


def group_size(shape: str, actors: int) -> int:
    from ldpfed.engine.ray_engine import tree_group_size

    return {"flat": 1, "direct": 1, "tree": tree_group_size(actors)}.get(shape) or int(shape)


def measure(actors: int, shards: int, rounds: int, per_population: int, mode: str, shape: str = "flat") -> dict:
    from ldpfed.engine.ray_engine import run_ray

    config = RunConfig("ldp-sgd", env="linear", env_params={"d": 10, "K": 10}, populations=actors,
                       round_size=actors * per_population, users=rounds * actors * per_population)
    options = dict(actors=actors, shards=shards, mode=mode, group_size=group_size(shape, actors),
                   transport="direct" if shape == "direct" else "ray")
    run_ray(config.replace(users=2 * config.round_size), **options)   # warm-up
    started = time.perf_counter()
    s = run_ray(config, **options).summary
    wall = time.perf_counter() - started
    return {"shape": shape, "groups": s["groups"], "actors": actors, "shards": shards, "rounds": rounds,
            "driver_cpu_ms": 1e3 * s["cpu_s_driver"] / rounds,
            "wall_ms": 1e3 * wall / rounds, "actor_cpu_ms": 1e3 * s["cpu_s_populations"] / rounds,
            "shard_cpu_ms": 1e3 * s["cpu_s_shards"] / rounds}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--actors", type=_ints, default=(2, 4, 8, 16, 32, 64))
    parser.add_argument("--shards", type=_ints, default=(1, 4))
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--users-per-population", type=int, default=10)
    parser.add_argument("--mode", default="pre-aggregated", choices=["pre-aggregated", "per-user"])
    parser.add_argument("--shape", type=lambda text: tuple(text.split(",")), default=("flat",),
                        help="flat, tree (groups of ceil(sqrt(actors))) or a group size over Ray calls, or direct "
                             "(flat over sockets); several: flat,tree,direct")
    args = parser.parse_args(argv)
    import ray

    from ldpfed.engine.ray_engine import ensure_ray

    ensure_ray(None, num_cpus=os.cpu_count())
    print(f"coordinator cost per round ({args.mode}, {args.users_per_population} users per population, "
          f"{args.rounds} rounds); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
    rows = []
    try:
        for shape in args.shape:
            for shards in args.shards:
                for actors in args.actors:
                    rows.append(measure(actors, shards, args.rounds, args.users_per_population, args.mode, shape))
                    r = rows[-1]
                    print(f"  {shape:>5} actors {actors:>4} groups {r['groups']:>4} shards {shards:>3}: driver CPU "
                          f"{r['driver_cpu_ms']:7.2f} ms/round, wall {r['wall_ms']:7.2f} ms/round, actors' CPU "
                          f"{r['actor_cpu_ms']:7.2f}, shards' CPU {r['shard_cpu_ms']:6.2f}", flush=True)
    finally:
        ray.shutdown()
    print("\n| shape | actors | groups | shards | driver CPU ms/round | wall ms/round | actors' CPU ms/round | "
          "shards' CPU ms/round |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['shape']} | {r['actors']} | {r['groups']} | {r['shards']} | {r['driver_cpu_ms']:.2f} | "
              f"{r['wall_ms']:.2f} | {r['actor_cpu_ms']:.2f} | {r['shard_cpu_ms']:.2f} |")
    fits = {}
    for shape in args.shape:
        for shards in args.shards:
            part = [r for r in rows if r["shards"] == shards and r["shape"] == shape]
            for over in ("actors", "groups") if shape not in ("flat", "direct") else ("actors",):
                x = np.array([r[over] for r in part], dtype=float)
                if len(set(x)) < 2:
                    continue
                for key in ("driver_cpu_ms", "wall_ms"):
                    b, a = np.polyfit(x, [r[key] for r in part], 1)
                    fits[shape, shards, over, key] = (a, b)
                    print(f"fit, {shape}, {shards} shard(s): {key} = {a:.2f} + {b:.3f} x {over}")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    rate = None
    for shape, over in (("flat", "actors"), ("tree", "groups"), ("direct", "actors")):  # on the fewest shards' fit
        fit = fits.get((shape, min(args.shards), over, "driver_cpu_ms"))
        if fit:
            rate = rate or floor_rate()
            scale_model(shape, min(args.shards), *fit, rate)
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


def scale_model(shape: str, shards: int, a: float, b: float, rate: float, share: float = 0.10) -> None:
    """docs/scaling.md's model: a round costs the coordinator c(A) = a + b A of CPU (flat; a + b ceil(sqrt(A)) for
    the tree, whose driver calls the groups' leaders) and each of A actors B / (A rate) of work; the coordinator
    stays under `share` of the round when c <= share (B / (A rate) + c), i.e. B >= A rate c (1 - share) / share.
    One actor per node. In a tree each leader's calls to its members (as many as the groups, in parallel with the
    other leaders') add to the round's serial path about as much again: not counted here."""
    over = "groups" if shape == "tree" else "actors"
    print(f"\nscale model, {shape}: one process does {rate:,.0f} users/s of ldp-sgd (d = 10, K = 10); coordinator "
          f"{max(a, 0):.2f} + {b:.3f} ms x {over} ({shards} shard(s)); coordinator under {share:.0%} of a round:")
    print("| nodes (one actor each) | coordinator ms/round | smallest round (users) | its wall time (s) |")
    print("|---:|---:|---:|---:|")
    for nodes in (10, 100, 1000):
        calls = -(-nodes // group_size("tree", nodes)) if shape == "tree" else nodes    # the groups, or the actors
        coordinator = 1e-3 * (max(a, 0.0) + b * calls)
        smallest = nodes * rate * coordinator * (1 - share) / share
        print(f"| {nodes:,} | {1e3 * coordinator:,.1f} | {smallest:,.0f} | {smallest / (nodes * rate) + coordinator:.2f} |")


if __name__ == "__main__":
    sys.exit(main())
