"""Seed 000: Han, Liang, Wang, Zhang (NeurIPS 2021), "Generalized linear bandits with local differential privacy".

Single parameter (Algorithm 1): every user sees K contexts x_{t,a}, pulls the greedy arm argmax_a x_{t,a}^T theta_hat
and sends one privatized message about (x_{t,a_t}, r_t).
  * ldp-ols  (eq. 3-4): M = x x^T + W (symmetric Gaussian), u = r x + xi (Gaussian);
             theta_hat = (sum M + c~ sqrt(t) I)^{-1} sum u,  c~ = 2 sigma (4 sqrt(d) + 2 log(2T/alpha)) (Thm 3.1).
  * ldp-sgd  (eq. 5-6): Z = l2-ball mechanism of g = (mu(x^T theta_hat) - r) x clipped to R = 2 c_r C_B;
             theta_hat <- theta_hat - eta_t Z.
Multi parameter (Algorithm 2): one theta per arm, one context per user; warm-up of K s0 users pulling the arms
round-robin (the arm is public then and only its slot of the message is filled), then elimination with the
warm-up estimates (eq. 7, margin h) and a greedy pull among the survivors, with a message for EVERY arm
(the real one for the pulled arm, psi(0, 0) for the others: the synthetic update) so the server cannot tell
which arm was pulled.
  * ldp-ols-multi, ldp-sgd-multi.
Non-private baselines (noise off, same code): ols, ols-multi.

Privacy accounting (C_B = params.context_bound, c_r = env.reward_bound, both public; the client clips x to C_B
and r to c_r BEFORE privatizing and counts what it clipped):
  * ldp-ols: (eps, delta) split evenly, (eps/2, delta/2) for M and (eps/2, delta/2) for u (composition).
    Sensitivities: M: the upper triangle (incl. diagonal) of x x^T as a vector; for ||x||, ||x'|| <= C_B,
    ||x x^T - x' x'^T||_F^2 = ||x||^4 + ||x'||^4 - 2 (x^T x')^2 <= 2 C_B^4, and the upper triangle has at most
    the Frobenius norm, so Delta_M = sqrt(2) C_B^2. u: ||r x - r' x'|| <= 2 c_r C_B = Delta_u.
    (The paper's Section 3.1 uses W ~ N(0, 4 C_B^2 sigma^2), xi ~ N(0, C_B^2 c_r^2 sigma^2) with
    sigma = 2 sqrt(2 ln(1.25/delta))/eps; its u noise is smaller than the sensitivity 2 c_r C_B requires for an
    even split, so we calibrate from the sensitivities above instead.)
    c~ uses sigma = the std of the entries of W (the noise the shift has to dominate).
    calibration "classic" (sigma = Delta sqrt(2 ln(1.25/delta'))/eps', the paper's Lemma 2.1) is proven for
    eps' <= 1, i.e. eps <= 2 here (eps <= 4 for the multi-parameter split); "analytic" is exact for every eps.
  * ldp-sgd: eps-LDP l2-ball mechanism with radius R = 2 c_r C_B (delta unused).
  * multi: every arm slot is privatized at (eps/2, delta/2) (Propositions 4.1-4.2); a neighbouring user changes at
    most two slots (its pulled arm and the neighbour's), so the whole message is (eps, delta)-LDP. Inside an OLS
    slot, (eps/2, delta/2) is split evenly between M and u: (eps/4, delta/4) each. SGD slots: l2-ball at eps/2.
    The psi(0, 0) messages of the non-pulled arms have the same shapes and the same noise as the real one.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from numba import njit

from ldpfed.algorithms.base import Algorithm
from ldpfed.algorithms.compiled import CompiledAlgorithm, Steps, no_weights
from ldpfed.algorithms.fields import Field
from ldpfed.algorithms.options import CALIBRATION, Option
from ldpfed.envs.links import link_code, link_mean, mean_function
from ldpfed.mechanisms.clip import CLIP_RTOL, clip_row, clip_value
from ldpfed.util.errors import ConfigError
from ldpfed.util.linalg import spd_solve
from ldpfed.mechanisms import (Domain, GaussianMechanism, L2BallMechanism, SymmetricGaussianMechanism,
                              weighted_sphere_bounds)

SINGLE_ENVS = ("linear", "logistic", "poisson")
MULTI_ENVS = ("linear-multi", "logistic-multi", "poisson-multi", "classification")
PAPER = "seed 000 Han et al. 2021"


# ---- options (ldpfed.algorithms.options) ------------------------------------------------------------------------
CONTEXT_BOUND = Option(1.0, low=0, low_open=True,
                       doc="C_B: public bound on a context's norm; the client clips contexts to it (and rewards to "
                           "the env's reward bound c_r) before privatizing, and the noise is calibrated for it")
ALPHA = Option(0.1, low=0, high=1, low_open=True, high_open=True,
               doc="failure probability in the shift c~ (Theorems 3.1, 4.1); 0.1 is the authors' public code "
                   "(fail_prob)")
RIDGE = Option(1.0, low=0, low_open=True,
               doc="constant ridge of the non-private OLS solve, in place of the noise shift (a reconstruction)")
STEP = Option(5.0, low=0, low_open=True,
              doc="SGD step numerator: eta_t = step / (t + step_offset) (5: the authors' public code's 5/(t+1))")
STEP_OFFSET = Option("auto", low=0, allow=("auto",),
                     doc="SGD step offset (a reconstruction); 'auto' = B - 1 (0 at B = 1, the paper's c/t): damps "
                         "the first steps of a round, which all use one published theta")
RADIUS = Option("auto", low=0, low_open=True, allow=("auto",),
                doc="clip radius R of the gradient before the l2-ball mechanism; 'auto' = 2 c_r C_B (the paper)")
S0 = Option("auto", kind="int", low=1, allow=("auto", "authors"),
            doc="warm-up pulls per arm; 'auto' = min(3000, max(1, round(T / (100 K)))) (the paper's 3000 at T = 1e6: "
                "about 1% of the users; a reconstruction for smaller T); 'authors' = ceil(3000 / K) (the public "
                "code's 3000 warm-up users in all)")
H = Option(1.0, low=0, low_open=True, allow_inf=True,
           doc="elimination margin h of eq. 7, in units of x^T theta (the paper's h_sub is unknown to the "
               "algorithm; 1.0 is a reconstruction); inf: no elimination (the authors' code)")
PROJECT = Option(math.inf, low=0, low_open=True, allow_inf=True,
                 doc="radius of the ball every theta_a is projected on after each update (post-processing); inf: "
                     "none (the paper)")


def _unit_vector(rng: np.random.Generator, d: int) -> np.ndarray:
    theta = rng.standard_normal(d)
    return theta / np.linalg.norm(theta)


def authors_sigma(eps: float, delta: float, shares: float = 2.5) -> float:
    """The noise std of seed 000's public code (OLS, UCB: 6 sqrt(2 ln(2.5/delta))/eps; GLOC: shares = 3.75), the same
    for every field of the message whatever its sensitivity."""
    return 6.0 * math.sqrt(2.0 * math.log(shares / delta)) / eps


def authors_gaussian(cls, sigma: float, sensitivity: float, eps: float, delta: float):
    """A Gaussian mechanism (class cls) with noise std `sigma`, recorded in the ledger at its budget share
    (eps, delta) with the sensitivity that sigma covers under the classic calibration; and whether that covers the
    field's true sensitivity (if not, the share's (eps, delta) claim does not hold)."""
    covered = sigma * eps / math.sqrt(2.0 * math.log(1.25 / delta))
    return cls(covered, eps, delta, calibration="classic"), covered >= sensitivity * (1.0 - 1e-12)


def l2_ball_gamma_ratio(dim: int) -> float:
    """Gamma((dim+1)/2) / Gamma(dim/2): the part of the l2-ball mechanism's B that depends on the dimension."""
    return math.exp(math.lgamma((dim + 1) / 2.0) - math.lgamma(dim / 2.0))


