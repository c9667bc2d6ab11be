"""Laplace mechanism."""

from __future__ import annotations

import numpy as np

from . import _validate as V
from .domains import Domain, laplace_tail
from .guarantee import Guarantee
from .protocol import LAPLACE, RowKernel, require_bound


class LaplaceMechanism:
    """values + Lap(b) i.i.d. on every entry, b = sensitivity / eps (L1 sensitivity); pure eps-DP."""

    def __init__(self, sensitivity, eps, *, model="ldp"):
        sens = V.positive("sensitivity", sensitivity)
        e = V.eps(eps)
        self.b = sens / e
        self.guarantee = Guarantee("laplace", V.model(model), e, 0.0, sens, "l1")

    def privatize(self, values, rng: np.random.Generator) -> np.ndarray:
        x = V.finite_array("values", values)
        out = rng.laplace(0.0, self.b, size=x.shape)
        out += x
        return out

    def row_kernel(self, shape):
        """One user's field, compiled (ldpfed.mechanisms.rows): x + b l with l a standard Laplace draw."""
        return RowKernel(LAPLACE, (self.b,), int(np.prod(shape, dtype=np.int64)))

    def draw_rows(self, rng: np.random.Generator, n: int, shape) -> np.ndarray:
        """n users' standard Laplace draws, (n, entries) (b times them is, bit for bit, what privatize adds)."""
        return rng.laplace(0.0, 1.0, size=(int(n), int(np.prod(shape, dtype=np.int64))))

    def output_domain(self, shape, data_bound=None, **schedule) -> Domain:
        """Contract: input entries within +-data_bound (the caller's public bound; required) plus the tail bound t
        of `domains.laplace_tail` over the field's coordinates (an honest output exceeds it w.p. < 1e-13)."""
        data_bound = require_bound(data_bound, "laplace")
        shape = tuple(shape)
        t = laplace_tail(self.b, int(np.prod(shape, dtype=np.int64)))
        return Domain(shape, low=-np.asarray(data_bound), high=data_bound, noise=("laplace", t),
                      source=f"laplace b={self.b:.6g}: |data| <= bound, tail {t:.6g}", **schedule)

    def dp_event(self) -> dict:
        """Lap(b) on every entry, one draw per input."""
        return {"noise": "laplace", "noise_scale": float(self.b), "nodes": 1}

    def __repr__(self):
        return f"LaplaceMechanism(b={self.b:.6g}, eps={self.guarantee.eps})"
