"""Runs a sweep and logs it: every run of a sweep (ldpfed/sweep.py) on the chosen engine, each logged as it ends
(the local folder first, then MLflow), a failing run reported without stopping the others, Ctrl-C or SIGTERM
leaving a sweep that `--resume` continues. `python -m ldpfed sweep` and `jobs/run_all.py` both run through here:
`sweep.add_arguments` gives them the same options, `main` the same behaviour; only their command lines differ (`Job`).
"""
from __future__ import annotations

import shlex
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass

from ldpfed import signals
from ldpfed import sweep as sweeps
from ldpfed.algorithms import REGISTRY
from ldpfed.engine import run
from ldpfed.engine.checkpoint import Checkpointer
from ldpfed.errors import ConfigError, describe_error
from ldpfed.progress import SweepProgress
from ldpfed.signals import Terminated, exit_status, interruptible
from ldpfed.tracking import Tracker, TrackingUnavailable, records
from ldpfed.tracking.report import markdown_table


@dataclass(frozen=True)
class Job:
    """Who runs the sweep, as its messages name it: `name` (the first line, the MLflow tag `job`), `command` (what
    to type to resume it) and `rerun` (what reruns the sweep from its saved sweep.toml)."""
    name: str
    command: str
    rerun: str


def main(parser, args, path, job: Job) -> int:
    """Run the sweep of file `path` as the parsed command line `args` says; bad input exits 2 through `parser`.
    Returns the exit status: 0, 1 when a run failed or MLflow was lost, 130/143 when interrupted."""
    try:
        sweep, sweep_file = sweeps.from_args(args, path)
        configs = sweeps.configs(sweep)
    except (ValueError, ConfigError) as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    if not configs:
        parser.exit(2, f"{parser.prog}: error: the sweep has no run (no algorithm supports the listed envs)\n")

    resume_dir = sweeps.resume_folder(args, path)
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
            return run_sweep(args, sweep, sweep_file, configs, tracker, engine, options, resume_dir, job)
    except KeyboardInterrupt as error:
        return exit_status(error)
    finally:
        if ray_started:          # no orphans: the Ray this job started stops with it
            import ray

            ray.shutdown()


def run_sweep(args, sweep, sweep_file, configs, tracker, engine, options, resume_dir, job: Job) -> int:
    algorithms = sorted({c.algorithm for c in configs})
    print(f"{job.name}: sweep {sweep.name!r}, {len(algorithms)} algorithms, {len(configs)} runs, "
          f"{sum(c.users for c in configs):,} users, engine {engine}", flush=True)
    effective = (f"# the sweep as run (from {sweep_file.name}, with the command line's overrides)\n"
                 + sweeps.to_toml(sweep))
    description = (f"{sweep.description or 'Sweep ' + sweep.name}\n\nFrom `{sweep_file.name}`: "
                   f"{len(configs)} runs of {len(algorithms)} algorithms, eps {', '.join(f'{e:g}' for e in sweep.eps)} "
                   f"(private algorithms; non-private ones once per seed), seeds "
                   f"{', '.join(map(str, sweep.seeds))}, engine {engine}. Rerun: "
                   f"`{job.rerun}` with this run's sweep.toml artifact.")
    failures, started = [], time.perf_counter()
    logged = tracker.sweep(sweep.name, params={**sweep.to_dict(), "file": str(sweep_file)},
                           tags={"job": job.name, "engine": engine}, description=description,
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
                label = run_label(config)
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
                    run_pool(args.workers, todo, engine, options, checkpointer, bar, finish)
                else:
                    for config in todo:
                        bar.started(run_label(config))
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
              f"Resume with:  {job.command} --resume {logged.local_dir.resolve()}"
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
            here = shlex.quote(sys.executable)       # this interpreter: the command runs as printed
            print(f"Open the UI:   {here} -m ldpfed ui {local_dir}\n               (or: {tracker.ui_command()})")
        print(f"Sweep's runs:  {tracker.runs_url(logged.parent_run_id)}")
        print(f"Its report:    {tracker.artifact_url(logged.parent_run_id, 'report/report.html')}")
    if mlflow_lost is not None:
        print(f"\n{mlflow_lost}\nWhen MLflow is back, upload what it lacks:  python -m ldpfed sync "
              f"{local_dir.resolve()} --tracking-uri {tracker.display_uri}", file=sys.stderr)
        return 1
    if failures:
        print(f"{len(failures)} runs failed:", *(f"  {run_label(c)}: {e}" for c, e in failures), sep="\n",
              file=sys.stderr)
        return 1
    return 0


def run_pool(workers, configs, engine, options, checkpointer, bar, finish) -> None:
    """The local engine on `workers` processes. On Ctrl-C or SIGTERM the workers are stopped with SIGTERM, which
    each turns into an interrupt: the run it was doing writes its checkpoint."""
    pool = ProcessPoolExecutor(workers, initializer=signals.install)
    try:
        futures = {pool.submit(run, c, engine=engine, checkpointer=checkpointer(c), **options): c for c in configs}
        for config in configs[:workers]:     # the pool starts them in submission order
            bar.started(run_label(config))
        waiting = iter(configs[workers:])
        for future in as_completed(futures):
            following = next(waiting, None)
            if following is not None:
                bar.started(run_label(following))
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


def run_label(config) -> str:
    private = REGISTRY[config.algorithm].privacy_model != "none"
    return f"{config.algorithm} {config.env}{f' eps={config.eps:g}' if private else ''} seed={config.seed}"
