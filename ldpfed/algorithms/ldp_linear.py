"""Seed 002 (Zheng, Cai, Huang, Li, Wang, NeurIPS 2020): LDP contextual bandits.

* `ldp-ucb` (Algorithm 5, Appendix D of the full version): LinUCB on noisy Gram statistics. The user sends
  x x^T + B_t (B_t symmetric: upper triangle incl. the diagonal i.i.d. N(0, sigma^2), mirrored) and r x + xi_t.
  Server: V~_t = sum (x x^T + B) + c_t I, theta~_t = V~_t^{-1} u~_t; the next user plays
  argmax_a theta~^T x_a + beta_t ||x_a||_{V~_t^{-1}} with
      Upsilon_t = sigma sqrt(t) (4 sqrt(d) + 2 ln(2T/alpha)),  c_t = 2 Upsilon_t,
      beta_t = 2 sigma sqrt(d ln T) + (sqrt(3 Upsilon_t) + sigma sqrt(d t / Upsilon_t)) d ln T
  (beta_t as in the authors' code).
* `ldp-gloc` (Algorithm 3): GLOC with noisy online gradient descent. The user plays the UCB action of
  (theta~, V~, beta), sets z = x^T theta^_t (the online learner's prediction) and sends x x^T + B_t,
  z x + xi_t and grad l(theta^_t) + r_t with l the negative log-likelihood, grad = (g(x^T theta^) - y) x.
  Server: V~, u~ as above, theta~ = V~^{-1} u~ (ridge-like regression of the predictions z on x) and
  theta^_{t+1} = Proj_W(theta^_t - zeta (sum of noisy gradients)), W the ball of radius S.
  sigma = 6 sqrt(2 ln(3.75/delta))/eps, beta_t^2 = (sigma/mu) sqrt(d t) (the O~ of the paper with the constants of
  the public reference code, C = 1). The exploration width uses the accumulated noisy Gram matrix V~_t (the
  published figures came from code whose width used a Gram matrix that was never updated, so that only the
  shift c_t changed it and the width stayed about constant; not reproduced).

Privacy (clients clip to the public bounds before privatizing, and count clipped users):
* ldp-ucb: two Gaussian mechanisms, each at (eps/2, delta/2): M = x x^T (upper triangle incl. diagonal has
  L2 norm <= ||x||^2 <= 1, so sensitivity 2) and u = r x (||r x|| <= c_r, sensitivity 2 c_r, c_r the env's
  public reward bound). sigma_M = 2 sqrt(2 ln(2.5/delta))/(eps/2) = 4 sqrt(2 ln(2.5/delta))/eps. (The authors'
  code used 4 sqrt(ln(1.25/delta))/eps, which drops the factor 2 under the root and does not split delta; and
  its index used ||x||^2_{V^{-1}} instead of ||x||_{V^{-1}}: we follow the paper.)
* ldp-gloc: three Gaussian mechanisms, each at (eps/3, delta/3): M (sensitivity 2), u = z x with
  |z| <= ||theta^|| <= S = 1 (sensitivity 2), and the gradient, clipped to the public bound
  C_g = max_{|a|<=1} |g(a)| + c_r (sensitivity 2 C_g), so sigma_M = sigma_u = 6 sqrt(2 ln(3.75/delta))/eps = sigma
  and the gradient noise std is C_g sigma (the paper's r_t ~ N(0, C^2 sigma^2) with C the bound of the gradient
  norm; the paper's C is the bound of |g|, which bounds |g(a) - y| only for particular rewards).
Both are (eps, delta)-LDP per user by basic composition.

Profile "authors-code" (seed 000's public code, liangzp/LDP-Bandit Scheme1/, which ran both as baselines):
* ldp-ucb (LDPUCBServer + OLSMechanism): noise std 6 sqrt(2 ln(2.5/delta))/eps on M and u (and in Upsilon_t,
  beta_t); V~ starts at I instead of 0. (More noise than the calibration above: the claim stands.)
* ldp-gloc (LDPGLMServer + GLMMechanism): noise std sigma on the gradient too (not C_g sigma); zeta = 1/sqrt(T);
  no projection of theta^ (S = inf); theta^ and theta~ start at random unit vectors; z = x^T theta^ unclipped in
  u = z x; the gradient (g(clip(z, -5, 5)) - y) x unclipped. Both leave sensitivities uncovered: the ledger says
  "claim_void".

Rounds: with B users per round every user of the round sees the same published state (theta~, V~^{-1},
beta, theta^); the server adds the round's summed messages, then recomputes with t = number of users so far.

Written once (ldpfed.algorithms.compiled): the UCB arm (`_ucb_act`), the clipped rows (`_ucb_prepare`,
`_gloc_prepare`) and the server's update (`_ucb_update`, `_gloc_update`, both through `_ucb_refresh`, which also
builds the initial state) are the numba functions every engine path runs; beta_t is `_beta` (LdpUcb.beta calls it).
The contexts' clip rule (squared norm against bound^2, counted beyond bound^2 (1 + 2 rtol): ldpfed.mechanisms.clip's
clip_rows_by_squares) is ldpfed.mechanisms.clip.clip_row_by_squares, one row at a time.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from ldpfed.algorithms.compiled import CompiledAlgorithm, Steps, no_weights
from ldpfed.algorithms.fields import Field
from ldpfed.algorithms.glm_ldp import _dot, authors_gaussian, authors_sigma
from ldpfed.algorithms.options import CALIBRATION, Option
from ldpfed.envs.links import inf_slope, link_code, link_mean, mean_function, sup_mean
from ldpfed.mechanisms import GaussianMechanism, SymmetricGaussianMechanism
from ldpfed.mechanisms.clip import CLIP_RTOL, clip_row, clip_row_by_squares, clip_value
from ldpfed.util.errors import ConfigError

SINGLE_GLM_ENVS = ("linear", "logistic")

# ldp-gloc's links: the inverse link g, its largest |g| on [-S, S] and mu = inf g' on [-S, S] (the paper's
# assumptions, S = 1) come from ldpfed.envs.links
GLOC_LINKS = ("identity", "logistic")
CONTEXT_BOUND = 1.0      # the public bound C_B of the contexts' norm

# consts() of both classes, by position (the compiled functions read them so; the clip bounds C_B, c_r first)
(C_B_, C_R_, SIGMA_, D_, LOG_T_, UPSILON_UNIT_, GLOC_, MU_, S_, Z_BOUND_, GRAD_Z_CLIP_, GRAD_BOUND_, ZETA_,
 LINK_) = range(14)


ALPHA = Option(0.1, low=0, high=1, low_open=True, high_open=True,
               doc="failure probability alpha in Upsilon_t = sigma sqrt(t) (4 sqrt(d) + 2 ln(2T/alpha)) (authors' "
                   "code: 0.1)")


class LdpUcb(CompiledAlgorithm):
    """Algorithm 5 (Appendix D): LDP contextual linear UCB. See the module docstring."""

    name = "ldp-ucb"
    paper = "seed 002 Zheng et al. 2020, Algorithm 5 (Appendix D): LDP-UCB for contextual linear bandits"
    privacy_model = "ldp"
    env_kinds = SINGLE_GLM_ENVS
    default_env = "linear"
    options = {"alpha": ALPHA, "calibration": CALIBRATION}
    # The setting of the public reference comparison (d=2, K=10, unit contexts, eps=1,
    # delta=0.01); a reconstruction, the seed's own experiment settings are not in its text.
    paper_setting = {"env_params": {"d": 2, "K": 10}, "users": 10**5, "eps": 1.0, "delta": 0.01, "params": {}}
    shares = 2   # number of mechanisms sharing (eps, delta)

    authors_shares = 2.5   # the public code's sigma = 6 sqrt(2 ln(authors_shares/delta))/eps

    state_keys = ("M", "u", "t", "theta", "V_inv", "beta")
    model_keys = ("theta", "V_inv", "beta")
    metric_names = ("clipped",)

    def setup(self):
        self.alpha, calibration = self.params["alpha"], self.params["calibration"]
        self.c_r = float(self.world.reward_bound)
        self.authors = self.profile == "authors-code"
        self.void_reasons: list[str] = []
        eps, delta = self.eps / self.shares, self.delta / self.shares
        if self.authors:
            self.authors_sigma = authors_sigma(self.eps, self.delta, self.authors_shares)
            self.mechanisms["M"] = self._authors_mechanism(SymmetricGaussianMechanism, "M", 2.0, eps, delta)
        else:
            self.mechanisms["M"] = SymmetricGaussianMechanism(2.0, eps, delta, calibration=calibration)
        self.sigma = self.mechanisms["M"].sigma
        self._setup_fields(eps, delta, calibration)
        d, T = self.d, self.T
        self.log_T = math.log(max(T, 2))
        self.upsilon_unit = self.sigma * (4.0 * math.sqrt(d) + 2.0 * math.log(2.0 * T / self.alpha))

    def _authors_mechanism(self, cls, field, sensitivity, eps, delta):
        """The public code's noise std on a field; notes in the ledger when it does not cover the sensitivity."""
        mech, covered = authors_gaussian(cls, self.authors_sigma, sensitivity, eps, delta)
        if not covered:
            self.void_reasons.append(f"{field}: the authors' noise std {self.authors_sigma:.4g} covers sensitivity "
                                     f"{mech.guarantee.sensitivity:.4g} at (eps={eps:g}, delta={delta:g}), "
                                     f"not the field's {sensitivity:.4g}")
        return mech

    def _setup_fields(self, eps, delta, calibration):
        if self.authors:
            self.mechanisms["u"] = self._authors_mechanism(GaussianMechanism, "u", 2.0 * self.c_r, eps, delta)
            return
        self.mechanisms["u"] = GaussianMechanism(2.0 * self.c_r, eps, delta, calibration=calibration)

    def ledger(self):
        rows = super().ledger()
        if self.void_reasons:
            rows = [{**row, "claim_void": "; ".join(self.void_reasons)} for row in rows]
        return rows

    # ---- the compiled steps and their constants ----------------------------------------------------
    def steps(self):
        return Steps(_ucb_act, _ucb_prepare, no_weights, _ucb_update)

    def consts(self):
        """(C_B, c_r, sigma, d, ln T, Upsilon_t / sqrt(t), gloc, mu, S, z bound, gradient z clip, gradient bound,
        zeta, link code): the positions C_B_ ... LINK_ above. ldp-ucb: the gloc entries are unused."""
        return (CONTEXT_BOUND, self.c_r, float(self.sigma), float(self.d), float(self.log_T),
                float(self.upsilon_unit), False, 1.0, math.inf, math.inf, math.inf, math.inf, 0.0, 0)

    def beta(self, t: int) -> float:
        """beta_t (the compiled `_beta`, which the update uses)."""
        return float(_beta(self.compiled_consts(), int(t)))

    # ---- server half ------------------------------------------------------------------------------
    def _ucb_state(self, M: np.ndarray, u: np.ndarray) -> dict:
        """The state of M, u before any user: V~ = M + c_1 I, theta~, V~^{-1}, beta_1 (by `_ucb_refresh`)."""
        d = self.d
        state = {"M": np.array(M, dtype=float), "u": np.array(u, dtype=float), "t": np.zeros(1, dtype=np.int64),
                 "theta": np.zeros(d), "V_inv": np.zeros((d, d)), "beta": np.zeros(1)}
        _ucb_refresh(state["M"], state["u"], state["t"], state["theta"], state["V_inv"], state["beta"],
                     self.compiled_consts(), 0)
        return state

    def initial_state(self, rng):
        # the authors' code starts V~ at I (before the shift); the paper at 0
        return self._ucb_state(np.eye(self.d) if self.authors else np.zeros((self.d, self.d)), np.zeros(self.d))

    def estimate(self, state):
        return state["theta"]

    def fields(self):
        # clipped inputs (||x|| <= 1): |x_i x_j| <= 1; |r x_i| <= c_r (ldp-gloc: |z x_i| <= S, |grad_i| <= C_g)
        d, made_by = self.d, self.mechanisms
        fields = {"M": Field((d, d), mechanism=made_by["M"], data_bound=1.0),
                  "u": Field((d,), mechanism=made_by["u"], data_bound=self.c_r if self.shares == 2 else self.S)}
        if self.shares != 2:
            fields["grad"] = Field((d,), mechanism=made_by["grad"], data_bound=self.grad_bound)
        return fields


