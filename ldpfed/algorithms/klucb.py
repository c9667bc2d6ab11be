"""Seed 004: Gajane (AAAI 2023), "Local differential privacy for sequential decision making in a changing
environment": SW-KLUCB-CF (Algorithm 1) with the randomized-response corruption of Eq. (2).

Protocol (Bernoulli arms, envs "piecewise-bernoulli" and "bernoulli"):
  * The server publishes Index_a(t) for every arm; user t pulls argmax_a Index_a(t) (ties: the lowest arm), after
    the initialization "pull each arm once": users 0..K-1 pull arms 0..K-1. The pulled arm is chosen from public
    information only, so it is public (`pulls`, a one-hot vector).
  * The user reports its reward bit through randomized response (Eq. 2: keep the bit with probability
    e^eps/(1+e^eps)), the only private field (`feedback`: the one-hot vector of the pulled arm times the reported
    bit). The whole message is eps-LDP (pure; the run's delta is not used). The user writes its bit into the
    first slot of the feedback row (0 in the others, whatever its data); randomized response answers every slot
    (independently), and the user's post-processing (`finish`) sends the bit's report in the pulled arm's slot,
    0 in the others.
  * The server keeps, per arm, the number of pulls N_a(t, w) and the sum of the feedback bits over the last w
    users, and computes
        Index_a(t) = g^{-1}( max{ q in [0, 1] : N_a(t, w) kl(lambda_hat_a, q) <= f(min(t, w)) } ),
    lambda_hat_a the mean feedback in the window, kl the Bernoulli KL divergence, g(mu) = 1/(1+e^eps) +
    tanh(eps/2) mu the feedback mean of randomized response (g^{-1} is the mechanism's `debias`).
    An arm with no pull in the window has max{q} = 1, the largest possible index (so it is pulled next).
  * f(x) = log x + 3 log log x (Theorem 1). Guard (ours, the paper uses f only at large x): for x <= e,
    log log x <= 0, so we use f(x) = log x + 3 log(max(log x, 1)), which equals the paper's f for x >= e, is
    continuous, non-decreasing and >= 0 for x >= 1.
  * w = sqrt(4 e T / (L_T + 4)) (Theorem 1), rounded up to an integer. L_T (option "L_T") is the number of
    breakpoints in the paper's convention, where the first breakpoint is at t = 1 (so L_T is the number of
    stationary segments); its default is public: the world's number of segments (PublicWorld.segments; the
    change times stay hidden). The option "window" overrides w directly.
  * Option "window_rule": "paper" (default, Theorem 1's w) or "eps-aware": w_eps = w / tanh(eps/2), rounded up
    (at most T). Derivation: the sliding-window analysis balances the cost of forgetting, about L_T w (after each
    change up to w users still see the old segment's data), against the cost of learning inside each of the
    T / w windows, which grows as log(w) / kl(lambda_a, lambda_*) with the FEEDBACK gap. Randomized response maps a
    reward mean mu to g(mu) = 1/(1+e^eps) + tanh(eps/2) mu, so every feedback gap is tanh(eps/2) times the reward
    gap and kl shrinks by tanh(eps/2)^2 (kl(p, q) ~ 2 (p - q)^2 near the middle). The balance
    L_T w = (T / w) c / tanh(eps/2)^2 gives w proportional to sqrt(T / L_T) / tanh(eps/2): Theorem 1's window
    (whose constant assumes the reward gap) divided by tanh(eps/2). Non-private (g = identity): w_eps = w.
  * The index max{q} is solved by bisection (`klucb_upper`) on the bracket
    [lambda_hat, min(1, lambda_hat + sqrt(f / (2 N)))] (Pinsker: kl(p, q) >= 2 (q - p)^2).

Rounds: at B = 1 this is Algorithm 1 exactly (user t sees the window of the w users t-w..t-1). With B > 1 every
user of a round sees the same published index and the server's window is kept per round: it holds the rounds
that contain at least one of the last w users (so between w and w + B - 1 users; exactly w at B = 1). When B >= w
the window is just the last round.

Variants (subclasses, same code):
  * klucb-cf: no window (N_a and lambda_hat over all users, f(t)): kl-UCB-CF of the stationary corrupt bandits.
  * sw-klucb, klucb: the non-private baselines (randomized response off: the raw bit is sent, g = identity).

Written once (ldpfed.algorithms.compiled): act, prepare, finish and update below are the compiled functions every
engine runs (a round of users in a process or a Ray actor, and the sequential B = 1 loop). The state is arrays: the
window is a ring buffer of per-round sums (two K-vectors and a stop per round: ring_n, ring_s, ring_stop, with
head and size), and the published index is part of the state, refreshed by update. An arm's index is a function
of its (N, sum) and of f only, so update solves it again only for the arms whose (N, sum, f) changed (`solved`
keeps what each arm's index was solved at); once t >= w, f(min(t, w)) is constant.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit
from scipy.special import xlogy

from ldpfed.algorithms.compiled import CompiledAlgorithm, Steps, no_weights
from ldpfed.algorithms.fields import Field
from ldpfed.algorithms.options import Option
from ldpfed.mechanisms import Domain, RandomizedResponse
from ldpfed.util.memory import check_allocation

PAPER = "seed 004 Gajane 2023"


def kl_bernoulli(p, q):
    """KL divergence between Bernoulli(p) and Bernoulli(q) (0 log 0 = 0)."""
    p, q = np.asarray(p, dtype=float), np.asarray(q, dtype=float)
    with np.errstate(divide="ignore"):
        return xlogy(p, p) - xlogy(p, q) + xlogy(1 - p, 1 - p) - xlogy(1 - p, 1 - q)


@njit(cache=True)
def _exploration(x):
    if x <= 1:
        return 0.0
    lx = math.log(x)
    return lx + 3.0 * math.log(max(lx, 1.0))


def exploration(x: float) -> float:
    """f(x) = log x + 3 log log x, guarded as log x + 3 log(max(log x, 1)) (equal for x >= e); 0 for x <= 1."""
    return float(_exploration(float(x)))


# Bisection schedule: HALVINGS halvings of the bracket, in passes of k halvings each.
_PASSES = (7, 7, 7, 7, 6)
HALVINGS = sum(_PASSES)    # 34: the returned q is within 2^-34 = 5.8e-11 below the root
PASSES = np.array(_PASSES, dtype=np.int64)


@njit(cache=True)
def _xlogx(p):
    return 0.0 if p == 0.0 else p * math.log(p)


@njit(cache=True)
def klucb_upper_one(p, n, f, passes):
    """max{q in [p, 1] : n kl(p, q) <= f} for one arm, by bisection; n = 0 gives 1 (no constraint).

    The root lies in [p, min(1, p + sqrt(f / (2 n)))] (Pinsker). kl(p, .) increases on [p, 1], so the feasible
    points form the interval [p, root]: bisection keeps a feasible `lo`, halves the bracket HALVINGS times (the
    bracket is at most 1 wide, so it ends below 2^-34 = 5.8e-11) and returns `lo` (just below the root). A pass of
    k halvings (the schedule `passes`) moves `lo` to the last feasible one of the 2^k - 1 dyadic points of the
    bracket, found by binary search (the feasible points are a prefix); NaN (0 log 0 at a degenerate bracket) is
    infeasible. The result depends only on (p, n, f), bit for bit."""
    if n <= 0:
        return 1.0
    p = min(max(p, 0.0), 1.0)
    bound = f / n                         # kl(p, q) <= bound
    lo = p
    width = min(1.0, p + math.sqrt(0.5 * bound)) - lo
    q1 = 1.0 - p
    # kl(p, q) = [p log p + (1-p) log(1-p)] - [p log q + (1-p) log(1-q)] <= bound  <=>  v(q) >= thr
    thr = _xlogx(p) + _xlogx(q1) - bound
    for k in passes:
        width *= 0.5 ** k                 # exact (a power of two)
        first, last = 1, 2 ** k - 1       # the largest feasible j in [first, last], or 0
        found = 0
        while first <= last:
            j = (first + last) // 2
            grid = lo + width * j
            v = p * math.log(grid) + q1 * math.log1p(-grid)
            if v >= thr:
                found = j
                first = j + 1
            else:
                last = j - 1
        lo += found * width
    return lo


@njit(cache=True)
def _klucb_upper(p, n, f, passes, out):
    for i in range(out.shape[0]):
        out[i] = klucb_upper_one(p[i], n[i], f[i], passes)


def klucb_upper(p, n, f) -> np.ndarray:
    """max{q in [p, 1] : n kl(p, q) <= f}, element-wise (klucb_upper_one): p empirical means (clipped to [0, 1]),
    n counts (n = 0 gives 1: no constraint), f the threshold (scalar or array); broadcast together."""
    p, n, f = (np.asarray(x, dtype=float) for x in (p, n, f))
    shape = np.broadcast_shapes(p.shape, n.shape, f.shape)
    p, n, f = (np.ascontiguousarray(np.broadcast_to(x, shape)).ravel() for x in (p, n, f))
    out = np.empty(p.shape[0])
    _klucb_upper(p, n, f, PASSES, out)
    return out.reshape(shape)


def paper_window(T: int, L_T: int) -> int:
    """w = sqrt(4 e T / (L_T + 4)) of Theorem 1, rounded up."""
    return max(1, math.ceil(math.sqrt(4.0 * math.e * T / (L_T + 4))))


def eps_aware_window(T: int, L_T: int, gap_factor: float) -> int:
    """Theorem 1's window divided by the factor that shrinks every feedback gap (tanh(eps/2) under randomized
    response, 1 for the paper's window), rounded up, at most T."""
    return min(T, max(1, math.ceil(math.sqrt(4.0 * math.e * T / (L_T + 4)) / gap_factor)))


