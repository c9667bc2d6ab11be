#!/usr/bin/env python
"""Run a sweep (algorithms x envs x eps x seeds, from a TOML sweep file) and log it to MLflow.

    python jobs/run_all.py                                   # jobs/sweeps/quick.toml: every algorithm, a few minutes
    python jobs/run_all.py --sweep jobs/sweeps/example.toml  # a custom sweep (see ldpfed/sweep.py for the keys)
    python jobs/run_all.py --algorithms ldp-sgd,uniform --eps 0.5,1 --seeds 0-4 --name sgd-vs-uniform
    python jobs/run_all.py --address auto                    # on a running Ray cluster (e.g. `ray job submit`)

Options given on the command line override the sweep file's keys; the sweep as run is written to the results
folder and the MLflow parent run as `sweep.toml` (rerun it with --sweep). A sweep with overrides but no --name is
named "custom". Each run is one MLflow child run of the sweep's parent run; results are also written under
--out/<name> (a free folder: an earlier sweep's folder is never moved or overwritten; a rerun of the same name
goes to <name>-2, ...). A run that fails is reported and the sweep goes on; the job then exits with status 1.
It ends by printing the results table, the command that opens the MLflow UI and a link to the sweep's runs.
"""
from __future__ import annotations

import argparse
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from ldpfed import sweep as sweeps
from ldpfed.algorithms import REGISTRY
from ldpfed.config import PROFILES
from ldpfed.engine import ENGINES, run
from ldpfed.errors import ConfigError
from ldpfed.progress import SweepProgress
from ldpfed.tracking import Tracker, TrackingUnavailable
from ldpfed.tracking.report import markdown_table

# Command-line options that override a key of the sweep file: (option dest, sweep key, parser of the text).
OVERRIDES = [("algorithms", "algorithms", None), ("envs", "envs", None), ("eps", "eps", sweeps.parse_eps),
             ("seeds", "seeds", sweeps.parse_seeds), ("users", "users", int), ("round_size", "round_size", int),
             ("populations", "populations", int), ("delta", "delta", float), ("engine", "engine", None),
             ("profile", "profile", None)]


