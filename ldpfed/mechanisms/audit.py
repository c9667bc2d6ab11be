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

`audit_samples` (and `audit_mechanism`, `audit_stream`) audit one mechanism known only through its protocol, with a
stated power: the claim is the tightest the mechanism makes (`claim_of`: a Gaussian dp_event declares mu-GDP, and
for a mu-GDP claim the GDP bound on mu is a valid test of the claim itself, model-free given the claim); the
neighbouring inputs are the worst under it (`neighbours`); the statistic and event are the likelihood-ratio ones,
fitted and chosen on pilot samples; the sample size is planned so that noise 1/POWER_RATIO of the claim is flagged
with probability >= POWER (tests/test_audit_power.py and jobs/audit_power.py measure it).
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
    mu_claimed: float | None = None  # set: judged in mu (a Gaussian dp_event's claim), else in eps

    @property
    def flagged(self) -> bool:
        if self.mu_claimed is not None:
            return self.mu_lower > self.mu_claimed
        return self.eps_lower > self.eps_claimed

    def __str__(self):
        verdict = "FLAGGED" if self.flagged else "pass"
        if self.mu_claimed is not None:
            return (f"{self.method}: mu_lb={self.mu_lower:.4f} vs declared mu={self.mu_claimed:.4f} (eps_lb="
                    f"{self.eps_lower:.4f} at delta={self.delta:g}, n={self.n}) -> {verdict}")
        extra = "" if self.mu_lower is None else f", mu_lb={self.mu_lower:.4f}"
        return (f"{self.method}: eps_lb={self.eps_lower:.4f} vs claimed {self.eps_claimed} (delta={self.delta}, "
                f"n={self.n}{extra}) -> {verdict}")


def event_audit(event_b: np.ndarray, event_a: np.ndarray, eps_claimed, delta=0.0, alpha=0.05) -> AuditResult:
    """event_b / event_a: boolean outcomes of E for the runs on inputs b / a."""
    k_b, n_b = int(np.count_nonzero(event_b)), int(event_b.size)
    k_a, n_a = int(np.count_nonzero(event_a)), int(event_a.size)
    lb = eps_lower_bound(k_b, n_b, k_a, n_a, delta, alpha)
    return AuditResult(float(eps_claimed), float(delta), lb, "event", min(n_a, n_b), (k_b, k_a))


def gdp_audit(stat_a: np.ndarray, stat_b: np.ndarray, tau: float, eps_claimed, delta, alpha=0.05,
              mu_claimed=None) -> AuditResult:
    """Threshold test 'stat > tau => b' on a scalar statistic (e.g. projection on the difference direction).
    mu_claimed: judge the result against this mu (a mu-GDP claim) instead of eps_claimed."""
    k_fp = int(np.count_nonzero(stat_a > tau))
    k_fn = int(np.count_nonzero(stat_b <= tau))
    mu_lb = gdp_mu_lower_bound(k_fp, stat_a.size, k_fn, stat_b.size, alpha)
    return AuditResult(float(eps_claimed), float(delta), gdp_eps(mu_lb, delta), "gdp",
                       int(min(stat_a.size, stat_b.size)), (k_fp, k_fn), mu_lb,
                       None if mu_claimed is None else float(mu_claimed))


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


# ---- one mechanism, through its protocol ------------------------------------------------------------------------
class Declared:
    """A mechanism known only through its protocol: the guarantee, dp_event and output domain of `claimed`, the
    outputs of `actual`. Planting `actual` with less noise than `claimed` is how the audit's power is measured."""

    def __init__(self, claimed, actual):
        self.guarantee, self._claimed, self._actual = claimed.guarantee, claimed, actual

    def privatize(self, x, rng):
        return self._actual.privatize(x, rng)

    def output_domain(self, shape, data_bound=None, **schedule):
        return self._claimed.output_domain(shape, data_bound, **schedule)

    def dp_event(self):
        return self._claimed.dp_event()


# The audit's design point: it is planned to flag, with probability >= POWER, a mechanism whose privacy loss is
# POWER_RATIO times what it claims (noise divided by 1.5: Gaussian and Laplace noise, tree nodes; for randomized
# response and the l2-ball, which have no noise scale, the mechanism built for 1.5 eps).
POWER_RATIO = 1.5
POWER = 0.95
PILOT_N = 4_000            # samples per input to choose the statistic and the event
MIN_N = 5_000              # samples per input of the audit itself: at least this many ...
MAX_N = 500_000            # ... and at most this many (the budget)
RANK_N = 50_000            # when no event shows more than the claim: ranked by their bound on this many samples
SELECT_SE = 2.0            # events are chosen on pilot frequencies moved this many standard errors unfavourably
MAX_COORDS = 64            # output coordinates the statistic reads (those that move most between the inputs)
CHUNK_VALUES = 2_000_000   # output values per sampled chunk (bounds memory for large outputs)