class LdpGloc(LdpUcb):
    """Algorithm 3: LDP generalized linear bandits (GLOC with noisy online gradient descent).
    See the module docstring. zeta = zeta_scale * 2S / (C_g sqrt(1 + d sigma^2) sqrt(T)) (the paper:
    zeta = Theta(1/sqrt T); the constant is a reconstruction, see _setup_fields); S = radius of W (paper: 1)."""

    name = "ldp-gloc"
    paper = "seed 002 Zheng et al. 2020, Algorithm 3: LDP-GLOC for generalized linear bandits"
    env_kinds = SINGLE_GLM_ENVS
    default_env = "logistic"
    options = {**LdpUcb.options,
               "zeta_scale": Option(1.0, low=0, low_open=True,
                                    doc="multiplies the step zeta = 2S / (C_g sqrt(1 + d sigma^2) sqrt(T)) of the "
                                        "online gradient descent (the constant is a reconstruction; the paper: "
                                        "zeta = Theta(1/sqrt T))"),
               "S": Option(1.0, low=0, low_open=True, allow_inf=True,
                           doc="radius of the ball W that theta^ is projected on, and |z| <= S in u = z x (the "
                               "paper: 1); finite under profile paper, inf (no projection) is the authors' code")}
    profile_defaults = {"authors-code": {"S": math.inf}}
    authors_shares = 3.75
    # Reconstruction: the seed-000 comparison setting (d=2, K=10) on its GLM (logistic) env.
    paper_setting = {"env_params": {"d": 2, "K": 10}, "users": 10**5, "eps": 1.0, "delta": 0.01, "params": {}}
    shares = 3

    state_keys = LdpUcb.state_keys + ("theta_hat",)
    model_keys = LdpUcb.model_keys + ("theta_hat",)

    def _setup_fields(self, eps, delta, calibration):
        link = self.world.link
        if link not in GLOC_LINKS:
            raise ConfigError("env", self.world.name, f"ldp-gloc supports links {sorted(GLOC_LINKS)}")
        self.link = link
        if self.authors:
            self._setup_authors_fields(link, eps, delta)
            return
        self.S = self.params["S"]
        if math.isinf(self.S):       # the paper's W is a ball and u's sensitivity 2S must be finite
            raise ConfigError("params.S", self.S, "must be finite under profile 'paper' (inf, no projection, is the "
                                                  "authors' code)")
        self.grad_z_clip = self.S                        # the gradient is taken at z clipped to [-S, S]
        self.g = mean_function(link)
        self.mu = inf_slope(link, self.S)
        self.grad_bound = sup_mean(link, self.S) + self.c_r      # |g(z) - y| <= max|g| + c_r with |z| <= S
        # zeta = Theta(1/sqrt T) (the paper); the constant is the online-gradient-descent step D / (G sqrt T)
        # for W of diameter D = 2S and noisy gradients of second moment G^2 = C_g^2 (1 + d sigma^2)
        # (a reconstruction; the public reference code used d K / sqrt T without projection).
        grad_rms = self.grad_bound * math.sqrt(1.0 + self.d * self.sigma ** 2)
        self.zeta = self.params["zeta_scale"] * 2.0 * self.S / (grad_rms * math.sqrt(self.T))
        # u = z x with |z| <= S ||x|| <= S
        self.mechanisms["u"] = GaussianMechanism(2.0 * self.S, eps, delta, calibration=calibration)
        self.mechanisms["grad"] = GaussianMechanism(2.0 * self.grad_bound, eps, delta, calibration=calibration)

    def _setup_authors_fields(self, link, eps, delta):
        """LDPGLMServer + GLMMechanism: mu = inf g' on [-1, 1] (the code's constants), zeta = 1/sqrt(T), no
        projection (S = inf unless params.S), z = x^T theta^ unclipped in u, gradient at z clipped to [-5, 5]."""
        self.S = self.params["S"]
        self.g = mean_function(link)
        self.mu = inf_slope(link, 1.0)
        self.zeta = 1.0 / math.sqrt(self.T)
        self.grad_z_clip = 5.0                           # z is clipped to [-5, 5] inside the gradient only
        z_max = min(self.S, 5.0)
        self.grad_bound = sup_mean(link, z_max) + self.c_r
        self.mechanisms["u"] = self._authors_mechanism(GaussianMechanism, "u", 2.0 * self.S, eps, delta)
        self.mechanisms["grad"] = self._authors_mechanism(GaussianMechanism, "grad", 2.0 * self.grad_bound, eps, delta)

    def steps(self):
        return Steps(_ucb_act, _gloc_prepare, no_weights, _gloc_update)

    def consts(self):
        # paper: z clipped to S (counted) and the gradient to C_g (plain rule, counted); authors' code: neither
        z_bound, grad_bound = (math.inf, math.inf) if self.authors else (float(self.S), float(self.grad_bound))
        return (CONTEXT_BOUND, self.c_r, float(self.sigma), float(self.d), float(self.log_T),
                float(self.upsilon_unit), True, float(self.mu), float(self.S), z_bound, float(self.grad_z_clip),
                grad_bound, float(self.zeta), link_code(self.link))

    def initial_state(self, rng):
        state = self._ucb_state(np.zeros((self.d, self.d)), np.zeros(self.d))
        state["theta_hat"] = np.zeros(self.d)
        if self.authors:     # both estimates start at random unit vectors (theta~ is replaced at the first update)
            for key in ("theta", "theta_hat"):
                v = rng.standard_normal(self.d)
                state[key] = v / np.linalg.norm(v)
        return state


