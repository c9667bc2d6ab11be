"""What is recorded about one run, independent of MLflow: params, tags, metric curves, local files.

Everything here is a pure function of a RunResult (plus the code version), so the local copy and the MLflow copy
of a run say the same thing.
"""
from __future__ import annotations

import functools
import json
import math
import os
import re
import subprocess
import threading
from pathlib import Path

import numpy as np
import pandas as pd

from ldpfed.tracking.svg import regret_svg

MAX_POINTS = 200                  # points per metric curve sent to MLflow: a chart's worth (every round: table.parquet)
BOOKKEEPING_POINTS = 20           # points per curve of a rate or a counter: its shape, not the results' resolution
MAX_PARAM_CHARS = 6000            # MLflow 3's limit on a param value
CLUSTER_KEYS = ("nodes", "actors", "shards")
# Throughput (per-round values) and the server's rejected messages (a running count): curves when the engine's
# table has them per round, else the run's value at the last step.
RATE_KEYS = ("users_per_s", "messages_per_s")
COUNT_KEYS = ("rejected_messages",)
SCALAR_KEYS = ("final_regret", "final_estimation_error", "elapsed_s", *RATE_KEYS, *COUNT_KEYS)
TABLE_BASE = ("round", "users", "regret", "cumulative_regret", "estimation_error")
# The fields of a RunConfig that name a run in a sweep's summary (a failed run has these and its error only).
RUN_FIELDS = ("algorithm", "env", "eps", "delta", "seed", "users", "round_size")


# ---------------------------------------------------------------- config and params
def config_dict(config) -> dict:
    """The run's validated config as a plain dict (RunConfig, or a dict from another engine)."""
    if hasattr(config, "to_dict"):
        return dict(config.to_dict())
    if isinstance(config, dict):
        return dict(config)
    raise TypeError(f"result.config must be a RunConfig or a dict, not {type(config).__name__}")


def algorithm_class(name: str):
    from ldpfed.algorithms import REGISTRY

    return REGISTRY.get(name)


def algorithm_params(config: dict) -> dict:
    """The options the algorithm ran with: its defaults (the paper's values, or the profile's) overridden by
    config.params."""
    cls = algorithm_class(config.get("algorithm", ""))
    defaults = dict(getattr(cls, "defaults", {}) or {}) if cls is not None else {}
    by_profile = (getattr(cls, "profile_defaults", {}) or {}).get(config.get("profile"), {}) if cls is not None else {}
    return {**defaults, **by_profile, **(config.get("params") or {})}


def flatten(mapping: dict, prefix: str = "") -> dict:
    """Nested dicts to dotted keys; lists, arrays and other values kept as leaves."""
    flat = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, name + "."))
        elif isinstance(value, dict):
            continue                      # an empty mapping has nothing to record
        else:
            flat[name] = value
    return flat


_KEY_BAD = re.compile(r"[^\w\-. /]")


def mlflow_key(key: str) -> str:
    """A key MLflow accepts (alphanumerics, underscores, dashes, periods, spaces, slashes; 250 chars)."""
    return _KEY_BAD.sub("_", str(key))[:250]


def flat_params(mapping: dict) -> dict:
    """A nested mapping as MLflow params: dotted keys, values as text."""
    return {mlflow_key(k): param_text(v) for k, v in flatten(mapping).items()}


def param_text(value) -> str:
    if isinstance(value, (list, tuple, np.ndarray)):
        text = json.dumps(to_jsonable(value))
    elif isinstance(value, float):
        text = repr(value)
    else:
        text = str(value)
    return text if len(text) <= MAX_PARAM_CHARS else text[:MAX_PARAM_CHARS - 15] + "...(truncated)"


def is_private(config: dict) -> bool:
    """False for an algorithm without a privacy model (eps plays no part in it: one run per seed is enough)."""
    cls = algorithm_class(config.get("algorithm", ""))
    return getattr(cls, "privacy_model", "none") != "none" if cls is not None else True


