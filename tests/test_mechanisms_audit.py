"""Statistical privacy audits of every mechanism (see ldpfed/mechanisms/audit.py for the method).

Each test: (1) plans the sample size n from the known event probabilities of a deliberately WEAKENED copy so that,
even with both counts 3 standard deviations on the unfavourable side, the Clopper-Pearson lower bound (joint
confidence 95%) exceeds the claimed eps; (2) runs the REAL mechanism and asserts the lower bound is <= the claim;
(3) runs the weakened copy and asserts the bound exceeds the claim. Seeds are fixed; nothing was tuned on the
outcome (n comes from the plan, events are fixed before sampling).
"""

import math

import numpy as np
import pytest
from scipy import integrate, special, stats

import ldpfed.mechanisms as M
from ldpfed.mechanisms import audit as A
from ldpfed.mechanisms.l2ball import _privatize_rows
from ldpfed.util.errors import ConfigError

ALPHA = 0.05
Z = 3.0
EPS = 1.0
DELTA = 1e-5
RESULTS = {}


def _record(name, res):
    RESULTS[name] = res
    print(f"\n[audit] {name}: {res}")


def _rng(tag):
    return np.random.default_rng([20240601, sum(map(ord, tag))])


def _tight_n(p_b, p_a, within=0.15):
    """n at which the audit of a mechanism whose claim is tight gets within `within` of the claim."""
    return A.required_n(p_b, p_a, EPS - within, 0.0, ALPHA, Z) or 0


# ---------------------------------------------------------------- Gaussian (vector), classic calibration
def test_audit_gaussian_vector_event_and_gdp():
    dim, sens = 3, 1.0
    real = M.GaussianMechanism(sens, EPS, DELTA)
    weak_sigma = real.sigma / 2  # deliberately weakened: half the noise
    taus = np.arange(0.0, 12.0, 0.25)
    tau, n = A.plan_event_audit(
        [(t, stats.norm.sf((t - sens) / weak_sigma), stats.norm.sf(t / weak_sigma)) for t in taus],
        EPS, DELTA, ALPHA, Z)
    assert n <= 3_000_000, n
    a, b = np.zeros((n, dim)), np.zeros((n, dim))
    b[:, 0] = sens  # neighbouring inputs: differ by the sensitivity along e_1
    rng = _rng("gauss")
    ya, yb = real.privatize(a, rng)[:, 0], real.privatize(b, rng)[:, 0]
    res_real = A.event_audit(yb > tau, ya > tau, EPS, DELTA, ALPHA)
    za = a[:, 0] + weak_sigma * rng.standard_normal(n)
    zb = b[:, 0] + weak_sigma * rng.standard_normal(n)
    res_weak = A.event_audit(zb > tau, za > tau, EPS, DELTA, ALPHA)
    _record(f"gaussian classic real (tau={tau:.2f})", res_real)
    _record("gaussian classic half-noise", res_weak)
    assert not res_real.flagged
    assert res_weak.flagged
    # Gaussian-DP estimate (model based, sharper): midpoint threshold
    g_real = A.gdp_audit(ya, yb, sens / 2, EPS, DELTA, ALPHA)
    g_weak = A.gdp_audit(za, zb, sens / 2, EPS, DELTA, ALPHA)
    _record("gaussian classic real GDP", g_real)
    _record("gaussian classic half-noise GDP", g_weak)
    assert not g_real.flagged and g_weak.flagged
    # the true mu of the real mechanism is 1/sigma; the lower bound must sit below it
    assert g_real.mu_lower <= sens / real.sigma


