"""Gaussian mechanisms: calibration (classic and analytic), i.i.d. noise, symmetric matrix noise."""

from __future__ import annotations

import math
import warnings

import numpy as np
from numba import njit
from scipy import optimize, special

from ldpfed.util.errors import ConfigError
from ldpfed.util.normals import fill_normal_rows, normal_array

from . import _validate as V
from .domains import Domain, gaussian_tail_z
from .guarantee import Guarantee
from .protocol import GAUSSIAN, SYMMETRIC_GAUSSIAN, RowKernel, require_bound


def analytic_delta(eps: float, sigma_over_sensitivity: float) -> float:
    """Exact delta(eps) of the Gaussian mechanism with noise std s = sigma/Delta (Balle & Wang 2018, Thm 8):
    delta = Phi(1/(2s) - eps s) - e^eps Phi(-1/(2s) - eps s).
    Equivalently the delta(eps) of mu-GDP with mu = 1/s."""
    s = sigma_over_sensitivity
    a = 1.0 / (2.0 * s)
    b = eps * s
    first = special.ndtr(a - b)
    second = math.exp(eps + special.log_ndtr(-a - b))  # e^eps Phi(.) without overflowing e^eps
    return float(first - second)


def _analytic_unit_sigma(eps: float, delta: float) -> float:
    """Smallest s = sigma/Delta with analytic_delta(eps, s) <= delta (delta(eps, s) is decreasing in s)."""
    f = lambda s: analytic_delta(eps, s) - delta  # noqa: E731
    lo, hi = 1e-3, 1.0
    while f(lo) <= 0.0:  # tiny noise already enough (huge eps): move down
        lo /= 10.0
        if lo < 1e-300:
            return lo
    while f(hi) > 0.0:
        hi *= 2.0
    return float(optimize.brentq(f, lo, hi, xtol=1e-15, rtol=4 * np.finfo(float).eps, maxiter=500))


def gaussian_sigma(sensitivity, eps, delta, calibration="classic") -> float:
    """Noise standard deviation of an (eps, delta)-DP Gaussian mechanism with L2 sensitivity `sensitivity`.

    classic: Delta * sqrt(2 ln(1.25/delta)) / eps (Dwork & Roth Thm A.1). It is only *proven* for eps <= 1.
    Above eps = 1 the exact privacy profile (Balle & Wang 2018, Thm 8) decides: the classic sigma still holds
    for moderate eps (it is then larger than needed), but it under-states delta at large eps (e.g. delta = 0.01,
    eps = 10: its true delta is 4 delta). So above eps = 1 "classic" returns max(classic sigma, analytic sigma):
    the paper's formula wherever it is valid (paper reproductions keep their noise), the smallest valid sigma
    where it is not, with a CalibrationWarning saying so. (Switching rather than only warning: a run must never
    claim a delta its noise does not deliver.)
    analytic: the exact smallest sigma (Balle & Wang 2018, analytic Gaussian mechanism), found by root finding on
    the exact delta(eps, sigma) formula; valid for every eps > 0 and always <= the classic sigma for eps <= 1.
    """
    sens = V.positive("sensitivity", sensitivity)
    e = V.eps(eps)
    d = V.delta_open(delta)
    cal = V.calibration(calibration)
    if cal == "classic":
        classic = math.sqrt(2.0 * math.log(1.25 / d)) / e
        if e > 1.0:
            exact = _analytic_unit_sigma(e, d)
            if exact > classic:
                warnings.warn(f"classic Gaussian calibration at eps={e:g}, delta={d:g} under-states delta "
                              f"(true delta {analytic_delta(e, classic):.3g}); using the analytic sigma",
                              CalibrationWarning, stacklevel=2)
                return sens * exact
        return sens * classic
    return sens * _analytic_unit_sigma(e, d)


class CalibrationWarning(UserWarning):
    """A requested calibration was replaced by a valid one (see gaussian_sigma)."""


