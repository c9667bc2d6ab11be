"""Tracker and Sweep: one MLflow parent run per sweep, one child run per simulated run, a local copy of everything.

See the package docstring (ldpfed/tracking/__init__.py) for the API and the layout of what is written.
"""
from __future__ import annotations

import logging
import os
import re
import time
import warnings
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pandas as pd

from ldpfed.tracking import records, report
from ldpfed.tracking.store import (DEFAULT_EMBEDDED_URI, TrackingUnavailable, http_policy, is_http, probe, redact,
                                   resolve_tracking_uri, scrub, sqlite_path)

log = logging.getLogger("ldpfed.tracking")

SUMMARY_FIRST = ["key", "algorithm", "env", "eps", "delta", "seed", "status", "users", "round_size", "engine",
                 "final_regret", "regret_vs_uniform", "final_estimation_error", "elapsed_s", "users_per_s"]
# The experiment tag that makes MLflow 3's UI open an experiment in its "Model training" view (runs table),
# not its GenAI overview (traces); see mlflow/server/js (ExperimentKind.CUSTOM_MODEL_DEVELOPMENT).
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
UI_PORT = 5000      # where the UI of an embedded store is served (loopback), unless a Tracker's ui_port says


def _slug(text: str) -> str:
    return re.sub(r"[^\w.=+-]", "_", str(text)).strip("._") or "run"


def _now_ms() -> int:
    return int(time.time() * 1000)


class _DriverOnly:
    def __reduce__(self):
        raise TypeError(f"{type(self).__name__} is driver-only: log results from the driver, do not ship the "
                        "tracker to Ray tasks or actors")


