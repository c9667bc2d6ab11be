"""The local randomizers one user at a time, compiled: what a compiled algorithm's message fields go through.

A compiled algorithm (ldpfed.algorithms.compiled) writes each user's clipped data, field by field, into one flat
row of `inputs`; every field's mechanism then turns its part of the row into the message, here, from the user's
pre-drawn random numbers. The algorithm never writes a privatized field itself: under local DP, what leaves the user
is the mechanism's output, by construction (TF Privacy's DPQuery keeps the same line between preprocessing a record
and adding noise).

A mechanism takes part by offering `row_kernel(shape) -> RowKernel` (its kind, its float parameters, how many random
numbers one user's field needs) and `draw_rows(rng, n, shape) -> (n, draws)` (those numbers, drawn in the order its
batched `privatize` draws them, so both give the same outputs from the same Generator), and optionally
`fill_rows(rng, out)`: the same numbers written into a view of the round's draw buffer. Kinds:

* PASS: the value as it is (a public field, or a raw field sent to a trusted server): no draws.
* GAUSSIAN: x + sigma z, one standard normal per entry.
* SYMMETRIC_GAUSSIAN: a (d, d) matrix + the symmetric noise whose upper triangle (incl. the diagonal, row-major) is
  sigma z: d (d + 1) / 2 normals per matrix.
* L2_BALL: l2ball.privatize_at on each row of `dim` entries: dim normals and one uniform per row.
* RANDOMIZED_RESPONSE: a bit kept when u < p_keep, else flipped: one uniform per entry.
* LAPLACE: x + b l, one standard Laplace draw per entry.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ldpfed.util.jit import loops

from .l2ball import privatize_at
from .protocol import (GAUSSIAN, L2_BALL, LAPLACE, PASS, PASS_KERNEL, RANDOMIZED_RESPONSE,  # noqa: F401
                       SYMMETRIC_GAUSSIAN, RowKernel)


# layout columns: kind, offset of the field in the row, its size, offset of its draws, offset of its params, the
# length of the rows the kind works on (the l2-ball's dim, the symmetric noise's d; else 1) and how many there are
KIND, OFFSET, SIZE, DRAW_OFFSET, PARAM_OFFSET, UNIT, COUNT = range(7)
COLUMNS = 7
# kinds whose output entry depends only on the same input entry (and draws): they can privatize a row in place
ELEMENTWISE = (PASS, GAUSSIAN, SYMMETRIC_GAUSSIAN, RANDOMIZED_RESPONSE, LAPLACE)


@njit(cache=True, inline="always")
def privatize_field(kind, off, size, dz, p, unit, count, params, x, z, y):
    """y = one field's mechanism applied to its part of one user's row x, from the user's draws z: the field's row
    of the layout (the columns above) and params, float64, every field's parameters one after the other."""
    if kind == PASS:
        for j in range(size):
            y[off + j] = x[off + j]
    elif kind == GAUSSIAN or kind == LAPLACE:       # x + scale * (a standard normal or Laplace draw)
        scale = params[p]
        for j in range(size):
            y[off + j] = x[off + j] + scale * z[dz + j]
    elif kind == SYMMETRIC_GAUSSIAN:
        # in the output's order, the draw of (a, b) for b >= a and of (b, a) below the diagonal; unsigned indices:
        # numba then skips its negative-index wraparound (a compare and select per access)
        sigma, d = params[p], unit
        for m in range(count):
            first = dz + m * (d * (d + 1) // 2)     # the draw of (0, 0)
            diagonal = first                        # the draw of (a, a)
            for a in range(d):
                row = off + m * d * d + a * d
                below = first                       # the draw of (b, b)
                for b in range(a):
                    y[np.uint64(row + b)] = sigma * z[np.uint64(below + a - b)] + x[np.uint64(row + b)]
                    below += d - b
                for b in range(a, d):
                    y[np.uint64(row + b)] = sigma * z[np.uint64(diagonal + b - a)] + x[np.uint64(row + b)]
                diagonal += d - a
    elif kind == L2_BALL:
        radius, big_b, tanh_half, dim = params[p], params[p + 1], params[p + 2], unit
        for m in range(count):
            privatize_at(x, off + m * dim, dim, radius, big_b, tanh_half, z, dz + m * dim, z[dz + count * dim + m],
                         y, off + m * dim)
    elif kind == RANDOMIZED_RESPONSE:
        p_keep = params[p]
        for j in range(size):
            y[off + j] = x[off + j] if z[dz + j] < p_keep else 1.0 - x[off + j]


@njit(inline="always")
def _no_field(params, x, z, y):
    return None


def _then(field, rest):
    """privatize_field for this field's layout row (closure constants), then `rest`."""
    kind, off, size, dz, p, unit, count = field

    @njit(inline="always")
    def row(params, x, z, y):
        privatize_field(kind, off, size, dz, p, unit, count, params, x, z, y)
        rest(params, x, z, y)

    return row


def privatize_loop(layout: "FieldLayout"):
    """`run(params, inputs, draws, out)`: the layout's row privatizer (FieldLayout.row_privatizer) on every user (row)
    of inputs, compiled once per process and layout (ldpfed.util.jit)."""
    def build(use):
        row = layout.row_privatizer()

        @njit
        def run(params, inputs, draws, out):
            for i in range(inputs.shape[0]):
                row(params, inputs[i], draws[i], out[i])

        return run

    return loops(("privatize", layout.key), build)


class FieldLayout:
    """Where each message field sits in a user's flat row, and how its mechanism privatizes it (from an algorithm's
    declared fields: name -> (shape, mechanism or None))."""

    def __init__(self, fields: dict):
        self.names = tuple(fields)
        self.shapes, self.kernels, self.mechanisms = {}, {}, {}
        rows, params, offset, draw_offset = [], [], 0, 0
        for name, (shape, mechanism) in fields.items():
            shape = tuple(int(s) for s in shape)
            size = int(np.prod(shape, dtype=np.int64))
            kernel = PASS_KERNEL if mechanism is None else mechanism.row_kernel(shape)
            unit = (int(kernel.params[3]) if kernel.kind == L2_BALL else
                    int(kernel.params[1]) if kernel.kind == SYMMETRIC_GAUSSIAN else 1)
            count = size // (unit * unit if kernel.kind == SYMMETRIC_GAUSSIAN else unit)
            rows.append((kernel.kind, offset, size, draw_offset, len(params), unit, count))
            params.extend(float(v) for v in kernel.params)
            self.shapes[name], self.kernels[name], self.mechanisms[name] = shape, kernel, mechanism
            offset += size
            draw_offset += kernel.draws
        self.layout = np.array(rows, dtype=np.int64).reshape(len(rows), COLUMNS)
        self.params = np.array(params, dtype=float)
        self.width, self.draw_width = offset, draw_offset
        self.slices = {name: slice(int(r[OFFSET]), int(r[OFFSET] + r[SIZE])) for name, r in zip(self.names, rows)}
        self.key = tuple(int(v) for v in self.layout.ravel())
        self.elementwise = all(kernel.kind in ELEMENTWISE for kernel in self.kernels.values())

    def row_privatizer(self):
        """`row(params, x, z, y)`: every field's mechanism on one user's row x into y, from its draws z, compiled
        for this layout: each field's offsets and sizes are constants of the code, so numba compiles its loops for
        their known sizes (unrolled), not over sizes read at run time. Inlined into the loops that call it, which are
        therefore built per layout (`key`)."""
        row = _no_field
        for field in reversed(self.layout.tolist()):
            row = _then(tuple(int(v) for v in field), row)
        return row

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Every field's random numbers for n users, (n, draw_width), field by field in declaration order."""
        out = np.empty((n, self.draw_width))
        start = 0
        for name in self.names:
            mechanism, width = self.mechanisms[name], self.kernels[name].draws
            if not width:
                continue
            if hasattr(mechanism, "fill_rows"):         # written in place: no part to copy
                mechanism.fill_rows(rng, out[:, start:start + width])
            else:
                out[:, start:start + width] = mechanism.draw_rows(rng, n, self.shapes[name])
            start += width
        return out

    def privatize(self, inputs: np.ndarray, draws: np.ndarray, overwrite: bool = False) -> np.ndarray:
        """The privatized rows; with overwrite, written over `inputs` when every field's kind is ELEMENTWISE (not
        the l2-ball, which reads its whole row after writing its first entry)."""
        out = inputs if overwrite and self.elementwise else np.empty_like(inputs)
        privatize_loop(self)(self.params, inputs, draws, out)
        return out

    def split(self, rows: np.ndarray) -> dict:
        """The flat rows (n, width) as a message dict of per-field views (n, *shape)."""
        n = rows.shape[0]
        return {name: rows[:, self.slices[name]].reshape(n, *self.shapes[name]) for name in self.names}

    def join(self, fields: dict, n: int | None = None) -> np.ndarray:
        """A dict of per-field arrays (leading axis n, or none for one row: aggregated sums) as flat rows. For one
        row, a field that is missing counts as zeros (a round whose every message the server rejected sums to
        nothing)."""
        if not self.names:
            return np.zeros(0) if n is None else np.zeros((n, 0))
        if n is None:
            return np.concatenate([np.asarray(fields[name], dtype=float).reshape(-1) if name in fields
                                   else np.zeros(int(np.prod(self.shapes[name], dtype=np.int64)))
                                   for name in self.names])
        return np.concatenate([np.asarray(fields[name], dtype=float).reshape(n, -1) for name in self.names], axis=1)
