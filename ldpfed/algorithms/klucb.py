"""Seed 004: Gajane (AAAI 2023), "Local differential privacy for sequential decision making in a changing
environment": SW-KLUCB-CF (Algorithm 1) with the randomized-response corruption of Eq. (2).

Protocol (Bernoulli arms, envs "piecewise-bernoulli" and "bernoulli"):
  * The server publishes Index_a(t) for every arm; user t pulls argmax_a Index_a(t) (ties: the lowest arm), after
    the initialization "pull each arm once": users 0..K-1 pull arms 0..K-1. The pulled arm is chosen from public
    information only, so it is public (`pulls`, a one-hot vector).
  * The user reports its reward bit through randomized response (Eq. 2: keep the bit with probability
    e^eps/(1+e^eps)), the only private field (`feedback`: the one-hot vector of the pulled arm times the reported
    bit). The whole message is eps-LDP (pure; the run's delta is not used).
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
  * The index max{q} is solved by vectorized bisection over arms (`klucb_upper`) on the bracket
    [lambda_hat, min(1, lambda_hat + sqrt(f / (2 N)))] (Pinsker: kl(p, q) >= 2 (q - p)^2).

Rounds: at B = 1 this is Algorithm 1 exactly (user t sees the window of the w users t-w..t-1). With B > 1 every
user of a round sees the same published index and the server's window is kept per round: it holds the rounds
that contain at least one of the last w users (so between w and w + B - 1 users; exactly w at B = 1). When B >= w
the window is just the last round.

Variants (subclasses, same code):
  * klucb-cf: no window (N_a and lambda_hat over all users, f(t)): kl-UCB-CF of the stationary corrupt bandits.
  * sw-klucb, klucb: the non-private baselines (randomized response off: the raw bit is sent, g = identity).

Speed: the window is a ring buffer of per-round sums (two K-vectors per round), and once t >= w the threshold
f(min(t, w)) is constant, so the index of an arm is a function of its integer (N, sum) only and is memoized.
"""
from __future__ import annotations

import math

import numpy as np
from scipy.special import xlogy

from ldpfed.algorithms.base import Algorithm
from ldpfed.algorithms.fields import Field
from ldpfed.algorithms.options import Option
from ldpfed.mechanisms import Domain, RandomizedResponse
from ldpfed.memory import check_allocation

PAPER = "seed 004 Gajane 2023"
_CACHE_LIMIT = 1_000_000    # memoized (N, sum) pairs before the memo is cleared


def kl_bernoulli(p, q):
    """KL divergence between Bernoulli(p) and Bernoulli(q) (0 log 0 = 0)."""
    p, q = np.asarray(p, dtype=float), np.asarray(q, dtype=float)
    with np.errstate(divide="ignore"):
        return xlogy(p, p) - xlogy(p, q) + xlogy(1 - p, 1 - p) - xlogy(1 - p, 1 - q)


def exploration(x: float) -> float:
    """f(x) = log x + 3 log log x, guarded as log x + 3 log(max(log x, 1)) (equal for x >= e); 0 for x <= 1."""
    if x <= 1:
        return 0.0
    lx = math.log(x)
    return lx + 3.0 * math.log(max(lx, 1.0))


# Bisection schedule: HALVINGS halvings of the bracket, done `k` at a time by one numpy pass each.
_PASSES = (7, 7, 7, 7, 6)
HALVINGS = sum(_PASSES)    # 34: the returned q is within 2^-34 = 5.8e-11 below the root
_DYADIC = {k: np.arange(1, 2 ** k, dtype=float) for k in set(_PASSES)}


