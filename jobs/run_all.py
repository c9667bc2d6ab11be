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

from ldpfed import signals
from ldpfed import sweep as sweeps
from ldpfed.algorithms import REGISTRY
from ldpfed.config import PROFILES
from ldpfed.engine import ENGINES, run
from ldpfed.engine.checkpoint import Checkpointer
from ldpfed.errors import ConfigError, describe_error
from ldpfed.signals import Terminated, exit_status, interruptible
from ldpfed.progress import SweepProgress
from ldpfed.tracking import Tracker, TrackingUnavailable, records
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
    parser.add_argument("--resume", nargs="?", const="", default=None, metavar="DIR",
                        help="continue an interrupted sweep in its folder DIR (default: --out/<name>): its finished "
                             "runs are kept, an interrupted run continues from its checkpoint, the rest run; the "
                             "sweep is DIR/sweep.toml (no other option needed)")
    parser.add_argument("--checkpoint-every-s", type=float, default=20.0,
                        help="each run writes a checkpoint at least this often (seconds)")
    return parser, parser.parse_args(argv)


def resume_folder(args) -> Path | None:
    """The folder of the sweep to continue (--resume DIR, or --out/<name> for a bare --resume), or None."""
    if args.resume is None:
        return None
    if args.resume:
        return Path(args.resume)
    sweep, _ = load_sweep(args, resuming=False)
    from ldpfed.tracking.tracker import _slug

    return Path(args.out) / _slug(sweep.name)


def load_sweep(args, resuming: bool = True) -> tuple[sweeps.Sweep, Path]:
    """The sweep file with the command line's overrides applied, validated; and the file it came from. When
    resuming, the sweep as it was run (its folder's sweep.toml)."""
    path = args.sweep or sweeps.SWEEPS_DIR / f"{args.preset}.toml"
    if resuming and args.resume is not None:
        path = resume_folder(args) / "sweep.toml"
        if not path.exists():
            raise ValueError(f"--resume: {path} not found (not the folder of a sweep run by run_all)")
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

    resume_dir = resume_folder(args)
    experiment, out_dir = args.experiment, args.out
    if resume_dir is not None:
        try:
            experiment = records.read_json(resume_dir / "sweep.json").get("experiment") or experiment
        except (OSError, ValueError):
            pass
        out_dir = resume_dir.parent
    # Before any simulation: a tracking server that cannot be reached is reported now, not after an hour.
    try:
        tracker = Tracker(experiment=experiment, tracking_uri=args.tracking_uri, out_dir=out_dir,
                          enabled=not args.no_tracking)
    except TrackingUnavailable as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n(use --no-tracking to keep local results only)\n")

    engine, options = sweep.engine, {}
    ray_started = False
    if engine == "ray":
        from ldpfed.engine.ray_engine import ensure_ray

        ray_started = ensure_ray(args.address)
        options = {"actors": 2, "shards": 2, **sweep.ray}
    try:
        with interruptible():
            return _run_sweep(args, sweep, sweep_file, configs, tracker, engine, options, resume_dir)
    except KeyboardInterrupt as error:
        return exit_status(error)
    finally:
        if ray_started:          # no orphans: the Ray this job started stops with it
            import ray

            ray.shutdown()


