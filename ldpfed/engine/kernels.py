"""Compiled per-user loops of the sequential engine (round size 1, one population): see sequential.py.

Every kernel runs users [t0, t0 + n) of ONE algorithm one at a time: act on the published model, the env's reward
and pseudo-regret, the client's clipping and local randomizer, the server's update. All randomness arrives
pre-drawn (contexts, reward noise, the mechanisms' standard normals and uniforms), so a kernel is a pure function
of its inputs; every constant (noise std, radii, bounds, steps, shifts, ...) is read by the caller from the
algorithm and env instances, never re-derived here. The maths mirrors the algorithm's `act`/`encode`/`update`
line by line (same clipping, same mechanism sampling, same order of operations where it matters);
tests/test_sequential.py feeds a kernel the generic engine's own random draws and checks it reproduces
run_local (equal up to floating-point rounding).

Outputs per user: regret[i], counts[i, :] (the algorithm's metric counters, in its column order), and, at the
users flagged in snap_at (>= 0: a slot), a copy of the estimate in snaps[slot] (estimation-error checkpoints).
Link codes: 0 identity, 1 logistic, 2 exponential capped at 50 (the algorithm side of seed 000's Poisson link).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

IDENTITY, LOGISTIC, EXP_CAPPED = 0, 1, 2


@njit(cache=True)
def _link(code, z):
    if code == IDENTITY:
        return z
    if code == LOGISTIC:
        return 1.0 / (1.0 + math.exp(-z))
    return math.exp(min(z, 50.0))


@njit(cache=True)
def _dot(a, b):
    s = 0.0
    for j in range(a.shape[0]):
        s += a[j] * b[j]
    return s


@njit(cache=True)
def _env_glm(ctx_i, a, theta_star, env_link, noise_std, wnoise):
    """The single-parameter GLM env's step for one user: (reward, regret) of arm a."""
    best = -np.inf
    chosen = 0.0
    for k in range(ctx_i.shape[0]):
        m = _link(env_link, _dot(ctx_i[k], theta_star))
        if m > best:
            best = m
        if k == a:
            chosen = m
    if env_link == IDENTITY:
        reward = chosen + noise_std * wnoise
    else:
        reward = 1.0 if wnoise < chosen else 0.0
    return reward, best - chosen


@njit(cache=True)
def _greedy(ctx_i, theta):
    best, arm = -np.inf, 0
    for k in range(ctx_i.shape[0]):
        s = _dot(ctx_i[k], theta)
        if s > best or k == 0:
            best, arm = s, k
    return arm


@njit(cache=True)
def _clip_rows(x, bound, rtol):
    """In place: x scaled to norm <= bound (rows over it); 1 if it exceeded bound (1 + rtol) (glm_ldp.clip_rows)."""
    norm = math.sqrt(_dot(x, x))
    if norm > bound:
        scale = bound / max(norm, 1e-300)
        for j in range(x.shape[0]):
            x[j] *= scale
    return 1 if norm > bound * (1.0 + rtol) else 0


@njit(cache=True)
def _clip_value(r, bound):
    if abs(r) > bound:
        return min(max(r, -bound), bound), 1
    return r, 0


@njit(cache=True)
def _l2_ball(g, radius, ball_B, tanh_half, gauss, unif, out):
    """L2BallMechanism.privatize of one row g into out (gauss: its d standard normals, unif: its uniform)."""
    d = g.shape[0]
    norm = math.sqrt(_dot(g, g))
    norm_c = radius if norm > radius else norm
    nv = math.sqrt(_dot(gauss, gauss))
    if nv == 0.0:
        nv = 1.0
    proj = 0.0
    for j in range(d):
        out[j] = gauss[j] / nv
    if norm > 0.0:
        for j in range(d):
            proj += out[j] * (g[j] / norm)
    else:
        proj = out[0]
    p_pos = 0.5 + norm_c * (tanh_half / (2.0 * radius))
    want_pos = unif < p_pos
    if (proj >= 0.0) != want_pos:
        for j in range(d):
            u = g[j] / norm if norm > 0.0 else (1.0 if j == 0 else 0.0)
            out[j] -= (2.0 * proj) * u
    for j in range(d):
        out[j] *= ball_B


# ------------------------------------------------------------------------------------------------------------
# seed 000, single parameter
# ------------------------------------------------------------------------------------------------------------
@njit(cache=True)
def ldp_sgd(theta, t0, ctx, wnoise, theta_star, env_link, noise_std, alg_link, C_B, c_r, R, ball_B, tanh_half,
            step, offset, rtol, gauss, unif, snap_at, snaps, regret, counts):
    """LdpSgd: counts columns (clipped_context, clipped_reward, clipped)."""
    n, K, d = ctx.shape
    x = np.empty(d)
    g = np.empty(d)
    z = np.empty(d)
    for i in range(n):
        a = _greedy(ctx[i], theta)
        reward, regret[i] = _env_glm(ctx[i], a, theta_star, env_link, noise_std, wnoise[i])
        for j in range(d):
            x[j] = ctx[i, a, j]
        counts[i, 0] = _clip_rows(x, C_B, rtol)
        r, counts[i, 1] = _clip_value(reward, c_r)
        coef = _link(alg_link, _dot(x, theta)) - r
        for j in range(d):
            g[j] = coef * x[j]
        counts[i, 2] = _clip_rows(g, R, rtol)
        _l2_ball(g, R, ball_B, tanh_half, gauss[i], unif[i], z)
        eta = step / ((t0 + i) + (1.0 + offset))
        for j in range(d):
            theta[j] = theta[j] - eta * z[j]
        if snap_at[i] >= 0:
            snaps[snap_at[i], :] = theta


@njit(cache=True)
def ldp_ols(V, U, theta, ctx, wnoise, theta_star, env_link, noise_std, C_B, c_r, sigma_M, sigma_u, upper,
            shifts, rtol, gauss_M, gauss_u, private, snap_at, snaps, regret, counts):
    """LdpOls / Ols: counts columns (clipped_context, clipped_reward); shifts[i] = algo.shift(t + 1)."""
    n, K, d = ctx.shape
    x = np.empty(d)
    A = np.empty((d, d))
    for i in range(n):
        a = _greedy(ctx[i], theta)
        reward, regret[i] = _env_glm(ctx[i], a, theta_star, env_link, noise_std, wnoise[i])
        for j in range(d):
            x[j] = ctx[i, a, j]
        counts[i, 0] = _clip_rows(x, C_B, rtol)
        r, counts[i, 1] = _clip_value(reward, c_r)
        for j in range(d):
            for k in range(d):
                m = x[j] * x[k]
                if private:
                    m = sigma_M * gauss_M[i, upper[j, k]] + m
                V[j, k] = V[j, k] + m
            u = r * x[j]
            if private:
                u = sigma_u * gauss_u[i, j] + u
            U[j] = U[j] + u
        for j in range(d):
            for k in range(d):
                A[j, k] = V[j, k]
            A[j, j] = V[j, j] + shifts[i]
        theta[:] = np.linalg.solve(A, U)
        if snap_at[i] >= 0:
            snaps[snap_at[i], :] = theta
