"""Duchi, Jordan & Wainwright l2-ball mechanism (seed 000, Lemma 2.2), sampled without rejection."""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from ldpfed.errors import ConfigError

from . import _validate as V
from .domains import Domain
from .guarantee import Guarantee

# A row counts as clipped when its norm exceeds radius by more than this relative tolerance; rows within the
# tolerance (e.g. vectors normalised to exactly `radius` with rounding error) are still rescaled to `radius`,
# which changes them by at most one ulp-level amount, but are not counted.
CLIP_RTOL = 1e-9


def l2_ball_radius(radius, eps, dim) -> float:
    """B = R sqrt(pi) coth(eps/2) Gamma((d+1)/2) / Gamma(d/2), with the Gamma ratio taken through log-gamma
    (the plain ratio overflows near d = 340). E[B v] = g for the sampling in L2BallMechanism."""
    r = V.positive("radius", radius)
    e = V.eps(eps)
    d = V.integer("dim", dim)
    log_ratio = special.gammaln((d + 1) / 2.0) - special.gammaln(d / 2.0)
    return r * math.sqrt(math.pi) / math.tanh(e / 2.0) * math.exp(log_ratio)


def _sample_sphere_halfspace(u: np.ndarray, p_pos: np.ndarray, B: float, rng: np.random.Generator) -> np.ndarray:
    """Rows Z = B v with v uniform on the unit sphere restricted to {v.u >= 0} w.p. p_pos, else to {v.u < 0}.

    u: (n, dim) unit vectors (the orientation of the half-spaces), p_pos: (n,). No rejection: a Gaussian
    direction is normalised, and reflected through the hyperplane u-perp (v - 2 (v.u) u, which maps the uniform
    law on one half-sphere onto the other) when it lies on the wrong side.
    """
    n, dim = u.shape
    v = rng.standard_normal((n, dim))
    nv = np.sqrt(np.einsum("ij,ij->i", v, v))
    # A zero Gaussian draw has probability 0 (and would need all dim draws exactly 0); guard anyway.
    nv[nv == 0.0] = 1.0
    v /= nv[:, None]
    want_pos = rng.random(n) < p_pos
    proj = np.einsum("ij,ij->i", v, u)
    flip = (proj >= 0.0) != want_pos
    v[flip] -= (2.0 * proj[flip])[:, None] * u[flip]
    v *= B
    return v


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
        self.B = l2_ball_radius(self.radius, self.eps, self.dim)
        self._tanh = math.tanh(self.eps / 2.0)
        self.guarantee = Guarantee("l2-ball", V.model(model), self.eps, 0.0, self.radius, "l2")

    def privatize(self, g, rng: np.random.Generator) -> tuple[np.ndarray, int]:
        """g: (n, dim). Returns (Z of shape (n, dim), number of rows clipped to the radius)."""
        x = V.finite_array("g", g)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ConfigError("g.shape", x.shape, f"must be (n, {self.dim})")
        n = x.shape[0]
        norms = np.sqrt(np.einsum("ij,ij->i", x, x))
        over = norms > self.radius
        n_clipped = int(np.count_nonzero(norms > self.radius * (1.0 + CLIP_RTOL)))
        norms_c = np.where(over, self.radius, norms)
        # orientation u = g/||g||; for g = 0 any fixed unit vector (p = 1/2 makes the output symmetric).
        u = np.zeros((n, self.dim))
        nz = norms > 0.0
        u[nz] = x[nz] / norms[nz, None]
        u[~nz, 0] = 1.0
        p_pos = 0.5 + norms_c * (self._tanh / (2.0 * self.radius))
        return _sample_sphere_halfspace(u, p_pos, self.B, rng), n_clipped

    def output_domain(self, shape=None, **schedule) -> Domain:
        """Contract: every output row has l2 norm exactly B (up to rounding), whatever the input. `shape` (..., dim)
        and `schedule` (e.g. slots=) describe the message field that carries the outputs."""
        shape = (self.dim,) if shape is None else tuple(shape)
        return Domain(shape, low=-self.B, high=self.B, radius=self.B, source=f"l2-ball sphere of radius B={self.B:.6g}",
                      **schedule)

    def __repr__(self):
        return f"L2BallMechanism(radius={self.radius}, eps={self.eps}, dim={self.dim}, B={self.B:.6g})"
