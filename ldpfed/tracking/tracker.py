"""Tracker: the connection to an MLflow experiment (embedded SQLite by default, or a server) and the local
folder a job's runs go to; `tracker.sweep(...)` starts a SweepRun (sweep_run.py), `tracker.log_run` logs one run.

See the package docstring (ldpfed/tracking/__init__.py) for the API and the layout of what is written.
"""
from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

from ldpfed.tracking import links, mirror, records
from ldpfed.tracking.store import (TrackingUnavailable, first_line, http_policy, probe, redact,
                                   resolve_tracking_uri, sqlite_path)
from ldpfed.tracking.sweep_run import DriverOnly, SweepRun

log = logging.getLogger("ldpfed.tracking")

# The experiment tag that makes MLflow 3's UI open an experiment in its "Model training" view (runs table),
# not its GenAI overview (traces); see mlflow/server/js (ExperimentKind.CUSTOM_MODEL_DEVELOPMENT).
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")


class Tracker(DriverOnly):
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
        self.out_dir = Path(out_dir) if out_dir is not None else Path("results") / records.slug(self.experiment)
        self.max_points = max_points
        self.probe_timeout = float(probe_timeout)
        self.request_retries, self.request_timeout = int(request_retries), float(request_timeout)
        self.strict, self.fallback_local = strict, fallback_local
        self.client = None
        self.ui_port = links.UI_PORT                # `python -m ldpfed ui --port` serves elsewhere
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
                                          f"{type(exc).__name__}: {first_line(exc)}") from exc
        self.client = client
        log.info("tracking experiment %r (id %s) at %s", self.experiment, self.experiment_id, self.display_uri)

    @property
    def display_uri(self) -> str | None:
        """The tracking URI as it may be shown or written: credentials redacted."""
        return None if self.tracking_uri is None else redact(self.tracking_uri)

    def ui_command(self) -> str | None:
        """The shell command that serves the MLflow UI for an embedded (SQLite) store; None for a server (its
        own address is the UI) or when tracking is off."""
        return links.ui_command(self.tracking_uri, self.ui_port) if self.enabled else None

    def ui_address(self) -> str | None:
        """Where the UI answers: the tracking server itself, or the address of `ui_command()`."""
        return links.ui_address(self.tracking_uri, self.ui_port) if self.enabled else None

    def runs_url(self, parent_run_id: str | None = None) -> str | None:
        """A link to the experiment's runs table; with `parent_run_id`, only that sweep's child runs."""
        return links.runs_url(self.ui_address(), self.experiment_id, parent_run_id) if self.enabled else None

    def run_url(self, run_id: str) -> str | None:
        """A link to one run's page in the UI."""
        return links.run_url(self.ui_address(), self.experiment_id, run_id) if self.enabled else None

    def artifact_url(self, run_id: str, path: str) -> str | None:
        """A link to one artifact of a run, shown in the UI's artifact viewer (e.g. a sweep's report/report.html)."""
        return links.artifact_url(self.ui_address(), self.experiment_id, run_id, path) if self.enabled else None

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
              files: dict | None = None, resume_dir: str | Path | None = None) -> SweepRun:
        """A context manager: one MLflow parent run, `log_result` per simulated run, sweep artifacts on exit.
        `description` (Markdown) is the parent run's description, followed on exit by the results table;
        `files` ({file name: text}, e.g. the sweep file) are written to the sweep folder and logged on the parent
        run at its start."""
        return SweepRun(self, name, params or {}, tags or {}, description, files or {}, resume_dir)

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
        return mirror.log_run(self, result, config, tags, records.metric_curves(result, self.max_points), folder)

    def __repr__(self):
        where = self.display_uri if self.enabled else "local only"
        return f"Tracker(experiment={self.experiment!r}, tracking={where!r}, out_dir={str(self.out_dir)!r})"


__all__ = ["Tracker", "TrackingUnavailable"]
