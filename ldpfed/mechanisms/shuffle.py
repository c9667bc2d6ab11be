"""Privacy amplification by shuffling: the accounting of the "shuffle" trust model.

Each user randomizes locally with an eps0-LDP randomizer; a shuffler permutes a batch of n such messages; the
server sees only the shuffled batch, which is then (eps, delta)-DP for each user with eps << eps0 once n is large.
Source: Feldman, McMillan, Talwar, "Hiding Among the Clones: A Simple and Nearly Optimal Analysis of Privacy
Amplification by Shuffling", FOCS 2021, arXiv:2012.12803 (FMT below). Neighbours replace one user's data.

* `closed_form_eps`: FMT Theorem 3.1, valid when eps0 <= log(n / (16 log(2/delta))).
* `numerical_eps`: FMT's numerical method (their Sec. 4 and App. E; the authors' apple/ml-shuffling-amplification
  computes the same quantity). FMT's reduction: for two datasets differing in user 1's data, the shuffled batch
  is one post-processing of P0 = (A + D, C - A + 1 - D) and of P1 = (A + 1 - D, C - A + D), with
  C ~ Bin(n - 1, e^-eps0) (the other users that act as "clones" of user 1), A ~ Bin(C, 1/2), D ~ Bern(e^eps0 /
  (e^eps0 + 1)). So the batch is (eps, delta)-DP for every eps with D_{e^eps}(P0 || P1) <= delta (hockey-stick
  divergence; the reverse direction is equal: mapping the first coordinate a -> C + 1 - a swaps P0 and P1).
  Why the value returned is an upper bound on that eps:
  - The pair reveals C (its coordinates sum to C + 1), so the divergence is E_C[d(C)], d(c) the divergence
    between the two one-dimensional laws given C = c, computed exactly: their ratio is monotone in the first
    coordinate, so the optimal event is a prefix {a <= t}; we take the largest of the prefixes at t-1, t, t+1
    (guarding the rounding of t) -- each a lower bound on d(c) and one of them equal to it.
  - d is non-increasing in c: the pair at c + 1 is the pair at c plus one fresh clone (add 1 to a coordinate
    chosen by a fair coin), the same post-processing of both laws. So grouping the c's into blocks and charging
    each block's mass d(its smallest c) over-counts; the tails of C are two more such blocks (the lower one
    charged d(0)). Nothing is dropped; block masses are binomial cdf differences (scipy.stats.binom, Boost's
    incomplete beta; scipy.special.bdtr is off by 0.02 near the mean at n = 1e8, so it is not used).
  - A binary search keeps an eps whose bound is <= delta; it returns that eps, never more than eps0 (the
    divergence is 0 at eps = eps0: the shuffled batch is a post-processing of the eps0-DP messages).
* `approximate_eps_delta`: (eps0, delta0)-DP randomizers (the Gaussian mechanisms), FMT's extension to approximate
  DP (Sec. 3, Theorem 3.8 in arXiv:2012.12803): the same eps, and delta + (e^eps + 1)(1 + e^-eps0 / 2) n delta0.
  Our reading of the extra term: the price of coupling each (eps0, delta0) randomizer with an eps0-DP one (the
  batch within total variation eta = (1 + e^-eps0 / 2) n delta0 of a batch of pure ones), since a mechanism within
  eta of an (eps, delta)-DP one on both datasets is (eps, delta + (1 + e^eps) eta)-DP. That step holds for any
  valid eps of the pure batch, so the numerical eps may stand in for Theorem 3.1's.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
from scipy.stats import binom

from ldpfed.util.errors import ConfigError

BOUNDS = ("numerical", "closed-form")
EPS0_MAX = 100.0   # beyond this no realistic batch holds a clone (n e^-eps0 ~ 0): nothing to amplify
EPS_RTOL = 1e-5    # binary searches stop when the bracket is this small relative to its upper end
BLOCKS = 2000      # evaluation points of d(c) in the bulk of C; every c when the bulk is no wider
TAIL = 1e-4        # each tail block of C holds about TAIL * delta (then charged in full: see above)
TINY_EPS0 = 1e-6   # the smallest eps0 largest_eps0 tries


# ---------------------------------------------------------------- checks
def _n(value, name: str = "n") -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
            or float(value) != int(value) or int(value) < 1:
        raise ConfigError(name, value, "must be an integer >= 1 (the number of messages shuffled together)")
    return int(value)


def _real(name: str, value, low: float, high: float, low_open: bool, high_open: bool) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ConfigError(name, value, "must be a finite real number")
    v = float(value)
    if v < low or v > high or (low_open and v == low) or (high_open and v == high):
        raise ConfigError(name, value, f"must be in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}")
    return v


def _args(eps0, n, delta) -> tuple[float, int, float]:
    return (_real("eps0", eps0, 0.0, EPS0_MAX, False, False), _n(n),
            _real("delta", delta, 0.0, 1.0, True, True))


# ---------------------------------------------------------------- FMT Theorem 3.1
def closed_form_limit(n, delta) -> float:
    """The largest eps0 FMT Theorem 3.1 covers at batch size n: log(n / (16 log(2/delta))) (<= 0: none)."""
    return math.log(_n(n) / (16.0 * math.log(2.0 / _real("delta", delta, 0.0, 1.0, True, True))))


def closed_form_valid(eps0, n, delta) -> bool:
    """Whether FMT Theorem 3.1 applies: eps0 <= log(n / (16 log(2/delta)))."""
    eps0, n, delta = _args(eps0, n, delta)
    return eps0 <= closed_form_limit(n, delta)


def closed_form_eps(eps0, n, delta) -> float:
    """FMT Theorem 3.1: eps = log(1 + (e^eps0 - 1)/(e^eps0 + 1) (8 sqrt(e^eps0 log(4/delta) / n) + 8 e^eps0 / n)).
    ConfigError naming `n` when no eps0 > 0 is covered at this batch size (n <= 16 log(2/delta)), else `eps0`
    when it exceeds log(n / (16 log(2/delta)))."""
    eps0, n, delta = _args(eps0, n, delta)
    limit = closed_form_limit(n, delta)
    if limit <= 0.0:
        raise ConfigError("n", n, f"FMT Thm 3.1 needs n > 16 e^eps0 log(2/delta) = {16 * math.log(2 / delta):.4g} "
                                  f"e^eps0 at delta = {delta:g}; this batch is too small for any eps0 > 0")
    if eps0 > limit:
        raise ConfigError("eps0", eps0, f"FMT Thm 3.1 needs eps0 <= log(n / (16 log(2/delta))) = {limit:.4g} "
                                        f"at n = {n}, delta = {delta:g}")
    e = math.exp(eps0)
    return math.log1p((e - 1.0) / (e + 1.0) * (8.0 * math.sqrt(e * math.log(4.0 / delta) / n) + 8.0 * e / n))


# ---------------------------------------------------------------- FMT numerical method
def _clone_blocks(eps0: float, n: int, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """Blocks of C ~ Bin(n - 1, e^-eps0) that cover 0..n-1: (smallest c of each block, its mass)."""
    big, p = n - 1, math.exp(-eps0)
    if big + 1 <= BLOCKS:
        c = np.arange(big + 1)
        return c, binom.pmf(c, big, p)
    mean = big * p
    width = math.sqrt(2.0 * math.log(1.0 / (TAIL * delta)) * max(mean, 1.0)) + 3.0   # Chernoff: tails ~TAIL*delta
    lo, hi = max(0, math.floor(mean - width)), min(big, math.ceil(mean + width))
    edges = np.unique(np.round(np.linspace(lo, hi + 1, min(BLOCKS, hi + 1 - lo) + 1)).astype(np.int64))
    edges = np.unique(np.concatenate([[0], edges, [big + 1]]))   # blocks [edges[i], edges[i+1])
    below, above = binom.cdf(edges - 1, big, p), binom.sf(edges - 1, big, p)   # P(C < edge), P(C >= edge)
    upper = edges[:-1] >= mean                                                  # difference the smaller tail
    mass = np.where(upper, above[:-1] - above[1:], below[1:] - below[:-1])
    return edges[:-1], np.maximum(mass, 0.0)


def _clone_delta(eps: float, eps0: float, c: np.ndarray, mass: np.ndarray) -> float:
    """Upper bound on D_{e^eps}(P0 || P1) (module docstring): sum over blocks of mass * d(smallest c)."""
    if eps >= eps0:
        return 0.0
    alpha, e = 1.0 / (1.0 + math.exp(-eps0)), math.exp(eps)
    rho = (math.exp(eps0) - e) / (math.exp(eps + eps0) - 1.0)   # P0(a) >= e^eps P1(a) iff a / (c + 1 - a) <= rho
    t = np.floor(rho / (1.0 + rho) * (c + 1)).astype(np.int64)
    f = [binom.cdf(t + j, c, 0.5) for j in (-2, -1, 0, 1)]   # P(Bin(c, 1/2) <= t + j)
    d = [f[j + 1] * (alpha - e * (1.0 - alpha)) - f[j] * (e * alpha - (1.0 - alpha)) for j in range(3)]
    return float(np.dot(mass, np.maximum(np.maximum(d[0], d[1]), np.maximum(d[2], 0.0))))


def numerical_eps(eps0, n, delta) -> float:
    """FMT's numerical bound: the smallest eps (to relative EPS_RTOL, rounded up) whose clone-pair divergence is
    <= delta; at most eps0. An upper bound on the batch's eps (module docstring)."""
    eps0, n, delta = _args(eps0, n, delta)
    if eps0 == 0.0:
        return 0.0
    c, mass = _clone_blocks(eps0, n, delta)
    if _clone_delta(0.0, eps0, c, mass) <= delta:   # the two batches are within delta in total variation
        return 0.0
    lo, hi = 0.0, eps0
    if closed_form_limit(n, delta) >= eps0:   # Thm 3.1 usually brackets tighter (checked, not assumed)
        guess = closed_form_eps(eps0, n, delta)
        if guess < hi and _clone_delta(guess, eps0, c, mass) <= delta:
            hi = guess
    while hi - lo > EPS_RTOL * hi + 1e-15:   # the floor ends the search when eps is ~0
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if _clone_delta(mid, eps0, c, mass) <= delta else (mid, hi)
    return hi


