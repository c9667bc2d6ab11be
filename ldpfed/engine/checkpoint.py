"""Checkpoints of a run: the server state, the next round, the random-stream position and the per-round table.

Format (open, no pickle): ONE `.npz` file (a zip of `.npy` arrays, readable by numpy in any language that reads
zip + npy). Entry `meta` holds UTF-8 JSON: the format version, the run's config, `next_round`, the random-stream
position, the recorder's scalars and per-round metric counters, and the server state as a JSON tree whose arrays
are the entries `a0`, `a1`, ... The per-round table's columns are the entries `table.<column>`.

The random-stream position is the next round alone: every draw comes from `derive(seed, purpose, population,
round)` (see `ldpfed.util.rng`), so nothing else about the generators needs to be kept.

The state tree: dicts with string keys, lists, tuples, None, bool, int, float, str stay JSON; numpy arrays and
numpy scalars go to npz entries (dtype and shape exact); dicts with other keys become lists of pairs; objects of
classes defined in `ldpfed` (e.g. a tree mechanism's running noise) are kept as their class path and attribute
tree, and restored without running their constructor. Anything else is refused at write time, so a checkpoint
never silently loses part of the state.

Writes are atomic: a temporary file in the same directory, flushed and fsynced, then `os.replace`d, so a kill at
any moment leaves either the previous checkpoint or the new one. Files get the process's umask.
"""
from __future__ import annotations

import dataclasses
import importlib
import io
import json
import math
import os
import time
from pathlib import Path

import numpy as np

from ldpfed.util.signals import deferred

FORMAT = "ldpfed-checkpoint/1"
FILENAME = "checkpoint.npz"
DEFAULT_EVERY_S = 20.0      # a few checkpoints per minute: cheap (one small file) and at most ~20 s of work lost


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or read, or that belongs to another run."""


# ---- state <-> (JSON tree, arrays) -----------------------------------------------------------------
def encode(value, arrays: list, memo: dict | None = None):
    """A JSON-able tree for `value`; its arrays are appended to `arrays` and referenced by index. An array met
    twice (the same object) is stored once and restored as one object, so aliasing in the state survives."""
    memo = {} if memo is None else memo
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"__float__": repr(value)}
    if isinstance(value, (np.ndarray, np.generic)):
        if isinstance(value, np.ndarray) and value.dtype == object:
            raise CheckpointError(f"cannot checkpoint an object array of shape {value.shape}")
        if isinstance(value, np.ndarray) and id(value) in memo:
            return {"__array__": memo[id(value)], "scalar": False}
        arrays.append(value if isinstance(value, np.ndarray) else np.asarray(value))
        if isinstance(value, np.ndarray):
            memo[id(value)] = len(arrays) - 1
        return {"__array__": len(arrays) - 1, "scalar": isinstance(value, np.generic)}
    if isinstance(value, tuple):
        return {"__tuple__": [encode(v, arrays, memo) for v in value]}
    if isinstance(value, list):
        return [encode(v, arrays, memo) for v in value]
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in value):
            return {k: encode(v, arrays, memo) for k, v in value.items()}
        return {"__pairs__": [[encode(k, arrays, memo), encode(v, arrays, memo)] for k, v in value.items()]}
    cls = type(value)
    if cls.__module__.split(".")[0] == "ldpfed" and hasattr(value, "__dict__"):
        return {"__object__": f"{cls.__module__}:{cls.__qualname__}", "attrs": encode(dict(vars(value)), arrays, memo)}
    raise CheckpointError(f"cannot checkpoint a value of type {cls.__module__}.{cls.__qualname__}")


def decode(tree, arrays):
    if isinstance(tree, list):
        return [decode(v, arrays) for v in tree]
    if not isinstance(tree, dict):
        return tree
    if "__array__" in tree:
        array = arrays[f"a{tree['__array__']}"]
        return array[()] if tree["scalar"] else array
    if "__float__" in tree:
        return float(tree["__float__"])
    if "__tuple__" in tree:
        return tuple(decode(v, arrays) for v in tree["__tuple__"])
    if "__pairs__" in tree:
        return {decode(k, arrays): decode(v, arrays) for k, v in tree["__pairs__"]}
    if "__object__" in tree:
        module, _, name = tree["__object__"].partition(":")
        if module.split(".")[0] != "ldpfed":      # only the project's own classes are ever rebuilt
            raise CheckpointError(f"refusing to rebuild an object of class {tree['__object__']}")
        cls = importlib.import_module(module)
        for part in name.split("."):
            cls = getattr(cls, part)
        obj = cls.__new__(cls)
        obj.__dict__.update(decode(tree["attrs"], arrays))   # also for frozen dataclasses
        return obj
    return {k: decode(v, arrays) for k, v in tree.items()}


def _jsonable_config(config) -> dict:
    return json.loads(json.dumps(dataclasses.asdict(config), sort_keys=True, default=repr))


# ---- the file ---------------------------------------------------------------------------------------
def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that a reader (or a crash) sees the old file or the new one, never half."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:   # the rename itself reaches the disk
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def save(path: Path, config, next_round: int, state, recorder_snapshot: dict, in_flight=None) -> None:
    arrays: list = []
    state_tree = encode(state, arrays)
    in_flight_tree = None if in_flight is None else encode(in_flight, arrays)
    table = recorder_snapshot["table"]
    meta = {
        "format": FORMAT, "config": _jsonable_config(config), "next_round": int(next_round),
        "rng": {"scheme": "derive(seed, purpose, population, round)", "seed": config.seed,
                "next_round": int(next_round)},
        "recorder": {k: v for k, v in recorder_snapshot.items() if k != "table"},
        "state": state_tree, "written_at": time.time(),
        **({} if in_flight_tree is None else {"in_flight": in_flight_tree}),
    }
    entries = {f"a{i}": a for i, a in enumerate(arrays)}
    entries.update({f"table.{c}": np.asarray(v) for c, v in table.items()})
    entries["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **entries)
    write_atomic(path, buffer.getvalue())


def load(path: Path, config=None) -> dict:
    """{"next_round", "state", "recorder"} from a checkpoint; refuses one written for another config."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            meta = json.loads(bytes(npz["meta"]).decode())
            if meta.get("format") != FORMAT:
                raise CheckpointError(f"{path}: unknown checkpoint format {meta.get('format')!r}")
            # a checkpoint written before federation models existed is one of the ideal federation's
            written = {"federation": "ideal", "federation_options": {}, **meta["config"]}
            if config is not None and written != _jsonable_config(config):
                raise CheckpointError(f"{path}: written for another run ({meta['config']}), not for {config}")
            arrays = {k: npz[k] for k in npz.files if k.startswith("a")}
            table = {k.split(".", 1)[1]: npz[k] for k in npz.files if k.startswith("table.")}
    except CheckpointError:
        raise
    except Exception as error:   # truncated or foreign file: say which and why
        raise CheckpointError(f"{path}: unreadable checkpoint ({type(error).__name__}: {error})") from error
    return {"next_round": meta["next_round"], "state": decode(meta["state"], arrays),
            "in_flight": decode(meta["in_flight"], arrays) if "in_flight" in meta else None,
            "recorder": {**meta["recorder"], "table": table}, "written_at": meta.get("written_at")}


