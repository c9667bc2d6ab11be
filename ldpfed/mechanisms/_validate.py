"""Input checks shared by the mechanisms. Every failure raises ConfigError naming the parameter and its value."""

from __future__ import annotations

import math
import numbers
from functools import lru_cache

import numpy as np

from ldpfed.util.errors import ConfigError

MODELS = ("ldp", "central")


def real(name: str, value) -> float:
    """A finite real number (bool and non-numbers rejected)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ConfigError(name, value, "must be a real number")
    v = float(value)
    if not math.isfinite(v):
        raise ConfigError(name, value, "must be finite")
    return v


def positive(name: str, value) -> float:
    v = real(name, value)
    if v <= 0.0:
        raise ConfigError(name, value, "must be > 0")
    return v


def eps(value, name: str = "eps") -> float:
    return positive(name, value)


def delta_open(value, name: str = "delta") -> float:
    """A delta that is required: strictly inside (0, 1)."""
    v = real(name, value)
    if not 0.0 < v < 1.0:
        raise ConfigError(name, value, "must be in the open interval (0, 1)")
    return v


def integer(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise ConfigError(name, value, "must be an integer")
    v = int(value)
    if v < minimum:
        raise ConfigError(name, value, f"must be >= {minimum}")
    return v


def model(value) -> str:
    if value not in MODELS:
        raise ConfigError("model", value, f"must be one of {MODELS}")
    return value


def calibration(value) -> str:
    if value not in ("classic", "analytic"):
        raise ConfigError("calibration", value, "must be 'classic' or 'analytic'")
    return value


def shape(name: str, value) -> tuple[int, ...]:
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        value = (value,)
    try:
        tup = tuple(value)
    except TypeError:
        raise ConfigError(name, value, "must be an int or a tuple of ints") from None
    for s in tup:
        if isinstance(s, (bool, np.bool_)) or not isinstance(s, numbers.Integral) or s < 1:
            raise ConfigError(name, value, "every entry must be an integer >= 1")
    return tuple(int(s) for s in tup)


def finite_array(name: str, value) -> np.ndarray:
    """float64 array, every entry finite (no copy when already float64)."""
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ConfigError(name, _short(value), "must be numeric (convertible to float64)") from None
    if not np.isfinite(arr).all():
        bad = arr[~np.isfinite(arr)].ravel()[:3]
        raise ConfigError(name, _short(value), f"must be finite; found {bad.tolist()}")
    return arr


def _short(value):
    """A value to put in an error message without dumping a huge array."""
    try:
        arr = np.asarray(value)
    except Exception:  # noqa: BLE001 - only for the message
        return value
    if arr.size > 6:
        return f"<array shape={arr.shape} dtype={arr.dtype}>"
    return value


@lru_cache(maxsize=64)
def sym_gather_index(d: int) -> np.ndarray:
    """Index of length d*d into the d(d+1)/2 upper-triangle (incl. diagonal) entries, row-major:
    entry (i, j) of the matrix takes triangle entry k(min(i,j), max(i,j)). z[..., idx].reshape(d, d) is the
    symmetric matrix whose upper triangle is z."""
    iu0, iu1 = np.triu_indices(d)
    k = np.empty((d, d), dtype=np.intp)
    k[iu0, iu1] = np.arange(iu0.size)
    k[iu1, iu0] = np.arange(iu0.size)
    k.setflags(write=False)
    return k.ravel()


def symmetric_from_upper(z: np.ndarray, d: int) -> np.ndarray:
    """z shape (..., d(d+1)/2) -> symmetric (..., d, d) with z on the upper triangle incl. diagonal."""
    idx = sym_gather_index(d)
    return np.take(z, idx, axis=-1).reshape(*z.shape[:-1], d, d)
