"""Seed 003 - Shukla (2024): PrivateThresholdLASSO (central / joint DP, sparse high-dimensional linear bandit).

Central model: the server is trusted with the raw (x, r) of every pulled arm (client half shared with seed
001's algorithms: z = [x; r], coordinates of x clipped to the public bound C_X, r to the env's reward bound C_r).
It keeps the sufficient statistics X^T X, X^T y of the whole history (folded in blocks of `FLUSH` rows, so a
user costs one row of a BLAS Gram update, not a d x d outer product) and releases, privately:

* at each episode start (users t = 2^k - 1, k = 1, 2, ...; the seed's text also reads 2^(k-1)):
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

Written once (ldpfed.algorithms.compiled): act (greedy on the published support), prepare (the clipped row z) and
fold (the row into its slot of the round's rows Z), both shared with seed 001 (central_linucb), and update (the round's rows into the history buffer, the
round's element into the episode's tree, theta_S) are compiled; what is not per user runs in plain Python through
the protocol's breaks()/between(): at an episode start, SparseEstimation (the LASSO and the sparse vector pass)
and the new episode's tree with its history element; when the buffer is full, its rows folded into the Gram (a
symmetric rank-k BLAS update in place, dsyrk). The server's randomness: a round's Wishart node is drawn by
draw_server before the support it lands on is known, so it is drawn for the largest support (max_support + 1
chi-squares, then the normals below the diagonal of the largest node; a node of a smaller support takes the
chi-squares of its own degrees of freedom and the first normals): the same Wishart law for every support, and
the same draws as WishartMechanism.sample_bartlett when the support is the largest; on a smaller (or empty)
support the unused draws shift the server stream (the history element and the sparse vector pass in between()
draw as before, from the same Generator after them).
"""
from __future__ import annotations

import math

import numpy as np

from numba import njit
from scipy.linalg import blas

from ldpfed.algorithms.central_linucb import CentralRows, central_prepare, slot_fold
from ldpfed.algorithms.compiled import CompiledAlgorithm, Steps, no_weights
from ldpfed.algorithms.options import Option
from ldpfed.mechanisms import AboveNoisyThreshold, WishartMechanism, WishartTree, tree_depth
from ldpfed.util.errors import ConfigError

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


# ---- the compiled steps -------------------------------------------------------------------------------------------
@njit(cache=True)
def support_act(model, consts, contexts, i, user, draws, actions):
    """argmax_k x_{k,S}^T theta_S (the first of equals); arm 0 while the support is empty (every arm ties)."""
    support, theta_S = model
    best, arm = -np.inf, 0
    if support.shape[0] > 0:
        for k in range(contexts.shape[1]):
            score = 0.0
            for j in range(support.shape[0]):
                score += contexts[i, k, support[j]] * theta_S[j]
            if k == 0 or score > best:
                best, arm = score, k
    actions[i] = arm


@njit(cache=True)
def flush_rows(gram, buffer, buffered):
    """gram += B^T B of the buffered rows (the compiled fallback of `_flush`, for rounds larger than FLUSH)."""
    k = buffered[0]
    if k:
        rows = buffer[:k]
        gram += np.dot(rows.T, rows)
        buffered[0] = 0


@njit(cache=True)
def mirror_upper(G):
    """G's lower triangle = its upper triangle."""
    for i in range(G.shape[0]):
        for j in range(i):
            G[i, j] = G[j, i]


@njit(cache=True)
def wishart_tree_add(clean, noisy, prefix, tree_j, element, chi, normals, s2, k, debias, noise):
    """The binary mechanism with Wishart nodes (ldpfed.mechanisms.wishart.tree_add), on arrays: append `element`
    (used in place), close the node of level lowbit(j) -- the element plus the clean nodes below it, plus (noise)
    the Bartlett draw s2 A A^T, A lower triangular with sqrt(chi) on the diagonal and `normals` below it (row by
    row), symmetrized; debias: minus its mean k s2 I -- and update the released prefix (in place)."""
    p = element.shape[0]
    j = tree_j[0] + 1
    tree_j[0] = j
    level = 0
    while not (j >> level) & 1:
        level += 1
    for i in range(level):          # the node of `level` covers the element and the nodes below it, which close
        element += clean[i]
        prefix -= noisy[i]
    released = element.copy()
    if noise:
        a = np.zeros((p, p))
        m = 0
        for r in range(p):
            a[r, r] = math.sqrt(chi[r])
            for c in range(r):
                a[r, c] = normals[m]
                m += 1
        w = np.zeros((p, p))
        for r in range(p):
            for c in range(p):
                s = 0.0
                for l in range(min(r, c) + 1):
                    s += a[r, l] * a[c, l]
                w[r, c] = s * s2
        for r in range(p):
            for c in range(p):
                released[r, c] += (w[r, c] + w[c, r]) * 0.5
        if debias:
            for r in range(p):
                released[r, r] -= k * s2
    clean[level] = element
    noisy[level] = released
    prefix += released


