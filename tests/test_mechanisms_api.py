"""API smoke tests: every exported mechanism constructs, runs, and reports its guarantee."""

import numpy as np
import pytest

import ldpfed.mechanisms as M
from ldpfed.util.errors import ConfigError


def test_exports_exist():
    for name in ["Guarantee", "gaussian_sigma", "GaussianMechanism", "SymmetricGaussianMechanism",
                 "LaplaceMechanism", "l2_ball_radius", "L2BallMechanism", "RandomizedResponse", "TreeNoise",
                 "TreeMechanism", "WishartMechanism", "AboveNoisyThreshold"]:
        assert hasattr(M, name), name


def test_smoke_all():
    rng = np.random.default_rng(0)
    g = M.GaussianMechanism(1.0, 1.0, 1e-5)
    assert g.privatize(np.zeros((3, 4)), rng).shape == (3, 4)
    assert g.guarantee.as_dict()["mechanism"] == "gaussian"
    s = M.SymmetricGaussianMechanism(1.0, 1.0, 1e-5)
    out = s.privatize(np.zeros((5, 3, 3)), rng)
    assert np.array_equal(out, np.swapaxes(out, -1, -2))
    assert M.LaplaceMechanism(2.0, 0.5).b == 4.0
    z, n_clip = M.L2BallMechanism(1.0, 1.0, 3).privatize_counted(np.array([[2.0, 0, 0], [0.1, 0, 0]]), rng)
    assert n_clip == 1 and z.shape == (2, 3)
    rr = M.RandomizedResponse(1.0)
    assert set(np.unique(rr.privatize(np.array([0, 1, 1, 0]), rng))) <= {0, 1}
    tm = M.TreeMechanism(8, (2,), eps=1.0, delta=1e-5, sensitivity=1.0)
    for _ in range(8):
        tm.add(np.ones(2), rng)
    with pytest.raises(ConfigError):
        tm.add(np.ones(2), rng)
    w = M.WishartMechanism(3, 1.0, 1e-5)
    assert np.linalg.eigvalsh(w.privatize(np.zeros((3, 3)), rng)).min() >= 0
    idx = M.AboveNoisyThreshold(0.0, 1.0, max_positives=2).select(np.array([-100.0, 100.0, 100.0, 100.0]), rng)
    assert idx.tolist() == [1, 2]
