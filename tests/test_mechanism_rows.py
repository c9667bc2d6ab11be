"""The compiled rows (ldpfed.mechanisms.rows) give the mechanisms' own batched outputs, bit for bit, from the same
Generator state: one user's fields compiled per layout (FieldLayout.row_privatizer) against privatize."""
import numpy as np
import pytest
from numba import njit

from ldpfed.mechanisms import GaussianMechanism, L2BallMechanism, SymmetricGaussianMechanism
from ldpfed.mechanisms.rows import FieldLayout
from ldpfed.util.jit import inlined


def _same_as_batched(mechanism, shape, n=257, seed=5, symmetric=False):
    layout = FieldLayout({"f": (shape, mechanism)})
    data = np.random.default_rng(seed + 1).standard_normal((n, *shape))
    if symmetric:
        data = data + np.swapaxes(data, -1, -2)
    rows = layout.privatize(data.reshape(n, -1), layout.draw(np.random.default_rng(seed), n))
    return rows.reshape(n, *shape), data


@pytest.mark.parametrize("d", [1, 2, 3, 10])
def test_symmetric_gaussian_rows_are_the_batched_outputs(d):
    mech = SymmetricGaussianMechanism(1.0, 0.5, 1e-3)
    for shape in ((d, d), (3, d, d)):
        rows, data = _same_as_batched(mech, shape, symmetric=True)
        expected = mech.privatize(data, np.random.default_rng(5))
        assert np.array_equal(rows, expected)
        assert np.array_equal(rows, np.swapaxes(rows, -1, -2))      # symmetric data, symmetric noise
        assert not np.array_equal(rows, data)


@pytest.mark.parametrize("dim, rows_per_user", [(2, 1), (10, 1), (3, 4)])
def test_l2_ball_rows_are_the_batched_outputs(dim, rows_per_user):
    mech = L2BallMechanism(1.5, 1.0, dim)
    shape = (dim,) if rows_per_user == 1 else (rows_per_user, dim)
    rows, data = _same_as_batched(mech, shape)
    expected = mech.privatize(data.reshape(-1, dim), np.random.default_rng(5))
    assert np.array_equal(rows.reshape(-1, dim), expected)


def test_two_fields_in_one_row():
    mech_M, mech_u = SymmetricGaussianMechanism(1.0, 0.5, 1e-3), GaussianMechanism(2.0, 0.5, 1e-3)
    layout = FieldLayout({"M": ((4, 4), mech_M), "u": ((4,), mech_u)})
    n = 33
    data = np.random.default_rng(1).standard_normal((n, layout.width))
    rows = layout.privatize(data, layout.draw(np.random.default_rng(2), n))
    rng = np.random.default_rng(2)      # the layout draws field by field, in declaration order
    expected_M = mech_M.privatize(data[:, :16].reshape(n, 4, 4), rng)
    expected_u = mech_u.privatize(data[:, 16:], rng)
    assert np.array_equal(rows[:, :16].reshape(n, 4, 4), expected_M)
    assert np.array_equal(rows[:, 16:], expected_u)


@njit(cache=True)
def _helper(x):
    return 2.0 * x


@njit(cache=True)
def _step(x):
    return _helper(x) + 1.0


def test_inlined_copies_inline_the_helpers_they_call():
    copy = inlined(_step)
    assert copy.py_func.__globals__["_helper"] is inlined(_helper)
    assert copy.targetoptions["inline"] == "always" and inlined(_helper).targetoptions["inline"] == "always"
    assert _step.py_func.__globals__["_helper"] is _helper       # the module's own name is left alone
    assert copy(3.0) == _step(3.0) == 7.0
