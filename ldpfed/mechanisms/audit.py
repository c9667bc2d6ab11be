"""Statistical privacy audits: empirical LOWER bounds on eps from samples of a mechanism's outputs.

Two neighbouring inputs a, b are run n times each through the mechanism, and an event E of the output
(fixed before sampling, e.g. "projection on the difference direction > tau") is counted. (eps, delta)-DP
implies P_b(E) <= e^eps P_a(E) + delta, so

    eps >= ln( (P_b(E) - delta) / P_a(E) ),

and replacing P_b(E) by its one-sided Clopper-Pearson lower bound and P_a(E) by its upper bound (each at
level alpha/2, so the pair holds jointly with probability >= 1 - alpha) gives a lower bound that holds with
probability >= 1 - alpha for ANY mechanism satisfying the claim. An audit PASSES when that lower bound is
<= the claimed eps, and FLAGS the mechanism when it exceeds it.

For Gaussian noise a sharper estimate uses the hypothesis-testing view (Gaussian DP, Dong, Roth & Su 2019):
a threshold test with false-positive rate alpha_fp and false-negative rate beta has, for a mu-GDP mechanism,
mu >= Phi^-1(1 - alpha_fp) - Phi^-1(beta); with upper CP bounds on both rates this is a lower confidence bound
on mu, converted to eps at the claimed delta through the exact mu-GDP privacy profile. That conversion assumes
the mechanism's trade-off curve is Gaussian (true for additive Gaussian noise), so it is a model-based bound;
the event bound above is model-free.

`plan_event_audit` derives the sample size from the statistics: the smallest n at which the bound, computed at
counts z standard deviations on the unfavourable side of their means, still exceeds the claimed eps for a
(weakened) mechanism whose event probabilities are known.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, special

from .gaussian import analytic_delta


def cp_lower(k, n, alpha):
    """One-sided (1 - alpha) Clopper-Pearson lower bound on a binomial proportion."""
    k = np.asarray(k, dtype=float)
    return np.where(k <= 0, 0.0, special.betaincinv(np.maximum(k, 1e-300), n - k + 1, alpha))


def cp_upper(k, n, alpha):
    """One-sided (1 - alpha) Clopper-Pearson upper bound on a binomial proportion."""
    k = np.asarray(k, dtype=float)
    return np.where(k >= n, 1.0, special.betaincinv(k + 1, np.maximum(n - k, 1e-300), 1.0 - alpha))


def eps_lower_bound(k_b, n_b, k_a, n_a, delta=0.0, alpha=0.05) -> float:
    """Lower bound (confidence 1 - alpha) on eps from E counted k_b/n_b times under input b and k_a/n_a times
    under input a: ln((CP_lo(P_b) - delta) / CP_hi(P_a)); 0.0 if the data show nothing."""
    lo_b = float(cp_lower(k_b, n_b, alpha / 2))
    hi_a = float(cp_upper(k_a, n_a, alpha / 2))
    if lo_b - delta <= 0.0 or hi_a <= 0.0:
        return 0.0
    return max(0.0, math.log((lo_b - delta) / hi_a))


def gdp_mu_lower_bound(k_fp, n_a, k_fn, n_b, alpha=0.05) -> float:
    """Lower confidence bound on mu (Gaussian DP) from a test that rejects 'input a' on event E:
    false positives k_fp/n_a (E under a), false negatives k_fn/n_b (not E under b)."""
    a_hi = float(cp_upper(k_fp, n_a, alpha / 2))
    b_hi = float(cp_upper(k_fn, n_b, alpha / 2))
    return max(0.0, float(-special.ndtri(a_hi) - special.ndtri(b_hi)))


def gdp_eps(mu: float, delta: float) -> float:
    """Smallest eps with mu-GDP => (eps, delta)-DP: solves delta = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)."""
    if mu <= 0.0:
        return 0.0
    s = 1.0 / mu
    if analytic_delta(0.0, s) <= delta:
        return 0.0
    hi = 1.0
    while analytic_delta(hi, s) > delta:
        hi *= 2.0
    return float(optimize.brentq(lambda e: analytic_delta(e, s) - delta, 0.0, hi, xtol=1e-12))


def gdp_mu(eps: float, delta: float) -> float:
    """The largest mu whose mu-GDP implies (eps, delta)-DP (= Delta / analytic sigma)."""
    from .gaussian import gaussian_sigma

    return 1.0 / gaussian_sigma(1.0, eps, delta, "analytic")


@dataclass(frozen=True)
class AuditResult:
    eps_claimed: float
    delta: float
    eps_lower: float  # model-free event bound, or GDP-based when method == "gdp"
    method: str  # "event" or "gdp"
    n: int
    counts: tuple  # (k_b, k_a) for "event", (k_fp, k_fn) for "gdp"
    mu_lower: float | None = None

    @property
    def flagged(self) -> bool:
        return self.eps_lower > self.eps_claimed

    def __str__(self):
        extra = "" if self.mu_lower is None else f", mu_lb={self.mu_lower:.4f}"
        return (f"{self.method}: eps_lb={self.eps_lower:.4f} vs claimed {self.eps_claimed} (delta={self.delta}, "
                f"n={self.n}{extra}) -> {'FLAGGED' if self.flagged else 'pass'}")


def event_audit(event_b: np.ndarray, event_a: np.ndarray, eps_claimed, delta=0.0, alpha=0.05) -> AuditResult:
    """event_b / event_a: boolean outcomes of E for the runs on inputs b / a."""
    k_b, n_b = int(np.count_nonzero(event_b)), int(event_b.size)
    k_a, n_a = int(np.count_nonzero(event_a)), int(event_a.size)
    lb = eps_lower_bound(k_b, n_b, k_a, n_a, delta, alpha)
    return AuditResult(float(eps_claimed), float(delta), lb, "event", min(n_a, n_b), (k_b, k_a))


def gdp_audit(stat_a: np.ndarray, stat_b: np.ndarray, tau: float, eps_claimed, delta, alpha=0.05) -> AuditResult:
    """Threshold test 'stat > tau => b' on a scalar statistic (e.g. projection on the difference direction)."""
    k_fp = int(np.count_nonzero(stat_a > tau))
    k_fn = int(np.count_nonzero(stat_b <= tau))
    mu_lb = gdp_mu_lower_bound(k_fp, stat_a.size, k_fn, stat_b.size, alpha)
    return AuditResult(float(eps_claimed), float(delta), gdp_eps(mu_lb, delta), "gdp",
                       int(min(stat_a.size, stat_b.size)), (k_fp, k_fn), mu_lb)


def pessimistic_bound(p_b: float, p_a: float, n: int, delta=0.0, alpha=0.05, z=3.0) -> float:
    """The event bound at counts z binomial standard deviations on the unfavourable side of n p_b and n p_a."""
    k_b = max(0.0, n * p_b - z * math.sqrt(n * p_b * (1 - p_b)))
    k_a = min(float(n), n * p_a + z * math.sqrt(n * p_a * (1 - p_a)))
    return eps_lower_bound(math.floor(k_b), n, math.ceil(k_a), n, delta, alpha)


def required_n(p_b: float, p_a: float, eps_claimed: float, delta=0.0, alpha=0.05, z=3.0,
               n_max=10**8) -> int | None:
    """Smallest n (to ~2%) with pessimistic_bound(...) > eps_claimed, or None if even n_max does not suffice."""
    if pessimistic_bound(p_b, p_a, n_max, delta, alpha, z) <= eps_claimed:
        return None
    lo, hi = 10, n_max
    while hi - lo > 1 and hi > lo * 1.02:
        mid = min(hi - 1, max(lo + 1, int(math.sqrt(lo * hi))))
        if pessimistic_bound(p_b, p_a, mid, delta, alpha, z) > eps_claimed:
            hi = mid
        else:
            lo = mid
    return int(hi)


def plan_event_audit(candidates, eps_claimed, delta=0.0, alpha=0.05, z=3.0, n_max=10**8):
    """candidates: iterable of (param, p_b, p_a) with the event probabilities of the WEAKENED mechanism.
    Returns (param, n) minimising the sample size needed to flag it, or raises if none can."""
    best = None
    for param, p_b, p_a in candidates:
        n = required_n(p_b, p_a, eps_claimed, delta, alpha, z, n_max)
        if n is not None and (best is None or n < best[1]):
            best = (param, n)
    if best is None:
        raise ValueError("no candidate event can flag the weakened mechanism within n_max samples")
    return best


def required_n_gdp(mu_true: float, mu_target: float, alpha=0.05, z=3.0, n_max=10**8) -> int | None:
    """Smallest n (to ~2%) at which the midpoint-threshold GDP bound of a mechanism with true mu = mu_true,
    computed at error counts z standard deviations above their means, exceeds mu_target."""
    p = float(special.ndtr(-mu_true / 2.0))  # both error rates of the midpoint test

    def ok(n):
        k = min(float(n), n * p + z * math.sqrt(n * p * (1 - p)))
        return gdp_mu_lower_bound(math.ceil(k), n, math.ceil(k), n, alpha) > mu_target

    if not ok(n_max):
        return None
    lo, hi = 10, n_max
    while hi - lo > 1 and hi > lo * 1.02:
        mid = min(hi - 1, max(lo + 1, int(math.sqrt(lo * hi))))
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return int(hi)
