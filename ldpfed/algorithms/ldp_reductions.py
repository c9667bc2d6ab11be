"""Seed 002 (Zheng, Cai, Huang, Li, Wang, NeurIPS 2020): LDP black-box reductions for context-free bandits.

* Algorithm 1 (one-point reduction): the user adds N(0, sigma^2), sigma = 2B sqrt(2 ln(1.25/delta))/eps, to its
  bounded loss (|f| <= B, so the range, hence the L2 sensitivity, is 2B) and any non-private algorithm runs on
  the noisy values. Instantiated here with
    - a UCB black box on K arms (`ldp-mab-ucb`, non-private `ucb`),
    - the Tsallis-INF black box of Zimmert & Seldin (the paper's reference [44], Appendix B.1)
      (`ldp-mab-adversarial`, non-private `tsallis-inf`),
    - one-point bandit convex optimization, Flaxman-Kalai-McMahan gradient descent without a gradient with the
      sphere-sampling estimate (d/rho) f(x) u (`ldp-bco-one-point`, non-private `bco-one-point`).
* Algorithm 2 (two-point BCO): the user sends f(x1) - f(x2) + n^T (x1 - x2), n ~ N(0, sigma^2 I_d),
  sigma = 2G sqrt(2 ln(1.25/delta))/eps, to the two-point algorithm of Agarwal, Dekel and Xiao 2010 (the paper's
  Algorithm 4) with rho = log T / T, xi = rho/r and the step of Theorem 6: eta = 1/sqrt(T) for convex losses,
  eta_t = 1/(mu t) for mu-strongly convex ones (`ldp-bco-two-point`, non-private `bco-two-point`).

Privacy: every user sends ONE privatized scalar (the noisy reward, loss or loss difference) at the full
(eps, delta); the other message fields (the arm, the sampling direction u) are chosen by the algorithm from public
state and the user's own randomness, independently of the user's data, so they are public (`public_fields`).
Non-private baselines are subclasses with `private = False` (no noise, privacy model "none").

Rounds: with B users per round every user of the round sees the same published state; the server folds the
round's summed messages in one step (for gradient methods: one step with the summed gradient estimates,
followed by one projection; with B = 1 this is exactly the paper's sequential algorithm).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from ldpfed.algorithms.base import Algorithm
from ldpfed.algorithms.compiled import CompiledAlgorithm, Steps, no_weights
from ldpfed.algorithms.fields import Field
from ldpfed.algorithms.options import CALIBRATION, Option
from ldpfed.envs.base import unit_sphere
from ldpfed.mechanisms import Domain, GaussianMechanism, SumBounds, gaussian_tail_z
from ldpfed.mechanisms.clip import clip_value
from ldpfed.util.errors import ConfigError

MAB_ENVS = ("bernoulli", "piecewise-bernoulli")


# ---- options (ldpfed.algorithms.options) --------------------------------------------------------------------
ETA_SCALE = Option(1.0, low=0, low_open=True, doc="multiplies the learning rate / step of the black box (1: the "
                                                   "value in the class doc)")
RHO_SCALE = Option(1.0, low=0, low_open=True, doc="multiplies the sampling radius rho (1: the value in the class "
                                                   "doc); rho must stay below the inner radius r of the domain")
START = Option("boundary", kind="choice", choices=("boundary", "centre"),
               doc="start point y_1: 'boundary' = (1 - xi) R e_1, a fixed point on the edge; 'centre' = 0 (Agarwal "
                   "et al.'s and FKM's choice)")


class _OnePointScalar(Algorithm):
    """Shared by the reductions whose user privatizes one bounded scalar with the Gaussian mechanism of
    Algorithm 1 (L2 sensitivity 2B, B the public bound of the scalar, the whole (eps, delta) on it)."""

    privacy_model = "ldp"
    private = True
    private_field = "reward"

    def _build_mechanism(self, bound: float) -> float:
        """Register the mechanism of the private field; return its noise std (0 when not private)."""
        calibration = self.params["calibration"]
        if not self.private:
            return 0.0
        mech = GaussianMechanism(2.0 * bound, self.eps, self.delta, calibration=calibration)
        self.mechanisms[self.private_field] = mech
        return mech.sigma

    def _scalar_domain(self, bound: float) -> Domain:
        """The private scalar: the mechanism's output domain for data in [-bound, bound] (raw when not private)."""
        if self.private:
            return self.mechanisms[self.private_field].output_domain((), bound)
        return Domain((), low=-bound, high=bound, source="raw, public bound")


def published_arm(model) -> int:
    """The arm the server published for a round (ldp-mab-ucb's model): what its users t >= K pull."""
    return int(np.asarray(model["arm"]).reshape(-1)[0])


