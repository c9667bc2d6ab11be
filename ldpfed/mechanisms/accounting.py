"""The privacy accountant: what one user's data costs over a whole run, composed from the mechanisms that ran.

A run's ledger has one row per mechanism (a message field, or a server release). Each row states the
mechanism's own (eps, delta) claim and, set by the algorithm that knows its protocol:

* `per_user`: how many outputs of that mechanism one user's data can change (default 1). Basic composition
  multiplies the row's (eps, delta) by it.
* `composition`: why that number is right (one message per arrival; a tree release that is one mechanism on the
  node sums; k of K slots by parallel composition; an episode count ...).

**Every claim is checked against its own noise, fail closed** (`check_claim`, run by `compose` on every row, so
built-ins, plugin algorithms and plugin trust models alike): a row whose noise the accountant models states its
noise and sensitivity, and its claimed (eps, delta) must be at least what that noise gives one output at the claimed
delta (`noise_epsilon`: the Gaussian's exact curve of Balle and Wang 2018, the Laplace's pure eps or, at delta > 0,
its PLD, the Skellam RDP bound of Agarwal, Kairouz and Liu 2021 through dp-accounting's RDP conversion; a row's
`nodes` draws composed). A claim below it is refused with a ConfigError naming `ledger[<row>].eps` and both
numbers; a modelled row missing a number it needs (its sensitivity, its scale) is refused naming that field.
Randomized response's event carries no scale (its eps is its keep probability): nothing to contradict.

`compose(rows, delta)` adds the rows up by basic composition (sum of eps, sum of delta: always valid) -- that is
the guarantee the run claims and what `check_budget` holds against the configured (eps, delta) -- and also asks
Google's dp-accounting (privacy loss distributions, PLD) for the eps of the same composition at the configured
delta. The PLD total is tighter for Gaussian mechanisms (their privacy loss is known exactly, so composing them is
far cheaper than adding their eps); it is reported next to the basic total, not used to admit a run.

PLD per row, from the noise the mechanism actually draws (its `dp_event()`, see ldpfed/mechanisms/protocol.py;
`noise_fields` checks it and gives it to the ledger row):
* Gaussian (incl. symmetric matrix noise and the Gaussian tree's nodes): N(0, s^2) at L2 distance `sensitivity`;
  a tree row composes its `nodes` nodes (each element lands in at most `nodes` of them).
* Laplace (and the Laplace tree): Lap(b) at L1 distance `sensitivity` (the 1-D pair dominates, as in
  dp-accounting's LaplaceDpEvent).
* randomized response: binary RR with keep probability expit(eps), i.e. dp-accounting's noise parameter
  p = 2 / (1 + e^eps).
* Skellam (secure aggregation's discrete noise, `noise_variance` per entry, L2 `sensitivity` and
  `l1_sensitivity` in quantized units): its RDP bound converted to (eps, delta), composed as its claim.
* an empty event (l2-ball, Wishart and its tree, sparse vector, LinUCB-DGS's dynamic tree): the generic
  (eps, delta) PLD of the row's claim.
Our sensitivities are the largest change between two users' inputs (replace-one neighbours); dp-accounting's
Gaussian and Laplace PLDs take exactly that distance between the two noise laws.

A ledger whose rows carry `claim_void` (the authors-code profile reproducing code whose noise does not cover its
inputs) has no guarantee to compose or enforce: the summary then says `privacy_claim_void` and has no numbers.

This module sits at the mechanisms layer: it knows mechanisms, never algorithms or engines.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from ldpfed.util.errors import ConfigError

from .gaussian import analytic_delta
from .protocol import check_dp_event

# Relative slack when comparing a composed total with the configured budget: eps/2 + eps/2 in floating point may
# exceed eps by an ulp; a real overspend is far larger than this.
BUDGET_RTOL = 1e-9
# PLD discretization of the privacy loss; pessimistic rounding, so the PLD eps is an upper bound on the true eps of
# the composition, loose by at most this much per composed mechanism. (dp-accounting's default 1e-4 costs ~10x
# the time for a figure that is reported, not enforced.)
PLD_INTERVAL = 1e-3
# Above this per-mechanism eps the PLD is not computed (its support grows like eps^2 / PLD_INTERVAL and e^eps
# overflows in dp-accounting near 700): the summary then has the basic total only.
PLD_MAX_EPS = 20.0


def noise_fields(mech) -> dict:
    """The noise a mechanism draws, for the ledger: its own `dp_event()` ({"noise": kind, "noise_std"/
    "noise_scale": ..., "nodes": ...}, or {} for mechanisms whose privacy loss dp-accounting does not model: their
    claim is composed as is), checked (ConfigError naming the bad field)."""
    return check_dp_event(mech.dp_event())


@dataclass(frozen=True)
class Composition:
    """One user's composed guarantee over a run."""

    eps: float                    # basic composition: sum over rows of per_user * eps
    delta: float                  # basic composition: sum over rows of per_user * delta
    delta_target: float           # the delta at which the PLD eps is computed (the run's configured delta)
    eps_pld: float | None         # dp-accounting's eps of the same composition at delta_target (None: beyond
                                  # PLD_MAX_EPS)
    reasons: tuple = ()           # each row's composition reason
    void: str | None = None       # why the rows' claims do not hold (a profile reproducing unprivate code)

    def summary(self) -> dict:
        """Entries for a run's summary (numbers go to MLflow as metrics; a void claim has no numbers)."""
        if self.void:
            return {"privacy_eps_composed": math.inf, "privacy_delta_composed": math.inf,
                    "privacy_eps_dp_accounting": None, "privacy_claim_void": self.void}
        return {"privacy_eps_composed": self.eps, "privacy_delta_composed": self.delta,
                "privacy_eps_dp_accounting": self.eps_pld}


