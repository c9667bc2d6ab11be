"""Sparse high-dimensional linear bandits (seed 003) and the arm-pool world of seed 001.

Both are single-parameter linear worlds: contexts (n, K, d), mean reward x^T theta*, Gaussian reward noise.

* "arm-pool" (seed 001, Section 4): a pool of `pool` arms with features drawn once (ground truth, from the env
  generator), each user is shown K of them drawn without replacement (from the context generator).
  Features and theta* have i.i.d. uniform coordinates and are normalized to unit norm; reward noise std 0.5.
* "sparse-linear" (seed 003; the paper gives no experiment, these are our choices): d = 1000, theta* is
  s0-sparse with unit norm, contexts have i.i.d. U[-1, 1] coordinates, so E[x x^T] = I/3: the compatibility
  constant phi^2 and the sparse eigenvalue C_p of seed 003's Assumptions 2 and 5 are both 1/3. The contexts are
  bounded coordinate-wise (|x_i| <= 1), so ||x_S|| <= sqrt(|S|) on every support S: this is the form of seed
  003's Assumption 1 (a bound on sub-vectors of small support), which is what its private least squares on the
  estimated support needs. (A bound on the full ||x|| in d = 1000 would shrink every coordinate to ~1/sqrt(d)
  and with it the signal of the support regression by a factor of d/3.)
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
from numba import njit

from ldpfed.envs.base import Env, EnvSteps, nonneg_float, turned
from ldpfed.envs.glm import IDENTITY, _single_step
from ldpfed.util.errors import ConfigError, integer
from ldpfed.util.options import Option


def _real(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
        raise ConfigError(name, value, "must be a finite number")
    return float(value)


class _LinearSingle(Env):
    """Shared part: linear mean reward x^T theta*, Gaussian noise, regret and estimation error. The step is
    compiled (EnvSteps, which the inherited batched `step` runs too): the chosen arm's mean plus noise_std times
    the user's standard normal (draw_noise), and the best arm's mean minus the chosen one's."""

    def means(self, contexts):
        return contexts @ self.theta

    def compiled(self):
        # the single-parameter identity-link step of the GLM worlds (ldpfed.envs.glm)
        return EnvSteps(_single_step, (self.theta, IDENTITY, float(self.noise_std)))

    def draw_noise(self, n, rng):
        return rng.standard_normal(n)

    def estimation_error(self, estimate):
        if estimate is None:
            return None
        return float(np.linalg.norm(np.asarray(estimate, dtype=float) - self.theta))


