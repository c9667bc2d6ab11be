#!/usr/bin/env python
"""Every algorithm of the registry on its paper's setting, sweeping eps and seeds, logged to MLflow.

    python jobs/run_all.py                      # preset "quick" on the Ray engine: a few minutes on 2 cores
    python jobs/run_all.py --preset paper       # the README's regret table (T = 1e5, 10 seeds; long)
    python jobs/run_all.py --address auto       # on a running Ray cluster (e.g. through `ray job submit`)

Each run is one MLflow child run of the sweep's parent run; results are also written under --out. A run that
fails is reported and the sweep goes on; the job then exits with status 1.
"""
from __future__ import annotations

import argparse
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed


from ldpfed.algorithms import REGISTRY
from ldpfed.config import PROFILES, RunConfig
from ldpfed.engine import ENGINES, run
from ldpfed.envs import ENVS
from ldpfed.errors import ConfigError
from ldpfed.progress import Progress
from ldpfed.tracking import Tracker, TrackingUnavailable

PRESETS = {
    # users=None: the algorithm's paper_setting decides.
    "quick": {"users": 10_000, "round_size": 500, "seeds": 2, "eps": [0.5, 2.0], "engine": "ray", "populations": 4},
    "paper": {"users": None, "round_size": 10, "seeds": 10, "eps": [0.5, 1.0, 2.0], "engine": "local",
              "populations": 1},
}


def configs_for(preset: dict, algorithms: list[str], profile: str = "paper") -> list[RunConfig]:
    """One RunConfig per (algorithm, eps, seed), on each algorithm's paper setting; plus uniform play on every
    (env, env_params, users) those settings use that has arms, the reference each algorithm must beat."""
    settings = []
    for name in algorithms:
        setting = dict(REGISTRY[name].paper_setting)
        settings.append((name, REGISTRY[name].default_env, setting.get("env_params", {}),
                         preset["users"] or setting.get("users", 100_000), setting.get("delta", 0.01),
                         setting.get("params", {})))
    if "uniform" in algorithms:
        worlds = {(env, repr(sorted({**ENVS[env].defaults, **env_params}.items())), users): (env, env_params, users)
                  for _, env, env_params, users, _, _ in settings if env in REGISTRY["uniform"].env_kinds}
        settings = [s for s in settings if s[0] != "uniform"]
        settings += [("uniform", env, env_params, users, 0.01, {}) for env, env_params, users in worlds.values()]
    configs = []
    for name, env, env_params, users, delta, params in settings:
        for eps in preset["eps"]:
            for seed in range(preset["seeds"]):
                configs.append(RunConfig(
                    algorithm=name, env=env, users=users, round_size=min(preset["round_size"], users),
                    populations=preset["populations"], eps=eps, delta=delta, seed=seed,
                    env_params=env_params, params=params, profile=profile))
    return configs


def regret_table(summaries: pd.DataFrame) -> str:
    """Markdown: median and spread (25-75% quantiles) of the final regret over seeds, per algorithm and eps."""
    rows = ["| algorithm | env | eps | T | seeds | median final regret | 25%-75% | per user | users/s |",
            "|---|---|---|---|---|---|---|---|---|"]
    grouped = summaries.groupby(["algorithm", "env", "eps"], sort=True)
    for (algorithm, env, eps), group in grouped:
        regret = group["final_regret"]
        users = int(group["users"].iloc[0])
        rows.append(f"| {algorithm} | {env} | {eps:g} | {users:,} | {len(group)} | {regret.median():,.1f} | "
                    f"{regret.quantile(0.25):,.1f} - {regret.quantile(0.75):,.1f} | "
                    f"{regret.median() / users:.4f} | {group['users_per_s'].median():,.0f} |")
    return "\n".join(rows)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="quick")
    parser.add_argument("--algorithms", default=None, help="comma-separated names (default: every algorithm)")
    parser.add_argument("--users", type=int, default=None, help="override the preset's users per run")
    parser.add_argument("--round-size", type=int, default=None)
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--eps", default=None, help="comma-separated eps values")
    parser.add_argument("--engine", choices=ENGINES, default=None)
    parser.add_argument("--profile", choices=PROFILES, default="paper",
                        help="paper (default) or authors-code: the public reference code's choices")
    parser.add_argument("--actors", type=int, default=2, help="population actors per run (ray)")
    parser.add_argument("--shards", type=int, default=2, help="server shard actors per run (ray)")
    parser.add_argument("--address", default=None, help="Ray cluster address (default: a local Ray instance)")
    parser.add_argument("--workers", type=int, default=1, help="parallel processes for the local engine")
    parser.add_argument("--tracking-uri", default=None, help="MLflow server (default: MLFLOW_TRACKING_URI or ./mlflow.db)")
    parser.add_argument("--experiment", default="run_all")
    parser.add_argument("--out", default="results/run_all", help="local copy of every result")
    parser.add_argument("--no-tracking", action="store_true", help="local results only")
    return parser, parser.parse_args(argv)


