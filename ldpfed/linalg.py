"""Small dense solves and inverses of symmetric positive definite matrices, compiled (numba), for the algorithms'
per-user server steps (ridge Gram matrices of 20-25 dimensions, a solve or an inverse after every user).

Bottom layer (numpy and numba only). A Cholesky factorization A = L L^T (row by row, dot-product form: for these
sizes it beats both LAPACK's LU, whose call and copies cost more than the arithmetic, and a vectorized
right-looking loop). A matrix that is not positive definite up to rounding (a pivot <= 0: possible when a noisy
Gram matrix is not dominated by its shift) is solved or inverted by numpy's LU instead: the same linear system, so
the result is the same up to rounding either way.
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def cholesky_lower(A, L):
    """L (lower triangle written) with L L^T = A, from A's lower triangle; False when a pivot is not > 0."""
    d = A.shape[0]
    for i in range(d):
        for j in range(i + 1):
            s = A[i, j]
            for k in range(j):
                s -= L[i, k] * L[j, k]
            if i == j:
                if not s > 0.0:
                    return False
                L[i, i] = np.sqrt(s)
            else:
                L[i, j] = s / L[j, j]
    return True


@njit(cache=True)
def spd_solve(A, b, x):
    """x = A^{-1} b for a symmetric A (Cholesky; LU when A is not positive definite)."""
    d = A.shape[0]
    L = np.empty((d, d))
    if not cholesky_lower(A, L):
        x[:] = np.linalg.solve(A, b)
        return
    for i in range(d):                  # L y = b
        s = b[i]
        for k in range(i):
            s -= L[i, k] * x[k]
        x[i] = s / L[i, i]
    for i in range(d - 1, -1, -1):      # L^T x = y, by columns of L^T (rows of L)
        x[i] /= L[i, i]
        xi = x[i]
        for k in range(i):
            x[k] -= L[i, k] * xi


@njit(cache=True)
def spd_inverse(A, out):
    """out = A^{-1} for a symmetric A, exactly symmetric (Cholesky: L^{-T} L^{-1}; LU when A is not positive
    definite, then symmetrized as (inv + inv^T) / 2)."""
    d = A.shape[0]
    L = np.empty((d, d))
    if not cholesky_lower(A, L):
        inverse = np.linalg.inv(A)
        for a in range(d):
            for c in range(d):
                out[a, c] = (inverse[a, c] + inverse[c, a]) * 0.5
        return
    T = np.empty((d, d))                # row j of T: column j of L^{-1} (L y = e_j), zero above the diagonal
    for j in range(d):
        for i in range(j):
            T[j, i] = 0.0
        T[j, j] = 1.0 / L[j, j]
        for i in range(j + 1, d):
            s = 0.0
            for k in range(j, i):
                s -= L[i, k] * T[j, k]
            T[j, i] = s / L[i, i]
    for a in range(d):                  # (L^{-T} L^{-1})[a, c] = sum_{k >= max(a, c)} T[a, k] T[c, k]
        for c in range(a + 1):
            s = 0.0
            for k in range(a, d):
                s += T[a, k] * T[c, k]
            out[a, c] = s
            out[c, a] = s
