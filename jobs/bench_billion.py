#!/usr/bin/env python3
"""A billion users in one run: ldp-sgd (d = 10, K = 10) through the Ray engine on this machine.

    python jobs/bench_billion.py                    # 1e9 users, rounds of 1e5, 2 population actors, 1 shard
    python jobs/bench_billion.py --users 1e8        # a tenth of it
    python jobs/bench_billion.py --resume           # continue from the last checkpoint (results/billion/)

While it runs: the standard progress display (users/s and ETA) and a checkpoint every --checkpoint-every-s
seconds into --out; Ctrl-C writes one too, so `--resume` continues where it stopped, bit for bit. At --mark users
(1e8) and at the end it reads the peak RSS (VmHWM) of the driver, every population actor and every shard: memory is
flat when the two readings agree to within a few MB (only the per-round table grows: ~0.5 kB a round). The
peaks are read from /proc, so the actors must run on this machine (the local Ray this job starts).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from ldpfed.config import RunConfig
from ldpfed.engine.checkpoint import Checkpointer
from ldpfed.engine.driver import drive
from ldpfed.engine.ray_engine import RayBackend, ensure_ray
from ldpfed.util.progress import Progress

MB = 2**20


def peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), bytes."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")


def peaks(backend: RayBackend) -> dict:
    pids = backend.pids()
    return {"driver": peak_rss(os.getpid()), "populations": max(peak_rss(p) for p in pids["population"]),
            "shards": max(peak_rss(p) for p in pids["shard"])}


def show(label: str, reading: dict) -> str:
    return f"{label}: peak RSS driver {reading['driver'] / MB:,.1f} MB, population actors " \
           f"{reading['populations'] / MB:,.1f} MB, shards {reading['shards'] / MB:,.1f} MB"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    number = lambda text: int(float(text))   # noqa: E731
    parser.add_argument("--users", type=number, default=10**9)
    parser.add_argument("--round-size", type=number, default=100_000)
    parser.add_argument("--populations", type=int, default=8)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--mark", type=number, default=10**8, help="read the peaks also when the run passes this")
    parser.add_argument("--out", type=Path, default=Path("results/billion"))
    parser.add_argument("--checkpoint-every-s", type=float, default=180.0)
    parser.add_argument("--resume", action="store_true", help="continue from --out's checkpoint")
    args = parser.parse_args(argv)
    config = RunConfig("ldp-sgd", env="linear", users=args.users, round_size=args.round_size,
                       populations=args.populations, env_params={"d": 10, "K": 10})
    checkpointer = Checkpointer(args.out / "checkpoint", every_s=args.checkpoint_every_s)
    checkpointer.check_writable()
    if checkpointer.path.exists() and not args.resume:
        print(f"{checkpointer.path} exists: --resume to continue that run, or delete it to start again",
              file=sys.stderr)
        return 2
    print(f"{config.users:,} users of {config.algorithm} (d = 10, K = 10) in {config.rounds:,} rounds of "
          f"{config.round_size:,}; {args.actors} population actors, {args.shards} shard(s); {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    backend = RayBackend(args.actors, args.shards)
    bar = Progress(config.users, label="billion")
    readings, calls = {}, []

    def progress(done, regret):
        bar(done, regret)
        calls.append(done)      # the first call comes before the actors start (the run's clock starts there)
        if len(calls) > 1 and done >= args.mark and "mark" not in readings and done < config.users:
            readings["mark"] = (done, peaks(backend))

    started = ensure_ray(None, log_to_driver=False)
    wall = time.perf_counter()
    ok = False
    try:
        result = drive(config, backend, progress=progress, checkpointer=checkpointer)
        readings["end"] = (config.users, peaks(backend))
        ok = True
    finally:
        bar.close()
        backend.release(reuse=False)
        if started:
            import ray
            ray.shutdown()
    wall = time.perf_counter() - wall
    s = result.summary
    resumed = s.get("resumed_from_round", 0)
    print(f"{config.users - resumed * config.round_size:,} users in {wall / 60:.1f} min ({s['users_per_s']:,.0f} "
          f"users/s){f', resumed from round {resumed:,}' if resumed else ''}; {s['checkpoints_written']} "
          f"checkpoints, {s['checkpoint_write_s']:.1f} s writing them; final regret {s['final_regret']:,.1f}")
    for label, (users, reading) in sorted(readings.items(), key=lambda item: item[1][0]):
        print(show(f"at {users:,} users", reading))
    if "mark" in readings:
        growth = max(readings["end"][1][k] - readings["mark"][1][k] for k in readings["end"][1])
        print(f"peak RSS growth from {readings['mark'][0]:,} to {config.users:,} users: {growth / MB:,.1f} MB "
              f"(largest over driver, population actors, shards)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