# ---- the algorithm, one user at a time, compiled (ldpfed.algorithms.compiled) ---------------------------------
# consts: (K, w (0: no window), capacity of the ring buffer, p_flip, tanh_half, PASSES); the non-private baselines
# have p_flip = 0, tanh_half = 1, so that g^{-1}(q) = (q - 0) / 1 = q exactly.
# model: (index,). state: (t, n, s, index, solved[, ring_n, ring_s, ring_stop, head, size]).

@njit(cache=True)
def klucb_act(model, consts, contexts, i, user, draws, actions):
    """User `user` < K pulls arm `user` (initialization, a public schedule); the others the argmax of the published
    index (ties: the lowest arm)."""
    K = consts[0]
    if user < K:
        actions[i] = user
        return
    index = model[0]
    arm, best = 0, index[0]
    for k in range(1, index.shape[0]):
        if best != best:                  # np.argmax: the first NaN wins
            break
        if index[k] > best or index[k] != index[k]:
            arm, best = k, index[k]
    actions[i] = arm


def published_arm(model) -> int:
    """The arm the users t >= K of a round pull: the argmax of the published index, as klucb_act takes it."""
    return int(np.argmax(model["index"]))


@njit(cache=True)
def klucb_prepare(model, consts, contexts, actions, reward, user, i, inputs, counts):
    """Row: `pulls` (K: the pulled arm, one-hot, public), then `feedback` (K: the reward bit in the first slot, 0 in
    the others whatever the data; randomized response privatizes it after this, and `klucb_finish` moves the report
    to the pulled arm's slot). The mechanism is calibrated for a bit, so the reward is made a bit here, before it is
    privatized: values other than 0 and 1 (none on the Bernoulli envs) are rounded to the nearest bit and counted
    (`clipped`)."""
    K = consts[0]
    row = inputs[i]
    row[actions[i]] = 1.0
    row[K] = 1.0 if reward > 0.5 else 0.0
    counts[i, 0] = 0 if (reward == 0.0 or reward == 1.0) else 1


