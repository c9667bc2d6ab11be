"""Runs a sweep and logs it: every run of a sweep (ldpfed/sweep_spec.py), each logged as it ends (the local folder first,
then MLflow), a failing run reported without stopping the others, Ctrl-C or SIGTERM leaving a sweep that `resume`
continues.

`sweep(...)` (also `ldpfed.sweep(...)`) is the API: a sweep file, a preset's name, a mapping or keyword arguments in,
a `SweepResult` out (the results table as a DataFrame, the sweep's folder, the MLflow parent run, the failures);
bad input raises ConfigError or ValueError (an unreachable tracking store TrackingUnavailable) before any run.
`main` is the command line's use of it: `python -m ldpfed sweep` and jobs/run_all.py parse their options
(`sweep.add_arguments`) and get an exit status; only their names and commands differ (`Job`).

Where the runs run: with one worker and no Ray address, in this process one after another. Otherwise as Ray
tasks, one CPU each (`run_tasks`), on a local Ray started for the sweep or on the cluster at `address`, as many at
once as `workers` says (default: the cluster's CPUs); Ray places them on the nodes, retries those of a lost node
elsewhere, and their results stream back to this process (the driver), which alone writes the local folder and
MLflow. Runs on the ray engine (engine "ray") go one at a time from the driver, their actors spread by Ray and
reused by the next run of the same shape; with `workers` set, several at once, each a Ray task driving actors of
its own, in its own placement group (`ray_cpus`: the CPUs it asks for must be set).
"""
from __future__ import annotations

import platform
import shlex
import signal
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ldpfed import sweep_spec as sweeps
from ldpfed.algorithms import REGISTRY
from ldpfed.engine import run
from ldpfed.engine.checkpoint import Checkpointer
from ldpfed.engine.ray_options import ray_address
from ldpfed.tracking import Tracker, TrackingUnavailable, records
from ldpfed.tracking.report import grouped_table, markdown_table
from ldpfed.util.errors import ConfigError, describe_error
from ldpfed.util.progress import SweepProgress
from ldpfed.util.signals import Terminated, exit_status, interruptible

# A task lost with its node (or its worker process) is run again elsewhere this many times; a run that raises is
# not retried (its error is the run's result). A run's bits depend on its config alone, so a retry changes nothing.
MAX_RETRIES = 3
QUEUED_PER_RUN = 1     # runs queued at Ray beside each one running: a CPU that frees starts the next at once
WAIT_S = 1.0           # ray.wait's timeout: how soon Ctrl-C and SIGTERM are heard while runs are out


@dataclass(frozen=True)
class Job:
    """Who runs the sweep, as its messages name it: `name` (the first line, the MLflow tag `job`), `command` (the
    shell command that continued with `--resume DIR` resumes it; None: the Python API) and `rerun` (what reruns the
    sweep from its saved sweep.toml)."""
    name: str
    command: str | None = None
    rerun: str = "ldpfed.sweep('sweep.toml')"

    def resume_line(self, folder: Path, tracking_uri: str | None) -> str:
        if self.command is not None:
            return f"{self.command} --resume {folder}" + (f" --tracking-uri {tracking_uri}" if tracking_uri else "")
        uri = f", tracking_uri={tracking_uri!r}" if tracking_uri else ""
        return f"ldpfed.sweep(resume={str(folder)!r}{uri})"


API = Job(name="ldpfed.sweep")


@dataclass
class SweepResult:
    """What a sweep gives back. `table`: one row per run (the local folder's summary/summary.parquet: key,
    algorithm, env, eps, seed, status, final_regret, ..., node); `folder`: the sweep's local folder; `parent_run_id`:
    its MLflow parent run (None without tracking); `failures`: {run key: error} of the runs that raised;
    `mlflow_error`: why MLflow logging is incomplete (every result is in `folder`; `python -m ldpfed sync` repairs),
    else None."""
    name: str
    table: pd.DataFrame
    folder: Path
    parent_run_id: str | None
    failures: dict = field(default_factory=dict)
    mlflow_error: str | None = None
    elapsed_s: float = 0.0
    tracking_uri: str | None = None

    @property
    def ok(self) -> bool:
        """True when every run finished and MLflow has them all."""
        return not self.failures and self.mlflow_error is None

    def grouped(self) -> pd.DataFrame:
        """The table the sweep prints: one row per (env, algorithm, eps), medians over the seeds."""
        return grouped_table(self.table)

    def runs_per_node(self) -> pd.Series:
        """Finished runs per node (the host's name in the driver's process; IP and Ray's node id for a task)."""
        return runs_per_node(self.table)

    def __repr__(self):
        lost = ", MLflow incomplete" if self.mlflow_error else ""
        return (f"SweepResult({self.name!r}: {len(self.table)} runs, {len(self.failures)} failed, folder "
                f"{str(self.folder)!r}, parent run {self.parent_run_id!r}{lost})")


