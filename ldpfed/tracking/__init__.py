"""Experiment tracking: MLflow runs (embedded SQLite by default, or a shared server), Parquet/JSON tables, plots.

Usage (in a job's driver; only the driver logs, a Tracker refuses to be pickled into Ray tasks or actors)::

    from ldpfed.tracking import Tracker, TrackingUnavailable

    tracker = Tracker(experiment="run_all", tracking_uri=None, out_dir="results/run_all")
    with tracker.sweep("quick", params={"users": 10_000, "seeds": 2}, tags={"job": "run_all"},
                       description="what the sweep is (Markdown)", files={"sweep.toml": text}) as sweep:
        for config in configs:
            sweep.log_result(run_local(config))       # one MLflow CHILD run per RunResult
        # a run that raised: sweep.log_failure(config, error)  (a FAILED child run, a FAILED row locally)
    # on exit: the combined summary table, the plots and the report, on the parent run and under out_dir/quick/
    # sweep.summary (DataFrame, one row per run), sweep.local_dir, sweep.parent_run_id, sweep.run_ids
    tracker.ui_command(), tracker.runs_url(sweep.parent_run_id)   # what a job prints at its end
    tracker.log_run(result)                  # one run on its own, no parent (`python -m ldpfed run --track`)

Modules
    tracker.py (Tracker: the connection and `log_run`), sweep_run.py (SweepRun: one sweep as it runs), local.py
    (LocalSweep: the sweep's folder, the source of truth, and resume), mirror.py (the MLflow copy of a run, a
    failed run, a parent run: used live and by sync.py alike), links.py (links into the UI), records.py (what is
    recorded of a run, the summary row), report.py and plots.py, store.py (tracking URIs and their probe), ui.py.

Where runs go
    tracking_uri=None uses MLFLOW_TRACKING_URI if set, else MLflow 3's own default: the SQLite file
    `mlflow.db` in the working directory with artifacts in `./mlruns` beside it, no server needed. An
    `http(s)://host:port` URI sends everything to an MLflow server (artifacts through the server's proxy, or
    wherever the server says). `Tracker(..., enabled=False)` writes local results only.

Fail fast
    `Tracker(...)` probes the store before any simulation work (one request, `probe_timeout`=5 s, no retries;
    MLflow's own retries would take minutes) and gets or creates the experiment. Failure raises
    `TrackingUnavailable` (a RuntimeError; `.uri`, `.reason`) whose message names the URI. With
    `fallback_local=True` it warns instead and the tracker keeps local results only (`tracker.enabled` False).
    During a sweep, MLflow calls use `request_retries`=3 and `request_timeout`=60 s unless the
    MLFLOW_HTTP_REQUEST_* variables are set; if a call still fails, the sweep warns, stops calling MLflow,
    keeps writing locally, and on exit raises TrackingUnavailable (unless strict=False or fallback_local=True)
    after all local files are written. Before each run's upload a server is probed (probe_timeout, no retries),
    so a dead or frozen one is found in seconds. `python -m ldpfed sync DIR` (tracking/sync.py) later uploads
    what MLflow lacks from the local folder, idempotently.

Tracker(experiment, tracking_uri=None, out_dir=None, *, enabled=True, fallback_local=False, probe_timeout=5.0,
        request_retries=3, request_timeout=60.0, max_points=2000, strict=True)
    out_dir defaults to results/<experiment>. `tracker.enabled`, `.tracking_uri`, `.display_uri` (credentials
    redacted: the only form written to files, logs and errors), `.experiment_id`, `.client`. The experiment is
    tagged mlflow.experimentKind=custom_model_development so MLflow 3's UI opens it on its runs table.

Results are never lost
    Each `log_result` first writes, under `out_dir/<sweep>/`:
        runs/<algorithm>__<env>__eps=<eps>__seed=<seed>/table.parquet   every round, full resolution
                                                       /summary.json   RunResult.summary
                                                       /ledger.json    the privacy ledger
                                                       /config.json    config, env as built, algorithm options, tags
                                                       /regret.svg     its regret curve (shown by the UI)
        summary/summary.parquet, summary/summary.csv   the combined summary (one row per run), rewritten per run
        sweep.json                                     URIs and MLflow run ids, status, MLflow errors if any
    and on exit plots/*.png and report/ (regret_table.md, report.html). Only then does it call MLflow. When
    out_dir/<sweep> already holds a sweep, the new one goes to <sweep>-2, -3, ...: nothing earlier is moved.

What one child run holds
    params   the RunConfig's fields (`algorithm`, `env`, `eps` ("n/a" when not private), `seed`, `users`, ...),
             `rounds`, the env as built (`world.X`: d, K, ...) and every algorithm option, defaults included
             (`setting.X`); the names sort so MLflow's comparison views start with algorithm, env, eps, seed
    tags     privacy_model, mechanisms (from the ledger, comma-separated, or "none"), engine ("single-process" or
             the Ray engine's name), cluster.nodes / cluster.actors / cluster.shards (when the engine reports
             them), engine.X for the engine's text settings (e.g. engine.mode), code_version (git commit, else
             the package version), code_dirty, mlflow.source.git.commit,
             paper, algorithm, env, ldpfed.sweep, ldpfed.key, mlflow.parentRunId, and the sweep's tags
    metrics  curves with step = users processed, down-sampled with the first and last kept: the results at
             most MAX_POINTS (200) each, cumulative_regret and estimation_error (at its checkpoints); the
             bookkeeping at most BOOKKEEPING_POINTS (20) each, users_per_s / messages_per_s / rejected_messages
             (if the engine's table has those columns per round, rejected_messages as a running count), total_X
             (running sum of each algorithm counter X, e.g. clipped users); and scalars
             logged once (step 0): final_regret, regret_vs_uniform (on exit), final_estimation_error, elapsed_s
             and every other number of the summary (the Ray engine's messages, fold latencies, peak memory in MB
             as peak_rss_X_mb)
    artifacts table.parquet, summary.json, ledger.json, config.json, regret.svg (the files above)

What the parent run holds
    params: the sweep's params (flattened); tags: the sweep's tags, ldpfed.sweep, ldpfed.sweep_id (its own id,
    also on every child: the UI link filters on it), code version, the description (mlflow.note.content; on exit
    followed by the results table), and on exit algorithms, envs, engine, privacy_models, eps_values; metrics
    `runs`, `failed_runs`, `regret_vs_uniform/<env>/<algorithm>/<eps>`; artifacts the `files`, report/,
    summary/summary.{parquet,csv}, sweep.json and plots/ (see plots.py): regret_curves.png (cumulative regret
    against users, a panel per (env, eps), a line
    per algorithm: median over seeds with a 25-75% quantile band), final_regret_vs_eps.png and, when the
    algorithms estimate a parameter, final_estimation_error_vs_eps.png (median and 25-75% bars over seeds,
    log eps axis when eps spans a factor >= 4).
"""
from ldpfed.tracking.records import (BOOKKEEPING_POINTS, MAX_POINTS, downsample_index, metric_curves, run_params,
                                     run_tags, write_run)
from ldpfed.tracking.store import DEFAULT_EMBEDDED_URI, TrackingUnavailable, probe, resolve_tracking_uri
from ldpfed.tracking.sweep_run import SweepRun
from ldpfed.tracking.tracker import Tracker

__all__ = ["Tracker", "SweepRun", "TrackingUnavailable", "DEFAULT_EMBEDDED_URI", "MAX_POINTS", "BOOKKEEPING_POINTS",
           "probe", "resolve_tracking_uri", "run_params", "run_tags", "metric_curves", "downsample_index", "write_run"]
