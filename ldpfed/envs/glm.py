"""Generalized linear contextual bandits (seed 000, 002, 001 settings).

Single parameter: each user sees K contexts x_{t,a} (uniform on the unit sphere) and one theta*.
Multi parameter: each user has one context x_t and arm a has its own theta*_a.
Mean reward mu(x^T theta) with mu the identity, logistic or exponential link.

Options: d, K, noise_std (of the identity link's Gaussian reward noise), contexts ("sphere": uniform on the unit
sphere, the paper; "gaussian": N(0, I_d) unnormalised, ||x|| ~ sqrt(d), as the authors' multi-parameter code, which
breaks the public context bound C_B = 1 the algorithms' noise is calibrated for).
Profile "authors-code" (seed 000's public code): noiseless rewards on the single-parameter envs; reward noise 0.05
and N(0, I_d) contexts on the multi-parameter envs.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from numba import njit

from ldpfed.envs.base import Env, EnvSteps, nonneg_float, turned, unit_sphere
from ldpfed.envs.links import mean_function
from ldpfed.envs.sphere import sphere_points
from ldpfed.util.errors import integer
from ldpfed.util.options import Option


def glm_options(d: int, K: int) -> dict:
    """The options of the GLM worlds, with their default sizes."""
    return {
        "d": Option(d, kind="int", low=1, doc="context dimension"),
        "K": Option(K, kind="int", low=2, doc="arms: contexts per user (single parameter) or parameters (multi)"),
        "noise_std": Option(0.1, low=0, doc="std of the identity link's Gaussian reward noise (the public reward "
                                            "bound is 1 + 3 noise_std)"),
        "contexts": Option("sphere", kind="choice", choices=("sphere", "gaussian"),
                           doc="'sphere': uniform on the unit sphere (the paper; public bound ||x|| <= 1); "
                               "'gaussian': N(0, I_d), no public bound (the authors' multi-parameter code)"),
    }


class GLMContextual(Env):
    link = "identity"
    options = glm_options(2, 10)
    varies = ("theta (each arm's in a multi-parameter world), turned, its unit norm kept; the contexts' centre, "
              "moved by about spread (unit-sphere contexts stay on the sphere)")
    context_centre = None     # a population's contexts are shifted by it (Env.varied); None: the run's law

    def __init__(self, rng, users, **params):
        super().__init__(rng, users, **params)
        self.d = integer("env_params.d", self.params["d"])
        self.K = integer("env_params.K", self.params["K"], 2)
        self.noise_std = nonneg_float("env_params.noise_std", self.params["noise_std"])
        self.gaussian_contexts = self.params["contexts"] == "gaussian"
        self.mu = mean_function(self.link, capped=False)    # the world's true mean (Poisson: not capped)
        shape = (self.K,) if self.multi else ()
        self.theta = unit_sphere(rng, shape, self.d) if self.multi else unit_sphere(rng, 1, self.d)[0]
        # Public bound the clients clip rewards to: |x^T theta| <= 1, so the mean is bounded; the
        # Gaussian noise of the identity link is cut at 3 std, Poisson(e) exceeds 8 with prob. ~0.3%.
        self.reward_bound = {"identity": 1.0 + 3.0 * self.noise_std, "logistic": 1.0, "poisson": 8.0}[self.link]

    def public(self):
        # Unit-sphere contexts are bounded by 1; N(0, I) contexts (authors-code) have no bound.
        return replace(super().public(), context_bound=None if self.gaussian_contexts else 1.0)

    def contexts(self, users, rng):
        n = len(users)
        if self.gaussian_contexts:
            points = rng.standard_normal((n, self.d) if self.multi else (n, self.K, self.d))
        else:   # sphere_points: the compiled sampler (same law as unit_sphere, ~4x cheaper: the main cost)
            points = sphere_points(rng, n if self.multi else (n, self.K), self.d)
        if self.context_centre is None:
            return points
        # a population's own contexts: shifted towards its centre, and back on the sphere (the public bound holds)
        points += self.context_centre
        if not self.gaussian_contexts:
            points /= np.maximum(np.linalg.norm(points, axis=-1, keepdims=True), 1e-300)
        return points

    def means(self, contexts):
        """Mean reward of every arm, shape (n, K)."""
        if self.multi:
            return self.mu(contexts @ self.theta.T)
        n, K, d = contexts.shape   # one (n K, d) @ (d,) product (numpy's (n, K, d) @ (d,) loops over n)
        return self.mu((contexts.reshape(n * K, d) @ self.theta).reshape(n, K))

    def _vary(self, spread, rng):
        self.theta = turned(self.theta, spread, rng)
        self.context_centre = spread * rng.standard_normal(self.d) / np.sqrt(self.d)    # E||centre||^2 = spread^2

    def compiled(self):
        # the inherited batched step runs this for every user (one copy of the step: ldpfed.envs.base.EnvSteps)
        return EnvSteps(_multi_step if self.multi else _single_step,
                        (self.theta, LINKS[self.link], float(self.noise_std)))

    def draw_noise(self, n, rng):
        # identity: the Gaussian reward noise; logistic: the Bernoulli draw's uniform; Poisson: the uniform of
        # its inverse CDF
        return rng.standard_normal(n) if self.link == "identity" else rng.random(n)

    def estimation_error(self, estimate):
        if estimate is None:
            return None
        return float(np.linalg.norm(np.asarray(estimate) - self.theta))


IDENTITY, LOGISTIC, POISSON = range(3)
LINKS = {"identity": IDENTITY, "logistic": LOGISTIC, "poisson": POISSON}


@njit(cache=True)
def _mean(link, z):
    """The world's true mean mu(z) (links.mean_function(capped=False))."""
    if link == IDENTITY:
        return z
    if link == LOGISTIC:
        return 1.0 / (1.0 + math.exp(-z))
    return math.exp(z)