def test_audit_gaussian_analytic_is_tight_but_passes():
    real = M.GaussianMechanism(1.0, EPS, DELTA, calibration="analytic")
    mu_claim = A.gdp_mu(EPS, DELTA)
    assert mu_claim == pytest.approx(1.0 / real.sigma)
    # n: flag half the noise (mu = 2 mu_claim), and bring the exact mechanism's bound within mu-equivalent of eps 0.8
    n = max(A.required_n_gdp(2 * mu_claim, mu_claim, ALPHA, Z),
            A.required_n_gdp(mu_claim, 1.0 / M.gaussian_sigma(1.0, 0.8, DELTA, "analytic"), ALPHA, Z))
    assert n <= 3_000_000, n
    rng = _rng("gauss-analytic")
    ya = real.privatize(np.zeros(n), rng)
    yb = real.privatize(np.ones(n), rng)
    res = A.gdp_audit(ya, yb, 0.5, EPS, DELTA, ALPHA)
    _record("gaussian analytic real GDP", res)
    assert not res.flagged
    assert res.eps_lower > 0.8  # the analytic calibration is exact: the audit comes close to the claim
    wa = 0.0 + real.sigma / 2 * rng.standard_normal(n)  # deliberately weakened: half the noise
    wb = 1.0 + real.sigma / 2 * rng.standard_normal(n)
    res_w = A.gdp_audit(wa, wb, 0.5, EPS, DELTA, ALPHA)
    _record("gaussian analytic half-noise GDP", res_w)
    assert res_w.flagged


# ---------------------------------------------------------------- symmetric matrix noise
def test_audit_symmetric_gaussian_off_diagonal():
    """Neighbours differ in one off-diagonal entry (upper-triangle norm = sensitivity). The real mechanism
    passes; half the noise and the (G + G^T)/2 construction (off-diagonal std sigma/sqrt 2) are flagged."""
    d, sens = 3, 1.0
    real = M.SymmetricGaussianMechanism(sens, EPS, DELTA, calibration="analytic")
    mu_claim = A.gdp_mu(EPS, DELTA)
    # GDP plan: the weakened copies have mu = 2/s (half noise) and sqrt(2)/s ((G+G^T)/2 off the diagonal).
    n = max(A.required_n_gdp(mu, mu_claim, ALPHA, Z) for mu in (2 * sens / real.sigma, math.sqrt(2) * sens / real.sigma))
    assert n <= 2_000_000, n
    rng = _rng("sym")
    a = np.zeros((n, d, d))
    b = np.zeros((n, d, d))
    b[:, 0, 1] = b[:, 1, 0] = sens
    ya, yb = real.privatize(a, rng)[:, 0, 1], real.privatize(b, rng)[:, 0, 1]
    res = A.gdp_audit(ya, yb, sens / 2, EPS, DELTA, ALPHA)
    _record("symmetric-gaussian real GDP (off-diagonal)", res)
    assert not res.flagged

    def g_plus_gt(x):
        g = real.sigma * rng.standard_normal(x.shape)
        return x + (g + np.swapaxes(g, -1, -2)) / 2

    wa, wb = g_plus_gt(a)[:, 0, 1], g_plus_gt(b)[:, 0, 1]
    res_w = A.gdp_audit(wa, wb, sens / 2, EPS, DELTA, ALPHA)
    _record("symmetric (G+G^T)/2 GDP (off-diagonal)", res_w)
    assert res_w.flagged
    ha = a[:, 0, 1] + real.sigma / 2 * rng.standard_normal(n)
    hb = b[:, 0, 1] + real.sigma / 2 * rng.standard_normal(n)
    res_h = A.gdp_audit(ha, hb, sens / 2, EPS, DELTA, ALPHA)
    _record("symmetric half-noise GDP", res_h)
    assert res_h.flagged


