"""The mechanism protocol: what every privacy mechanism offers, ldpfed's own and a plugin's alike.

A mechanism is any object with

* `guarantee`: its Guarantee (ldpfed.mechanisms.guarantee): model, (eps, delta), sensitivity, norm;
* `privatize(x, rng) -> np.ndarray`: its output for the input x, drawing every random number from `rng` (a
  numpy Generator); always an array (a mechanism that also reports something else, e.g. the l2-ball mechanism's
  count of clipped rows, offers it through another method);
* `output_domain(shape, data_bound=None, **schedule) -> Domain`: the values an honest output of per-user shape
  `shape` can take (what the server shards check every client's message against). `data_bound` is the public
  bound of what the caller privatizes (|x| <= data_bound entry-wise), needed by the mechanisms whose output is
  the input plus unbounded noise (Gaussian, Laplace, ...): they raise DataBoundRequired without it; the
  mechanisms whose output does not depend on the input's size (l2-ball, randomized response) ignore it.
  `schedule` is passed on to the Domain (e.g. slots=, at_most_one=);
* `dp_event() -> dict`: the noise it draws, for the privacy accountant (ldpfed.mechanisms.accounting), as ledger
  fields: {"noise": "gaussian", "noise_std": s, "nodes": n}, {"noise": "laplace", "noise_scale": b, "nodes": n}
  or {"noise": "randomized-response", "nodes": n} (n: how many draws of that noise one input lands in, e.g. a
  tree's depth), or {} when dp-accounting does not model its privacy loss: its (eps, delta) claim is then
  composed as it stands. `check_dp_event` says what is valid.

`Mechanism` is runtime-checkable: isinstance(obj, Mechanism) tells whether obj has these members (not whether it
keeps the contract; tests/test_mechanism_protocol.py checks that of every mechanism class of ldpfed).
"""
from __future__ import annotations

import math
import numbers
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np

from ldpfed.util.errors import ConfigError

from .domains import Domain
from .guarantee import Guarantee

# The noises the accountant models, and the ledger field of each one's scale (None: no scale; randomized response's
# is its eps).
DP_EVENT_NOISES = {"gaussian": "noise_std", "laplace": "noise_scale", "randomized-response": None,
                   "skellam": "noise_variance"}
# Fields an event of a kind must carry besides its scale (Skellam: the L1 sensitivity, the L2 one being the
# guarantee's `sensitivity`).
DP_EVENT_EXTRA = {"skellam": ("l1_sensitivity",)}


@runtime_checkable
class Mechanism(Protocol):
    """A privacy mechanism (see the module doc)."""

    guarantee: Guarantee

    def privatize(self, x, rng: np.random.Generator) -> np.ndarray:
        ...

    def output_domain(self, shape, data_bound=None, **schedule) -> Domain:
        ...

    def dp_event(self) -> dict:
        ...


# What a mechanism can do to one user's field in a compiled algorithm's row (ldpfed.mechanisms.rows): a mechanism
# that offers `row_kernel(shape) -> RowKernel` and `draw_rows(rng, n, shape) -> (n, draws)` can make a field of a
# compiled algorithm (ldpfed.algorithms.compiled).
PASS, GAUSSIAN, SYMMETRIC_GAUSSIAN, L2_BALL, RANDOMIZED_RESPONSE, LAPLACE = range(6)
KIND_NAMES = ("pass", "gaussian", "symmetric-gaussian", "l2-ball", "randomized-response", "laplace")


class RowKernel(NamedTuple):
    kind: int               # one of the kinds above
    params: tuple = ()      # floats, read by the kind's branch of rows.privatize_field
    draws: int = 0          # random numbers per user for one field


PASS_KERNEL = RowKernel(PASS)


class DataBoundRequired(ConfigError):
    """output_domain of a mechanism whose outputs are bounded only through a public bound of its inputs, called
    without that bound (data_bound=None)."""

    def __init__(self, mechanism: str):
        super().__init__("data_bound", None, f"the {mechanism} mechanism's outputs are the input plus noise: their "
                                             f"domain needs the public bound of what is privatized")


def require_bound(data_bound, mechanism: str):
    """data_bound, or DataBoundRequired when it is None."""
    if data_bound is None:
        raise DataBoundRequired(mechanism)
    return data_bound


def check_dp_event(event) -> dict:
    """event as a dict of ledger fields, or ConfigError naming the bad key (see the module doc)."""
    if not isinstance(event, dict):
        raise ConfigError("dp_event", event, "must be a dict (empty: a claim dp-accounting does not model)")
    if not event:
        return {}
    noise = event.get("noise")
    if noise not in DP_EVENT_NOISES:
        raise ConfigError("dp_event.noise", noise, f"must be one of {list(DP_EVENT_NOISES)} (or an empty event)")
    scale_key = DP_EVENT_NOISES[noise]
    allowed = {"noise", "nodes"} | ({scale_key} if scale_key else set()) | set(DP_EVENT_EXTRA.get(noise, ()))
    unknown = set(event) - allowed
    if unknown:
        raise ConfigError(f"dp_event.{sorted(unknown)[0]}", event[sorted(unknown)[0]],
                          f"not a field of a {noise} event (fields: {sorted(allowed)})")
    nodes = event.get("nodes")
    if isinstance(nodes, (bool, np.bool_)) or not isinstance(nodes, numbers.Integral) or nodes < 1:
        raise ConfigError("dp_event.nodes", nodes, "must be an integer >= 1 (draws of the noise one input is in)")
    for extra in DP_EVENT_EXTRA.get(noise, ()):
        value = event.get(extra)
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not (
                math.isfinite(value) and value > 0):
            raise ConfigError(f"dp_event.{extra}", value, "must be a finite number > 0")
    if scale_key:
        scale = event.get(scale_key)
        if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, numbers.Real) or not (
                math.isfinite(scale) and scale > 0):
            raise ConfigError(f"dp_event.{scale_key}", scale, "must be a finite number > 0")
    return dict(event)
