"""Seed 001 - Wang, Zhao, Wang (RecSys 2022): LinUCB, constant-sensitivity Private LinUCB, Private LinUCB-DGS.

Central DP: the server is trusted with the raw (x, r) of the pulled arm; what is protected is what the server
RELEASES (the model every later user acts on, hence the arm sequence). Noise is added at the server by the
tree (binary) mechanism, in `update`, from the round's "server" generator.

Client half (shared): the user pulls argmax_a theta^T x_a + alpha ||x_a||_{A^{-1}} with the published
(theta, A^{-1}) and sends z = [x; r] (x clipped to the public context bound L, r to the env's reward bound R;
clipped users are counted). The round's aggregate Z places each user's row at slot (user index mod B) of a
(B, d+1) array: a sum of one-hot-placed messages, so population/shard sums are exact, and the server gets the
round's rows (Z^T Z is then the round's augmented Gram matrix, the stream element of the tree: with B > 1 one
element is a round sum, and one user is in exactly one element).

Written once (ldpfed.algorithms.compiled): act (the UCB index), prepare (the clipped row z, shared with seed 003's
algorithms: `central_prepare`), fold (the row into its slot of Z: `slot_fold`, shared too) and update (the
server's step on the round's rows, its tree noise included) are compiled functions that every engine path runs. The tree's node noise is the server's randomness: `draw_server`
draws it (one node per round, in the order the tree mechanism draws it) and the compiled update scales it.

The spec is the paper: Huazheng Wang, David Zhao, Hongning Wang, "Dynamic Global Sensitivity for Differentially
Private Contextual Bandits", RecSys 2022 (doi:10.1145/3523227.3546781; arXiv:2208.14555). Where a formula was not
available to us it is reconstructed; options marked "reconstruction" are ours, not the paper's text.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from ldpfed.algorithms.compiled import CompiledAlgorithm, Steps, no_weights
from ldpfed.algorithms.fields import Field
from ldpfed.algorithms.options import CALIBRATION, Option
from ldpfed.mechanisms.clip import clip_value
from ldpfed.util.linalg import inverse_cholesky
from ldpfed.mechanisms import (Domain, DynamicTreeMechanism, Guarantee, SumBounds, TreeMechanism, gaussian_sigma,
                              node_draws, tree_depth)

PAPER_001 = "seed 001 Wang, Zhao, Wang 2022"
# Seed 001's simulation (Section 4): arm pool of 1,000, 10 arms shown, reward noise std 0.5; eps, delta lost:
# the reconstruction takes delta = 0.1 with eps swept; eps = 1 is the default point of the sweep.
SETTING_001 = {"env_params": {}, "users": 100_000, "eps": 1.0, "delta": 0.1, "params": {}}


# ---- the client half and the aggregate, shared with seed 003 (consts start with (L, R, linf, B)) -------------
@njit(cache=True)
def _einsum_dot(x, y, n):
    """sum x_j y_j over [:n] in the order of numpy's einsum over a contiguous last axis ("ij,ij->i": two lanes,
    blocks of four pairs added last pair first, the tail a pair at a time, then the lanes). The squared norm of
    clip.clip_rows_in_place, whose comparison with L^2 decides, for rows of norm 1 up to rounding, whether a row
    counts as clipped; and the UCB width, whose value decides the ties of the first users (theta = 0, A^{-1} a
    multiple of I: every arm of norm 1 ties up to rounding)."""
    a0, a1 = 0.0, 0.0
    i = 0
    while n - i >= 8:
        for k in range(3, -1, -1):
            a0 = a0 + x[i + 2 * k] * y[i + 2 * k]
            a1 = a1 + x[i + 2 * k + 1] * y[i + 2 * k + 1]
        i += 8
    while i < n:
        a0 = a0 + x[i] * y[i]
        if i + 1 < n:
            a1 = a1 + x[i + 1] * y[i + 1]
        i += 2
    return a0 + a1


@njit(cache=True)
def _block_sq(x, lo, n):
    """numpy's pairwise_sum of x[lo:lo + n]^2 for n <= 128 (its leaf: eight accumulators)."""
    if n < 8:
        res = -0.0
        for i in range(n):
            res += x[lo + i] * x[lo + i]
        return res
    r = np.empty(8)
    for j in range(8):
        r[j] = x[lo + j] * x[lo + j]
    i = 8
    while i < n - (n % 8):
        for j in range(8):
            r[j] += x[lo + i + j] * x[lo + i + j]
        i += 8
    res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
    while i < n:
        res += x[lo + i] * x[lo + i]
        i += 1
    return res