# ---------------------------------------------------------------------------------------------------------------
# The compiled steps (ldpfed.algorithms.compiled): one user's act and prepare, the server's update
# ---------------------------------------------------------------------------------------------------------------
@njit(cache=True)
def _beta(consts, t):
    """beta_t: ldp-ucb 2 sigma sqrt(d ln T) + (sqrt(3 Upsilon_t) + sigma sqrt(d t / Upsilon_t)) d ln T;
    ldp-gloc sqrt((sigma / mu) sqrt(d t))."""
    sigma, d, log_T = consts[SIGMA_], consts[D_], consts[LOG_T_]
    if consts[GLOC_]:
        return math.sqrt(sigma / consts[MU_] * math.sqrt(d * t))
    upsilon = consts[UPSILON_UNIT_] * math.sqrt(t)
    return (2.0 * sigma * math.sqrt(d * log_T)
            + (math.sqrt(3.0 * upsilon) + sigma * math.sqrt(d * t / upsilon)) * d * log_T)


@njit(cache=True)
def _ucb_refresh(M, u, t, theta, V_inv, beta, consts, stop):
    """After `stop` users (t = max(stop, 1)): V~ = M + c_t I with c_t = 2 Upsilon_t, V_inv = V~^{-1},
    theta = V~^{-1} u, beta = beta_t."""
    tt = max(stop, 1)
    c = 2.0 * consts[UPSILON_UNIT_] * math.sqrt(tt)
    d = u.shape[0]
    V = np.empty((d, d))
    for a in range(d):
        for b in range(d):
            V[a, b] = M[a, b]
        V[a, a] = M[a, a] + c
    V_inv[:, :] = np.linalg.inv(V)
    for a in range(d):
        s = 0.0
        for b in range(d):
            s += V_inv[a, b] * u[b]
        theta[a] = s
    t[0] = tt
    beta[0] = _beta(consts, tt)