def _per_user(row) -> int:
    value = row.get("per_user", 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"ledger[{row.get('message')}].per_user", value, "must be an integer >= 1")
    return value


def compose(rows, delta_target: float, pld: bool = True) -> Composition | None:
    """Basic composition of the ledger rows and dp-accounting's PLD eps at delta_target; None for an empty
    ledger (a run without privacy). pld=False: the basic composition only (eps_pld None), with every row still
    read as the PLD would read it -- for checking that a ledger composes without importing dp-accounting and
    computing its PLD (the run's summary does that once, in the driver)."""
    rows = list(rows or [])
    if not rows:
        return None
    reasons = tuple(f"{row.get('message')}: {row.get('composition', 'one output per user')}" for row in rows)
    void = "; ".join(sorted({str(row["claim_void"]) for row in rows if row.get("claim_void")})) or None
    if void:     # the rows' eps are not a guarantee: nothing to compose
        return Composition(math.inf, math.inf, float(delta_target), None, reasons, void)
    for row in rows:          # a claim its own noise contradicts is refused, whoever wrote the row
        check_claim(row)
    eps = sum(_per_user(row) * float(row["eps"]) for row in rows)
    delta = sum(_per_user(row) * float(row["delta"]) for row in rows)
    key = tuple(_pld_key(row) for row in rows)
    beyond = max(float(row["eps"]) for row in rows) > PLD_MAX_EPS
    tight = None if beyond or not pld else _pld_eps(key, float(delta_target))
    return Composition(eps, delta, float(delta_target), tight, reasons)


# ---------------------------------------------------------------- claims against their noise
# Relative slack of the comparison: floating point only (an analytic calibration meets its claim with equality).
CLAIM_RTOL = 1e-6
# The PLD's discretization where a row is checked through it (Laplace at delta > 0): its eps is pessimistic by at
# most this much, which the check forgives.
CLAIM_PLD_INTERVAL = 1e-4


def _needs(row, key: str) -> float:
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise ConfigError(f"ledger[{row.get('message')}].{key}", value,
                          f"a {row.get('noise')} row is checked against its noise: it needs a finite {key} > 0")
    return float(value)


@lru_cache(maxsize=1024)
def gaussian_epsilon(unit_sigma: float, delta: float) -> float:
    """The eps at `delta` of the Gaussian mechanism with sigma / sensitivity = unit_sigma: where its exact curve
    (gaussian.analytic_delta, decreasing in eps) meets delta; inf when no eps up to 1e4 does (delta 0)."""
    low, high = 0.0, 1.0
    while analytic_delta(high, unit_sigma) > delta:
        low, high = high, 2.0 * high
        if high > 1e4:
            return math.inf
    for _ in range(100):
        mid = (low + high) / 2.0
        low, high = (mid, high) if analytic_delta(mid, unit_sigma) > delta else (low, mid)
    return high