class _GLMBase(Algorithm):
    """What every seed-000 algorithm shares: the link, the public bounds, the client's clipping.

    profile "authors-code" (`self.authors`): the choices of the public code (liangzp/LDP-Bandit, Scheme1/), listed per
    class; the multi-parameter versions then do not clip inputs (the code does not), and where that or the code's
    noise leaves a field's sensitivity uncovered the ledger rows carry "claim_void" with the reason."""

    private = True

    def setup(self):
        multi = self.name.endswith("-multi")
        if bool(self.world.multi) != multi:
            raise ConfigError("env", self.world.name, f"{self.name} runs on {self.envs()}")
        self.authors = self.profile == "authors-code"
        self.void_reasons: list[str] = []
        self.C_B = self.params["context_bound"]
        self.c_r = float(self.world.reward_bound)
        self.link = self.world.link or "identity"
        self.mu = mean_function(self.link)       # the Poisson mean capped at e^50 (ldpfed.envs.links)
        self._I = np.eye(self.d)
        # the message's arm slots: none for a single parameter; multi: a leading (K,) axis, sent on the public
        # schedule `sent_slots` (set by _MultiBase._setup_multi)
        self.slot_axes, self.slot_schedule = (), {}
        # The authors' multi-parameter code privatizes raw N(0, I_d) contexts and noisy rewards without clipping.
        self.clip_inputs = not (self.authors and multi and self.private)
        if not self.clip_inputs:
            self.void_reasons.append(
                f"inputs are not clipped (authors' code): contexts and rewards may exceed the bounds C_B = {self.C_B:g}, "
                f"c_r = {self.c_r:g} the noise is calibrated for (N(0, I_d) contexts have norm ~ sqrt(d))")
        self._setup()

    def _setup(self):
        pass

    def ledger(self):
        rows = super().ledger()
        if self.void_reasons:
            reason = "; ".join(self.void_reasons)
            rows = [{**row, "claim_void": reason} for row in rows]
        return rows

    def _ols_sensitivities(self):
        return math.sqrt(2.0) * self.C_B ** 2, 2.0 * self.c_r * self.C_B


# ---------------------------------------------------------------------------------------------------------------
# Single parameter (Algorithm 1)
# ---------------------------------------------------------------------------------------------------------------
class _SingleBase(_GLMBase, CompiledAlgorithm):
    """Written once (ldpfed.algorithms.compiled): the greedy arm of the published theta, then each class's prepare
    and update."""

    env_kinds = SINGLE_ENVS
    default_env = "linear"
    paper_setting = {"env_params": {"d": 2, "K": 10}, "users": 10**6, "eps": 1.0, "delta": 0.01}
    model_keys = ("theta",)

    def estimate(self, state):
        return state["theta"]

    def _chosen(self, contexts, actions):
        return contexts[np.arange(len(actions)), actions]


@njit(cache=True)
def _dot(a, b):
    s = 0.0
    for j in range(a.shape[0]):
        s += a[j] * b[j]
    return s


@njit(cache=True)
def greedy_act(model, consts, contexts, i, user, draws, actions):
    """The arm of the largest x_{i,k}^T theta (the first of equals)."""
    theta = model[0]
    best, arm = -np.inf, 0
    for k in range(contexts.shape[1]):
        score = _dot(contexts[i, k], theta)
        if score > best or k == 0:
            best, arm = score, k
    actions[i] = arm


@njit(cache=True)
def _take_clipped(contexts, i, arm, reward, C_B, c_r, x, counts_i):
    """x = the pulled arm's context clipped to C_B; returns the reward clipped to c_r; counts both."""
    for j in range(x.shape[0]):
        x[j] = contexts[i, arm, j]
    counts_i[0] = clip_row(x, C_B, CLIP_RTOL)
    r, counts_i[1] = clip_value(reward, c_r)
    return r