@njit(cache=True)
def klucb_finish(consts, user, row):
    """The user's post-processing of its privatized row: the report (first slot of `feedback`) is sent in the pulled
    arm's slot, the other slots 0 (randomized response also answered for them; their input was 0 whatever the
    user's data): feedback = pulls * report."""
    K = consts[0]
    report = row[K]
    for k in range(K):
        row[K + k] = row[k] * report


@njit(cache=True)
def _refresh_index(t, n, s, index, solved, consts):
    """Index_a(t) = g^{-1}(max{q : N_a kl(lambda_hat_a, q) <= f}) for every arm whose (N, sum, f) changed since its
    index was last solved (solved: rows N, sum, f; N < 0: never solved), f = f(min(t, w)) (f(t) without a window)."""
    K, w, p_flip, tanh_half, passes = consts[0], consts[1], consts[3], consts[4], consts[5]
    f = _exploration(float(t if w == 0 else min(t, w)))
    for k in range(K):
        if solved[0, k] < 0 or n[k] != solved[0, k] or s[k] != solved[1, k] or f != solved[2, k]:
            p = s[k] / max(n[k], 1.0) if n[k] > 0 else 0.0
            index[k] = (klucb_upper_one(p, n[k], f, passes) - p_flip) / tanh_half
            solved[0, k], solved[1, k], solved[2, k] = n[k], s[k], f