class ArmPool(_LinearSingle):
    """Seed 001's simulation: 1,000 arms, 10 shown per user, features and theta* uniform and normalized.

    The seed lost the dimension and the support of the uniform law; d = 25 (the dimension of its LastFM
    experiment and of the authors' earlier arm-pool simulations) and U(-1, 1) are our reconstruction
    (`feature_low` = 0 gives the U(0, 1) reading). Public attributes used by seed 001's algorithms:
    `context_bound` (||x|| <= 1) and `context_min_eig`, the smallest eigenvalue of E[x x^T] for an arm drawn
    uniformly from the pool (the lambda_0 of seed 001's Assumption 1; the pool is public item data).
    """
    name = "arm-pool"
    varies = "theta, turned, its unit norm kept (the arm pool is the same)"

    def _vary(self, spread, rng):
        self.theta = turned(self.theta, spread, rng)
    options = {
        "d": Option(25, kind="int", low=1, doc="feature dimension"),
        "K": Option(10, kind="int", low=2, doc="arms shown to each user (at most pool)"),
        "pool": Option(1000, kind="int", low=2, doc="arms in the pool (features drawn once)"),
        "noise_std": Option(0.5, low=0, doc="std of the Gaussian reward noise"),
        "feature_low": Option(-1.0, high=1, high_open=True,
                              doc="coordinates of features and theta* are U(feature_low, 1) before normalizing"),
    }

    @classmethod
    def cross_check(cls, params, users):
        if params["K"] > params["pool"]:
            raise ConfigError("env_params.K", params["K"], f"cannot show more arms than the pool of {params['pool']}")

    def __init__(self, rng, users, **params):
        super().__init__(rng, users, **params)
        self.d = integer("env_params.d", self.params["d"])
        self.pool_size = integer("env_params.pool", self.params["pool"], 2)
        self.K = integer("env_params.K", self.params["K"], 2)
        if self.K > self.pool_size:
            raise ConfigError("env_params.K", self.K, f"cannot show more arms than the pool of {self.pool_size}")
        self.noise_std = nonneg_float("env_params.noise_std", self.params["noise_std"])
        low = _real("env_params.feature_low", self.params["feature_low"])
        if not low < 1.0:
            raise ConfigError("env_params.feature_low", low, "must be < 1 (coordinates are U(feature_low, 1))")
        self.pool = self._normalized(rng.uniform(low, 1.0, (self.pool_size, self.d)))
        self.theta = self._normalized(rng.uniform(low, 1.0, self.d))
        self.context_bound = 1.0
        self.context_min_eig = float(np.linalg.eigvalsh(self.pool.T @ self.pool / self.pool_size)[0])
        # |x^T theta| <= 1; the Gaussian noise is cut at 3 std (as in the GLM worlds).
        self.reward_bound = 1.0 + 3.0 * self.noise_std

    @staticmethod
    def _normalized(v):
        norms = np.linalg.norm(v, axis=-1, keepdims=True)
        return v / np.maximum(norms, 1e-300)

    def shown(self, users, rng):
        """Indices (n, K) of the arms shown to each user: K distinct arms, uniformly at random."""
        # Draw K indices per user and redraw the rows that repeat an arm (rejection: exactly uniform over
        # K-subsets; about K^2 / (2 pool) of the rows are redrawn), n K draws instead of n * pool.
        idx = rng.integers(0, self.pool_size, (len(users), self.K))
        bad = self._repeats(idx)
        while bad.any():
            idx[bad] = rng.integers(0, self.pool_size, (int(bad.sum()), self.K))
            bad = self._repeats(idx)
        return idx

    @staticmethod
    def _repeats(idx):
        s = np.sort(idx, axis=1)
        return (s[:, 1:] == s[:, :-1]).any(axis=1)

    def public(self):
        # The pool's features are public item data, so lambda_0 computed from them is public.
        return replace(super().public(), context_bound=self.context_bound, context_min_eig=self.context_min_eig)

    def contexts(self, users, rng):
        return self.pool[self.shown(users, rng)]