def noise_epsilon(row) -> float | None:
    """The eps that a ledger row's own noise gives one output of its mechanism at the row's claimed delta (its
    `nodes` draws composed), or None when the noise is not one the accountant models (an empty event; randomized
    response, whose event's eps is its keep probability: nothing to contradict). ConfigError naming the field when
    a modelled noise misses a number it needs (a check with missing input rejects)."""
    noise = row.get("noise")
    if noise not in ("gaussian", "laplace", "skellam"):
        return None
    count = int(row.get("nodes", 1))
    delta = float(row["delta"])
    sensitivity = _needs(row, "sensitivity")
    if noise == "gaussian":       # k equal Gaussians: one with sigma / sqrt(k)
        return gaussian_epsilon(_needs(row, "noise_std") / math.sqrt(count) / sensitivity, delta)
    if noise == "laplace":
        scale = _needs(row, "noise_scale")
        if delta == 0.0:
            return count * sensitivity / scale
        from dp_accounting.pld import privacy_loss_distribution as pld

        one = pld.from_laplace_mechanism(scale, sensitivity=sensitivity,
                                         value_discretization_interval=CLAIM_PLD_INTERVAL)
        return float((one if count == 1 else one.self_compose(count)).get_epsilon_for_delta(delta)) - \
            count * CLAIM_PLD_INTERVAL
    return skellam_epsilon(_needs(row, "noise_variance"), sensitivity, _needs(row, "l1_sensitivity"), delta, count)


def check_claim(row) -> None:
    """ConfigError naming the row's eps when its claimed (eps, delta) is below what its own noise gives."""
    if row.get("claim_void"):
        return
    got = noise_epsilon(row)
    if got is None:
        return
    claimed = float(row["eps"])
    if claimed < got * (1.0 - CLAIM_RTOL):
        scale = {key: row[key] for key in ("noise_std", "noise_scale", "noise_variance") if key in row}
        raise ConfigError(f"ledger[{row.get('message')}].eps", claimed,
                          f"the row's own {row['noise']} noise ({', '.join(f'{k} {v:.6g}' for k, v in scale.items())}"
                          f", sensitivity {float(row['sensitivity']):.6g}, {int(row.get('nodes', 1))} draw(s)) gives "
                          f"eps = {got:.6g} at delta = {float(row['delta']):.3g}: the claim is below what its noise "
                          f"gives (a miscalibrated mechanism)")


def check_budget(composition: Composition | None, eps: float, delta: float, algorithm: str = "") -> None:
    """ConfigError naming `eps` or `delta` when the composed (basic) guarantee exceeds the configured budget."""
    if composition is None or composition.void:   # no claim to hold (the summary says privacy_claim_void)
        return
    why = "; ".join(composition.reasons)
    if composition.eps > eps * (1.0 + BUDGET_RTOL):
        raise ConfigError("eps", eps, f"{algorithm} spends eps = {composition.eps:.6g} per user over the run "
                                      f"(basic composition: {why}), more than the configured eps")
    if composition.delta > delta * (1.0 + BUDGET_RTOL):
        raise ConfigError("delta", delta, f"{algorithm} spends delta = {composition.delta:.6g} per user over the "
                                          f"run (basic composition: {why}), more than the configured delta")


# ---------------------------------------------------------------- Skellam (secure aggregation's discrete noise)
# RDP orders at which the Skellam bound is evaluated before dp-accounting converts it to (eps, delta).
RDP_ORDERS = tuple([1.0 + x / 10.0 for x in range(1, 100)] + list(range(11, 64)) + [80, 96, 128, 192, 256, 512, 1024])