@njit(cache=True)
def _pairwise_sq(x, lo, n):
    """sum x_j^2 over x[lo:lo + n] in the order of numpy's pairwise add.reduce (np.linalg.norm of a row): halves
    (cut at a multiple of 8) summed recursively above 128 entries, written with a stack (numba's disk cache does
    not keep recursive functions)."""
    if n <= 128:
        return _block_sq(x, lo, n)
    los = np.empty(64, dtype=np.int64)
    ns = np.empty(64, dtype=np.int64)
    stage = np.zeros(64, dtype=np.int64)
    left = np.empty(64)
    sp, ret = 0, 0.0
    los[0], ns[0] = lo, n
    while sp >= 0:
        a, m = los[sp], ns[sp]
        if m <= 128:
            ret = _block_sq(x, a, m)
            sp -= 1
            continue
        half = m // 2
        half -= half % 8
        if stage[sp] == 0:              # the first half
            stage[sp] = 1
            sp += 1
            los[sp], ns[sp], stage[sp] = a, half, 0
        elif stage[sp] == 1:            # the second half
            left[sp] = ret
            stage[sp] = 2
            sp += 1
            los[sp], ns[sp], stage[sp] = a + half, m - half, 0
        else:
            ret = left[sp] + ret
            sp -= 1
    return ret


@njit(cache=True)
def central_prepare(model, consts, contexts, actions, reward, user, i, inputs, counts):
    """Row i: z = [x; r] of the pulled arm, x clipped to L (l2: a row of squared norm over L^2 scaled by
    L / ||x||; linf: every coordinate clipped to [-L, L], the row counted once), r clipped to R; counts[i, 0]:
    clipped x plus clipped r (the rules of clip.clip_rows_in_place / clip_coords_in_place / clip_values, their sums
    in numpy's order: the same rows clipped and counted, to the bit)."""
    L, R, linf = consts[0], consts[1], consts[2]
    arm = actions[i]
    row = inputs[i]
    d = row.shape[0] - 1
    for j in range(d):
        row[j] = contexts[i, arm, j]
    clipped = 0
    if linf:
        for j in range(d):
            if abs(row[j]) > L:
                clipped = 1
        if clipped:
            for j in range(d):
                row[j] = min(max(row[j], -L), L)
    else:
        if _einsum_dot(row, row, d) > L * L:
            scale = L / math.sqrt(_pairwise_sq(row, 0, d))
            for j in range(d):
                row[j] *= scale
            clipped = 1
    r, clipped_r = clip_value(reward, R)
    row[d] = r
    counts[i, 0] = clipped + clipped_r


@njit(cache=True)
def slot_fold(consts, user, row, out):
    """The aggregate Z: the user's row at slot (user mod B) of the (B, d+1) rows (B = consts[3]; 1 at B = 1)."""
    w = row.shape[0]
    base = (user % consts[3]) * w
    for j in range(w):
        out[base + j] += row[j]