@dataclass
class Plan:
    """A validated sweep, ready to run: nothing has been simulated yet."""
    sweep: sweeps.Sweep
    source: str                   # where the sweep came from, as messages name it
    configs: list
    tracker: Tracker
    resume_dir: Path | None
    workers: int | str | None
    address: str | None
    checkpoint_every_s: float
    progress: bool
    verbose: bool
    job: Job
    tracking_uri_given: bool


def sweep(spec=None, *, name=None, algorithms=None, envs=None, eps=None, seeds=None, users=None, round_size=None,
          populations=None, delta=None, engine=None, profile=None, trust=None, trust_options=None, params=None,
          env_params=None, federation=None, federation_options=None,
          env_round_size=None, actors=None, shards=None, placement=None, actor_cpus=None, shard_cpus=None,
          workers=None, address=None, tracking=True,
          tracking_uri=None, experiment=sweeps.EXPERIMENT, out=sweeps.OUT, resume=None, checkpoint_every_s=20.0,
          progress=True, verbose=True, job: Job = API) -> SweepResult:
    """Run a sweep and return its SweepResult.

    spec: a sweep file (TOML), a preset's name ("quick", "paper", "example"), a mapping of sweep keys, or None (the
    keyword arguments alone). algorithms ... env_round_size: sweep keys over the spec's (see ldpfed/sweep_spec.py;
    lists or comma-separated text; seeds also a range or "0-9"); with any of them a file's sweep is named "custom"
    unless `name` is given. federation, federation_options: the federation model of every run and its options
    (ldpfed.federation; docs/federation.md). actors, shards, placement, actor_cpus, shard_cpus: the ray engine's actors and shards
    per run, their placement ("spread", "pack" or "none") and the CPUs each asks for (see
    ldpfed.engine.ray_engine.RayBackend).
    workers: runs at once. 1 (the default without `address`): in this process, one after another; an integer or
    "auto" (the cluster's CPUs; the default with `address`): Ray tasks, one CPU each, on a local Ray started for
    the sweep (stopped after it) or on the cluster at `address` ("auto": the running cluster). On the ray engine
    (default: one run at a time, from this process, its actors reused by the next run of the same shape) an
    integer or "auto" (as many runs as the cluster's CPUs hold) runs that many at once, each a Ray task driving
    actors of its own in its own placement group; actor_cpus and shard_cpus must then be set (or placement
    "none"), since a run otherwise takes every free CPU.
    tracking: log to MLflow (tracking_uri, experiment) besides the local folder `out`/<name>. resume: a sweep folder
    to continue (or True for `out`/<name>): its finished runs are kept, the others run. progress: the sweep's bar;
    verbose: the lines the command line prints (the sweep, the results table, links).
    Raises ConfigError or ValueError for bad input, TrackingUnavailable for a store that cannot be reached, before
    any run; KeyboardInterrupt (Ctrl-C, or SIGTERM as Terminated) after keeping every finished run."""
    plan = prepare(spec, name=name, overrides={
        "algorithms": algorithms, "envs": envs, "eps": eps, "seeds": seeds, "users": users, "round_size": round_size,
        "populations": populations, "delta": delta, "engine": engine, "profile": profile, "trust": trust,
        "trust_options": trust_options, "params": params, "env_params": env_params, "env_round_size": env_round_size,
        "federation": federation, "federation_options": federation_options},
        ray={"actors": actors, "shards": shards, "placement": placement, "actor_cpus": actor_cpus,
             "shard_cpus": shard_cpus}, workers=workers, address=address,
        tracking=tracking, tracking_uri=tracking_uri, experiment=experiment, out=out, resume=resume,
        checkpoint_every_s=checkpoint_every_s, progress=progress, verbose=verbose, job=job)
    return execute(plan)