class SparseLinear(_LinearSingle):
    """Seed 003's LASSO bandit world: theta* s0-sparse in R^d (d >> s0), K contexts per user.

    theta*: s0 coordinates chosen at random, values +-U(0.5, 1), normalized to unit norm. Contexts: i.i.d.
    U[-1, 1] coordinates (fresh for every user and arm). Public attributes: `context_bound` = 1 bounds every
    coordinate (so ||x_S|| <= sqrt(|S|)), `context_min_eig` = 1/3 = the compatibility constant phi^2 of
    E[x x^T] = I/3, `sparsity` = s0; `support` is the ground truth (for tests, not for algorithms).
    """
    name = "sparse-linear"
    varies = "theta's values on its support, turned, its unit norm kept (the support, so the sparsity, is the same)"

    def _vary(self, spread, rng):
        theta = np.zeros(self.d)
        theta[self.support] = turned(self.theta[self.support], spread, rng)
        self.theta = theta
    options = {
        "d": Option(1000, kind="int", low=1, doc="dimension (d >> s0)"),
        "s0": Option(5, kind="int", low=1, doc="sparsity of theta* (public: seed 003 assumes it known); at most d"),
        "K": Option(10, kind="int", low=2, doc="contexts (arms) per user"),
        "noise_std": Option(0.1, low=0, doc="std of the Gaussian reward noise"),
    }

    @classmethod
    def cross_check(cls, params, users):
        if params["s0"] > params["d"]:
            raise ConfigError("env_params.s0", params["s0"], f"must be <= d = {params['d']}")

    def __init__(self, rng, users, **params):
        super().__init__(rng, users, **params)
        self.d = integer("env_params.d", self.params["d"])
        self.K = integer("env_params.K", self.params["K"], 2)
        self.sparsity = integer("env_params.s0", self.params["s0"])
        if self.sparsity > self.d:
            raise ConfigError("env_params.s0", self.sparsity, f"must be <= d = {self.d}")
        self.noise_std = nonneg_float("env_params.noise_std", self.params["noise_std"])
        self.support = np.sort(rng.choice(self.d, size=self.sparsity, replace=False))
        values = rng.uniform(0.5, 1.0, self.sparsity) * rng.choice([-1.0, 1.0], size=self.sparsity)
        self.theta = np.zeros(self.d)
        self.theta[self.support] = values / np.linalg.norm(values)
        self.context_bound = 1.0
        self.context_min_eig = 1.0 / 3.0
        # |x^T theta| <= ||theta||_1 <= sqrt(s0) for a unit-norm s0-sparse theta; noise cut at 3 std.
        self.reward_bound = float(np.sqrt(self.sparsity)) + 3.0 * self.noise_std

    def public(self):
        # s0 is public: seed 003 assumes it known (it calibrates the noise); the support is not.
        return replace(super().public(), context_bound=self.context_bound, context_min_eig=self.context_min_eig,
                       sparsity=self.sparsity)

    def contexts(self, users, rng):
        return self._uniform(rng, np.empty((len(users), self.K, self.d)))

    @staticmethod
    def _uniform(rng, out):
        """out = U[-1, 1] draws: -1 + 2 u, u = rng.random() (one 64-bit word each), the bits of
        rng.uniform(-1.0, 1.0, out.shape), drawn into `out`."""
        rng.random(out=out)
        out *= 2.0
        out += -1.0
        return out

    def context_stream(self, users, rng):
        # 10,000 uniforms per user (330 MB for a block of the sequential engine): drawn a sub-block at a time into
        # one buffer, just before the loop reads them, instead of all at once through memory. They are the next
        # n K d words of rng: a copy of its state draws them as they are asked for, and rng jumps past them now
        # (PCG64.advance), so what it draws next is the same.
        bitgen = rng.bit_generator
        if type(bitgen) is not np.random.PCG64:
            return super().context_stream(users, rng)
        ahead = np.random.PCG64()
        ahead.state = bitgen.state
        ahead = np.random.Generator(ahead)
        bitgen.advance(len(users) * self.K * self.d)
        buffer, drawn = np.empty((0, self.K, self.d)), 0

        def contexts(lo, hi):
            nonlocal buffer, drawn
            if lo != drawn:
                raise ValueError(f"contexts of users [{lo}, {hi}) asked for after those up to {drawn}: in order only")
            drawn = hi
            if len(buffer) < hi - lo:
                buffer = np.empty((hi - lo, self.K, self.d))
            return self._uniform(ahead, buffer[:hi - lo])

        return contexts

    def means(self, contexts):
        # only the support matters: n K s0 operations instead of n K d
        return contexts[..., self.support] @ self.theta[self.support]

    def compiled(self):
        if "_steps" not in self.__dict__:
            self._steps = EnvSteps(_sparse_step, (self.support.astype(np.int64), self.theta[self.support].copy(),
                                                  float(self.noise_std)))
        return self._steps


@njit(cache=True)
def _sparse_step(truth, contexts, i, user, actions, noise):
    """The arms' means x_{i,k,S}^T theta*_S over the support S only; (the chosen arm's mean + noise_std times the
    user's standard normal, the best mean - the chosen one)."""
    support, values, noise_std = truth
    best, chosen = -np.inf, 0.0
    for k in range(contexts.shape[1]):
        mean = 0.0
        for j in range(support.shape[0]):
            mean += contexts[i, k, support[j]] * values[j]
        best = max(best, mean)
        if k == actions[i]:
            chosen = mean
    return chosen + noise_std * noise[i], best - chosen