class LdpOls(_SingleBase):
    """LDP-OLS (Algorithm 1 with eq. 3-4). Budget: (eps/2, delta/2) for M, (eps/2, delta/2) for u (module doc).

    profile "authors-code" (Scheme1 GOLSServer + OLSMechanism): noise std 6 sqrt(2 ln(2.5/delta))/eps on every
    entry of M and u (more than the calibration above needs while c_r C_B <= 1.5, so the claim stands), and theta_hat
    = (sum M)^{-1} sum u with NO shift (the code's greedy OLS; its shifted variant ROLSServer is not the one run)."""

    name = "ldp-ols"
    paper = f"{PAPER}, Algorithm 1 with the OLS mechanism (eq. 3-4)"
    privacy_model = "ldp"
    # alpha: failure probability in c~ (Theorem 3.1); 0.1 is the authors' public code (fail_prob).
    options = {"alpha": ALPHA, "calibration": CALIBRATION, "context_bound": CONTEXT_BOUND}

    def _setup(self):
        self._set_noise(self.eps / 2, self.delta / 2, log_arg=2.0 * self.T)

    def _set_noise(self, eps, delta, log_arg):
        alpha, calibration = self.params["alpha"], self.params["calibration"]
        sens_M, sens_u = self._ols_sensitivities()
        if self.authors:
            sigma = authors_sigma(self.eps, self.delta)   # the user's whole (eps, delta), for every field and slot
            self.mech_M, ok_M = authors_gaussian(SymmetricGaussianMechanism, sigma, sens_M, eps, delta)
            self.mech_u, ok_u = authors_gaussian(GaussianMechanism, sigma, sens_u, eps, delta)
            if not (ok_M and ok_u):
                self.void_reasons.append(
                    f"the authors' noise std {sigma:.4g} is below the calibration of the fields' sensitivities "
                    f"(M: {sens_M:.4g}, u: {sens_u:.4g}) at their shares (eps={eps:g}, delta={delta:g})")
        else:
            self.mech_M = SymmetricGaussianMechanism(sens_M, eps, delta, calibration=calibration)
            self.mech_u = GaussianMechanism(sens_u, eps, delta, calibration=calibration)
        self.mechanisms = {"M": self.mech_M, "u": self.mech_u}
        # Theorem 3.1 (4.1 for multi: log(2TK/alpha)): c~ = 2 sigma (4 sqrt(d) + 2 log(2T/alpha)).
        self.c_shift = 2.0 * self.mech_M.sigma * (4.0 * math.sqrt(self.d) + 2.0 * math.log(log_arg / alpha))

    def shift(self, t):
        if self.authors:
            return 0.0       # the authors' greedy OLS inverts the noisy Gram matrix as it is
        return self.c_shift * math.sqrt(t)

    def initial_state(self, rng):
        d = self.d
        return {"V": np.zeros((d, d)), "U": np.zeros(d), "t": np.zeros(1, dtype=np.int64), "theta": np.zeros(d)}

    def fields(self):
        # M = x x^T and u = r x (per arm slot for multi), of clipped inputs: |x_i x_j| <= ||x||^2 <= C_B^2,
        # |r x_i| <= c_r C_B; through the Gaussian mechanisms (raw, to a server that is trusted, without privacy)
        slots, schedule = self.slot_axes, self.slot_schedule
        shapes = {"M": (*slots, self.d, self.d), "u": (*slots, self.d)}
        bounds = {"M": self.C_B ** 2, "u": self.c_r * self.C_B}
        if self.private:
            return {f: Field(shapes[f], mechanism=self.mechanisms[f], data_bound=bounds[f], schedule=schedule)
                    for f in shapes}
        return {f: Field(shapes[f], domain=Domain(shapes[f], low=-bounds[f], high=bounds[f], symmetric=f == "M",
                                                  source="raw, public bounds", **schedule), raw=True)
                for f in shapes}

    state_keys = ("V", "U", "t", "theta")
    metric_names = ("clipped_context", "clipped_reward")

    def steps(self):
        return Steps(greedy_act, _ols_prepare, no_weights, _ols_update)

    def consts(self):
        # the shift after user t: c~ sqrt(t) (paper), 0 (authors' code), or the constant ridge (ols)
        scale, root = (self.c_shift, True) if type(self).shift is LdpOls.shift and not self.authors \
            else (float(self.shift(1)), False)
        return (self.C_B, self.c_r, float(scale), root)


class Ols(LdpOls):
    """Greedy OLS without privacy: LDP-OLS with the noise off. The shift c~ sqrt(t) exists only to dominate the
    privacy noise; without noise a constant ridge (params.ridge, a reconstruction, not from the paper) keeps the
    first solves well posed."""

    name = "ols"
    paper = f"{PAPER}, non-private greedy OLS baseline"
    privacy_model = "none"
    private = False
    options = {"ridge": RIDGE, "context_bound": CONTEXT_BOUND}

    def _setup(self):
        self.ridge = self.params["ridge"]

    def shift(self, t):
        return self.ridge


class LdpSgd(_SingleBase):
    """LDP-SGD (Algorithm 1 with eq. 5-6): eps-LDP l2-ball mechanism on the clipped gradient.

    Step eta_t = step / (t + step_offset) for the t-th user (t = 1, 2, ...); the defaults are the authors' public
    code 5/(t+1) with its 0-based t (Theorem 3.1 takes eta_t = c' d / (kappa_l zeta p_* t), whose constants are
    unknown in practice). step_offset (default "auto" = B - 1: 0 at B = 1, the paper's c/t) is a reconstruction: a positive offset
    damps the first, largest steps (the public code's RSGD server used 1/(t+50)). Start: a
    random unit vector (public code), drawn from the run's init generator. No projection (the paper has none).
    In a round every user's gradient is taken at the published theta and applied with its own eta_t (aggregate).

    radius: the clip radius R of the gradient, "auto" = 2 c_r C_B (the paper). profile "authors-code" (Scheme1
    GreedySGDServer + SGDLDPMechanism): R = 1 (the code's hemisphere probability 1/2 + ||g||/2 saturates at norm 1,
    which is clipping at 1: still eps-LDP), mu evaluated at x^T theta clipped to [-20, 20], and a weight decay
    theta <- theta - eta_t (Z + 0.05 theta) on the logistic and Poisson links (0 on the identity link)."""

    name = "ldp-sgd"
    paper = f"{PAPER}, Algorithm 1 with the SGD mechanism (eq. 5-6)"
    privacy_model = "ldp"
    options = {"step": STEP, "step_offset": STEP_OFFSET, "context_bound": CONTEXT_BOUND, "radius": RADIUS}
    profile_defaults = {"authors-code": {"radius": 1.0}}

    def _setup(self):
        self._set_step()
        self.grad_radius = self._radius()
        self.mech = L2BallMechanism(self.grad_radius, self.eps, self.d)
        self.mechanisms = {"Z": self.mech}
        self.decay = 0.05 if self.authors and self.link != "identity" else 0.0
        self.predict_clip = 20.0 if self.authors else math.inf    # |x^T theta| cap inside mu (authors' code)

    def _radius(self):
        radius = self.params["radius"]
        return 2.0 * self.c_r * self.C_B if radius == "auto" else radius

    def _predict(self, z):
        return self.mu(z if math.isinf(self.predict_clip) else np.clip(z, -self.predict_clip, self.predict_clip))

    def _eta(self, users):
        """Step of each user (public: a function of the arrival index only; user i, 0-based, is the (i+1)-th)."""
        return self.step / (np.asarray(users, dtype=float) + (1.0 + self.step_offset))

    def _set_step(self):
        self.step = self.params["step"]
        offset = self.params["step_offset"]
        if offset == "auto":
            # B - 1: zero at B = 1 (the paper's sequential steps); with rounds it keeps the B steps taken at one
            # published theta from summing to a huge first move (5 H_B at B = 1000 made LDP-SGD diverge).
            offset = self.config.round_size - 1
        self.step_offset = float(offset)

    def initial_state(self, rng):
        return {"theta": _unit_vector(rng, self.d)}

    def fields(self):
        # the l2-ball mechanism's outputs (per arm slot for multi): norm B whatever the gradient, no data bound
        return {"Z": Field((*self.slot_axes, self.d), mechanism=self.mechanisms["Z"], schedule=self.slot_schedule)}

    def aggregate_bounds(self, users):
        # sum_i eta_i Z_i with public eta_i > 0 and ||Z_i|| = B: per slot row, norm <= sum_i eta_i B; the sums of
        # the weights are read off `aggregate` itself (on outputs of one coordinate, 1 in the sent slots)
        if self.anonymous_sums():     # shuffled: plain sums (CompiledAlgorithm.anonymous_sums)
            return super().aggregate_bounds(users)
        spec, users, domains = self.message_spec(), np.asarray(users), self.cached_domains()
        if domains["Z"].slots is None:
            eta_sums = np.array([self._eta(users).sum()])
        else:
            sent = np.asarray(domains["Z"].slots(users), dtype=float)
            ones = {"Z": sent[..., None], "n": sent}
            eta_sums = np.asarray(self.aggregate(ones, users)["Z"]).reshape(-1)
        bounds = {"Z": weighted_sphere_bounds(eta_sums, self.mech.output_radius, int(np.prod(spec["Z"])), self.d)}
        if "n" in domains:
            bounds["n"] = domains["n"].sum_bounds(users)
        return bounds

    state_keys = ("theta",)
    metric_names = ("clipped_context", "clipped_reward", "clipped")

    def central_sources(self):
        # weigh scales each field by the public eta_t (entry-wise): the aggregate carries the message's fields
        return {key: key for key in self.layout().names}

    def steps(self):
        return Steps(greedy_act, _sgd_prepare, _sgd_weigh, _sgd_update)

    def consts(self):
        return (self.C_B, self.c_r, self.grad_radius, link_code(self.link), self.predict_clip, self.step,
                1.0 + self.step_offset, self.decay)