# Param names sort so that MLflow's comparison views, which pre-select the first params in alphabetical order
# among those that differ, start with algorithm, env, eps, seed: the algorithm's options are `setting.X` and the
# env as built is `world.X` (both sort after `seed`).
def run_params(result) -> dict:
    """Every param of a run: the RunConfig's fields (`algorithm`, `env`, `eps` ("n/a" when the algorithm is
    not private), `seed`, `delta`, `users`, `round_size`, `populations`, `trust` and each of its options as `trust_options.X`, `federation` and each of its options as
    `federation_options.X`), derived `rounds`, the env as built
    (`world.X`, e.g. d, K) and every algorithm option with its default filled in (`setting.X`). The options as
    given (config.params, config.env_params) are in config.json."""
    config = config_dict(result.config)
    params = {k: v for k, v in config.items() if k not in ("params", "env_params", "trust_options",
                                                          "federation_options")}
    params.update(flatten(dict(config.get("trust_options") or {}), "trust_options."))   # the trust model's options
    params.update(flatten(dict(config.get("federation_options") or {}), "federation_options."))   # the federation's
    if not is_private(config):
        params["eps"] = "n/a"
    if config.get("users") and config.get("round_size"):
        params["rounds"] = -(-int(config["users"]) // int(config["round_size"]))
    params.update(flatten(dict(result.env or {}), "world."))
    params.update(flatten(algorithm_params(config), "setting."))
    return {mlflow_key(k): param_text(v) for k, v in params.items()}


# ---------------------------------------------------------------- tags
def mechanisms(ledger) -> list[str]:
    return sorted({str(row.get("mechanism")) for row in ledger or [] if row.get("mechanism")})


def privacy_model(config: dict, ledger) -> str:
    cls = algorithm_class(config.get("algorithm", ""))
    declared = getattr(cls, "privacy_model", None) if cls is not None else None
    if declared:
        return str(declared)
    models = sorted({str(row.get("model")) for row in ledger or [] if row.get("model")})
    return "+".join(models) if models else "none"


@functools.lru_cache(maxsize=1)
def code_version() -> dict:
    """{"code_version": ..., "code_dirty": ...}: the git commit of the ldpfed checkout, else the package version."""
    root = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5, check=True).stdout.strip()
        if re.fullmatch(r"[0-9a-f]{40}", sha):
            return {"code_version": sha, "code_dirty": str(bool(dirty)).lower(), "mlflow.source.git.commit": sha}
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        from importlib.metadata import version

        return {"code_version": f"ldpfed {version('ldpfed')}"}
    except Exception:  # noqa: BLE001 - not installed as a distribution
        return {"code_version": "unknown"}


def run_tags(result) -> dict:
    """Tags of a run: privacy model, mechanisms (from the ledger), engine, cluster size, code version."""
    config = config_dict(result.config)
    summary = result.summary or {}
    mechs = mechanisms(result.ledger)
    tags = {
        "algorithm": str(config.get("algorithm")),
        "env": str(config.get("env")),
        "privacy_model": privacy_model(config, result.ledger),
        "mechanisms": ",".join(mechs) if mechs else "none",
        "engine": str(summary.get("engine", "unknown")),
        **code_version(),
    }
    cls = algorithm_class(config.get("algorithm", ""))
    if cls is not None and getattr(cls, "paper", ""):
        tags["paper"] = str(cls.paper)
    for key in CLUSTER_KEYS:
        if summary.get(key) is not None:
            tags[f"cluster.{key}"] = str(summary[key])
    for key, value in summary.items():     # the engine's settings, e.g. the Ray engine's mode
        if isinstance(value, str) and key not in NOT_METRICS:
            tags[mlflow_key(f"engine.{key}")] = value[:5000]
    return tags


# ---------------------------------------------------------------- metrics
def downsample_index(n: int, points: int = MAX_POINTS) -> np.ndarray:
    """At most `points` evenly spread indices of range(n), always the first and the last."""
    if n <= points:
        return np.arange(n)
    return np.unique(np.round(np.linspace(0, n - 1, points)).astype(int))


def finite(value) -> bool:
    try:
        return value is not None and math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def metric_curves(result, points: int = MAX_POINTS) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """name -> (steps, values) with step = users processed, each at most `points` long.

    The results, at most `points` each: cumulative_regret; estimation_error at its checkpoints. The bookkeeping,
    at most BOOKKEEPING_POINTS each (every round is in table.parquet): users_per_s / messages_per_s when the
    engine's table has them per round; rejected_messages (running count) likewise; `total_X` (running sum) for
    each other per-round counter X of the table (the algorithms' metrics, e.g. clipped users). MLflow's store
    writes a row per point: the results' resolution is worth it, a counter's is not.
    """
    table = result.table
    curves = {}
    users = table["users"].to_numpy(dtype=np.int64)
    bookkeeping = min(points, BOOKKEEPING_POINTS)
    columns = ["cumulative_regret", "estimation_error", *[c for c in RATE_KEYS if c in table.columns]]
    for column in columns:
        values = table[column].to_numpy(dtype=float)
        keep = np.isfinite(values)
        steps, values = users[keep], values[keep]
        index = downsample_index(len(values), points if column in TABLE_BASE else bookkeeping)
        if len(index):
            curves[column] = (steps[index], values[index])
    for column in table.columns:
        if column in TABLE_BASE or column in RATE_KEYS or not pd.api.types.is_numeric_dtype(table[column]):
            continue
        running = np.nancumsum(table[column].to_numpy(dtype=float))
        index = downsample_index(len(running), bookkeeping)
        name = column if column in COUNT_KEYS else f"total_{column}"
        curves[mlflow_key(name)] = (users[index], running[index])
    return curves


# Summary entries that restate the config or are tags, never metrics.
NOT_METRICS = {*RUN_FIELDS, "engine", *CLUSTER_KEYS}
# Settings of the engine that are numbers but not results: params of the run, not metrics.
ENGINE_SETTINGS = {"max_in_flight", "groups"}
MB = 2 ** 20