def _python_values(overrides: dict) -> dict:
    """Keyword arguments as sweep keys: a range or a single seed as a list of seeds."""
    out = dict(overrides)
    if isinstance(out.get("seeds"), range):
        out["seeds"] = list(out["seeds"])
    if isinstance(out.get("seeds"), int) and not isinstance(out["seeds"], bool):
        out["seeds"] = [out["seeds"]]
    return out


def prepare(spec=None, *, name=None, overrides=None, ray=None, workers=None, address=None, tracking=True,
            tracking_uri=None, experiment=sweeps.EXPERIMENT, out=sweeps.OUT, resume=None, checkpoint_every_s=20.0,
            progress=True, verbose=True, job: Job = API) -> Plan:
    """Everything `sweep` checks before any run: the sweep and its runs, the options, the tracking store."""
    workers = sweeps.parse_workers(workers)
    if not (isinstance(checkpoint_every_s, (int, float)) and not isinstance(checkpoint_every_s, bool)
            and checkpoint_every_s >= 0):
        raise ValueError(f"checkpoint_every_s={checkpoint_every_s!r}: a number of seconds >= 0")
    the_sweep, path, resume_dir = sweeps.load(spec, _python_values(overrides or {}), name, resume, out, ray)
    configs = sweeps.configs(the_sweep)
    if not configs:
        raise ValueError("the sweep has no run (no algorithm supports the listed envs)")
    ray_cpus(the_sweep, workers)        # Ray-engine runs at once: their CPUs must be known
    if uses_ray(the_sweep.engine, address, workers):
        address = ray_address(address)      # and RAY_ADDRESS: a dashboard's HTTP address is refused before any work
    if resume_dir is not None:
        try:
            experiment = records.read_json(resume_dir / "sweep.json").get("experiment") or experiment
        except (OSError, ValueError):
            pass
        out = resume_dir.parent
    # Before any simulation: a tracking server that cannot be reached is reported now, not after an hour.
    tracker = Tracker(experiment=experiment, tracking_uri=tracking_uri, out_dir=out, enabled=bool(tracking))
    source = path.name if path is not None else "keyword arguments"
    return Plan(the_sweep, source, configs, tracker, resume_dir, workers, address, float(checkpoint_every_s),
                bool(progress), bool(verbose), job, tracking_uri is not None)


def ray_cpus(the_sweep, workers) -> float | None:
    """The CPUs one Ray-engine run of the sweep asks for (its actors' and shards'; shufflers beside), when its runs
    go several at once (`workers` an integer > 1 or "auto"); None otherwise, or with placement "none" (no CPUs
    asked for). Raises ConfigError when they are not set: a run whose actors take what fits holds every free CPU,
    and the other runs would only wait for it."""
    if not ray_runs_at_once(the_sweep.engine, workers):
        return None
    options = ray_run_options(the_sweep)
    if options.get("placement") == "none":
        return None
    if options.get("actor_cpus") is None or options.get("shard_cpus") is None:
        raise ConfigError("workers", workers, "Ray-engine runs at once need the CPUs each actor asks for: set "
                          "actor_cpus and shard_cpus ([ray], --actor-cpus/--shard-cpus), or placement none")
    return options["actors"] * options["actor_cpus"] + options["shards"] * options["shard_cpus"]


def ray_run_options(the_sweep) -> dict:
    """The options of the sweep's Ray-engine runs: its [ray] table over 2 population actors and 2 shards."""
    return {"actors": 2, "shards": 2, **the_sweep.ray}


def ray_runs_at_once(engine: str, workers) -> bool:
    """Whether Ray-engine runs go several at once, each a Ray task (else one at a time from the driver)."""
    return engine == "ray" and workers not in (None, 1)


def uses_ray(engine: str, address, workers) -> bool:
    """Whether a sweep needs Ray: Ray-engine runs, a cluster's address, or runs sent as tasks."""
    return engine == "ray" or address is not None or workers not in (None, 1)


def execute(plan: Plan) -> SweepResult:
    """Run a prepared sweep (see `sweep`): start or join Ray if its runs need it, and stop the Ray it started."""
    engine = plan.sweep.engine
    in_ray = uses_ray(engine, plan.address, plan.workers)
    ray_started = False
    if in_ray:
        from ldpfed.engine.ray_engine import ensure_ray

        ray_started = ensure_ray(plan.address)      # a Ray it starts runs its tasks at this process's niceness
    try:
        with interruptible():
            return _run_sweep(plan, in_ray)
    finally:
        if engine == "ray":      # the last run's held placement group gives its CPUs back to the cluster
            from ldpfed.engine.ray_engine import IDLE_ACTORS

            IDLE_ACTORS.clear_groups()
        if ray_started:          # no orphans: the Ray this sweep started stops with it
            import ray

            ray.shutdown()