@njit(cache=True)
def klucb_update(state, consts, sums, start, stop, server):
    """Fold the summed rows of users [start, stop) (pulls, then feedback) into all-time counts; refresh the index."""
    t, n, s, index, solved = state
    K = consts[0]
    for k in range(K):
        n[k] += sums[k]
        s[k] += sums[K + k]
    t[0] = stop
    _refresh_index(stop, n, s, index, solved, consts)


@njit(cache=True)
def sw_klucb_update(state, consts, sums, start, stop, server):
    """Fold the summed rows of users [start, stop) into the window: push the round's sums into the ring buffer, drop
    the rounds that hold none of the last w users; refresh the index."""
    t, n, s, index, solved, ring_n, ring_s, ring_stop, head, size = state
    K, w, cap = consts[0], consts[1], consts[2]
    if size[0] == cap:
        raise RuntimeError("sw-klucb-cf: window ring buffer overflow")
    slot = (head[0] + size[0]) % cap
    for k in range(K):
        n[k] += sums[k]
        s[k] += sums[K + k]
        ring_n[slot, k] = sums[k]
        ring_s[slot, k] = sums[K + k]
    ring_stop[slot] = stop
    size[0] += 1
    oldest = stop - w
    while size[0] > 0 and ring_stop[head[0]] <= oldest:
        h = head[0]
        for k in range(K):
            n[k] -= ring_n[h, k]
            s[k] -= ring_s[h, k]
        head[0] = (h + 1) % cap
        size[0] -= 1
    t[0] = stop
    _refresh_index(stop, n, s, index, solved, consts)


class ReportRandomizedResponse(RandomizedResponse):
    """Randomized response on the `feedback` row, whose first slot holds the user's bit (0 in the others, whatever
    the data; klucb_finish then sends the report in the pulled arm's slot). The same mechanism: one independent
    uniform per slot; only their order differs: every user's first-slot uniforms come first, as
    RandomizedResponse.privatize draws them for one bit per user, then the other slots'."""

    def draw_rows(self, rng, n, shape):
        n, size = int(n), int(np.prod(shape, dtype=np.int64))
        first = rng.random((n, 1))
        return np.concatenate([first, rng.random((n, size - 1))], axis=1) if size > 1 else first