def final_metrics(result) -> dict[str, float]:
    """The run's numbers, each logged once: final regret and error, elapsed time, throughput, counters, and every
    other numeric entry of the summary (e.g. the Ray engine's fold latencies); byte counts (`peak_rss_X`) are
    given in MB as `peak_rss_X_mb`; a yes/no entry (e.g. privacy_shuffle_amplified) as 1 or 0, which MLflow can
    filter on (`metrics.privacy_shuffle_amplified = 1`) and plot."""
    summary = result.summary or {}
    out = {key: float(summary[key]) for key in SCALAR_KEYS if finite(summary.get(key))}
    for key, value in summary.items():
        if key in NOT_METRICS or key in ENGINE_SETTINGS or key in out:
            continue
        if isinstance(value, (bool, np.bool_)):
            out[mlflow_key(key)] = float(bool(value))
            continue
        if isinstance(value, (int, float, np.integer, np.floating)) and finite(value):
            if key.startswith("peak_rss") or key.endswith("_bytes"):
                out[mlflow_key(key.removesuffix("_bytes") + "_mb")] = float(value) / MB
            else:
                out[mlflow_key(key)] = float(value)
    return out


# ---------------------------------------------------------------- local files
def to_jsonable(value):
    """JSON-safe copy: numpy scalars and arrays to Python, non-finite floats to None, unknown objects to str."""
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return to_jsonable(value.tolist())
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if value is None or isinstance(value, str):
        return value
    return str(value)


def _atomic(path: Path, write) -> Path:
    """Write through a temporary file in the same folder, then rename: a crash never leaves half a file. The
    temporary name is this process's and thread's own, and the file is created as any new file is, with the
    umask's mode (reading the umask means setting it, for every thread of the process, for a moment)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_text(path: Path, text: str) -> Path:
    def write(tmp):
        with open(tmp, "w") as handle:
            handle.write(text)

    return _atomic(Path(path), write)


def write_json(path: Path, data) -> Path:
    return write_text(path, json.dumps(to_jsonable(data), indent=2, sort_keys=False) + "\n")


def read_json(path: Path):
    with open(path) as handle:
        return json.load(handle)


def write_parquet(path: Path, frame: pd.DataFrame) -> Path:
    return _atomic(Path(path), lambda tmp: frame.to_parquet(tmp, index=False))


def write_csv(path: Path, frame: pd.DataFrame) -> Path:
    return _atomic(Path(path), lambda tmp: frame.to_csv(tmp, index=False))


def _eps_text(config: dict) -> str:
    return f"eps={float(config.get('eps', 0)):g}" if is_private(config) else "non-private"


def slug(text) -> str:
    """`text` as a file or folder name."""
    return re.sub(r"[^\w.=+-]", "_", str(text)).strip("._") or "run"


def run_key(config: dict) -> str:
    """A file-system safe name of a run: algorithm, env, eps (or "non-private"), seed."""
    raw = f"{config.get('algorithm')}__{config.get('env')}__{_eps_text(config)}__seed={config.get('seed')}"
    return re.sub(r"[^\w.=+-]", "_", raw)


def summary_row(key: str, config: dict, status: str, **values) -> dict:
    """One run's row of a sweep's combined summary: its key, `values` (a finished run's summary numbers, a failed
    run's error), its status, then the config's RUN_FIELDS that `values` lacks; eps None when eps played no part
    (not drawn or grouped at an eps)."""
    row = {"key": key, **values, "status": status}
    row.setdefault("local_dir", None)
    row.setdefault("run_id", None)
    if not is_private(config):
        row["eps"] = None
    for name in RUN_FIELDS:
        row.setdefault(name, config.get(name))
    return row


def run_name(config: dict, final_regret=None, vs_uniform=None) -> str:
    """A run's name in the MLflow UI, what tells runs apart first (the runs table cuts long names): algorithm,
    eps, and once known the final regret and the regret over uniform play's; then env and seed."""
    result = "" if not finite(final_regret) else f" regret={float(final_regret):.1f}"
    if finite(vs_uniform):
        result += f" vs-uniform={float(vs_uniform):.2f}"
    return f"{config.get('algorithm')} {_eps_text(config)}{result} {config.get('env')} seed={config.get('seed')}"


def write_run(folder: Path, result, tags: dict | None = None) -> dict[str, Path]:
    """The full record of one run under `folder`: table.parquet (every round), summary.json, ledger.json,
    config.json (config, env as built, algorithm options, tags), and regret.svg (its regret curve, which the MLflow
    UI shows among the run's artifacts)."""
    folder = Path(folder)
    config = config_dict(result.config)
    table = result.table.iloc[downsample_index(len(result.table))]     # the plot's line: MAX_POINTS at most
    plot = folder / "regret.svg"
    write_text(plot, regret_svg(table["users"], table["cumulative_regret"],
                                run_name(config, (result.summary or {}).get("final_regret"))))
    return {
        "plot": plot,
        "table": write_parquet(folder / "table.parquet", result.table),
        "summary": write_json(folder / "summary.json", result.summary or {}),
        "ledger": write_json(folder / "ledger.json", list(result.ledger or [])),
        "config": write_json(folder / "config.json", {"config": config, "env": result.env or {},
                                                      "algorithm_params": algorithm_params(config),
                                                      "tags": tags or {}}),
    }
