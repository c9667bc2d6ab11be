"""Duchi, Jordan & Wainwright l2-ball mechanism (seed 000, Lemma 2.2), sampled without rejection."""

from __future__ import annotations

import math

import numpy as np
from numba import njit
from scipy import special

from ldpfed.mechanisms.clip import CLIP_RTOL
from ldpfed.util.errors import ConfigError
from ldpfed.util.normals import fill_normal_rows, normal_array

from . import _validate as V
from .domains import Domain
from .guarantee import Guarantee
from .protocol import L2_BALL, RowKernel

# A row counts as clipped when its norm exceeds radius by more than ldpfed.mechanisms.clip.CLIP_RTOL; rows within the
# tolerance (e.g. vectors normalised to exactly `radius` with rounding error) are still rescaled to `radius`,
# which changes them by at most one ulp-level amount, but are not counted.


def l2_ball_radius(radius, eps, dim) -> float:
    """B = R sqrt(pi) coth(eps/2) Gamma((d+1)/2) / Gamma(d/2), with the Gamma ratio taken through log-gamma
    (the plain ratio overflows near d = 340). E[B v] = g for the sampling in L2BallMechanism."""
    r = V.positive("radius", radius)
    e = V.eps(eps)
    d = V.integer("dim", dim)
    log_ratio = special.gammaln((d + 1) / 2.0) - special.gammaln(d / 2.0)
    return r * math.sqrt(math.pi) / math.tanh(e / 2.0) * math.exp(log_ratio)


@njit(cache=True, inline="always")
def privatize_at(x, xo, dim, radius, B, tanh_half, z, zo, unif, out, oo):
    """The mechanism on the row x[xo:xo + dim] into out[oo:oo + dim], from the dim standard normals z[zo:zo + dim]
    and the uniform `unif`; returns ||g|| (the caller counts clipping). The one implementation of the sampling: the
    batched mechanism below (privatize_row) and the compiled rows (ldpfed.mechanisms.rows) both call it; offsets, not
    slices, so a compiled loop makes no array views per user.

    g is clipped to the radius; v = gauss / ||gauss|| is uniform on the unit sphere; the output B v lies in the
    half-space {v.u >= 0} of u = g/||g|| (u = e_1 for g = 0) w.p. p = 1/2 + ||g|| tanh(eps/2) / (2R), else in the
    opposite one. No rejection: a v on the wrong side is reflected through the hyperplane u-perp (v - 2 (v.u) u
    maps the uniform law on one half-sphere onto the other)."""
    norm = 0.0
    for j in range(dim):
        norm += x[xo + j] * x[xo + j]
    norm = math.sqrt(norm)
    norm_c = radius if norm > radius else norm
    nv = 0.0
    for j in range(dim):
        nv += z[zo + j] * z[zo + j]
    nv = math.sqrt(nv)
    if nv == 0.0:    # probability 0 (all dim normals exactly 0); guard anyway
        nv = 1.0
    proj = 0.0
    for j in range(dim):
        out[oo + j] = z[zo + j] / nv
        proj += out[oo + j] * ((x[xo + j] / norm) if norm > 0.0 else (1.0 if j == 0 else 0.0))
    want_pos = unif < 0.5 + norm_c * (tanh_half / (2.0 * radius))
    if (proj >= 0.0) != want_pos:
        for j in range(dim):
            out[oo + j] -= (2.0 * proj) * ((x[xo + j] / norm) if norm > 0.0 else (1.0 if j == 0 else 0.0))
    for j in range(dim):
        out[oo + j] *= B
    return norm


@njit(cache=True)
def privatize_row(g, radius, B, tanh_half, gauss, unif, out):
    """privatize_at on one whole row g (dim,) into out (dim,), from its normals `gauss` (dim,)."""
    return privatize_at(g, 0, g.shape[0], radius, B, tanh_half, gauss, 0, unif, out, 0)


@njit(cache=True)
def _privatize_rows(x, radius, B, tanh_half, rtol, gauss, unif, out):
    """privatize_row on every row of x (n, dim) into out (n, dim); returns how many rows were clipped (norm >
    radius (1 + rtol)). Compiled: one pass per row, no temporaries (the numpy version cost more than drawing its
    normals)."""
    clipped = 0
    for i in range(x.shape[0]):
        if privatize_row(x[i], radius, B, tanh_half, gauss[i], unif[i], out[i]) > radius * (1.0 + rtol):
            clipped += 1
    return clipped


