"""Distributional properties: unbiasedness, variances, symmetry, tree noise structure. Bounds are z-tests at 5
standard errors computed from the KNOWN variances, so a pass is not a matter of seed luck."""

import math

import numpy as np
import pytest

import ldpfed.mechanisms as M
from ldpfed.util.errors import ConfigError

ZMAX = 5.0


def _inputs(dim, R, rng):
    g = rng.standard_normal(dim)
    return {
        "interior": 0.6 * R * g / np.linalg.norm(g),
        "boundary": R * g / np.linalg.norm(g),
        "zero": np.zeros(dim),
    }


# ---------------------------------------------------------------- l2-ball
@pytest.mark.parametrize("dim, n", [(1, 400_000), (2, 1_000_000), (5, 1_000_000), (50, 200_000)])
def test_l2_ball_unbiased_and_on_sphere(dim, n):
    R, eps = 1.0, 1.0
    mech = M.L2BallMechanism(R, eps, dim)
    rng = np.random.default_rng([7, dim])
    for name, g in _inputs(dim, R, rng).items():
        z, clipped = mech.privatize_counted(np.broadcast_to(g, (n, dim)), rng)
        assert clipped == 0, name
        np.testing.assert_allclose(np.linalg.norm(z, axis=1), mech.output_radius, rtol=1e-12)
        se = mech.output_radius / math.sqrt(dim * n)  # per-coordinate variance of Z is B^2/d - g_i^2 <= B^2/d
        dev = np.abs(z.mean(axis=0) - g) / se
        assert dev.max() < ZMAX, (name, dev.max())
        # second moment: v is uniform on a half-sphere, E[v v^T] = I/d, so E[Z Z^T] = B^2 I / d
        if dim <= 5:
            second = z.T @ z / n / (mech.output_radius**2 / dim)
            np.testing.assert_allclose(second, np.eye(dim), atol=ZMAX * math.sqrt(2 / n) * 2)


def test_l2_ball_clipping_counted_and_unbiased_for_clipped_input():
    R, dim, n = 2.0, 3, 400_000
    mech = M.L2BallMechanism(R, 1.0, dim)
    rng = np.random.default_rng(11)
    g = np.array([3.0, 4.0, 0.0])  # norm 5 > R
    unit = rng.standard_normal((5, dim))
    unit = R * unit / np.linalg.norm(unit, axis=1, keepdims=True)  # exactly on the sphere (up to rounding)
    batch = np.vstack([np.broadcast_to(g, (n, dim)), unit, 0.5 * unit])
    z, clipped = mech.privatize_counted(batch, rng)
    assert clipped == n  # the norm-5 rows; rows of norm R (rounding) and R/2 are not counted
    target = g * R / 5.0
    se = mech.output_radius / math.sqrt(dim * n)
    assert np.abs(z[:n].mean(axis=0) - target).max() < ZMAX * se


def test_l2_ball_input_not_modified_and_shapes():
    mech = M.L2BallMechanism(1.0, 0.5, 4)
    g = np.full((3, 4), 2.0)
    before = g.copy()
    z, c = mech.privatize_counted(g, np.random.default_rng(0))
    assert np.array_equal(g, before) and z.shape == (3, 4) and z.dtype == np.float64 and c == 3
    z0, c0 = mech.privatize_counted(np.zeros((0, 4)), np.random.default_rng(0))
    assert z0.shape == (0, 4) and c0 == 0