class CentralRows:
    """Client half of the central-model linear algorithms (seeds 001 and 003): raw z = [x; r] of the pulled arm.

    Subclasses set `context_norm` ("l2": clip ||x|| to L; "linf": clip every coordinate to L)."""

    context_norm = "l2"
    metric_names = ("clipped",)

    def client_bounds(self):
        bound = self.world.context_bound
        self.L = 1.0 if bound is None else float(bound)
        self.reward_bound = float(self.world.reward_bound)

    def row_consts(self) -> tuple:
        """(L, R, linf, B): the first consts of every central-rows algorithm (central_prepare and slot_fold read
        them; B the rows of the aggregate)."""
        return float(self.L), float(self.reward_bound), self.context_norm == "linf", int(self.config.round_size)

    def sum_fields(self):
        # the round's rows (slot_fold): one at B = 1
        return {"Z": (self.config.round_size, self.d + 1)}

    def fields(self):
        # z = [x; r], raw (no mechanism makes it: the server is trusted; the private algorithms' mechanisms are the
        # server's releases, in self.mechanisms); the trusted server still accepts only the public bounds:
        # ||x|| <= L (l2) or |x_i| <= L (linf), |r| <= R
        high = np.append(np.full(self.d, self.L), self.reward_bound)
        z = Domain((self.d + 1,), low=-high, high=high, norm_part=self.d,
                   max_radius=self.L if self.context_norm == "l2" else None,
                   source=f"raw [x; r], {self.context_norm} ||x|| <= L, |r| <= R")
        return {"z": Field((self.d + 1,), domain=z, raw=True)}

    def aggregate_bounds(self, users):
        # the round's rows: a user's row at slot (user mod B) within the bounds, every other row 0
        users = np.asarray(users)
        rows = 1 if self.config.round_size == 1 else self.config.round_size
        high = np.zeros((rows, self.d + 1))
        high[users % rows] = np.append(np.full(self.d, self.L), self.reward_bound)
        row_max = high[:, 0] if self.context_norm == "l2" else np.full(rows, np.inf)
        groups = np.arange(high.size) // (self.d + 1) + rows * (np.arange(high.size) % (self.d + 1) == self.d)
        return {"Z": SumBounds(-high.reshape(-1), high.reshape(-1), groups=groups,
                               group_max=np.concatenate([row_max * (1 + 1e-9), np.full(rows, np.inf)]))}

    def server_rows(self, n: int) -> int:
        """How many of n users' rows of server draws are drawn: each user's at B = 1 (a user is a round), the
        round's first only otherwise (one stream element, one node, per round)."""
        return n if self.config.round_size == 1 else min(n, 1)

    def node_draws_per_user(self, n: int, rng, noise: str, size: int) -> np.ndarray:
        """The server draws of n users, (n, size): the standard draws of the tree node each closes (the
        mechanisms' node_draws, as TreeNoise draws a node), zero rows for users who close none (server_rows)."""
        rows = self.server_rows(n)
        draws = node_draws(noise, rng, rows, size)
        if rows == n:
            return draws
        out = np.zeros((n, size))
        out[:rows] = draws
        return out


# ---- LinUCB's compiled steps ----------------------------------------------------------------------------------
@njit(cache=True)
def _quadratic_width(x, Ainv, v, d):
    """x^T Ainv x (v: scratch, x^T Ainv first)."""
    for a in range(d):
        v[a] = 0.0
    for b in range(d):
        xb = x[b]
        for a in range(d):
            v[a] += xb * Ainv[b, a]
    return _einsum_dot(v, x, d)


@njit(cache=True)
def _factor_width(x, Linv, d):
    """x^T A^{-1} x = ||Linv x||^2 for the lower-triangular Linv = L^{-1}, A = L L^T."""
    s = 0.0
    for k in range(d):
        v = 0.0
        for a in range(k + 1):
            v += Linv[k, a] * x[a]
        s += v * v
    return s


@njit(cache=True)
def _ucb_arm(theta, inverse, factor, alpha, contexts, i):
    """argmax_k x_k^T theta + alpha sqrt(max(x_k^T A^{-1} x_k, 0)) (the first of equals), A^{-1} given as itself
    (factor False) or as its factor Linv (factor True: inverse_cholesky)."""
    K, d = contexts.shape[1], contexts.shape[2]
    v = np.empty(d)
    best, arm = -np.inf, 0
    for k in range(K):
        x = contexts[i, k]
        score = 0.0
        for a in range(d):
            score += x[a] * theta[a]
        if alpha > 0:
            width = _factor_width(x, inverse, d) if factor else _quadratic_width(x, inverse, v, d)
            score = score + alpha * math.sqrt(max(width, 0.0))
        if k == 0 or score > best:
            best, arm = score, k
    return arm


@njit(cache=True)
def ucb_act(model, consts, contexts, i, user, draws, actions):
    """The UCB index with the published (theta, A^{-1}); alpha = consts[4]."""
    actions[i] = _ucb_arm(model[0], model[1], False, consts[4], contexts, i)


@njit(cache=True)
def factor_ucb_act(model, consts, contexts, i, user, draws, actions):
    """The UCB index with the published (theta, inverse, factored): `inverse` is L^{-1} of A = L L^T when
    factored[0] = 1, A^{-1} itself when 0 (the first model, and an A that is not positive definite); alpha =
    consts[4]."""
    actions[i] = _ucb_arm(model[0], model[1], model[2][0] == 1, consts[4], contexts, i)