class GaussianMechanism:
    """values + N(0, sigma^2) i.i.d. on every entry (any shape; leading axis = users by convention). The normals
    come from ldpfed.util.normals, one call per privatize (the sequential engine's draw_client makes the same calls)."""

    mechanism_name = "gaussian"

    def __init__(self, sensitivity, eps, delta, *, model="ldp", calibration="classic"):
        self.sigma = gaussian_sigma(sensitivity, eps, delta, calibration)
        self.calibration = calibration
        self.guarantee = Guarantee(
            mechanism=self.mechanism_name,
            model=V.model(model),
            eps=float(eps),
            delta=float(delta),
            sensitivity=float(sensitivity),
            norm="l2",
        )

    def privatize(self, values, rng: np.random.Generator) -> np.ndarray:
        x = V.finite_array("values", values)
        out = normal_array(rng, x.shape)      # the compiled ziggurat (ldpfed.util.normals): one call, 4 words of rng
        out *= self.sigma
        out += x
        return out

    def noisy_coordinates(self, shape) -> int:
        """How many independent noise draws a field of this shape gets (per user)."""
        return int(np.prod(shape, dtype=np.int64))

    def row_kernel(self, shape):
        """One user's field of this shape, compiled (ldpfed.mechanisms.rows): x + sigma z."""
        return RowKernel(GAUSSIAN, (self.sigma,), self.noisy_coordinates(shape))

    def draw_rows(self, rng: np.random.Generator, n: int, shape) -> np.ndarray:
        """The standard normals of n users' fields, (n, draws): the draws privatize makes for (n, *shape)."""
        return normal_array(rng, (int(n), self.noisy_coordinates(shape)))

    def fill_rows(self, rng: np.random.Generator, out: np.ndarray) -> None:
        """draw_rows's numbers written into out (n, draws), a view of the round's draw buffer (no copy)."""
        fill_normal_rows(rng, out)

    def output_domain(self, shape, data_bound=None, **schedule) -> Domain:
        """Contract: the finite reals, narrowed to |output - data| <= z sigma per entry, where |data| <= data_bound
        entry-wise (the public bound of what the caller privatizes; required: DataBoundRequired without it) and
        z = gaussian_tail_z(noisy coordinates): by the union bound over the field's coordinates an honest output
        exceeds it w.p. < 1e-13."""
        data_bound = require_bound(data_bound, self.mechanism_name)
        shape = tuple(shape)
        z = gaussian_tail_z(self.noisy_coordinates(shape))
        return Domain(shape, low=-np.asarray(data_bound), high=data_bound, noise=("gaussian", self.sigma, z),
                      symmetric=self.mechanism_name == "symmetric-gaussian",
                      source=f"{self.mechanism_name} sigma={self.sigma:.6g}: |data| <= bound, tail z={z:.3f}",
                      **schedule)

    def dp_event(self) -> dict:
        """N(0, sigma^2) on every entry, one draw per input (the symmetric version: on the upper triangle)."""
        return {"noise": "gaussian", "noise_std": float(self.sigma), "nodes": 1}

    def __repr__(self):
        g = self.guarantee
        return f"{type(self).__name__}(sigma={self.sigma:.6g}, eps={g.eps}, delta={g.delta}, {self.calibration})"


_SQRT_MAX = math.sqrt(np.finfo(float).max)    # |x_i| at most this: every x_i x_j is finite