# ---------------------------------------------------------------- randomized response
@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0])
def test_randomized_response_debias_unbiased(eps):
    rr = M.RandomizedResponse(eps)
    rng = np.random.default_rng([3, int(eps * 10)])
    n, mu = 1_000_000, 0.3
    bits = (rng.random(n) < mu).astype(int)
    reports = rr.privatize(bits, rng)
    m = reports.mean()
    q = rr.feedback_mean(mu)
    assert abs(m - q) < ZMAX * math.sqrt(q * (1 - q) / n)
    est = rr.debias(m)
    assert abs(est - mu) < ZMAX * math.sqrt(q * (1 - q) / n) / math.tanh(eps / 2)
    # per-bit keep probability
    kept = (reports == bits).mean()
    assert abs(kept - rr.p_keep) < ZMAX * math.sqrt(rr.p_keep * (1 - rr.p_keep) / n)
    # booleans accepted, output 0/1 ints of the same shape
    out = rr.privatize(np.array([[True, False], [False, True]]), rng)
    assert out.shape == (2, 2) and set(np.unique(out)) <= {0, 1} and np.issubdtype(out.dtype, np.integer)


# ---------------------------------------------------------------- Gaussian, Laplace, symmetric noise
def test_gaussian_and_laplace_noise_moments():
    rng = np.random.default_rng(5)
    n = 400_000
    g = M.GaussianMechanism(1.0, 1.0, 1e-5)
    x = np.tile([1.0, -2.0], (n, 1))
    y = g.privatize(x, rng) - x
    assert y.dtype == np.float64 and y.shape == x.shape
    assert np.abs(y.mean(axis=0)).max() < ZMAX * g.sigma / math.sqrt(n)
    assert np.abs(y.var(axis=0) / g.sigma**2 - 1).max() < ZMAX * math.sqrt(2 / n)
    lap = M.LaplaceMechanism(1.0, 0.5)
    w = lap.privatize(np.zeros(n), rng)
    assert abs(w.var() / (2 * lap.b**2) - 1) < ZMAX * math.sqrt(5 / n)  # var of the variance estimate: (mu4/sigma^4 - 1)/n = 5/n


def test_gaussian_mechanisms_noise_is_normal_in_law_including_the_tail():
    """The local randomizers' normals come from the compiled ziggurat (ldpfed.util.normals): the privacy guarantee is
    about the noise's whole law, its tail included, not only its moments. The noise / sigma of GaussianMechanism and
    of SymmetricGaussianMechanism's upper triangle: Kolmogorov-Smirnov against N(0, 1) at level 1e-3, the mass
    beyond 2, 3 and 4 sigma within 4.5 binomial standard deviations, no lag-1 correlation between consecutive draws
    (users x coordinates in C order); and power: the same KS test rejects noise 2% too small."""
    from scipy import stats

    rng = np.random.default_rng(21)
    g = M.GaussianMechanism(1.0, 1.0, 1e-5)
    sym = M.SymmetricGaussianMechanism(1.0, 1.0, 1e-5)
    d = 5
    iu = np.triu_indices(d)
    for z in ((g.privatize(np.zeros((200_000, 5)), rng) / g.sigma).ravel(),
              (sym.privatize_gram(np.zeros((100_000, d)), rng)[:, iu[0], iu[1]] / sym.sigma).ravel()):
        n = len(z)
        assert stats.kstest(z, "norm").pvalue > 1e-3
        for cut in (2.0, 3.0, 4.0):
            p = 2 * stats.norm.sf(cut)
            assert abs(np.count_nonzero(np.abs(z) > cut) - p * n) <= 4.5 * math.sqrt(n * p * (1 - p)) + 1, cut
        assert abs(np.corrcoef(z[:-1], z[1:])[0, 1]) <= 4.5 / math.sqrt(n)
        assert stats.kstest(z * 0.98, "norm").pvalue < 1e-3