# ---------------------------------------------------------------- Laplace
def test_audit_laplace():
    sens = 1.0
    real = M.LaplaceMechanism(sens, EPS)
    wb_ = real.b / 2

    def probs(b, t):  # P(y > t) for inputs sens and 0
        return stats.laplace.sf(t - sens, scale=b), stats.laplace.sf(t, scale=b)

    tau, n = A.plan_event_audit([(t, *probs(wb_, t)) for t in (0.0, 0.5, 1.0, 1.5, 2.0, 3.0)], EPS, 0.0, ALPHA, Z)
    n = max(n, _tight_n(*probs(real.b, tau)))
    rng = _rng("laplace")
    ya = real.privatize(np.zeros(n), rng)
    yb = real.privatize(np.full(n, sens), rng)
    res = A.event_audit(yb > tau, ya > tau, EPS, 0.0, ALPHA)
    weak = M.LaplaceMechanism(sens, 2 * EPS)  # same as b/2: half the noise
    assert weak.b == pytest.approx(wb_)
    res_w = A.event_audit(weak.privatize(np.full(n, sens), rng) > tau, weak.privatize(np.zeros(n), rng) > tau,
                          EPS, 0.0, ALPHA)
    _record(f"laplace real (tau={tau}, n={n})", res)
    _record("laplace half-noise", res_w)
    assert not res.flagged and res.eps_lower > EPS - 0.15
    assert res_w.flagged


# ---------------------------------------------------------------- l2-ball
def test_audit_l2_ball():
    """Inputs +R e1 and -R e1, event Z_1 > 0: P = expit(eps) vs expit(-eps), ratio exactly e^eps.
    Weakened copy: the public reference code's bug -- calibrated for radius R/2 and fed norm-R inputs unclipped
    (keep probability 1/2 + tanh(eps/2) = 0.96 at eps = 1)."""
    R, dim = 1.0, 5
    real = M.L2BallMechanism(R, EPS, dim)
    p_weak = 0.5 + (R / (2 * (R / 2))) * math.tanh(EPS / 2)
    assert p_weak < 1
    _, n = A.plan_event_audit([(None, p_weak, 1 - p_weak)], EPS, 0.0, ALPHA, Z)
    n = max(n, _tight_n(special.expit(EPS), special.expit(-EPS)))
    rng = _rng("l2ball")
    a = np.zeros((n, dim))
    a[:, 0] = -R
    b = -a
    za, ca = real.privatize_counted(a, rng)
    zb, cb = real.privatize_counted(b, rng)
    assert ca == cb == 0
    res = A.event_audit(zb[:, 0] > 0, za[:, 0] > 0, EPS, 0.0, ALPHA)

    def weak_privatize(g):  # no clipping, radius R/2: the mechanism's own sampler with p = 1/2 + ||g|| tanh / R
        # (radius R: norm-R inputs pass unclipped; tanh doubled: the half-radius keep probability; B of R/2)
        gauss, unif, out = rng.standard_normal(g.shape), rng.random(len(g)), np.empty(g.shape)
        _privatize_rows(g, R, M.l2_ball_radius(R / 2, EPS, dim), 2 * math.tanh(EPS / 2), 1e-9, gauss, unif, out)
        return out

    res_w = A.event_audit(weak_privatize(b)[:, 0] > 0, weak_privatize(a)[:, 0] > 0, EPS, 0.0, ALPHA)
    _record(f"l2-ball real (n={n})", res)
    _record("l2-ball half-radius unclipped", res_w)
    assert not res.flagged and res.eps_lower > EPS - 0.15
    assert res_w.flagged
    # and the real mechanism with clipping is NOT fooled by out-of-ball inputs
    zc, cc = real.privatize_counted(4 * b, rng)
    assert cc == n
    res_c = A.event_audit(zc[:, 0] > 0, za[:, 0] > 0, EPS, 0.0, ALPHA)
    _record("l2-ball real, inputs of norm 4R (clipped)", res_c)
    assert not res_c.flagged