def skellam_rdp(alpha: float, variance: float, l2: float, l1: float) -> float:
    """The Renyi DP of order alpha of adding Skellam noise Sk(mu, mu) (variance 2 mu) to every entry of an integer
    vector whose L2 and L1 sensitivities are l2 and l1 (Agarwal, Kairouz and Liu, "The Skellam Mechanism for
    Differentially Private Federated Learning", NeurIPS 2021, Theorem 3.5):
        alpha l2^2 / (4 mu) + min(((2 alpha - 1) l2^2 + 6 l1) / (16 mu^2), 3 l1 / (4 mu)).
    The first term is the Gaussian's of the same variance (alpha l2^2 / (2 sigma^2)); the second vanishes as the
    variance grows."""
    mu = variance / 2.0
    return alpha * l2 ** 2 / (4.0 * mu) + min(((2.0 * alpha - 1.0) * l2 ** 2 + 6.0 * l1) / (16.0 * mu ** 2),
                                              3.0 * l1 / (4.0 * mu))


@lru_cache(maxsize=1024)
def skellam_epsilon(variance: float, l2: float, l1: float, delta: float, count: int = 1) -> float:
    """The eps at `delta` of `count` releases of the Skellam mechanism (skellam_rdp, composed by adding the RDP),
    converted by dp-accounting's RDP conversion (the tighter of its bounds over RDP_ORDERS)."""
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    if not (variance > 0 and delta > 0):
        return math.inf
    rdp = [count * skellam_rdp(a, float(variance), float(l2), float(l1)) for a in RDP_ORDERS]
    return float(compute_epsilon(RDP_ORDERS, rdp, float(delta))[0])


def skellam_variance_for(eps: float, delta: float, l2: float, l1: float, count: int = 1) -> float:
    """The smallest Skellam variance (bisection, relative 1e-6, rounded up) whose skellam_epsilon is <= eps."""
    if not (eps > 0 and 0 < delta < 1):
        raise ConfigError("eps", eps, "Skellam noise needs eps > 0 and delta in (0, 1)")
    low, high = 1e-12, max(1.0, l2 ** 2)
    while skellam_epsilon(high, l2, l1, delta, count) > eps:
        low, high = high, high * 4.0
    while high - low > 1e-6 * high:
        mid = (low + high) / 2.0
        low, high = (low, mid) if skellam_epsilon(mid, l2, l1, delta, count) <= eps else (mid, high)
    return high


# ---------------------------------------------------------------- dp-accounting
def _pld_key(row) -> tuple:
    """What the PLD of a row depends on (hashable, for the cache)."""
    noise = row.get("noise")
    count = _per_user(row) * int(row.get("nodes", 1))
    if noise == "gaussian":
        return ("gaussian", float(row["noise_std"]), float(row["sensitivity"]), count)
    if noise == "laplace":
        return ("laplace", float(row["noise_scale"]), float(row["sensitivity"]), count)
    if noise == "randomized-response":
        return ("randomized-response", float(row["eps"]), count)
    return ("claim", float(row["eps"]), float(row["delta"]), _per_user(row))


def pld_of(key: tuple):
    """dp-accounting's PLD of one ledger row (see _pld_key)."""
    from dp_accounting.pld import common, privacy_loss_distribution as pld

    kind = key[0]
    if kind == "gaussian":
        _, std, sens, count = key
        one = pld.from_gaussian_mechanism(std, sensitivity=sens, value_discretization_interval=PLD_INTERVAL)
    elif kind == "laplace":
        _, scale, sens, count = key
        one = pld.from_laplace_mechanism(scale, sensitivity=sens, value_discretization_interval=PLD_INTERVAL)
    elif kind == "randomized-response":
        _, e, count = key
        one = pld.from_randomized_response(2.0 / (1.0 + math.exp(e)), 2, value_discretization_interval=PLD_INTERVAL)
    else:
        _, e, d, count = key
        one = pld.from_privacy_parameters(common.DifferentialPrivacyParameters(e, d),
                                          value_discretization_interval=PLD_INTERVAL)
    return one if count == 1 else one.self_compose(count)


@lru_cache(maxsize=256)
def _pld_eps(key: tuple, delta_target: float) -> float:
    total = None
    for row_key in key:
        one = pld_of(row_key)
        total = one if total is None else total.compose(one)
    return float(total.get_epsilon_for_delta(delta_target))
