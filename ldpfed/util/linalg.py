"""Small dense solves and inverse factors of symmetric positive definite matrices, compiled (numba), for the algorithms'
per-user server steps (ridge Gram matrices of 20-25 dimensions, a solve or an inverse factor after every user).

Bottom layer (numpy and numba only). A Cholesky factorization A = L L^T (row by row, dot-product form: for these
sizes it beats both LAPACK's LU, whose call and copies cost more than the arithmetic, and a vectorized
right-looking loop). A matrix that is not positive definite up to rounding (a pivot <= 0: possible when a noisy
Gram matrix is not dominated by its shift) is solved by numpy's LU instead (the same linear system, so the result
is the same up to rounding either way); it has no inverse factor, and the caller decides what to do then.

Each entry is its dot-product sum in the order of the plain loops (s = a - l_0 m_0 - l_1 m_1 - ..., one after the
other), but two independent sums run side by side (two rows of L, two columns of L^{-1}) and share their common
loads: a sum is a chain of dependent subtractions, so the processor has two chains
to overlap. Same operations in the same order per entry, so the same bits as one sum at a time (a vectorized
column-at-a-time form was slower at these sizes).
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def cholesky_lower(A, L):
    """L (lower triangle written) with L L^T = A, from A's lower triangle; False when a pivot is not > 0."""
    d = A.shape[0]
    for i in range(0, d, 2):            # rows i and r = i + 1 together: two independent sums share each L[j, k]
        r = min(i + 1, d - 1)           # (d odd: the last row alone, its second sum a copy, not written)
        for j in range(i + 1):
            s0, s1 = A[i, j], A[r, j]
            for k in range(j):
                ljk = L[j, k]
                s0 -= L[i, k] * ljk
                s1 -= L[r, k] * ljk
            if i == j:
                if not s0 > 0.0:
                    return False
                L[i, i] = np.sqrt(s0)
            else:
                L[i, j] = s0 / L[j, j]
            if r > i:
                L[r, j] = s1 / L[j, j]
        if r > i:
            s = A[r, r]
            for k in range(r):
                s -= L[r, k] * L[r, k]
            if not s > 0.0:
                return False
            L[r, r] = np.sqrt(s)
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
def inverse_cholesky(A, Linv):
    """Linv = L^{-1} (lower triangular, zero above the diagonal) for A = L L^T, so that A^{-1} = Linv^T Linv and
    x^T A^{-1} x = ||Linv x||^2: what a UCB width needs, at about two thirds of the work of A^{-1} itself (the
    product Linv^T Linv is left out). False, Linv not written, when A is not positive definite."""
    d = A.shape[0]
    L = np.empty((d, d))
    if not cholesky_lower(A, L):
        return False
    for j in range(d):                  # column j of Linv: L y = e_j, zero above the diagonal
        for i in range(j):
            Linv[i, j] = 0.0
        Linv[j, j] = 1.0 / L[j, j]
    for j in range(0, d - 1, 2):        # columns j and q = j + 1 together: their sums share each L[i, k]
        q = j + 1
        s0 = 0.0
        s0 -= L[q, j] * Linv[j, j]
        Linv[q, j] = s0 / L[q, q]
        for i in range(q + 1, d):
            s0, s1 = 0.0, 0.0
            s0 -= L[i, j] * Linv[j, j]
            for k in range(q, i):
                lik = L[i, k]
                s0 -= lik * Linv[k, j]
                s1 -= lik * Linv[k, q]
            Linv[i, j] = s0 / L[i, i]
            Linv[i, q] = s1 / L[i, i]
    return True