@dataclass(frozen=True)
class Claim:
    """What a mechanism's audit holds it to. kind "gdp": mu-GDP, what a Gaussian dp_event declares (N(0, s^2) in
    `nodes` draws at l2 distance Delta is sqrt(nodes) Delta / s -GDP, the curve the accountant composes); kind "dp":
    (eps, delta)-DP (Laplace and randomized-response events, and an empty event's guarantee)."""
    kind: str
    eps: float
    delta: float
    mu: float | None = None
    source: str = ""


def claim_of(guarantee, event=None) -> Claim:
    """The tightest claim a mechanism makes: its dp_event's noise (what the accountant composes) where it has
    one, else its guarantee."""
    from .protocol import check_dp_event

    event = check_dp_event({} if event is None else event)
    g, noise, nodes = guarantee, event.get("noise"), int(event.get("nodes", 1))
    if noise == "gaussian":
        mu = math.sqrt(nodes) * float(g.sensitivity) / float(event["noise_std"])
        return Claim("gdp", float(g.eps), float(g.delta), mu,
                     f"dp_event: gaussian noise_std={event['noise_std']:.6g} in {nodes} draw(s) at l2 distance "
                     f"{g.sensitivity:.6g}")
    if noise == "laplace":
        eps = nodes * float(g.sensitivity) / float(event["noise_scale"])
        if g.delta == 0.0:
            eps = min(eps, float(g.eps))
        return Claim("dp", eps, 0.0, None, f"dp_event: laplace noise_scale={event['noise_scale']:.6g} in {nodes} "
                                           f"draw(s) at l1 distance {g.sensitivity:.6g}")
    if noise == "randomized-response":
        return Claim("dp", float(g.eps), 0.0, None, f"dp_event: randomized response at eps={g.eps:.6g}")
    return Claim("dp", float(g.eps), float(g.delta), None, f"guarantee ({g.eps:.6g}, {g.delta:.3g})")


def neighbours(mechanism, x0) -> tuple[np.ndarray, np.ndarray, str]:
    """(x_a, x_b, what): the neighbouring inputs the mechanism's claim is tightest on, around x0 (one input as
    privatize takes it, without the batch axis). Randomized response: one bit flipped. The l2-ball (whose
    sensitivity is the radius R of its input ball): the first row at -R e1 and +R e1. Every other mechanism
    (sensitivity: the largest l1 or l2 distance between two inputs): x0 and x0 + sensitivity e1, the first entry
    moved (the worst pair for additive noise; for a symmetric matrix, a diagonal entry; for a stream, its first
    element, which lands in the most tree nodes)."""
    g, event = mechanism.guarantee, mechanism.dp_event() or {}
    x_a = np.array(x0, dtype=float)
    x_b = x_a.copy()
    if event.get("noise") == "randomized-response" or g.mechanism == "randomized-response":
        x_a.flat[0], x_b.flat[0] = 0.0, 1.0
        return x_a, x_b, "one bit flipped"
    if g.mechanism == "l2-ball" and not event:
        dim = int(getattr(mechanism, "dim", x_a.shape[-1]))
        for x, sign in ((x_a, -1.0), (x_b, 1.0)):
            row = x.reshape(-1, dim)[0]
            row[:] = 0.0
            row[0] = sign * float(g.sensitivity)
        return x_a, x_b, f"first row at -R e1 and +R e1 (R = {g.sensitivity:.4g})"
    x_b.flat[0] += float(g.sensitivity)
    return x_a, x_b, f"first entry moved by the sensitivity {g.sensitivity:.4g} ({g.norm})"


