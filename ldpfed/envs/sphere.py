"""Uniform points on the unit sphere, drawn fast: the world simulation's main cost (K d normals per user).

A point is d standard normals divided by their norm (uniform by the rotation invariance of N(0, I_d)). The normals
come from a compiled ziggurat (Doornik's ZIGNOR, 128 layers: Doornik 2005, "An improved ziggurat method to generate
normal random samples") fed with the run's Generator's raw 64-bit words: ~2x cheaper than Generator.standard_normal,
and the normalisation is fused into one pass (no temporaries). Deterministic: the same Generator state gives the
same points, bit for bit, in any process (so the engines stay bit-identical). tests/test_sphere.py checks the
normals (Kolmogorov-Smirnov, tail mass) and the points (norms, the law of a coordinate).
Bits of a word: 0-6 choose the layer, 11-63 give the uniform (disjoint, so independent).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

_LAYERS = 128
_R = 3.442619855899          # start of the tail (ZIGNOR, 128 layers)
_V = 9.91256303526217e-3     # area of each layer
_U53 = 1.0 / 2.0 ** 53


def _tables():
    x = np.zeros(_LAYERS + 1)
    f = math.exp(-0.5 * _R * _R)
    x[0], x[1] = _V / f, _R
    for i in range(2, _LAYERS):
        x[i] = math.sqrt(-2.0 * math.log(_V / x[i - 1] + f))
        f = math.exp(-0.5 * x[i] * x[i])
    return x, x[1:] / x[:-1]    # x[LAYERS] = 0


_ZX, _ZR = _tables()


@njit(cache=True)
def _fill_normals(words, out, start, zx, zr, tail_start):
    """Standard normals into out[start:] from words; returns how many were completed (stops when the words run
    out; the words of an unfinished draw are dropped)."""
    w, nw, k, m = 0, words.shape[0], start, out.shape[0]
    seven, shift = np.uint64(0x7F), np.uint64(11)
    while k < m and w < nw:
        word = words[w]
        w += 1
        i = word & seven
        u = 2.0 * ((word >> shift) * _U53) - 1.0
        if abs(u) < zr[i]:
            out[k] = u * zx[i]
            k += 1
            continue
        if i == 0:       # the tail beyond R (Marsaglia's method)
            while True:
                if w + 2 > nw:
                    return k
                a = ((words[w] >> shift) + np.uint64(1)) * _U53
                b = ((words[w + 1] >> shift) + np.uint64(1)) * _U53
                w += 2
                x = math.log(a) / tail_start
                if -2.0 * math.log(b) >= x * x:
                    break
            out[k] = (x - tail_start) if u < 0.0 else (tail_start - x)
            k += 1
            continue
        if w >= nw:
            return k
        x = u * zx[i]            # the wedge between layers i and i + 1
        f0 = math.exp(-0.5 * (zx[i] * zx[i] - x * x))
        f1 = math.exp(-0.5 * (zx[i + 1] * zx[i + 1] - x * x))
        v = (words[w] >> shift) * _U53
        w += 1
        if f1 + v * (f0 - f1) < 1.0:
            out[k] = x
            k += 1
    return k


@njit(cache=True)
def _normalize_rows(x):
    for i in range(x.shape[0]):
        s = 0.0
        for j in range(x.shape[1]):
            s += x[i, j] * x[i, j]
        s = math.sqrt(s)
        if s == 0.0:     # probability 0 (all d normals exactly 0); keep a unit vector anyway
            x[i, 0], s = 1.0, 1.0
        for j in range(x.shape[1]):
            x[i, j] /= s


def standard_normals(rng: np.random.Generator, n: int) -> np.ndarray:
    """n standard normals from rng's raw words (the compiled ziggurat)."""
    out = np.empty(n)
    done = 0
    while done < n:
        need = n - done
        done = _fill_normals(rng.bit_generator.random_raw(need + need // 32 + 16), out, done, _ZX, _ZR, _R)
    return out


def sphere_points(rng: np.random.Generator, shape, d: int) -> np.ndarray:
    """Uniform draws on the unit sphere of R^d, shape (*shape, d)."""
    shape = tuple(np.atleast_1d(shape).tolist())
    m = int(np.prod(shape))
    x = standard_normals(rng, m * d).reshape(m, d)
    _normalize_rows(x)
    return x.reshape(*shape, d)
