"""The MLflow copy of what the local sweep folder holds: a run, a failed run, a sweep's parent run.

The sweep (sweep_run.py) calls these live, after its local files are written; `python -m ldpfed sync` (sync.py)
calls them to upload what MLflow lacks from those files. So a run uploaded by either says the same thing.
`tracker` is a connected Tracker (its client, experiment and HTTP policy).
"""
from __future__ import annotations

import time
from pathlib import Path

from ldpfed.tracking import records
from ldpfed.tracking.store import http_policy


def now_ms() -> int:
    return int(time.time() * 1000)


def metric(key: str, value, step=0, timestamp: int | None = None):
    from mlflow.entities import Metric

    return Metric(key=key, value=float(value), timestamp=timestamp or now_ms(), step=int(step))


def params(mapping: dict) -> list:
    from mlflow.entities import Param

    return [Param(k, v) for k, v in mapping.items()]


def tags(mapping: dict) -> list:
    from mlflow.entities import RunTag

    return [RunTag(k, str(v)) for k, v in mapping.items()]


def start_parent(tracker, name: str, sweep_params: dict, run_tags: dict) -> str:
    """A sweep's parent run: its params (flattened), its tags and `ldpfed.sweep_id` (its own id, also on every
    child: the UI's link filters on it). Returns its id."""
    client = tracker.client
    run = client.create_run(tracker.experiment_id, run_name=name, tags=run_tags)
    run_id = run.info.run_id
    client.log_batch(run_id, params=params(records.flat_params(sweep_params)), tags=tags({"ldpfed.sweep_id": run_id}))
    return run_id


def log_run(tracker, result, config: dict, run_tags: dict, curves: dict, folder: Path,
            parent_run_id: str | None = None) -> str:
    """One MLflow run of a finished run (a child of `parent_run_id` if given): params, tags, metric curves with
    step = users, the final scalars once (step 0), the local files of `folder` as artifacts. A run half-logged
    when MLflow fails is marked FAILED (one quick try), not left RUNNING. Returns its id."""
    client = tracker.client
    summary = result.summary or {}
    elapsed = summary.get("elapsed_s")
    now = now_ms()
    start = now - int(float(elapsed) * 1000) if records.finite(elapsed) else now
    metrics = [metric(name, value, step, now)
               for name, (steps, values) in curves.items() for step, value in zip(steps, values)]
    # Scalars once, at step 0: MLflow lists them with the run's metrics, not as charts along the users axis.
    metrics += [metric(name, value, 0, now) for name, value in records.final_metrics(result).items()
                if name not in curves]
    with tracker.http():
        run = client.create_run(tracker.experiment_id, start_time=start,
                                run_name=records.run_name(config, summary.get("final_regret")),
                                tags={**run_tags, **({"mlflow.parentRunId": parent_run_id} if parent_run_id else {})})
        run_id = run.info.run_id
        try:
            client.log_batch(run_id, metrics=metrics, params=params(records.run_params(result)))
            artifact_repository(tracker, run.info.artifact_uri).log_artifacts(str(folder))
            client.set_terminated(run_id, status="FINISHED", end_time=now_ms())
        except Exception:
            try:
                with http_policy(retries=0, timeout=tracker.probe_timeout):
                    client.set_terminated(run_id, status="FAILED")
            except Exception:  # noqa: BLE001
                pass
            raise
    return run_id


def artifact_repository(tracker, artifact_uri: str):
    """The artifact store of a run whose artifact URI is known (from create_run). `client.log_artifacts(run_id)`
    would first read the whole run back from the tracking store to learn that URI: a query per run."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    return get_artifact_repository(artifact_uri, tracking_uri=tracker.tracking_uri)


def log_failed_run(tracker, config: dict, run_tags: dict, error: str, parent_run_id: str) -> str:
    """A FAILED child run of a run that raised: the config as params (eps "n/a" when not private), the error
    text as the `error` tag. Returns its id."""
    client = tracker.client
    values = records.flat_params(config)
    if not records.is_private(config):
        values["eps"] = "n/a"
    with tracker.http():
        run = client.create_run(tracker.experiment_id, run_name=records.run_name(config),
                                tags={**run_tags, "error": error[:5000], "mlflow.parentRunId": parent_run_id})
        client.log_batch(run.info.run_id, params=params(values))
        client.set_terminated(run.info.run_id, status="FAILED")
    return run.info.run_id
