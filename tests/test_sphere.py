"""The compiled sampler of the GLM envs' contexts (ldpfed/envs/sphere.py): right law, deterministic.

Statistical checks use fixed seeds; each is a test at level 1e-3 (KS p-value, or a binomial count within
4.5 standard deviations: two-sided level ~7e-6), so a correct sampler fails with probability < 1%.
"""
import numpy as np
from scipy import stats

from ldpfed.envs import sphere
from ldpfed.envs.sphere import _R, _ZR, _ZX, _fill_normals, sphere_points, standard_normals


def test_normals_are_standard_normal_including_the_tail():
    z = standard_normals(np.random.default_rng(11), 400_000)
    assert stats.kstest(z, "norm").pvalue > 1e-3
    # the ziggurat's tail branch (beyond R) and the wedges must carry exactly the normal's mass
    for cut in (_R, 2.0, 4.0):
        p = 2 * stats.norm.sf(cut)
        count = np.count_nonzero(np.abs(z) > cut)
        assert abs(count - p * len(z)) <= 4.5 * np.sqrt(len(z) * p * (1 - p)) + 1, cut
    assert np.all(np.isfinite(z)) and z.min() < -4 and z.max() > 4
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


def test_same_generator_same_points_and_refills_continue_the_stream():
    a = sphere_points(np.random.default_rng(3), 50, 4)
    b = sphere_points(np.random.default_rng(3), 50, 4)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, sphere_points(np.random.default_rng(4), 50, 4))
    # when the words run out, the draws done so far are exactly the first ones of a longer supply
    words = np.random.default_rng(5).bit_generator.random_raw(200)
    full, part = np.empty(150), np.empty(150)
    k_full = _fill_normals(words, full, 0, _ZX, _ZR, _R)
    k_part = _fill_normals(words[:60], part, 0, _ZX, _ZR, _R)
    assert 0 < k_part < 60 <= k_full and np.array_equal(part[:k_part], full[:k_part])
    # and standard_normals refills until it has them all
    assert np.all(np.isfinite(standard_normals(np.random.default_rng(6), 10_000)))
    assert sphere.sphere_points(np.random.default_rng(7), 1, 3).shape == (1, 3)