class _Quiet:
    """A sweep bar that shows nothing (progress=False)."""

    def started(self, name):
        pass

    def finished(self, name, failed=False, algorithm=None):
        pass

    def close(self):
        pass

    def write(self, text):
        print(text, file=sys.stderr)


def _run_sweep(plan: Plan, in_ray: bool) -> SweepResult:
    sweep, configs, tracker, job = plan.sweep, plan.configs, plan.tracker, plan.job
    engine, options = sweep.engine, (ray_run_options(sweep) if sweep.engine == "ray" else {})
    say = print if plan.verbose else (lambda *args, **kwargs: None)
    algorithms = sorted({c.algorithm for c in configs})
    say(f"{job.name}: sweep {sweep.name!r}, {len(algorithms)} algorithms, {len(configs)} runs, "
        f"{sum(c.users for c in configs):,} users, engine {engine}", flush=True)
    effective = (f"# the sweep as run (from {plan.source}, with the command line's overrides)\n"
                 + sweeps.to_toml(sweep))
    description = (f"{sweep.description or 'Sweep ' + sweep.name}\n\nFrom `{plan.source}`: "
                   f"{len(configs)} runs of {len(algorithms)} algorithms, eps {', '.join(f'{e:g}' for e in sweep.eps)} "
                   f"(private algorithms; non-private ones once per seed), seeds "
                   f"{', '.join(map(str, sweep.seeds))}, engine {engine}. Rerun: "
                   f"`{job.rerun}` with this run's sweep.toml artifact.")
    failures, started = [], time.perf_counter()
    logged = tracker.sweep(sweep.name, params={**sweep.to_dict(), "file": plan.source},
                           tags={"job": job.name, "engine": engine}, description=description,
                           files={"sweep.toml": effective}, resume_dir=plan.resume_dir)
    done = logged.finished_keys
    todo = in_turn([c for c in configs if records.run_key(records.config_dict(c)) not in done])
    if plan.resume_dir is not None:
        say(f"resuming {logged.local_dir}: {len(configs) - len(todo)} of {len(configs)} runs finished earlier, "
            f"{len(todo)} to run", flush=True)
        for problem in logged.unreadable:
            print(f"  unreadable, run again: {problem}", file=sys.stderr)
    ray_at_once = ray_runs_at_once(engine, plan.workers)
    if ray_at_once:
        say(f"engine ray: {plan.workers} runs at once, each a Ray task driving actors of its own (not reused "
            f"between runs)", flush=True)

    def checkpoint_dir(config) -> Path:
        return logged.checkpoint_dir(config)

    as_tasks = (engine == "local" and in_ray) or ray_at_once
    # runs at once, for the ETA (with workers auto the CPUs are counted later: at least two)
    at_once = (plan.workers if isinstance(plan.workers, int) else 2) if as_tasks else 1
    bar = (SweepProgress(len(configs), label=f"sweep {sweep.name}", algorithms=[c.algorithm for c in todo],
                         at_once=at_once) if plan.progress else _Quiet())
    for _ in range(len(configs) - len(todo)):
        bar.finished("(earlier)", failed=False)
    mlflow_lost = None
    here = platform.node()
    try:
        with logged:
            def finish(config, result=None, error=None, node=None, node_id=None):
                label = run_label(config)
                if error is None:
                    result.summary["node"] = node or here      # where it ran: a column of the sweep's table
                    if node_id is not None:
                        result.summary["node_id"] = node_id
                    logged.log_result(result)
                    spent = logged.checkpoint_dir(config) / "checkpoint.npz"
                    spent.unlink(missing_ok=True)     # the run is finished: its checkpoint is not needed
                else:
                    failures.append((config, error))
                    logged.log_failure(config, error)
                    bar.write(f"FAILED {label}: {error}")
                bar.finished(label, failed=error is not None, algorithm=config.algorithm)

            if as_tasks:
                run_tasks(todo, plan.workers, checkpoint_dir, plan.checkpoint_every_s, bar, finish,
                          ray_options=options if ray_at_once else None, run_cpus=ray_cpus(sweep, plan.workers))
            else:
                for config in todo:
                    bar.started(run_label(config))
                    checkpointer = Checkpointer(checkpoint_dir(config), every_s=plan.checkpoint_every_s)
                    try:
                        result = run(config, engine=engine, checkpointer=checkpointer, **options)
                    except Exception as error:
                        traceback.print_exc()
                        finish(config, error=describe_error(error))
                    else:
                        finish(config, result)
    except KeyboardInterrupt as error:
        bar.close()
        finished = len(logged.finished_keys)
        why = "terminated (SIGTERM)" if isinstance(error, Terminated) else "interrupted"
        if plan.verbose:
            uri = tracker.display_uri if plan.tracking_uri_given else None
            print(f"\n{why}: {finished} of {len(configs)} runs finished, {len(logged.failures)} failed; the running "
                  f"ones kept their checkpoints. Results so far: {logged.local_dir}"
                  f"{f'; MLflow parent run {logged.parent_run_id} marked KILLED' if logged.parent_run_id else ''}.\n"
                  f"Resume with:  {job.resume_line(logged.local_dir.resolve(), uri)}",
                  file=sys.stderr)
        raise
    except TrackingUnavailable as error:    # raised on exit, after every local file is written
        mlflow_lost = error
    finally:
        bar.close()
    summary, local_dir = logged.summary, logged.local_dir
    elapsed = time.perf_counter() - started
    table = markdown_table(summary) if not summary.empty else "(no run finished)"
    say(f"\n{table}\n\n{len(configs) - len(failures)} runs in {elapsed:,.0f} s; results in {local_dir} "
        f"(report/report.html: this table with the plots)")
    nodes = runs_per_node(summary)
    if len(nodes):
        say("Runs per node:  " + ", ".join(f"{node} {count}" for node, count in nodes.items()))
    if tracker.enabled:
        say(f"\nMLflow: experiment {tracker.experiment!r}, parent run {logged.parent_run_id}, at {tracker.display_uri}")
        if tracker.ui_command():
            python = shlex.quote(sys.executable)       # this interpreter: the command runs as printed
            say(f"Open the UI:   {python} -m ldpfed ui {local_dir}\n               (or: {tracker.ui_command()})")
        # the report first: the comparison at a glance (MLflow's runs table cannot be told which columns to show)
        say(f"Results:       {tracker.artifact_url(logged.parent_run_id, 'report/report.html')}")
        say(f"Its runs:      {tracker.runs_url(logged.parent_run_id)}  (run names: algorithm, eps, regret, "
            f"regret over uniform's)")
    if mlflow_lost is not None and plan.verbose:
        print(f"\n{mlflow_lost}\nWhen MLflow is back, upload what it lacks:  python -m ldpfed sync "
              f"{local_dir.resolve()} --tracking-uri {tracker.display_uri}", file=sys.stderr)
    elif failures and plan.verbose:
        print(f"{len(failures)} runs failed:", *(f"  {run_label(c)}: {e}" for c, e in failures), sep="\n",
              file=sys.stderr)
    return SweepResult(name=sweep.name, table=summary, folder=local_dir, parent_run_id=logged.parent_run_id,
                       failures=dict(logged.failures), mlflow_error=None if mlflow_lost is None else str(mlflow_lost),
                       elapsed_s=elapsed, tracking_uri=tracker.display_uri)


