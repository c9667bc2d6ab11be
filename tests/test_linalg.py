"""ldpfed.util.linalg: the Cholesky solve and inverse factor of the per-user server steps agree with numpy to rounding,
a matrix that is not positive definite goes to LU (solve) or is refused (inverse factor)."""
import numpy as np
import pytest

from ldpfed.util.linalg import cholesky_lower, inverse_cholesky, spd_solve


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
        Linv = np.full((d, d), np.nan)
        assert inverse_cholesky(A, Linv)
        assert np.array_equal(Linv, np.tril(Linv))          # written everywhere, zero above the diagonal
        inv = Linv.T @ Linv
        np.testing.assert_allclose(inv, np.linalg.inv(A), rtol=0, atol=50 * scale * np.abs(inv).max())
        x = rng.standard_normal(d)                          # the UCB width it serves
        np.testing.assert_allclose(np.sum((Linv @ x) ** 2), x @ np.linalg.solve(A, x), rtol=50 * scale)
        L = np.zeros((d, d))
        assert cholesky_lower(A, L)
        np.testing.assert_allclose(np.tril(L) @ np.tril(L).T, A, rtol=0, atol=50 * np.finfo(float).eps * A.max())


def test_indefinite_matrices_go_to_numpys_lu():
    """A noisy Gram matrix that its shift does not dominate: Cholesky refuses it, numpy's LU solves it, and it has
    no inverse factor (the caller is told, and the array is left as it was)."""
    rng = np.random.default_rng(1)
    W = rng.standard_normal((6, 6))
    A, b = W + W.T, rng.standard_normal(6)
    assert np.linalg.eigvalsh(A)[0] < 0 and not cholesky_lower(A, np.zeros((6, 6)))
    x, Linv = np.empty(6), np.full((6, 6), 7.0)
    spd_solve(A, b, x)
    assert np.array_equal(x, np.linalg.solve(A, b))
    assert not inverse_cholesky(A, Linv) and np.all(Linv == 7.0)


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


def plain_inverse_factor(L):
    """L^{-1}, column by column (L y = e_j), each entry's sum in k order, one at a time."""
    d = len(L)
    Linv = [[0.0] * d for _ in range(d)]
    for j in range(d):
        Linv[j][j] = 1.0 / L[j][j]
        for i in range(j + 1, d):
            s = 0.0
            for k in range(j, i):
                s -= L[i][k] * Linv[k][j]
            Linv[i][j] = s / L[i][i]
    return Linv


@pytest.mark.parametrize("d", [1, 2, 5, 20, 25])
def test_the_same_bits_as_one_sum_at_a_time(d):
    """linalg runs two sums side by side; each keeps the plain loops' order of operations, so the bits are theirs."""
    rng = np.random.default_rng(100 + d)
    A = spd(rng, d, 0.5)
    L = np.zeros((d, d))
    assert cholesky_lower(A, L)
    assert np.tril(L).tobytes() == np.array(plain_cholesky(A)).tobytes()
    Linv = np.empty((d, d))
    assert inverse_cholesky(A, Linv)
    assert Linv.tobytes() == np.array(plain_inverse_factor(plain_cholesky(A))).tobytes()