class Checkpointer:
    """When and where a run writes its checkpoints: every `every_rounds` rounds or `every_s` seconds, whichever
    comes first (None: not by that criterion), into `directory/checkpoint.npz`."""

    def __init__(self, directory, every_rounds: int | None = None, every_s: float | None = DEFAULT_EVERY_S):
        if every_rounds is not None and (isinstance(every_rounds, bool) or not isinstance(every_rounds, int)
                                         or every_rounds < 1):
            raise CheckpointError(f"every_rounds={every_rounds!r}: must be an integer >= 1 or None")
        if every_s is not None and not (isinstance(every_s, (int, float)) and every_s >= 0):
            raise CheckpointError(f"every_s={every_s!r}: must be a number >= 0 or None")
        self.directory = Path(directory)
        self.path = self.directory / FILENAME
        self.every_rounds, self.every_s = every_rounds, every_s
        self.last_round = None
        self.last_time = time.monotonic()
        self.written = 0
        self.write_s = 0.0

    def check_writable(self) -> None:
        """Fail now, before any simulation, if the directory cannot take a checkpoint."""
        self.directory.mkdir(parents=True, exist_ok=True)
        probe = self.directory / f".write-probe.{os.getpid()}"
        try:
            probe.write_bytes(b"")
        except OSError as error:
            raise CheckpointError(f"checkpoint directory {self.directory} is not writable: {error}") from error
        finally:
            probe.unlink(missing_ok=True)

    def load(self, config) -> dict | None:
        if not self.path.exists():
            return None
        saved = load(self.path, config)
        self.last_round = saved["next_round"]
        return saved

    def due(self, next_round: int) -> bool:
        since = next_round - (self.last_round or 0)
        if self.every_rounds is not None and since >= self.every_rounds:
            return True
        return self.every_s is not None and time.monotonic() - self.last_time >= self.every_s

    def save(self, config, next_round: int, state, recorder, in_flight=None) -> None:
        started = time.perf_counter()
        with deferred():   # a checkpoint is written whole, and counted, whatever signal comes
            save(self.path, config, next_round, state, recorder.snapshot(), in_flight)
            self.last_round, self.last_time = next_round, time.monotonic()
            self.written += 1
            self.write_s += time.perf_counter() - started
