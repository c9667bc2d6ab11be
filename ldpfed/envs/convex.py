"""Bandit convex optimization on a Euclidean ball (seed 002, Section 3). Owner: seed-002 work.

Env "convex": the decision set is X = R * (unit ball of R^d) (so r = R in the paper's r B within X within R B).
User t holds a private convex loss

    f_t(x) = s * ||x - c_t||^2,   c_t = x* + spread * w_t,   w_t uniform in the unit ball (drawn per user),

with x* = target_norm * R * (a random unit vector) drawn once from the env generator. The scale s is chosen
so that the loss is bounded by B = loss_bound on the whole domain: with D = R + ||x*|| + spread (the largest
possible distance between a point of X and a centre c_t), s = B / D^2, so 0 <= f_t <= B, and f_t is
G-Lipschitz on X with G = 2 s D = 2 B / D. B and G are public (`reward_bound`, `lipschitz`): the clients clip to
them before privatizing. spread = 0 gives one fixed function for every user (the oblivious adversary of the
paper with f_t = f); spread > 0 is stochastic BCO with a per-user function.

Actions: one point per user, shape (n, d), or two points per user, shape (n, 2, d) (two-point feedback).
Rewards: one number per user (they are LOSSES: the algorithms minimize them): the loss value f_t(x) of a one-point
user; for a two-point user the difference f_t(x_1) - f_t(x_2) of its two losses (the two-point feedback: all the
algorithms use of the two values, so a user's reward stays one number, as the compiled steps exchange it).
Pseudo-regret of a user: F(x) - F(x*) with F = E f_t, i.e. s * ||x - x*||^2 (the mean of the c_t is x*).
A two-point user's regret is the AVERAGE of its two plays, (F(x_1) + F(x_2))/2 - F(x*), as in the paper's
multi-point regret (eq. 2, 1/K times the sum over the K queried points), so a two-point user and a one-point
user each count as one unit of the horizon.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
from numba import njit

from ldpfed.envs.base import Env, EnvSteps, nonneg_float, turned, unit_sphere
from ldpfed.util.errors import ConfigError, integer
from ldpfed.util.options import Option


def uniform_ball(rng: np.random.Generator, n: int, d: int, radius: float = 1.0) -> np.ndarray:
    """n points uniform in the ball of radius `radius` of R^d, shape (n, d)."""
    directions = unit_sphere(rng, n, d)
    return directions * (radius * rng.random((n, 1)) ** (1.0 / d))


class ConvexBall(Env):
    """Bandit convex optimization on a ball: user t's loss s ||x - c_t||^2, one or two points per user (seed 002)."""
    name = "convex"
    varies = "the minimiser x*, turned, its norm kept (so the loss's public scale and bounds are the same)"

    def _vary(self, spread, rng):
        self.x_star = turned(self.x_star, spread, rng)
    options = {
        "d": Option(2, kind="int", low=1, doc="dimension of the decision set"),
        "radius": Option(1.0, low=0, low_open=True, doc="R: the decision set is the ball of radius R"),
        "target_norm": Option(0.5, low=0, high=1, doc="||x*|| / R: the minimizer's distance from the centre"),
        "spread": Option(0.25, low=0, doc="users' centres c_t = x* + spread w_t, w_t uniform in the unit ball"),
        "loss_bound": Option(1.0, low=0, low_open=True, doc="B: every loss lies in [0, B] on the domain (public)"),
    }

    def __init__(self, rng, users, **params):
        super().__init__(rng, users, **params)
        self.d = integer("env_params.d", self.params["d"])
        self.K = 0
        self.radius = nonneg_float("env_params.radius", self.params["radius"])
        if self.radius <= 0:
            raise ConfigError("env_params.radius", self.params["radius"], "must be > 0")
        target = nonneg_float("env_params.target_norm", self.params["target_norm"])
        if target > 1:
            raise ConfigError("env_params.target_norm", target, "must be in [0, 1] (x* lies in the domain)")
        self.spread = nonneg_float("env_params.spread", self.params["spread"])
        self.loss_bound = nonneg_float("env_params.loss_bound", self.params["loss_bound"])
        if self.loss_bound <= 0:
            raise ConfigError("env_params.loss_bound", self.params["loss_bound"], "must be > 0")
        self.x_star = target * self.radius * unit_sphere(rng, 1, self.d)[0]
        diameter = self.radius + float(np.linalg.norm(self.x_star)) + self.spread
        self.scale = self.loss_bound / diameter ** 2
        self.lipschitz = 2.0 * self.scale * diameter        # G, public
        self.reward_bound = self.loss_bound                  # B, public: 0 <= f_t <= B on the domain
        self.inner_radius = self.radius                      # r of the paper (X is a ball: r = R)
        self._tolerance = self.radius * (1.0 + 1e-9)

    def pseudo_regret(self, points: np.ndarray) -> np.ndarray:
        """F(x) - F(x*) = s ||x - x*||^2 for points of shape (..., d)."""
        diff = points - self.x_star
        return self.scale * np.einsum("...i,...i->...", diff, diff)

    def step(self, contexts, actions, users, rng):
        """(losses, pseudo-regret): the compiled step (`_convex_step`) for every user, after a shape check."""
        points = np.asarray(actions, dtype=float)
        n = len(users)
        if points.shape not in ((n, self.d), (n, 2, self.d)):
            raise ValueError(f"convex env: actions must have shape ({n}, {self.d}) or ({n}, 2, {self.d}), "
                             f"got {points.shape}")
        return super().step(contexts, points, users, rng)

    def compiled(self):
        # draw_noise: each user's centre offset w_t (uniform in the unit ball); step raises ValueError on a point
        # outside the domain ball
        return EnvSteps(_convex_step, (self.x_star, float(self.scale), float(self.spread), self._tolerance ** 2))

    def draw_noise(self, n, rng):
        """w_t uniform in the unit ball, (n, d): the users' private functions are centred at x* + spread w_t."""
        return uniform_ball(rng, n, self.d)

    def estimation_error(self, estimate):
        if estimate is None:
            return None
        return float(np.linalg.norm(np.asarray(estimate) - self.x_star))

    def uniform_regret(self) -> float:
        """Expected per-user regret of a point drawn uniformly in the domain (E||U||^2 = R^2 d/(d+2))."""
        return self.scale * (self.radius ** 2 * self.d / (self.d + 2) + float(self.x_star @ self.x_star))

    def public(self):
        # Seed 002's Theorems 5-6 assume R, r, B, G and the strong-convexity modulus mu known. f_t = s ||x - c_t||^2
        # has Hessian 2 s I, so mu = 2 s. (s and G depend on ||x*|| = target_norm * R, a config value, not on the
        # direction of x*, which stays hidden.)
        return replace(super().public(), radius=self.radius, inner_radius=self.inner_radius,
                       lipschitz=float(self.lipschitz), strong_convexity=2.0 * float(self.scale))

    def describe(self):
        return {**super().describe(), "lipschitz": self.lipschitz, "scale": self.scale,
                "x_star": self.x_star.tolist()}