@njit(cache=True)
def support_solve(prefix, theta_S, ridge):
    """theta_S = (G_SS + ridge I)^{-1} G_Sr from the released prefix (least squares when singular)."""
    s = theta_S.shape[0]
    A = np.empty((s, s))
    u = np.empty(s)
    for r in range(s):
        for c in range(s):
            A[r, c] = prefix[r, c]
        A[r, r] += ridge
        u[r] = prefix[r, s]
    try:
        theta_S[:] = np.linalg.solve(A, u)
    except Exception:                # singular without ridge: minimum-norm least squares
        theta_S[:] = np.linalg.lstsq(A, u)[0]


@njit(cache=True)
def lasso_update(state, consts, sums, start, stop, server):
    """The round's rows into the history buffer (flushed into the Gram when full), and, during an episode, their
    Gram on the support columns into the episode's tree (its node's Wishart draws: server[0], laid out for the
    largest support; chi_index picks the chi-square draws of this support's degrees of freedom), then theta_S."""
    gram, buffer, buffered, support, theta_S, cols, tree_j, clean, noisy, prefix, users, rounds = state
    ridge, debias, noise, chi_index, kk, sens2, n_chi = consts[4:11]
    w = buffer.shape[1]
    flush = buffer.shape[0]
    n_rows = sums.shape[0] // w
    for c0 in range(0, n_rows, flush):
        m = min(flush, n_rows - c0)
        if buffered[0] + m > flush:
            flush_rows(gram, buffer, buffered)
        k = buffered[0]
        for r in range(m):
            for c in range(w):
                buffer[k + r, c] = sums[(c0 + r) * w + c]
        buffered[0] = k + m
    p = cols.shape[0]
    if p > 0:
        element = np.zeros((p, p))
        for r in range(n_rows):
            z = sums[r * w:(r + 1) * w]
            for a in range(p):
                za = z[cols[a]]
                if za != 0.0:
                    for c in range(p):
                        element[a, c] += za * z[cols[c]]
        chi = np.empty(p)
        normals = server[0, n_chi:]
        if noise:
            for i in range(p):
                chi[i] = server[0, chi_index[p, i]]
        wishart_tree_add(clean, noisy, prefix, tree_j, element, chi, normals, sens2[p], kk[p], debias, noise)
        support_solve(prefix, theta_S, ridge)
    users[0] = stop
    rounds[0] += 1