class _Help(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The docstring as written, and each option's default where it has one (the help says what None means)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=_Help)
    parser.add_argument("--sweep", type=Path, default=None,
                        help="sweep file (TOML); default: jobs/sweeps/<preset>.toml")
    parser.add_argument("--preset", choices=sorted(p.stem for p in sweeps.SWEEPS_DIR.glob("*.toml")),
                        default="quick", help="a sweep file of jobs/sweeps/ by name (when --sweep is not given)")
    parser.add_argument("--name", default=None,
                        help="the sweep's name (MLflow parent run, results folder); default: the file's, or "
                             "'custom' when options override the file")
    over = parser.add_argument_group("overrides of the sweep file's keys (default: the file's value)")
    over.add_argument("--algorithms", default=None, help="comma-separated names, or 'all'")
    over.add_argument("--envs", default=None, help="comma-separated envs, or 'paper' (each algorithm's own)")
    over.add_argument("--eps", default=None, help="comma-separated eps values (private algorithms)")
    over.add_argument("--seeds", default=None, help="comma-separated seeds, or an inclusive range such as 0-9")
    over.add_argument("--users", default=None, help="users per run (default of the file: the paper setting)")
    over.add_argument("--round-size", default=None, help="users per round")
    over.add_argument("--populations", default=None, help="populations per run")
    over.add_argument("--delta", default=None, help="delta of every run (default of the file: the paper setting)")
    over.add_argument("--engine", choices=ENGINES, default=None, help="engine")
    over.add_argument("--profile", choices=PROFILES, default=None,
                      help="paper: the papers' text; authors-code: the public reference code's choices")
    parser.add_argument("--actors", type=int, default=None, help="population actors per run (ray; file: [ray])")
    parser.add_argument("--shards", type=int, default=None, help="server shard actors per run (ray; file: [ray])")
    parser.add_argument("--address", default=None, help="Ray cluster address (default: a new local Ray instance)")
    parser.add_argument("--workers", type=int, default=1, help="parallel processes for the local engine")
    parser.add_argument("--tracking-uri", default=None,
                        help="MLflow store (default: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here)")
    parser.add_argument("--experiment", default="run_all", help="MLflow experiment")
    parser.add_argument("--out", default="results/run_all", help="local copy of every result")
    parser.add_argument("--no-tracking", action="store_true", help="local results only, no MLflow")
    return parser, parser.parse_args(argv)


def load_sweep(args) -> tuple[sweeps.Sweep, Path]:
    """The sweep file with the command line's overrides applied, validated; and the file it came from."""
    path = args.sweep or sweeps.SWEEPS_DIR / f"{args.preset}.toml"
    data = sweeps.read(path)
    overridden = False
    for dest, key, convert in OVERRIDES:
        text = getattr(args, dest)
        if text is None:
            continue
        option = "--" + dest.replace("_", "-")
        try:
            data[key] = convert(text) if convert is not None else text
        except ValueError:
            raise ConfigError(option, text, "not a valid value") from None
        overridden = True
    ray = dict(data.get("ray", {}))
    for key in ("actors", "shards"):
        if getattr(args, key) is not None:
            ray[key] = getattr(args, key)
    data["ray"] = ray
    if args.name is not None:
        data["name"] = args.name
    elif overridden:
        data["name"] = "custom"
    return sweeps.build(data, source=str(path)), path


def main(argv=None) -> int:
    parser, args = parse_args(argv)
    try:
        sweep, sweep_file = load_sweep(args)
        configs = sweeps.configs(sweep)
    except (ValueError, ConfigError) as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    if not configs:
        parser.exit(2, f"{parser.prog}: error: the sweep has no run (no algorithm supports the listed envs)\n")

    # Before any simulation: a tracking server that cannot be reached is reported now, not after an hour.
    try:
        tracker = Tracker(experiment=args.experiment, tracking_uri=args.tracking_uri, out_dir=args.out,
                          enabled=not args.no_tracking)
    except TrackingUnavailable as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n(use --no-tracking to keep local results only)\n")

    engine, options = sweep.engine, {}
    if engine == "ray":
        from ldpfed.engine.ray_engine import ensure_ray

        ensure_ray(args.address)
        options = {"actors": 2, "shards": 2, **sweep.ray}
    algorithms = sorted({c.algorithm for c in configs})
    print(f"run_all: sweep {sweep.name!r}, {len(algorithms)} algorithms, {len(configs)} runs, "
          f"{sum(c.users for c in configs):,} users, engine {engine}", flush=True)
    effective = (f"# the sweep as run (from {sweep_file.name}, with the command line's overrides)\n"
                 + sweeps.to_toml(sweep))
    description = (f"{sweep.description or 'Sweep ' + sweep.name}\n\nFrom `{sweep_file.name}`: "
                   f"{len(configs)} runs of {len(algorithms)} algorithms, eps {', '.join(f'{e:g}' for e in sweep.eps)} "
                   f"(private algorithms; non-private ones once per seed), seeds "
                   f"{', '.join(map(str, sweep.seeds))}, engine {engine}. Rerun: "
                   f"`python jobs/run_all.py --sweep sweep.toml` with this run's sweep.toml artifact.")
    failures, started = [], time.perf_counter()
    bar = SweepProgress(len(configs), label=f"sweep {sweep.name}")
    try:
        with tracker.sweep(sweep.name, params={**sweep.to_dict(), "file": str(sweep_file)},
                           tags={"job": "run_all", "engine": engine}, description=description,
                           files={"sweep.toml": effective}) as logged:
            def finish(config, result=None, error=None):
                label = _label(config)
                if error is None:
                    logged.log_result(result)
                else:
                    failures.append((config, error))
                    logged.log_failure(config, error)
                    bar.write(f"FAILED {label}: {error}")
                bar.finished(label, failed=error is not None)

            if engine == "local" and args.workers > 1:
                with ProcessPoolExecutor(args.workers) as pool:
                    futures = {pool.submit(run, c, engine=engine, **options): c for c in configs}
                    for config in configs[:args.workers]:     # the pool starts them in submission order
                        bar.started(_label(config))
                    waiting = iter(configs[args.workers:])
                    for future in as_completed(futures):
                        following = next(waiting, None)
                        if following is not None:
                            bar.started(_label(following))
                        try:
                            finish(futures[future], future.result())
                        except Exception as error:  # one bad run must not lose the others
                            finish(futures[future], error=repr(error))
            else:
                for config in configs:
                    bar.started(_label(config))
                    try:
                        finish(config, run(config, engine=engine, **options))
                    except Exception as error:
                        traceback.print_exc()
                        finish(config, error=repr(error))
            summary, local_dir = logged.summary, logged.local_dir
    finally:
        bar.close()
    elapsed = time.perf_counter() - started
    table = markdown_table(summary) if not summary.empty else "(no run finished)"
    print(f"\n{table}\n\n{len(configs) - len(failures)} runs in {elapsed:,.0f} s; results in {local_dir} "
          f"(report/report.html: this table with the plots)")
    if tracker.enabled:
        print(f"\nMLflow: experiment {args.experiment!r}, parent run {logged.parent_run_id}, at {tracker.display_uri}")
        if tracker.ui_command():
            print(f"Open the UI:   {tracker.ui_command()}")
        print(f"Sweep's runs:  {tracker.runs_url(logged.parent_run_id)}")
        print(f"Its report:    {tracker.artifact_url(logged.parent_run_id, 'report/report.html')}")
    if failures:
        print(f"{len(failures)} runs failed:", *(f"  {_label(c)}: {e}" for c, e in failures), sep="\n",
              file=sys.stderr)
        return 1
    return 0


def _label(config) -> str:
    private = REGISTRY[config.algorithm].privacy_model != "none"
    return f"{config.algorithm} {config.env}{f' eps={config.eps:g}' if private else ''} seed={config.seed}"


if __name__ == "__main__":
    sys.exit(main())
