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

from ldpfed.mechanisms.l2ball import privatize_row

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
def _reward(env_link, noise_std, wnoise, chosen):
    """The GLM env's reward of an arm of mean `chosen`: Gaussian noise (identity link) or a Bernoulli draw."""
    if env_link == IDENTITY:
        return chosen + noise_std * wnoise
    return 1.0 if wnoise < chosen else 0.0


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
    return _reward(env_link, noise_std, wnoise, chosen), best - chosen


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
    """In place: x scaled to norm <= bound (rows over it); 1 if it exceeded bound (1 + rtol) (ldpfed.clip.clip_rows)."""
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


# ------------------------------------------------------------------------------------------------------------
# seed 000, multi parameter (Algorithm 2): warm-up, elimination, a message for every arm slot
# ------------------------------------------------------------------------------------------------------------
@njit(cache=True)
def _env_glm_multi(x, a, theta_star, env_link, noise_std, wnoise):
    best = -np.inf
    chosen = 0.0
    for k in range(theta_star.shape[0]):
        m = _link(env_link, _dot(x, theta_star[k]))
        if m > best:
            best = m
        if k == a:
            chosen = m
    return _reward(env_link, noise_std, wnoise, chosen), best - chosen


@njit(cache=True)
def _take_inputs(x, reward, C_B, c_r, clip, rtol, counts_row):
    """The client's inputs (glm_ldp._GLMBase._clip): x (in place) and the reward clipped to C_B and c_r, counted in
    counts_row[0:2]; with clip False (the authors' multi-parameter code) left as they are, only counted where they
    exceed the bounds. Returns the reward."""
    if clip:
        counts_row[0] = _clip_rows(x, C_B, rtol)
        r, counts_row[1] = _clip_value(reward, c_r)
        return r
    counts_row[0] = 1 if _dot(x, x) > C_B ** 2 * (1.0 + 2.0 * rtol) else 0
    counts_row[1] = 1 if abs(reward) > c_r else 0
    return reward


@njit(cache=True)
def _project_rows(theta, radius):
    """In place: every row of theta scaled to norm <= radius (LdpSgdMulti._projected; radius inf: nothing)."""
    if math.isinf(radius):
        return
    for k in range(theta.shape[0]):
        norm = math.sqrt(_dot(theta[k], theta[k]))
        scale = min(1.0, radius / max(norm, 1e-300))
        for j in range(theta.shape[1]):
            theta[k, j] = theta[k, j] * scale


@njit(cache=True)
def _act_multi(x, t, warm, h, theta, theta_warm):
    """_MultiBase.act for one user: round-robin during warm-up, then eq. (7) elimination and a greedy pull."""
    K = theta.shape[0]
    if t < warm:
        return t % K
    top = -np.inf
    for k in range(K):
        top = max(top, _dot(x, theta_warm[k]))
    best, a = -np.inf, 0
    for k in range(K):
        s = _dot(x, theta[k]) if _dot(x, theta_warm[k]) > top - h / 2 else -np.inf
        if s > best or k == 0:
            best, a = s, k
    return a


@njit(cache=True)
def _end_of_user(theta, theta_warm, frozen, warm_done, snap_row, snaps):
    """After a multi-parameter user: keep theta as the warm-up estimate the first time warm-up is done (elimination
    reads it), and snapshot theta if this user is a table row (snap_row >= 0)."""
    if not frozen[0] and warm_done:
        theta_warm[:, :] = theta
        frozen[0] = True
    if snap_row >= 0:
        snaps[snap_row] = theta


@njit(cache=True)
def ldp_sgd_multi(theta, theta_warm, n_msgs, frozen, t0, ctx, wnoise, theta_star, env_link, noise_std, alg_link,
                  C_B, c_r, R, ball_B, tanh_half, warm, h, rtol, sent, eta, project, gauss, unif, snap_at, snaps,
                  regret, counts):
    """LdpSgdMulti: counts (clipped_context, clipped_reward, clipped); sent[i, k] and eta[i, k] are the public
    slot mask and step sizes (from the algorithm's slots and message_counts); frozen[0]: theta_warm is set;
    project: the radius every theta_k is projected on after each update (inf: none)."""
    n, d = ctx.shape
    K = theta.shape[0]
    x = np.empty(d)
    g = np.empty(d)
    zero = np.zeros(d)
    z = np.empty(d)
    for i in range(n):
        t = t0 + i
        a = _act_multi(ctx[i], t, warm, h, theta, theta_warm if frozen[0] else theta)
        reward, regret[i] = _env_glm_multi(ctx[i], a, theta_star, env_link, noise_std, wnoise[i])
        x[:] = ctx[i]
        counts[i, 0] = _clip_rows(x, C_B, rtol)
        r, counts[i, 1] = _clip_value(reward, c_r)
        coef = _link(alg_link, _dot(x, theta[a])) - r
        for j in range(d):
            g[j] = coef * x[j]
        counts[i, 2] = _clip_rows(g, R, rtol)
        for k in range(K):
            privatize_row(g if k == a else zero, R, ball_B, tanh_half, gauss[i * K + k], unif[i * K + k], z)
            for j in range(d):
                theta[k, j] = theta[k, j] - eta[i, k] * (z[j] * sent[i, k])
            n_msgs[k] = n_msgs[k] + sent[i, k]
        _project_rows(theta, project)
        _end_of_user(theta, theta_warm, frozen, t + 1 >= warm, snap_at[i], snaps)