class PrivateThresholdLasso(CentralRows, CompiledAlgorithm):
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
    # The seed has no experiment; a reconstruction: d >> s0, e.g. d = 1000, s0 = 5, K = 10 (the env's defaults).
    paper_setting = {"env_params": {"d": 1000, "s0": 5, "K": 10}, "users": 100_000, "eps": 1.0, "delta": 0.1,
                     "params": {}}
    FLUSH = 256
    state_keys = ("gram", "buffer", "buffered", "support", "theta_S", "cols", "tree_j", "tree_clean", "tree_noisy",
                  "tree_prefix", "users", "rounds")
    model_keys = ("support", "theta_S")

    def setup(self):
        self.client_bounds()   # self.L: coordinate bound C_X, self.reward_bound: C_r
        # None: a public value of the env (or one derived from the other options), held to the option's check
        s0 = self.resolved("s0", self.world.sparsity)   # seed 003 assumes s0 known (public)
        if s0 > self.d:
            raise ConfigError("params.s0", s0, f"must be an integer in [1, d={self.d}]")
        self.s0 = s0
        self.lambda_0 = self.params["lambda_0"]
        self.phi2 = self.resolved("phi2", 1.0 if self.world.context_min_eig is None else self.world.context_min_eig)
        self.C_theta = self.params["C_theta"]
        self.s_bar = self.resolved("s_bar", 1.0 + 4.0 * self.reward_bound * self.L * math.sqrt(self.s0) / self.phi2)
        self.lasso_sensitivity = self.resolved(
            "lasso_sensitivity", 2.0 * self.L * (self.reward_bound + self.L * math.sqrt(self.s0) * self.C_theta) / self.phi2)
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
        self._node_draws()

    def _node_draws(self):
        """How a round's Wishart node is drawn ahead of the support it lands on (draw_server): the chi-square
        draws of every degree of freedom a node on a support of 1..max_support coordinates needs (a node of
        dimension p = |S| + 1 draws chi2(k_p - i), i < p; k_p - p does not depend on p, so these are the
        max_support + 1 degrees of freedom of the largest node, in its order), then the standard normals below
        the diagonal of the largest node (a smaller node uses the first p (p - 1) / 2, its rows of the lower
        triangle). chi_index[p, i]: where chi2(k_p - i) is; kk[p], sens2[p]: k and s^2 of the node's mechanism."""
        pmax = self.max_support + 1
        self.node_k = np.zeros(pmax + 1)
        self.node_s2 = np.zeros(pmax + 1)
        if not self.private:
            self.chi_dfs = np.zeros(0)
            self.chi_index = np.zeros((pmax + 1, pmax), dtype=np.int64)
            self.n_normals = 0
            return
        dfs = {}
        for p in range(2, pmax + 1):
            mech = self._wishart(p - 1)
            self.node_k[p], self.node_s2[p] = mech.k, mech.sensitivity ** 2
            for i in range(p):
                dfs[(p, i)] = mech.k - i
        self.chi_dfs = np.array(sorted(set(dfs.values()), reverse=True), dtype=float)
        where = {df: j for j, df in enumerate(self.chi_dfs.tolist())}
        self.chi_index = np.zeros((pmax + 1, pmax), dtype=np.int64)
        for (p, i), df in dfs.items():
            self.chi_index[p, i] = where[float(df)]
        self.n_normals = pmax * (pmax - 1) // 2

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
        return math.sqrt(size * self.L ** 2 + self.reward_bound ** 2)

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

    # ---- the compiled protocol ---------------------------------------------------------------------------------
    def steps(self):
        return Steps(support_act, central_prepare, no_weights, lasso_update, fold=slot_fold)

    def consts(self):
        return (*self.row_consts(), float(self.ridge), bool(self.debias), bool(self.private), self.chi_index,
                self.node_k, self.node_s2, int(len(self.chi_dfs)))

    def draw_server(self, n, rng):
        # the node of each round (one per round; each user's at B = 1): chi-squares, then normals (module doc of
        # _node_draws); none without noise
        if not self.private:
            return np.zeros((n, 0))
        m = len(self.chi_dfs)
        out = np.zeros((n, m + self.n_normals))
        rows = self.server_rows(n)
        if rows:
            out[:rows, :m] = rng.chisquare(np.broadcast_to(self.chi_dfs, (rows, m)))
            out[:rows, m:] = rng.standard_normal((rows, self.n_normals))
        return out

    def episode_starts(self, hi: int) -> list:
        """The round ends u <= hi (u < T) after which an episode starts: the first user of the next round is at or
        after the next t = 2^k - 1 (1-based; k >= 2, t = 3, 7, 15, ...), i.e. some t in (u, u + B] (in the first
        round, some t <= 2B)."""
        B = self.config.round_size
        out, k = [], 2
        while (1 << k) - 1 <= hi + B:
            u = max(B, B * (((1 << k) - 2) // B))
            if u <= hi and u < self.T and (not out or out[-1] != u):
                out.append(u)
            k += 1
        return out

    def breaks(self, start, stop):
        """Episode starts, and the round ends after which the history buffer is full (the next round's rows would
        not fit: flushed then, by BLAS's symmetric rank-k update); in (start, stop]."""
        B = self.config.round_size
        hi = min(stop, self.T - 1)
        if hi <= start:
            return []
        starts = self.episode_starts(hi)
        out = {u for u in starts if u > start}
        step = (self.FLUSH // B) * B         # a flush every FLUSH // B rounds after the last episode start
        if step:
            bounds = [0] + starts
            for i, e in enumerate(bounds):
                end = bounds[i + 1] if i + 1 < len(bounds) else hi + 1
                first = e + step * max(1, -(-(start + 1 - e) // step))
                out.update(range(first, min(end, hi + 1), step))
        return sorted(out)

    def between(self, state, stop, rng):
        """At an episode start: SparseEstimation on the history, then the episode's tree (its first element the
        history's Gram on the new support); else the buffer is full: flush it."""
        B = self.config.round_size
        if stop in self.episode_starts(stop):
            self._start_episode(state, self._sparse_estimation(state, stop, rng), rng)
            state["next_start"][0] = (1 << (stop + B + 1).bit_length()) - 1
        elif state["buffered"][0] + B > self.FLUSH:
            self._flush(state)

    # ---- server half -------------------------------------------------------------------------
    def initial_state(self, rng):
        d1 = self.d + 1
        E = (self.T + self.config.round_size).bit_length() + 1    # more than the episode starts
        return {
            "gram": np.zeros((d1, d1)),              # clean [X y]^T [X y] of the flushed rows
            "buffer": np.zeros((self.FLUSH, d1)), "buffered": np.zeros(1, dtype=np.int64),
            "users": np.zeros(1, dtype=np.int64), "rounds": np.zeros(1, dtype=np.int64),
            "lasso": np.zeros(self.d),               # last LASSO estimate (warm start)
            "support": np.zeros(0, dtype=np.int64),
            "theta_S": np.zeros(0),
            # the episode's tree on the columns [S; r] (none while the support is empty): its step j, the clean and
            # released (noisy) node of every level, the released prefix sum
            "cols": np.zeros(0, dtype=np.int64), "tree_j": np.zeros(1, dtype=np.int64),
            "tree_clean": np.zeros((self.tree_depth, 0, 0)), "tree_noisy": np.zeros((self.tree_depth, 0, 0)),
            "tree_prefix": np.zeros((0, 0)),
            # the episode of t = 1 has no history: empty support, nothing released; the next starts at t = 3
            "next_start": np.array([3], dtype=np.int64),   # next episode start t = 2^k - 1 (1-based user index)
            # every episode (see `episodes`): users n, lambda, S0 and S1 as masks over the d coordinates
            "n_episodes": np.zeros(1, dtype=np.int64), "episode_users": np.zeros(E, dtype=np.int64),
            "episode_lambda": np.zeros(E), "episode_S0": np.zeros((E, self.d), dtype=bool),
            "episode_S1": np.zeros((E, self.d), dtype=bool),
        }

    def _flush(self, state):
        k = int(state["buffered"][0])
        if k:
            # gram += rows^T rows in place: BLAS's symmetric rank-k update of the upper triangle (gram.T is its
            # Fortran-order view, whose lower triangle that is), then mirrored: the bits of `gram += rows.T @ rows`
            # (numpy's own syrk) without its d x d temporary
            gram = state["gram"]
            blas.dsyrk(1.0, state["buffer"][:k], beta=1.0, c=gram.T, trans=1, lower=1, overwrite_c=1)
            mirror_upper(gram)
            state["buffered"][0] = 0

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
        e = int(state["n_episodes"][0])
        state["episode_users"][e], state["episode_lambda"][e] = n, lam
        state["episode_S0"][e, S0] = True
        state["episode_S1"][e, S1] = True
        state["n_episodes"][0] = e + 1
        return np.sort(S1).astype(np.int64)

    def _start_episode(self, state, support, rng):
        s = len(support)
        p = s + 1 if s else 0                        # nothing to estimate, nothing released on an empty support
        state["support"] = support
        state["theta_S"] = np.zeros(s)
        state["cols"] = np.append(support, self.d).astype(np.int64) if s else np.zeros(0, dtype=np.int64)
        state["tree_j"] = np.zeros(1, dtype=np.int64)
        state["tree_clean"] = np.zeros((self.tree_depth, p, p))
        state["tree_noisy"] = np.zeros((self.tree_depth, p, p))
        state["tree_prefix"] = np.zeros((p, p))
        if not s:
            return
        cols = state["cols"]
        element = state["gram"][np.ix_(cols, cols)]           # the history element (a fresh array)
        if self.private:                                      # WishartMechanism.sample_bartlett's draws
            mech = self._wishart(s)
            chi = rng.chisquare(mech.k - np.arange(p))
            normals = rng.standard_normal(p * (p - 1) // 2)
            k, s2 = float(mech.k), mech.sensitivity ** 2
        else:
            chi, normals, k, s2 = np.zeros(p), np.zeros(0), 0.0, 0.0
        wishart_tree_add(state["tree_clean"], state["tree_noisy"], state["tree_prefix"], state["tree_j"], element,
                         chi, normals, s2, k, bool(self.debias), bool(self.private))
        support_solve(state["tree_prefix"], state["theta_S"], float(self.ridge))

    def estimate(self, state):
        theta = np.zeros(self.d)
        theta[state["support"]] = state["theta_S"]
        return theta


def episodes(state) -> list[dict]:
    """The episodes of a private-lasso / lasso-bandit state: users n, lambda, S0 (the screen) and S1 (the
    support released), as index arrays."""
    return [{"users": int(state["episode_users"][e]), "lambda": float(state["episode_lambda"][e]),
             "S0": np.flatnonzero(state["episode_S0"][e]), "S1": np.flatnonzero(state["episode_S1"][e])}
            for e in range(int(state["n_episodes"][0]))]


class LassoBandit(PrivateThresholdLasso):
    """The same thresholded LASSO bandit with every noise off (non-private baseline)."""

    name = "lasso-bandit"
    paper = f"{PAPER_003}, Algorithm 1 without noise (thresholded LASSO bandit, Ariu et al. 2020 style)"
    privacy_model = "none"
    private = False
