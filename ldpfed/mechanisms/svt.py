"""Sparse vector technique: AboveNoisyThreshold with at most c positives (Dwork & Roth 2014, Algorithm 2
"Sparse"; seed 003, Algorithm 2 lines 4-14)."""

from __future__ import annotations

import math

import numpy as np

from ldpfed.util.errors import ConfigError

from . import _validate as V
from .domains import Domain
from .guarantee import Guarantee


def sparse_scales(eps: float, sensitivity: float, c: int, delta: float = 0.0) -> tuple[float, float]:
    """Default (threshold_scale, value_scale) of Dwork-Roth Sparse for c positives, threshold re-drawn after
    every positive: sigma = 2 c Delta / eps (pure eps-DP, delta = 0) or sqrt(32 c ln(1/delta)) Delta / eps
    ((eps, delta)-DP by advanced composition, the form seed 003 uses with xi = sigma), threshold ~ Lap(sigma),
    every query value ~ Lap(2 sigma)."""
    if delta == 0.0:
        sigma = 2.0 * c * sensitivity / eps
    else:
        sigma = math.sqrt(32.0 * c * math.log(1.0 / delta)) * sensitivity / eps
    return sigma, 2.0 * sigma


class AboveNoisyThreshold:
    """Indices of the queries whose noisy value reaches a noisy threshold, stopping after max_positives.

    Each positive ends one AboveThreshold round; a round with threshold noise Lap(s_T) and value noise Lap(s_V)
    on queries of sensitivity Delta costs eps0 = Delta/s_T + 2 Delta/s_V. The default scales (sparse_scales)
    spend eps0 = eps/c per round (delta = 0: c rounds compose to eps) or eps/sqrt(8 c ln(1/delta)) (delta > 0:
    advanced composition, Dwork-Roth Thm 3.20/Cor 3.21, stated there for eps < 1). Explicit scales are
    accepted if they are at least that noisy (else ConfigError). `delta` is an extension of the spec'd
    signature (keyword, default 0.0 = pure DP).
    """

    def __init__(self, threshold, eps, *, sensitivity=1.0, max_positives=1, threshold_scale=None,
                 value_scale=None, model="central", delta=0.0):
        self.threshold = V.real("threshold", threshold)
        e = V.eps(eps)
        sens = V.positive("sensitivity", sensitivity)
        c = V.integer("max_positives", max_positives)
        dl = V.real("delta", delta)
        if dl != 0.0:
            dl = V.delta_open(delta)
        dT, dV = sparse_scales(e, sens, c, dl)
        sT = dT if threshold_scale is None else V.positive("threshold_scale", threshold_scale)
        sV = dV if value_scale is None else V.positive("value_scale", value_scale)
        budget = e / c if dl == 0.0 else e / math.sqrt(8.0 * c * math.log(1.0 / dl))
        spent = sens / sT + 2.0 * sens / sV
        if spent > budget * (1.0 + 1e-9):
            field, val = (("value_scale", value_scale) if value_scale is not None
                          else ("threshold_scale", threshold_scale))
            raise ConfigError(field, val, f"too little noise: one round costs {spent:.6g} > the per-round budget "
                                          f"{budget:.6g} for eps={e}, delta={dl}, max_positives={c}")
        self.threshold_scale, self.value_scale = sT, sV
        self.max_positives = c
        self.sensitivity = sens
        self.guarantee = Guarantee("sparse-vector", V.model(model), e, dl, sens, "l1")

    def select_batch(self, values, rng: np.random.Generator) -> np.ndarray:
        """Independent runs on the rows of values (n, m): (n, max_positives) int array of selected indices in
        increasing order, padded with -1. Used by select() and by vectorized audits."""
        q = V.finite_array("values", values)
        if q.ndim != 2:
            raise ConfigError("values.ndim", q.ndim, "select_batch needs a 2-D (runs, queries) array")
        n, m = q.shape
        noisy = q + rng.laplace(0.0, self.value_scale, size=(n, m))
        out = np.full((n, self.max_positives), -1, dtype=np.int64)
        start = np.zeros(n, dtype=np.int64)  # next query index to examine, per run
        active = np.ones(n, dtype=bool)
        cols = np.arange(m)
        for r in range(self.max_positives):
            thr = self.threshold + rng.laplace(0.0, self.threshold_scale, size=n)  # fresh threshold per round
            hit = (noisy >= thr[:, None]) & (cols[None, :] >= start[:, None])
            any_hit = hit.any(axis=1) & active
            first = np.argmax(hit, axis=1)
            out[any_hit, r] = first[any_hit]
            start = np.where(any_hit, first + 1, start)
            active = any_hit
            if not active.any():
                break
        return out

    def select(self, values, rng: np.random.Generator) -> np.ndarray:
        """values: 1-D array of query answers. Returns the indices of the positives (at most max_positives)."""
        q = V.finite_array("values", values)
        if q.ndim != 1:
            raise ConfigError("values.ndim", q.ndim, "must be a 1-D array of query values")
        row = self.select_batch(q[None, :], rng)[0]
        return row[row >= 0]

    def privatize(self, values, rng: np.random.Generator) -> np.ndarray:
        """The positives as 0/1 indicators of the shape of values (..., m): one independent run per row of queries
        (the last axis); a 1-D input draws exactly what select() draws."""
        q = V.finite_array("values", values)
        if q.ndim < 1:
            raise ConfigError("values.ndim", q.ndim, "must have a last axis of queries")
        rows = q.reshape(-1, q.shape[-1])
        selected = self.select_batch(rows, rng)
        out = np.zeros(rows.shape)
        run, slot = np.nonzero(selected >= 0)
        out[run, selected[run, slot]] = 1.0
        return out.reshape(q.shape)

    def output_domain(self, shape, data_bound=None, **schedule) -> Domain:
        """Contract: 0/1 indicators, whatever the queries (data_bound is not needed: ignored)."""
        return Domain(tuple(shape), low=0.0, high=1.0, integral=True,
                      source=f"sparse vector: indicators of at most {self.max_positives} positives", **schedule)

    def dp_event(self) -> dict:
        """{}: dp-accounting has no model of the sparse vector technique; its claim is composed as it stands."""
        return {}

    def __repr__(self):
        g = self.guarantee
        return (f"AboveNoisyThreshold(threshold={self.threshold}, eps={g.eps}, delta={g.delta}, "
                f"c={self.max_positives}, threshold_scale={self.threshold_scale:.6g}, "
                f"value_scale={self.value_scale:.6g})")
