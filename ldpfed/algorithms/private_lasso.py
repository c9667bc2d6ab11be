"""Seed 003 - Shukla (2024): PrivateThresholdLASSO (central / joint DP, sparse high-dimensional linear bandit).

Central model: the server is trusted with the raw (x, r) of every pulled arm (client half shared with seed
001's algorithms: z = [x; r], coordinates of x clipped to the public bound C_X, r to the env's reward bound C_r).
It keeps the sufficient statistics X^T X, X^T y of the whole history (folded in blocks of `FLUSH` rows, so a
user costs one row of a BLAS Gram update, not a d x d outer product) and releases, privately:

* at each episode start (users t = 2^k - 1, k = 1, 2, ...; ALGORITHMS.md; the seed's text also reads 2^(k-1)):
  the support S_t (SparseEstimation, Algorithm 2): LASSO on the history,
  theta_hat = argmin (1/n) ||y - X theta||^2 + lambda_t ||theta||_1, lambda_t = lambda_0 sqrt(2 log n log d / n)
  (coordinate descent on the Gram form with an active set and vectorized KKT checks); S0 = {i : |theta_hat_i| >
  4 lambda_t} (the non-private screen); then AboveNoisyThreshold over |theta_hat_i|, i in S0 in index order,
  stopping after s0 + sqrt(s_bar) positives;
* every round: the least squares on S_t, from tree-aggregated private Gram statistics of z_S = [x_S; r]: a
  fresh tree per episode whose first element is the history's Gram restricted to S_t and whose next elements
  are the rounds' Grams (with B > 1 a round sum: one user is in one element); every tree node gets Wishart
  noise at the per-node budget of Section 3, (eps2 / sqrt(8 L ln(2/delta2)), delta2 / (2 L)), L the depth.
  theta_S = (G_xx + ridge I)^{-1} G_xr; users act greedily: argmax_k x_k^T theta.

Budget (Algorithm 1): E = ceil(log2 T) episodes; delta1 = delta2 = delta / (2E), eps1 = eps2 = eps / (2E ln(1/delta2));
each episode spends (eps1, delta1) on the sparse vector pass and (eps2, delta2) on its tree; the ledger lists both
per-episode guarantees with the number of episodes.

Reconstructions (the seed's Algorithm 2 is partly garbled; marked in `defaults`):
* the queries of the sparse vector pass are |theta_hat_i| (the seed compares signed values) with sensitivity
  Delta_n = c / n, c = 2 C_X (C_r + C_X sqrt(s0) C_theta) / phi^2 (one sample moves the gradient of the
  (1/n)-scaled loss by at most 2 C_X (C_r + C_X ||theta||_1) / n in sup norm; phi^2 = restricted curvature);
  the seed gives the noise xi without a sensitivity.
* the noisy threshold is 4 lambda_t sqrt(s_bar) + gap * xi_T ln(1/delta1) (xi_T = the threshold noise scale):
  the seed's 4 lambda_t Gamma sqrt(s_bar) with Gamma containing xi log(.) is garbled (it turns negative for
  eps > 1 - delta); our margin makes a coordinate at the screen threshold pass with probability about delta1,
  which is what the seed's privacy argument for the non-private screen S0 needs. The non-private subclass uses
  the same threshold with the noise (and so the margin) off.
* the least squares' constraint ||theta|| <= C_theta is replaced by a ridge; `debias` subtracts the (public)
  mean k s^2 I of every Wishart node (off, as in the seed).
* Wishart draws use the Bartlett decomposition with WishartMechanism's calibration (k, sensitivity): the same
  distribution as WishartMechanism.sample, in O(dim^2) instead of O(k dim) (k reaches 1e9 and more here).
"""
from __future__ import annotations

import math

import numpy as np

from ldpfed.algorithms.base import Algorithm
from ldpfed.algorithms.central_linucb import CentralRows
from ldpfed.algorithms.options import Option
from ldpfed.errors import ConfigError
from ldpfed.mechanisms import AboveNoisyThreshold, WishartMechanism, WishartTree, tree_depth
from ldpfed.mechanisms.wishart import new_stream, tree_add