def klucb_upper(p, n, f) -> np.ndarray:
    """max{q in [p, 1] : n kl(p, q) <= f}, vectorized over arms, by bisection.

    p: empirical means in [0, 1]; n: counts (n = 0 gives 1: no constraint); f: the threshold (scalar or array).
    The root lies in [p, min(1, p + sqrt(f / (2 n)))] (Pinsker). kl(p, .) increases on [p, 1], so the feasible
    points form the interval [p, root]: bisection keeps a feasible `lo`, halves the bracket HALVINGS times (the
    bracket is at most 1 wide, so it ends below 2^-34 = 5.8e-11) and returns `lo` (just below the root).
    Vectorized over arms AND over several halvings at a time: one numpy pass tests the 2^k - 1 dyadic points of
    every arm's bracket and moves `lo` to the last feasible one, which is exactly where k successive halvings
    end (bisection's decisions are the feasibility of those dyadic points). The schedule of passes is fixed, so
    an arm's result depends only on its own (p, n, f), bit for bit, whichever arms are solved with it.
    """
    p = np.minimum(np.maximum(np.asarray(p, dtype=float), 0.0), 1.0)
    n = np.asarray(n, dtype=float)
    f = np.asarray(f, dtype=float)
    shape = np.broadcast_shapes(p.shape, n.shape, f.shape)
    p, n, f = (np.broadcast_to(x, shape).ravel() for x in (p, n, f))
    return _solve(p, n, f).reshape(shape)


def _solve(p: np.ndarray, n: np.ndarray, f) -> np.ndarray:
    """klucb_upper on 1-D float arrays p in [0, 1], n >= 0 and f (a float or an array like p)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        bound = np.where(n > 0, f / n, np.inf)      # kl(p, q) <= bound
        lo = p.copy()
        width = np.minimum(1.0, p + np.sqrt(0.5 * bound))
        width -= lo
        q1 = 1.0 - p
        # kl(p, q) = [p log p + (1-p) log(1-p)] - [p log q + (1-p) log(1-q)] <= bound  <=>  v(q) >= thr
        thr = xlogy(p, p)
        thr += xlogy(q1, q1)
        thr -= bound
        thr = thr[:, None]
        pc, qc = p[:, None], q1[:, None]
        for k in _PASSES:
            width *= 0.5 ** k     # exact (a power of two)
            grid = lo[:, None] + width[:, None] * _DYADIC[k]
            v = pc * np.log(grid)
            v += qc * np.log1p(-grid)
            # nan (0 * log 0 at a degenerate bracket) counts as infeasible
            lo += np.add.reduce(v >= thr, axis=1) * width
    lo[n <= 0] = 1.0
    return lo


def paper_window(T: int, L_T: int) -> int:
    """w = sqrt(4 e T / (L_T + 4)) of Theorem 1, rounded up."""
    return max(1, math.ceil(math.sqrt(4.0 * math.e * T / (L_T + 4))))


def eps_aware_window(T: int, L_T: int, gap_factor: float) -> int:
    """Theorem 1's window divided by the factor that shrinks every feedback gap (tanh(eps/2) under randomized
    response, 1 for the paper's window), rounded up, at most T."""
    return min(T, max(1, math.ceil(math.sqrt(4.0 * math.e * T / (L_T + 4)) / gap_factor)))