@njit(cache=True)
def _ols_prepare(model, consts, contexts, actions, reward, user, i, inputs, counts):
    """Row: M = x x^T (d * d), then u = r x (d), of the clipped context and reward."""
    C_B, c_r = consts[0], consts[1]
    d = contexts.shape[2]
    row = inputs[i]
    x = row[d * d:]                       # u's slot holds x until M is written
    r = _take_clipped(contexts, i, actions[i], reward, C_B, c_r, x, counts[i])
    for a in range(d):
        for b in range(d):
            row[a * d + b] = x[a] * x[b]
    for j in range(d):
        x[j] = r * x[j]


@njit(cache=True)
def _ols_update(state, consts, sums, start, stop, server):
    """V += sum M, U += sum u, theta = (V + shift(stop) I)^{-1} U."""
    V, U, t, theta = state
    scale, root = consts[2], consts[3]
    d = U.shape[0]
    A = np.empty((d, d))
    shift = scale * np.sqrt(stop) if root else scale
    for a in range(d):
        for b in range(d):
            V[a, b] += sums[a * d + b]
            A[a, b] = V[a, b]
        U[a] += sums[d * d + a]
        A[a, a] = V[a, a] + shift
    theta[:] = np.linalg.solve(A, U)
    t[0] = stop


@njit(cache=True)
def _sgd_prepare(model, consts, contexts, actions, reward, user, i, inputs, counts):
    """Row: the gradient g = (mu(x^T theta) - r) x of the clipped context and reward, clipped to R."""
    C_B, c_r, R, link, predict_clip = consts[0], consts[1], consts[2], consts[3], consts[4]
    theta = model[0]
    g = inputs[i]
    r = _take_clipped(contexts, i, actions[i], reward, C_B, c_r, g, counts[i])
    coef = link_mean(link, min(max(_dot(g, theta), -predict_clip), predict_clip)) - r
    for j in range(g.shape[0]):
        g[j] = coef * g[j]
    counts[i, 2] = clip_row(g, R, CLIP_RTOL)


@njit(cache=True)
def _sgd_eta(consts, user):
    """eta of user `user` (0-based): step / (user + 1 + step_offset), public."""
    return consts[5] / (user + consts[6])


@njit(cache=True)
def _sgd_weigh(consts, user, row):
    eta = _sgd_eta(consts, user)
    for j in range(row.shape[0]):
        row[j] = eta * row[j]


@njit(cache=True)
def _sgd_update(state, consts, sums, start, stop, server):
    """theta <- theta (1 - decay sum eta) - sum eta Z (the authors' weight decay at the published theta)."""
    theta = state[0]
    decay = consts[7]
    if decay != 0.0:
        etas = 0.0
        for user in range(start, stop):
            etas += _sgd_eta(consts, user)
        for j in range(theta.shape[0]):
            theta[j] = theta[j] * (1.0 - decay * etas)
    for j in range(theta.shape[0]):
        theta[j] = theta[j] - sums[j]


