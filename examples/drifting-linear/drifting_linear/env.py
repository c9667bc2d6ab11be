"""A linear bandit whose parameter drifts over the horizon: an ldpfed env plugin.

User t (0 <= t < T, T the run's users) sees K contexts uniform on the unit sphere of R^d, as in ldpfed's "linear"
world, and arm k's mean reward is x_{t,k}^T theta_t, where theta_t turns at constant speed along a great circle:

    theta_t = cos(a_t) u + sin(a_t) v,    a_t = drift * t / T,

u and v orthonormal, drawn once from the run's env generator (the ground truth: no algorithm sees them). `drift` is
the angle theta turns over the whole horizon, in radians: 0 is the stationary "linear" world (the same draws, so the
same runs bit for bit), pi/2 ends orthogonal to where it started, pi ends at -u (the best arm of the first users is
then the worst). The reward is the mean plus noise_std times a standard normal. ||theta_t|| = 1, so "linear"'s public
bounds hold: ||x|| <= 1, |mean| <= 1, rewards clipped to 1 + 3 noise_std. Pseudo-regret of user t: the gap to its
best arm under its own theta_t.

`kinds = ("linear",)`: it keeps the contract of ldpfed's "linear" (K contexts of shape (K, d) per user, one
parameter, the identity link, the same public fields), so every algorithm that runs on "linear" (ldp-ols, ldp-sgd,
ldp-ucb, linucb, uniform, ...) runs on it unchanged. None of them assumes a moving parameter: the point of the world
is to see what that costs them.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from numba import njit

from ldpfed.envs.base import Env, EnvSteps, turned, unit_sphere
from ldpfed.envs.sphere import sphere_points
from ldpfed.util.options import Option


class DriftingLinear(Env):
    """A linear bandit whose theta* turns by `drift` radians over the horizon (of kind "linear")."""

    name = "drifting-linear"          # the entry point's name (pyproject.toml)
    kinds = ("linear",)               # every algorithm that runs on "linear" runs on this world
    link = "identity"
    # --env-param NAME=VALUE: checked by ldpfed before any work (an error names env_params.<name>); `describe` shows
    # the docs
    options = {
        "d": Option(2, kind="int", low=2, doc="context dimension (at least 2: theta turns in a plane)"),
        "K": Option(10, kind="int", low=2, doc="arms: contexts per user"),
        "noise_std": Option(0.1, low=0, doc="std of the Gaussian reward noise (public reward bound 1 + 3 noise_std)"),
        "drift": Option(math.pi / 2, low=0, high=math.pi,
                        doc="the angle (radians) theta turns over the horizon: 0 is the stationary linear world, "
                            "pi/2 ends orthogonal to the start, pi at its opposite"),
    }

    def __init__(self, rng, users, **params):
        super().__init__(rng, users, **params)        # checks the options (Env.checked_params)
        self.d, self.K = self.params["d"], self.params["K"]
        self.noise_std, self.drift = self.params["noise_std"], self.params["drift"]
        # u first, as "linear" draws its theta: at drift 0 the two worlds are the same
        self.u = unit_sphere(rng, 1, self.d)[0]
        w = rng.standard_normal(self.d)
        w -= (w @ self.u) * self.u
        self.v = w / np.linalg.norm(w)
        self.reward_bound = 1.0 + 3.0 * self.noise_std     # |x^T theta_t| <= 1; the noise cut at 3 std

    # A population's own world (the heterogeneous federation model): its starting direction turned, the plane of
    # the turn following it; on a copy of this env (Env.varied), the arrays replaced, never changed in place.
    varies = "theta's start u, turned (unit norm kept); v re-orthogonalised to it; the drift is the run's"

    def _vary(self, spread, rng):
        u = turned(self.u, spread, rng)
        w = self.v - (self.v @ u) * u
        self.u, self.v = u, w / np.linalg.norm(w)

    def public(self):
        # what "linear" makes public: contexts on the unit sphere. The drift itself is not public (nor u, v).
        return replace(super().public(), context_bound=1.0)

    def theta_at(self, users) -> np.ndarray:
        """theta_t of these users, shape (n, d) (for tests and plots; the step computes it per user)."""
        angle = self.drift * np.asarray(users, dtype=float)[:, None] / self.horizon
        return np.cos(angle) * self.u + np.sin(angle) * self.v

    def contexts(self, users, rng):
        return sphere_points(rng, (len(users), self.K), self.d)      # "linear"'s contexts, the same draws

    def compiled(self):
        # what the inherited batched step runs for every user, and the sequential engine user by user
        return EnvSteps(_drifting_step, (self.u, self.v, float(self.drift), float(self.horizon),
                                         float(self.noise_std)))

    def draw_noise(self, n, rng):
        return rng.standard_normal(n)

    def estimation_error(self, estimate):
        """Distance of the estimate from the last user's theta (where the drift has taken it)."""
        if estimate is None:
            return None
        return float(np.linalg.norm(np.asarray(estimate) - self.theta_at([self.horizon - 1])[0]))

    def describe(self):
        return {**super().describe(), "drift": self.drift}


@njit(cache=True)
def _drifting_step(truth, contexts, i, user, actions, noise):
    """User `user` under its own theta_t: (the chosen arm's mean + noise_std times its normal, best mean - chosen)."""
    u, v, drift, horizon, noise_std = truth
    angle = drift * user / horizon
    c, s = math.cos(angle), math.sin(angle)
    best, chosen = -np.inf, 0.0
    for k in range(contexts.shape[1]):
        mean = 0.0
        for j in range(u.shape[0]):
            mean += contexts[i, k, j] * (c * u[j] + s * v[j])
        best = max(best, mean)
        if k == actions[i]:
            chosen = mean
    return chosen + noise_std * noise[i], best - chosen
