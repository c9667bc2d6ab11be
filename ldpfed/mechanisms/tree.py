"""Binary (tree) mechanism for private prefix sums of a stream (seeds 001, 003)."""

from __future__ import annotations

import math

import numpy as np

from ldpfed.util.errors import ConfigError
from ldpfed.util.normals import normal_array

from . import _validate as V
from .domains import Domain, gaussian_tail_z, laplace_tail
from .gaussian import gaussian_sigma
from .guarantee import Guarantee
from .protocol import require_bound

NOISES = ("gaussian", "laplace")


def tree_depth(horizon: int) -> int:
    """L = floor(log2 horizon) + 1: the number of levels, hence the most nodes one element touches."""
    return int(horizon).bit_length()


def node_draws(noise: str, rng: np.random.Generator, rows: int, size: int) -> np.ndarray:
    """The standard draws of `rows` tree nodes of `size` independent coordinates each, (rows, size), in one call:
    standard normals from the compiled ziggurat (ldpfed.util.normals: ~4x cheaper than numpy's, which was the largest
    cost of private-linucb at B = 1, where every user closes a node of (d+1)(d+2)/2 draws), or standard Laplace
    draws (numpy). A node's noise is its draws times the node's scale. Every tree draws here: TreeNoise, and the
    compiled trees of algorithms/central_linucb.py (their draw_server), so the two stay the same numbers."""
    if noise == "gaussian":
        return normal_array(rng, (rows, size))
    return rng.laplace(0.0, 1.0, (rows, size))


def _stream(horizon, shape, noise) -> tuple:
    """(horizon, shape, noise) of a tree's stream, checked (ConfigError naming the parameter)."""
    if noise not in NOISES:
        raise ConfigError("noise", noise, f"must be one of {NOISES}")
    return V.integer("horizon", horizon), V.shape("shape", shape), noise


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
        self.horizon, self.shape, self.noise = _stream(horizon, shape, noise)
        self.node_scale = V.positive("node_scale", node_scale)
        self.symmetric = bool(symmetric)
        if self.symmetric and (len(self.shape) != 2 or self.shape[0] != self.shape[1]):
            raise ConfigError("shape", shape, "symmetric=True needs a square (d, d) shape")
        self.depth = tree_depth(self.horizon)
        self.t = 0
        self._nodes = np.zeros((self.depth, *self.shape))

    def _fresh(self, scale: float, rng: np.random.Generator) -> np.ndarray:
        z = node_draws(self.noise, rng, 1, self.coordinates())[0]
        z *= scale
        return V.symmetric_from_upper(z, self.shape[0]) if self.symmetric else z.reshape(self.shape)

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

    def coordinates(self) -> int:
        """How many independent draws one node gets (the upper triangle of a symmetric node)."""
        if self.symmetric:
            d = self.shape[0]
            return d * (d + 1) // 2
        return int(np.prod(self.shape, dtype=np.int64))

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

    def privatize(self, x, rng: np.random.Generator) -> np.ndarray:
        """The releases of a whole stream x (n, *shape), n <= horizon, by a fresh tree (this object's own stream,
        fed by `add`, is left as it is): out[t] = x_1 + ... + x_t + the noise of prefix t; the same draws and values
        as n calls of `add` on a new TreeMechanism."""
        a = V.finite_array("x", x)
        if a.shape[1:] != self.shape or a.ndim != len(self.shape) + 1:
            raise ConfigError("x.shape", a.shape, f"must be (n, *{self.shape}): a stream of elements")
        if a.shape[0] > self.horizon:
            raise ConfigError("x.shape", a.shape, f"the stream is longer than horizon={self.horizon}")
        tree = TreeNoise(self.horizon, self.shape, noise=self._noise.noise, node_scale=self.node_scale,
                         symmetric=self._noise.symmetric)
        out = np.empty_like(a)
        total = np.zeros(self.shape)
        for t in range(a.shape[0]):
            noise = tree.step(rng)
            total += a[t]
            out[t] = total + noise
        return out

    def output_domain(self, shape, data_bound=None, **schedule) -> Domain:
        """Contract of one release (shape: the element's): a sum of at most `horizon` elements within +-data_bound
        entry-wise (required) plus the noise of at most `depth` nodes: Gaussian, std <= sqrt(depth) node_scale per
        entry (tail z over a node's coordinates); Laplace, depth times the tail of one node's draws."""
        data_bound = require_bound(data_bound, self.guarantee.mechanism)
        return _tree_domain(tuple(shape), self.horizon * np.asarray(data_bound, dtype=np.float64),
                            self._noise.noise, self.node_scale, self.depth, self._noise.coordinates(),
                            self._noise.symmetric, f"{self.guarantee.mechanism} node scale {self.node_scale:.6g}",
                            schedule)

    def dp_event(self) -> dict:
        """The node noise, in the `depth` nodes one element lands in."""
        kind = self.guarantee.mechanism.removeprefix("tree-")
        key = "noise_std" if kind == "gaussian" else "noise_scale"
        return {"noise": kind, key: float(self.node_scale), "nodes": int(self.depth)}

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