# ---------------------------------------------------------------- randomized response
def test_audit_randomized_response():
    real = M.RandomizedResponse(EPS)
    weak = M.RandomizedResponse(2 * EPS)  # wrong keep probability expit(2 eps)
    _, n = A.plan_event_audit([(None, weak.p_keep, 1 - weak.p_keep)], EPS, 0.0, ALPHA, Z)
    n = max(n, _tight_n(real.p_keep, 1 - real.p_keep))
    rng = _rng("rr")
    ones, zeros = np.ones(n, dtype=int), np.zeros(n, dtype=int)
    res = A.event_audit(real.privatize(ones, rng) == 1, real.privatize(zeros, rng) == 1, EPS, 0.0, ALPHA)
    res_w = A.event_audit(weak.privatize(ones, rng) == 1, weak.privatize(zeros, rng) == 1, EPS, 0.0, ALPHA)
    _record(f"randomized-response real (n={n})", res)
    _record("randomized-response keep=expit(2eps)", res_w)
    assert not res.flagged and res.eps_lower > EPS - 0.15
    assert res_w.flagged


# ---------------------------------------------------------------- tree mechanism
def _run_tree(mech, first, rng):
    """Stream of vectors of independent trials: x_1 = first, x_t = 0 afterwards. Returns all prefixes (T, n)."""
    outs = []
    for t in range(1, mech.horizon + 1):
        outs.append(mech.add(first if t == 1 else np.zeros_like(first), rng))
    return np.array(outs)


def test_audit_tree_gaussian():
    """Streams differ in x_1 (by the sensitivity). The noisy prefixes at t = 1, 2, 4, 8 are exactly the L = 4
    noisy nodes that contain x_1; their sum is the sufficient statistic. Weakened copy: half the node noise,
    which for L = 4 is also exactly the 'forgot the sqrt(L) factor' bug."""
    T, sens = 15, 1.0
    L = M.tree_depth(T)
    assert L == 4
    sigma_node = math.sqrt(L) * M.gaussian_sigma(sens, EPS, DELTA)
    s_sum_w = math.sqrt(L) * sigma_node / 2  # std of the 4-node sum, weakened
    taus = np.arange(0.0, 30.0, 0.25)
    tau, n = A.plan_event_audit(
        [(t, stats.norm.sf((t - L * sens) / s_sum_w), stats.norm.sf(t / s_sum_w)) for t in taus], EPS, DELTA, ALPHA, Z)
    assert n <= 3_000_000
    rng = _rng("tree-g")
    stats_ = {}
    for label, weaken in (("real", False), ("half-noise", True)):
        for inp, first in (("a", np.zeros(n)), ("b", np.full(n, sens))):
            m = M.TreeMechanism(T, (n,), eps=EPS, delta=DELTA, sensitivity=sens)
            assert m.node_scale == pytest.approx(sigma_node)
            if weaken:
                m._noise.node_scale = m.node_scale / 2  # deliberately weakened copy
            y = _run_tree(m, first, rng)
            stats_[label, inp] = y[0] + y[1] + y[3] + y[7]
        res = A.event_audit(stats_[label, "b"] > tau, stats_[label, "a"] > tau, EPS, DELTA, ALPHA)
        g = A.gdp_audit(stats_[label, "a"], stats_[label, "b"], L * sens / 2, EPS, DELTA, ALPHA)
        _record(f"tree-gaussian {label} (tau={tau:.2f}, n={n})", res)
        _record(f"tree-gaussian {label} GDP", g)
        assert res.flagged == weaken and g.flagged == weaken