class SWKLUCBCF(CompiledAlgorithm):
    """SW-KLUCB-CF (see the module docstring). Privacy: the whole eps goes to the randomized response of the
    reward bit (pure eps-LDP; delta unused); the pulled arm is a function of the published index: public."""
    name = "sw-klucb-cf"
    paper = f"{PAPER}, Algorithm 1 (SW-KLUCB-CF) with randomized response (Eq. 2)"
    privacy_model = "ldp"
    env_kinds = ("piecewise-bernoulli", "bernoulli")
    default_env = "piecewise-bernoulli"
    options = {
        "L_T": Option(None, kind="int", low=1, allow=(None,),
                      doc="the paper's number of breakpoints L_T (counting t = 1: the number of stationary segments); "
                          "None: the env's public number of segments"),
        "window": Option(None, kind="int", low=1, allow=(None,),
                         doc="the window w in users; None: the window rule's"),
        "window_rule": Option("paper", kind="choice", choices=("paper", "eps-aware"),
                              doc="'paper': w = sqrt(4 e T / (L_T + 4)) (Theorem 1); 'eps-aware': that divided by "
                                  "tanh(eps/2), the factor randomized response shrinks every feedback gap by (at most "
                                  "T)"),
    }
    # The paper has no experiments; a reconstruction: T = 1e5..1e6, K = 5, L_T = 4, eps in {0.5, 1, 2}.
    # delta is not used (pure eps-LDP); RunConfig needs one.
    paper_setting = {"env_params": {"K": 5, "breakpoints": 4}, "users": 10**5, "eps": 1.0, "delta": 0.01,
                     "params": {}}
    private = True
    windowed = True

    # ---- the compiled functions' world (module functions above) --------------------------------------------
    model_keys = ("index",)
    metric_names = ("clipped",)
    WINDOW_KEYS = ("ring_n", "ring_s", "ring_stop", "head", "size")

    def setup(self):
        if self.windowed:
            L_T = self.params["L_T"]
            if L_T is None:
                L_T = self.world.segments or 1   # public: the number of stationary segments, not their times
            self.L_T = L_T
            window, rule = self.params["window"], self.params["window_rule"]
            if window is None:
                gap_factor = math.tanh(self.eps / 2.0) if (self.private and rule == "eps-aware") else 1.0
                window = eps_aware_window(self.T, L_T, gap_factor)
            self.w = window
        else:
            self.L_T, self.w = None, None
        B = int(self.config.round_size)
        # Rounds whose users overlap the last w users: stops in (t - w, t], spaced by B (the last round may be
        # shorter, hence + 2).
        self.capacity = (-(-self.w // B) + 2) if self.windowed else 0
        if self.windowed:   # the ring buffer: two K-vectors and a stop per round of the window
            field = "params.window" if self.params["window"] is not None else "users"
            check_allocation(field, self.params["window"] if field == "params.window" else self.T,
                             self.capacity * (2 * self.K + 1) * 8, f"a window of {self.w:,} users")
        self.rr = ReportRandomizedResponse(self.eps) if self.private else None
        self.state_keys = ("t", "n", "s", "index", "solved") + (self.WINDOW_KEYS if self.windowed else ())

    def steps(self):
        return Steps(klucb_act, klucb_prepare, no_weights, sw_klucb_update if self.windowed else klucb_update,
                     klucb_finish)

    def consts(self):
        p_flip, tanh_half = (self.rr.p_flip, self.rr.tanh_half) if self.private else (0.0, 1.0)
        return (int(self.K), int(self.w) if self.windowed else 0, int(self.capacity), float(p_flip), float(tanh_half),
                PASSES)

    # ---- server half -------------------------------------------------------------------------
    def initial_state(self, rng):
        K = self.K
        state = {"t": np.zeros(1, dtype=np.int64), "n": np.zeros(K), "s": np.zeros(K), "index": np.zeros(K),
                 "solved": np.full((3, K), -1.0)}
        if self.windowed:
            state.update(ring_n=np.zeros((self.capacity, K)), ring_s=np.zeros((self.capacity, K)),
                         ring_stop=np.zeros(self.capacity, dtype=np.int64), head=np.zeros(1, dtype=np.int64),
                         size=np.zeros(1, dtype=np.int64))
        # (consts() afresh, not the cached compiled_consts(): that builds the layout, whose mechanism parameters a
        # test may still change before the first message)
        _refresh_index(0, state["n"], state["s"], state["index"], state["solved"], self.consts())
        return state

    # Rounds of at most this share of the window keep the paper's behaviour (REPRODUCTION.md, price of batching)
    ROUND_SHARE_OF_WINDOW = 0.1

    def round_size_caveat(self) -> str | None:
        B = int(self.config.round_size)
        if not self.windowed or B <= self.ROUND_SHARE_OF_WINDOW * self.w:
            return None
        if B >= self.w:
            return (f"rounds of {B:,} users are no shorter than its window of {self.w:,} users, so the window holds "
                    f"only the last round: every arm that round did not play has the highest index, and its play "
                    f"hardly depends on the feedback (nor on eps); its paper's algorithm needs rounds of at most "
                    f"{max(1, int(self.ROUND_SHARE_OF_WINDOW * self.w)):,} users here (a tenth of the window)")
        return (f"rounds of {B:,} users are more than a tenth of its window of {self.w:,} users: every user of a "
                f"round sees an index up to {B:,} users old, and its regret grows with the round size "
                f"(REPRODUCTION.md, price of batching)")

    def threshold(self, t: int) -> float:
        """f(min(t, w)) (f(t) without a window)."""
        return exploration(min(t, self.w) if self.windowed else t)

    def index(self, state) -> np.ndarray:
        """Index_a(t) for every arm from the state's t, n and s (what update publishes), solved afresh."""
        K = self.K
        index, solved = np.zeros(K), np.full((3, K), -1.0)
        _refresh_index(int(np.reshape(state["t"], -1)[0]), np.asarray(state["n"], dtype=float),
                       np.asarray(state["s"], dtype=float), index, solved, self.consts())
        return index

    def central_touched(self, sums, start, stop):
        # the feedback of an arm nobody pulled (public one-hot pulls) is 0 for every user: nothing to hide there
        return {"pulls": np.ones(self.K), "feedback": (np.asarray(sums.get("pulls", np.zeros(self.K))) > 0) * 1.0}

    def fields(self):
        # pulls: one-hot of the scheduled arm (user t < K pulls t, the others the round's argmax of the index),
        # public; feedback: a bit in at most one slot (the pulled arm's), through randomized response (the
        # non-private baselines send it raw, to a server that is trusted)
        K = self.K
        pulls = Domain((K,), low=0.0, high=1.0, integral=True, one_hot=True, scheduled=K, published=published_arm,
                       source="public pulled arm")
        feedback = (Field((K,), mechanism=self.rr, schedule={"at_most_one": True}) if self.private else
                    Field((K,), domain=Domain((K,), low=0.0, high=1.0, integral=True, at_most_one=True,
                                              source="raw reward bit"), raw=True))
        return {"pulls": Field((K,), domain=pulls), "feedback": feedback}


class KLUCBCF(SWKLUCBCF):
    """kl-UCB-CF: SW-KLUCB-CF without the window (all users, f(t))."""
    name = "klucb-cf"
    paper = f"{PAPER}, baseline KLUCB-CF (Algorithm 1 without the sliding window)"
    options = {}
    windowed = False


class SWKLUCB(SWKLUCBCF):
    """Non-private SW-KLUCB: the raw reward bit is sent (randomized response off, g = identity)."""
    name = "sw-klucb"
    paper = f"{PAPER}, non-private baseline SW-KLUCB"
    privacy_model = "none"
    private = False


class KLUCB(KLUCBCF):
    """Non-private kl-UCB (no window, no randomized response)."""
    name = "klucb"
    paper = f"{PAPER}, non-private baseline kl-UCB"
    privacy_model = "none"
    private = False

