#!/usr/bin/env python
"""Fault drill: inject each fault into a real run and measure the time to detect it and to recover.

    python jobs/fault_drill.py                       # ldp-ols, d=10, K=10, 2e5 users in rounds of 2,000
    python jobs/fault_drill.py --users 2000000       # the issue's size

Scenarios (each run is compared, table bit for bit, with an undisturbed run of the same config):
* population actor SIGKILLed, shard actor SIGKILLed (Ray engine, 2 actors, 2 shards): detect = from the kill to
  the engine noticing; recover = from then to the recreated actor being ready (the round is then redone).
* actor frozen with SIGSTOP (SIGCONT later), default timeout (10x the slowest recent round, >= 5 s) or
  --round-timeout: detect = from the SIGSTOP to the timeout firing.
* driver SIGKILLed (a subprocess running `python -m ldpfed run --checkpoint-dir`): detect is whoever restarts
  it; recover = from the restart to the resumed run passing the round it was killed at; lost = rounds redone.
Only processes this job started are ever signalled (the actors of its own Ray, by the pids the engine reports).
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ldpfed.config import RunConfig  # noqa: E402
from ldpfed.engine import run_local  # noqa: E402


def actor_fault(config, kind: str, how: str, at_round: int, options: dict) -> dict:
    from ldpfed.engine.driver import drive
    from ldpfed.engine.ray_engine import RayBackend

    backend = RayBackend(**options)
    injected = {}
    at_users = (at_round + 1) * config.round_size

    def progress(done, regret):
        if done == at_users and not injected:
            pid = backend.pids()[kind][0]
            injected["at"] = time.time()
            os.kill(pid, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
            injected["pid"] = pid
            if how == "freeze":
                def thaw():
                    try:
                        os.kill(pid, signal.SIGCONT)
                    except ProcessLookupError:
                        pass
                threading.Timer(60.0, thaw).start()

    started = time.perf_counter()
    try:
        result = drive(config, backend, progress=progress)
    finally:
        backend.release(reuse=False)
    events = result.summary["recovery_events"]
    first = events[0] if events else None
    return {"result": result, "wall_s": time.perf_counter() - started, "recoveries": len(events),
            "detect_s": None if first is None else first["detected_at"] - injected["at"],
            "recover_s": None if first is None else first["recover_s"],
            "redo_rounds": len(events)}


def driver_kill(config, at_round: int, every_s: float) -> dict:
    work = Path(tempfile.mkdtemp(prefix="ldpfed-drill-"))
    cmd = [sys.executable, "-m", "ldpfed", "run", config.algorithm, "--env", config.env, "--users", str(config.users),
           "--round-size", str(config.round_size), "--populations", str(config.populations), "--seed",
           str(config.seed), "--quiet", "--out", str(work / "out"), "--checkpoint-every-s", str(every_s)]
    for key, value in config.env_params.items():
        cmd += ["--env-param", f"{key}={value}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LDPFED_PROGRESS_ROUNDS": "1"}
    child = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    checkpoint = work / "out" / "checkpoint" / "checkpoint.npz"
    from ldpfed.engine.checkpoint import load
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:    # kill it once a checkpoint at or past `at_round` exists
        time.sleep(0.2)
        try:
            if checkpoint.exists() and load(checkpoint)["next_round"] >= at_round:
                break
        except Exception:
            pass
        if child.poll() is not None:
            break
    killed_at = load(checkpoint)["next_round"] if checkpoint.exists() else 0
    child.send_signal(signal.SIGKILL)
    child.wait()
    restarted = time.perf_counter()
    subprocess.run(cmd + ["--resume"], env=env, check=True, stdout=subprocess.DEVNULL, timeout=1800)
    total = time.perf_counter() - restarted
    table = pd.read_parquet(work / "out" / "results.parquet")
    return {"table": table, "recover_s": total, "resumed_from": killed_at, "wall_s": total}


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
    parser.add_argument("--skip-driver", action="store_true")
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
        for name, kind, how in (("population actor killed", "population", "kill"),
                                ("shard actor killed", "shard", "kill"),
                                ("population actor frozen", "population", "freeze"),
                                ("shard actor frozen", "shard", "freeze")):
            out = actor_fault(config, kind, how, at_round, options)
            same = out["result"].table.equals(reference.table)
            rows.append((name, out["detect_s"], out["recover_s"], out["wall_s"], same))
            print(f"  {name}: detected in {out['detect_s']:.2f} s, recovered in {out['recover_s']:.2f} s "
                  f"(+ the round redone), run {out['wall_s']:.1f} s, identical table: {same}", flush=True)
    finally:
        ray.shutdown()
    if not args.skip_driver:
        out = driver_kill(config, at_round, every_s=2.0)
        same = out["table"].equals(reference.table)
        rows.append(("driver killed (resume)", None, out["recover_s"], out["wall_s"], same))
        print(f"  driver killed at checkpoint round {out['resumed_from']}: resumed run took {out['recover_s']:.1f} s, "
              f"identical table: {same}", flush=True)
    print("\n| scenario | time to detect (s) | time to recover (s) | run wall (s) | identical to undisturbed |")
    print("|---|---|---|---|---|")
    for name, detect, recover, wall, same in rows:
        d = "-" if detect is None else f"{detect:.2f}"
        print(f"| {name} | {d} | {recover:.2f} | {wall:.1f} | {same} |")
    return 0 if all(row[-1] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
