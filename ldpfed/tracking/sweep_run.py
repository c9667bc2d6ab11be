"""SweepRun: one sweep as it runs: the local folder first (local.py), then its MLflow mirror (mirror.py), a parent
run and a child run per run.

See the package docstring (ldpfed/tracking/__init__.py) for the API and the layout of what is written.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from ldpfed.tracking import mirror, records, report
from ldpfed.tracking.local import LocalSweep
from ldpfed.tracking.store import TrackingUnavailable, first_line, http_policy, is_http, probe


class DriverOnly:
    def __reduce__(self):
        raise TypeError(f"{type(self).__name__} is driver-only: log results from the driver, do not ship the "
                        "tracker to Ray tasks or actors")


class SweepRun(DriverOnly):
    """One sweep: a parent run, a child run per `log_result`, and the local folder `local_dir`.

    Local files are written first, for every result, whatever MLflow does. If MLflow fails during the sweep
    the sweep warns, stops calling MLflow, keeps writing locally, and (Tracker strict=True) raises
    TrackingUnavailable on exit, after every local file is written.
    """

    def __init__(self, tracker, name: str, params: dict, tags: dict, description: str = "",
                 files: dict | None = None, resume_dir: str | Path | None = None):
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"sweep name={name!r}: must be a non-empty string")
        if not isinstance(params, dict) or not isinstance(tags, dict):
            raise ValueError("sweep params and tags must be mappings")
        self.tracker, self.name = tracker, name.strip()
        self.params, self.tags = params, {str(k): str(v) for k, v in tags.items()}
        self.description = str(description or "")
        self.files = {records.slug(k): str(v) for k, v in (files or {}).items()}
        self.resumed = resume_dir is not None
        self.local = LocalSweep(Path(resume_dir) if self.resumed else tracker.out_dir / records.slug(self.name),
                                self.name, tracker.max_points, resume=self.resumed)
        # its MLflow parent run is reused on resume
        self.parent_run_id: str | None = self.local.previous.get("parent_run_id")
        self.errors: list[str] = []                 # MLflow failures (the local copy is complete regardless)
        self._active = False
        self._mlflow = False
        self.status = "RUNNING"     # sweep.json's status: the MLflow status the sweep ended with, once it has

    # the local store's state, as the sweep's
    local_dir = property(lambda self: self.local.local_dir)
    summary = property(lambda self: self.local.summary, doc="The combined summary table: one row per logged run.")
    run_ids = property(lambda self: self.local.run_ids)
    failures = property(lambda self: self.local.failures)
    unreadable = property(lambda self: self.local.unreadable)
    local_errors = property(lambda self: self.local.local_errors)
    finished_keys = property(lambda self: self.local.finished_keys)

    def checkpoint_dir(self, config) -> Path:
        """Where the run of `config` keeps its checkpoints while it runs."""
        return self.local.checkpoint_dir(config)

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> "SweepRun":
        self.local.prepare(self.resumed, self.files)
        self._active = True
        self._mlflow = self.tracker.enabled
        self.local.write_index(self._index())
        if self._mlflow:
            client = self.tracker.client
            tags = {**self.tags, "ldpfed.kind": "sweep", "ldpfed.sweep": self.name, **records.code_version(),
                    "mlflow.note.content": self.description or f"Sweep {self.name} (running)"}
            try:
                with self.tracker.http():
                    if self.resumed and self._parent_exists():     # the same parent run, running again
                        client.update_run(self.parent_run_id, status="RUNNING")
                    else:
                        self.parent_run_id = mirror.start_parent(self.tracker, self.name, self.params, tags)
                    for file_name in self.files:
                        client.log_artifact(self.parent_run_id, str(self.local_dir / file_name))
            except Exception as exc:  # noqa: BLE001
                if not self.tracker.fallback_local:     # still before any simulation work: fail now
                    self._active = False
                    raise TrackingUnavailable(self.tracker.tracking_uri,
                                              f"cannot start the parent run of sweep {self.name!r}: "
                                              f"{type(exc).__name__}: {first_line(exc)}") from exc
                self._mlflow_failed("starting the sweep's parent run", exc)
        self.local.write_index(self._index())
        return self

    def _parent_exists(self) -> bool:
        if not self.parent_run_id:
            return False
        try:
            run = self.tracker.client.get_run(self.parent_run_id)
        except Exception:  # noqa: BLE001 - not there (another store, deleted): a new parent
            return False
        return run.info.lifecycle_stage == "active"

    def __exit__(self, exc_type, exc, tb):
        self._active = False
        # MLflow's statuses: an interrupt (Ctrl-C, SIGTERM) is KILLED, an error FAILED
        status = "FINISHED" if exc_type is None else "KILLED" if issubclass(exc_type, KeyboardInterrupt) else "FAILED"
        self.status = status
        self.local.add_relative_regret()
        self.local.write_combined()
        plot_files = self.local.write_plots()
        table = self.local.write_report(self.description, plot_files)
        self.local.write_index(self._index())
        if self._mlflow and self.parent_run_id:
            client = self.tracker.client
            try:
                with self.tracker.http():
                    client.log_artifacts(self.parent_run_id, str(self.local_dir / "summary"), "summary")
                    client.log_artifacts(self.parent_run_id, str(self.local_dir / "report"), "report")
                    for path in plot_files:
                        client.log_artifact(self.parent_run_id, str(path), "plots")
                    client.log_artifact(self.parent_run_id, str(self.local_dir / "sweep.json"))
                    self._log_aggregates(client, table)
                    client.set_terminated(self.parent_run_id, status=status)
            except Exception as error:  # noqa: BLE001
                self._mlflow_failed("finishing the sweep's parent run", error)
        elif self.errors and self.parent_run_id and self.tracker.enabled:
            # MLflow failed earlier: one quick try to mark the parent run incomplete rather than leave it RUNNING
            try:
                with http_policy(retries=0, timeout=self.tracker.probe_timeout):
                    self.tracker.client.set_tag(self.parent_run_id, "ldpfed.incomplete", "true")
                    self.tracker.client.set_terminated(self.parent_run_id, status="FAILED")
            except Exception:  # noqa: BLE001 - the server is still away; the local copy says it all
                pass
        if self.errors and self.tracker.strict and not self.tracker.fallback_local and exc_type is None:
            raise TrackingUnavailable(
                self.tracker.tracking_uri,
                f"MLflow logging of sweep {self.name!r} is incomplete ({'; '.join(self.errors)}). Every result "
                f"is in {self.local_dir}")
        return False

    def _log_aggregates(self, client, table: pd.DataFrame) -> None:
        """On the parent run: the description followed by the results table, run counts and one metric per
        (algorithm, env, eps) group (median regret over uniform's); on every child run its regret over uniform's,
        so the runs table sorts across envs."""
        rows, failed = self.local.rows, len(self.failures)
        text = (self.description + "\n\n" if self.description else "") + \
            f"{len(rows) - failed} runs finished, {failed} failed.\n\n" + report.markdown_table(self.summary)
        metrics = [mirror.metric("runs", len(rows)), mirror.metric("failed_runs", failed)]
        for r in table.itertuples(index=False):
            if np.isfinite(r.regret_vs_uniform) and r.algorithm != "uniform":
                eps = "non-private" if not np.isfinite(r.eps) else f"eps_{r.eps:g}"
                metrics.append(mirror.metric(records.mlflow_key(f"regret_vs_uniform/{r.env}/{r.algorithm}/{eps}"),
                                             r.regret_vs_uniform))
        client.log_batch(self.parent_run_id, metrics=metrics,
                         tags=mirror.tags({**self.local.sweep_tags(), "mlflow.note.content": text[:5000]}))
        for row in rows:
            if row.get("run_id") and row.get("regret_vs_uniform") is not None:
                name = records.run_name(row, row.get("final_regret"), row["regret_vs_uniform"])
                client.log_batch(row["run_id"], metrics=[mirror.metric("regret_vs_uniform", row["regret_vs_uniform"])],
                                 tags=mirror.tags({"mlflow.runName": name}))

    # ------------------------------------------------------------------ per run
    def log_result(self, result) -> dict:
        """Record one RunResult: local files first, then an MLflow child run. Returns the run's row of the
        combined summary (with `key`, `local_dir`, `run_id`)."""
        if not self._active:
            raise RuntimeError("log_result outside `with tracker.sweep(...)`")
        config = records.config_dict(result.config)
        key = self.local.unique(records.run_key(config))
        tags = {**self.tags, **records.run_tags(result), **self._child_tags(key)}
        curves = records.metric_curves(result, self.tracker.max_points)     # the local table's and MLflow's
        try:
            row = self.local.add_result(key, result, config, tags, curves)  # 1. never lost
        except OSError as exc:    # disk full, unwritable: this run fails, the sweep goes on
            folder = self.local_dir / "runs" / key
            return self.log_failure(config, f"{type(exc).__name__}: writing the results to {folder} failed: {exc}")
        self._mirror(row, f"logging run {key}", lambda: mirror.log_run(
            self.tracker, result, config, tags, curves,
            self.local_dir / row["local_dir"], self.parent_run_id))
        return dict(row)

    def log_failure(self, config, error) -> dict:
        """Record a run that raised instead of finishing: in the local summary and sweep.json (status FAILED,
        the error text), and as a FAILED MLflow child run with the run's config as params."""
        if not self._active:
            raise RuntimeError("log_failure outside `with tracker.sweep(...)`")
        config = records.config_dict(config)
        key = self.local.unique(records.run_key(config))
        text = str(error)[:5000] or type(error).__name__
        row = self.local.add_failure(key, config, text)
        self._mirror(row, f"logging the failure of run {key}", lambda: mirror.log_failed_run(
            self.tracker, config, {**self.tags, **self._child_tags(key), **records.code_version()}, text,
            self.parent_run_id))
        return dict(row)

    def _child_tags(self, key: str) -> dict:
        """The tags that put a run in this sweep; `ldpfed.sweep_id` (the parent's id) is the UI link's filter
        (runs of an earlier sweep of the same name have another)."""
        return {"ldpfed.kind": "run", "ldpfed.sweep": self.name, "ldpfed.key": key,
                **({"ldpfed.sweep_id": self.parent_run_id} if self.parent_run_id else {})}

    def _mirror(self, row: dict, what: str, upload) -> None:
        """After the local record of a run: its MLflow child run (`upload` returns its id), then (at most every
        few seconds) the combined summary and sweep.json with that id."""
        if self._mlflow:
            try:
                self._check_alive()
                row["run_id"] = self.local.run_ids[row["key"]] = upload()
            except Exception as exc:  # noqa: BLE001
                self._mlflow_failed(what, exc)
        self.local.write_soon(self._index)

    # ------------------------------------------------------------------ helpers
    def _check_alive(self) -> None:
        """One short request (probe_timeout, no retries) before a run's many: a frozen or dead server is found in
        seconds, not after MLflow's retries and timeouts (minutes per call)."""
        if is_http(self.tracker.tracking_uri):
            probe(self.tracker.tracking_uri, self.tracker.probe_timeout)

    def _index(self) -> dict:
        """sweep.json: the sweep, its status, and where its MLflow copy is."""
        return {"sweep": self.name, "experiment": self.tracker.experiment, "status": self.status,
                "tracking_uri": self.tracker.display_uri if self._mlflow else None,
                "experiment_id": self.tracker.experiment_id if self._mlflow else None,
                "parent_run_id": self.parent_run_id, "runs": self.run_ids, "failed_runs": self.failures,
                "mlflow_errors": self.errors,
                "params": records.to_jsonable(self.params), "tags": self.tags}

    def _mlflow_failed(self, what: str, exc: BaseException) -> None:
        message = f"{what}: {type(exc).__name__}: {first_line(exc)}"
        self.errors.append(message)
        self._mlflow = False
        self.local.guarded("sweep.json", lambda: self.local.write_index(self._index()))   # says so at once
        warnings.warn(f"ldpfed.tracking: MLflow at {self.tracker.display_uri} failed while {message}. The sweep "
                      f"goes on with local results only, under {self.local_dir}", RuntimeWarning, stacklevel=3)
