#!/usr/bin/env python3
"""What a run costs before it simulates anyone: numba's compile, with the compile cache cold, warm, and in-process.

    python jobs/bench_compile.py                                   # every registered algorithm, T = 10,000, B = 1
    python jobs/bench_compile.py --algorithms ldp-sgd,ldp-gloc --round-size 100
    python jobs/bench_compile.py --code /tmp/before                 # another checkout (PYTHONPATH), e.g. the code
                                                                    #   before the compile cache, for comparison

Per algorithm (on its default env: `python -m ldpfed run ALGORITHM`'s default setting), three fresh subprocesses
share one empty folder as NUMBA_CACHE_DIR (so numba's cache of the steps and ldpfed's of the loops, LDPFED_CACHE_DIR
being unset, both start empty, as on a new machine):
  * cold: the first process's first run (everything compiled);
  * fresh: the second process's first run, from the warm cache, and warm: its second run of the same config
    (nothing left to compile or load);
  * set-up, then first: the third process first pays what any process pays once, whatever it runs (numba's own
    set-up, done on its first compile or cache load, and the import of dp_accounting, which a private run's first
    privacy summary makes), then the algorithm's first run: what each further algorithm costs a sweep worker, a test
    worker or a Ray actor.
Each time is the wall time of `engine.run(config)` alone (the imports before it are not counted); (cmp) is the run's
summary compile_s, numba's time compiling or loading compiled code during the run (the code before the compile cache
has none: "-"). excess: first run (set up) minus warm; fresh: the fresh process's first run minus warm. The target:
excess within 0.5 s.
Subprocesses run one at a time. On a shared machine wall times move: compare rows of one run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 0.5

PROBE = """
import json, sys, time
t0 = time.perf_counter()
from ldpfed.config import RunConfig
from ldpfed.engine import run
imported = time.perf_counter() - t0
algorithm, users, round_size, set_up, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:6]
repeats = int(repeats)
setting_up = None
if set_up == "yes":     # what any process pays once, whatever it runs: numba's set-up, the accountant's imports
    t = time.perf_counter()
    import numba
    import dp_accounting  # noqa: F401  (imported by ldpfed.mechanisms.accounting on a private run's first summary)
    numba.njit(lambda x: x + 1)(1)
    setting_up = time.perf_counter() - t
config = RunConfig(algorithm, users=users, round_size=round_size)
times = []
for _ in range(repeats):
    t = time.perf_counter()
    result = run(config)
    times.append((time.perf_counter() - t, result.summary.get("compile_s"), result.summary["users_per_s"]))
print(json.dumps({"env": result.config.env, "engine": result.summary["engine"], "import": imported,
                  "set_up": setting_up, "runs": times}))
"""
LISTING = "from ldpfed.algorithms import REGISTRY; print(*sorted(REGISTRY))"


def probe(algorithm: str, users: int, round_size: int, cache: Path, code: Path, set_up: bool = False,
          repeats: int = 2) -> dict:
    env = {key: value for key, value in os.environ.items() if key != "LDPFED_CACHE_DIR"}
    env.update({"NUMBA_CACHE_DIR": str(cache), "PYTHONPATH": str(code)})
    done = subprocess.run([sys.executable, "-c", PROBE, algorithm, str(users), str(round_size),
                           "yes" if set_up else "no", str(repeats)], env=env, cwd=code, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{algorithm}: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else '?'}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def seconds(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithms", default="all", help="comma-separated names, or all (every registered one)")
    parser.add_argument("--users", type=lambda x: int(float(x)), default=10_000)
    parser.add_argument("--round-size", type=int, default=1)
    parser.add_argument("--code", type=Path, default=ROOT, help="the checkout to measure (its folder on PYTHONPATH)")
    parser.add_argument("--markdown", action="store_true", help="also print the table as Markdown")
    args = parser.parse_args(argv)
    if args.algorithms == "all":
        listing = subprocess.run([sys.executable, "-c", LISTING],
                                 env={**os.environ, "PYTHONPATH": str(args.code)}, cwd=args.code, capture_output=True,
                                 text=True, check=True)
        names = listing.stdout.split()
    else:
        names = [name for name in args.algorithms.split(",") if name]
    print(f"code: {args.code}; T = {args.users:,}, B = {args.round_size}; {os.cpu_count()} CPUs, load average "
          f"{'%.1f %.1f %.1f' % os.getloadavg()} (shared with other work: wall times move)")
    header = (f"{'algorithm':<20} {'env':<34} {'cold':>6} {'(cmp)':>5}  {'fresh':>5} {'(cmp)':>5}  {'set-up':>6} "
              f"{'+first':>6} {'(cmp)':>5}  {'warm':>5}  {'excess':>6} {'fresh':>5}  target")
    print(header, flush=True)
    rows, met, started = [], 0, time.perf_counter()
    for name in names:
        with tempfile.TemporaryDirectory(prefix="bench-compile-") as cache:
            try:
                cold = probe(name, args.users, args.round_size, Path(cache), args.code)
                fresh = probe(name, args.users, args.round_size, Path(cache), args.code)
                primed = probe(name, args.users, args.round_size, Path(cache), args.code, set_up=True, repeats=1)
            except RuntimeError as error:
                print(f"{name:<20} failed: {error}", flush=True)
                continue
        (c_wall, c_compile, _), _ = cold["runs"]
        (f_wall, f_compile, _), (h_wall, _, _) = fresh["runs"]
        ((p_wall, p_compile, _),) = primed["runs"]
        excess, fresh_excess = p_wall - h_wall, f_wall - h_wall
        ok = excess <= TARGET_S
        met += ok
        env = f"{cold['env']} ({fresh['engine']})"
        print(f"{name:<20} {env:<34} {c_wall:>6.2f} {seconds(c_compile):>5}  {f_wall:>5.2f} {seconds(f_compile):>5}  "
              f"{primed['set_up']:>6.2f} {p_wall:>6.2f} {seconds(p_compile):>5}  {h_wall:>5.3f}  {excess:>6.2f} "
              f"{fresh_excess:>5.2f}  {'met' if ok else 'MISSED'}", flush=True)
        rows.append([f"`{name}`", cold["env"], f"{c_wall:.2f}", seconds(c_compile), f"{f_wall:.2f}",
                     seconds(f_compile), f"{primed['set_up']:.2f}", f"{p_wall:.2f}", f"{h_wall:.3f}",
                     f"{excess:.2f}", f"{fresh_excess:.2f}", "met" if ok else "missed"])
    print(f"target (a second process's first run of the algorithm within {TARGET_S} s of the warm run, the process "
          f"set up): met by {met} of {len(rows)}; {time.perf_counter() - started:.0f} s; load average at the end "
          f"{'%.1f %.1f %.1f' % os.getloadavg()}")
    if args.markdown:
        print("\n| algorithm | env | cold: first run s | (compile s) | warm cache, fresh process: first run s | "
              "(compile s) | process set-up s | then the first run s | warm run s | excess s | excess, fresh s | "
              "target |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