def in_turn(configs: list) -> list:
    """The runs in the order they go: the algorithms in turn, one run of each, each algorithm's own runs in their
    order. The bar's ETA is the finished runs' average time; taken algorithm by algorithm, the first runs to finish
    were all of the first algorithms (the quick preset's first lines said five minutes for a sweep of under two,
    its slow changing-world runs coming early). What a run computes does not depend on when it runs."""
    groups: dict[str, list] = {}
    for config in configs:
        groups.setdefault(config.algorithm, []).append(config)
    longest = max((len(runs) for runs in groups.values()), default=0)
    return [runs[i] for i in range(longest) for runs in groups.values() if i < len(runs)]


def _run_task(config, checkpoint_dir: str, driver_ip: str, every_s: float, ray_options: dict | None = None):
    """One run as a Ray task; returns the result and where it ran (node IP, Ray node id). A run on the driver's
    machine writes its checkpoint into the sweep's folder, as in process; on another machine (another disk) it
    writes none: lost or stopped, it is run again from its start. With `ray_options` a Ray-engine run, whose actors
    this task starts and ends (their processes are not kept for another run: an idle actor would hold its CPUs
    from the sweep's other runs)."""
    import ray

    node = ray.util.get_node_ip_address()
    checkpointer = Checkpointer(checkpoint_dir, every_s=every_s) if node == driver_ip else None
    try:
        result = run(config, engine="local" if ray_options is None else "ray", checkpointer=checkpointer,
                     **(ray_options or {}))
    except KeyboardInterrupt as cancelled:
        # Cancelled (its checkpoint is written). An interrupt that landed inside an import, e.g. numba's first
        # set-up, left that module's registrations half done: importing it again registers twice ("duplicate
        # registration for ... UnicodeType") and every later run in this process would fail; one that landed inside
        # numba's compiler (a new machine or folder compiles every function) can leave its state broken too ("generator
        # raised StopIteration" in the next compile). Such a worker ends instead of taking the next task (Ray reports
        # the task as cancelled, and warns of the worker's exit).
        if interrupted_an_import(cancelled) or interrupted_the_compiler(cancelled):
            raise SystemExit(0) from None
        raise
    finally:
        if ray_options is not None:
            from ldpfed.engine.ray_engine import IDLE_ACTORS

            IDLE_ACTORS.clear()
    return result, node, ray.get_runtime_context().get_node_id()


