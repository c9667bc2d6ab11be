"""Exact calibration values of every mechanism."""

import math

import numpy as np
import pytest
from scipy import integrate, special, stats

import ldpfed.mechanisms as M


# ---------------------------------------------------------------- l2-ball radius B
@pytest.mark.parametrize("dim, expected, tol", [(1, 2.1640, 5e-5), (5, 5.7705, 5e-5), (10, 8.365, 5e-4),
                                                (50, 19.08, 5e-3)])
def test_l2_ball_radius_check_values(dim, expected, tol):
    assert M.l2_ball_radius(1.0, 1.0, dim) == pytest.approx(expected, abs=tol)


def test_l2_ball_radius_closed_forms():
    # d = 1: B = R coth(eps/2); d = 2: B = R coth(eps/2) pi/2; linear in R
    for eps in (0.1, 0.5, 1.0, 3.0):
        assert M.l2_ball_radius(1.0, eps, 1) == pytest.approx(1 / math.tanh(eps / 2), rel=1e-13)
        assert M.l2_ball_radius(1.0, eps, 2) == pytest.approx(math.pi / 2 / math.tanh(eps / 2), rel=1e-13)
        assert M.l2_ball_radius(2.5, eps, 7) == pytest.approx(2.5 * M.l2_ball_radius(1.0, eps, 7), rel=1e-13)
    # the second closed form of the calibration with the plain Gamma ratio, where it does not overflow yet
    for d in (3, 10, 100, 300):
        e = 1.0
        plain = (math.exp(e) + 1) / (math.exp(e) - 1) * math.sqrt(math.pi) / 2 * d * math.gamma((d + 1) / 2) / math.gamma(d / 2 + 1)
        assert M.l2_ball_radius(1.0, e, d) == pytest.approx(plain, rel=1e-12)


def test_l2_ball_radius_stable_at_d1000():
    with np.errstate(all="raise"):
        B = M.l2_ball_radius(1.0, 1.0, 1000)
    assert math.isfinite(B)
    d = 1000  # Gamma((d+1)/2)/Gamma(d/2) = sqrt(d/2) (1 - 1/(4d) + 1/(32 d^2) + O(d^-3))
    approx = math.sqrt(math.pi) / math.tanh(0.5) * math.sqrt(d / 2) * (1 - 1 / (4 * d) + 1 / (32 * d * d))
    assert B == pytest.approx(approx, rel=1e-8)
    mech = M.L2BallMechanism(1.0, 1.0, 1000)
    z = mech.privatize(np.full((4, 1000), 0.01), np.random.default_rng(0))
    assert np.allclose(np.linalg.norm(z, axis=1), B, rtol=1e-12)


# ---------------------------------------------------------------- Gaussian
def test_classic_sigma_value():
    assert M.gaussian_sigma(1.0, 1.0, 1e-5) == pytest.approx(math.sqrt(2 * math.log(1.25e5)), rel=1e-14)
    assert M.gaussian_sigma(1.0, 1.0, 1e-5) == pytest.approx(4.8448, abs=1e-4)
    assert M.gaussian_sigma(2.0, 0.5, 0.01) == pytest.approx(2 * math.sqrt(2 * math.log(125)) / 0.5, rel=1e-14)
    assert M.GaussianMechanism(2.0, 0.5, 0.01).sigma == M.gaussian_sigma(2.0, 0.5, 0.01)


def _delta_by_integration(eps, sigma):
    """delta(eps) = integral of max(0, p(x) - e^eps q(x)), p = N(1, s^2), q = N(0, s^2) (sensitivity 1)."""
    x0 = eps * sigma**2 + 0.5  # p > e^eps q  <=>  x > x0
    f = lambda x: stats.norm.pdf(x, 1.0, sigma) - math.exp(eps) * stats.norm.pdf(x, 0.0, sigma)  # noqa: E731
    return integrate.quad(f, x0, x0 + 60 * sigma, epsabs=1e-15, epsrel=1e-10, limit=400)[0]