# ---------------------------------------------------------------- approximate DP, the ledger's view
def approximate_eps_delta(eps0, delta0, n, delta, bound: str = "numerical") -> tuple[float, float]:
    """(eps0, delta0)-DP randomizers (FMT Thm 3.8, arXiv:2012.12803): the pure bound's eps (min eps0) and
    delta + (e^eps + 1)(1 + e^-eps0 / 2) n delta0. `bound` picks the pure bound (module docstring: either holds)."""
    eps0, n, delta = _args(eps0, n, delta)
    delta0 = _real("delta0", delta0, 0.0, 1.0, False, True)
    eps = min(eps0, _pure_eps(eps0, n, delta, bound))
    total = delta + (math.exp(eps) + 1.0) * (1.0 + math.exp(-eps0) / 2.0) * n * delta0
    if total >= 1.0:
        raise ConfigError("delta0", delta0, f"shuffling n = {n} messages at this delta0 gives delta = {total:.4g} "
                                            f">= 1 (FMT Thm 3.8 adds (e^eps + 1)(1 + e^-eps0/2) n delta0)")
    return eps, total


def _pure_eps(eps0: float, n: int, delta: float, bound: str) -> float:
    if bound == "numerical":
        return numerical_eps(eps0, n, delta)
    if bound == "closed-form":
        return closed_form_eps(eps0, n, delta)
    raise ConfigError("bound", bound, f"must be one of {BOUNDS}")


