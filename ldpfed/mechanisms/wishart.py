"""Wishart mechanism for second-moment (Gram) matrices (Sheffet 2015; used per tree node in seed 003)."""

from __future__ import annotations

import math

import numpy as np

from ldpfed.errors import ConfigError

from . import _validate as V
from .guarantee import Guarantee

BARTLETT_K = 4096  # above this many degrees of freedom, sample() uses the Bartlett decomposition


def wishart_dof(dim: int, eps: float, delta: float) -> int:
    """Degrees of freedom k = floor(d + 1 + 28 ln(4/delta) / eps^2).

    Source of the constant: Sheffet, "Private approximations of the 2nd-moment matrix using existing techniques
    in linear regression" (arXiv 1507.00056), Wishart-mechanism theorem, which we recall as
    k = floor(d + (14/eps^2) * 2 ln(4/delta)) = floor(d + 28 ln(4/delta)/eps^2); the "+1" (making W full rank
    with a margin) follows the task specification and the way Shariff & Sheffet (2018) quote it. The paper's
    text was not available to us to re-check the constant; the statistical audit in tests only confirms gross
    under-calibration is caught (the theorem's bound is loose). NOTE: seed 003's text gives a different k,
    ceil(d eps^-2 ln(8d/delta) (2/delta)) -- its factor 2/delta looks like a conversion error and is not used.
    The theorem is stated for rows of l2 norm <= `sensitivity` (scale matrix sensitivity^2 I)."""
    return int(math.floor(dim + 1 + 28.0 * math.log(4.0 / delta) / eps**2))


class WishartMechanism:
    """gram + W, W ~ Wishart_dim(k, sensitivity^2 I) = sum of k outer products of N(0, sensitivity^2 I) draws.
    The output stays positive semi-definite whenever gram is."""

    def __init__(self, dim, eps, delta, *, sensitivity=1.0, model="central"):
        self.dim = V.integer("dim", dim)
        e = V.eps(eps)
        dl = V.delta_open(delta)
        self.sensitivity = V.positive("sensitivity", sensitivity)
        self.k = wishart_dof(self.dim, e, dl)
        self.guarantee = Guarantee("wishart", V.model(model), e, dl, self.sensitivity, "l2")

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        """A draw of Wishart_dim(k, sensitivity^2 I). Up to BARTLETT_K degrees of freedom it is literally the
        Gram matrix of k Gaussian draws (O(k dim^2)); above, the Bartlett decomposition gives the same
        distribution in O(dim^3): W = s^2 A A^T, A lower triangular, A_ii^2 ~ chi2(k - i) (i = 0..dim-1),
        A_ij ~ N(0, 1) below the diagonal (k reaches 1e9 at the per-node budgets of seed 003)."""
        d, k = self.dim, self.k
        if k <= BARTLETT_K:
            x = rng.standard_normal((k, d))
            w = x.T @ x
        else:
            a = np.zeros((d, d))
            a[np.diag_indices(d)] = np.sqrt(rng.chisquare(k - np.arange(d)))
            low = np.tril_indices(d, -1)
            a[low] = rng.standard_normal(low[0].size)
            w = a @ a.T
        w *= self.sensitivity**2
        # exact symmetry (BLAS may differ in the last bit between (i,j) and (j,i))
        return (w + w.T) * 0.5

    def privatize(self, gram, rng: np.random.Generator) -> np.ndarray:
        g = V.finite_array("gram", gram)
        if g.shape != (self.dim, self.dim):
            raise ConfigError("gram.shape", g.shape, f"must be ({self.dim}, {self.dim})")
        return g + self.sample(rng)

    def __repr__(self):
        return f"WishartMechanism(dim={self.dim}, k={self.k}, sensitivity={self.sensitivity})"
