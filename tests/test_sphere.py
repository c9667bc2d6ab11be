"""The compiled normals (ldpfed/util/normals.py: the GLM envs' contexts, ldpfed/envs/sphere.py, and the local
randomizers' noise): right generator, right law, deterministic.

Statistical checks use fixed seeds; each is a test at level 1e-3 (KS or chi-square p-value, or a count within
4.5 standard deviations: two-sided level ~7e-6), so a correct sampler fails with probability < 1%.
"""
import numpy as np
from scipy import stats

from ldpfed.envs.sphere import sphere_points
from ldpfed.util.normals import R as _R, _xoshiro_words, normal_array, standard_normals

MASK = (1 << 64) - 1


def xoshiro256pp_reference(state, n):
    """xoshiro256++ as published (Blackman & Vigna, xoshiro256plusplus.c), in Python integers."""
    s = [int(v) for v in state]
    rotl = lambda x, k: ((x << k) | (x >> (64 - k))) & MASK  # noqa: E731
    out = []
    for _ in range(n):
        out.append((rotl((s[0] + s[3]) & MASK, 23) + s[0]) & MASK)
        t = (s[1] << 17) & MASK
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
    return out, s


def test_generator_is_xoshiro256pp():
    for state in ([1, 2, 3, 4], np.random.default_rng(0).bit_generator.random_raw(4).tolist()):
        st = np.array(state, dtype=np.uint64)
        words = np.empty(1000, dtype=np.uint64)
        _xoshiro_words(st, words)
        expected, final = xoshiro256pp_reference(state, 1000)
        assert words.tolist() == expected
        assert st.tolist() == final           # the state is carried over exactly


def test_normals_are_standard_normal_including_the_tail():
    z = standard_normals(np.random.default_rng(11), 2_000_000)
    assert stats.kstest(z, "norm").pvalue > 1e-3
    # fine structure: 512 equiprobable bins (a wrong ziggurat layer or wedge moves the mass of a few bins, which
    # the KS statistic can miss); chi-square with 511 degrees of freedom
    counts = np.bincount(np.minimum((stats.norm.cdf(z) * 512).astype(int), 511), minlength=512)
    assert stats.chisquare(counts).pvalue > 1e-3
    # the ziggurat's tail branch (beyond R) and the wedges must carry exactly the normal's mass
    for cut in (_R, 2.0, 4.0):
        p = 2 * stats.norm.sf(cut)
        count = np.count_nonzero(np.abs(z) > cut)
        assert abs(count - p * len(z)) <= 4.5 * np.sqrt(len(z) * p * (1 - p)) + 1, cut
    assert np.all(np.isfinite(z)) and z.min() < -4.5 and z.max() > 4.5
    # consecutive draws are uncorrelated (lag-1 sample correlation ~ N(0, 1/n))
    assert abs(np.corrcoef(z[:-1], z[1:])[0, 1]) <= 4.5 / np.sqrt(len(z))
    # power: the same KS test rejects a slightly wrong scale (std 1.01)
    assert stats.kstest(z * 1.01, "norm").pvalue < 1e-3


def test_sphere_points_are_uniform_on_the_sphere():
    d = 10
    x = sphere_points(np.random.default_rng(12), (20_000, 5), d)
    assert x.shape == (20_000, 5, d)
    np.testing.assert_allclose(np.linalg.norm(x, axis=-1), 1.0, rtol=0, atol=4e-16)
    # a coordinate of a uniform point: x_1^2 ~ Beta(1/2, (d-1)/2); and the sign is a fair coin
    first = x[..., 0].ravel()
    assert stats.kstest(first ** 2, stats.beta(0.5, (d - 1) / 2).cdf).pvalue > 1e-3
    n = first.size
    assert abs(np.count_nonzero(first > 0) - n / 2) <= 4.5 * np.sqrt(n / 4)
    # directions are not biased towards any axis: the mean point is ~0 (each coordinate has variance 1/d)
    assert np.all(np.abs(x.reshape(-1, d).mean(axis=0)) <= 4.5 * np.sqrt(1 / d / n))


def test_calls_on_one_generator_are_independent():
    # each call seeds from 4 fresh words of the Generator: two calls give unrelated points (the inner product of
    # two independent uniform points of S^{d-1} has mean 0 and variance 1/d)
    rng, d, n = np.random.default_rng(13), 5, 50_000
    a, b = sphere_points(rng, n, d), sphere_points(rng, n, d)
    dots = np.einsum("ij,ij->i", a, b)
    assert abs(dots.mean()) <= 4.5 * np.sqrt(1 / d / n)


def test_same_generator_state_same_points_and_four_words_per_call():
    a = sphere_points(np.random.default_rng(3), 50, 4)
    b = sphere_points(np.random.default_rng(3), 50, 4)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, sphere_points(np.random.default_rng(4), 50, 4))
    # a call takes exactly 4 words of the Generator, whatever its size: the run's other draws do not move
    for size in (0, 1, 10_000):
        rng, ref = np.random.default_rng(5), np.random.default_rng(5)
        sphere_points(rng, size, 3)
        ref.bit_generator.random_raw(4)
        assert rng.random() == ref.random()
    assert sphere_points(np.random.default_rng(7), 1, 3).shape == (1, 3)
    assert sphere_points(np.random.default_rng(7), (0, 4), 3).shape == (0, 4, 3)