def test_symmetric_noise_variances_not_halved():
    d, n = 4, 200_000
    mech = M.SymmetricGaussianMechanism(1.0, 1.0, 1e-5)
    rng = np.random.default_rng(9)
    N = mech.noise((n,), d, rng)
    assert N.shape == (n, d, d)
    assert np.array_equal(N, np.swapaxes(N, -1, -2))
    var = N.var(axis=0) / mech.sigma**2
    tol = ZMAX * math.sqrt(2 / n)
    assert np.abs(var - 1).max() < tol  # diagonal AND off-diagonal sigma^2 (not sigma^2/2)
    iu = np.triu_indices(d)
    upper = N[:, iu[0], iu[1]]
    corr = np.corrcoef(upper.T) - np.eye(len(iu[0]))
    assert np.abs(corr).max() < ZMAX / math.sqrt(n)  # upper-triangle entries independent
    # privatize adds that noise; batch prefix shapes
    m = np.broadcast_to(np.eye(d), (3, 2, d, d))
    out = mech.privatize(m, rng)
    assert out.shape == (3, 2, d, d) and np.array_equal(out, np.swapaxes(out, -1, -2))
    assert mech.noise((), 3, rng).shape == (3, 3)


def test_mechanisms_use_only_the_given_rng():
    x = np.ones((5, 3))
    for mech in (M.GaussianMechanism(1.0, 1.0, 1e-5), M.LaplaceMechanism(1.0, 1.0)):
        a = mech.privatize(x, np.random.default_rng(42))
        b = mech.privatize(x, np.random.default_rng(42))
        assert np.array_equal(a, b)
    l2 = M.L2BallMechanism(1.0, 1.0, 3)
    assert np.array_equal(l2.privatize(x * 0.1, np.random.default_rng(1)),
                          l2.privatize(x * 0.1, np.random.default_rng(1)))


# ---------------------------------------------------------------- tree
@pytest.mark.parametrize("noise, var_per_node", [("gaussian", lambda s: s**2), ("laplace", lambda s: 2 * s**2)])
def test_tree_prefix_variance_is_popcount_nodes(noise, var_per_node):
    T, n, s = 16, 200_000, 1.5
    tn = M.TreeNoise(T, (n,), noise=noise, node_scale=s)
    rng = np.random.default_rng(13)
    prefixes = np.array([tn.step(rng) for _ in range(T)])
    assert tn.t == T
    for t in (1, 2, 3, 5, 6, 7, 8, 11, 13, 15, 16):
        v = prefixes[t - 1].var()
        expected = bin(t).count("1") * var_per_node(s)
        kurt = 3.0 if noise == "gaussian" else 3.0 + 3.0 / bin(t).count("1")  # sum of k Laplace: excess 3/k
        assert abs(v / expected - 1) < ZMAX * math.sqrt((kurt - 1) / n), (t, v, expected)
    # nodes are shared exactly where the dyadic decomposition says: prefix 3 = node[1,2] + node[3]; prefix 2 = node[1,2]
    c = np.cov(prefixes[1], prefixes[2])[0, 1]
    assert abs(c / var_per_node(s) - 1) < ZMAX * math.sqrt(4 / n)
    c = np.cov(prefixes[3], prefixes[4])[0, 1]  # prefix 4 = node[1..4], prefix 5 = node[1..4] + node[5]
    assert abs(c / var_per_node(s) - 1) < ZMAX * math.sqrt(4 / n)


def test_tree_node_scale_override_per_step():
    n = 200_000
    tn = M.TreeNoise(4, (n,), node_scale=1.0)
    rng = np.random.default_rng(17)
    tn.step(rng, node_scale=5.0)  # node [1]
    p2 = tn.step(rng, node_scale=2.0)  # node [1,2]
    p3 = tn.step(rng, node_scale=3.0)  # node [3]
    p4 = tn.step(rng)  # node [1..4] with the default scale
    for p, expected in ((p2, 4.0), (p3, 13.0), (p4, 1.0)):
        assert abs(p.var() / expected - 1) < ZMAX * math.sqrt(2 / n)


