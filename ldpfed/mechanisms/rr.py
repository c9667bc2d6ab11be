"""Binary randomized response (seed 004, Eq. 2)."""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from ldpfed.util.errors import ConfigError

from . import _validate as V
from .domains import Domain
from .guarantee import Guarantee
from .protocol import RANDOMIZED_RESPONSE, RowKernel


class RandomizedResponse:
    """Report the true bit with probability p_keep = e^eps/(1+e^eps) = expit(eps), else its flip; pure eps-LDP."""

    def __init__(self, eps, *, model="ldp"):
        self.eps = V.eps(eps)
        self.p_keep = float(special.expit(self.eps))
        self.p_flip = float(special.expit(-self.eps))  # 1/(1+e^eps), computed without cancellation
        self.tanh_half = math.tanh(self.eps / 2.0)  # = 2 p_keep - 1
        self.guarantee = Guarantee("randomized-response", V.model(model), self.eps, 0.0, 1.0, "none")

    def privatize(self, bits, rng: np.random.Generator) -> np.ndarray:
        b = np.asarray(bits)
        if b.dtype == np.bool_:
            b = b.astype(np.int64)
        elif not (np.issubdtype(b.dtype, np.integer) or np.issubdtype(b.dtype, np.floating)):
            raise ConfigError("bits", bits if b.size <= 6 else f"<array dtype={b.dtype}>", "must be 0/1 or bool")
        if not np.isin(b, (0, 1)).all():
            bad = b[~np.isin(b, (0, 1))].ravel()[:3].tolist()
            raise ConfigError("bits", bits if b.size <= 6 else f"<array with {bad}>", "entries must be 0 or 1")
        b = b.astype(np.int64, copy=False)
        flip = rng.random(b.shape) >= self.p_keep
        return np.bitwise_xor(b, flip.astype(np.int64))

    def row_kernel(self, shape):
        """One user's bits, compiled (ldpfed.mechanisms.rows): kept when u < p_keep, else flipped."""
        return RowKernel(RANDOMIZED_RESPONSE, (self.p_keep,), int(np.prod(shape, dtype=np.int64)))

    def draw_rows(self, rng: np.random.Generator, n: int, shape) -> np.ndarray:
        """n users' uniforms, (n, entries): the draws privatize makes for bits of shape (n, *shape)."""
        return rng.random((int(n), int(np.prod(shape, dtype=np.int64))))

    def output_domain(self, shape, data_bound=None, **schedule) -> Domain:
        """Contract: every reported bit is 0 or 1, whatever the input (data_bound is not needed: ignored); a field
        that carries bits in a slot, e.g. the pulled arm's, may say so with at_most_one=True."""
        return Domain(shape, low=0.0, high=1.0, integral=True, source="randomized response: bits {0, 1}", **schedule)

    def dp_event(self) -> dict:
        """Binary randomized response with keep probability expit(eps) (the accountant reads eps off the
        guarantee)."""
        return {"noise": "randomized-response", "nodes": 1}

    def feedback_mean(self, mu):
        """Mean of the reports when the true bits have mean mu: 1/(1+e^eps) + tanh(eps/2) mu."""
        if np.ndim(mu):
            return self.p_flip + self.tanh_half * np.asarray(mu, dtype=np.float64)
        return self.p_flip + self.tanh_half * float(mu)

    def debias(self, mean_reports):
        """Unbiased estimate of mu from the mean of reports: (m - 1/(1+e^eps)) / tanh(eps/2)."""
        if np.ndim(mean_reports):
            return (np.asarray(mean_reports, dtype=np.float64) - self.p_flip) / self.tanh_half
        return (float(mean_reports) - self.p_flip) / self.tanh_half

    def __repr__(self):
        return f"RandomizedResponse(eps={self.eps}, p_keep={self.p_keep:.6g})"
