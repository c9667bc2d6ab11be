"""Bad input raises ConfigError naming the parameter (and showing its value)."""

import math

import numpy as np
import pytest

import ldpfed.mechanisms as M
from ldpfed.util.errors import ConfigError

RNG = np.random.default_rng(0)


def _raises(field, fn, *args, **kwargs):
    with pytest.raises(ConfigError) as info:
        fn(*args, **kwargs)
    assert info.value.field == field, (info.value.field, field)
    assert field in str(info.value)
    return info.value


BAD_EPS = [0.0, -1.0, math.inf, math.nan, "1", None, True]
BAD_DELTA = [0.0, 1.0, -0.1, 1.5, math.nan]


@pytest.mark.parametrize("eps", BAD_EPS)
def test_bad_eps_everywhere(eps):
    _raises("eps", M.gaussian_sigma, 1.0, eps, 1e-5)
    _raises("eps", M.GaussianMechanism, 1.0, eps, 1e-5)
    _raises("eps", M.SymmetricGaussianMechanism, 1.0, eps, 1e-5)
    _raises("eps", M.LaplaceMechanism, 1.0, eps)
    _raises("eps", M.l2_ball_radius, 1.0, eps, 3)
    _raises("eps", M.L2BallMechanism, 1.0, eps, 3)
    _raises("eps", M.RandomizedResponse, eps)
    _raises("eps", M.TreeMechanism, 8, (2,), eps=eps, delta=1e-5, sensitivity=1.0)
    _raises("eps", M.WishartMechanism, 3, eps, 1e-5)
    _raises("eps", M.AboveNoisyThreshold, 0.0, eps)


@pytest.mark.parametrize("delta", BAD_DELTA)
def test_bad_delta_where_needed(delta):
    e = _raises("delta", M.gaussian_sigma, 1.0, 1.0, delta)
    assert repr(delta) in str(e) or "nan" in str(e)
    _raises("delta", M.GaussianMechanism, 1.0, 1.0, delta)
    _raises("delta", M.SymmetricGaussianMechanism, 1.0, 1.0, delta)
    _raises("delta", M.TreeMechanism, 8, (2,), eps=1.0, delta=delta, sensitivity=1.0)
    _raises("delta", M.WishartMechanism, 3, 1.0, delta)


def test_tree_delta_rules():
    _raises("delta", M.TreeMechanism, 8, (2,), eps=1.0, sensitivity=1.0)  # gaussian needs delta (default 0.0)
    _raises("delta", M.TreeMechanism, 8, (2,), eps=1.0, delta=0.1, sensitivity=1.0, noise="laplace")


@pytest.mark.parametrize("bad", [0.0, -2.0, math.inf, math.nan])
def test_bad_sensitivity_radius_scale(bad):
    _raises("sensitivity", M.gaussian_sigma, bad, 1.0, 1e-5)
    _raises("sensitivity", M.LaplaceMechanism, bad, 1.0)
    _raises("sensitivity", M.TreeMechanism, 8, (2,), eps=1.0, delta=1e-5, sensitivity=bad)
    _raises("sensitivity", M.WishartMechanism, 3, 1.0, 1e-5, sensitivity=bad)
    _raises("sensitivity", M.AboveNoisyThreshold, 0.0, 1.0, sensitivity=bad)
    _raises("radius", M.l2_ball_radius, bad, 1.0, 3)
    _raises("radius", M.L2BallMechanism, bad, 1.0, 3)
    _raises("node_scale", M.TreeNoise, 8, (2,), node_scale=bad)
    _raises("node_scale", M.TreeNoise(8, (2,), node_scale=1.0).step, RNG, node_scale=bad)
    _raises("threshold_scale", M.AboveNoisyThreshold, 0.0, 1.0, threshold_scale=bad)
    _raises("value_scale", M.AboveNoisyThreshold, 0.0, 1.0, value_scale=bad)