@dataclass(frozen=True)
class Amplified:
    """The guarantee of one shuffled batch, for a privacy ledger row."""

    eps: float
    delta: float
    eps0: float
    delta0: float
    n: int
    bound: str
    reason: str


def amplify(eps0, n, delta, delta0=0.0, bound: str = "numerical") -> Amplified:
    """The (eps, delta) of a shuffled batch of n (eps0, delta0)-LDP messages: min(eps0, FMT's bound)."""
    eps, total = approximate_eps_delta(eps0, delta0, n, delta, bound)
    eps0, n, delta0 = float(eps0), int(n), float(delta0)
    source = {"numerical": "FMT 2021 numerical bound (Sec. 4)", "closed-form": "FMT 2021 Thm 3.1"}[bound]
    what = f"({eps0:g}, {delta0:g})-LDP messages, {source} + Thm 3.8" if delta0 else f"eps0 = {eps0:g}-LDP " \
                                                                                     f"messages, {source}"
    reason = (f"shuffle of a batch of n = {n} {what}; each user sends one message in one batch, so the run's "
              f"guarantee is its batch's")
    return Amplified(eps, total, eps0, delta0, n, bound, reason)


def largest_eps0(target_eps, n, delta, bound: str = "numerical") -> float:
    """The largest eps0 (to relative EPS_RTOL, rounded down) whose amplified eps at batch size n is <= target_eps.
    ConfigError naming `round_size` (the batch size) when the batch is too small for the bound's validity
    condition or even eps0 = TINY_EPS0 misses the target."""
    target = _real("target_eps", target_eps, 0.0, math.inf, True, True)
    n, delta = _n(n, "round_size"), _real("delta", delta, 0.0, 1.0, True, True)
    top = EPS0_MAX
    if bound == "closed-form":
        top = min(top, closed_form_limit(n, delta))
        if top < TINY_EPS0:
            raise ConfigError("round_size", n, f"FMT Thm 3.1 covers no eps0 at a batch of {n} (needs n > 16 "
                                               f"e^eps0 log(2/delta) = {16 * math.log(2 / delta):.4g} e^eps0)")

    def meets(e0: float) -> bool:
        return amplify(e0, n, delta, bound=bound).eps <= target

    if not meets(TINY_EPS0):
        raise ConfigError("round_size", n, f"even eps0 = {TINY_EPS0:g} does not reach eps = {target:g} at a batch "
                                           f"of {n} (delta = {delta:g}); the batch must grow or the target loosen")
    lo = max(TINY_EPS0, min(target, top))   # min(eps0, bound) <= eps0: any eps0 <= target meets it
    if meets(top):
        return top
    hi = top
    while hi - lo > EPS_RTOL * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if meets(mid) else (lo, mid)
    return lo