def test_tree_symmetric_nodes():
    d, n = 3, 100_000
    tn = M.TreeNoise(8, (d, d), node_scale=1.0, symmetric=True)
    rng = np.random.default_rng(19)
    out = tn.step(rng)
    assert out.shape == (d, d) and np.array_equal(out, out.T)
    # variances of a symmetric node: all entries 1 (vectorize over trials by a batch of independent trees)
    samples = np.array([M.TreeNoise(2, (d, d), node_scale=1.0, symmetric=True).step(rng) for _ in range(4000)])
    assert np.abs(samples.var(axis=0) - 1).max() < ZMAX * math.sqrt(2 / 4000)
    tm = M.TreeMechanism(8, (d, d), eps=1.0, delta=1e-5, sensitivity=1.0, symmetric=True)
    y = tm.add(np.eye(d), rng)
    assert np.array_equal(y, y.T)


def test_tree_noise_does_not_depend_on_data():
    T, shape = 13, (2, 3)
    rng_data = np.random.default_rng(23)
    s1, s2 = rng_data.standard_normal((T, *shape)), 100 * rng_data.standard_normal((T, *shape))
    for kw in (dict(delta=1e-5), dict(noise="laplace")):
        m1 = M.TreeMechanism(T, shape, eps=1.0, sensitivity=1.0, **kw)
        m2 = M.TreeMechanism(T, shape, eps=1.0, sensitivity=1.0, **kw)
        r1, r2 = np.random.default_rng(99), np.random.default_rng(99)
        y1 = np.array([m1.add(x, r1) for x in s1])
        y2 = np.array([m2.add(x, r2) for x in s2])
        n1, n2 = y1 - np.cumsum(s1, axis=0), y2 - np.cumsum(s2, axis=0)
        np.testing.assert_allclose(n1, n2, atol=1e-9)
        # and it equals the TreeNoise with the same rng and scale
        tn = M.TreeNoise(T, shape, noise=kw.get("noise", "gaussian"), node_scale=m1.node_scale)
        r3 = np.random.default_rng(99)
        np.testing.assert_allclose(n1, np.array([tn.step(r3) for _ in range(T)]), atol=1e-9)


# ---------------------------------------------------------------- sparse vector
def test_sparse_vector_selection_behaviour():
    rng = np.random.default_rng(29)
    a = M.AboveNoisyThreshold(0.0, 1.0, max_positives=2)
    q = np.array([-1e4, 1e4, -1e4, 1e4, 1e4])
    assert a.select(q, rng).tolist() == [1, 3]  # stops after 2 positives
    assert a.select(np.full(6, -1e4), rng).tolist() == []
    batch = a.select_batch(np.tile(q, (4, 1)), rng)
    assert batch.tolist() == [[1, 3]] * 4
    # a single noisy comparison: P(value 0 passes threshold 0) = 1/2 by symmetry of Lap - Lap
    one = M.AboveNoisyThreshold(0.0, 1.0)
    hits = one.select_batch(np.zeros((200_000, 1)), rng)[:, 0] == 0
    assert abs(hits.mean() - 0.5) < ZMAX * 0.5 / math.sqrt(200_000)


def test_privatize_gram_is_privatize_of_the_outer_product():
    # the same draws and the same values, bit for bit, for any batch prefix (the OLS clients' fast path)
    mech = M.SymmetricGaussianMechanism(math.sqrt(2.0), 1.0, 1e-3)
    x = np.random.default_rng(1).standard_normal((7, 3, 4))
    a = mech.privatize_gram(x, np.random.default_rng(2))
    b = mech.privatize(x[..., :, None] * x[..., None, :], np.random.default_rng(2))
    assert a.shape == (7, 3, 4, 4) and np.array_equal(a, b)
    assert np.array_equal(mech.privatize_gram(x[0, 0], np.random.default_rng(3)),
                          mech.privatize(np.outer(x[0, 0], x[0, 0]), np.random.default_rng(3)))
    with pytest.raises(ConfigError):
        mech.privatize_gram(np.array([[1e200, 0.0]]), np.random.default_rng(4))
    with pytest.raises(ConfigError):
        mech.privatize_gram(np.array([[np.nan, 0.0]]), np.random.default_rng(4))
