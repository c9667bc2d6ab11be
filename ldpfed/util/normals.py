"""Standard normals drawn fast: a compiled ziggurat fed by an inlined xoshiro256++ generator.

The normals come from Doornik's ZIGNOR ziggurat (128 layers: Doornik 2005, "An improved ziggurat method to generate
normal random samples") fed by xoshiro256++ (Blackman & Vigna 2018) inlined in the same compiled loop: ~2x cheaper
per normal than numpy's Generator.standard_normal (whose words go through a function pointer per draw). Bits of a
word: 0-6 choose the layer, 11-63 give the uniform (disjoint, so independent). The tail beyond R is Marsaglia's
exact method, so the law is the standard normal's up to floating point, as numpy's own ziggurat.

Who uses it: the world simulation (envs/sphere.py: contexts on the sphere), the local randomizers' noise
(mechanisms: Gaussian, symmetric Gaussian, the l2-ball's directions) and the Gaussian tree's nodes
(mechanisms/tree.py: node_draws; at B = 1 private-linucb closes a node of 351 normals per user): the per-user hot
paths. The Wishart mechanism's draws and everything else come from numpy. Like numpy's PCG64, xoshiro256++ is not
a cryptographic generator: right for simulating a mechanism's law, not for protecting real users' data.

Stream: each call takes 4 raw words from the run's Generator (`rng.bit_generator.random_raw(4)`) as the 256-bit
xoshiro state and draws everything from it, so the normals are a function of the Generator's state only: the same
Generator state gives the same normals, bit for bit, in any process (the engines stay bit-identical), and the
Generator moves on by exactly 4 words per call whatever the size; a call for no normals takes no words (as numpy's).
Two calls are NOT one call cut in two (unlike numpy's): whoever mirrors a mechanism's draws (the sequential
engine's `draw_client`) makes the same calls, of the same sizes, in the same order.
tests/test_sphere.py checks the generator against the reference algorithm and the normals (Kolmogorov-Smirnov,
chi-square on 512 bins, tail mass, lag correlation).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

_LAYERS = 128
R = 3.442619855899          # start of the tail (ZIGNOR, 128 layers)
_V = 9.91256303526217e-3     # area of each layer
_U53 = 1.0 / 2.0 ** 53


def _tables():
    x = np.zeros(_LAYERS + 1)
    f = math.exp(-0.5 * R * R)
    x[0], x[1] = _V / f, R
    for i in range(2, _LAYERS):
        x[i] = math.sqrt(-2.0 * math.log(_V / x[i - 1] + f))
        f = math.exp(-0.5 * x[i] * x[i])
    return x, x[1:] / x[:-1]    # x[LAYERS] = 0


ZX, ZR = _tables()     # the ziggurat's layer edges and ratios (passed to the compiled loops)


@njit(inline="always")
def _rotl(x, k):
    return (x << np.uint64(k)) | (x >> np.uint64(64 - k))


@njit(inline="always")
def _next(s0, s1, s2, s3):
    """xoshiro256++: (the next 64-bit word, the new state)."""
    word = _rotl(s0 + s3, 23) + s0
    t = s1 << np.uint64(17)
    s2 ^= s0
    s3 ^= s1
    s1 ^= s2
    s0 ^= s3
    s2 ^= t
    s3 = _rotl(s3, 45)
    return word, s0, s1, s2, s3


@njit(inline="always")
def _uniform_open(word):
    """(0, 1]: 53 bits of the word, plus one ulp (so a log of it is finite)."""
    return ((word >> np.uint64(11)) + np.uint64(1)) * _U53


@njit(inline="always")
def next_normal(s0, s1, s2, s3, zx, zr):
    """One standard normal (ZIGNOR) and the new state."""
    while True:
        word, s0, s1, s2, s3 = _next(s0, s1, s2, s3)
        i = np.intp(word & np.uint64(0x7F))
        u = 2.0 * (np.int64(word >> np.uint64(11)) * _U53) - 1.0
        if abs(u) < zr[i]:
            return u * zx[i], s0, s1, s2, s3
        if i == 0:       # the tail beyond R (Marsaglia's method)
            while True:
                wa, s0, s1, s2, s3 = _next(s0, s1, s2, s3)
                wb, s0, s1, s2, s3 = _next(s0, s1, s2, s3)
                x = math.log(_uniform_open(wa)) / R
                if -2.0 * math.log(_uniform_open(wb)) >= x * x:
                    break
            return ((x - R) if u < 0.0 else (R - x)), s0, s1, s2, s3
        x = u * zx[i]            # the wedge between layers i and i + 1
        f0 = math.exp(-0.5 * (zx[i] * zx[i] - x * x))
        f1 = math.exp(-0.5 * (zx[i + 1] * zx[i + 1] - x * x))
        wv, s0, s1, s2, s3 = _next(s0, s1, s2, s3)
        if f1 + ((wv >> np.uint64(11)) * _U53) * (f0 - f1) < 1.0:
            return x, s0, s1, s2, s3


@njit(cache=True)
def _xoshiro_words(state, out):
    """out[:] = the next words of xoshiro256++ from `state` (updated in place): the generator alone, for tests."""
    s0, s1, s2, s3 = state[0], state[1], state[2], state[3]
    for k in range(out.shape[0]):
        w, s0, s1, s2, s3 = _next(s0, s1, s2, s3)
        out[k] = w
    state[0], state[1], state[2], state[3] = s0, s1, s2, s3


@njit(cache=True)
def _fill_normals(state, out, zx, zr):
    """out (2-d, possibly strided: a column block of a wider buffer) = standard normals in C order; `state`
    (4 uint64, the xoshiro state) is updated in place."""
    s0, s1, s2, s3 = state[0], state[1], state[2], state[3]
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            x, s0, s1, s2, s3 = next_normal(s0, s1, s2, s3, zx, zr)
            out[i, j] = x
    state[0], state[1], state[2], state[3] = s0, s1, s2, s3


def xoshiro_state(rng: np.random.Generator) -> np.ndarray:
    """The xoshiro state of one call: 4 raw words of rng (all zero, probability 2^-256, is xoshiro's one fixed
    point: replaced by a fixed nonzero state)."""
    state = np.asarray(rng.bit_generator.random_raw(4), dtype=np.uint64)
    if not state.any():
        state[0] = 1
    return state


def standard_normals(rng: np.random.Generator, n: int) -> np.ndarray:
    """n standard normals (the compiled ziggurat), from 4 words of rng (none when n = 0)."""
    return fill_normal_rows(rng, np.empty((1, int(n))))[0]


def fill_normal_rows(rng: np.random.Generator, out: np.ndarray) -> np.ndarray:
    """out (n, m), a view, filled with the numbers normal_array(rng, (n, m)) gives: no array of its own to copy."""
    if out.size:
        _fill_normals(xoshiro_state(rng), out, ZX, ZR)
    return out


def normal_array(rng: np.random.Generator, shape) -> np.ndarray:
    """Standard normals of this shape, filled in C order: standard_normals(rng, size).reshape(shape)."""
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
    return standard_normals(rng, math.prod(shape)).reshape(shape)