def main(argv=None) -> int:
    parser, args = parse_args(argv)
    preset = dict(PRESETS[args.preset])
    for key in ("users", "round_size", "seeds", "engine"):
        if getattr(args, key) is not None:
            preset[key] = getattr(args, key)
    try:
        if args.eps is not None:
            preset["eps"] = [float(e) for e in args.eps.split(",")]
        names = sorted(REGISTRY) if args.algorithms is None else [n.strip() for n in args.algorithms.split(",")]
        for name in names:
            if name not in REGISTRY:
                raise ConfigError("--algorithms", name, f"unknown; choose from {sorted(REGISTRY)}")
        configs = configs_for(preset, names, args.profile)
    except (ValueError, ConfigError) as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")

    # Before any simulation: a tracking server that cannot be reached is reported now, not after an hour.
    try:
        tracker = Tracker(experiment=args.experiment, tracking_uri=args.tracking_uri, out_dir=args.out,
                          enabled=not args.no_tracking)
    except TrackingUnavailable as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n(use --no-tracking to keep local results only)\n")

    engine = preset["engine"]
    options = {}
    if engine == "ray":
        from ldpfed.engine.ray_engine import ensure_ray

        ensure_ray(args.address)
        options = {"actors": args.actors, "shards": args.shards}
    total_users = sum(c.users for c in configs)
    print(f"run_all: {len(names)} algorithms, {len(configs)} runs, {total_users:,} users, engine {engine}",
          flush=True)
    progress = Progress(total_users, label="run_all")
    done_users, failures, started = 0, [], time.perf_counter()
    params = {"preset": args.preset, **preset, "algorithms": ",".join(names), "profile": args.profile}
    with tracker.sweep(args.preset, params=params, tags={"job": "run_all", "engine": engine}) as sweep:
        def finish(config, result=None, error=None):
            nonlocal done_users
            done_users += config.users
            if error is None:
                sweep.log_result(result)
            else:
                failures.append((config, error))
                sweep.log_failure(config, error)
                print(f"\nFAILED {config.algorithm} eps={config.eps} seed={config.seed}: {error}", file=sys.stderr)
            progress(done_users)

        if engine == "local" and args.workers > 1:
            with ProcessPoolExecutor(args.workers) as pool:
                futures = {pool.submit(run, c, engine=engine, **options): c for c in configs}
                for future in as_completed(futures):
                    try:
                        finish(futures[future], future.result())
                    except Exception as error:  # one bad run must not lose the others
                        finish(futures[future], error=repr(error))
        else:
            for config in configs:
                try:
                    finish(config, run(config, engine=engine, **options))
                except Exception as error:
                    traceback.print_exc()
                    finish(config, error=repr(error))
        summaries, local_dir = sweep.summary, sweep.local_dir
    elapsed = time.perf_counter() - started
    table = regret_table(summaries) if not summaries.empty else "(no run finished)"
    (local_dir / "regret_table.md").write_text(table + "\n")
    print(f"\n{table}\n\n{len(configs) - len(failures)} runs in {elapsed:,.0f} s; results in {local_dir}")
    if not args.no_tracking:
        print(f"MLflow: experiment '{args.experiment}' at {tracker.tracking_uri}")
    if failures:
        print(f"{len(failures)} runs failed:", *(f"  {c.algorithm} eps={c.eps} seed={c.seed}: {e}"
                                                 for c, e in failures), sep="\n", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