@njit(cache=True)
def _round_gram(sums, d):
    """(X^T X, X^T r) of the round's rows (flat, rows of d + 1)."""
    w = d + 1
    G = np.zeros((d, d))
    u = np.zeros(d)
    for m in range(sums.shape[0] // w):
        z = sums[m * w:(m + 1) * w]
        r = z[d]
        for a in range(d):
            za = z[a]
            if za != 0.0:
                for b in range(d):
                    G[a, b] += za * z[b]
            u[a] += za * r
    return G, u


@njit(cache=True)
def _matvec(M, x, out):
    for a in range(M.shape[0]):
        s = 0.0
        for b in range(M.shape[1]):
            s += M[a, b] * x[b]
        out[a] = s


@njit(cache=True)
def clean_update(A, Ainv, b, theta, rounds, sums, refresh):
    """LinUCB's server step: A += X^T X, b += X^T r, theta = A^{-1} b. A^{-1} by Sherman-Morrison for a one-user
    round (O(d^2)), by an exact inverse for larger rounds and every `refresh` rounds."""
    d = A.shape[0]
    w = d + 1
    if sums.shape[0] == w and rounds[0] % refresh != 0:
        x = sums[:d]
        r = sums[d]
        Ax = np.empty(d)
        _matvec(Ainv, x, Ax)
        xAx = 0.0
        for a in range(d):
            xAx += x[a] * Ax[a]
        denom = 1.0 + xAx
        for a in range(d):
            xa = x[a]
            for c in range(d):
                A[a, c] += xa * x[c]
        for c in range(d):              # Ainv -= outer(Ax, Ax / denom)
            Ax_c = Ax[c] / denom
            for a in range(d):
                Ainv[a, c] -= Ax[a] * Ax_c
        for a in range(d):
            b[a] += x[a] * r
    else:
        G, u = _round_gram(sums, d)
        A += G
        Ainv[:, :] = np.linalg.inv(A)
        b += u
    _matvec(Ainv, b, theta)


@njit(cache=True)
def linucb_update(state, consts, sums, start, stop, server):
    A, Ainv, b, theta, rounds, users = state
    clean_update(A, Ainv, b, theta, rounds, sums, consts[5])
    rounds[0] += 1
    users[0] = stop


class LinUCB(CentralRows, CompiledAlgorithm):
    """Non-private LinUCB: A = lam I + sum x x^T, b = sum r x, theta = A^{-1} b, index theta^T x + alpha ||x||_{A^{-1}}.

    The server keeps A, A^{-1} (Sherman-Morrison for one-user rounds, exact inverse otherwise and every
    `REFRESH` rounds) and b; it publishes (theta, A^{-1}). No privacy (privacy_model "none"); the client sends
    raw data as in the central model."""

    name = "linucb"
    paper = f"{PAPER_001}, Section 4 baseline LinUCB (Li et al. 2010)"
    privacy_model = "none"
    env_kinds = ("arm-pool", "linear")
    default_env = "arm-pool"
    options = {
        "alpha": Option(0.3, low=0, doc="exploration width alpha of the index theta^T x + alpha ||x||_{A^-1} "
                                        "(reconstruction: the seed lost its alpha; 0.3 is the usual value of the "
                                        "authors' LinUCB code)"),
        "lam": Option(1.0, low=0, low_open=True, doc="ridge lambda of A = lambda I + sum x x^T"),
    }
    paper_setting = SETTING_001
    REFRESH = 4096
    state_keys = ("A", "Ainv", "b", "theta", "rounds", "users")
    model_keys = ("theta", "Ainv")

    def setup(self):
        self.alpha, self.lam = self.params["alpha"], self.params["lam"]
        self.client_bounds()

    def steps(self):
        return Steps(ucb_act, central_prepare, no_weights, linucb_update, fold=slot_fold)

    def consts(self):
        return (*self.row_consts(), float(self.alpha), int(self.REFRESH))

    # ---- server half -------------------------------------------------------------------------
    def initial_state(self, rng):
        d = self.d
        return {"A": self.lam * np.eye(d), "Ainv": np.eye(d) / self.lam, "b": np.zeros(d), "theta": np.zeros(d),
                "rounds": np.zeros(1, dtype=np.int64), "users": np.zeros(1, dtype=np.int64)}

    def estimate(self, state):
        return state["theta"]


# ---- Private LinUCB ---------------------------------------------------------------------------------------------
@njit(cache=True)
def tree_level(t):
    """The level of the node closing at step t: its lowest set bit."""
    level = 0
    while not (t >> level) & 1:
        level += 1
    return level


@njit(cache=True)
def tree_above(t, level, depth):
    """The next set bit of t above `level` (-1: none). The tree's noise is kept as partial sums: partial[j] = the
    nodes of t's set bits >= j, added from the highest level down, valid at t's set bits. At step t the bits above
    lowbit(t) are those of t - 1, so their partials hold, and the noise of prefix t is partial[above] + the node
    closing now: one node's work per step instead of popcount(t) (the same nodes, summed in another order)."""
    for j in range(level + 1, depth):
        if (t >> j) & 1:
            return j
    return -1


@njit(cache=True)
def private_linucb_update(state, consts, sums, start, stop, server):
    """One stream element G = Z^T Z of the round into the Gaussian tree (its node noise: server[0], the upper
    triangle row by row, times the node std, mirrored; added to the partial sum above it: tree_above), then
    A~ = M[:d, :d] + shift I and theta~ = A~^{-1} M[:d, d] from the noisy prefix sum M, A~^{-1} kept as its factor
    Linv (inverse_cholesky; A~^{-1} itself, factored = 0, in the rare case that A~ is not positive definite)."""
    partial, total, tree_t, inverse, factored, theta, rounds, users = state
    node_scale, shift = consts[5], consts[6]
    w = partial.shape[1]
    d = w - 1
    G = np.zeros((w, w))                # the round's element Z^T Z, then added to the clean prefix sum
    for m in range(sums.shape[0] // w):
        z = sums[m * w:(m + 1) * w]
        for a in range(w):
            za = z[a]
            if za != 0.0:
                for c in range(w):
                    G[a, c] += za * z[c]
    total += G
    t = tree_t[0] + 1
    tree_t[0] = t
    level = tree_level(t)
    above = tree_above(t, level, partial.shape[0])
    noisy = partial[level]              # the noise of prefix t
    k = 0
    noise = server[0]
    for a in range(w):
        for c in range(a, w):
            value = noise[k] * node_scale
            k += 1
            if above >= 0:
                value += partial[above, a, c]
            noisy[a, c] = value
            noisy[c, a] = value
    A = np.empty((d, d))
    u = np.empty(d)
    for a in range(d):
        for c in range(d):
            A[a, c] = total[a, c] + noisy[a, c]
        A[a, a] += shift
        u[a] = total[a, d] + noisy[a, d]
    if inverse_cholesky(A, inverse):    # inverse = Linv; theta = Linv^T (Linv u)
        factored[0] = 1
        y = np.empty(d)
        for a in range(d):
            s = 0.0
            for c in range(a + 1):
                s += inverse[a, c] * u[c]
            y[a] = s
        for c in range(d):
            theta[c] = 0.0
        for a in range(d):
            ya = y[a]
            for c in range(a + 1):
                theta[c] += inverse[a, c] * ya
    else:                               # not positive definite (probability <= upsilon_alpha): A~^{-1} itself
        factored[0] = 0
        full = np.linalg.inv(A)
        for a in range(d):
            for c in range(d):
                inverse[a, c] = (full[a, c] + full[c, a]) * 0.5     # exactly symmetric
        _matvec(inverse, u, theta)
    rounds[0] += 1
    users[0] = stop


class PrivateLinUCB(LinUCB):
    """Constant-sensitivity Private LinUCB (Shariff & Sheffet 2018 / Neel & Roth 2018 style; seed 001's baseline).

    Stream element of round e: G_e = sum over its users of z z^T, z = [x; r]. The tree mechanism (symmetric
    Gaussian nodes) releases noisy prefix sums M_t; the server keeps nothing else. Released model:
    A~ = M_t[:d, :d] + (lam + 2 Upsilon) I, u~ = M_t[:d, d], theta~ = A~^{-1} u~, published with A~^{-1}
    (post-processing of the release) in the form of its inverse Cholesky factor L^{-1}, A~ = L L^T (`inverse`,
    `factored` = 1): the width ||L^{-1} x||^2 costs the user half of x^T A~^{-1} x, and the server saves the
    product L^{-T} L^{-1}. The first model (shift^{-1} I) and an A~ that is not positive definite publish A~^{-1}
    itself (`factored` = 0). Upsilon = node_std sqrt(depth) (4 sqrt(d+1) + 2 ln(2 T / upsilon_alpha))
    bounds the operator norm of the prefix noise with probability 1 - upsilon_alpha (Shariff & Sheffet), so
    A~ is positive definite with that probability (the client clamps a negative width to 0 otherwise).

    Privacy: the whole (eps, delta) goes to the tree: one user changes one element by at most
    ||z z^T - z' z'^T||_F <= sqrt(2) (L^2 + R^2) (neighbouring = one user's (x, r) replaced), which bounds the
    L2 norm of the upper triangle; node std = sqrt(depth) sigma(sensitivity, eps, delta) (TreeMechanism).

    The tree's state is arrays: `tree_partial` (depth, d+1, d+1), the partial sums of its nodes (tree_above), the
    clean prefix sum `tree_sum` and the step `tree_t`; a node's noise is drawn by draw_server (standard normals of
    its upper triangle, as TreeMechanism draws them) and scaled by the node std in the compiled update.
    """

    name = "private-linucb"
    paper = f"{PAPER_001}, Section 4 baseline Private LinUCB (constant sensitivity, Shariff & Sheffet 2018)"
    privacy_model = "central"
    options = {
        **LinUCB.options,
        "upsilon_alpha": Option(0.05, low=0, high=1, low_open=True, high_open=True,
                                doc="failure probability of the Upsilon bound on the prefix noise's operator norm "
                                    "(Shariff & Sheffet; a reconstruction)"),
        "calibration": CALIBRATION,  # of the tree's Gaussian nodes
    }
    state_keys = ("tree_partial", "tree_sum", "tree_t", "inverse", "factored", "theta", "rounds", "users")
    model_keys = ("theta", "inverse", "factored")

    def setup(self):
        super().setup()
        self.upsilon_alpha = self.params["upsilon_alpha"]
        self.calibration = self.params["calibration"]
        self.sensitivity = math.sqrt(2.0) * (self.L ** 2 + self.reward_bound ** 2)
        self.mechanisms["gram"] = self._tree()
        tree = self.mechanisms["gram"]
        self.upsilon = tree.node_scale * math.sqrt(tree.depth) * (
            4.0 * math.sqrt(self.d + 1) + 2.0 * math.log(2.0 * self.config.rounds / self.upsilon_alpha))
        self.shift = self.lam + 2.0 * self.upsilon

    def _tree(self):
        return TreeMechanism(self.config.rounds, (self.d + 1, self.d + 1), eps=self.eps, delta=self.delta,
                             sensitivity=self.sensitivity, noise="gaussian", symmetric=True,
                             calibration=self.calibration, model="central")

    def steps(self):
        return Steps(factor_ucb_act, central_prepare, no_weights, private_linucb_update, fold=slot_fold)

    def consts(self):
        return (*self.row_consts(), float(self.alpha), float(self.mechanisms["gram"].node_scale), float(self.shift))

    def draw_server(self, n, rng):
        # the node closing at each round: the standard normals of its upper triangle, (d+1)(d+2)/2 of them
        w = self.d + 1
        return self.node_draws_per_user(n, rng, "gaussian", w * (w + 1) // 2)

    def initial_state(self, rng):
        d, w = self.d, self.d + 1
        return {"tree_partial": np.zeros((self.mechanisms["gram"].depth, w, w)), "tree_sum": np.zeros((w, w)),
                "tree_t": np.zeros(1, dtype=np.int64), "inverse": np.eye(d) / self.shift,
                "factored": np.zeros(1, dtype=np.int64), "theta": np.zeros(d),
                "rounds": np.zeros(1, dtype=np.int64), "users": np.zeros(1, dtype=np.int64)}


# ---- LinUCB-DGS -------------------------------------------------------------------------------------------------
@njit(cache=True)
def dgs_update(state, consts, sums, start, stop, server):
    """The clean LinUCB step, then the tree's noise of this round: the node closing now scaled to
    unit_scale * Delta_stop (its draws: server[0], standard normal or standard Laplace), released = theta + the
    noise of the nodes covering the round; the node scales and the noise actually drawn are recorded."""
    (A, Ainv, b, theta, partial, tree_t, level_scale, released, node_scale, noise_std, noise_norm, rounds,
     users) = state
    refresh, unit_scale, numerator, lam, lambda_0, var_per_scale2 = consts[5:11]
    clean_update(A, Ainv, b, theta, rounds, sums, refresh)
    r = rounds[0]
    scale = unit_scale * (numerator / (lam + lambda_0 * stop))
    t = tree_t[0] + 1
    tree_t[0] = t
    level = tree_level(t)
    above = tree_above(t, level, partial.shape[0])
    draws = server[0]
    noise = partial[level]              # the noise of prefix t (partial sums: tree_above)
    for a in range(partial.shape[1]):
        noise[a] = draws[a] * scale + (partial[above, a] if above >= 0 else 0.0)
    level_scale[level] = scale
    var = 0.0
    for j in range(level_scale.shape[0]):
        if (t >> j) & 1:
            var += level_scale[j] ** 2
    node_scale[r] = scale
    noise_std[r] = math.sqrt(var_per_scale2 * var)
    sq = 0.0
    for a in range(noise.shape[0]):
        sq += noise[a] * noise[a]
        released[a] = theta[a] + noise[a]
    noise_norm[r] = math.sqrt(sq)
    rounds[0] = r + 1
    users[0] = stop


class LinUCBDGS(LinUCB):
    """Private LinUCB with Dynamic Global Sensitivity (seed 001, Algorithms 1-2, as reconstructed).

    theta_t = A_t^{-1} b_t on the clean statistics (the server is trusted); the released model is
    theta_t + n_t, where n_t is the sum of the noise of the tree nodes covering t (TreeNoise), and the node
    closing at round e gets noise scaled to the sensitivity at e:
        Delta_e = 2 L (R + L S) / (lam + lambda_0 e)        (e = users seen when the node closes)
    Laplace (the paper): scale b_e = depth * Delta_e / eps per coordinate (the paper writes log2 T; depth =
    floor(log2 T) + 1 is the number of nodes one element touches, slightly more noise); Gaussian: node std
    sqrt(depth) sigma(Delta_e, eps, delta) (TreeMechanism's calibration). Arms are chosen with the released
    theta and the width alpha ||x||_{A^{-1}}.

    Privacy model of the paper: neighbouring sequences differ in ONE REWARD; the arm sequence is the output.
    A_t is a function of the pulled contexts only, which the paper treats as public, so A^{-1} is published
    as is; only theta carries noise. Delta_e rests on the paper's Assumption 1 (lambda_min E[x x^T] >=
    lambda_0, i.i.d. contexts) and holds with probability 1 - delta: the Laplace variant is (eps, delta)-DP. The
    Gaussian variant adds the Gaussian tree's own delta on top of that event, so the run's delta is split: delta/2
    charged to the event (Delta_e holding with probability 1 - delta/2) and the tree calibrated at (eps, delta/2),
    which makes it (eps, delta)-DP as configured (the privacy accountant refuses a ledger above the budget; the
    Gaussian variant is the default: it is correctly calibrated by the L2 bound Delta_e as it stands).
    Delta_e bounds the L2 change of theta; the paper uses it as the Laplace (L1) sensitivity, which under-noises by
    up to sqrt(d) (a privacy bug: the release is then not eps-DP). An L1 bound is sqrt(d) larger:
    `l1_sensitivity=True` (the default) applies it; False reproduces the paper's calibration, for comparison only.

    The node scales are kept: state["node_scale"][r] (scale of the node closing at round r),
    state["noise_std"][r] (per-coordinate std of n_t, from the scales of the nodes covering t) and
    state["noise_norm"][r] (||n_t|| actually drawn). The tree is arrays: `tree_partial` (depth, d), the partial sums
    of its nodes (tree_above), the step `tree_t`; a node's standard draws come from draw_server (as TreeNoise draws them), scaled in the update.
    """

    name = "linucb-dgs"
    paper = f"{PAPER_001}, Algorithm 2 (Private LinUCB-DGS) with Algorithm 1 (tree mechanism with DGS)"
    privacy_model = "central"
    options = {
        **LinUCB.options,
        "lambda_0": Option(None, low=0, allow=(None,),
                           doc="lower bound lambda_0 of lambda_min E[x x^T] (the paper's Assumption 1); None: the "
                               "env's public value (1/d for isotropic contexts)"),
        "S": Option(1.0, low=0, doc="bound on ||theta*||"),
        "noise": Option("gaussian", kind="choice", choices=("laplace", "gaussian"),
                        doc="node noise: 'gaussian' (the paper's \"or Gaussian\": Delta_e is an L2 bound, which is "
                            "what it needs) or 'laplace' (the paper's main text, which then needs the sqrt(d) L1 "
                            "factor)"),
        "calibration": CALIBRATION,  # Gaussian variant only
        "l1_sensitivity": Option(True, kind="bool",
                                 doc="scale the Laplace nodes by sqrt(d), a true L1 bound (the paper's is not; "
                                     "false reproduces its calibration, for comparison only)"),
    }
    state_keys = ("A", "Ainv", "b", "theta", "tree_partial", "tree_t", "level_scale", "released", "node_scale",
                  "noise_std", "noise_norm", "rounds", "users")
    model_keys = ("released", "Ainv")

    def setup(self):
        super().setup()
        lam0 = self.params["lambda_0"]
        if lam0 is None:     # the env's public value, held to the same check
            lam0 = self.world.context_min_eig
            lam0 = self.options["lambda_0"].validate("lambda_0", 1.0 / self.d if lam0 is None else lam0)
        self.lambda_0 = lam0
        self.S = self.params["S"]
        self.noise = self.params["noise"]
        self.calibration = self.params["calibration"]
        self.depth = tree_depth(self.config.rounds)
        self.numerator = 2.0 * self.L * (self.reward_bound + self.L * self.S)
        factor = math.sqrt(self.d) if (self.params["l1_sensitivity"] and self.noise == "laplace") else 1.0
        if self.noise == "laplace":
            # node scale per unit of sensitivity; the variance of one coordinate of a node is 2 b^2
            self.unit_scale = factor * self.depth / self.eps
            self.var_per_scale2 = 2.0
        else:
            # delta/2 for the tree, delta/2 for Assumption 1's event (docstring): (eps, delta) in total
            self.unit_scale = math.sqrt(self.depth) * gaussian_sigma(1.0, self.eps, self.delta / 2,
                                                                     self.calibration)
            self.var_per_scale2 = 1.0
        # Laplace: delta for Assumption 1's event; Gaussian: delta/2 for the event + delta/2 for the tree.
        guarantee = Guarantee(f"tree-{self.noise}", "central", self.eps, self.delta, self.sensitivity_at(1) * factor,
                              "l1" if self.noise == "laplace" else "l2")
        # the release of theta: tree noise whose node closing after e users has scale unit_scale * Delta_e
        self.mechanisms["theta"] = DynamicTreeMechanism(self.config.rounds, (self.d,), noise=self.noise,
                                                        unit_scale=self.unit_scale,
                                                        max_sensitivity=self.sensitivity_at(1), guarantee=guarantee)

    def sensitivity_at(self, e: int) -> float:
        """Delta_e = 2 L (R + L S) / (lam + lambda_0 e): dynamic global sensitivity after e users."""
        return self.numerator / (self.lam + self.lambda_0 * e)

    def steps(self):
        return Steps(ucb_act, central_prepare, no_weights, dgs_update, fold=slot_fold)

    def consts(self):
        return (*self.row_consts(), float(self.alpha), int(self.REFRESH), float(self.unit_scale),
                float(self.numerator), float(self.lam), float(self.lambda_0), float(self.var_per_scale2))

    def draw_server(self, n, rng):
        # the node closing at each round: d standard normals or d standard Laplace draws
        return self.node_draws_per_user(n, rng, self.noise, self.d)

    def initial_state(self, rng):
        state = super().initial_state(rng)
        rounds = self.config.rounds
        state.update({
            "tree_partial": np.zeros((self.depth, self.d)), "tree_t": np.zeros(1, dtype=np.int64),
            "level_scale": np.zeros(self.depth),
            "released": np.zeros(self.d),   # nothing released yet: the data-independent zero model
            "node_scale": np.zeros(rounds), "noise_std": np.zeros(rounds), "noise_norm": np.zeros(rounds),
        })
        return state

    def estimate(self, state):
        return state["released"]