@njit(cache=True)
def _sq_dist(x_star, spread, w, point):
    """(||point - c||^2, ||point - x*||^2) with c = x* + spread w the user's centre."""
    loss = regret = 0.0
    for j in range(x_star.shape[0]):
        e = point[j] - (x_star[j] + spread * w[j])
        loss += e * e
        r = point[j] - x_star[j]
        regret += r * r
    return loss, regret


@njit(cache=True)
def _check_inside(point, tol2):
    sq = 0.0
    for j in range(point.shape[0]):
        sq += point[j] * point[j]
    if sq > tol2:
        raise ValueError("convex env: an action lies outside the domain ball")


@njit(cache=True)
def _convex_step(truth, contexts, i, user, actions, noise):
    """User i's loss s ||x - c_i||^2 at its point x = actions[i] (one point: (d,)), or the difference of its losses
    at its two points (actions[i]: (2, d)); pseudo-regret s ||x - x*||^2 (the mean over the two points)."""
    x_star, scale, spread, tol2 = truth
    if actions.ndim == 3:
        _check_inside(actions[i, 0], tol2)
        _check_inside(actions[i, 1], tol2)
        loss1, regret1 = _sq_dist(x_star, spread, noise[i], actions[i, 0])
        loss2, regret2 = _sq_dist(x_star, spread, noise[i], actions[i, 1])
        return scale * loss1 - scale * loss2, (scale * regret1 + scale * regret2) / 2.0
    _check_inside(actions[i], tol2)
    loss, regret = _sq_dist(x_star, spread, noise[i], actions[i])
    return scale * loss, scale * regret