class Tracker(_DriverOnly):
    """Where a job's runs go: an MLflow experiment (embedded SQLite by default, or a server) and a local folder.

    Constructing a Tracker checks the tracking store (one request, `probe_timeout` seconds, no retries) and
    gets or creates the experiment, so an unreachable server is reported before any simulation work, as
    TrackingUnavailable naming the URI. With fallback_local=True that failure is a warning instead and the
    tracker writes local results only; enabled=False never touches MLflow.
    """

    def __init__(self, experiment: str, tracking_uri: str | None = None, out_dir: str | Path | None = None, *,
                 enabled: bool = True, fallback_local: bool = False, probe_timeout: float = 5.0,
                 request_retries: int = 3, request_timeout: float = 60.0, max_points: int = records.MAX_POINTS,
                 strict: bool = True):
        if not isinstance(experiment, str) or not experiment.strip():
            raise ValueError(f"experiment={experiment!r}: must be a non-empty name")
        if not (isinstance(max_points, int) and 2 <= max_points <= records.MAX_POINTS):
            raise ValueError(f"max_points={max_points!r}: must be an integer in [2, {records.MAX_POINTS}]")
        self.experiment = experiment.strip()
        self.out_dir = Path(out_dir) if out_dir is not None else Path("results") / _slug(self.experiment)
        self.max_points = max_points
        self.probe_timeout = float(probe_timeout)
        self.request_retries, self.request_timeout = int(request_retries), float(request_timeout)
        self.strict, self.fallback_local = strict, fallback_local
        self.client = None
        self.ui_port = UI_PORT                 # `python -m ldpfed ui --port` serves elsewhere
        self.experiment_id: str | None = None
        self.unavailable: TrackingUnavailable | None = None
        self.tracking_uri = resolve_tracking_uri(tracking_uri) if enabled else None
        if enabled:
            # MLflow's client prints "View run ... at <server URI>" for every run it ends on a server: a hundred
            # lines per sweep, with the URI as given (credentials included). Jobs print one redacted link instead.
            os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
            try:
                self._connect()
            except TrackingUnavailable as exc:
                if not fallback_local:
                    raise
                self.unavailable = exc
                self.client = None
                warnings.warn(f"{exc}. Continuing with local results only, under {self.out_dir}",
                              RuntimeWarning, stacklevel=2)

    @property
    def enabled(self) -> bool:
        """True when runs go to MLflow (False: local results only)."""
        return self.client is not None

    def _connect(self) -> None:
        from mlflow import MlflowClient
        from mlflow.entities import LifecycleStage
        from mlflow.exceptions import MlflowException

        uri = self.tracking_uri
        probe(uri, self.probe_timeout)
        client = MlflowClient(tracking_uri=uri)
        with http_policy(retries=0, timeout=self.probe_timeout):
            try:
                found = client.get_experiment_by_name(self.experiment)
                if found is None:
                    try:
                        self.experiment_id = client.create_experiment(
                            self.experiment, artifact_location=self._artifact_location(uri))
                    except MlflowException as exc:      # created meanwhile by another job
                        found = client.get_experiment_by_name(self.experiment)
                        if found is None:
                            raise exc
                if found is not None:
                    if found.lifecycle_stage == LifecycleStage.DELETED:
                        client.restore_experiment(found.experiment_id)
                        log.warning("restored the deleted MLflow experiment %r", self.experiment)
                    self.experiment_id = found.experiment_id
                if found is None or EXPERIMENT_KIND[0] not in (found.tags or {}):
                    client.set_experiment_tag(self.experiment_id, *EXPERIMENT_KIND)
            except TrackingUnavailable:
                raise
            except Exception as exc:  # noqa: BLE001 - report any store failure as unavailability, with its cause
                raise TrackingUnavailable(uri, f"cannot get or create experiment {self.experiment!r}: "
                                          f"{type(exc).__name__}: {_first_line(exc)}") from exc
        self.client = client
        log.info("tracking experiment %r (id %s) at %s", self.experiment, self.experiment_id, self.display_uri)

    @property
    def display_uri(self) -> str | None:
        """The tracking URI as it may be shown or written: credentials redacted."""
        return None if self.tracking_uri is None else redact(self.tracking_uri)

    def ui_command(self) -> str | None:
        """The shell command that serves the MLflow UI for an embedded (SQLite) store; None for a server (its
        own address is the UI) or when tracking is off."""
        if not self.enabled or is_http(self.tracking_uri):
            return None
        return (f"mlflow ui --backend-store-uri {self.display_uri} --host 127.0.0.1 --port {self.ui_port} --workers 1")

    def ui_address(self) -> str | None:
        """Where the UI answers: the tracking server itself, or the address of `ui_command()`."""
        if not self.enabled:
            return None
        return self.display_uri.rstrip("/") if is_http(self.tracking_uri) else f"http://127.0.0.1:{self.ui_port}"

    def runs_url(self, parent_run_id: str | None = None) -> str | None:
        """A link that opens the experiment's runs table in the "Model training" view; with `parent_run_id`, only
        that sweep's child runs (flat, not folded under the parent), best first by regret_vs_uniform."""
        if not self.enabled:
            return None
        query = "workflowType=machine_learning"
        if parent_run_id:
            search = f"tags.`ldpfed.sweep_id` = '{parent_run_id}' and tags.`ldpfed.kind` = 'run'"
            query += (f"&searchFilter={quote(search, safe='')}&orderByKey={quote('metrics.`regret_vs_uniform`', safe='')}"
                      "&orderByAsc=true")
        return f"{self.ui_address()}/#/experiments/{self.experiment_id}/runs?{query}"

    def artifact_url(self, run_id: str, path: str) -> str | None:
        """A link to one artifact of a run, shown in the UI's artifact viewer (e.g. a sweep's report/report.html)."""
        if not self.enabled:
            return None
        return (f"{self.ui_address()}/#/experiments/{self.experiment_id}/runs/{run_id}/artifacts/{path}"
                "?workflowType=machine_learning")

    @staticmethod
    def _artifact_location(uri: str) -> str | None:
        """For a SQLite store outside the cwd, artifacts beside the database (MLflow's default is ./mlruns)."""
        path = sqlite_path(uri)
        if path is None or path.parent.resolve() == Path.cwd().resolve():
            return None
        return (path.parent / "mlruns").resolve().as_uri()

    def http(self):
        """The HTTP retry policy for logging calls during a sweep (user-set environment variables win)."""
        return http_policy(self.request_retries, self.request_timeout, override_user=False)

    def sweep(self, name: str, params: dict | None = None, tags: dict | None = None, description: str = "",
              files: dict | None = None, resume_dir: str | Path | None = None) -> "Sweep":
        """A context manager: one MLflow parent run, `log_result` per simulated run, sweep artifacts on exit.
        `description` (Markdown) is the parent run's description, followed on exit by the results table;
        `files` ({file name: text}, e.g. the sweep file) are written to the sweep folder and logged on the parent
        run at its start."""
        return Sweep(self, name, params or {}, tags or {}, description, files or {}, resume_dir)

    def _log_run(self, result, config, tags, curves, folder: Path, parent_run_id: str | None = None) -> str:
        """One MLflow run of a RunResult (a child of `parent_run_id` if given): params, tags, metric curves with
        step = users, the final scalars once (step 0), the local files of `folder` as artifacts."""
        client = self.client
        summary = result.summary or {}
        elapsed = summary.get("elapsed_s")
        now = _now_ms()
        start = now - int(float(elapsed) * 1000) if records.finite(elapsed) else now
        metrics = [_metric(name, value, step, now)
                   for name, (steps, values) in curves.items() for step, value in zip(steps, values)]
        # Scalars once, at step 0: MLflow lists them with the run's metrics, not as charts along the users axis.
        metrics += [_metric(name, value, 0, now) for name, value in records.final_metrics(result).items()
                    if name not in curves]
        with self.http():
            run = client.create_run(self.experiment_id, start_time=start, run_name=records.run_name(config),
                                    tags={**tags, **({"mlflow.parentRunId": parent_run_id} if parent_run_id else {})})
            run_id = run.info.run_id
            try:
                client.log_batch(run_id, metrics=metrics, params=_params(records.run_params(result)))
                client.log_artifacts(run_id, str(folder))
                client.set_terminated(run_id, status="FINISHED", end_time=_now_ms())
            except Exception:
                try:        # do not leave a half-logged child RUNNING; one quick try
                    with http_policy(retries=0, timeout=self.probe_timeout):
                        client.set_terminated(run_id, status="FAILED")
                except Exception:  # noqa: BLE001
                    pass
                raise
        return run_id

    def log_run(self, result) -> str:
        """Log one RunResult as a run of its own (no sweep, no parent): the files under out_dir/runs/<key>/ first,
        then the MLflow run; returns its run id (`ldpfed run --track`)."""
        if not self.enabled:
            raise TrackingUnavailable(str(self.tracking_uri), "tracking is off for this Tracker")
        config = records.config_dict(result.config)
        key = records.run_key(config)
        tags = {**records.run_tags(result), "ldpfed.kind": "run", "ldpfed.key": key}
        folder = self.out_dir / "runs" / key
        records.write_run(folder, result, tags)
        with self.http():
            return self._log_run(result, config, tags, records.metric_curves(result, self.max_points), folder)

    def run_url(self, run_id: str) -> str | None:
        """A link to one run's page in the UI, in the "Model training" view (without `workflowType` MLflow 3 shows
        the page in its GenAI view, where a run's description is not shown)."""
        if not self.enabled:
            return None
        return f"{self.ui_address()}/#/experiments/{self.experiment_id}/runs/{run_id}?workflowType=machine_learning"

    def __repr__(self):
        where = self.display_uri if self.enabled else "local only"
        return f"Tracker(experiment={self.experiment!r}, tracking={where!r}, out_dir={str(self.out_dir)!r})"