class L2BallMechanism:
    """eps-LDP, unbiased release of g with ||g|| <= radius: Z = B v, ||Z|| = B exactly, E[Z] = g exactly.

    v is uniform on the unit sphere, in the half-space {v : v.g >= 0} with probability
    1/2 + ||g|| tanh(eps/2) / (2R), otherwise in the opposite one (zero input: either, w.p. 1/2 -> E[Z] = 0).
    The density ratio of two inputs is at most p_max/(1-p_max) = e^eps (p_max = expit(eps)).
    Rows with norm > radius are clipped to the radius (privacy and unbiasedness need ||g|| <= R) and counted.
    """

    def __init__(self, radius, eps, dim, *, model="ldp"):
        self.radius = V.positive("radius", radius)
        self.eps = V.eps(eps)
        self.dim = V.integer("dim", dim)
        self.output_radius = l2_ball_radius(self.radius, self.eps, self.dim)
        self.tanh_half = math.tanh(self.eps / 2.0)
        self.guarantee = Guarantee("l2-ball", V.model(model), self.eps, 0.0, self.radius, "l2")

    def privatize(self, g, rng: np.random.Generator) -> np.ndarray:
        """g: (n, dim). Returns Z of shape (n, dim) (rows over the radius are clipped to it; privatize_counted also
        says how many)."""
        return self._sample(g, rng)[0]

    def privatize_counted(self, g, rng: np.random.Generator) -> tuple[np.ndarray, int]:
        """g: (n, dim). Returns (Z of shape (n, dim), number of rows clipped to the radius: norm > radius
        (1 + CLIP_RTOL)). The same draws and outputs as privatize."""
        return self._sample(g, rng)

    def row_kernel(self, shape):
        """One user's field, compiled (ldpfed.mechanisms.rows): its entries read as consecutive rows of `dim` (e.g.
        (dim,), (K, dim), or (K, d) for one message of dim = K d), privatize_row on each row (rows over the radius
        are clipped to it; the caller counts clipping)."""
        shape = tuple(shape)
        if not shape or int(np.prod(shape, dtype=np.int64)) % self.dim:
            raise ConfigError("shape", shape, f"must hold whole rows of the mechanism's dim {self.dim}")
        rows = int(np.prod(shape, dtype=np.int64)) // self.dim
        return RowKernel(L2_BALL, (self.radius, self.output_radius, self.tanh_half, self.dim), rows * (self.dim + 1))

    def draw_rows(self, rng: np.random.Generator, n: int, shape) -> np.ndarray:
        """n users' draws, (n, rows (dim + 1)): every row's normals, then every row's uniform (the order of
        _sample on the (n rows, dim) matrix of their inputs, so both give the same outputs)."""
        rows = int(np.prod(shape, dtype=np.int64)) // self.dim
        out = np.empty((int(n), rows * (self.dim + 1)))
        self.fill_rows(rng, out)
        return out

    def fill_rows(self, rng: np.random.Generator, out: np.ndarray) -> None:
        """draw_rows's numbers written into out (n, draws), a view of the round's draw buffer (no copy)."""
        rows = out.shape[1] // (self.dim + 1)
        fill_normal_rows(rng, out[:, :rows * self.dim])
        out[:, rows * self.dim:] = rng.random(out.shape[0] * rows).reshape(out.shape[0], rows)

    def _sample(self, g, rng: np.random.Generator) -> tuple[np.ndarray, int]:
        x = V.finite_array("g", g)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ConfigError("g.shape", x.shape, f"must be (n, {self.dim})")
        # The draws, in this order (the sequential engine's draw_client mirrors it): the directions' normals (one
        # call to ldpfed.util.normals), then the half-space uniforms.
        gauss = normal_array(rng, x.shape)
        unif = rng.random(x.shape[0])
        out = np.empty_like(gauss)
        n_clipped = _privatize_rows(x, self.radius, self.output_radius, self.tanh_half, CLIP_RTOL, gauss, unif, out)
        return out, int(n_clipped)

    def output_domain(self, shape, data_bound=None, **schedule) -> Domain:
        """Contract: every output row has l2 norm exactly B (up to rounding), whatever the input (data_bound is not
        needed: ignored). `shape` (..., dim) and `schedule` (e.g. slots=) describe the message field that carries
        the outputs."""
        shape = tuple(shape)
        B = self.output_radius
        return Domain(shape, low=-B, high=B, radius=B, source=f"l2-ball sphere of radius B={B:.6g} (the output radius)",
                      **schedule)

    def dp_event(self) -> dict:
        """{}: dp-accounting has no model of this mechanism's privacy loss; its pure eps claim is composed as is."""
        return {}

    def __repr__(self):
        return f"L2BallMechanism(radius={self.radius}, eps={self.eps}, dim={self.dim}, B={self.output_radius:.6g})"
