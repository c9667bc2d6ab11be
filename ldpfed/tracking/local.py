"""A sweep's local folder, the source of truth: every run's files, the combined summary, sweep.json, the report
and the plots. Written first, whatever MLflow does; MLflow is a mirror of it (mirror.py, sync.py).

Layout (under `local_dir`; see the package docstring): runs/<key>/ (table.parquet, summary.json, ledger.json,
config.json), summary/summary.{parquet,csv}, sweep.json, plots/*.png, report/ (regret_table.md, report.html),
checkpoints/<key>/ while a run runs, and the sweep's own `files` (e.g. sweep.toml).
"""
from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from ldpfed.tracking import records, report
from ldpfed.tracking.store import first_line

log = logging.getLogger("ldpfed.tracking")

COMBINED_EVERY_S = 5.0       # the combined summary's rewrites while runs go on (see write_soon)
SUMMARY_FIRST = ["key", "algorithm", "env", "eps", "delta", "seed", "status", "users", "round_size", "engine",
                 "final_regret", "regret_vs_uniform", "final_estimation_error", "elapsed_s", "users_per_s"]


class LocalSweep:
    """The rows, curves and files of one sweep in `local_dir`; `resume=True` continues the sweep found there."""

    def __init__(self, local_dir: Path, name: str, max_points: int, resume: bool = False):
        self.local_dir, self.name, self.max_points = Path(local_dir), name, max_points
        self.rows: list[dict] = []
        self.curves: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.run_ids: dict[str, str | None] = {}    # key -> MLflow run id (None: not in MLflow)
        self.failures: dict[str, str] = {}          # runs that raised, by key
        self.unreadable: list[str] = []             # local files of an earlier session that could not be read
        self.local_errors: list[str] = []           # writes of the sweep's own files that failed (disk full...)
        self.previous: dict = {}                    # sweep.json of the earlier session (resume)
        self._combined_at = -float("inf")            # when the combined summary was last written (monotonic)
        if resume:
            self._load_previous()

    # ------------------------------------------------------------------ resume
    def _load_previous(self) -> None:
        """Continue the sweep in `local_dir`: its finished runs (rows of the summary whose run files are intact)
        are kept and not run again; failed or missing runs will be run."""
        try:
            self.previous = records.read_json(self.local_dir / "sweep.json")
        except (OSError, ValueError) as exc:
            raise ValueError(f"{self.local_dir}: not a sweep folder to resume ({type(exc).__name__}: {exc})") from exc
        summary_path = self.local_dir / "summary" / "summary.parquet"
        try:
            frame = pd.read_parquet(summary_path) if summary_path.exists() else pd.DataFrame()
        except Exception as exc:  # noqa: BLE001 - a corrupt table: rebuild from the run folders below
            self.unreadable.append(f"{summary_path}: {type(exc).__name__}: {first_line(exc)}")
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
                self.unreadable.append(f"{table_path}: {type(exc).__name__}: {first_line(exc)}")
                continue
            key = str(row["key"])
            self.rows.append(row)
            self.run_ids[key] = (self.previous.get("runs") or {}).get(key) or row.get("run_id")
            self._keep_curve(key, table)
        self._find_unlisted()

    def _keep_curve(self, key: str, table: pd.DataFrame) -> None:
        """A finished run's cumulative-regret curve (for the sweep's plots), from its table's two columns."""
        users = table["users"].to_numpy(dtype=np.int64)
        keep = records.downsample_index(len(users), self.max_points)
        self.curves[key] = (users[keep], table["cumulative_regret"].to_numpy(dtype=float)[keep])

    def _find_unlisted(self) -> None:
        """Finished runs whose folders are complete but whose rows the combined summary had not received yet (the
        sweep was killed between two writes of it): their rows, rebuilt from their own files."""
        listed = {str(row["key"]) for row in self.rows}
        for folder in sorted((self.local_dir / "runs").glob("*/")):
            key = folder.name
            if key in listed:
                continue
            try:
                saved = records.read_json(folder / "config.json")
                summary = records.read_json(folder / "summary.json")
                table = pd.read_parquet(folder / "table.parquet", columns=["users", "cumulative_regret"])
            except Exception:  # noqa: BLE001 - an incomplete folder: that run is run again
                continue
            if not (folder / "ledger.json").exists():
                continue
            tags = saved.get("tags") or {}
            row = records.summary_row(key, saved.get("config") or {}, "FINISHED", **summary,
                                      privacy_model=tags.get("privacy_model"), mechanisms=tags.get("mechanisms"),
                                      local_dir=str(folder.relative_to(self.local_dir)))
            row["run_id"] = (self.previous.get("runs") or {}).get(key)
            self.rows.append(row)
            self.run_ids[key] = row["run_id"]
            self._keep_curve(key, table)

    @property
    def finished_keys(self) -> set[str]:
        """Keys of the runs held as finished (after a resume: those of the earlier sessions too)."""
        return {str(row["key"]) for row in self.rows if row.get("status") == "FINISHED"}

    def checkpoint_dir(self, config) -> Path:
        """Where the run of `config` keeps its checkpoints while it runs."""
        return self.local_dir / "checkpoints" / records.run_key(records.config_dict(config))

    def prepare(self, resumed: bool, files: dict) -> None:
        """The folder, with the sweep's `files` in it. A new sweep takes a free folder: `<name>`, else `<name>-2`,
        `<name>-3`, ...; an earlier sweep's folder is never moved or overwritten (its MLflow runs and printed
        paths stay valid)."""
        if not resumed:
            base, n = self.local_dir, 2
            while self.local_dir.exists() and any(self.local_dir.iterdir()):
                self.local_dir = base.with_name(f"{base.name}-{n}")
                n += 1
            if self.local_dir != base:
                log.info("sweep %r: %s is taken by an earlier sweep, writing to %s", self.name, base, self.local_dir)
        self.local_dir.mkdir(parents=True, exist_ok=True)
        for file_name, text in files.items():
            (self.local_dir / file_name).write_text(text)

    # ------------------------------------------------------------------ per run
    def unique(self, key: str) -> str:
        if key not in self.run_ids:
            return key
        n = 2
        while f"{key}-{n}" in self.run_ids:
            n += 1
        return f"{key}-{n}"

    def add_result(self, key: str, result, config: dict, tags: dict, curves: dict) -> dict:
        """A finished run: its files under runs/<key>/ (an OSError, e.g. disk full, is raised before anything is
        recorded), its cumulative-regret curve (of `curves`, `records.metric_curves(result, self.max_points)`) and
        its summary row, which is returned."""
        folder = self.local_dir / "runs" / key
        records.write_run(folder, result, tags)
        if "cumulative_regret" in curves:
            self.curves[key] = curves["cumulative_regret"]
        row = records.summary_row(key, config, "FINISHED", **(result.summary or {}),
                                  privacy_model=tags["privacy_model"], mechanisms=tags["mechanisms"],
                                  local_dir=str(folder.relative_to(self.local_dir)))
        self._add(key, row)
        return row

    def add_failure(self, key: str, config: dict, text: str) -> dict:
        """A run that raised: its summary row (status FAILED, the error text), which is returned."""
        row = records.summary_row(key, config, "FAILED", error=text)
        self.failures[key] = text
        self._add(key, row)
        return row

    def _add(self, key: str, row: dict) -> None:
        self.run_ids[key] = None
        self.rows.append(row)

    def write_soon(self, index) -> None:
        """The combined summary and sweep.json (`index()` gives its content) while runs go on, at most every
        COMBINED_EVERY_S: rewriting both after each run made logging quadratic in the runs. The sweep's end writes
        them whatever happened; a resume after a hard kill finds the runs they had not listed yet by their folders
        (`_load_previous`), and `ldpfed sync` finds the MLflow runs by their `ldpfed.key` tags."""
        if time.monotonic() - self._combined_at >= COMBINED_EVERY_S:
            self.guarded("the combined summary", self.write_combined)
            self.guarded("sweep.json", lambda: self.write_index(index()))

    def guarded(self, what: str, write) -> None:
        """A write of the sweep's own files while runs go on: a failure (disk full) is reported, not raised, so
        one bad write never ends the sweep; each run's own files are written (and checked) by add_result."""
        try:
            write()
        except OSError as exc:
            message = f"writing {what} under {self.local_dir}: {type(exc).__name__}: {exc}"
            self.local_errors.append(message)
            warnings.warn(f"ldpfed.tracking: {message}", RuntimeWarning, stacklevel=4)

    # ------------------------------------------------------------------ the sweep's tables, report and plots
    @property
    def summary(self) -> pd.DataFrame:
        """The combined summary table: one row per logged run."""
        frame = pd.DataFrame(self.rows)
        if frame.empty:
            return frame
        first = [c for c in SUMMARY_FIRST if c in frame.columns]
        return frame[first + [c for c in frame.columns if c not in first]]

    def write_combined(self) -> None:
        self._combined_at = time.monotonic()
        frame = self.summary
        if frame.empty:
            return
        frame = frame.astype({c: "string" for c in frame.columns if frame[c].dtype == object})
        records.write_parquet(self.local_dir / "summary" / "summary.parquet", frame)
        records.write_csv(self.local_dir / "summary" / "summary.csv", frame)

    def write_index(self, index: dict) -> None:
        records.write_json(self.local_dir / "sweep.json", index)

    def add_relative_regret(self) -> None:
        """Each finished run's final regret over uniform play's median on its env (see report.py)."""
        frame = self.summary
        if frame.empty or "final_regret" not in frame.columns:
            return
        for row, value in zip(self.rows, report.relative_to_uniform(frame)):
            row["regret_vs_uniform"] = value if np.isfinite(value) else None

    def write_plots(self) -> list[Path]:
        from ldpfed.tracking import plots       # matplotlib only when a sweep ends

        return plots.sweep_plots(self.summary, self.curves, self.local_dir / "plots", self.name)

    def write_report(self, description: str, plot_files: list[Path]) -> pd.DataFrame:
        """report/regret_table.md and report/report.html (the table grouped by env, the plots embedded); returns
        the grouped table."""
        frame = self.summary
        folder = self.local_dir / "report"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "regret_table.md").write_text(report.markdown_table(frame) + "\n")
        (folder / "report.html").write_text(report.html_report(
            f"Sweep {self.name}", description.splitlines()[0] if description else "", frame, plot_files))
        return report.grouped_table(frame)

    def sweep_tags(self) -> dict:
        """What the sweep covers: algorithms, envs, engine, privacy models, eps values (comma-separated)."""
        frame = self.summary
        tags = {}
        for column, tag in (("algorithm", "algorithms"), ("env", "envs"), ("engine", "engine"),
                            ("privacy_model", "privacy_models")):
            if column in frame.columns:
                tags[tag] = ",".join(sorted(str(v) for v in frame[column].dropna().unique()))
        if "eps" in frame.columns:
            tags["eps_values"] = ",".join(f"{v:g}" for v in sorted(frame["eps"].dropna().unique()))
        return tags
