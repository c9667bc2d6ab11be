"""Clipping to public bounds, done by a client before it privatizes anything: the one home of the clip rules.

Bottom layer (numpy only). Every function returns what it clipped and how many entries (values) or rows (vectors)
it counted as clipped; the counts go to the run's metrics, never to the server.

Why there are several row rules: each call site's arithmetic is kept exactly as it was (runs must reproduce bit
for bit), and they differ in how the norm is measured, how a row is rescaled and what counts as clipped. The
compiled algorithms (ldpfed.algorithms.compiled) clip one user at a time with `clip_row` / `clip_value` (bottom of
this file):

* `clip_rows`: norm sqrt(x.x) by einsum, a row over the bound is
  multiplied by bound / norm; counted when its norm exceeds bound (1 + rtol) (contexts drawn on the unit sphere
  have norm 1 up to rounding: rescaled, not counted). With norm="linalg" and rtol=0 it is the plain rule (norm by
  np.linalg.norm, every row over the bound counted) that ldp-gloc's gradient uses.
* `clip_rows_by_squares`: compares
  the SQUARED norm with bound^2 (no square root unless a row is over), divides a row over by norm / bound, counts
  it when its squared norm exceeds bound^2 (1 + 2 rtol).
* `clip_rows_in_place` (the central-model clients of seeds 001 and 003): squared norm by einsum against bound^2,
  a row over multiplied in place by bound / np.linalg.norm(row), every row over counted.
The two norms (einsum, np.linalg.norm) may differ in the last bit, and bound / norm * x and x / (norm / bound) too.
"""
from __future__ import annotations

import numpy as np
from numba import njit

# A row counts as clipped when its norm exceeds the bound by more than this relative tolerance (contexts drawn on
# the unit sphere have norm 1 up to rounding); every row above the bound is still rescaled to it.
CLIP_RTOL = 1e-9
_TINY = 1e-300      # guards a division by a zero norm


def clip_rows(x: np.ndarray, bound: float, rtol: float = CLIP_RTOL, norm: str = "einsum") -> tuple[np.ndarray, int]:
    """Rows of x (last axis) scaled down to norm <= bound, and how many exceeded bound (1 + rtol). x itself is
    returned when no row is over the bound (no copy). norm: "einsum" (sqrt of einsum x.x) or "linalg"
    (np.linalg.norm): the two may differ in the last bit, so each caller keeps its own (see the module doc)."""
    if norm == "einsum":
        norms = np.sqrt(np.einsum("...i,...i->...", x, x))
    elif norm == "linalg":
        norms = np.linalg.norm(x, axis=-1)
    else:
        raise ValueError(f"norm must be 'einsum' or 'linalg', not {norm!r}")
    over = norms > bound
    if not over.any():
        return x, 0
    scale = np.where(over, bound / np.maximum(norms, _TINY), 1.0)
    counted = over if rtol == 0 else norms > bound * (1.0 + rtol)
    return x * scale[..., None], int(np.count_nonzero(counted))


def clip_rows_by_squares(x: np.ndarray, bound: float, rtol: float = CLIP_RTOL) -> tuple[np.ndarray, int]:
    """Rows of x (n, d) scaled down to norm <= bound by comparing squared norms (see the module doc), and how many
    exceeded bound^2 (1 + 2 rtol) in squared norm. x itself is returned when no row is over."""
    sq = np.einsum("ni,ni->n", x, x)
    limit = bound ** 2
    over = sq > limit
    if not over.any():
        return x, 0
    x = np.where(over[:, None], x / (np.sqrt(np.maximum(sq, _TINY)) / bound)[:, None], x)
    return x, int(np.count_nonzero(sq > limit * (1 + 2 * rtol)))


def clip_rows_in_place(x: np.ndarray, bound: float) -> int:
    """Rows of x (n, d) whose squared norm exceeds bound^2 scaled in place to norm bound (by bound /
    np.linalg.norm(row)); returns how many (every row over is counted)."""
    over = np.einsum("ij,ij->i", x, x) > bound ** 2
    count = int(over.sum())
    if count:
        x[over] *= bound / np.linalg.norm(x[over], axis=1, keepdims=True)
    return count


def clip_coords_in_place(x: np.ndarray, bound: float) -> int:
    """Every coordinate of x (n, d) clipped in place to [-bound, bound]; returns how many ROWS had a coordinate out
    of bounds (the l-infinity ball's count)."""
    count = int(np.any(np.abs(x) > bound, axis=1).sum())
    if count:
        np.clip(x, -bound, bound, out=x)
    return count


def rows_over(x: np.ndarray, bound: float, rtol: float = CLIP_RTOL) -> int:
    """How many rows of x have a squared norm beyond bound^2 (1 + 2 rtol): the count of clip_rows without clipping
    (for clients that do not clip, e.g. the authors' multi-parameter code)."""
    return int(np.count_nonzero(np.einsum("...i,...i->...", x, x) > bound ** 2 * (1 + 2 * rtol)))


def clip_values(r: np.ndarray, bound: float) -> tuple[np.ndarray, int]:
    """Values clipped to [-bound, bound], and how many were outside (|r| > bound; a nan is neither clipped nor
    counted). r itself is returned when none is outside (np.clip is slow on the tiny arrays of one-user rounds)."""
    over = np.abs(r) > bound
    if not over.any():
        return r, 0
    return np.minimum(np.maximum(r, -bound), bound), int(np.count_nonzero(over))


def values_over(r: np.ndarray, bound: float) -> int:
    """How many values lie outside [-bound, bound] (the count of clip_values without clipping)."""
    return int(np.count_nonzero(np.abs(r) > bound))


# ---- one user at a time, compiled: what the compiled algorithms' `prepare` uses (ldpfed.algorithms.compiled) ------
@njit(cache=True)
def clip_row(x, bound, rtol):
    """In place: x (d,) scaled by bound / ||x|| when its norm exceeds bound; 1 if it exceeded bound (1 + rtol)
    (the rule of clip_rows)."""
    sq = 0.0
    for j in range(x.shape[0]):
        sq += x[j] * x[j]
    norm = np.sqrt(sq)
    if norm > bound:
        scale = bound / max(norm, _TINY)
        for j in range(x.shape[0]):
            x[j] *= scale
    return 1 if norm > bound * (1.0 + rtol) else 0


@njit(cache=True)
def clip_value(r, bound):
    """(r clipped to [-bound, bound], 1 if it was outside)."""
    if abs(r) > bound:
        return min(max(r, -bound), bound), 1
    return r, 0


@njit(cache=True)
def clip_row_by_squares(x, bound, rtol):
    """In place, the rule of clip_rows_by_squares on one row: x / (||x|| / bound) when ||x||^2 exceeds bound^2; 1
    if it exceeded bound^2 (1 + 2 rtol)."""
    sq = 0.0
    for j in range(x.shape[0]):
        sq += x[j] * x[j]
    limit = bound * bound
    if sq > limit:
        root = np.sqrt(max(sq, _TINY)) / bound
        for j in range(x.shape[0]):
            x[j] = x[j] / root
    return 1 if sq > limit * (1.0 + 2.0 * rtol) else 0