def test_audit_tree_laplace():
    """Event: all 4 nodes containing x_1 are >= sensitivity. Real: probabilities 1/16 and e^-eps/16
    (ratio exactly e^eps); half the node scale doubles the log-ratio."""
    T, sens = 15, 1.0
    L = 4
    p_b = 0.5**L
    p_a_weak = (0.5 * math.exp(-2 * EPS / L)) ** L
    _, n = A.plan_event_audit([(None, p_b, p_a_weak)], EPS, 0.0, ALPHA, Z)
    n = max(n, _tight_n(p_b, (0.5 * math.exp(-EPS / L)) ** L))
    rng = _rng("tree-l")
    for label, weaken in (("real", False), ("half-noise", True)):
        ev = {}
        for inp, first in (("a", np.zeros(n)), ("b", np.full(n, sens))):
            m = M.TreeMechanism(T, (n,), eps=EPS, sensitivity=sens, noise="laplace")
            assert m.depth == L and m.node_scale == pytest.approx(L * sens / EPS)
            if weaken:
                m._noise.node_scale = m.node_scale / 2
            y = _run_tree(m, first, rng)
            ev[inp] = (y[[0, 1, 3, 7]] >= sens).all(axis=0)
        res = A.event_audit(ev["b"], ev["a"], EPS, 0.0, ALPHA)
        _record(f"tree-laplace {label} (n={n})", res)
        assert res.flagged == weaken
        if not weaken:
            assert res.eps_lower > EPS - 0.15


# ---------------------------------------------------------------- Wishart
def test_audit_wishart():
    """Neighbours: Gram 0 (no rows) vs e1 e1^T (one row of norm 1). With b, output[0,0] >= 1 always; with a it
    is < 1 with probability P(chi2_k < 1). For the real k this is astronomically small; a copy that drops the
    privacy term (k = d + 1) is flagged. NOTE: the theorem's k is loose -- even half the noise scale is not
    detectable by any event we know of, so only gross under-calibration is audited here."""
    d = 3
    real = M.WishartMechanism(d, EPS, DELTA)
    assert stats.chi2.cdf(1.0, real.k) < 1e-100
    k_weak = d + 1
    p_weak = stats.chi2.cdf(1.0, k_weak)
    _, n = A.plan_event_audit([(None, p_weak, 0.0)], EPS, DELTA, ALPHA, Z)
    n = max(n, 2000)
    rng = _rng("wishart")
    a, b = np.zeros((d, d)), np.zeros((d, d))
    b[0, 0] = 1.0
    for label, k in (("real", real.k), ("k=d+1", k_weak)):
        m = M.WishartMechanism(d, EPS, DELTA)
        m.k = k
        ea = np.array([m.privatize(a, rng)[0, 0] < 1.0 for _ in range(n)])
        eb = np.array([m.privatize(b, rng)[0, 0] < 1.0 for _ in range(n)])
        assert not eb.any()
        res = A.event_audit(ea, eb, EPS, DELTA, ALPHA)
        _record(f"wishart {label} (k={k}, n={n})", res)
        assert res.flagged == (label != "real")


# ---------------------------------------------------------------- sparse vector
def _svt_event_prob(q, T, sT, sV):
    """P(the first positive is the last query) for values q, threshold T, noise scales sT, sV (quadrature)."""
    def f(r):
        thr = T + r
        return (stats.laplace.pdf(r, scale=sT) * np.prod(stats.laplace.cdf(thr - q[:-1], scale=sV))
                * stats.laplace.sf(thr - q[-1], scale=sV))
    return integrate.quad(f, -80 * sT, 80 * sT, points=[0.0], limit=500)[0]


def test_audit_sparse_vector():
    """Queries a = (D, D, D, D, 0), b = (0, 0, 0, 0, D) (each moves by the sensitivity D); event: the first
    positive is query 5. As the number of queries grows this event's log-ratio tends to the full eps."""
    sens, m = 1.0, 5
    real = M.AboveNoisyThreshold(0.0, EPS, sensitivity=sens)
    qa = np.r_[np.full(m - 1, sens), 0.0]
    qb = np.r_[np.zeros(m - 1), sens]
    sT, sV = real.threshold_scale / 2, real.value_scale / 2  # weakened: half the noise
    with pytest.raises(ConfigError):
        M.AboveNoisyThreshold(0.0, EPS, threshold_scale=sT, value_scale=sV)
    cands = [(T, _svt_event_prob(qb, T, sT, sV), _svt_event_prob(qa, T, sT, sV)) for T in (-2.0, -1.0, 0.0, 1.0, 2.0)]
    T, n = A.plan_event_audit(cands, EPS, 0.0, ALPHA, Z)
    assert n <= 2_000_000
    rng = _rng("svt")
    for label, weaken in (("real", False), ("half-noise", True)):
        mech = M.AboveNoisyThreshold(T, EPS, sensitivity=sens)
        if weaken:
            mech.threshold_scale, mech.value_scale = sT, sV
        ea = mech.select_batch(np.broadcast_to(qa, (n, m)), rng)[:, 0] == m - 1
        eb = mech.select_batch(np.broadcast_to(qb, (n, m)), rng)[:, 0] == m - 1
        res = A.event_audit(eb, ea, EPS, 0.0, ALPHA)
        _record(f"sparse-vector {label} (T={T}, n={n})", res)
        assert res.flagged == weaken