class SymmetricGaussianMechanism(GaussianMechanism):
    """Symmetric matrix noise for Gram-type messages: the upper triangle INCLUDING the diagonal is i.i.d.
    N(0, sigma^2) and mirrored, so every entry (diagonal and off-diagonal) has variance sigma^2.
    (G + G^T)/2 is a different, weaker distribution (off-diagonal variance sigma^2/2) and is not used.

    `sensitivity` is the L2 sensitivity of the upper triangle (incl. diagonal) seen as a vector of
    d(d+1)/2 entries; the noise is exactly a Gaussian mechanism on that vector."""

    mechanism_name = "symmetric-gaussian"

    def noisy_coordinates(self, shape) -> int:
        """The upper triangle (incl. diagonal) of each trailing (d, d) matrix is drawn; the rest is mirrored."""
        d = shape[-1]
        return int(np.prod(shape[:-2], dtype=np.int64)) * d * (d + 1) // 2

    def row_kernel(self, shape):
        """One user's field of (..., d, d) matrices, compiled: each + the symmetric noise of its upper triangle."""
        if len(shape) < 2 or shape[-1] != shape[-2]:
            raise ConfigError("shape", shape, "must be (..., d, d) with square trailing axes")
        return RowKernel(SYMMETRIC_GAUSSIAN, (self.sigma, shape[-1]), self.noisy_coordinates(shape))

    def noise(self, shape_prefix, d, rng: np.random.Generator) -> np.ndarray:
        """The symmetric noise alone, shape (*shape_prefix, d, d)."""
        d = V.integer("d", d)
        if isinstance(shape_prefix, (int, np.integer)) and not isinstance(shape_prefix, bool):
            shape_prefix = (int(shape_prefix),)
        try:
            prefix = tuple(int(s) for s in shape_prefix)
        except (TypeError, ValueError):
            raise ConfigError("shape_prefix", shape_prefix, "must be a tuple of ints") from None
        if any(s < 0 for s in prefix):
            raise ConfigError("shape_prefix", shape_prefix, "entries must be >= 0")
        return self._draw(prefix, d, None, rng)

    def _draw(self, prefix, d, base, rng):
        """base (None: zeros) + the symmetric noise, shape (*prefix, d, d): the upper triangles' standard normals
        are drawn in one block (*prefix, d(d+1)/2), row-major (the sequential engine's draw_client mirrors it), and
        sigma z is written to (i, j) and (j, i) by a compiled loop (no temporaries)."""
        z = normal_array(rng, (*prefix, d * (d + 1) // 2))
        out = np.empty((*prefix, d, d))
        flat = out.reshape(-1, d, d)
        add = base is not None
        index = V.sym_gather_index(d).reshape(d, d)
        _mirror_upper(z.reshape(-1, z.shape[-1]), self.sigma, base.reshape(-1, d, d) if add else flat, add, index, flat)
        return out

    def privatize(self, mats, rng: np.random.Generator) -> np.ndarray:
        m = V.finite_array("mats", mats)
        if m.ndim < 2 or m.shape[-1] != m.shape[-2]:
            raise ConfigError("mats.shape", m.shape, "must be (..., d, d) with square trailing axes")
        return self._draw(m.shape[:-2], m.shape[-1], m, rng)

    def privatize_gram(self, rows, rng: np.random.Generator) -> np.ndarray:
        """privatize(x x^T) for every row x of `rows` (..., d), without building the x x^T: the same draws and the
        same values, bit for bit (one pass instead of three over the (..., d, d) messages)."""
        x = V.finite_array("rows", rows)
        if x.ndim < 1:
            raise ConfigError("rows.shape", x.shape, "must be (..., d)")
        if float(np.max(np.abs(x), initial=0.0)) > _SQRT_MAX:
            raise ConfigError("rows", "entries beyond 1.3e154", "x x^T must be finite")
        d = x.shape[-1]
        z = normal_array(rng, (*x.shape[:-1], d * (d + 1) // 2))
        out = np.empty((*x.shape[:-1], d, d))
        index = V.sym_gather_index(d).reshape(d, d)
        _mirror_upper_gram(z.reshape(-1, z.shape[-1]), self.sigma, x.reshape(-1, d), index, out.reshape(-1, d, d))
        return out


@njit(cache=True)
def _mirror_upper(z, sigma, base, add, index, out):
    """out[i] = (base[i] if add, else 0) + the symmetric (d, d) matrix whose upper triangle (incl. diagonal,
    row-major) is sigma z[i]: entry (a, b) gets sigma z[i, index[a, b]] (index = V.sym_gather_index, so (a, b) and
    (b, a) read the same draw). Written in the output's order (2x faster than walking the triangle)."""
    d = out.shape[1]
    for i in range(out.shape[0]):
        for a in range(d):
            for b in range(d):
                w = sigma * z[i, index[a, b]]
                out[i, a, b] = (w + base[i, a, b]) if add else w


@njit(cache=True)
def _mirror_upper_gram(z, sigma, x, index, out):
    """out[i] = x[i] x[i]^T + the symmetric noise of _mirror_upper (the same values as privatize of the outer
    product: x_a x_b + sigma z)."""
    d = out.shape[1]
    for i in range(out.shape[0]):
        for a in range(d):
            for b in range(d):
                out[i, a, b] = sigma * z[i, index[a, b]] + x[i, a] * x[i, b]