@njit(cache=True)
def _ucb_act(model, consts, contexts, i, user, draws, actions):
    """argmax_k x_k^T theta~ + beta ||x_k||_{V~^{-1}} (the first of equals)."""
    theta, V_inv, beta = model[0], model[1], model[2][0]
    d = theta.shape[0]
    best, arm = -np.inf, 0
    for k in range(contexts.shape[1]):
        x = contexts[i, k]
        width = 0.0
        for j in range(d):
            s = 0.0
            for m in range(d):
                s += x[m] * V_inv[m, j]
            width += s * x[j]
        score = _dot(x, theta) + beta * math.sqrt(max(width, 0.0))
        if score > best or k == 0:
            best, arm = score, k
    actions[i] = arm


@njit(cache=True)
def _take_context(consts, contexts, i, arm, reward, x):
    """x = the pulled arm's context clipped to C_B (by squares); returns (the reward clipped to c_r, clipped count)."""
    for j in range(x.shape[0]):
        x[j] = contexts[i, arm, j]
    n_x = clip_row_by_squares(x, consts[C_B_], CLIP_RTOL)
    y, n_y = clip_value(reward, consts[C_R_])
    return y, n_x + n_y


@njit(cache=True)
def _gram_row(row, x):
    """M = x x^T at the start of the row."""
    d = x.shape[0]
    for a in range(d):
        for b in range(d):
            row[a * d + b] = x[a] * x[b]