@njit(cache=True)
def _reward(link, noise_std, mean, noise):
    """A reward of mean `mean` from the user's pre-drawn noise: Gaussian noise (identity), a Bernoulli draw
    (logistic) or a Poisson draw by inverse CDF (the means are at most e: a few terms)."""
    if link == IDENTITY:
        return mean + noise_std * noise
    if link == LOGISTIC:
        return 1.0 if noise < mean else 0.0
    k, p = 0, math.exp(-mean)
    cdf = p
    while noise > cdf and p > 0.0:
        k += 1
        p *= mean / k
        cdf += p
    return float(k)


@njit(cache=True)
def _dot(a, b):
    s = 0.0
    for j in range(a.shape[0]):
        s += a[j] * b[j]
    return s


@njit(cache=True)
def _single_step(truth, contexts, i, user, actions, noise):
    """Single parameter: the arms' means mu(x_{i,k}^T theta*); (reward of the chosen arm, best mean - its mean)."""
    theta, link, noise_std = truth
    best, chosen = -np.inf, 0.0
    for k in range(contexts.shape[1]):
        m = _mean(link, _dot(contexts[i, k], theta))
        best = max(best, m)
        if k == actions[i]:
            chosen = m
    return _reward(link, noise_std, chosen, noise[i]), best - chosen


@njit(cache=True)
def _multi_step(truth, contexts, i, user, actions, noise):
    """Multi parameter: arm k's mean mu(x_i^T theta*_k)."""
    theta, link, noise_std = truth
    best, chosen = -np.inf, 0.0
    for k in range(theta.shape[0]):
        m = _mean(link, _dot(contexts[i], theta[k]))
        best = max(best, m)
        if k == actions[i]:
            chosen = m
    return _reward(link, noise_std, chosen, noise[i]), best - chosen


def _variant(cls_name: str, name: str, link: str, multi: bool, options: dict):
    profile = {"authors-code": AUTHORS_MULTI if multi else AUTHORS_SINGLE}
    doc = (f"{link.capitalize()} GLM contextual bandit: "
           + ("one context per user, a theta* per arm." if multi else "K contexts per user, one theta*.")
           + " Contexts uniform on the unit sphere (seed 000's setting).")
    return type(cls_name, (GLMContextual,), {"name": name, "link": link, "multi": multi, "options": options,
                                             "profile_defaults": profile, "__module__": __name__, "__doc__": doc})


SINGLE = glm_options(2, 10)
MULTI = glm_options(20, 3)
AUTHORS_SINGLE = {"noise_std": 0.0}                            # Scheme1/envs: rewards are the means
AUTHORS_MULTI = {"noise_std": 0.05, "contexts": "gaussian"}    # Scheme1/instances/multiparam.py
# Module-level names: the entry points (pyproject.toml) and pickling refer to them.
Linear = _variant("Linear", "linear", "identity", False, SINGLE)
Logistic = _variant("Logistic", "logistic", "logistic", False, SINGLE)
Poisson = _variant("Poisson", "poisson", "poisson", False, SINGLE)
LinearMulti = _variant("LinearMulti", "linear-multi", "identity", True, MULTI)
LogisticMulti = _variant("LogisticMulti", "logistic-multi", "logistic", True, MULTI)
PoissonMulti = _variant("PoissonMulti", "poisson-multi", "poisson", True, MULTI)
