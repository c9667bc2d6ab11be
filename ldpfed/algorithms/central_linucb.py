"""Seed 001 - Wang, Zhao, Wang (RecSys 2022): LinUCB, constant-sensitivity Private LinUCB, Private LinUCB-DGS.

Central DP: the server is trusted with the raw (x, r) of the pulled arm; what is protected is what the server
RELEASES (the model every later user acts on, hence the arm sequence). Noise is added at the server by the
tree (binary) mechanism, in `update`, from the round's "server" generator.

Client half (shared): the user pulls argmax_a theta^T x_a + alpha ||x_a||_{A^{-1}} with the published
(theta, A^{-1}) and sends z = [x; r] (x clipped to the public context bound L, r to the env's reward bound R;
clipped users are counted). `aggregate` places each user's row at slot (user index mod B) of a (B, d+1) array:
a sum of one-hot-placed messages, so population/shard sums are exact, and the server gets the round's rows
(Z^T Z is then the round's augmented Gram matrix, the stream element of the tree: with B > 1 one element is a
round sum, and one user is in exactly one element).

The seed lost its formulas; the reconstruction of /work/shared/ALGORITHMS.md ("Seed 001") is the spec. Options
marked "reconstruction" are ours, not the paper's text.
"""
from __future__ import annotations

import math

import numpy as np

from ldpfed.algorithms.base import Algorithm
from ldpfed.algorithms.fields import Field
from ldpfed.algorithms.options import CALIBRATION, Option
from ldpfed.clip import clip_coords_in_place, clip_rows_in_place, clip_values
from ldpfed.mechanisms import (Domain, DynamicTreeMechanism, Guarantee, SumBounds, TreeMechanism, gaussian_sigma,
                              tree_depth)

PAPER_001 = "seed 001 Wang, Zhao, Wang 2022"
# Seed 001's simulation (Section 4): arm pool of 1,000, 10 arms shown, reward noise std 0.5; eps, delta lost:
# ALGORITHMS.md gives delta = 0.1 with eps swept; eps = 1 is the default point of the sweep.
SETTING_001 = {"env_params": {}, "users": 100_000, "eps": 1.0, "delta": 0.1, "params": {}}


class CentralRows:
    """Client half of the central-model linear algorithms (seeds 001 and 003): raw z = [x; r] of the pulled arm.

    Subclasses set `context_norm` ("l2": clip ||x|| to L; "linf": clip every coordinate to L)."""

    context_norm = "l2"

    def client_bounds(self):
        bound = self.world.context_bound
        self.L = 1.0 if bound is None else float(bound)
        self.R = float(self.world.reward_bound)

    def encode(self, model, contexts, actions, rewards, users, rng):
        n = len(users)
        z = np.empty((n, self.d + 1))
        x = z[:, :self.d]
        x[...] = contexts[np.arange(n), actions]
        if self.context_norm == "l2":
            clipped_x = clip_rows_in_place(x, self.L)
        else:
            clipped_x = clip_coords_in_place(x, self.L)     # users with a coordinate out of bounds
        z[:, self.d] = rewards
        r = z[:, self.d]
        r_clipped, clipped_r = clip_values(r, self.R)
        if clipped_r:
            r[...] = r_clipped
        return {"z": z}, {"clipped": clipped_x + clipped_r}

    def fields(self):
        # z = [x; r], raw (no mechanism makes it: the server is trusted; the private algorithms' mechanisms are the
        # server's releases, in self.mechanisms); the trusted server still accepts only the public bounds:
        # ||x|| <= L (l2) or |x_i| <= L (linf), |r| <= R
        high = np.append(np.full(self.d, self.L), self.R)
        z = Domain((self.d + 1,), low=-high, high=high, norm_part=self.d,
                   max_radius=self.L if self.context_norm == "l2" else None,
                   source=f"raw [x; r], {self.context_norm} ||x|| <= L, |r| <= R")
        return {"z": Field((self.d + 1,), domain=z, raw=True)}

    def aggregate_bounds(self, users):
        # the round's rows: a user's row at slot (user mod B) within the bounds, every other row 0
        users = np.asarray(users)
        rows = 1 if self.config.round_size == 1 else self.config.round_size
        high = np.zeros((rows, self.d + 1))
        high[users % rows] = np.append(np.full(self.d, self.L), self.R)
        row_max = high[:, 0] if self.context_norm == "l2" else np.full(rows, np.inf)
        groups = np.arange(high.size) // (self.d + 1) + rows * (np.arange(high.size) % (self.d + 1) == self.d)
        return {"Z": SumBounds(-high.reshape(-1), high.reshape(-1), groups=groups,
                               group_max=np.concatenate([row_max * (1 + 1e-9), np.full(rows, np.inf)]))}

    def aggregate(self, messages, users):
        """Rows placed at slot (user mod B): summing these over populations or shards gives the round's rows."""
        if "z" not in messages:
            return {}
        B = self.config.round_size
        if B == 1:
            return {"Z": messages["z"]}
        rows = np.zeros((B, self.d + 1))
        rows[np.asarray(users) % B] = messages["z"]
        return {"Z": rows}