PAPER_003 = "seed 003 Shukla 2024"


def lasso_gram(G, u, n, lam, theta0=None, tol=1e-8, max_sweeps=1000, max_outer=200, grow=10):
    """argmin (1/n) (theta^T G theta - 2 u^T theta) + lam ||theta||_1, G = X^T X, u = X^T y (the Gram form of
    (1/n) ||y - X theta||^2 + lam ||theta||_1).

    Coordinate descent, theta_j = soft(u_j - sum_{k != j} G_jk theta_k, n lam / 2) / G_jj, swept over a working
    set; the KKT conditions of all d coordinates are checked with one vectorized mat-vec between passes, and the
    `grow` (at least) worst violators enter the working set (the solution has at most n nonzeros, so a
    working set keeps the Python sweeps short when d >> n)."""
    d = len(u)
    thr = 0.5 * n * lam
    diag = np.diagonal(G).copy()
    usable = diag > 0
    theta = np.zeros(d) if theta0 is None else np.array(theta0, dtype=float)
    theta[~usable] = 0.0
    working = np.flatnonzero(theta)
    for _ in range(max_outer):
        grad = u - G @ theta
        excess = np.where((theta == 0) & usable, np.abs(grad) - thr * (1.0 + 1e-9), -1.0)
        violators = np.flatnonzero(excess > 0)
        if len(violators) == 0:
            break
        take = max(grow, len(working))
        if len(violators) > take:
            violators = violators[np.argpartition(-excess[violators], take - 1)[:take]]
        working = np.union1d(working, violators)
        Gw = G[np.ix_(working, working)]
        gw, tw, dw = grad[working].copy(), theta[working].copy(), diag[working]
        for _ in range(max_sweeps):
            biggest = 0.0
            for i in range(len(working)):
                old = tw[i]
                rho = gw[i] + dw[i] * old
                new = math.copysign(max(abs(rho) - thr, 0.0), rho) / dw[i]
                if new != old:
                    gw -= Gw[:, i] * (new - old)
                    tw[i] = new
                    change = abs(new - old)
                    if change > biggest:
                        biggest = change
            if biggest <= tol * max(1.0, float(np.max(np.abs(tw)))):
                break
        theta[working] = tw
        working = working[tw != 0]
    return theta


def wishart_bartlett(mech: WishartMechanism, rng: np.random.Generator) -> np.ndarray:
    """A draw of Wishart_dim(k, sensitivity^2 I) with WishartMechanism's calibration, by the Bartlett
    decomposition (WishartMechanism.sample_bartlett, what every node of the episode trees draws)."""
    return mech.sample_bartlett(rng)