# ==== multi-armed bandits ==========================================================================
class _OnePointMab(_OnePointScalar, CompiledAlgorithm):
    """Multi-armed bandit message: the public arm and the privatized reward; the server keeps per-arm sums.

    Written once (ldpfed.algorithms.compiled): each class's act chooses the arm; prepare writes the arm (public) and
    the reward clipped to c_r; fold adds the privatized row to the pulled arm's count and reward sum (post-processing
    with the public arm: the aggregate's fields are `count` and `reward`, (K,) each); each class's update."""

    scheduled_arm = False     # arms on the public schedule (user t < K pulls t, then the published arm)?
    metric_names = ("clipped",)

    def fields(self):
        # the arm: public (chosen from the published model and the user's own coins, never from its reward); the
        # reward: the Gaussian mechanism's output for data in [-c_r, c_r] (raw, to a trusted server, when not private)
        arm = Domain((), low=0, high=self.K - 1, integral=True, scheduled=self.K if self.scheduled_arm else None,
                     published=published_arm if self.scheduled_arm else None, source="public arm")
        reward = (Field((), mechanism=self.mechanisms[self.private_field], data_bound=self.c_r) if self.private else
                  Field((), domain=self._scalar_domain(self.c_r), raw=True))
        return {"arm": Field((), domain=arm), "reward": reward}

    def sum_fields(self):
        return {"count": (self.K,), "reward": (self.K,)}

    def central_sources(self):
        # fold adds a user's reward (weight 1) to one arm's entry of the aggregate reward; the count is public
        return {"reward": "reward"}

    def central_touched(self, sums, start, stop):
        # the public per-arm counts: an arm nobody pulled this round holds no one's reward
        return {"reward": (np.asarray(sums.get("count", np.zeros(self.K))) > 0).astype(float)}

    def aggregate_bounds(self, users):
        n, K = len(users), self.K
        reward = self.cached_domains()["reward"].sum_bounds(users)     # a bound for one arm holding all n
        scheduled = None
        if self.scheduled_arm:
            users = np.asarray(users)
            scheduled = (np.bincount(users[users < K], minlength=K).astype(float), float(np.sum(users >= K)))
        return {"count": SumBounds(np.zeros(K), np.full(K, float(n)), integral=True, total=float(n),
                                   scheduled=scheduled, published=published_arm if self.scheduled_arm else None),
                "reward": SumBounds(np.full(K, reward.low[0]), np.full(K, reward.high[0]))}


class LdpMabUcb(_OnePointMab):
    """Algorithm 1 with a UCB black box (stochastic K-armed bandit).

    The server's UCB chooses the arm (public); the user pulls it and sends reward + N(0, sigma^2),
    sigma = 2 c_r sqrt(2 ln(1.25/delta))/eps (c_r = env.reward_bound, the public reward bound, so the whole
    (eps, delta) goes to the one noisy reward). A noisy reward is sub-Gaussian with variance proxy
    s^2 = c_r^2 + sigma^2 (bounded part + Gaussian part), and the index is the asymptotically optimal UCB of
    Lattimore & Szepesvari (Bandit Algorithms, Alg. 6) for s-sub-Gaussian rewards:
        mean_a + sqrt(2 s^2 log f(t) / n_a),  f(t) = 1 + t log^2 t,  t = index of the next user (1-based).
    (The choice of UCB variant is ours: the paper only asks for a UCB-type black box.)
    The first K users pull arms 0..K-1 once (user t pulls arm t).
    State: per-arm pulls `count` and noisy reward sums `reward`, `t` (users folded in) and the published `arm`
    ((1,) int64 arrays).
    """

    name = "ldp-mab-ucb"
    paper = "seed 002 Zheng et al. 2020, Algorithm 1 (one-point LDP reduction) with a UCB black box"
    env_kinds = MAB_ENVS
    default_env = "bernoulli"
    options = {"calibration": CALIBRATION}
    scheduled_arm = True
    state_keys = ("count", "reward", "t", "arm")
    model_keys = ("arm",)
    # The paper has no MAB experiment; a reconstruction: 10 Bernoulli arms, T = 1e5, eps = 1, delta = 0.01.
    paper_setting = {"env_params": {"K": 10}, "users": 10**5, "eps": 1.0, "delta": 0.01, "params": {}}

    def setup(self):
        self.c_r = float(self.world.reward_bound)
        self.sigma = self._build_mechanism(self.c_r)
        self.proxy = self.c_r ** 2 + self.sigma ** 2

    def initial_state(self, rng):
        return {"count": np.zeros(self.K), "reward": np.zeros(self.K), "t": np.zeros(1, dtype=np.int64),
                "arm": np.zeros(1, dtype=np.int64)}

    def steps(self):
        return Steps(_ucb_act, _mab_prepare, no_weights, _ucb_update, fold=_mab_fold)

    def consts(self):
        return (self.c_r, self.proxy, int(self.K))

    def estimate(self, state):
        return None