def _tree_domain(shape, data_bound, noise, node_scale, depth, coords, symmetric, source, schedule) -> Domain:
    """Domain of a release that is data within +-data_bound plus at most `depth` tree nodes of scale node_scale."""
    if noise == "gaussian":
        z = gaussian_tail_z(coords)
        widen = ("gaussian", math.sqrt(depth) * node_scale, z)
    else:
        widen = ("laplace", depth * laplace_tail(node_scale, coords * depth))
    return Domain(shape, low=-data_bound, high=data_bound, noise=widen, symmetric=symmetric,
                  source=f"{source}: |data| <= bound, at most {depth} nodes", **schedule)


class DynamicTreeMechanism:
    """The binary mechanism's noise on values a server releases along a stream, each node's scale set when it
    closes: the node closing at step t gets unit_scale * sensitivity_t (LinUCB-DGS: the dynamic global sensitivity
    Delta_e after e users). Release t is x_t + the sum of the nodes covering t (TreeNoise, popcount(t) <= depth
    nodes).

    The guarantee is the caller's: it rests on sensitivity bounds this class cannot check (for LinUCB-DGS, an
    assumption on the contexts that holds with probability 1 - delta/2). So dp_event() is {}: the claim is composed
    as it stands, dp-accounting has no model of a mechanism whose sensitivity holds only on an event.
    `noise_stream()` is the TreeNoise a running server draws from, step by step, with node_scale(sensitivity_t).
    """

    def __init__(self, horizon, shape, *, noise="gaussian", unit_scale, max_sensitivity, guarantee: Guarantee):
        self.horizon, self.shape, self.noise = _stream(horizon, shape, noise)
        self.unit_scale = V.positive("unit_scale", unit_scale)
        self.max_sensitivity = V.positive("max_sensitivity", max_sensitivity)
        self.depth = tree_depth(self.horizon)
        self.guarantee = guarantee

    def node_scale(self, sensitivity: float) -> float:
        """The scale of a node closing when the released values' sensitivity is `sensitivity`."""
        return self.unit_scale * sensitivity

    def noise_stream(self) -> TreeNoise:
        return TreeNoise(self.horizon, self.shape, noise=self.noise, node_scale=self.unit_scale)

    def privatize(self, x, rng: np.random.Generator, sensitivities=None) -> np.ndarray:
        """The releases of the values x (n, *shape), n <= horizon, by a fresh noise stream: out[t] = x_t + the noise
        of prefix t, the node closing at t scaled by node_scale(sensitivities[t]) (default: max_sensitivity)."""
        a = V.finite_array("x", x)
        if a.shape[1:] != self.shape or a.ndim != len(self.shape) + 1:
            raise ConfigError("x.shape", a.shape, f"must be (n, *{self.shape}): a stream of released values")
        if a.shape[0] > self.horizon:
            raise ConfigError("x.shape", a.shape, f"the stream is longer than horizon={self.horizon}")
        sens = np.full(a.shape[0], self.max_sensitivity) if sensitivities is None else np.asarray(sensitivities)
        tree = self.noise_stream()
        out = np.empty_like(a)
        for t in range(a.shape[0]):
            out[t] = a[t] + tree.step(rng, node_scale=self.node_scale(float(sens[t])))
        return out

    def output_domain(self, shape, data_bound=None, **schedule) -> Domain:
        """Contract of one release: the value within +-data_bound entry-wise (required) plus at most `depth` nodes
        of scale at most node_scale(max_sensitivity)."""
        data_bound = require_bound(data_bound, f"tree-{self.noise}")
        return _tree_domain(tuple(shape), np.asarray(data_bound, dtype=np.float64), self.noise,
                            self.node_scale(self.max_sensitivity), self.depth,
                            int(np.prod(self.shape, dtype=np.int64)), False,
                            f"tree-{self.noise}, node scale <= {self.node_scale(self.max_sensitivity):.6g}", schedule)

    def dp_event(self) -> dict:
        """{}: the claim holds on the caller's event (see the class doc), composed as it stands."""
        return {}

    def __repr__(self):
        return (f"DynamicTreeMechanism(tree-{self.noise}, horizon={self.horizon}, shape={self.shape}, "
                f"unit_scale={self.unit_scale:.6g}, eps={self.guarantee.eps}, delta={self.guarantee.delta})")
