"""A local mechanism's central twin: the same privacy per user, with the noise added once by a trusted server.

Under the central trust model (ldpfed.trust.central) a user sends `mean(x)`: what the local mechanism outputs
on average for its (clipped) input x. Every local randomizer of ldpfed is unbiased for an affine function of its
input, so the server's estimator is unchanged in expectation: the Gaussian and Laplace mechanisms' mean is x
itself, the l2-ball's the row clipped to its radius (E[B v] = g, Duchi et al. Lemma 2.2), randomized response's
(1 - p) + (2p - 1) x. The server then adds noise once to a round's aggregate, calibrated to one user's
contribution to it (each user is in one round's aggregate: parallel composition over the rounds), at the local
mechanism's own (eps, delta):

* Gaussian, symmetric Gaussian, Laplace: the same noise (sigma or b) as the local mechanism: it was calibrated to
  the sensitivity of one user's field, which is the sensitivity of a sum to one user.
* l2-ball (pure eps): Laplace on each entry, b = 2 R sqrt(dim) / eps: two rows in the ball of radius R differ by at
  most 2 R in l2, so by 2 R sqrt(dim) in l1 (pure eps, like the local mechanism; a Gaussian twin would need a delta
  the l2-ball's claim does not have).
* randomized response (pure eps): Laplace on each entry, b = (2p - 1) / eps: one user moves one entry's mean by
  2p - 1 = tanh(eps / 2).

A mechanism may offer its own `central_twin()` (a plugin's mechanism, or a better twin); otherwise the twin is read
off its row kernel (ldpfed.mechanisms.protocol.RowKernel: its kind and parameters), so no isinstance chain.
`weight` scales the noise where the aggregate weighs each user's row by a public factor (the largest factor of the
round's users: each user's contribution is then within weight x the field's sensitivity).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ldpfed.util.errors import ConfigError

from .domains import Domain
from .guarantee import Guarantee
from .protocol import GAUSSIAN, KIND_NAMES, L2_BALL, LAPLACE, RANDOMIZED_RESPONSE, SYMMETRIC_GAUSSIAN


@dataclass(frozen=True)
class CentralTwin:
    """The central-model twin of one local mechanism (see the module doc)."""

    local: object               # the local mechanism it stands for
    noise: str                  # "gaussian" or "laplace": what the server adds to each entry of an aggregate
    scale: float                # its std (gaussian) or scale b (laplace), for a user's weight of 1
    guarantee: Guarantee        # per user, model "central", the local mechanism's (eps, delta)
    offset: float = 0.0         # mean(x) = offset + slope * clip(x)
    slope: float = 1.0
    clip_rows: tuple | None = None     # (radius, dim): rows of dim entries clipped to radius before the mean
    symmetric: bool = False     # the noise of a (..., d, d) field is symmetric (one draw per upper-triangle pair)

    def mean(self, x: np.ndarray) -> np.ndarray:
        """What one user sends for its field x, (n, *shape) or one (*shape): the local mechanism's mean."""
        x = np.array(x, dtype=float, copy=True)
        if self.clip_rows is not None:
            radius, dim = self.clip_rows
            rows = x.reshape(-1, dim)
            norms = np.sqrt(np.einsum("ij,ij->i", rows, rows))
            over = norms > radius
            rows[over] *= (radius / norms[over])[:, None]
        return self.offset + self.slope * x

    def output_domain(self, shape, data_bound=None, **schedule) -> Domain:
        """The values an honest user's mean can take (what the server shards check): the local mechanism's data
        bound for the additive noises, the ball for the l2-ball, [0, max(p, 1 - p)] for randomized response."""
        shape = tuple(shape)
        if self.clip_rows is not None:
            radius = self.clip_rows[0]
            return Domain(shape, low=-radius, high=radius, max_radius=radius,
                          source=f"central twin of the l2-ball: rows clipped to R={radius:.6g}", **schedule)
        if self.slope != 1.0 or self.offset != 0.0:     # randomized response's mean of a bit
            top = max(self.offset, self.offset + self.slope)
            schedule = {k: v for k, v in schedule.items() if k != "at_most_one"}   # means are not bits
            return Domain(shape, low=0.0, high=top, source="central twin of randomized response: mean of a bit",
                          **schedule)
        if data_bound is None:
            raise ConfigError("data_bound", None, "the central twin of an additive-noise mechanism needs the public "
                                                  "bound of what is privatized")
        return Domain(shape, low=-np.asarray(data_bound), high=data_bound, symmetric=self.symmetric,
                      source=f"central twin of {self.guarantee.mechanism}: |data| <= bound", **schedule)

    def draw(self, rng: np.random.Generator, shape, weight) -> np.ndarray:
        """The server's noise for an aggregate field of `shape`, each entry's scale times `weight` (a scalar or an
        array of that shape: the largest public weight of a user on that entry)."""
        shape = tuple(int(s) for s in shape)
        if self.noise == "gaussian":
            z = rng.standard_normal(shape)
            if self.symmetric:       # the upper triangle's draws mirrored: the local mechanism's symmetric noise
                z = np.triu(z) + np.swapaxes(np.triu(z, 1), -1, -2)
        else:
            z = rng.laplace(0.0, 1.0, size=shape)
        return self.scale * np.asarray(weight, dtype=float) * z

    def dp_event(self) -> dict:
        key = "noise_std" if self.noise == "gaussian" else "noise_scale"
        return {"noise": self.noise, key: float(self.scale), "nodes": 1}


def central_twin(mechanism, shape) -> CentralTwin:
    """The central twin of `mechanism` for a field of `shape`: its own `central_twin()` when it offers one, else
    read off its row kernel. ConfigError naming the mechanism when it has neither."""
    own = getattr(mechanism, "central_twin", None)
    if callable(own):
        return own()
    kernel_of = getattr(mechanism, "row_kernel", None)
    if not callable(kernel_of):
        raise ConfigError("trust", "central", f"the mechanism {mechanism!r} has no central twin (it offers neither "
                                              f"central_twin() nor a row kernel)")
    kernel = kernel_of(tuple(shape))
    local = mechanism.guarantee
    eps, delta = float(local.eps), float(local.delta)

    def twin(noise, scale, sensitivity, norm, **mean):
        guarantee = Guarantee(local.mechanism, "central", eps, delta, float(sensitivity), norm)
        return CentralTwin(mechanism, noise, float(scale), guarantee, **mean)

    if kernel.kind in (GAUSSIAN, SYMMETRIC_GAUSSIAN):
        return twin("gaussian", kernel.params[0], local.sensitivity, local.norm,
                    symmetric=kernel.kind == SYMMETRIC_GAUSSIAN)
    if kernel.kind == LAPLACE:
        return twin("laplace", kernel.params[0], local.sensitivity, local.norm)
    if kernel.kind == L2_BALL:
        radius, dim = float(kernel.params[0]), int(kernel.params[3])
        l1 = 2.0 * radius * math.sqrt(dim)
        return twin("laplace", l1 / eps, l1, "l1", clip_rows=(radius, dim))
    if kernel.kind == RANDOMIZED_RESPONSE:
        p_keep = float(kernel.params[0])
        gap = 2.0 * p_keep - 1.0
        return twin("laplace", gap / eps, gap, "l1", offset=1.0 - p_keep, slope=gap)
    raise ConfigError("trust", "central", f"no central twin for a {KIND_NAMES[kernel.kind]} row kernel")