class Ucb(LdpMabUcb):
    """The non-private UCB black box of `ldp-mab-ucb` (no noise, variance proxy c_r^2)."""

    name = "ucb"
    paper = "seed 002 baseline: non-private UCB (Lattimore & Szepesvari Alg. 6)"
    privacy_model = "none"
    private = False


def tsallis_inf_weights(losses: np.ndarray, eta: float) -> np.ndarray:
    """1/2-Tsallis-INF weights (Zimmert & Seldin 2019) of the cumulative loss estimates: see `_tsallis_weights`."""
    p = np.empty(len(losses))
    _tsallis_weights(np.asarray(losses, dtype=float), float(eta), p)
    return p


class LdpMabAdversarial(_OnePointMab):
    """Algorithm 1 with the Tsallis-INF black box (alpha = 1/2, importance-weighted loss estimates), the
    algorithm of the paper's reference [44] that gives the best-of-both-worlds LDP MAB result of Appendix B.1.

    The server publishes the probabilities p_t; the user samples its arm from p_t with its own randomness (so
    the arm is independent of its data and public), pulls it and sends reward + N(0, sigma^2),
    sigma = 2 c_r sqrt(2 ln(1.25/delta))/eps. The server turns the noisy reward into the loss
    (c_r - r~)/(2 c_r) (losses in [0, 1] before noise, noise std sigma_l = sigma/(2 c_r)) and adds
    loss / p_{t,a} to the pulled arm's cumulative estimate (p_t is public: the probabilities it published).
    Learning rate: eta_t = 2 / sqrt(t) (Zimmert & Seldin, Thm 1) divided by C = sqrt(1 + sigma_l^2), the root
    second moment of a noisy loss (a reconstruction: the stability term of the FTRL analysis grows with
    E[loss^2] = 1 + sigma_l^2; C = 1 without noise); `eta_scale` multiplies it.
    State: the cumulative loss estimates `L`, the published `p` and `t` (users folded in, a (1,) int64 array).
    """

    late_messages = False   # the server divides each loss by the probability it published for the loss's round
    name = "ldp-mab-adversarial"
    paper = "seed 002 Zheng et al. 2020, Algorithm 1 with a Tsallis-INF black box (Appendix B.1)"
    env_kinds = MAB_ENVS
    default_env = "bernoulli"
    options = {"calibration": CALIBRATION,
               "eta_scale": Option(1.0, low=0, low_open=True,
                                   doc="multiplies the learning rate eta_t = 2 / (sqrt(t) sqrt(1 + sigma_l^2))")}
    state_keys = ("L", "p", "t")
    model_keys = ("p",)
    act_draws = 1                # the uniform that samples the arm from p
    # every user of a round draws its arm from the same published p with its own coins: one randomizer
    public_draws = frozenset({"arm"})
    # Reconstruction (no MAB experiment in the paper), as for ldp-mab-ucb.
    paper_setting = {"env_params": {"K": 10}, "users": 10**5, "eps": 1.0, "delta": 0.01, "params": {}}

    def setup(self):
        self.c_r = float(self.world.reward_bound)
        self.sigma = self._build_mechanism(self.c_r)
        sigma_loss = self.sigma / (2.0 * self.c_r)
        self.eta_scale = self.params["eta_scale"] / math.sqrt(1.0 + sigma_loss ** 2)

    def initial_state(self, rng):
        return {"L": np.zeros(self.K), "p": np.full(self.K, 1.0 / self.K), "t": np.zeros(1, dtype=np.int64)}

    def steps(self):
        return Steps(_sample_act, _mab_prepare, no_weights, _tsallis_update, fold=_mab_fold)

    def consts(self):
        return (self.c_r, self.eta_scale)

    def estimate(self, state):
        return None


class TsallisInf(LdpMabAdversarial):
    """The non-private Tsallis-INF black box of `ldp-mab-adversarial`."""

    name = "tsallis-inf"
    paper = "seed 002 baseline: non-private Tsallis-INF (Zimmert & Seldin 2019)"
    privacy_model = "none"
    private = False