@pytest.mark.parametrize("eps, delta", [(1.0, 1e-5), (0.5, 1e-3), (0.1, 1e-6), (3.0, 1e-5), (10.0, 1e-8)])
def test_analytic_sigma_satisfies_exact_delta(eps, delta):
    s = M.gaussian_sigma(1.0, eps, delta, "analytic")
    assert M.analytic_delta(eps, s) == pytest.approx(delta, rel=1e-9)
    assert _delta_by_integration(eps, s) == pytest.approx(delta, rel=1e-6)
    assert M.analytic_delta(eps, s * (1 - 1e-6)) > delta  # it is the smallest such sigma
    assert M.gaussian_sigma(3.0, eps, delta, "analytic") == pytest.approx(3 * s, rel=1e-12)


def test_analytic_smaller_than_classic():
    for delta in (1e-2, 1e-5, 1e-9):
        assert M.gaussian_sigma(1.0, 1.0, delta, "analytic") < M.gaussian_sigma(1.0, 1.0, delta)
    assert M.gaussian_sigma(1.0, 1.0, 1e-5, "analytic") == pytest.approx(3.7306, abs=1e-4)


# ---------------------------------------------------------------- Laplace, randomized response
def test_laplace_scale():
    m = M.LaplaceMechanism(3.0, 0.5)
    assert m.b == 6.0
    assert m.guarantee.as_dict() == dict(mechanism="laplace", model="ldp", eps=0.5, delta=0.0, sensitivity=3.0,
                                         norm="l1")


def test_randomized_response_probabilities():
    rr = M.RandomizedResponse(1.0)
    assert rr.p_keep == pytest.approx(math.e / (1 + math.e), rel=1e-15)
    assert rr.feedback_mean(0.0) == pytest.approx(1 / (1 + math.e), rel=1e-15)
    assert rr.feedback_mean(1.0) == pytest.approx(rr.p_keep, rel=1e-15)
    mu = np.linspace(0, 1, 11)
    np.testing.assert_allclose(rr.debias(rr.feedback_mean(mu)), mu, atol=1e-14)
    with np.errstate(all="raise"):  # large eps must not overflow
        big = M.RandomizedResponse(1000.0)
    assert big.p_keep == 1.0 and big.feedback_mean(0.25) == pytest.approx(0.25)


# ---------------------------------------------------------------- tree, Wishart, sparse vector
@pytest.mark.parametrize("horizon, depth", [(1, 1), (2, 2), (3, 2), (4, 3), (7, 3), (8, 4), (1000, 10), (2**20, 21)])
def test_tree_depth(horizon, depth):
    assert M.tree_depth(horizon) == depth == math.floor(math.log2(horizon)) + 1
    assert M.TreeNoise(horizon, (2,), node_scale=1.0).depth == depth


def test_tree_node_scales():
    T = 1000
    g = M.TreeMechanism(T, (3,), eps=0.5, delta=1e-4, sensitivity=2.0)
    assert g.depth == 10
    assert g.node_scale == pytest.approx(math.sqrt(10) * M.gaussian_sigma(2.0, 0.5, 1e-4), rel=1e-14)
    assert g.guarantee.mechanism == "tree-gaussian" and g.guarantee.norm == "l2" and g.guarantee.model == "central"
    ga = M.TreeMechanism(T, (3,), eps=0.5, delta=1e-4, sensitivity=2.0, calibration="analytic")
    assert ga.node_scale == pytest.approx(math.sqrt(10) * M.gaussian_sigma(2.0, 0.5, 1e-4, "analytic"), rel=1e-14)
    lap = M.TreeMechanism(T, (3,), eps=0.5, sensitivity=2.0, noise="laplace")
    assert lap.node_scale == pytest.approx(10 * 2.0 / 0.5)
    assert lap.guarantee.delta == 0.0 and lap.guarantee.norm == "l1" and lap.guarantee.mechanism == "tree-laplace"
    # not the (eps/L, delta/L) split, which is several times noisier
    split = M.gaussian_sigma(2.0, 0.5 / 10, 1e-4 / 10)
    assert split / g.node_scale > 3