# ---------------------------------------------------------------- one mechanism, through its protocol
def test_claims_and_neighbours_follow_the_protocol():
    g = M.GaussianMechanism(2.0, 1.0, 0.01)
    claim = A.claim_of(g.guarantee, g.dp_event())
    assert claim.kind == "gdp" and claim.mu == pytest.approx(2.0 / g.sigma)
    tree = M.TreeMechanism(15, (1,), eps=1.0, delta=0.01, sensitivity=1.0)
    assert A.claim_of(tree.guarantee, tree.dp_event()).mu == pytest.approx(2.0 / tree.node_scale)   # 4 nodes
    lap_tree = M.TreeMechanism(15, (1,), eps=1.0, sensitivity=1.0, noise="laplace")
    lap = A.claim_of(lap_tree.guarantee, lap_tree.dp_event())
    assert (lap.kind, lap.eps, lap.delta) == ("dp", pytest.approx(1.0), 0.0)          # 4 nodes of scale 4
    ball = M.L2BallMechanism(2.0, 1.0, 3)
    assert A.claim_of(ball.guarantee, ball.dp_event()).kind == "dp"
    x_a, x_b, _ = A.neighbours(ball, np.array([0.3, 0.1, 0.0]))
    assert np.array_equal(x_a, [-2.0, 0, 0]) and np.array_equal(x_b, [2.0, 0, 0])
    x_a, x_b, _ = A.neighbours(M.RandomizedResponse(1.0), np.array([1.0, 0.0, 1.0]))
    assert np.array_equal(x_a, [0, 0, 1]) and np.array_equal(x_b, [1, 0, 1])
    x_a, x_b, _ = A.neighbours(g, np.array([0.5, 0.5]))
    assert np.array_equal(x_b - x_a, [2.0, 0.0])


@pytest.mark.parametrize("ratio", [1.0, 1.5])
def test_mechanism_audit_flags_gaussian_noise_of_two_thirds_its_claim(ratio):
    """The design point on a few seeds: a Gaussian mechanism drawing 1/1.5 of the noise its dp_event declares is
    flagged, the calibrated one is not (tests/test_audit_power.py measures the rates over many seeds)."""
    def gaussian(r):
        mech = M.GaussianMechanism(1.0, 1.0, 0.01)
        mech.sigma /= r
        return mech

    for seed in range(5):
        result = A.audit_mechanism(A.Declared(gaussian(1.0), gaussian(ratio)), np.zeros(3), alpha=1e-3, seed=seed)
        _record(f"gaussian noise 1/{ratio:g}, seed {seed}", result)
        assert result.flagged == (ratio > 1), result
        assert result.result.mu_lower <= 1.0 / gaussian(ratio).sigma      # a lower bound on the true mu


def test_mechanism_audit_bound_stays_below_the_truth_for_pure_dp():
    """Randomized response at its claim: the event bound is below eps (valid) and close to it (tight)."""
    result = A.audit_mechanism(M.RandomizedResponse(1.0), np.zeros(4), alpha=1e-3, seed=0)
    assert not result.flagged and 0.8 < result.result.eps_lower <= 1.0