@njit(cache=True)
def _ucb_prepare(model, consts, contexts, actions, reward, user, i, inputs, counts):
    """Row: M = x x^T (d * d), then u = r x (d), of the clipped context and reward."""
    d = contexts.shape[2]
    row = inputs[i]
    x = row[d * d:d * d + d]              # u's slot holds x until M is written
    r, counts[i, 0] = _take_context(consts, contexts, i, actions[i], reward, x)
    _gram_row(row, x)
    for j in range(d):
        x[j] = r * x[j]


@njit(cache=True)
def _gloc_prepare(model, consts, contexts, actions, reward, user, i, inputs, counts):
    """Row: M = x x^T, u = z x and the gradient (g(z) - y) x, with z = x^T theta^. Profile paper: z clipped to S
    and the gradient to C_g (counted); authors' code: z unclipped in u, clipped to [-5, 5] inside g only."""
    theta_hat = model[3]
    d = contexts.shape[2]
    row = inputs[i]
    x = row[d * d:d * d + d]              # u's slot holds x until M is written
    g = row[d * d + d:d * d + 2 * d]
    y, clipped = _take_context(consts, contexts, i, actions[i], reward, x)
    z, n_z = clip_value(_dot(x, theta_hat), consts[Z_BOUND_])
    gz = consts[GRAD_Z_CLIP_]
    coef = link_mean(consts[LINK_], min(max(z, -gz), gz)) - y
    for j in range(d):
        g[j] = coef * x[j]
    n_g = clip_row(g, consts[GRAD_BOUND_], 0.0)      # the plain rule: every gradient over the bound counted
    counts[i, 0] = clipped + n_z + n_g
    _gram_row(row, x)
    for j in range(d):
        x[j] = z * x[j]


