"""Laplace mechanism."""

from __future__ import annotations

import numpy as np

from . import _validate as V
from .guarantee import Guarantee


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

    def __repr__(self):
        return f"LaplaceMechanism(b={self.b:.6g}, eps={self.guarantee.eps})"
