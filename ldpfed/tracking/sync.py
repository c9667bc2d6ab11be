"""Repair an MLflow copy from the local results: `python -m ldpfed sync RESULTS_DIR [--tracking-uri URI]`.

The local folder of a sweep (written first, whatever MLflow does: see local.py) holds everything: sweep.json
(the sweep's name, experiment, status, parent run id), summary/summary.parquet (one row per run, FINISHED or
FAILED), runs/<key>/ (table.parquet, summary.json, ledger.json, config.json), report/, plots/. `sync` uploads
what MLflow lacks:
* the parent run (created if it is not in this store), with the sweep's status (FINISHED, FAILED, KILLED);
* a child run per finished run that MLflow does not hold as FINISHED (a half-logged child, left RUNNING or
  FAILED by a server that died mid-call, is deleted and logged again in full: params, metric curves, artifacts);
* a FAILED child per failed run that has none;
* the parent's artifacts (summary, report, plots, sweep.json).
It is idempotent: a second sync finds every run FINISHED and uploads no run again. Unreadable local files are
skipped and reported, never fatal. sweep.json then records the parent and child run ids of this store.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pandas as pd

from ldpfed.tracking import mirror, records
from ldpfed.tracking.tracker import Tracker

TERMINAL = ("FINISHED", "FAILED", "KILLED")


@dataclass
class SyncReport:
    folder: Path
    parent_run_id: str | None = None
    parent_created: bool = False
    uploaded: list = field(default_factory=list)        # keys of finished runs logged now
    already: list = field(default_factory=list)         # keys MLflow held as FINISHED
    failed_logged: list = field(default_factory=list)   # keys of failed runs logged now as FAILED children
    replaced: list = field(default_factory=list)        # half-logged children deleted and logged again
    skipped: list = field(default_factory=list)         # (path, why): unreadable local files
    status: str | None = None

    def line(self) -> str:
        return (f"{self.folder}: parent {self.parent_run_id}{' (created)' if self.parent_created else ''} "
                f"{self.status}; {len(self.uploaded)} runs uploaded ({len(self.replaced)} replacing half-logged "
                f"ones), {len(self.already)} already there, {len(self.failed_logged)} failed runs recorded, "
                f"{len(self.skipped)} unreadable skipped")


def sweep_folders(path: Path) -> list[Path]:
    """`path` itself if it is a sweep folder (has sweep.json), else its sub-folders that are."""
    path = Path(path)
    if (path / "sweep.json").exists():
        return [path]
    return sorted(p for p in path.iterdir() if p.is_dir() and (p / "sweep.json").exists()) if path.is_dir() else []


def load_run(folder: Path):
    """A RunResult-like record of one finished run from its local files (what mirror.log_run needs)."""
    saved = records.read_json(folder / "config.json")
    return SimpleNamespace(config=saved["config"], env=saved.get("env") or {},
                           summary=records.read_json(folder / "summary.json"),
                           ledger=records.read_json(folder / "ledger.json"),
                           table=pd.read_parquet(folder / "table.parquet")), saved.get("tags") or {}


def sync(path, tracking_uri: str | None = None, experiment: str | None = None, log=print) -> list[SyncReport]:
    """Sync every sweep folder under `path` (or `path` itself) to the tracking store; returns one report each."""
    folders = sweep_folders(Path(path))
    if not folders:
        raise FileNotFoundError(f"{path}: no sweep folder (a folder with sweep.json) there")
    reports = []
    trackers: dict = {}
    for folder in folders:
        try:
            index = records.read_json(folder / "sweep.json")
        except (OSError, ValueError) as exc:
            report = SyncReport(folder, skipped=[(str(folder / "sweep.json"), f"{type(exc).__name__}: {exc}")])
            log(f"{folder}: skipped, sweep.json unreadable ({type(exc).__name__}: {exc})")
            reports.append(report)
            continue
        name = experiment or index.get("experiment") or "run_all"
        if name not in trackers:
            trackers[name] = Tracker(experiment=name, tracking_uri=tracking_uri, out_dir=folder.parent)
        report = sync_sweep(folder, index, trackers[name])
        log(report.line())
        for where, why in report.skipped:
            log(f"  unreadable, skipped: {where}: {why}")
        reports.append(report)
    return reports


def sync_sweep(folder: Path, index: dict, tracker: Tracker) -> SyncReport:
    client = tracker.client
    report = SyncReport(folder)
    name = index.get("sweep") or folder.name
    status = index.get("status") or "RUNNING"
    with tracker.http():
        parent = index.get("parent_run_id")
        if parent and not _active(client, parent):
            parent = None
        if parent is None:
            tags = {**(index.get("tags") or {}), "ldpfed.kind": "sweep", "ldpfed.sweep": name,
                    "ldpfed.synced": "true", **records.code_version()}
            parent = mirror.start_parent(tracker, name, index.get("params") or {}, tags)
            report.parent_created = True
        report.parent_run_id = parent
        children: dict[str, list] = {}
        for run in client.search_runs([tracker.experiment_id], f"tags.`ldpfed.sweep_id` = '{parent}'",
                                      max_results=50000):
            key = run.data.tags.get("ldpfed.key")
            if key and run.info.run_id != parent:
                children.setdefault(key, []).append(run)

        rows, run_ids = _rows(folder, report), dict(index.get("runs") or {})
        for row in rows:
            key = str(row["key"])
            present = children.get(key, [])
            done = [r for r in present if r.info.status == "FINISHED"]
            if row.get("status") == "FINISHED":
                if done:
                    report.already.append(key)
                    run_ids[key] = done[0].info.run_id
                    continue
                run_folder = folder / str(row.get("local_dir") or Path("runs") / key)
                try:
                    result, tags = load_run(run_folder)
                except Exception as exc:  # noqa: BLE001 - a corrupt file: report it, sync the rest
                    report.skipped.append((str(run_folder), f"{type(exc).__name__}: {exc}"))
                    continue
                for stale in present:         # half-logged by a server that went away: replace in full
                    client.delete_run(stale.info.run_id)
                    report.replaced.append(key)
                tags = {**tags, "ldpfed.key": key, "ldpfed.sweep_id": parent, "ldpfed.synced": "true"}
                config = records.config_dict(result.config)
                run_ids[key] = mirror.log_run(tracker, result, config, tags,
                                              records.metric_curves(result, tracker.max_points), run_folder, parent)
                report.uploaded.append(key)
            elif row.get("status") == "FAILED" and not present:
                config = {f: row.get(f) for f in records.RUN_FIELDS}
                config = {k: v for k, v in config.items() if v is not None and not _nan(v)}
                run_ids[key] = mirror.log_failed_run(tracker, config, {
                    **(index.get("tags") or {}), "ldpfed.kind": "run", "ldpfed.sweep": name, "ldpfed.key": key,
                    "ldpfed.sweep_id": parent, "ldpfed.synced": "true"}, str(row.get("error") or ""), parent)
                report.failed_logged.append(key)
            elif present:
                run_ids[key] = present[0].info.run_id

        for sub in ("summary", "report"):
            if (folder / sub).is_dir():
                client.log_artifacts(parent, str(folder / sub), sub)
        for plot in sorted((folder / "plots").glob("*.png")) if (folder / "plots").is_dir() else ():
            client.log_artifact(parent, str(plot), "plots")
        finished = sum(1 for row in rows if row.get("status") == "FINISHED")
        client.log_batch(parent, metrics=[mirror.metric("runs", len(rows)),
                                          mirror.metric("failed_runs", len(rows) - finished)])
        if status in TERMINAL:
            client.set_terminated(parent, status=status)
        report.status = status if status in TERMINAL else "RUNNING (the sweep never ended: resume it)"

    index.update({"parent_run_id": parent, "runs": run_ids, "tracking_uri": tracker.display_uri,
                  "experiment": tracker.experiment, "experiment_id": tracker.experiment_id, "mlflow_errors": [],
                  "synced_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    records.write_json(folder / "sweep.json", index)
    with tracker.http():
        client.log_artifact(parent, str(folder / "sweep.json"))
    return report


def _rows(folder: Path, report: SyncReport) -> list[dict]:
    """The sweep's runs from its summary table, else (table unreadable) from its run folders."""
    path = folder / "summary" / "summary.parquet"
    try:
        frame = pd.read_parquet(path)
        return [row for row in frame.to_dict("records") if row.get("key") is not None]
    except Exception as exc:  # noqa: BLE001
        if path.exists():
            report.skipped.append((str(path), f"{type(exc).__name__}: {exc}"))
    return [{"key": p.name, "status": "FINISHED", "local_dir": f"runs/{p.name}"}
            for p in sorted((folder / "runs").iterdir()) if p.is_dir()] if (folder / "runs").is_dir() else []


def _active(client, run_id: str) -> bool:
    try:
        return client.get_run(run_id).info.lifecycle_stage == "active"
    except Exception:  # noqa: BLE001 - not in this store
        return False


def _nan(value) -> bool:
    return isinstance(value, float) and value != value