class LinUCB(CentralRows, Algorithm):
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

    def setup(self):
        self.alpha, self.lam = self.params["alpha"], self.params["lam"]
        self.client_bounds()

    # ---- server half -------------------------------------------------------------------------
    def initial_state(self, rng):
        d = self.d
        return {"A": self.lam * np.eye(d), "Ainv": np.eye(d) / self.lam, "b": np.zeros(d), "theta": np.zeros(d),
                "rounds": 0, "users": 0}

    def _clean_update(self, state, Z):
        X, r = Z[:, :self.d], Z[:, self.d]
        A, Ainv = state["A"], state["Ainv"]
        if X.shape[0] == 1 and state["rounds"] % self.REFRESH:
            x = X[0]
            Ax = Ainv @ x
            A += np.outer(x, x)
            Ainv -= np.outer(Ax, Ax / (1.0 + x @ Ax))
        else:
            A += X.T @ X
            state["Ainv"] = np.linalg.inv(A)
        state["b"] += X.T @ r
        state["theta"] = state["Ainv"] @ state["b"]

    def update(self, state, sums, start, stop, rng):
        if "Z" in sums:
            self._clean_update(state, sums["Z"])
        state["rounds"] += 1
        state["users"] = stop
        return state

    def publish(self, state):
        return {"theta": state["theta"], "Ainv": state["Ainv"], "alpha": self.alpha}

    def estimate(self, state):
        return state["theta"]

    # ---- client half -------------------------------------------------------------------------
    def act(self, model, contexts, users, rng):
        scores = contexts @ model["theta"]
        if model["alpha"] > 0:
            width = np.einsum("nkd,nkd->nk", contexts @ model["Ainv"], contexts)
            scores = scores + model["alpha"] * np.sqrt(np.maximum(width, 0.0))
        return scores.argmax(axis=1)


