"""Uniform points on the unit sphere, drawn fast: the world simulation's main cost (K d normals per user).

A point is d standard normals divided by their norm (uniform by the rotation invariance of N(0, I_d)). The normals
come from ldpfed.util.normals (a compiled ziggurat fed by xoshiro256++), with the normalisation fused into the same
loop: one pass, no temporaries.

Stream: 4 raw words of the run's Generator per call, as ldpfed.util.normals says (same Generator state, same points, in
any process). (Earlier versions of ldpfed fed the ziggurat the Generator's own PCG64 words, one per draw: the
same law, other points, so their runs' contexts differ from these.)
tests/test_sphere.py checks the points (norms, the law of a coordinate).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from ldpfed.util.normals import ZR, ZX, next_normal, xoshiro_state


@njit(cache=True)
def _fill_sphere(state, out, zx, zr):
    """Every row of out (m, d) = d standard normals divided by their norm; `state` updated in place."""
    s0, s1, s2, s3 = state[0], state[1], state[2], state[3]
    d = out.shape[1]
    for i in range(out.shape[0]):
        s = 0.0
        for j in range(d):
            x, s0, s1, s2, s3 = next_normal(s0, s1, s2, s3, zx, zr)
            out[i, j] = x
            s += x * x
        s = math.sqrt(s)
        if s == 0.0:     # probability 0 (all d normals exactly 0); keep a unit vector anyway
            out[i, 0], s = 1.0, 1.0
        for j in range(d):
            out[i, j] /= s
    state[0], state[1], state[2], state[3] = s0, s1, s2, s3


def sphere_points(rng: np.random.Generator, shape, d: int) -> np.ndarray:
    """Uniform draws on the unit sphere of R^d, shape (*shape, d), from 4 words of rng."""
    shape = tuple(np.atleast_1d(shape).tolist())
    out = np.empty((int(np.prod(shape)), int(d)))
    _fill_sphere(xoshiro_state(rng), out, ZX, ZR)
    return out.reshape(*shape, d)