# ---- the MAB steps, compiled (ldpfed.algorithms.compiled); consts: (c_r, proxy) for UCB, (c_r, eta_scale) for
# Tsallis-INF -----------------------------------------------------------------------------------------------------
@njit(cache=True)
def _mab_prepare(model, consts, contexts, actions, reward, user, i, inputs, counts):
    """Row: the pulled arm (public), then the reward clipped to c_r; counts (clipped,)."""
    inputs[i, 0] = actions[i]
    inputs[i, 1], counts[i, 0] = clip_value(reward, consts[0])


@njit(cache=True)
def _mab_fold(consts, user, row, out):
    """The privatized row (arm a, reward r~) into the aggregate: count[a] += 1, reward[a] += r~ (out = count, then
    reward)."""
    K = out.shape[0] // 2
    a = int(row[0])
    out[a] += 1.0
    out[K + a] += row[1]


@njit(cache=True)
def _ucb_act(model, consts, contexts, i, user, draws, actions):
    """User t < K pulls arm t (the public schedule), later users the published arm."""
    actions[i] = user if user < consts[2] else model[0][0]


@njit(cache=True)
def _ucb_update(state, consts, sums, start, stop, server):
    """Per-arm sums, then the published arm: argmax of mean_a + sqrt(2 s^2 log f(t) / n_a), t = stop + 1 (an arm
    never pulled first)."""
    count, total, t, arm = state
    proxy = consts[1]
    K = count.shape[0]
    for k in range(K):
        count[k] = count[k] + sums[k]
        total[k] = total[k] + sums[K + k]
    n = stop + 1
    log_f = math.log(1.0 + n * math.log(n) ** 2)
    best, chosen = -np.inf, 0
    for k in range(K):
        if count[k] == 0.0:
            index = np.inf
        else:
            pulled = max(count[k], 1.0)
            index = total[k] / pulled + np.sqrt((2.0 * proxy * log_f) / pulled)
        if index > best or k == 0:
            best, chosen = index, k
    t[0] = stop
    arm[0] = chosen


@njit(cache=True)
def _sample_act(model, consts, contexts, i, user, draws, actions):
    """The arm sampled from the published p with the user's uniform: the first arm whose cumulative probability
    exceeds u * (sum of p) (np.searchsorted(cumsum(p), u * cdf[-1], side="right"), at most K - 1)."""
    p = model[0]
    K = p.shape[0]
    total = 0.0
    for k in range(K):
        total += p[k]
    x = draws[i, 0] * total
    cdf, chosen = 0.0, K - 1
    for k in range(K):
        cdf += p[k]
        if cdf > x:
            chosen = k
            break
    actions[i] = chosen


@njit(cache=True)
def _tsallis_update(state, consts, sums, start, stop, server):
    """L_a += (the round's loss sum of arm a) / p_a with losses (c_r - r~) / (2 c_r); then p = the Tsallis-INF
    weights of L at eta_t = 2 eta_scale / sqrt(t), t = stop + 1."""
    L, p, t = state
    c_r, eta_scale = consts[0], consts[1]
    K = L.shape[0]
    for k in range(K):
        loss = (c_r * sums[k] - sums[K + k]) / (2.0 * c_r)
        L[k] = L[k] + loss / p[k]
    _tsallis_weights(L, 2.0 * eta_scale / math.sqrt(stop + 1), p)
    t[0] = stop


@njit(cache=True)
def _tsallis_weights(losses, eta, out):
    """out = the 1/2-Tsallis-INF weights (Zimmert & Seldin 2019): w_i = 4 / (eta (L_i - x))^2 with x < min L solving
    sum w = 1. sum w(x) is convex and increasing on (-inf, min L); Newton from x0 = min L - 2/eta (where the leader
    alone has weight 1, so sum w >= 1) decreases monotonically to the root. (Sums as numpy's: _pairwise_sum.)"""
    K = losses.shape[0]
    ratio = np.empty(K)
    x = losses.min() - 2.0 / eta
    for _ in range(50):
        for k in range(K):
            gap = losses[k] - x
            z = eta * gap
            out[k] = 4.0 / (z * z)
            ratio[k] = out[k] / gap
        total = _pairwise_sum(out, 0, K)
        x -= (total - 1.0) / (2.0 * _pairwise_sum(ratio, 0, K))
        if total - 1.0 < 1e-12:
            break
    for k in range(K):
        z = eta * (losses[k] - x)
        out[k] = 4.0 / (z * z)
    total = _pairwise_sum(out, 0, K)
    for k in range(K):
        out[k] = out[k] / total