def interrupted_an_import(error: BaseException) -> bool:
    """True if `error` was raised while a module's body ran (a `<module>` frame in its traceback): an import."""
    return any(frame.f_code.co_name == "<module>" for frame, _ in traceback.walk_tb(error.__traceback__))


COMPILER_PACKAGES = ("numba", "llvmlite")


def interrupted_the_compiler(error: BaseException) -> bool:
    """True if `error` was raised inside numba's or llvmlite's code (a compile, or a cache load)."""
    return any(set(Path(frame.f_code.co_filename).parts) & set(COMPILER_PACKAGES)
               for frame, _ in traceback.walk_tb(error.__traceback__))


def run_tasks(configs, workers, checkpoint_dir, every_s, bar, finish, ray_options=None, run_cpus=None) -> None:
    """The local engine's runs as Ray tasks (one CPU each), `workers` at once (None or "auto": as many as the
    cluster has CPUs, counted again as nodes come and go), results handed to `finish` as they arrive (ray.wait).
    With `ray_options`, Ray-engine runs instead: each task (no CPU of its own) drives the run's actors, whose CPUs
    its placement group holds; "auto" is then as many runs as the cluster's CPUs hold at `run_cpus` each.
    Only that many task refs are out at a time, however many runs the sweep has, or with `workers` auto (1 +
    QUEUED_PER_RUN) times the CPUs: Ray queues those beyond its CPUs, so a CPU that frees starts the next run
    without waiting for the driver to log the last one (with one run out per CPU, the CPUs idled through every
    run's logging). The bar shows the oldest runs out, as many as run at once, as running. On Ctrl-C or SIGTERM
    the outstanding tasks are cancelled (each running one gets a KeyboardInterrupt and writes its checkpoint), the
    runs that finished meanwhile are kept, and the interrupt goes on."""
    import ray

    from ldpfed.engine.ray_engine import IDLE_ACTORS

    IDLE_ACTORS.clear_groups()      # a Ray-engine run's held placement group would keep the tasks' CPUs
    task = ray.remote(num_cpus=0 if ray_options is not None else 1, max_retries=MAX_RETRIES,
                      retry_exceptions=False)(_run_task)
    per_run = 1.0 if ray_options is None else (run_cpus or 1.0)
    driver_ip = ray.util.get_node_ip_address()
    pending, out = deque(configs), {}          # out: ref -> config, in submission order
    queued: set = set()                        # refs out but not yet shown as running
    counted = [0.0, 1]                         # when the cluster's CPUs were last counted, and how many

    def capacity() -> int:
        if isinstance(workers, int):
            return workers
        if time.monotonic() - counted[0] > 5.0:
            counted[:] = [time.monotonic(), max(1, int(ray.cluster_resources().get("CPU", 1) / per_run + 1e-9))]
        return counted[1]

    def collect(ref) -> None:
        config = out.pop(ref)
        queued.discard(ref)
        try:
            result, node, node_id = ray.get(ref)
        except ray.exceptions.TaskCancelledError:
            return
        except ray.exceptions.RayTaskError as error:       # the run raised: its own error is the record
            finish(config, error=describe_error(getattr(error, "cause", None) or error))
        except Exception as error:  # noqa: BLE001 - lost beyond its retries: this run fails, the others go on
            finish(config, error=describe_error(error))
        else:
            finish(config, result, node=node, node_id=node_id)

    # SIGTERM while ray.wait runs reaches us as a bare KeyboardInterrupt (Ray turns the handler's exception into
    # its own); noting it here keeps it a Terminated, exit status 143.
    signals = []
    previous = None
    if threading.current_thread() is threading.main_thread():
        def on_sigterm(signum, frame):
            signals.append(signum)
            raise Terminated(f"received {signal.Signals(signum).name}")

        previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        while pending or out:
            # a given number of workers is runs at once: nothing more goes out, or Ray would run it on a free CPU
            # (a Ray-engine run queued would be a process waiting for its placement group: none is queued)
            depth = capacity() if isinstance(workers, int) or ray_options else (1 + QUEUED_PER_RUN) * capacity()
            while pending and len(out) < depth:
                config = pending.popleft()
                ref = task.remote(config, str(checkpoint_dir(config)), driver_ip, every_s, ray_options)
                out[ref] = config
                queued.add(ref)
            for ref in [r for r in out if r in queued][:max(0, capacity() - (len(out) - len(queued)))]:
                queued.discard(ref)
                bar.started(run_label(out[ref]))
            ready, _ = ray.wait(list(out), num_returns=1, timeout=WAIT_S)
            for ref in ready:
                collect(ref)
    except KeyboardInterrupt as error:
        for ref in out:
            ray.cancel(ref)
        ready, _ = ray.wait(list(out), num_returns=len(out), timeout=30) if out else ([], [])
        for ref in ready:          # finished before the cancel reached them: kept
            try:
                result, node, node_id = ray.get(ref)
            except Exception:  # noqa: BLE001 - cancelled (its checkpoint written) or failed: run on resume
                continue
            finish(out[ref], result, node=node, node_id=node_id)
        if signals and not isinstance(error, Terminated):
            raise Terminated("received SIGTERM") from None
        raise
    except BaseException:          # the driver failed: its tasks must not run on in a Ray that outlives it
        for ref in out:
            ray.cancel(ref)
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def runs_per_node(table: pd.DataFrame) -> pd.Series:
    """Finished runs per node of a sweep's table: the host's name for runs in the driver's process, "IP [node id]"
    for Ray tasks."""
    if table.empty or "node" not in table.columns:
        return pd.Series(dtype=int)
    rows = table[table["status"] == "FINISHED"] if "status" in table.columns else table
    ids = rows["node_id"] if "node_id" in rows.columns else pd.Series(None, index=rows.index)
    names = [f"{node} [{str(node_id)[:8]}]" if isinstance(node_id, str) and node_id else str(node)
             for node, node_id in zip(rows["node"], ids)]
    return pd.Series(names, dtype=object).value_counts().sort_index()


def main(parser, args, spec, job: Job) -> int:
    """The command line's sweep: the options `sweep.add_arguments` parsed (`args`) and the sweep file or preset
    `spec`. Bad input exits 2 through `parser`; returns the exit status: 0, 1 when a run failed or MLflow was lost,
    130/143 when interrupted."""
    try:
        plan = prepare(spec, **_cli_options(args), job=job)
    except (ValueError, ConfigError) as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    except TrackingUnavailable as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n(use --no-tracking to keep local results only)\n")
    try:
        result = execute(plan)
    except KeyboardInterrupt as error:
        return exit_status(error)
    return 0 if result.ok else 1


def _cli_options(args) -> dict:
    options = sweeps.api_options(args)
    overrides = {key: options.pop(key) for key in [key for _, key, _ in sweeps.OVERRIDES] + ["trust_options"]
                 if key in options}
    ray = {key: options.pop(key) for key in sweeps.RAY_KEYS if key in options}
    return {**options, "overrides": overrides, "ray": ray}


def run_label(config) -> str:
    private = REGISTRY[config.algorithm].privacy_model != "none"
    return f"{config.algorithm} {config.env}{f' eps={config.eps:g}' if private else ''} seed={config.seed}"