def batch_sampler(privatize, x_a, x_b):
    """sample(which, n, rng): privatize on n copies of x_a (which = 0) or x_b (1), in chunks of (k, outputs)."""
    rows = max(1, min(8192, CHUNK_VALUES // max(1, np.size(x_a))))

    def sample(which, n, rng):
        x = (x_a, x_b)[which]
        for start in range(0, n, rows):
            k = min(rows, n - start)
            yield np.asarray(privatize(np.repeat(x[None], k, axis=0), rng), dtype=float).reshape(k, -1)

    return sample


def stream_sampler(make, stream_a, stream_b):
    """sample(which, n, rng) for a stream mechanism (privatize(x): the releases of a stream x of shape (T, *shape))
    whose coordinates get independent noise, as ldpfed's trees: k trials at once as the k coordinates of one stream
    of make((k, *shape)) (a mechanism of that element shape)."""
    rows = max(1, min(8192, CHUNK_VALUES // max(1, np.size(stream_a))))

    def sample(which, n, rng):
        x = (stream_a, stream_b)[which]
        for start in range(0, n, rows):
            k = min(rows, n - start)
            out = make((k, *x.shape[1:])).privatize(np.repeat(x[:, None], k, axis=1), rng)
            yield np.moveaxis(np.asarray(out, dtype=float), 1, 0).reshape(k, -1)

    return sample


@dataclass(frozen=True)
class MechanismAudit:
    """One mechanism's audit: its claim, the result (model-free event bound, or for a Gaussian claim the GDP
    bound judged in mu), how its statistic and event were chosen, and the sample size (planned and drawn)."""
    claim: Claim
    result: AuditResult | None        # None: no output moves between the inputs (nothing to tell apart)
    statistic: str = ""
    event: str = ""
    n_planned: int = 0
    pair: str = ""

    @property
    def flagged(self) -> bool:
        return self.result is not None and self.result.flagged

    def __str__(self):
        if self.result is None:
            return f"no output moves between the inputs ({self.pair}): pass"
        return f"{self.result}; {self.statistic}, event {self.event}, pair: {self.pair}; claim: {self.claim.source}"


def _rng(seed, *tag):
    return np.random.default_rng([*np.atleast_1d(seed).tolist(), *tag])


def _moving(sample, pilot_n, seed):
    """Pilot with common random numbers (both inputs from the same draws, so additive noise cancels): the output
    coordinates whose paired difference is non-zero and beyond 4 standard errors, at most MAX_COORDS of them (the
    largest), in output order."""
    total = squares = None
    for ya, yb in zip(sample(0, pilot_n, _rng(seed, 1)), sample(1, pilot_n, _rng(seed, 1))):
        d = yb - ya
        total = d.sum(axis=0) if total is None else total + d.sum(axis=0)
        squares = (d * d).sum(axis=0) if squares is None else squares + (d * d).sum(axis=0)
    mean = total / pilot_n
    se = np.sqrt(np.maximum(squares / pilot_n - mean**2, 0.0) / max(pilot_n - 1, 1))
    with np.errstate(divide="ignore", invalid="ignore"):
        score = np.where(se > 0, np.abs(mean) / se, np.where(mean != 0, np.inf, 0.0))
    moving = np.flatnonzero(score > 4.0)
    if len(moving) > MAX_COORDS:
        moving = moving[np.argsort(-score[moving], kind="stable")[:MAX_COORDS]]
    return np.sort(moving)


class _Statistic:
    """Outputs reduced to the coordinates that move, whitened with the pilot's pooled covariance (Cholesky, in
    output order: for a tree's prefix sums the whitened coordinates are its nodes). "linear" projects them on the
    whitened mean difference (the likelihood ratio for Gaussian noise); "clipped" sums each coordinate clipped to
    half its shift (the likelihood ratio for Laplace noise: it reaches its maximum, e^eps, on the event that every
    shifted coordinate is beyond its shift)."""

    def __init__(self, pilot_a, pilot_b):
        """pilot_a, pilot_b: paired samples (common random numbers) of the coordinates that move."""
        mean_a, mean_b = pilot_a.mean(axis=0), pilot_b.mean(axis=0)
        self.centre = 0.5 * (mean_a + mean_b)
        ca, cb = pilot_a - mean_a, pilot_b - mean_b
        cov = (ca.T @ ca + cb.T @ cb) / max(len(ca) + len(cb) - 2, 1)
        shift = (pilot_b - pilot_a).mean(axis=0)
        k = pilot_a.shape[1]
        scale = max(float(np.trace(cov)) / k, float(np.max(shift**2)), 1e-300)
        cov[np.diag_indices(k)] += 1e-9 * scale                     # deterministic coordinates stay invertible
        chol = np.linalg.cholesky(cov)
        self.whiten = np.linalg.solve(chol, np.eye(k))              # lower triangular: z = W (y - centre)
        self.shift = self.whiten @ shift
        self.direction = self.shift / np.linalg.norm(self.shift)
        half = 0.5 * np.abs(self.shift)
        keep = half >= 0.1 * half.max()                                # the rest: noise of the estimated covariance
        self.keep, self.half, self.sign = keep, half[keep], np.sign(self.shift[keep])

    def z(self, y):
        # einsum, not BLAS: for these skinny products BLAS threads cost more than they save
        return np.einsum("ij,kj->ik", y - self.centre, self.whiten)

    def linear(self, y):
        return self.z(y) @ self.direction

    def clipped(self, y):
        z = self.z(y)[:, self.keep] * self.sign
        return np.clip(z, -self.half, self.half).sum(axis=1)


def _thresholds(values):
    unique = np.unique(values)
    if len(unique) <= 256:
        return unique
    q = np.concatenate([[0.0005, 0.001, 0.002, 0.005], np.linspace(0.01, 0.99, 99), [0.995, 0.998, 0.999, 0.9995]])
    return np.unique(np.concatenate([np.quantile(values, q), [0.0]]))


def _choose_event(stats, pilot_a, pilot_b, claim, alpha, z_power):
    """The statistic and threshold event to audit, from the pilot's frequencies moved SELECT_SE standard errors to
    the unfavourable side (p_hi down on the likelier input, p_lo up on the other, +1 pseudo-count: among hundreds of
    candidates, a rare event does not win on the noise of a few counts): among the events that show more than the
    claim, the one that needs the fewest samples to flag it (delta method, as required_n); if none does, the one with
    the largest bound on RANK_N samples.
    Returns (name, tau, upper, p_hi, (hi, lo) or None when no event shows more than the claim); upper: "stat >= tau"
    (likelier under b), else "stat <= tau" (likelier under a)."""
    m = len(pilot_a)
    z_cp = float(special.ndtri(1.0 - alpha / 2.0))
    fastest, best = (math.inf, None), (-math.inf, None)
    for name, fn in stats:
        sa, sb = np.sort(fn(pilot_a)), np.sort(fn(pilot_b))
        for tau in _thresholds(np.concatenate([sa, sb])):
            ge_a = m - np.searchsorted(sa, tau, side="left")
            ge_b = m - np.searchsorted(sb, tau, side="left")
            le_a = np.searchsorted(sa, tau, side="right")
            le_b = np.searchsorted(sb, tau, side="right")
            for upper, k_hi, k_lo in ((True, ge_b, ge_a), (False, le_a, le_b)):
                p_hi, p_lo = k_hi / m, (k_lo + 1) / (m + 1)
                hi = p_hi - SELECT_SE * math.sqrt(p_hi * (1 - p_hi) / m)
                lo = min(p_lo + SELECT_SE * math.sqrt(p_lo * (1 - p_lo) / m), 1.0)
                if hi <= claim.delta:
                    continue
                event = (name, float(tau), upper, p_hi)
                gap = math.log((hi - claim.delta) / lo) - claim.eps
                if gap > 0:
                    s_hi = math.sqrt(hi * (1 - hi)) / (hi - claim.delta)
                    s_lo = math.sqrt((1 - lo) / lo)
                    n = ((z_cp * (s_hi + s_lo) + z_power * math.hypot(s_hi, s_lo)) / gap) ** 2
                    if n < fastest[0]:
                        fastest = (n, (*event, (hi, lo)))
                elif fastest[1] is None:
                    score = pessimistic_bound(hi, lo, RANK_N, claim.delta, alpha, z=0.0)
                    if score > best[0]:
                        best = (score, (*event, None))
    return fastest[1] if fastest[1] is not None else best[1]


def audit_samples(sample, claim: Claim, *, alpha=0.05, seed=0, ratio=POWER_RATIO, power=POWER, pilot_n=PILOT_N,
                  min_n=MIN_N, max_n=MAX_N, pair="") -> MechanismAudit:
    """Audit a mechanism from its outputs on two neighbouring inputs: sample(which, n, rng) yields chunks (k,
    outputs) of its outputs on input a (which = 0) or b (1), drawing from rng.

    1. A pilot with common random numbers finds the output coordinates that move (_moving); the same draws, kept on
       those coordinates, fit the statistic (_Statistic) and, for a (eps, delta) claim, choose it and the threshold
       event (_choose_event).
    2. The sample size is planned for the design point: n at which a mechanism with `ratio` times the claimed mu
       (GDP), or whose likelihood ratio on the chosen event is e^(ratio eps), is flagged with probability >= power
       (both counts z_power standard deviations on the unfavourable side); for an (eps, delta) claim also the n at
       which the event's frequencies on a fresh pilot would flag it, if they show more than the claim; within
       [min_n, max_n].
    3. On n fresh samples of each input, the bound: for a Gaussian claim the GDP bound on mu of the threshold test
       at the midpoint (valid for every mu-GDP mechanism), else the Clopper-Pearson event bound (valid for every
       (eps, delta)-DP mechanism); flagged when it exceeds the claim. The pilots only choose: the bound holds with
       confidence 1 - alpha whatever they chose."""
    coords = _moving(sample, pilot_n, seed)
    if len(coords) == 0:
        return MechanismAudit(claim, None, pair=pair)
    # the same draws again (deterministic), keeping only the coordinates that move
    pilot_a = np.concatenate([y[:, coords] for y in sample(0, pilot_n, _rng(seed, 1))])
    pilot_b = np.concatenate([y[:, coords] for y in sample(1, pilot_n, _rng(seed, 1))])
    stat = _Statistic(pilot_a, pilot_b)
    z_power = float(special.ndtri(power))

    def final(fn, n, tags=(4, 5)):
        def values(which, tag):
            return np.concatenate([fn(y[:, coords]) for y in sample(which, n, _rng(seed, tag))])
        return values(0, tags[0]), values(1, tags[1])

    if claim.kind == "gdp":
        n = required_n_gdp(ratio * claim.mu, claim.mu, alpha, z_power, max_n) or max_n
        n = int(min(max(n, min_n), max_n))
        sa, sb = final(stat.linear, n)
        result = gdp_audit(sa, sb, 0.0, claim.eps, claim.delta, alpha, mu_claimed=claim.mu)
        return MechanismAudit(claim, result, "linear (Gaussian likelihood ratio)", "statistic > midpoint", n, pair)
    stats = [("linear", stat.linear)] + ([("clipped", stat.clipped)] if stat.keep.any() else [])
    chosen = _choose_event(stats, pilot_a, pilot_b, claim, alpha, z_power)
    if chosen is None:
        return MechanismAudit(claim, AuditResult(claim.eps, claim.delta, 0.0, "event", 0, (0, 0)), pair=pair)
    name, tau, upper = chosen[:3]
    fn = dict(stats)[name]

    def event(sa, sb):                       # (E on the likelier input, E on the other)
        return (sb >= tau, sa >= tau) if upper else (sa <= tau, sb <= tau)

    # The plan, from a fresh pilot (the chosen event's frequencies are biased up on the pilot that chose it): the
    # design point, this event's likelihood ratio at e^(ratio eps); more samples if it shows a smaller excess.
    e_hi, e_lo = event(*final(fn, pilot_n, (6, 7)))
    p_hi, p_lo = e_hi.mean(), (np.count_nonzero(e_lo) + 1) / (pilot_n + 1)
    n = required_n(p_hi, max(p_hi - claim.delta, 0.0) * math.exp(-ratio * claim.eps), claim.eps, claim.delta,
                   alpha, z_power, max_n) or max_n
    hi = p_hi - math.sqrt(p_hi * (1 - p_hi) / pilot_n)
    lo = min(p_lo + math.sqrt(p_lo * (1 - p_lo) / pilot_n), 1.0)
    if hi > claim.delta and math.log((hi - claim.delta) / lo) > claim.eps:
        n = max(n, required_n(hi, lo, claim.eps, claim.delta, alpha, z_power, max_n) or max_n)
    n = int(min(max(n, min_n), max_n))
    result = event_audit(*event(*final(fn, n)), claim.eps, claim.delta, alpha)
    label = {"linear": "linear (projection on the whitened shift)", "clipped": "clipped (Laplace likelihood ratio)"}
    described = f"statistic {'>=' if upper else '<='} {tau:.4g} (likelier under {'b' if upper else 'a'})"
    return MechanismAudit(claim, result, label[name], described, n, pair)


def audit_mechanism(mechanism, x0, *, alpha=0.05, seed=0, **options) -> MechanismAudit:
    """Audit a mechanism known only through its protocol (guarantee, privatize, dp_event) against its own claim
    (claim_of) on the neighbours of x0 (one input as privatize takes it, without the batch axis): privatize on
    batches of copies of each. options: those of audit_samples."""
    claim = claim_of(mechanism.guarantee, mechanism.dp_event())
    x_a, x_b, pair = neighbours(mechanism, x0)
    return audit_samples(batch_sampler(mechanism.privatize, x_a, x_b), claim, alpha=alpha, seed=seed, pair=pair,
                         **options)


def audit_stream(make, x0, *, alpha=0.05, seed=0, **options) -> MechanismAudit:
    """audit_mechanism for a stream mechanism with independent noise per coordinate (ldpfed's trees): make(shape)
    builds it for elements of that shape; x0: a stream (T, *shape)."""
    mechanism = make(np.shape(x0)[1:])
    claim = claim_of(mechanism.guarantee, mechanism.dp_event())
    x_a, x_b, pair = neighbours(mechanism, x0)
    return audit_samples(stream_sampler(make, x_a, x_b), claim, alpha=alpha, seed=seed, pair=pair, **options)