class Sweep(_DriverOnly):
    """One sweep: a parent run, a child run per `log_result`, and the local folder `local_dir`.

    Local files are written first, for every result, whatever MLflow does. If MLflow fails during the sweep
    the sweep warns, stops calling MLflow, keeps writing locally, and (Tracker strict=True) raises
    TrackingUnavailable on exit, after every local file is written.
    """

    def __init__(self, tracker: Tracker, name: str, params: dict, tags: dict, description: str = "",
                 files: dict | None = None, resume_dir: str | Path | None = None):
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"sweep name={name!r}: must be a non-empty string")
        if not isinstance(params, dict) or not isinstance(tags, dict):
            raise ValueError("sweep params and tags must be mappings")
        self.tracker, self.name = tracker, name.strip()
        self.params, self.tags = params, {str(k): str(v) for k, v in tags.items()}
        self.description, self.files = str(description or ""), {_slug(k): str(v) for k, v in (files or {}).items()}
        self.local_dir = tracker.out_dir / _slug(self.name)
        self.parent_run_id: str | None = None
        self.run_ids: dict[str, str | None] = {}
        self.errors: list[str] = []                 # MLflow failures (the local copy is complete regardless)
        self.failures: dict[str, str] = {}          # runs that raised, by key (log_failure)
        self._rows: list[dict] = []
        self._curves: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._active = False
        self._mlflow = False
        self.resumed = resume_dir is not None
        self.unreadable: list[str] = []             # local files of an earlier session that could not be read
        self.local_errors: list[str] = []           # writes of the sweep's own files that failed (disk full...)
        if resume_dir is not None:
            self.local_dir = Path(resume_dir)
            self._load_previous()

    # ------------------------------------------------------------------ resume
    def _load_previous(self) -> None:
        """Continue the sweep in `local_dir`: its finished runs (rows of the summary whose run files are intact)
        are kept and not run again; failed or missing runs will be run; its MLflow parent run is reused."""
        try:
            index = records.read_json(self.local_dir / "sweep.json")
        except (OSError, ValueError) as exc:
            raise ValueError(f"{self.local_dir}: not a sweep folder to resume ({type(exc).__name__}: {exc})") from exc
        self.parent_run_id = index.get("parent_run_id")
        summary_path = self.local_dir / "summary" / "summary.parquet"
        try:
            frame = pd.read_parquet(summary_path) if summary_path.exists() else pd.DataFrame()
        except Exception as exc:  # noqa: BLE001 - a corrupt table: rebuild from the run folders below
            self.unreadable.append(f"{summary_path}: {type(exc).__name__}: {_first_line(exc)}")
            frame = pd.DataFrame()
        rows = frame.to_dict("records") if not frame.empty and "status" in frame.columns else []
        for row in rows:
            row = {k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in row.items()}
            if row.get("status") != "FINISHED" or not row.get("local_dir"):
                continue
            table_path = self.local_dir / str(row["local_dir"]) / "table.parquet"
            try:
                table = pd.read_parquet(table_path, columns=["users", "cumulative_regret"])
            except Exception as exc:  # noqa: BLE001 - that run is run again
                self.unreadable.append(f"{table_path}: {type(exc).__name__}: {_first_line(exc)}")
                continue
            key = str(row["key"])
            self._rows.append(row)
            self.run_ids[key] = (index.get("runs") or {}).get(key) or row.get("run_id")
            users = table["users"].to_numpy(dtype=np.int64)
            keep = records.downsample_index(len(users), self.tracker.max_points)
            self._curves[key] = (users[keep], table["cumulative_regret"].to_numpy(dtype=float)[keep])

    @property
    def finished_keys(self) -> set[str]:
        """Keys of the runs this sweep holds as finished (after a resume: those of the earlier sessions too)."""
        return {str(row["key"]) for row in self._rows if row.get("status") == "FINISHED"}

    def checkpoint_dir(self, config) -> Path:
        """Where the run of `config` keeps its checkpoints while it runs."""
        return self.local_dir / "checkpoints" / records.run_key(records.config_dict(config))

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> "Sweep":
        if self.resumed:
            self.local_dir.mkdir(parents=True, exist_ok=True)
        else:
            self._prepare_local_dir()
        self._active = True
        self._mlflow = self.tracker.enabled
        for file_name, text in self.files.items():
            (self.local_dir / file_name).write_text(text)
        records.write_json(self.local_dir / "sweep.json", self._index())
        if self._mlflow:
            client = self.tracker.client
            tags = {**self.tags, "ldpfed.kind": "sweep", "ldpfed.sweep": self.name, **records.code_version(),
                    "mlflow.note.content": self.description or f"Sweep {self.name} (running)"}
            params = {records.mlflow_key(k): records.param_text(v) for k, v in records.flatten(self.params).items()}
            try:
                with self.tracker.http():
                    if self.resumed and self._parent_exists():     # the same parent run, running again
                        client.update_run(self.parent_run_id, status="RUNNING")
                    else:
                        run = client.create_run(self.tracker.experiment_id, run_name=self.name, tags=tags)
                        self.parent_run_id = run.info.run_id
                        client.log_batch(self.parent_run_id, params=_params(params),
                                         tags=_tags({"ldpfed.sweep_id": self.parent_run_id}))
                    for file_name in self.files:
                        client.log_artifact(self.parent_run_id, str(self.local_dir / file_name))
            except Exception as exc:  # noqa: BLE001
                if not self.tracker.fallback_local:     # still before any simulation work: fail now
                    self._active = False
                    raise TrackingUnavailable(self.tracker.tracking_uri,
                                              f"cannot start the parent run of sweep {self.name!r}: "
                                              f"{type(exc).__name__}: {_first_line(exc)}") from exc
                self._mlflow_failed("starting the sweep's parent run", exc)
        records.write_json(self.local_dir / "sweep.json", self._index())
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
        self._add_relative_regret()
        self._write_combined()
        plot_files = self._write_plots()
        table = self._write_report(plot_files)
        records.write_json(self.local_dir / "sweep.json", self._index(status=status))
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

    def _add_relative_regret(self) -> None:
        """Each finished run's final regret over uniform play's median on its env (see report.py)."""
        frame = self.summary
        if frame.empty or "final_regret" not in frame.columns:
            return
        for row, value in zip(self._rows, report.relative_to_uniform(frame)):
            row["regret_vs_uniform"] = value if np.isfinite(value) else None

    def _write_report(self, plot_files: list[Path]) -> pd.DataFrame:
        """report/regret_table.md and report/report.html (the table grouped by env, the plots embedded)."""
        frame = self.summary
        folder = self.local_dir / "report"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "regret_table.md").write_text(report.markdown_table(frame) + "\n")
        (folder / "report.html").write_text(report.html_report(
            f"Sweep {self.name}", self.description.splitlines()[0] if self.description else "", frame, plot_files))
        return report.grouped_table(frame)

    def _log_aggregates(self, client, table: pd.DataFrame) -> None:
        """On the parent run: the description followed by the results table, run counts and one metric per
        (algorithm, env, eps) group (median regret over uniform's); on every child run its regret over uniform's,
        so the runs table sorts across envs."""
        failed = len(self.failures)
        text = (self.description + "\n\n" if self.description else "") + \
            f"{len(self._rows) - failed} runs finished, {failed} failed.\n\n" + report.markdown_table(self.summary)
        metrics = [_metric("runs", len(self._rows), 0), _metric("failed_runs", failed, 0)]
        for r in table.itertuples(index=False):
            if np.isfinite(r.regret_vs_uniform) and r.algorithm != "uniform":
                eps = "non-private" if not np.isfinite(r.eps) else f"eps_{r.eps:g}"
                metrics.append(_metric(records.mlflow_key(f"regret_vs_uniform/{r.env}/{r.algorithm}/{eps}"),
                                       r.regret_vs_uniform, 0))
        client.log_batch(self.parent_run_id, metrics=metrics,
                         tags=_tags({**self._sweep_tags(), "mlflow.note.content": text[:5000]}))
        for row in self._rows:
            if row.get("run_id") and row.get("regret_vs_uniform") is not None:
                client.log_batch(row["run_id"], metrics=[_metric("regret_vs_uniform", row["regret_vs_uniform"], 0)])

    # ------------------------------------------------------------------ per run
    def log_result(self, result) -> dict:
        """Record one RunResult: local files first, then an MLflow child run. Returns the run's row of the
        combined summary (with `key`, `local_dir`, `run_id`)."""
        if not self._active:
            raise RuntimeError("log_result outside `with tracker.sweep(...)`")
        config = records.config_dict(result.config)
        key = self._unique(records.run_key(config))
        tags = {**self.tags, **records.run_tags(result), "ldpfed.kind": "run", "ldpfed.sweep": self.name,
                "ldpfed.key": key, **self._sweep_id()}
        folder = self.local_dir / "runs" / key
        try:
            records.write_run(folder, result, tags)                 # 1. never lost
        except OSError as exc:    # disk full, unwritable: this run fails, the sweep goes on
            return self.log_failure(config, f"{type(exc).__name__}: writing the results to {folder} failed: {exc}")
        curves = records.metric_curves(result, self.tracker.max_points)
        if "cumulative_regret" in curves:
            self._curves[key] = curves["cumulative_regret"]
        row = {"key": key, **{k: v for k, v in (result.summary or {}).items()},
               "privacy_model": tags["privacy_model"], "mechanisms": tags["mechanisms"],
               "status": "FINISHED", "local_dir": str(folder.relative_to(self.local_dir)), "run_id": None}
        if not records.is_private(config):      # eps played no part: not drawn or grouped at an eps
            row["eps"] = None
        for field in ("algorithm", "env", "eps", "delta", "seed", "users", "round_size"):
            row.setdefault(field, config.get(field))
        self.run_ids[key] = None
        self._rows.append(row)
        self._local("the combined summary", self._write_combined)  # 2. the combined table, after every run
        if self._mlflow:                                            # 3. MLflow
            try:
                self._check_alive()
                row["run_id"] = self.run_ids[key] = self._log_child(result, config, tags, curves, folder)
            except Exception as exc:  # noqa: BLE001
                self._mlflow_failed(f"logging run {key}", exc)
            self._local("the combined summary", self._write_combined)
        self._local("sweep.json", lambda: records.write_json(self.local_dir / "sweep.json", self._index()))
        return dict(row)

    def log_failure(self, config, error) -> dict:
        """Record a run that raised instead of finishing: in the local summary and sweep.json (status FAILED,
        the error text), and as a FAILED MLflow child run with the run's config as params."""
        if not self._active:
            raise RuntimeError("log_failure outside `with tracker.sweep(...)`")
        config = records.config_dict(config)
        key = self._unique(records.run_key(config))
        text = str(error)[:5000] or type(error).__name__
        row = {"key": key, **{f: config.get(f) for f in ("algorithm", "env", "eps", "delta", "seed", "users",
                                                         "round_size")},
               "status": "FAILED", "error": text, "local_dir": None, "run_id": None}
        if not records.is_private(config):
            row["eps"] = None
        self.run_ids[key] = None
        self._rows.append(row)
        self.failures[key] = text
        self._local("the combined summary", self._write_combined)
        if self._mlflow:
            client = self.tracker.client
            params = flatten_params(config)
            if not records.is_private(config):
                params["eps"] = "n/a"
            try:
                self._check_alive()
                with self.tracker.http():
                    run = client.create_run(self.tracker.experiment_id, run_name=records.run_name(config),
                                            tags={**self.tags, "ldpfed.kind": "run", "ldpfed.sweep": self.name,
                                                  "ldpfed.key": key, "error": text[:5000], **self._sweep_id(),
                                                  "mlflow.parentRunId": self.parent_run_id,
                                                  **records.code_version()})
                    client.log_batch(run.info.run_id, params=_params(params))
                    client.set_terminated(run.info.run_id, status="FAILED")
                row["run_id"] = self.run_ids[key] = run.info.run_id
            except Exception as exc:  # noqa: BLE001
                self._mlflow_failed(f"logging the failure of run {key}", exc)
            self._local("the combined summary", self._write_combined)
        self._local("sweep.json", lambda: records.write_json(self.local_dir / "sweep.json", self._index()))
        return dict(row)

    def _sweep_id(self) -> dict:
        """The tag that puts a run in this sweep in the UI's filter (the parent's id; runs of an earlier sweep of
        the same name have another)."""
        return {"ldpfed.sweep_id": self.parent_run_id} if self.parent_run_id else {}

    def _unique(self, key: str) -> str:
        if key not in self.run_ids:
            return key
        n = 2
        while f"{key}-{n}" in self.run_ids:
            n += 1
        return f"{key}-{n}"

    def _log_child(self, result, config, tags, curves, folder: Path) -> str:
        return self.tracker._log_run(result, config, tags, curves, folder, self.parent_run_id)

    # ------------------------------------------------------------------ helpers
    def _check_alive(self) -> None:
        """One short request (probe_timeout, no retries) before a run's many: a frozen or dead server is found in
        seconds, not after MLflow's retries and timeouts (minutes per call)."""
        if is_http(self.tracker.tracking_uri):
            probe(self.tracker.tracking_uri, self.tracker.probe_timeout)

    def _local(self, what: str, write) -> None:
        """A write of the sweep's own files while runs go on: a failure (disk full) is reported, not raised, so
        one bad write never ends the sweep; each run's own files are written (and checked) by log_result."""
        try:
            write()
        except OSError as exc:
            message = f"writing {what} under {self.local_dir}: {type(exc).__name__}: {exc}"
            self.local_errors.append(message)
            warnings.warn(f"ldpfed.tracking: {message}", RuntimeWarning, stacklevel=3)

    @property
    def summary(self) -> pd.DataFrame:
        """The combined summary table: one row per logged run."""
        frame = pd.DataFrame(self._rows)
        if frame.empty:
            return frame
        first = [c for c in SUMMARY_FIRST if c in frame.columns]
        return frame[first + [c for c in frame.columns if c not in first]]

    def _prepare_local_dir(self) -> None:
        """A free folder: `<name>`, else `<name>-2`, `<name>-3`, ...; an earlier sweep's folder is never moved or
        overwritten (its MLflow runs and printed paths stay valid)."""
        base, n = self.local_dir, 2
        while self.local_dir.exists() and any(self.local_dir.iterdir()):
            self.local_dir = base.with_name(f"{base.name}-{n}")
            n += 1
        if self.local_dir != base:
            log.info("sweep %r: %s is taken by an earlier sweep, writing to %s", self.name, base, self.local_dir)
        self.local_dir.mkdir(parents=True, exist_ok=True)

    def _write_combined(self) -> None:
        frame = self.summary
        if frame.empty:
            return
        frame = frame.astype({c: "string" for c in frame.columns if frame[c].dtype == object})
        records.write_parquet(self.local_dir / "summary" / "summary.parquet", frame)
        records.write_csv(self.local_dir / "summary" / "summary.csv", frame)

    def _write_plots(self) -> list[Path]:
        from ldpfed.tracking import plots       # matplotlib only when a sweep ends

        return plots.sweep_plots(self.summary, self._curves, self.local_dir / "plots", self.name)

    def _sweep_tags(self) -> dict:
        frame = self.summary
        tags = {}
        for column, tag in (("algorithm", "algorithms"), ("env", "envs"), ("engine", "engine"),
                            ("privacy_model", "privacy_models")):
            if column in frame.columns:
                tags[tag] = ",".join(sorted(str(v) for v in frame[column].dropna().unique()))
        if "eps" in frame.columns:
            tags["eps_values"] = ",".join(f"{v:g}" for v in sorted(frame["eps"].dropna().unique()))
        return tags

    def _index(self, status: str = "RUNNING") -> dict:
        return {"sweep": self.name, "experiment": self.tracker.experiment, "status": status,
                "tracking_uri": self.tracker.display_uri if self._mlflow else None,
                "experiment_id": self.tracker.experiment_id if self._mlflow else None,
                "parent_run_id": self.parent_run_id, "runs": self.run_ids, "failed_runs": self.failures,
                "mlflow_errors": self.errors,
                "params": records.to_jsonable(self.params), "tags": self.tags}

    def _mlflow_failed(self, what: str, exc: BaseException) -> None:
        message = f"{what}: {type(exc).__name__}: {_first_line(exc)}"
        self.errors.append(message)
        self._mlflow = False
        warnings.warn(f"ldpfed.tracking: MLflow at {self.tracker.display_uri} failed while {message}. The sweep "
                      f"goes on with local results only, under {self.local_dir}", RuntimeWarning, stacklevel=3)


def flatten_params(config: dict) -> dict:
    flat = records.flatten(config)
    return {records.mlflow_key(k): records.param_text(v) for k, v in flat.items()}


def _metric(key: str, value, step, timestamp: int | None = None):
    from mlflow.entities import Metric

    return Metric(key=key, value=float(value), timestamp=timestamp or _now_ms(), step=int(step))


def _params(params: dict):
    from mlflow.entities import Param

    return [Param(k, v) for k, v in params.items()]


def _tags(tags: dict):
    from mlflow.entities import RunTag

    return [RunTag(k, str(v)) for k, v in tags.items()]


def _first_line(exc: BaseException) -> str:
    """The first line of an error, with any URI's credentials redacted (errors may quote the tracking URI)."""
    text = str(exc).strip().splitlines()
    return scrub(text[0][:300]) if text else ""


__all__ = ["Tracker", "Sweep", "TrackingUnavailable", "DEFAULT_EMBEDDED_URI"]