@njit(cache=True)
def _pairwise_sum(a, lo, n):
    """a[lo:lo + n].sum() in numpy's order, so the compiled weights are those of the numpy formula bit for bit:
    numpy's pairwise summation (_block_sum up to 128 entries; beyond, the sum of the two halves, the first a
    multiple of 8 entries long), its recursion unrolled on a stack (numba's cache does not take recursive
    functions)."""
    if n <= 128:
        return _block_sum(a, lo, n)
    los, ns, stage = np.empty(128, np.int64), np.empty(128, np.int64), np.zeros(128, np.int64)
    values = np.empty(128)
    top, held = 0, 0
    los[0], ns[0] = lo, n
    while top >= 0:
        start, size = los[top], ns[top]
        if size <= 128:
            values[held] = _block_sum(a, start, size)
            held += 1
            top -= 1
            continue
        half = size // 2
        half -= half % 8
        if stage[top] < 2:          # push the first half, then the second
            first = stage[top] == 0
            stage[top] += 1
            top += 1
            los[top], ns[top], stage[top] = (start, half, 0) if first else (start + half, size - half, 0)
        else:                       # both halves summed: their sum replaces them
            held -= 1
            values[held - 1] = values[held - 1] + values[held]
            top -= 1
    return values[0]


@njit(cache=True)
def _block_sum(a, lo, n):
    """numpy's pairwise_sum on at most 128 entries: a plain loop below 8, else 8 accumulators."""
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = 8
    while i < n - n % 8:
        r0 += a[lo + i]
        r1 += a[lo + i + 1]
        r2 += a[lo + i + 2]
        r3 += a[lo + i + 3]
        r4 += a[lo + i + 4]
        r5 += a[lo + i + 5]
        r6 += a[lo + i + 6]
        r7 += a[lo + i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[lo + i]
        i += 1
    return res


# ==== bandit convex optimization ====================================================================
class _BallBco(_OnePointScalar, CompiledAlgorithm):
    """Projected gradient descent on a ball domain (env "convex", X = R * unit ball, r = R) from sphere-sampled
    gradient estimates. State: the centre y. Messages: the public direction u and one private scalar; the
    aggregate is sum_i eta_i * scalar_i * u_i (post-processing with public vectors and the public step eta_i of
    user i, so a round of B users is B stale-gradient steps, and B = 1 is the sequential algorithm exactly).

    Written once (ldpfed.algorithms.compiled): act plays the published y moved by rho along the user's direction
    (draw_act: uniform on the sphere, the user's own coins), prepare writes the direction and the clipped scalar,
    weigh turns a row into eta_t * scalar * u in the u slot (the scalar slot is folded into it and set to 0), so
    the aggregate's "u" is the gradient sum and update takes one projected step with it.

    Start point (`start`; the paper leaves x_1 to the black box): "boundary" (default) y_1 = (1 - xi) R e_1, a
    fixed public point on the edge of the domain. x*'s direction is uniform, so E||y_1 - x*||^2 = R^2 + ||x*||^2,
    more than a uniform random point's R^2 d/(d+2) + ||x*||^2: an algorithm that does not learn does worse
    than uniform play. "centre" (y_1 = 0, Agarwal et al.'s and FKM's choice) sits at distance ||x*|| = R/2 of
    x* on the default env, so standing still already scores a third of uniform play's regret there.
    """

    public_draws = frozenset({"u"})   # every user draws its direction uniformly with its own coins: one randomizer

    env_kinds = ("convex",)
    default_env = "convex"
    state_keys = ("y",)
    model_keys = ("y",)
    metric_names = ("clipped",)
    points = 1                   # points a user plays: 1 (actions (d,)) or 2 (actions (2, d))

    def _domain(self):
        world = self.world
        self.R, self.r = float(world.radius), float(world.inner_radius)
        self.value_bound, self.G = float(world.reward_bound), float(world.lipschitz)

    def _set_steps(self, eta: float, rho: float):
        if not 0 < rho < self.r:
            raise ConfigError("params.rho_scale", self.params["rho_scale"],
                              f"gives rho = {rho:.4g}, which must be in (0, r = {self.r})")
        self.eta, self.rho = eta, rho
        self.xi = rho / self.r
        self.proj_radius = (1.0 - self.xi) * self.R           # y stays in (1 - xi) X, so y + rho u stays in X
        self.start = self.params["start"]
        self.act_draws = self.d                                # the user's direction u, drawn by draw_act
        self.action_shape = (self.d,) if self.points == 1 else (2, self.d)

    def initial_state(self, rng):
        y = np.zeros(self.d)
        if self.start == "boundary":
            y[0] = self.proj_radius
        return {"y": y}

    def step_sizes(self, users: np.ndarray) -> np.ndarray:
        """The step eta_t of each user t (public: it depends on the user's index only): the compiled rule."""
        consts = self.compiled_consts()
        return np.array([_bco_eta(consts, int(u)) for u in np.asarray(users)], dtype=float)

    def estimate(self, state):
        return state["y"]

    # ---- written once (ldpfed.algorithms.compiled) ---------------------------------------------------------------
    def steps(self):
        if self.points == 1:
            return Steps(_one_point_act, _one_point_prepare, _bco_weigh, _bco_update)
        return Steps(_two_point_act, _two_point_prepare, _bco_weigh, _bco_update)

    def consts(self):
        mu = getattr(self, "mu", None)
        # (gradient scale, projection radius, rho, scalar bound, eta, mu (0: constant steps), eta_scale)
        return (float(self.grad_scale), float(self.proj_radius), float(self.rho), float(self._scalar_bound()),
                float(self.eta), 0.0 if mu is None else float(mu), float(getattr(self, "eta_scale", 1.0)))

    def draw_act(self, n, rng):
        """Each user's direction u, uniform on the unit sphere (its own coins), (n, d)."""
        return unit_sphere(rng, n, self.d)

    def _scalar_bound(self) -> float:
        return self.diff_bound if self.private_field == "diff" else self.value_bound

    def fields(self):
        # u: public (drawn by the user's own coins, independently of its data); the scalar (loss or difference):
        # the Gaussian mechanism's output for data in [-bound, bound] (raw, to a trusted server, when not private)
        u = Domain((self.d,), low=-1.0, high=1.0, radius=1.0, source="public unit direction")
        bound = self._scalar_bound()
        scalar = (Field((), mechanism=self.mechanisms[self.private_field], data_bound=bound) if self.private else
                  Field((), domain=self._scalar_domain(bound), raw=True))
        return {"u": Field((self.d,), domain=u), self.private_field: scalar}

    def aggregate_bounds(self, users):
        # "u" holds sum_i eta_i s_i u_i: ||.|| <= sum_i eta_i |s_i| <= (sum_i eta_i) (bound + z_n sigma): every
        # honest |s_i| is within bound + z_n sigma, z_n = the tail over the n users (union bound), except w.p. 1e-13;
        # the scalar slot is folded into it (0)
        n = len(users)
        sigma = self.mechanisms[self.private_field].sigma if self.private else 0.0
        eta_sum = float(np.sum(self.step_sizes(users)))
        cap = eta_sum * (self._scalar_bound() + gaussian_tail_z(n) * sigma) * (1 + 1e-9)
        return {"u": SumBounds(np.full(self.d, -cap), np.full(self.d, cap), groups=np.zeros(self.d, dtype=np.int64),
                               group_max=np.array([cap])),
                self.private_field: SumBounds(np.zeros(1), np.zeros(1))}


class LdpBcoOnePoint(_BallBco):
    """Algorithm 1 with one-point BCO: FKM (Flaxman, Kalai, McMahan 2005), the black box of the paper's
    convex case [16].

    User t plays x_t = y_t + rho u_t (u_t uniform on the sphere, drawn by the user, public), suffers f_t(x_t)
    and sends f_t(x_t) + Z_t, Z_t ~ N(0, sigma^2), sigma = 2B sqrt(2 ln(1.25/delta))/eps. Server:
    y_{t+1} = Proj_{(1-xi) X}(y_t - eta (d/rho) (f_t(x_t) + Z_t) u_t).
    Parameters: FKM Theorem 3.3 (Lipschitz case) with the loss bound C replaced by the root second moment of
    the noisy loss C = sqrt(B^2 + sigma^2) (the quantity the gradient-descent analysis needs,
    E||g||^2 <= (d/rho)^2 C^2): nu = R/(C sqrt T), rho = T^{-1/4} sqrt(R d C r / (3 (G r + C))), xi = rho/r,
    and FKM's step nu on f u is the step eta = nu rho / d on the estimate (d/rho) f u. The paper leaves these
    to the black box; `eta_scale`, `rho_scale` multiply them (reconstruction).
    """

    name = "ldp-bco-one-point"
    paper = "seed 002 Zheng et al. 2020, Algorithm 1 with one-point BCO (FKM sphere-sampling estimator)"
    options = {"calibration": CALIBRATION, "eta_scale": ETA_SCALE, "rho_scale": RHO_SCALE, "start": START}
    private_field = "loss"
    # The paper has no BCO experiment; a reconstruction on the default "convex" env.
    paper_setting = {"env_params": {"d": 2}, "users": 10**5, "eps": 1.0, "delta": 0.01, "params": {}}

    def setup(self):
        self._domain()
        self.sigma = self._build_mechanism(self.value_bound)
        C = math.sqrt(self.value_bound ** 2 + self.sigma ** 2)
        T, d, R, r, G = self.T, self.d, self.R, self.r, self.G
        nu = R / (C * math.sqrt(T))
        rho = self.params["rho_scale"] * T ** -0.25 * math.sqrt(R * d * C * r / (3.0 * (G * r + C)))
        self._set_steps(self.params["eta_scale"] * nu * rho / d, rho)
        self.grad_scale = d / rho          # (d / rho) f u: the gradient estimate


class BcoOnePoint(LdpBcoOnePoint):
    """Non-private FKM (C = B)."""

    name = "bco-one-point"
    paper = "seed 002 baseline: non-private one-point BCO (Flaxman, Kalai, McMahan 2005)"
    privacy_model = "none"
    private = False


class LdpBcoTwoPoint(_BallBco):
    """Algorithm 2: two-point BCO with LDP (black box: Agarwal, Dekel, Xiao 2010, the paper's Algorithm 4).

    User t plays x_{t,1} = y_t + rho u_t and x_{t,2} = y_t - rho u_t (actions of shape (n, 2, d); the env's reward is
    the difference f_t(x_{t,1}) - f_t(x_{t,2}) of the two losses) and sends
    D_t = f_t(x_{t,1}) - f_t(x_{t,2}) + n_t^T (x_{t,1} - x_{t,2}), n_t ~ N(0, sigma^2 I_d),
    sigma = 2G sqrt(2 ln(1.25/delta))/eps. Since x_{t,1} - x_{t,2} = 2 rho u_t with ||u_t|| = 1, the noise
    n_t^T (x_{t,1} - x_{t,2}) is exactly N(0, (2 rho sigma)^2): it is drawn as the Gaussian mechanism on the
    difference, whose range is [-2 rho G, 2 rho G] (G-Lipschitz loss), i.e. L2 sensitivity 4 rho G, and
    whose noise std 4 rho G sqrt(2 ln(1.25/delta))/eps = 2 rho sigma. The client clips the difference to
    2 rho G (counted). Server: g_t = (d / (2 rho)) D_t u_t, y_{t+1} = Proj_{(1-xi) X}(y_t - eta g_t).
    Parameters: rho = log T / T, xi = rho/r (Algorithm 2), and the step of Theorem 6 (`step="paper"`, the
    default): eta_t = 1/(mu t) when the losses are mu-strongly convex with mu public (the "convex" env: f_t =
    s ||x - c_t||^2, mu = 2 s), eta = 1/sqrt(T) otherwise (Algorithm 2's line 2, the convex case).
    (Steps: eta_t = eta_scale / (mu t) with t = user index + 1, else the constant eta; `_bco_eta`.)
    `step="convex"` forces 1/sqrt(T). `eta_scale`, `rho_scale` multiply eta and rho (1 = the paper).
    The convex step eta = 1/sqrt(T) is not scale-free: the online-gradient-descent bound behind it,
    D^2/(2 eta) + eta T E||g||^2 / 2 with D = 2R the diameter of X and E||g_t||^2 <= d^2 (G^2 + sigma^2), is
    minimized by eta = D / (d sqrt(G^2 + sigma^2) sqrt(T)), which at eps = 1 is about 15 times smaller than
    1/sqrt(T) on the default "convex" env (G ~ 1, R = 1, d = 2): with the paper's step the private iterate is
    dominated by the noise for T up to about 1e6. `step="scaled"` uses that minimizer (times eta_scale;
    a reconstruction, not the paper's text, for the convex case).
    """

    name = "ldp-bco-two-point"
    paper = "seed 002 Zheng et al. 2020, Algorithm 2 (two-point feedback LDP BCO)"
    options = {"calibration": CALIBRATION, "eta_scale": ETA_SCALE, "rho_scale": RHO_SCALE,
               "step": Option("paper", kind="choice", choices=("paper", "convex", "scaled"),
                              doc="'paper': Theorem 6 (eta_t = 1/(mu t) for a public strong convexity mu, else "
                                  "1/sqrt(T)); 'convex': 1/sqrt(T); 'scaled': the OGD minimizer "
                                  "2R / (d sqrt(G^2 + sigma^2) sqrt(T)) (a reconstruction)"),
               "start": START}
    private_field = "diff"
    points = 2
    # Reconstruction (the paper has no BCO experiment).
    paper_setting = {"env_params": {"d": 2}, "users": 10**5, "eps": 1.0, "delta": 0.01, "params": {}}

    def setup(self):
        self._domain()
        T = self.T
        rho = self.params["rho_scale"] * math.log(max(T, 3)) / T
        step = self.params["step"]
        self.eta_scale = self.params["eta_scale"]
        self._set_steps(self.eta_scale / math.sqrt(T), rho)
        self.diff_bound = 2.0 * self.rho * self.G
        self.mech_sigma = self._build_mechanism(self.diff_bound)   # = 2 rho sigma
        self.sigma = self.mech_sigma / (2.0 * self.rho)              # the paper's sigma (0 when not private)
        mu = self.world.strong_convexity
        # Theorem 6's strongly convex case (eta_t = 1/(mu t)) when mu is public and positive.
        self.mu = float(mu) if step == "paper" and mu is not None and mu > 0 else None
        if step == "scaled":
            self.eta *= 2.0 * self.R / (self.d * math.sqrt(self.G ** 2 + self.sigma ** 2))
        self.grad_scale = self.d / (2.0 * self.rho)     # (d / (2 rho)) D u: the gradient estimate


class BcoTwoPoint(LdpBcoTwoPoint):
    """Non-private two-point BCO (Agarwal, Dekel, Xiao 2010) with the same eta, rho, xi."""

    name = "bco-two-point"
    paper = "seed 002 baseline: non-private two-point BCO (Agarwal, Dekel, Xiao 2010)"
    privacy_model = "none"
    private = False



# ---- the BCO steps, compiled (ldpfed.algorithms.compiled); consts: see _BallBco.consts ---------------------------
@njit(cache=True)
def _bco_eta(consts, user):
    """The step of user `user` (0-based): eta_scale / (mu (user + 1)) when mu > 0 (Theorem 6), else eta."""
    mu = consts[5]
    if mu > 0.0:
        return consts[6] / (mu * (user + 1.0))
    return consts[4]


@njit(cache=True)
def _one_point_act(model, consts, contexts, i, user, draws, actions):
    """x = y + rho u (u: the user's direction, draws[i])."""
    y, rho = model[0], consts[2]
    for j in range(y.shape[0]):
        actions[i, j] = y[j] + rho * draws[i, j]


@njit(cache=True)
def _two_point_act(model, consts, contexts, i, user, draws, actions):
    """x_1 = y + rho u, x_2 = y - rho u."""
    y, rho = model[0], consts[2]
    for j in range(y.shape[0]):
        offset = rho * draws[i, j]
        actions[i, 0, j] = y[j] + offset
        actions[i, 1, j] = y[j] - offset


@njit(cache=True)
def _unit_into(row, d):
    """row[:d] scaled to norm 1 (it is a nonzero multiple of the user's direction)."""
    sq = 0.0
    for j in range(d):
        sq += row[j] * row[j]
    norm = np.sqrt(sq)
    for j in range(d):
        row[j] = row[j] / norm


@njit(cache=True)
def _one_point_prepare(model, consts, contexts, actions, reward, user, i, inputs, counts):
    """Row: u = (x - y) / ||x - y|| (public), then the loss clipped to B; counts (clipped,)."""
    y, row = model[0], inputs[i]
    d = y.shape[0]
    for j in range(d):
        row[j] = actions[i, j] - y[j]
    _unit_into(row, d)
    row[d], counts[i, 0] = clip_value(reward, consts[3])


@njit(cache=True)
def _two_point_prepare(model, consts, contexts, actions, reward, user, i, inputs, counts):
    """Row: u = (x_1 - x_2) / ||x_1 - x_2|| (public), then the loss difference (the env's reward) clipped to
    2 rho G; counts (clipped,)."""
    row = inputs[i]
    d = actions.shape[2]
    for j in range(d):
        row[j] = actions[i, 0, j] - actions[i, 1, j]
    _unit_into(row, d)
    row[d], counts[i, 0] = clip_value(reward, consts[3])


@njit(cache=True)
def _bco_weigh(consts, user, row):
    """The privatized row (u, s) becomes (eta_t s u, 0): summed, the u slot is sum_t eta_t s_t u_t."""
    d = row.shape[0] - 1
    w = _bco_eta(consts, user) * row[d]
    for j in range(d):
        row[j] = w * row[j]
    row[d] = 0.0


@njit(cache=True)
def _bco_update(state, consts, sums, start, stop, server):
    """y <- Proj_{(1 - xi) X}(y - scale * sum_t eta_t s_t u_t), scale = d / rho (one point) or d / (2 rho)."""
    y = state[0]
    scale, radius = consts[0], consts[1]
    sq = 0.0
    for j in range(y.shape[0]):
        y[j] = y[j] - scale * sums[j]
        sq += y[j] * y[j]
    norm = np.sqrt(sq)
    if norm > radius:
        shrink = radius / norm
        for j in range(y.shape[0]):
            y[j] = y[j] * shrink