class PrivateLinUCB(LinUCB):
    """Constant-sensitivity Private LinUCB (Shariff & Sheffet 2018 / Neel & Roth 2018 style; seed 001's baseline).

    Stream element of round e: G_e = sum over its users of z z^T, z = [x; r]. The tree mechanism (symmetric
    Gaussian nodes) releases noisy prefix sums M_t; the server keeps nothing else. Released model:
    A~ = M_t[:d, :d] + (lam + 2 Upsilon) I, u~ = M_t[:d, d], theta~ = A~^{-1} u~, published with A~^{-1}
    (post-processing of the release). Upsilon = node_std sqrt(depth) (4 sqrt(d+1) + 2 ln(2 T / upsilon_alpha))
    bounds the operator norm of the prefix noise with probability 1 - upsilon_alpha (Shariff & Sheffet), so
    A~ is positive definite with that probability (the client clamps a negative width to 0 otherwise).

    Privacy: the whole (eps, delta) goes to the tree: one user changes one element by at most
    ||z z^T - z' z'^T||_F <= sqrt(2) (L^2 + R^2) (neighbouring = one user's (x, r) replaced), which bounds the
    L2 norm of the upper triangle; node std = sqrt(depth) sigma(sensitivity, eps, delta) (TreeMechanism).
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

    def setup(self):
        super().setup()
        self.upsilon_alpha = self.params["upsilon_alpha"]
        self.calibration = self.params["calibration"]
        self.sensitivity = math.sqrt(2.0) * (self.L ** 2 + self.R ** 2)
        self.mechanisms["gram"] = self._tree()
        tree = self.mechanisms["gram"]
        self.upsilon = tree.node_scale * math.sqrt(tree.depth) * (
            4.0 * math.sqrt(self.d + 1) + 2.0 * math.log(2.0 * self.config.rounds / self.upsilon_alpha))
        self.shift = self.lam + 2.0 * self.upsilon

    def _tree(self):
        return TreeMechanism(self.config.rounds, (self.d + 1, self.d + 1), eps=self.eps, delta=self.delta,
                             sensitivity=self.sensitivity, noise="gaussian", symmetric=True,
                             calibration=self.calibration, model="central")

    def initial_state(self, rng):
        d = self.d
        return {"tree": self._tree(), "Ainv": np.eye(d) / self.shift, "theta": np.zeros(d), "rounds": 0, "users": 0}

    def update(self, state, sums, start, stop, rng):
        Z = sums.get("Z")
        G = Z.T @ Z if Z is not None else np.zeros((self.d + 1, self.d + 1))
        M = state["tree"].add(G, rng)          # noisy prefix sum: every round releases, data or not
        d = self.d
        A = M[:d, :d]
        A[np.diag_indices(d)] += self.shift
        Ainv = np.linalg.inv(A)
        state["Ainv"] = (Ainv + Ainv.T) * 0.5
        state["theta"] = state["Ainv"] @ M[:d, d]
        state["rounds"] += 1
        state["users"] = stop
        return state


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
    state["noise_norm"][r] (||n_t|| actually drawn).
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
        self.numerator = 2.0 * self.L * (self.R + self.L * self.S)
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

    def initial_state(self, rng):
        state = super().initial_state(rng)
        rounds = self.config.rounds
        state.update({
            "tree": self.mechanisms["theta"].noise_stream(),
            "level_scale": np.zeros(self.depth),
            "released": np.zeros(self.d),   # nothing released yet: the data-independent zero model
            "node_scale": np.zeros(rounds), "noise_std": np.zeros(rounds), "noise_norm": np.zeros(rounds),
        })
        return state

    def update(self, state, sums, start, stop, rng):
        if "Z" in sums:
            self._clean_update(state, sums["Z"])
        r = state["rounds"]
        tree = state["tree"]
        scale = self.mechanisms["theta"].node_scale(self.sensitivity_at(stop))
        noise = tree.step(rng, node_scale=scale)
        t = tree.t
        level_scale = state["level_scale"]
        level_scale[(t & -t).bit_length() - 1] = scale
        bits = [j for j in range(self.depth) if (t >> j) & 1]
        state["node_scale"][r] = scale
        state["noise_std"][r] = math.sqrt(self.var_per_scale2 * float(np.sum(level_scale[bits] ** 2)))
        state["noise_norm"][r] = float(np.linalg.norm(noise))
        state["released"] = state["theta"] + noise
        state["rounds"] = r + 1
        state["users"] = stop
        return state

    def publish(self, state):
        return {"theta": state["released"], "Ainv": state["Ainv"], "alpha": self.alpha}

    def estimate(self, state):
        return state["released"]