class SWKLUCBCF(Algorithm):
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
    # The paper has no experiments; ALGORITHMS.md proposes T = 1e5..1e6, K = 5, L_T = 4, eps in {0.5, 1, 2}.
    # delta is not used (pure eps-LDP); RunConfig needs one.
    paper_setting = {"env_params": {"K": 5, "breakpoints": 4}, "users": 10**5, "eps": 1.0, "delta": 0.01,
                     "params": {}}
    private = True
    windowed = True

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
        if self.private:
            self.rr = RandomizedResponse(self.eps)
            self.inverse = self.rr.debias
        else:
            self.rr = None
            self.inverse = lambda u: u
        self._memo: dict[int, float] = {}

    # ---- server half -------------------------------------------------------------------------
    def initial_state(self, rng):
        K = self.K
        state = {"t": 0, "n": np.zeros(K), "s": np.zeros(K)}
        if self.windowed:
            state.update(ring_n=np.zeros((self.capacity, K)), ring_s=np.zeros((self.capacity, K)),
                         ring_stop=np.zeros(self.capacity, dtype=np.int64), head=0, size=0)
        return state

    def update(self, state, sums, start, stop, rng):
        pulls = sums.get("pulls")
        if pulls is not None:
            feedback = sums["feedback"]
            state["n"] += pulls
            state["s"] += feedback
            if self.windowed:
                cap, size = self.capacity, state["size"]
                if size == cap:
                    raise RuntimeError("sw-klucb-cf: window ring buffer overflow")
                slot = (state["head"] + size) % cap
                state["ring_n"][slot] = pulls
                state["ring_s"][slot] = feedback
                state["ring_stop"][slot] = stop
                state["size"] = size + 1
        if self.windowed:   # drop the rounds that hold none of the last w users
            head, size, oldest = state["head"], state["size"], stop - self.w
            ring_stop = state["ring_stop"]
            while size and ring_stop[head] <= oldest:
                state["n"] -= state["ring_n"][head]
                state["s"] -= state["ring_s"][head]
                head = (head + 1) % self.capacity
                size -= 1
            state["head"], state["size"] = head, size
        state["t"] = stop
        return state

    def threshold(self, t: int) -> float:
        """f(min(t, w)) (f(t) without a window)."""
        return exploration(min(t, self.w) if self.windowed else t)

    def upper(self, n: np.ndarray, s: np.ndarray, f: float) -> np.ndarray:
        """max{q : N kl(lambda_hat, q) <= f} per arm (the feedback-scale UCB), before g^{-1}."""
        with np.errstate(divide="ignore", invalid="ignore"):
            p = np.where(n > 0, s / np.maximum(n, 1.0), 0.0)
        return _solve(p, n, f)

    def index(self, state) -> np.ndarray:
        """Index_a(t) for every arm."""
        t, n, s = state["t"], state["n"], state["s"]
        f = self.threshold(t)
        if not (self.windowed and t >= self.w):
            return self.inverse(self.upper(n, s, f))
        # f is constant from now on: the index is a function of the integers (N, sum) only.
        memo = self._memo
        if len(memo) > _CACHE_LIMIT:
            memo.clear()
        ni, si = np.rint(n).astype(np.int64), np.rint(s).astype(np.int64)
        keys = ((ni << 32) + si).tolist()
        values = [memo.get(k) for k in keys]
        missing = [i for i, v in enumerate(values) if v is None]
        if missing:
            solved = self.inverse(self.upper(ni[missing].astype(float), si[missing].astype(float), f)).tolist()
            for i, v in zip(missing, solved):
                memo[keys[i]] = v
                values[i] = v
        return np.array(values)

    def publish(self, state):
        return {"index": self.index(state)}

    # ---- client half -------------------------------------------------------------------------
    def act(self, model, contexts, users, rng):
        actions = np.full(len(users), int(np.argmax(model["index"])), dtype=np.int64)
        init = users < self.K          # initialization: user k < K pulls arm k (public schedule)
        if init.any():
            actions[init] = users[init]
        return actions

    def encode(self, model, contexts, actions, rewards, users, rng):
        r = np.asarray(rewards, dtype=float)
        # Public bound: the reward is a bit. Non-binary rewards (none on the Bernoulli envs) are rounded to the
        # nearest bit before privatizing and counted.
        clipped = int(np.count_nonzero((r != 0.0) & (r != 1.0)))
        bits = (r > 0.5).astype(np.int64)
        reported = self.rr.privatize(bits, rng) if self.private else bits
        n = len(users)
        pulls = np.zeros((n, self.K))
        pulls[np.arange(n), actions] = 1.0
        return {"pulls": pulls, "feedback": pulls * reported[:, None]}, {"clipped": clipped}

    def fields(self):
        # pulls: one-hot of the scheduled arm (user t < K pulls t, the others the round's argmax of the index),
        # public; feedback: a bit in at most one slot (the pulled arm's), through randomized response (the
        # non-private baselines send it raw, to a server that is trusted)
        K = self.K
        pulls = Domain((K,), low=0.0, high=1.0, integral=True, one_hot=True, scheduled=K, source="public pulled arm")
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

