"""ldpfed.linalg: the Cholesky solve and inverse of the per-user server steps agree with numpy's LU to rounding,
and a matrix that is not positive definite goes to LU instead."""
import numpy as np
import pytest

from ldpfed.linalg import cholesky_lower, spd_inverse, spd_solve


def spd(rng, d, shift):
    X = rng.standard_normal((3 * d, d))
    return X.T @ X + shift * np.eye(d)


@pytest.mark.parametrize("d", [1, 2, 20, 25])
def test_solve_and_inverse_of_positive_definite_matrices(d):
    rng = np.random.default_rng(d)
    for shift in (1e-3, 1.0, 1e3):
        A, b = spd(rng, d, shift), rng.standard_normal(d)
        x = np.empty(d)
        spd_solve(A, b, x)
        scale = np.linalg.cond(A) * np.finfo(float).eps
        np.testing.assert_allclose(x, np.linalg.solve(A, b), rtol=0, atol=50 * scale * np.abs(x).max())
        inv = np.empty((d, d))
        spd_inverse(A, inv)
        assert np.array_equal(inv, inv.T)
        np.testing.assert_allclose(inv, np.linalg.inv(A), rtol=0, atol=50 * scale * np.abs(inv).max())
        L = np.zeros((d, d))
        assert cholesky_lower(A, L)
        np.testing.assert_allclose(np.tril(L) @ np.tril(L).T, A, rtol=0, atol=50 * np.finfo(float).eps * A.max())


def test_indefinite_matrices_go_to_numpys_lu():
    """A noisy Gram matrix that its shift does not dominate: Cholesky refuses it, numpy's LU solves it."""
    rng = np.random.default_rng(1)
    W = rng.standard_normal((6, 6))
    A, b = W + W.T, rng.standard_normal(6)
    assert np.linalg.eigvalsh(A)[0] < 0 and not cholesky_lower(A, np.zeros((6, 6)))
    x, inv = np.empty(6), np.empty((6, 6))
    spd_solve(A, b, x)
    spd_inverse(A, inv)
    assert np.array_equal(x, np.linalg.solve(A, b))
    # numba's LU is scipy's LAPACK build, numpy's its own: equal up to rounding, and symmetrized
    assert np.array_equal(inv, inv.T)
    np.testing.assert_allclose(inv, np.linalg.inv(A), rtol=0, atol=1e-12 * np.abs(inv).max())


def plain_cholesky(A):
    """The row-by-row dot-product Cholesky, one sum at a time (plain Python floats: the same IEEE operations)."""
    d = len(A)
    L = [[0.0] * d for _ in range(d)]
    for i in range(d):
        for j in range(i + 1):
            s = float(A[i, j])
            for k in range(j):
                s -= L[i][k] * L[j][k]
            L[i][j] = np.sqrt(s) if i == j else s / L[j][j]
    return L


def plain_inverse(L):
    """L^{-T} L^{-1}, each entry's sum in k order, one at a time."""
    d = len(L)
    T = [[0.0] * d for _ in range(d)]
    for j in range(d):
        T[j][j] = 1.0 / L[j][j]
        for i in range(j + 1, d):
            s = 0.0
            for k in range(j, i):
                s -= L[i][k] * T[j][k]
            T[j][i] = s / L[i][i]
    return [[sum_in_order(T[a][k] * T[c][k] for k in range(max(a, c), d)) for c in range(d)] for a in range(d)]


def sum_in_order(terms):
    s = 0.0
    for t in terms:
        s += t
    return s


@pytest.mark.parametrize("d", [1, 2, 5, 20, 25])
def test_the_same_bits_as_one_sum_at_a_time(d):
    """linalg runs two sums side by side; each keeps the plain loops' order of operations, so the bits are theirs."""
    rng = np.random.default_rng(100 + d)
    A = spd(rng, d, 0.5)
    L = np.zeros((d, d))
    assert cholesky_lower(A, L)
    assert np.tril(L).tobytes() == np.array(plain_cholesky(A)).tobytes()
    inv = np.empty((d, d))
    spd_inverse(A, inv)
    assert inv.tobytes() == np.array(plain_inverse(plain_cholesky(A))).tobytes()
