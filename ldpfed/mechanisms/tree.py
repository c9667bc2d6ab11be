"""Binary (tree) mechanism for private prefix sums of a stream (seeds 001, 003)."""

from __future__ import annotations

import math

import numpy as np

from ldpfed.errors import ConfigError

from . import _validate as V
from .gaussian import gaussian_sigma
from .guarantee import Guarantee

NOISES = ("gaussian", "laplace")


def tree_depth(horizon: int) -> int:
    """L = floor(log2 horizon) + 1: the number of levels, hence the most nodes one element touches."""
    return int(horizon).bit_length()


class TreeNoise:
    """Data-independent noise of the binary mechanism.

    Node at level i closes at the steps t with lowest set bit i (it covers the dyadic block (t - 2^i, t]) and
    gets fresh noise then; the noise of prefix t is the sum of the nodes of the set bits of t (popcount(t) <= L
    nodes). Gaussian nodes have std `node_scale`, Laplace nodes scale b = `node_scale`; `step(rng, node_scale=s)`
    overrides the scale of the node closing at that step (LinUCB-DGS scales a node by the sensitivity at its
    closing time). symmetric=True: each node is a symmetric matrix (upper triangle incl. diagonal i.i.d.,
    mirrored); shape must then be (d, d).
    """

    def __init__(self, horizon, shape, *, noise="gaussian", node_scale, symmetric=False):
        self.horizon = V.integer("horizon", horizon)
        self.shape = V.shape("shape", shape)
        if noise not in NOISES:
            raise ConfigError("noise", noise, f"must be one of {NOISES}")
        self.noise = noise
        self.node_scale = V.positive("node_scale", node_scale)
        self.symmetric = bool(symmetric)
        if self.symmetric and (len(self.shape) != 2 or self.shape[0] != self.shape[1]):
            raise ConfigError("shape", shape, "symmetric=True needs a square (d, d) shape")
        self.depth = tree_depth(self.horizon)
        self.t = 0
        self._nodes = np.zeros((self.depth, *self.shape))

    def _fresh(self, scale: float, rng: np.random.Generator) -> np.ndarray:
        if self.symmetric:
            d = self.shape[0]
            size = d * (d + 1) // 2
        else:
            size = self.shape
        if self.noise == "gaussian":
            z = rng.standard_normal(size)
            z *= scale
        else:
            z = rng.laplace(0.0, scale, size=size)
        return V.symmetric_from_upper(z, self.shape[0]) if self.symmetric else z

    def step(self, rng: np.random.Generator, node_scale=None) -> np.ndarray:
        """Advance t by one; return the noise of prefix t (a new array of shape `shape`)."""
        scale = self.node_scale if node_scale is None else V.positive("node_scale", node_scale)
        if self.t >= self.horizon:
            raise ConfigError("t", self.t + 1, f"the stream is longer than horizon={self.horizon}")
        self.t += 1
        t = self.t
        level = (t & -t).bit_length() - 1
        self._nodes[level] = self._fresh(scale, rng)
        out = np.zeros(self.shape)
        j, rest = 0, t
        while rest:
            if rest & 1:
                out += self._nodes[j]
            rest >>= 1
            j += 1
        return out

    def __repr__(self):
        return (f"TreeNoise(horizon={self.horizon}, shape={self.shape}, noise={self.noise!r}, "
                f"node_scale={self.node_scale:.6g}, symmetric={self.symmetric}, t={self.t})")


class TreeMechanism:
    """Private prefix sums of a stream x_1, x_2, ... (each x_t of shape `shape`) by the binary mechanism.

    Each element lands in at most L = depth nodes, so the whole release is ONE mechanism on the vector of node
    sums: Gaussian with L2 sensitivity sqrt(L) * sensitivity, i.e. node std sqrt(L) * sigma(sensitivity, eps,
    delta) -- the budget is NOT split into (eps/L, delta/L) (which would cost 4-5x more noise); Laplace with L1
    sensitivity L * sensitivity, i.e. node scale b = L * sensitivity / eps (pure DP, delta must be 0).
    `sensitivity` bounds the L2 (Gaussian) or L1 (Laplace) norm of one element x_t (for symmetric=True: of
    its upper triangle incl. diagonal, the entries that get independent noise).
    """

    def __init__(self, horizon, shape, *, eps, delta=0.0, sensitivity, noise="gaussian", symmetric=False,
                 calibration="classic", model="central"):
        horizon = V.integer("horizon", horizon)
        e = V.eps(eps)
        sens = V.positive("sensitivity", sensitivity)
        if noise not in NOISES:
            raise ConfigError("noise", noise, f"must be one of {NOISES}")
        L = tree_depth(horizon)
        if noise == "gaussian":
            dl = V.delta_open(delta)
            node_scale = math.sqrt(L) * gaussian_sigma(sens, e, dl, calibration)
            norm = "l2"
        else:
            dl = V.real("delta", delta)
            if dl != 0.0:
                raise ConfigError("delta", delta, "the Laplace tree mechanism is pure DP: delta must be 0")
            V.calibration(calibration)
            node_scale = L * sens / e
            norm = "l1"
        self.node_scale = node_scale
        self.guarantee = Guarantee(f"tree-{noise}", V.model(model), e, dl, sens, norm)
        self._noise = TreeNoise(horizon, shape, noise=noise, node_scale=node_scale, symmetric=symmetric)
        self.depth = L
        self.shape = self._noise.shape
        self.horizon = horizon
        self._sum = np.zeros(self.shape)

    @property
    def t(self) -> int:
        return self._noise.t

    def add(self, x, rng: np.random.Generator) -> np.ndarray:
        """Append x to the stream and return the noisy prefix sum including x."""
        a = V.finite_array("x", x)
        if a.shape != self.shape:
            raise ConfigError("x.shape", a.shape, f"must equal shape={self.shape}")
        noise = self._noise.step(rng)  # the same draws whatever x is
        self._sum += a
        return self._sum + noise

    def __repr__(self):
        g = self.guarantee
        return (f"TreeMechanism({g.mechanism}, horizon={self.horizon}, depth={self.depth}, "
                f"node_scale={self.node_scale:.6g}, eps={g.eps}, delta={g.delta})")