def test_bad_integers_and_options():
    for bad in (0, -1, 2.5, "3", True):
        _raises("dim", M.l2_ball_radius, 1.0, 1.0, bad)
        _raises("dim", M.WishartMechanism, bad, 1.0, 1e-5)
        _raises("horizon", M.TreeNoise, bad, (2,), node_scale=1.0)
        _raises("max_positives", M.AboveNoisyThreshold, 0.0, 1.0, max_positives=bad)
    _raises("calibration", M.gaussian_sigma, 1.0, 1.0, 1e-5, calibration="exact")
    _raises("model", M.GaussianMechanism, 1.0, 1.0, 1e-5, model="local")
    _raises("model", M.RandomizedResponse, 1.0, model="LDP")
    _raises("noise", M.TreeNoise, 8, (2,), noise="cauchy", node_scale=1.0)
    _raises("noise", M.TreeMechanism, 8, (2,), eps=1.0, sensitivity=1.0, noise="cauchy")
    _raises("shape", M.TreeNoise, 8, (2, 0), node_scale=1.0)
    _raises("shape", M.TreeNoise, 8, (2, 3), node_scale=1.0, symmetric=True)
    _raises("threshold", M.AboveNoisyThreshold, math.nan, 1.0)
    _raises("delta", M.AboveNoisyThreshold, 0.0, 1.0, delta=1.0)


def test_too_little_svt_noise_rejected():
    e = _raises("value_scale", M.AboveNoisyThreshold, 0.0, 1.0, threshold_scale=2.0, value_scale=2.0)
    assert "too little noise" in str(e)
    _raises("threshold_scale", M.AboveNoisyThreshold, 0.0, 1.0, max_positives=2, threshold_scale=2.0)


def test_bad_data():
    g = M.GaussianMechanism(1.0, 1.0, 1e-5)
    _raises("values", g.privatize, np.array([1.0, np.nan]), RNG)
    _raises("values", g.privatize, np.array([np.inf]), RNG)
    _raises("values", g.privatize, ["a", "b"], RNG)
    _raises("values", M.LaplaceMechanism(1.0, 1.0).privatize, [np.nan], RNG)
    s = M.SymmetricGaussianMechanism(1.0, 1.0, 1e-5)
    _raises("mats.shape", s.privatize, np.zeros((3, 2)), RNG)
    _raises("mats.shape", s.privatize, np.zeros(3), RNG)
    _raises("mats", s.privatize, np.full((2, 2), np.nan), RNG)
    _raises("d", s.noise, (2,), 0, RNG)
    l2 = M.L2BallMechanism(1.0, 1.0, 3)
    _raises("g.shape", l2.privatize, np.zeros(3), RNG)
    _raises("g.shape", l2.privatize, np.zeros((4, 2)), RNG)
    _raises("g", l2.privatize, np.array([[0.0, np.nan, 0.0]]), RNG)
    rr = M.RandomizedResponse(1.0)
    _raises("bits", rr.privatize, np.array([0, 2]), RNG)
    _raises("bits", rr.privatize, np.array([0.5]), RNG)
    _raises("bits", rr.privatize, np.array(["1"]), RNG)
    _raises("bits", rr.privatize, np.array([np.nan]), RNG)
    tm = M.TreeMechanism(4, (2,), eps=1.0, delta=1e-5, sensitivity=1.0)
    _raises("x.shape", tm.add, np.zeros(3), RNG)
    _raises("x", tm.add, np.array([0.0, np.inf]), RNG)
    assert tm.t == 0  # rejected input does not advance the stream
    w = M.WishartMechanism(3, 1.0, 1e-5)
    _raises("gram.shape", w.privatize, np.zeros((2, 2)), RNG)
    _raises("gram", w.privatize, np.full((3, 3), np.nan), RNG)
    svt = M.AboveNoisyThreshold(0.0, 1.0)
    _raises("values.ndim", svt.select, np.zeros((2, 2)), RNG)
    _raises("values", svt.select, np.array([np.nan]), RNG)


def test_error_message_shows_value_compactly():
    e = _raises("values", M.GaussianMechanism(1.0, 1.0, 1e-5).privatize, np.full((1000, 1000), np.nan), RNG)
    assert len(str(e)) < 300 and "shape=(1000, 1000)" in str(e)