@njit(cache=True)
def _add_gram_sums(M, u, sums):
    d = u.shape[0]
    for a in range(d):
        for b in range(d):
            M[a, b] += sums[a * d + b]
        u[a] += sums[d * d + a]


@njit(cache=True)
def _ucb_update(state, consts, sums, start, stop, server):
    """M += sum M, u += sum u, then V~, theta~, beta after `stop` users (_ucb_refresh)."""
    M, u, t, theta, V_inv, beta = state
    _add_gram_sums(M, u, sums)
    _ucb_refresh(M, u, t, theta, V_inv, beta, consts, stop)


@njit(cache=True)
def _gloc_update(state, consts, sums, start, stop, server):
    """As _ucb_update, and theta^ <- Proj_W(theta^ - zeta sum grad), W the ball of radius S."""
    M, u, t, theta, V_inv, beta, theta_hat = state
    _add_gram_sums(M, u, sums)
    _ucb_refresh(M, u, t, theta, V_inv, beta, consts, stop)
    d = u.shape[0]
    zeta, S = consts[ZETA_], consts[S_]
    off = d * d + d
    for j in range(d):
        theta_hat[j] = theta_hat[j] - zeta * sums[off + j]
    norm = math.sqrt(_dot(theta_hat, theta_hat))
    if norm > S:
        for j in range(d):
            theta_hat[j] *= S / norm
