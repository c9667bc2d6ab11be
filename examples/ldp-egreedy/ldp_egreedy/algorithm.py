"""LDP epsilon-greedy on randomized-response rewards: the worked example of an ldpfed plugin
(docs/writing-an-algorithm.md walks through it).

Protocol, on the Bernoulli bandits ("bernoulli", "piecewise-bernoulli": K arms, rewards are bits), for the users
t = 1, 2, ..., T:
  * Server: publishes the greedy arm, the arm with the highest estimated mean (an arm nobody has pulled yet comes
    first; ties: the lowest arm).
  * Client (user t): with probability e_t = min(1, c K / t) it explores, pulling an arm drawn uniformly; otherwise
    it pulls the published greedy arm. It sends the pulled arm as a one-hot K-vector (`pulls`) and its reward bit,
    passed through randomized response at eps, in the pulled arm's slot (`feedback`).
  * Server: adds a round's summed messages to per-arm counts N_a and report sums S_a. A report's mean is
    g(mu) = 1/(1+e^eps) + tanh(eps/2) mu, so rr.debias(S_a / N_a) = g^{-1}(S_a / N_a) estimates mu_a.

Privacy: pure eps-LDP per user (delta is not used). The reward bit is the user's only data, and it leaves the
user only through randomized response (`mechanisms["feedback"]`, the ledger's one row). The arm is public: it is
a function of the published greedy arm (computed from earlier users' privatized reports: post-processing), of the
user's public index t and of the user's own coins, never of its reward (drawn after the pull). So it may be sent
as it is (`public_fields`), as the built-in LDP reductions send theirs.

Rounds: with B users per round every user of a round sees the same greedy arm (B = 1 is the sequential
algorithm); each user still explores with its own e_t.

Written once (ldpfed.algorithms.compiled): what a user does (act, prepare) and what the server does (update) are
compiled functions that every engine runs: a round of users in a process or a Ray actor, and the paper's sequential
B = 1 loop at about a million users a second.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ldpfed.algorithms.compiled import CompiledAlgorithm, Steps, no_weights
from ldpfed.algorithms.fields import Field
from ldpfed.algorithms.options import Option
from ldpfed.mechanisms import Domain, RandomizedResponse


# ---- the algorithm, one user at a time, compiled (numba): every engine runs these -----------------------------
# Each function gets the published model and the algorithm's constants as tuples (model_keys and consts() below).
@njit(cache=True)
def egreedy_act(model, consts, contexts, i, user, draws, actions):
    """User `user` (numbered from 0) explores w.p. min(1, c K / t), t = user + 1, with the arm draw_act drew for
    it; else it pulls the published greedy arm."""
    c, K = consts[0], consts[1]
    if draws[i, 0] < min(1.0, c * K / (user + 1.0)):
        actions[i] = int(draws[i, 1])
    else:
        actions[i] = model[0][0]


@njit(cache=True)
def egreedy_prepare(model, consts, contexts, actions, reward, user, i, inputs, counts):
    """User i's data, written into its row: `pulls` (K entries: the pulled arm, one-hot, public) then `feedback`
    (K entries: the reward bit in the pulled arm's slot; randomized response privatizes it after this). The
    mechanism is calibrated for a bit, so the reward is made a bit here, BEFORE it is privatized: values other than
    0 and 1 (none on the Bernoulli envs) are rounded to the nearest bit and counted."""
    K = consts[1]
    row, arm = inputs[i], actions[i]
    row[arm] = 1.0
    row[K + arm] = 1.0 if reward > 0.5 else 0.0
    counts[i, 0] = 0 if reward == 0.0 or reward == 1.0 else 1


@njit(cache=True)
def egreedy_finish(consts, user, row):
    """Post-processing of the privatized row: only the pulled arm's report is sent (randomized response also
    answered for the other slots, whose input was 0 whatever the user's data)."""
    K = consts[1]
    for k in range(K):
        row[K + k] *= row[k]


@njit(cache=True)
def egreedy_update(state, consts, sums, start, stop, server):
    """Fold the summed rows of users [start, stop): per-arm pulls and reports; the greedy arm is the arm of the
    highest debiased mean, an arm nobody pulled yet first (ties: the lowest arm)."""
    count, reports, arm = state
    K, p_flip, tanh_half = consts[1], consts[2], consts[3]
    best, best_arm = -np.inf, 0
    for k in range(K):
        count[k] += sums[k]
        reports[k] += sums[K + k]
        mean = (reports[k] / count[k] - p_flip) / tanh_half if count[k] > 0 else np.inf
        if mean > best:
            best, best_arm = mean, k
    arm[0] = best_arm


class LdpEpsGreedy(CompiledAlgorithm):
    """Epsilon-greedy whose users send their reward bits through randomized response.

    User t explores (a uniformly random arm) with probability min(1, c K / t), else pulls the published greedy arm.
    """

    # ---- what the registry, `python -m ldpfed list` and `describe` show -------------------------------------
    name = "ldp-egreedy"                     # the entry point's name (pyproject.toml)
    paper = "example plugin: LDP epsilon-greedy with randomized-response rewards (not from the seeds)"
    privacy_model = "ldp"                    # every non-public message field must be a mechanism's output
    env_kinds = ("bernoulli", "piecewise-bernoulli")
    default_env = "bernoulli"
    # --param c=...: checked by ldpfed before setup() runs (an error names params.c); `describe` shows the doc
    options = {"c": Option(5.0, low=0.0, low_open=True, doc="exploration: user t explores w.p. min(1, c K / t)")}

    # ---- the compiled functions' world ---------------------------------------------------------------------
    state_keys = ("count", "reports", "arm")     # the state's arrays, in the order the compiled functions get them
    model_keys = ("arm",)                        # what every user sees: the published greedy arm
    metric_names = ("clipped",)                  # prepare's counters (to the simulation's metrics, never the server)
    act_draws = 2                                # act's random numbers per user (see draw_act)
    public_draws = frozenset({"pulls"})          # an explorer's arm: its own coins' draw (see randomizer_groups)

    def setup(self):
        """Build the mechanisms (called by Algorithm.__init__; self.params, self.K, self.eps are set)."""
        self.c = self.params["c"]
        self.rr = RandomizedResponse(self.eps)

    def steps(self):
        return Steps(egreedy_act, egreedy_prepare, no_weights, egreedy_update, egreedy_finish)

    def consts(self):
        return (self.c, self.K, self.rr.p_flip, self.rr.tanh_half)

    def draw_act(self, n, rng):
        # per user: the exploration coin, then the arm it explores with
        return np.column_stack([rng.random(n), rng.integers(self.K, size=n)]).astype(float)

    def fields(self):
        """The message, declared once: ldpfed derives the message spec, the domains the server shards check, the
        public fields, the mechanisms, the privacy ledger and each user's row (prepare's layout) from it."""
        K = self.K
        return {
            # the pulled arm, one-hot: public (module docstring), so no mechanism; its domain is the protocol's
            "pulls": Field((K,), domain=Domain((K,), low=0.0, high=1.0, integral=True, one_hot=True,
                                               source="public pulled arm (one-hot)")),
            # the reward bit through randomized response, in the pulled arm's slot: the ledger's one row
            "feedback": Field((K,), mechanism=self.rr, schedule={"at_most_one": True}),
        }

    def randomizer_groups(self, users):
        """Under --trust shuffle: which users a shuffled server can tell apart. User t explores with its own
        probability min(1, c K / t), so users past c K each run a randomizer of their own (the arm's law differs);
        the first c K all explore, one randomizer. A shuffle hides the later ones among nobody: their groups are
        single users, and the shuffle model refuses the run or runs it unamplified (--small-groups)."""
        users = np.asarray(users, dtype=np.int64)
        return np.where(users + 1.0 <= self.c * self.K, -1, users)

    def central_touched(self, sums, start, stop):
        """Under --trust central the server adds its noise only to the reports of arms someone pulled this round
        (the pulls are public; an arm nobody pulled holds no one's report)."""
        return {"pulls": np.ones(self.K), "feedback": (np.asarray(sums.get("pulls", np.zeros(self.K))) > 0) * 1.0}

    def initial_state(self, rng):
        return {"count": np.zeros(self.K), "reports": np.zeros(self.K), "arm": np.zeros(1, dtype=np.int64)}