class PrivateThresholdLasso(CentralRows, Algorithm):
    """PrivateThresholdLASSO (seed 003, Algorithms 1-2); see the module docstring for the protocol, the budget
    split and what is reconstructed. `private = False` (subclass `lasso-bandit`) turns every noise off."""

    name = "private-lasso"
    paper = f"{PAPER_003}, Algorithm 1 (PrivateThresholdLASSO) with Algorithm 2 (SparseEstimation)"
    privacy_model = "central"
    env_kinds = ("sparse-linear",)
    default_env = "sparse-linear"
    context_norm = "linf"
    private = True
    options = {
        "s0": Option(None, kind="int", low=1, allow=(None,),
                     doc="the sparsity s0, known to the algorithm (the paper); None: the env's public value; at most d"),
        # reconstruction: the paper gives no value. 0.02 with the sparse-linear world's noise std 0.1 puts lambda_t
        # at about half the sup norm of the score noise; the 4 lambda_t screen and the threshold remove the
        # LASSO's false positives (none reached S1 in our seeds)
        "lambda_0": Option(0.02, low=0, low_open=True,
                           doc="LASSO weight lambda_t = lambda_0 sqrt(2 log n log d / n) (a reconstruction: the paper "
                               "gives no value)"),
        "phi2": Option(None, low=0, low_open=True, allow=(None,),
                       doc="compatibility constant phi^2; None: the env's public value (1/3 for sparse-linear)"),
        "s_bar": Option(None, low=1, allow=(None,),
                        doc="None: the paper's 1 + 4 C_r C_X sqrt(s0) / phi^2; the support has at most "
                            "s0 + sqrt(s_bar) coordinates"),
        "C_theta": Option(1.0, low=0, low_open=True, doc="bound on ||theta*||_2"),
        "lasso_sensitivity": Option(None, low=0, low_open=True, allow=(None,),
                                    doc="c of the sparse vector queries' sensitivity Delta_n = c / n (a "
                                        "reconstruction); None: 2 C_X (C_r + C_X sqrt(s0) C_theta) / phi^2"),
        "gap": Option(2.0, low=0, doc="threshold margin, in units of xi_T ln(1/delta1) (a reconstruction)"),
        "ridge": Option(1.0, low=0, doc="ridge of the support least squares, for ||theta|| <= C_theta (a "
                                        "reconstruction)"),
        "debias": Option(False, kind="bool", doc="subtract the Wishart mean k s^2 I of every node from the released "
                                                 "Gram (a reconstruction; off, as in the seed)"),
    }
    # The seed has no experiment; ALGORITHMS.md: d >> s0, e.g. d = 1000, s0 = 5, K = 10 (the env's defaults).
    paper_setting = {"env_params": {"d": 1000, "s0": 5, "K": 10}, "users": 100_000, "eps": 1.0, "delta": 0.1,
                     "params": {}}
    FLUSH = 256

    def setup(self):
        self.client_bounds()   # self.L: coordinate bound C_X, self.R: reward bound C_r
        # None: a public value of the env (or one derived from the other options), held to the option's check
        s0 = self.resolved("s0", self.world.sparsity)   # seed 003 assumes s0 known (public)
        if s0 > self.d:
            raise ConfigError("params.s0", s0, f"must be an integer in [1, d={self.d}]")
        self.s0 = s0
        self.lambda_0 = self.params["lambda_0"]
        self.phi2 = self.resolved("phi2", 1.0 if self.world.context_min_eig is None else self.world.context_min_eig)
        self.C_theta = self.params["C_theta"]
        self.s_bar = self.resolved("s_bar", 1.0 + 4.0 * self.R * self.L * math.sqrt(self.s0) / self.phi2)
        self.lasso_sensitivity = self.resolved(
            "lasso_sensitivity", 2.0 * self.L * (self.R + self.L * math.sqrt(self.s0) * self.C_theta) / self.phi2)
        self.gap, self.ridge, self.debias = self.params["gap"], self.params["ridge"], self.params["debias"]
        self.max_support = min(self.d, int(math.floor(self.s0 + math.sqrt(self.s_bar))))

        # Budget split of Algorithm 1.
        self.episodes = max(1, math.ceil(math.log2(self.T))) if self.T > 1 else 1
        self.delta1 = self.delta2 = self.delta / (2 * self.episodes)
        self.eps1 = self.eps2 = self.eps / (2 * self.episodes * math.log(1.0 / self.delta2))
        # Per-node budget of the episode trees (Section 3, WishartTree), L = the deepest tree (all rounds + the
        # history element); the ledger's tree is the one of the largest support.
        self.tree_depth = tree_depth(self.config.rounds + 1)
        self.eps_node, self.delta_node = WishartTree.node_budget(self.config.rounds + 1, self.eps2, self.delta2)
        if self.private:
            # the episodes' releases: one sparse vector pass (its guarantee does not depend on n) and one tree
            self.mechanisms["support"] = self._svt(threshold=0.0, n=1)
            self.mechanisms["gram"] = self._wishart_tree(self.max_support)

    # ---- helpers -----------------------------------------------------------------------------
    def resolved(self, name: str, fallback):
        """params[name], or when it is None the fallback (a public value), through the option's check."""
        value = self.params[name]
        value = self.options[name].validate(name, fallback if value is None else value)
        if value is None:
            raise ConfigError(f"params.{name}", None, "the env has no public value to default to: set it")
        return value

    def row_bound(self, size: int) -> float:
        """||[x_S; r]|| <= sqrt(|S| C_X^2 + C_r^2): the Wishart sensitivity on a support of that size."""
        return math.sqrt(size * self.L ** 2 + self.R ** 2)

    def _svt(self, threshold, n):
        return AboveNoisyThreshold(threshold, self.eps1, sensitivity=self.lasso_sensitivity / n,
                                   max_positives=self.max_support, delta=self.delta1, model="central")

    def _wishart_tree(self, size) -> WishartTree:
        """The episode tree on a support of `size` coordinates: elements [x_S; r] [x_S; r]^T, (eps2, delta2)."""
        return WishartTree(self.config.rounds + 1, size + 1, self.eps2, self.delta2, sensitivity=self.row_bound(size))

    def _wishart(self, size) -> WishartMechanism:
        """The Wishart mechanism of every node of that tree."""
        return self._wishart_tree(size).node

    def threshold_at(self, n: int) -> float:
        """The (noise-free part of the) threshold of the sparse vector pass after n users:
        4 lambda_n sqrt(s_bar) + gap * xi_T ln(1/delta1) (xi_T = 0 when the noise is off)."""
        base = 4.0 * self.lambda_at(n) * math.sqrt(self.s_bar)
        if not self.private:
            return base
        return base + self.gap * self._svt(0.0, n).threshold_scale * math.log(1.0 / self.delta1)

    def support_svt(self, n: int) -> AboveNoisyThreshold:
        """The AboveNoisyThreshold of the episode starting after n users (eps1, delta1; Delta_n = c / n)."""
        return self._svt(self.threshold_at(n), n)

    def lambda_at(self, n: int) -> float:
        return self.lambda_0 * math.sqrt(2.0 * math.log(n) * math.log(self.d) / n) if n > 1 else 0.0

    def ledger(self):
        why = ("once per episode: every episode's sparse vector pass (LASSO on the whole history) and its tree "
               "(whose first element is the history's Gram) use every earlier user, so one user's data is in at "
               "most all E episodes")
        return [{**row, "releases": self.episodes, "per": "episode", "per_user": self.episodes, "composition": why}
                for row in super().ledger()]

    # ---- server half -------------------------------------------------------------------------
    def initial_state(self, rng):
        d1 = self.d + 1
        return {
            "gram": np.zeros((d1, d1)),              # clean [X y]^T [X y] of the flushed rows
            "buffer": np.zeros((self.FLUSH, d1)), "buffered": 0,
            "users": 0, "rounds": 0,
            "lasso": np.zeros(self.d),               # last LASSO estimate (warm start)
            "support": np.zeros(0, dtype=np.int64),
            "theta_S": np.zeros(0),
            "episode": None,                         # per-episode tree
            # the episode of t = 1 has no history: empty support, nothing released; the next starts at t = 3
            "next_start": 3,                         # next episode start t = 2^k - 1 (1-based user index)
            "episodes": [],                          # (n, lambda, S0, S1) of every episode
        }

    def _flush(self, state):
        k = state["buffered"]
        if k:
            rows = state["buffer"][:k]
            state["gram"] += rows.T @ rows
            state["buffered"] = 0

    def _store_rows(self, state, Z):
        buf = state["buffer"]
        for start in range(0, Z.shape[0], self.FLUSH):
            chunk = Z[start:start + self.FLUSH]
            k = state["buffered"]
            if k + chunk.shape[0] > self.FLUSH:
                self._flush(state)
                k = 0
            buf[k:k + chunk.shape[0]] = chunk
            state["buffered"] = k + chunk.shape[0]

    def _sparse_estimation(self, state, n, rng):
        """Algorithm 2 on the history of n users: the new support."""
        self._flush(state)
        d = self.d
        if n < 2:
            return np.zeros(0, dtype=np.int64)
        lam = self.lambda_at(n)
        G = state["gram"]
        theta_hat = lasso_gram(G[:d, :d], G[:d, d], n, lam, theta0=state["lasso"])
        state["lasso"] = theta_hat
        S0 = np.flatnonzero(np.abs(theta_hat) > 4.0 * lam)
        values = np.abs(theta_hat[S0])
        if self.private:
            S1 = S0[self.support_svt(n).select(values, rng)] if len(S0) else S0
        else:
            S1 = S0[values >= self.threshold_at(n)][:self.max_support]
        state["episodes"].append({"users": n, "lambda": lam, "S0": S0, "S1": S1})
        return np.sort(S1).astype(np.int64)

    def _start_episode(self, state, support, rng):
        state["support"] = support
        if len(support) == 0:      # nothing to estimate, nothing released
            state["episode"], state["theta_S"] = None, np.zeros(0)
            return
        cols = np.append(support, self.d)
        ep = {"cols": cols, **new_stream(len(cols)), "mech": self._wishart(len(support)) if self.private else None}
        state["episode"] = ep
        self._tree_add(state, state["gram"][np.ix_(cols, cols)], rng)   # the history element

    def _tree_add(self, state, element, rng):
        """Binary mechanism with Wishart nodes (ldpfed.mechanisms.wishart.tree_add; no noise when not private):
        append one element (a fresh array, used in place), update the released prefix and the support least
        squares."""
        ep = state["episode"]
        prefix = tree_add(ep, element, rng, ep["mech"], self.debias)
        s = len(ep["cols"]) - 1
        A = prefix[:s, :s].copy()
        A[np.diag_indices(s)] += self.ridge
        try:
            state["theta_S"] = np.linalg.solve(A, prefix[:s, s])
        except np.linalg.LinAlgError:      # singular without ridge: minimum-norm least squares
            state["theta_S"] = np.linalg.lstsq(A, prefix[:s, s], rcond=None)[0]

    def update(self, state, sums, start, stop, rng):
        Z = sums.get("Z")
        if Z is not None:
            self._store_rows(state, Z)
        if state["episode"] is not None and Z is not None:
            cols = state["episode"]["cols"]
            Zs = Z[:, cols]
            self._tree_add(state, Zs.T @ Zs, rng)
        elif state["episode"] is not None:
            self._tree_add(state, np.zeros((len(state["episode"]["cols"]),) * 2), rng)
        state["users"] = stop
        state["rounds"] += 1
        # Does the next round [stop + 1, stop + B] (1-based) contain an episode start t = 2^k - 1?
        B = self.config.round_size
        if stop < self.T and state["next_start"] <= stop + B:
            while state["next_start"] <= stop + B:
                state["next_start"] = 2 * state["next_start"] + 1
            self._start_episode(state, self._sparse_estimation(state, stop, rng), rng)
        return state

    def publish(self, state):
        return {"support": state["support"], "theta_S": state["theta_S"]}

    def estimate(self, state):
        theta = np.zeros(self.d)
        theta[state["support"]] = state["theta_S"]
        return theta

    # ---- client half -------------------------------------------------------------------------
    def act(self, model, contexts, users, rng):
        S = model["support"]
        if len(S) == 0:
            return np.zeros(len(users), dtype=np.int64)   # theta = 0: every arm ties, take the first
        return (contexts[..., S] @ model["theta_S"]).argmax(axis=1)


class LassoBandit(PrivateThresholdLasso):
    """The same thresholded LASSO bandit with every noise off (non-private baseline)."""

    name = "lasso-bandit"
    paper = f"{PAPER_003}, Algorithm 1 without noise (thresholded LASSO bandit, Ariu et al. 2020 style)"
    privacy_model = "none"
    private = False