def test_wishart_degrees_of_freedom():
    w = M.WishartMechanism(3, 1.0, 1e-5)
    assert w.k == math.floor(3 + 1 + 28 * math.log(4 / 1e-5)) == 365
    w2 = M.WishartMechanism(10, 0.5, 0.1, sensitivity=2.0)
    assert w2.k == math.floor(11 + 28 * math.log(40) / 0.25)
    s = w2.sample(np.random.default_rng(1))
    assert np.array_equal(s, s.T) and np.linalg.eigvalsh(s).min() > 0
    # mean of Wishart(k, c^2 I) is k c^2 I
    rng = np.random.default_rng(2)
    mean = np.mean([M.WishartMechanism(2, 1.0, 0.1, sensitivity=0.5).sample(rng) for _ in range(400)], axis=0)
    k = M.WishartMechanism(2, 1.0, 0.1).k
    np.testing.assert_allclose(mean, k * 0.25 * np.eye(2), atol=6 * 0.25 * math.sqrt(2 * k / 400))


@pytest.mark.parametrize("eps", [1.0, 0.05])  # k = 365 (Gram of k draws) and k ~ 1.4e5 (Bartlett)
def test_wishart_sample_moments(eps):
    """E[W] = k s^2 I, Var(W_ii) = 2 k s^4, Var(W_ij) = k s^4 (i != j), for both sampling paths."""
    from ldpfed.mechanisms import wishart

    d, s, n = 3, 0.5, 4000
    mech = M.WishartMechanism(d, eps, 1e-5, sensitivity=s)
    assert (mech.k > wishart.BARTLETT_K) == (eps < 1)
    rng = np.random.default_rng(31)
    W = np.array([mech.sample(rng) for _ in range(n)]) / (mech.k * s**2)
    k = mech.k
    np.testing.assert_allclose(W.mean(axis=0), np.eye(d), atol=6 * math.sqrt(2 / (k * n)))
    var = W.var(axis=0) * k  # -> 2 on the diagonal, 1 off it
    np.testing.assert_allclose(var, 1 + np.eye(d), rtol=6 * math.sqrt(2 / n) * 1.5)
    assert min(np.linalg.eigvalsh(w).min() for w in W[:50]) > 0


def test_sparse_vector_default_scales():
    a = M.AboveNoisyThreshold(1.0, 0.5, sensitivity=2.0, max_positives=3)
    assert a.threshold_scale == pytest.approx(2 * 3 * 2.0 / 0.5)
    assert a.value_scale == pytest.approx(2 * a.threshold_scale)
    assert a.guarantee.delta == 0.0 and a.guarantee.mechanism == "sparse-vector"
    b = M.AboveNoisyThreshold(1.0, 0.5, max_positives=4, delta=1e-6)
    assert b.threshold_scale == pytest.approx(math.sqrt(32 * 4 * math.log(1e6)) / 0.5)
    assert b.guarantee.delta == 1e-6
    # explicit scales: accepted when at least as noisy as the budget requires
    c = M.AboveNoisyThreshold(0.0, 1.0, threshold_scale=4.0, value_scale=8.0)
    assert (c.threshold_scale, c.value_scale) == (4.0, 8.0)


def test_guarantee_as_dict_and_frozen():
    g = M.GaussianMechanism(1.0, 1.0, 1e-5, model="central").guarantee
    assert g.as_dict() == dict(mechanism="gaussian", model="central", eps=1.0, delta=1e-5, sensitivity=1.0,
                               norm="l2")
    with pytest.raises(Exception):
        g.eps = 2.0
    assert M.SymmetricGaussianMechanism(1.0, 1.0, 1e-5).guarantee.mechanism == "symmetric-gaussian"
    assert M.L2BallMechanism(2.0, 1.0, 3).guarantee.as_dict() == dict(
        mechanism="l2-ball", model="ldp", eps=1.0, delta=0.0, sensitivity=2.0, norm="l2")
    assert M.RandomizedResponse(0.5).guarantee.norm == "none"
    assert M.WishartMechanism(3, 1.0, 1e-5).guarantee.model == "central"


def test_special_functions_agree():
    # expit used for p_keep equals the textbook e^eps/(1+e^eps) where the latter does not overflow
    for e in (0.01, 1.0, 20.0):
        assert special.expit(e) == pytest.approx(math.exp(e) / (1 + math.exp(e)), rel=1e-15)