# ---------------------------------------------------------------------------------------------------------------
# Multi parameter (Algorithm 2)
# ---------------------------------------------------------------------------------------------------------------
class _MultiBase(_GLMBase):
    """Warm-up, elimination (eq. 7) and synthetic updates shared by the OLS and SGD versions.

    Every message has per-arm fields of shape (K, ...) and the public field n (K,): how many messages each arm's
    slot carries (a one-hot of the public round-robin arm during warm-up, all ones after; a function of the
    arrival index only). After warm-up every slot is a full mechanism output.

    s0 (warm-up pulls per arm): the paper's 3000 at T = 1e6; default "auto" = min(3000, max(1, round(T / (100 K))))
    (warm-up about 1% of the users, the paper's proportion), a reconstruction for smaller T.
    h (elimination margin, eq. 7, in units of the linear predictor x^T theta): the paper sets h = h_sub, a property
    of the world unknown to the algorithm; default 1.0 is a reconstruction (eliminates only arms predicted at least
    0.5 below the best); h = inf turns elimination off, as in the authors' public code.
    profile "authors-code" (Scheme1/instances/multiparam.py): s0 = "authors" = ceil(3000 / K) (the code's 3000
    warm-up users in total), h = inf, and the inputs are not clipped (see _GLMBase).

    Written once (ldpfed.algorithms.compiled): `_multi_act` (round-robin, then elimination and the greedy pull), each
    class's prepare (the pulled arm's data in its slot, psi(0, 0) = zeros in the others, the public slot count n),
    `finish` (the slots the public schedule does not send zeroed after privatization) and update. The state keeps
    theta_warm as an array: it follows theta until the warm-up ends (what users after the warm-up see while it has
    not: the published theta) and is frozen at the theta after the update of user K s0 - 1 (theta_hat_{K s0}).
    """

    env_kinds = MULTI_ENVS
    default_env = "linear-multi"
    model_keys = ("theta", "theta_warm")

    def _setup_multi(self):
        s0 = self.params["s0"]
        if s0 == "auto":
            s0 = min(3000, max(1, int(round(self.T / (100 * self.K)))))
        elif s0 == "authors":
            s0 = -(-3000 // self.K)
        self.s0 = int(s0)
        self.warm = self.K * self.s0
        self.h = self.params["h"]
        self.slot_axes, self.slot_schedule = (self.K,), {"slots": self.sent_slots}
        if not self.clip_inputs:     # the counters of inputs beyond the bounds (the authors' code does not clip)
            self.metric_names = UNCLIPPED + type(self).metric_names[2:]

    def estimate(self, state):
        return state["theta"]

    def sent_slots(self, users) -> np.ndarray:
        """(n, K) 0/1: the slots a user's message carries, a function of the arrival index only (public)."""
        users = np.asarray(users)
        return np.where((users >= self.warm)[:, None], 1.0, np.arange(self.K) == (users % self.K)[:, None])

    def fields(self):
        # the per-arm fields of the OLS or SGD message (super: K slots each, on the public schedule), and n: which
        # slots the message carries, public
        n = Domain((self.K,), exact=self.sent_slots, source="public count of the sent slots")
        return {**super().fields(), "n": Field((self.K,), domain=n)}

    def _initial_theta_state(self, theta):
        return {"theta": theta, "theta_warm": theta.copy()}

    def multi_consts(self) -> tuple:
        """The constants every multi-parameter step reads (the indices C_B_ ... PROJECT_ below)."""
        return (self.C_B, self.c_r, bool(self.clip_inputs), int(self.K), int(self.d), int(self.s0), int(self.warm),
                float(self.h), float(getattr(self, "project", math.inf)))

    def ledger(self):
        note = ("per arm slot; K slots per user, a neighbouring input changes at most 2 slots "
                "(pulled arm and the neighbour's), so the user's message is (eps, delta)-LDP")
        why = ("parallel composition over the K arm slots: slot a carries data only when a is the pulled arm and "
               "psi(0, 0) otherwise, with independent noise per slot, so two inputs differ in at most 2 slots "
               "(their two pulled arms; 1 when K = 1) and the other slots have the same law under both")
        return [{**row, "scope": note, "per_user": min(2, self.K), "composition": why} for row in super().ledger()]


UNCLIPPED = ("unclipped_context_over_bound", "unclipped_reward_over_bound")
# consts of the multi-parameter steps: _MultiBase.multi_consts, then each class's own
C_B_, C_R_, CLIP_, K_, D_, S0_, WARM_, H_, PROJECT_ = range(9)
SHIFT_MODE_, SHIFT_SCALE_ = 9, 10                        # LdpOlsMulti
LINK_, RADIUS_, STEP_, STEP_OFFSET_, AUTHORS_, PREDICT_CLIP_, B_SCALE_, DECAY_, C_SHIFT_ = range(9, 18)  # LdpSgdMulti
SHIFT_PER_ARM, SHIFT_ROOT_T, SHIFT_CONSTANT = range(3)   # c~ sqrt(max(n_a, 1)), c~ sqrt(t), a constant ridge


@njit(cache=True)
def _multi_act(model, consts, contexts, i, user, draws, actions):
    """_MultiBase: round-robin (user % K) during the warm-up, then eq. (7): the arms whose warm-up score
    x^T theta_warm_a is within h/2 of the best survive, and the survivor of the largest x^T theta_a is pulled (the
    first of equals)."""
    theta, theta_warm = model[0], model[1]
    K = consts[K_]
    if user < consts[WARM_]:
        actions[i] = user % K
        return
    x = contexts[i]
    top = -np.inf
    for k in range(K):
        top = max(top, _dot(x, theta_warm[k]))
    floor = top - consts[H_] / 2
    best, arm = -np.inf, 0
    for k in range(K):
        score = _dot(x, theta[k]) if _dot(x, theta_warm[k]) > floor else -np.inf
        if score > best or k == 0:
            best, arm = score, k
    actions[i] = arm


@njit(cache=True)
def _multi_inputs(consts, contexts, i, reward, x, counts_i):
    """x = the user's context, clipped to C_B, and the reward clipped to c_r (returned), counted in counts_i[0:2];
    without clipping (the authors' multi-parameter code) as they are, counted where they exceed the bounds (the
    rules of ldpfed.mechanisms.clip.rows_over and values_over)."""
    C_B, c_r = consts[C_B_], consts[C_R_]
    for j in range(x.shape[0]):
        x[j] = contexts[i, j]
    if consts[CLIP_]:
        counts_i[0] = clip_row(x, C_B, CLIP_RTOL)
        r, counts_i[1] = clip_value(reward, c_r)
        return r
    counts_i[0] = 1 if _dot(x, x) > C_B ** 2 * (1.0 + 2.0 * CLIP_RTOL) else 0
    counts_i[1] = 1 if abs(reward) > c_r else 0
    return reward


@njit(cache=True)
def _sent(consts, user, k):
    """1.0 when slot k of this user's message is sent (every slot after the warm-up, the public arm's during it)."""
    if user >= consts[WARM_] or k == user % consts[K_]:
        return 1.0
    return 0.0


@njit(cache=True)
def _write_sent(consts, user, row, offset):
    for k in range(consts[K_]):
        row[offset + k] = _sent(consts, user, k)


@njit(cache=True)
def _zero(row, lo, hi):
    for j in range(lo, hi):
        row[j] = 0.0


@njit(cache=True)
def _zero_unsent(consts, user, row, offset, size):
    """The slots (of `size` entries each, from `offset`) that the public schedule does not send, zeroed."""
    for k in range(consts[K_]):
        if _sent(consts, user, k) == 0.0:
            _zero(row, offset + k * size, offset + (k + 1) * size)


@njit(cache=True)
def _write_ols_slot(row, K, d, a, x, r):
    """M_a = x x^T and u_a = r x in arm a's slots of an OLS message (M: K d d entries, then u: K d)."""
    base = a * d * d
    for p in range(d):
        for q in range(d):
            row[base + p * d + q] = x[p] * x[q]
    for j in range(d):
        row[K * d * d + a * d + j] = r * x[j]


@njit(cache=True)
def _ols_multi_prepare(model, consts, contexts, actions, reward, user, i, inputs, counts):
    """Row: M (K, d, d), u (K, d): x x^T and r x of the (clipped) context and reward in the pulled arm's slots,
    zeros in the others (psi(0, 0)); then n (K,), the public count of the sent slots."""
    K, d = consts[K_], consts[D_]
    row = inputs[i]
    a = actions[i]
    _zero(row, 0, K * d * (d + 1))
    x = row[K * d * d + a * d:K * d * d + (a + 1) * d]    # u's slot holds x until M is written
    r = _multi_inputs(consts, contexts, i, reward, x, counts[i])
    _write_ols_slot(row, K, d, a, x, r)
    _write_sent(consts, user, row, K * d * (d + 1))


@njit(cache=True)
def _ols_multi_finish(consts, user, row):
    """The slots of M and u that the public schedule does not send (the warm-up's other arms), zeroed."""
    K, d = consts[K_], consts[D_]
    _zero_unsent(consts, user, row, 0, d * d)
    _zero_unsent(consts, user, row, K * d * d, d)


@njit(cache=True)
def _ols_multi_solve(V, U, theta, k, shift, A):
    """theta_k = (V_k + shift I)^{-1} U_k (V_k is symmetric: ldpfed.util.linalg's Cholesky solve)."""
    d = U.shape[1]
    for p in range(d):
        for q in range(d):
            A[p, q] = V[k, p, q]
        A[p, p] = V[k, p, p] + shift
    spd_solve(A, U[k], theta[k])


@njit(cache=True)
def _add_ols_sums(V, U, sums, K, d):
    for k in range(K):
        for p in range(d):
            for q in range(d):
                V[k, p, q] += sums[k * d * d + p * d + q]
            U[k, p] += sums[K * d * d + k * d + p]


@njit(cache=True)
def _slot_unchanged(sums, K, d, k, mode):
    """Whether arm k's theta_k stays what it is: its slots of M and u are all zero (V_k, U_k unchanged) and so is
    its shift (constant, or per arm with a zero count). Its solve would give the same bits again."""
    if mode == SHIFT_ROOT_T or (mode == SHIFT_PER_ARM and sums[K * d * (d + 1) + k] != 0.0):
        return False
    for j in range(k * d * d, (k + 1) * d * d):
        if sums[j] != 0.0:
            return False
    for j in range(K * d * d + k * d, K * d * d + (k + 1) * d):
        if sums[j] != 0.0:
            return False
    return True


@njit(cache=True)
def _ols_multi_update(state, consts, sums, start, stop, server):
    """V_a += sum M_a, U_a += sum u_a, n_a += sum n_a, theta_a = (V_a + shift_a I)^{-1} U_a for every arm whose
    statistics or shift changed (ols-multi after the warm-up: the pulled arm only; the others' psi(0, 0) is zero);
    theta_warm follows theta until the warm-up ends."""
    V, U, n, theta, theta_warm = state
    K, d = consts[K_], consts[D_]
    mode, scale = consts[SHIFT_MODE_], consts[SHIFT_SCALE_]
    _add_ols_sums(V, U, sums, K, d)
    A = np.empty((d, d))
    for k in range(K):
        unchanged = _slot_unchanged(sums, K, d, k, mode)
        n[k] += sums[K * d * (d + 1) + k]
        if unchanged:
            continue
        if mode == SHIFT_PER_ARM:
            # an arm whose slot has received nothing yet has V = 0 and U = 0: any positive shift gives theta = 0
            shift = scale * np.sqrt(max(n[k], 1.0))
        elif mode == SHIFT_ROOT_T:
            shift = scale * math.sqrt(stop)
        else:
            shift = scale
        _ols_multi_solve(V, U, theta, k, shift, A)
    _follow_warm(consts, theta, theta_warm, start)


@njit(cache=True)
def _follow_warm(consts, theta, theta_warm, start):
    """theta_warm = theta after every update of a round that starts in the warm-up: the last is theta_hat_{K s0}."""
    if start < consts[WARM_]:
        theta_warm[:, :] = theta


@njit(cache=True)
def _project_rows(consts, theta):
    """Every theta_a scaled into the ball of radius `project` (post-processing; inf: nothing)."""
    radius = consts[PROJECT_]
    if math.isinf(radius):
        return
    for k in range(theta.shape[0]):
        norm = math.sqrt(_dot(theta[k], theta[k]))
        scale = min(1.0, radius / max(norm, 1e-300))
        for j in range(theta.shape[1]):
            theta[k, j] = theta[k, j] * scale


class LdpOlsMulti(_MultiBase, LdpOls):
    """LDP-OLS, multi parameter (Algorithm 2 with eq. 3-4). Each arm slot at (eps/2, delta/2), split evenly
    between M and u: (eps/4, delta/4) each. c~ = 2 sigma (4 sqrt(d) + 2 log(2TK/alpha)) (Theorem 4.1) with sigma the
    std of W, and the shift of arm a is c~ sqrt(n_a), n_a = the number of (noisy) messages its slot received.
    (paper_setting: s0 "auto" is the paper's 3000 at its T = 1e6.)

    profile "authors-code" (multiparam.py): every slot's M and u get noise std 6 sqrt(2 ln(2.5/delta))/eps (the
    user's whole budget, not split between slots or fields); every arm's shift is c~ sqrt(t), t = users so far, with
    c~ = 2 sigma (4 sqrt(d) + 2 log(2T/alpha)); plus the _MultiBase choices (unclipped N(0, I_d) contexts: claim
    void)."""

    name = "ldp-ols-multi"
    paper = f"{PAPER}, Algorithm 2 with the OLS mechanism"
    privacy_model = "ldp"
    options = {"s0": S0, "h": H, "alpha": ALPHA, "calibration": CALIBRATION, "context_bound": CONTEXT_BOUND}
    profile_defaults = {"authors-code": {"s0": "authors", "h": math.inf}}
    paper_setting = {"env_params": {"d": 20, "K": 3}, "users": 10**6, "eps": 1.0, "delta": 0.1, "params": {}}
    state_keys = ("V", "U", "n", "theta", "theta_warm")
    metric_names = ("clipped_context", "clipped_reward")

    def _setup(self):
        self._setup_multi()
        self._set_noise(self.eps / 4, self.delta / 4, log_arg=2.0 * self.T * (1 if self.authors else self.K))

    def shift_rule(self) -> tuple:
        """(mode, scale) of the shift after an update: c~ sqrt(max(n_a, 1)) per arm (the paper), c~ sqrt(t) for
        every arm (the authors' code), or a constant ridge (ols-multi)."""
        if self.authors and self.private:
            return SHIFT_ROOT_T, float(self.c_shift)
        return SHIFT_PER_ARM, float(self.c_shift)

    def initial_state(self, rng):
        K, d = self.K, self.d
        return {"V": np.zeros((K, d, d)), "U": np.zeros((K, d)), "n": np.zeros(K),
                **self._initial_theta_state(np.zeros((K, d)))}

    def steps(self):
        return Steps(_multi_act, _ols_multi_prepare, no_weights, _ols_multi_update, _ols_multi_finish)

    def consts(self):
        return (*self.multi_consts(), *self.shift_rule())


class OlsMulti(LdpOlsMulti):
    """Algorithm 2 with greedy OLS and no privacy: LDP-OLS-multi with the noise off (psi(0, 0) is then an empty
    message); constant ridge params.ridge instead of the noise shift (a reconstruction, as for ols)."""

    name = "ols-multi"
    paper = f"{PAPER}, non-private Algorithm 2 with OLS"
    privacy_model = "none"
    private = False
    options = {"s0": S0, "h": H, "ridge": RIDGE, "context_bound": CONTEXT_BOUND}

    def _setup(self):
        self._setup_multi()
        self.ridge = self.params["ridge"]

    def shift_rule(self):
        return SHIFT_CONSTANT, float(self.ridge)


@njit(cache=True)
def _sgd_multi_gradient(model, consts, contexts, reward, i, a, g, counts_i):
    """g = (mu(x^T theta_a) - r) x of the (clipped) context and reward, clipped to R (counted in counts_i[2]);
    profile authors-code: x^T theta_a capped to +-predict_clip inside mu."""
    r = _multi_inputs(consts, contexts, i, reward, g, counts_i)
    z = _dot(g, model[0][a])
    if consts[AUTHORS_]:
        z = min(max(z, -consts[PREDICT_CLIP_]), consts[PREDICT_CLIP_])
    coef = link_mean(consts[LINK_], z) - r
    for j in range(g.shape[0]):
        g[j] = coef * g[j]
    counts_i[2] = clip_row(g, consts[RADIUS_], CLIP_RTOL)


@njit(cache=True)
def _sgd_multi_prepare(model, consts, contexts, actions, reward, user, i, inputs, counts):
    """Row: Z (K, d): the clipped gradient in the pulled arm's slot, zeros in the others (psi(0, 0): the zero
    gradient); then n (K,), the public count of the sent slots."""
    K, d = consts[K_], consts[D_]
    row = inputs[i]
    a = actions[i]
    _zero(row, 0, K * d)
    _sgd_multi_gradient(model, consts, contexts, reward, i, a, row[a * d:(a + 1) * d], counts[i])
    _write_sent(consts, user, row, K * d)


@njit(cache=True)
def _sgd_multi_finish(consts, user, row):
    _zero_unsent(consts, user, row, 0, consts[D_])


@njit(cache=True)
def _sgd_multi_eta(consts, user):
    """The step of the user's message in every slot: step / (j + step_offset), j its 1-based index among the
    slot's messages (public): user // K + 1 during the warm-up (the slot of arm user % K), s0 + user - K s0 + 1
    after."""
    warm = consts[WARM_]
    count = user // consts[K_] + 1 if user < warm else consts[S0_] + user - warm + 1
    return consts[STEP_] / (count + consts[STEP_OFFSET_])


@njit(cache=True)
def _sgd_multi_weigh(consts, user, row):
    eta = _sgd_multi_eta(consts, user)
    for j in range(consts[K_] * consts[D_]):
        row[j] = eta * row[j]


@njit(cache=True)
def _sgd_multi_update(state, consts, sums, start, stop, server):
    """theta <- project(theta - sum eta Z), n += sum n; theta_warm follows theta until the warm-up ends."""
    theta, n, theta_warm = state
    K, d = consts[K_], consts[D_]
    for k in range(K):
        n[k] += sums[K * d + k]
        for j in range(d):
            theta[k, j] = theta[k, j] - sums[k * d + j]
    _project_rows(consts, theta)
    _follow_warm(consts, theta, theta_warm, start)


# profile authors-code: the row is M (K, d, d), u (K, d), Z (K d, one l2-ball message), n (K,)
@njit(cache=True)
def _sgd_authors_prepare(model, consts, contexts, actions, reward, user, i, inputs, counts):
    """Warm-up: the OLS message (x x^T, r x) in the public arm's slots of M and u, Z zero; after it: Z = the
    gradient of the pulled arm in its d entries of the K d vector (clipped to R as a whole: the other entries are
    zero), M and u zero. Inputs not clipped (the authors' code)."""
    K, d = consts[K_], consts[D_]
    row = inputs[i]
    a = actions[i]
    _zero(row, 0, K * d * (d + 2))
    if user < consts[WARM_]:
        x = row[K * d * d + a * d:K * d * d + (a + 1) * d]
        r = _multi_inputs(consts, contexts, i, reward, x, counts[i])
        _write_ols_slot(row, K, d, a, x, r)
        counts[i, 2] = 0
    else:
        z0 = K * d * (d + 1)
        _sgd_multi_gradient(model, consts, contexts, reward, i, a, row[z0 + a * d:z0 + (a + 1) * d], counts[i])
    _write_sent(consts, user, row, K * d * (d + 2))


@njit(cache=True)
def _sgd_authors_finish(consts, user, row):
    """Warm-up: only the public arm's slots of M and u are sent (Z zeroed); after it only Z (M and u zeroed)."""
    K, d = consts[K_], consts[D_]
    if user < consts[WARM_]:
        _zero_unsent(consts, user, row, 0, d * d)
        _zero_unsent(consts, user, row, K * d * d, d)
        _zero(row, K * d * (d + 1), K * d * (d + 2))
    else:
        _zero(row, 0, K * d * (d + 1))


@njit(cache=True)
def _sgd_authors_eta(consts, user):
    """The code's step 5 K / (t + 1), t the 0-based user index, after the warm-up; 0 during it (public)."""
    if user < consts[WARM_]:
        return 0.0
    return consts[STEP_] * consts[K_] / (user + 1.0)


@njit(cache=True)
def _sgd_authors_weigh(consts, user, row):
    K, d = consts[K_], consts[D_]
    eta = _sgd_authors_eta(consts, user) * consts[B_SCALE_]
    for j in range(K * d * (d + 1), K * d * (d + 2)):
        row[j] = eta * row[j]


@njit(cache=True)
def _sgd_authors_update(state, consts, sums, start, stop, server):
    """V += sum M, U += sum u, n += sum n; the arms pulled (publicly) in the round's warm-up part re-solved by OLS
    with shift c~ sqrt(min(stop, K s0)); after the warm-up theta <- theta (1 - decay sum eta) - sum eta B_d/B_Kd Z."""
    theta, V, U, n, theta_warm = state
    K, d, warm = consts[K_], consts[D_], consts[WARM_]
    _add_ols_sums(V, U, sums, K, d)
    for k in range(K):
        n[k] += sums[K * d * (d + 2) + k]
    if start < warm:
        hi = min(stop, warm)
        shift = consts[C_SHIFT_] * math.sqrt(hi)
        A = np.empty((d, d))
        for k in range(K):
            if hi - start >= K or (k - start) % K < hi - start:      # arm k = u % K for some u in [start, hi)
                _ols_multi_solve(V, U, theta, k, shift, A)
    if stop > warm:
        etas = 0.0
        for user in range(max(start, warm), stop):
            etas += _sgd_authors_eta(consts, user)
        keep = 1.0 - consts[DECAY_] * etas
        z0 = K * d * (d + 1)
        for k in range(K):
            for j in range(d):
                theta[k, j] = theta[k, j] * keep - sums[z0 + k * d + j]
    _project_rows(consts, theta)
    _follow_warm(consts, theta, theta_warm, start)


class LdpSgdMulti(_MultiBase, LdpSgd):
    """LDP-SGD, multi parameter (Algorithm 2 with eq. 5-6): every slot an l2-ball mechanism at eps/2, radius
    R = 2 c_r C_B; psi(0, 0) is the mechanism applied to the zero gradient (a uniformly random direction).
    Start theta_{0,a} = 0 (Algorithm 2). Step of arm a at its j-th message (j = 1, 2, ...): step / (j + step_offset).
    Theorem 4.1 writes the count as (t mod K) + 1 during warm-up and t - (K-1) s0 after; the latter is the per-arm
    message count and we read the former as its warm-up analogue floor(t/K) + 1 (also the per-arm count), so eta
    decays like 1/(messages received) throughout.
    project: radius of a ball every theta_a is projected on after each update (post-processing, free of privacy
    cost; the paper assumes ||theta*_a|| <= 1 but its SGD has no projection, so the default is inf = none). The first
    steps (eta = 5 on messages of norm B ~ 59 at d = 20, eps/2 = 0.5) throw theta to norms of hundreds, which steps
    5/j forget only like j^(-5 lambda), lambda ~ 1/(K d) the curvature an arm sees with unit contexts; project = 1
    bounds them (see REPRODUCTION.md for what it does and does not change).
    (paper_setting: s0 "auto" is the paper's 3000 at its T = 1e6.)

    profile "authors-code" (multiparam.py): the warm-up runs the OLS mechanism and estimator (noise std
    6 sqrt(2 ln(2.5/delta))/eps on M and u, shift c~ sqrt(t)) for the pulled arm, so SGD starts from the warm-up OLS
    estimates (arms start at random unit vectors); after it each user sends ONE l2-ball message (eps, radius 1: the
    code's hemisphere rule) of the whole (K d) gradient, whose B is the code's, computed for dimension d instead of
    K d (the released gradient is shrunk by B_d / B_Kd, 0.57 at d = 20, K = 3); step 5 K/(t+1) with t the 0-based
    user index; weight decay theta <- theta - eta (Z + 0.05 theta); no projection; plus the _MultiBase choices
    (unclipped N(0, I_d) contexts: claim void). Every user's row holds M, u and Z; each field's mechanism draws for
    every user (the batched code drew M and u for the warm-up users only and Z for the others: the same law, other
    draws), and `finish` zeroes the fields the public schedule does not send."""

    name = "ldp-sgd-multi"
    paper = f"{PAPER}, Algorithm 2 with the SGD mechanism"
    privacy_model = "ldp"
    options = {"s0": S0, "h": H, "step": STEP, "step_offset": replace(STEP_OFFSET, default=0.0),
               "context_bound": CONTEXT_BOUND, "project": PROJECT}
    profile_defaults = {"authors-code": {"s0": "authors", "h": math.inf, "project": math.inf}}
    paper_setting = {"env_params": {"d": 20, "K": 3}, "users": 10**6, "eps": 1.0, "delta": 0.1, "params": {}}
    metric_names = ("clipped_context", "clipped_reward", "clipped")

    def _setup(self):
        self._setup_multi()
        self._set_step()
        self.project = self.params["project"]
        self.decay = 0.0
        self.predict_clip = math.inf
        self.b_scale = 1.0
        self.c_shift = 0.0
        if self.authors:
            self._setup_authors()
            return
        self.state_keys = ("theta", "n", "theta_warm")
        self.grad_radius = 2.0 * self.c_r * self.C_B
        self.mech = L2BallMechanism(self.grad_radius, self.eps / 2, self.d)
        self.mechanisms = {"Z": self.mech}

    def _setup_authors(self):
        self.state_keys = ("theta", "V", "U", "n", "theta_warm")
        sigma = authors_sigma(self.eps, self.delta)
        sens_M, sens_u = self._ols_sensitivities()
        # a warm-up user sends one slot (the public arm's): its budget split between M and u
        self.mech_M, _ = authors_gaussian(SymmetricGaussianMechanism, sigma, sens_M, self.eps / 2, self.delta / 2)
        self.mech_u, _ = authors_gaussian(GaussianMechanism, sigma, sens_u, self.eps / 2, self.delta / 2)
        self.c_shift = 2.0 * sigma * (4.0 * math.sqrt(self.d) + 2.0 * math.log(2.0 * self.T / 0.1))  # alpha = 0.1
        self.grad_radius = 1.0
        self.predict_clip = 20.0                     # |x^T theta| cap inside mu (the code's)
        self.mech = L2BallMechanism(self.grad_radius, self.eps, self.K * self.d)
        self.b_scale = l2_ball_gamma_ratio(self.d) / l2_ball_gamma_ratio(self.K * self.d)
        self.decay = 0.05
        self.mechanisms = {"M": self.mech_M, "u": self.mech_u, "Z": self.mech}

    def initial_state(self, rng):
        K, d = self.K, self.d
        if self.authors:
            theta = np.stack([_unit_vector(rng, d) for _ in range(K)])
            return {"theta": theta, "V": np.zeros((K, d, d)), "U": np.zeros((K, d)), "n": np.zeros(K),
                    **self._initial_theta_state(theta)}
        return {"theta": np.zeros((K, d)), "n": np.zeros(K), **self._initial_theta_state(np.zeros((K, d)))}

    def fields(self):
        fields = super().fields()                        # Z per arm slot, n
        if not self.authors:
            return fields
        # authors-code: the warm-up OLS message in the public arm's slot, of unclipped inputs: nothing bounds what
        # is privatized, so M and u have no domain (data_bound None: make_domain raises NotImplementedError). The
        # ledger voids the claim, so the contract asks for none; a server shard that checks domains cannot be built.
        K, d, schedule = self.K, self.d, self.slot_schedule
        return {"M": Field((K, d, d), mechanism=self.mechanisms["M"], schedule=schedule),
                "u": Field((K, d), mechanism=self.mechanisms["u"], schedule=schedule), **fields}

    def steps(self):
        if self.authors:
            return Steps(_multi_act, _sgd_authors_prepare, _sgd_authors_weigh, _sgd_authors_update,
                         _sgd_authors_finish)
        return Steps(_multi_act, _sgd_multi_prepare, _sgd_multi_weigh, _sgd_multi_update, _sgd_multi_finish)

    def consts(self):
        return (*self.multi_consts(), link_code(self.link), float(self.grad_radius), float(self.step),
                float(self.step_offset), bool(self.authors), float(self.predict_clip), float(self.b_scale),
                float(self.decay), float(self.c_shift))

    def aggregate_bounds(self, users):
        # sum_i eta_i Z_i with public eta_i > 0 and ||Z_i|| = B per sent slot row: norm <= sum_i eta_i B; the
        # sums of the weights are read off `aggregate` itself (rows of ones in the sent slots)
        spec, users, domains = self.message_spec(), np.asarray(users), self.cached_domains()
        sent = np.asarray(domains["Z"].slots(users), dtype=float)
        ones = {"Z": np.repeat(sent[..., None], self.d, axis=-1), "n": sent}
        eta_sums = np.asarray(self.aggregate(ones, users)["Z"])[:, 0]
        return {"Z": weighted_sphere_bounds(eta_sums, self.mech.output_radius, int(np.prod(spec["Z"])), self.d),
                "n": domains["n"].sum_bounds(users)}