@njit(cache=True)
def ldp_sgd_multi_authors(theta, theta_warm, V, U, n_msgs, frozen, t0, ctx, wnoise, theta_star, env_link, noise_std,
                          alg_link, C_B, c_r, clip, sigma_M, sigma_u, upper, warm_shifts, R, ball_B, tanh_half,
                          predict_clip, eta, b_scale, decay, warm, h, rtol, gauss_M, gauss_u, gauss_Z, unif, snap_at,
                          snaps, regret, counts):
    """LdpSgdMulti under profile authors-code (its _encode_authors / _update_authors): warm-up users send an OLS
    message (M, u) in the public arm's slot and that arm is re-solved with shift warm_shifts[i]; later users send ONE
    l2-ball message (dimension K d, radius R) of the whole gradient, mu taken at x^T theta capped to +-predict_clip,
    and theta <- theta (1 - decay eta[i]) - eta[i] b_scale Z. gauss_M (n_warm, K, d(d+1)/2) and gauss_u
    (n_warm, K, d): the warm-up users' draws in order; gauss_Z (n_post, K d), unif (n_post,): the later users'.
    counts (unclipped_context_over_bound, unclipped_reward_over_bound, clipped) (clip False), else clipped_*."""
    n, d = ctx.shape
    K = theta.shape[0]
    x = np.empty(d)
    g = np.zeros(K * d)
    z = np.empty(K * d)
    A = np.empty((d, d))
    iw, ip = 0, 0
    for i in range(n):
        t = t0 + i
        a = _act_multi(ctx[i], t, warm, h, theta, theta_warm if frozen[0] else theta)
        reward, regret[i] = _env_glm_multi(ctx[i], a, theta_star, env_link, noise_std, wnoise[i])
        x[:] = ctx[i]
        r = _take_inputs(x, reward, C_B, c_r, clip, rtol, counts[i])
        counts[i, 2] = 0
        if t < warm:
            for j in range(d):
                for l in range(d):
                    V[a, j, l] = V[a, j, l] + (sigma_M * gauss_M[iw, a, upper[j, l]] + x[j] * x[l])
                U[a, j] = U[a, j] + (sigma_u * gauss_u[iw, a, j] + r * x[j])
            n_msgs[a] = n_msgs[a] + 1.0
            for j in range(d):
                for l in range(d):
                    A[j, l] = V[a, j, l]
                A[j, j] = V[a, j, j] + warm_shifts[i]
            theta[a] = np.linalg.solve(A, U[a])
            iw += 1
        else:
            coef = _link(alg_link, min(max(_dot(x, theta[a]), -predict_clip), predict_clip)) - r
            g[:] = 0.0
            for j in range(d):
                g[a * d + j] = coef * x[j]
            counts[i, 2] = _clip_rows(g, R, rtol)
            privatize_row(g, R, ball_B, tanh_half, gauss_Z[ip], unif[ip], z)
            keep = 1.0 - decay * eta[i]
            step = eta[i] * b_scale
            for k in range(K):
                for j in range(d):
                    theta[k, j] = theta[k, j] * keep - step * z[k * d + j]
                n_msgs[k] = n_msgs[k] + 1.0
            ip += 1
        _end_of_user(theta, theta_warm, frozen, t + 1 >= warm, snap_at[i], snaps)


@njit(cache=True)
def ldp_ols_multi(V, U, theta, theta_warm, n_msgs, frozen, t0, ctx, wnoise, theta_star, env_link, noise_std, C_B,
                  c_r, clip, sigma_M, sigma_u, upper, warm, h, rtol, sent, shifts, private, gauss_M, gauss_u, snap_at,
                  snaps, regret, counts):
    """LdpOlsMulti / OlsMulti: counts (clipped_context, clipped_reward), or with clip False (authors-code: inputs
    not clipped) (unclipped_context_over_bound, unclipped_reward_over_bound); shifts[i, k] = algo.shifts(n_k after
    user i, t + 1), sent[i, k] the public slot mask."""
    n, d = ctx.shape
    K = theta.shape[0]
    x = np.empty(d)
    A = np.empty((d, d))
    for i in range(n):
        t = t0 + i
        a = _act_multi(ctx[i], t, warm, h, theta, theta_warm if frozen[0] else theta)
        reward, regret[i] = _env_glm_multi(ctx[i], a, theta_star, env_link, noise_std, wnoise[i])
        x[:] = ctx[i]
        r = _take_inputs(x, reward, C_B, c_r, clip, rtol, counts[i])
        for k in range(K):
            pulled = 1.0 if k == a else 0.0
            for j in range(d):
                for l in range(d):
                    m = pulled * (x[j] * x[l])
                    if private:
                        m = (sigma_M * gauss_M[i, k, upper[j, l]] + m) * sent[i, k]
                    V[k, j, l] = V[k, j, l] + m
                u = pulled * (r * x[j])
                if private:
                    u = (sigma_u * gauss_u[i, k, j] + u) * sent[i, k]
                U[k, j] = U[k, j] + u
            n_msgs[k] = n_msgs[k] + sent[i, k]
            for j in range(d):
                for l in range(d):
                    A[j, l] = V[k, j, l]
                A[j, j] = V[k, j, j] + shifts[i, k]
            theta[k] = np.linalg.solve(A, U[k])
        _end_of_user(theta, theta_warm, frozen, t + 1 >= warm, snap_at[i], snaps)
