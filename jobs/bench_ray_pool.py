#!/usr/bin/env python3
"""What a Ray-engine sweep of short runs costs with and without the held placement group's warm actors.

    python jobs/bench_ray_pool.py                 # 14 runs of the quick preset: six algorithms, seeds 0-1, eps 1
    python jobs/bench_ray_pool.py --algorithms ldp-ols,uniform --seeds 0-3

The same sweep twice on one local Ray (local results only, no MLflow), in the order given by --order: "pooled",
as shipped (a run that ends well hands its placement group, with its actors idle in their bundles, to the next run
of the same shape), and "fresh", where every run ends its actors and removes its group (what a placement group per
run costs without the pool). The runs must be the same bit for bit both ways: the job checks it. Printed: each
way's wall time, the runs' own time (their elapsed_s, summed) and the ratio.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def one_sweep(args, out: Path, pooled: bool):
    import ldpfed
    from ldpfed.engine import ray_placement

    keep = ray_placement.IdleActors.give_back_group
    if not pooled:    # the run's group ends with it: what the pool saves is every run's actor processes
        ray_placement.IdleActors.give_back_group = lambda pool, shape, reservation: reservation.end()
    try:
        started = time.perf_counter()
        result = ldpfed.sweep("quick", algorithms=args.algorithms, seeds=args.seeds, eps=args.eps, engine="ray",
                              name="pooled" if pooled else "fresh", tracking=False, out=str(out), progress=False,
                              verbose=False)
        return result, time.perf_counter() - started
    finally:
        ray_placement.IdleActors.give_back_group = keep


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithms", default="ldp-sgd,ldp-ols,uniform,ols,ldp-ucb,linucb-dgs")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--eps", default="1")
    parser.add_argument("--order", default="pooled,fresh", help="which way runs first (the Ray start is outside)")
    args = parser.parse_args(argv)
    import ray

    from ldpfed.engine.ray_engine import IDLE_ACTORS, ensure_ray

    ensure_ray(None)
    results, times = {}, {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for way in args.order.split(","):
                IDLE_ACTORS.clear()
                results[way], times[way] = one_sweep(args, Path(tmp), pooled=way == "pooled")
    finally:
        ray.shutdown()
    pooled, fresh = (results[way].table.set_index("key").sort_index() for way in ("pooled", "fresh"))
    same = list(pooled.index) == list(fresh.index) and pooled["final_regret"].equals(fresh["final_regret"])
    n = len(results["pooled"].table)
    print(f"{n} Ray-engine runs ({args.algorithms}; seeds {args.seeds}; eps {args.eps}), one local Ray")
    for way in args.order.split(","):
        own = results[way].table["elapsed_s"].sum()
        print(f"  {way:6s}  {times[way]:7.1f} s wall  ({n / times[way]:.2f} runs/s; runs' own time {own:.1f} s)")
    print(f"  fresh / pooled: {times['fresh'] / times['pooled']:.1f}x;  same runs bit for bit: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
