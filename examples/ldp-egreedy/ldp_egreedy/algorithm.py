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
"""
from __future__ import annotations

import numpy as np

from ldpfed.algorithms.base import Algorithm
from ldpfed.algorithms.fields import Field
from ldpfed.algorithms.options import Option
from ldpfed.mechanisms import Domain, RandomizedResponse


class LdpEpsGreedy(Algorithm):
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

    def setup(self):
        """Build the mechanisms (called by Algorithm.__init__; self.params, self.K, self.eps are set)."""
        self.c = self.params["c"]
        self.rr = RandomizedResponse(self.eps)

    def fields(self):
        """The message, declared once: ldpfed derives the message spec, the domains the server shards check, the
        public fields, the mechanisms and the privacy ledger from it."""
        K = self.K
        return {
            # the pulled arm, one-hot: public (module docstring), so no mechanism; its domain is the protocol's
            "pulls": Field((K,), domain=Domain((K,), low=0.0, high=1.0, integral=True, one_hot=True,
                                               source="public pulled arm (one-hot)")),
            # the reward bit through randomized response, in the pulled arm's slot: the ledger's one row
            "feedback": Field((K,), mechanism=self.rr, schedule={"at_most_one": True}),
        }

    # ---- server half ----------------------------------------------------------------------------------------
    def initial_state(self, rng):
        return {"count": np.zeros(self.K), "reports": np.zeros(self.K), "arm": 0}

    def update(self, state, sums, start, stop, rng):
        """Fold the sums of users [start, stop): sums["pulls"] counts each arm's pulls, sums["feedback"] adds up
        each arm's reported bits (a round whose users sent nothing has no keys)."""
        count = state["count"] + sums.get("pulls", 0.0)
        reports = state["reports"] + sums.get("feedback", 0.0)
        means = np.full(self.K, np.inf)                     # unpulled arms first
        pulled = count > 0
        means[pulled] = self.rr.debias(reports[pulled] / count[pulled])
        return {"count": count, "reports": reports, "arm": int(np.argmax(means))}

    def publish(self, state):
        return {"arm": state["arm"]}             # all the clients need; no user's data, only sums of RR reports

    # ---- client half (vectorized over a round's users; rng is the users' own randomness) ---------------------
    def act(self, model, contexts, users, rng):
        t = users + 1.0                                     # users are numbered from 0
        explore = rng.random(len(users)) < np.minimum(1.0, self.c * self.K / t)
        random_arms = rng.integers(self.K, size=len(users))
        return np.where(explore, random_arms, model["arm"]).astype(np.int64)

    def encode(self, model, contexts, actions, rewards, users, rng):
        n = len(users)
        pulls = np.zeros((n, self.K))
        pulls[np.arange(n), actions] = 1.0                  # one-hot pulled arm (public)
        # The mechanism is calibrated for a bit, so whatever a client feeds in is made a bit BEFORE privatizing:
        # values other than 0 and 1 (none on the Bernoulli envs) are rounded to the nearest bit and counted.
        r = np.asarray(rewards, dtype=float)
        rounded = int(np.count_nonzero((r != 0.0) & (r != 1.0)))
        reported = self.rr.privatize((r > 0.5).astype(np.int64), rng)   # the one private value
        # (messages, metrics): the metrics go to the simulation's counters, never to the server
        return {"pulls": pulls, "feedback": pulls * reported[:, None]}, {"clipped": rounded}