def _run_sweep(args, sweep, sweep_file, configs, tracker, engine, options, resume_dir) -> int:
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
    logged = tracker.sweep(sweep.name, params={**sweep.to_dict(), "file": str(sweep_file)},
                           tags={"job": "run_all", "engine": engine}, description=description,
                           files={"sweep.toml": effective}, resume_dir=resume_dir)
    done = logged.finished_keys
    todo = [c for c in configs if records.run_key(records.config_dict(c)) not in done]
    if resume_dir is not None:
        print(f"resuming {logged.local_dir}: {len(configs) - len(todo)} of {len(configs)} runs finished earlier, "
              f"{len(todo)} to run", flush=True)
        for problem in logged.unreadable:
            print(f"  unreadable, run again: {problem}", file=sys.stderr)
    checkpoint_every = args.checkpoint_every_s

    def checkpointer(config):
        return Checkpointer(logged.checkpoint_dir(config), every_s=checkpoint_every)

    bar = SweepProgress(len(configs), label=f"sweep {sweep.name}")
    for _ in range(len(configs) - len(todo)):
        bar.finished("(earlier)", failed=False)
    interrupted, mlflow_lost = None, None
    try:
        with logged:
            def finish(config, result=None, error=None):
                label = _label(config)
                if error is None:
                    logged.log_result(result)
                    spent = logged.checkpoint_dir(config) / "checkpoint.npz"
                    spent.unlink(missing_ok=True)     # the run is finished: its checkpoint is not needed
                else:
                    failures.append((config, error))
                    logged.log_failure(config, error)
                    bar.write(f"FAILED {label}: {error}")
                bar.finished(label, failed=error is not None)

            try:
                if engine == "local" and args.workers > 1:
                    _run_pool(args.workers, todo, engine, options, checkpointer, bar, finish)
                else:
                    for config in todo:
                        bar.started(_label(config))
                        try:
                            result = run(config, engine=engine, checkpointer=checkpointer(config), **options)
                        except Exception as error:
                            traceback.print_exc()
                            finish(config, error=describe_error(error))
                        else:
                            finish(config, result)
            except KeyboardInterrupt as error:
                interrupted = error
                raise
            summary, local_dir = logged.summary, logged.local_dir
    except KeyboardInterrupt:
        bar.close()
        finished = len(logged.finished_keys)
        why = "terminated (SIGTERM)" if isinstance(interrupted, Terminated) else "interrupted"
        print(f"\n{why}: {finished} of {len(configs)} runs finished, {len(logged.failures)} failed; the running "
              f"one kept its checkpoint. Results so far: {logged.local_dir}"
              f"{f'; MLflow parent run {logged.parent_run_id} marked KILLED' if logged.parent_run_id else ''}.\n"
              f"Resume with:  python jobs/run_all.py --resume {logged.local_dir.resolve()}"
              f"{f' --tracking-uri {tracker.display_uri}' if args.tracking_uri else ''}", file=sys.stderr)
        raise
    except TrackingUnavailable as error:    # raised on exit, after every local file is written
        mlflow_lost = error
        summary, local_dir = logged.summary, logged.local_dir
    finally:
        bar.close()
    elapsed = time.perf_counter() - started
    table = markdown_table(summary) if not summary.empty else "(no run finished)"
    print(f"\n{table}\n\n{len(configs) - len(failures)} runs in {elapsed:,.0f} s; results in {local_dir} "
          f"(report/report.html: this table with the plots)")
    if tracker.enabled:
        print(f"\nMLflow: experiment {tracker.experiment!r}, parent run {logged.parent_run_id}, at {tracker.display_uri}")
        if tracker.ui_command():
            print(f"Open the UI:   {tracker.ui_command()}")
        print(f"Sweep's runs:  {tracker.runs_url(logged.parent_run_id)}")
        print(f"Its report:    {tracker.artifact_url(logged.parent_run_id, 'report/report.html')}")
    if mlflow_lost is not None:
        print(f"\n{mlflow_lost}\nWhen MLflow is back, upload what it lacks:  python -m ldpfed sync "
              f"{local_dir.resolve()} --tracking-uri {tracker.display_uri}", file=sys.stderr)
        return 1
    if failures:
        print(f"{len(failures)} runs failed:", *(f"  {_label(c)}: {e}" for c, e in failures), sep="\n",
              file=sys.stderr)
        return 1
    return 0


def _run_pool(workers, configs, engine, options, checkpointer, bar, finish) -> None:
    """The local engine on `workers` processes. On Ctrl-C or SIGTERM the workers are stopped with SIGTERM, which
    each turns into an interrupt: the run it was doing writes its checkpoint."""
    pool = ProcessPoolExecutor(workers, initializer=signals.install)
    try:
        futures = {pool.submit(run, c, engine=engine, checkpointer=checkpointer(c), **options): c for c in configs}
        for config in configs[:workers]:     # the pool starts them in submission order
            bar.started(_label(config))
        waiting = iter(configs[workers:])
        for future in as_completed(futures):
            following = next(waiting, None)
            if following is not None:
                bar.started(_label(following))
            try:
                result = future.result()
            except Exception as error:  # one bad run must not lose the others
                finish(futures[future], error=describe_error(error))
            else:
                finish(futures[future], result)
    except KeyboardInterrupt:
        processes = list((pool._processes or {}).values())   # the pool's own worker processes (ours)
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            if process.is_alive():
                process.terminate()
        for process in processes:
            process.join(timeout=30)
        raise
    pool.shutdown()


def _label(config) -> str:
    private = REGISTRY[config.algorithm].privacy_model != "none"
    return f"{config.algorithm} {config.env}{f' eps={config.eps:g}' if private else ''} seed={config.seed}"


if __name__ == "__main__":
    sys.exit(main())
