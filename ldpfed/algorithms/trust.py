"""Trust models: where the noise goes, not a different algorithm.

* "local" (the papers): no one is trusted; each user privatizes its message with the run's (eps, delta).
* "shuffle": each user still privatizes locally, and an anonymizing shuffler mixes each round's messages before the
  server sees them, which amplifies privacy (ldpfed.mechanisms.shuffle: Feldman, McMillan, Talwar, FOCS 2021).
  `--eps`/`--delta` are then the target of the shuffled batch, and the users' randomizers run at the largest eps0
  whose amplified guarantee at the batch size (users per round; the run's smallest round) meets it. The algorithm
  is the same class, built at that local budget (eps0, delta0).

For randomizers that are pure eps0-LDP (every ledger row has delta = 0: the l2-ball, randomized response, Laplace)
the pure bound applies at the whole delta. For approximate (eps0, delta0) randomizers (the Gaussian mechanisms)
FMT's Theorem 3.8 adds (e^eps + 1)(1 + e^-eps0 / 2) n delta0 to delta: half of delta goes to the pure bound, and
delta0 is chosen so that the added term is at most the other half whatever eps0 (e^eps <= e^target and
1 + e^-eps0 / 2 <= 1.5).

* "central": a trusted server. Each user sends its clipped data as its mechanisms' mean (unbiased: the server's
  estimator is unchanged), and the server adds each mechanism's central twin's noise once to the round's aggregate,
  calibrated to one user's contribution at the run's (eps, delta) (ldpfed.mechanisms.central). The algorithm is the
  same class, at the same budget; its confidence widths and shifts still assume the local noise, which is larger:
  they are conservative, not wrong.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ldpfed.config import TRUST_MODELS  # noqa: F401  (re-exported: the trust models are named once, in config)
from ldpfed.errors import ConfigError
from ldpfed.mechanisms import shuffle
from ldpfed.mechanisms.central import central_twin
from ldpfed.shuffling import smallest_groups, smallest_share

SHUFFLE_BOUND = "numerical"       # FMT's numerical bound: the tighter of their two (shuffle.BOUNDS)
# A batch "too small to amplify": its eps0 is less than 5% above the target (shuffling any batch never hurts, so
# eps0 = eps always meets the target; below this gain the run is the local one with a shuffler in the way).
MIN_GAIN = 1.05


@dataclass(frozen=True)
class ShufflePlan:
    """The local budget of a shuffled run and what it buys. A user is hidden only among the users of its shuffler's
    share that run the same randomizer (`Algorithm.randomizer_groups`): the worst-off user is in the smallest such
    group of the run, so eps0 is the largest its group size amplifies to the target."""

    eps0: float            # each user's local randomizer (the algorithm's eps)
    delta0: float          # its delta (0: pure randomizers)
    batch: int             # the smallest randomizer group of any round's share: the worst user's anonymity set
    delta_pure: float      # the part of the target delta spent in the pure bound
    bound: str
    largest: int = 0       # the largest group any user is shuffled in (FMT Thm 3.8's added delta grows with it)
    smallest_round: int = 0                 # the first round whose smallest group is `batch`
    group_runs: tuple = ()                  # (first round, last round, smallest group) for runs of equal rounds
    amplifies: bool = True                  # False: the smallest group amplifies nothing, eps0 is the target

    def amplified(self, eps0: float, delta0: float, n: int | None = None) -> shuffle.Amplified:
        """The guarantee of the worst-off user (a group of n, by default the run's smallest) for (eps0, delta0)-LDP
        messages (the ledger's composed local guarantee). Its delta charges FMT Thm 3.8's term at the largest
        group, which bounds it for every group."""
        n = self.batch if n is None else int(n)
        pure = shuffle.amplify(eps0, n, self.delta_pure, bound=self.bound)
        largest = max(self.largest, n)
        delta = self.delta_pure + (math.exp(pure.eps) + 1.0) * (1.0 + math.exp(-eps0) / 2.0) * largest * delta0
        what = (f"({eps0:g}, {delta0:g})-LDP messages" if delta0 else f"eps0 = {eps0:g}-LDP messages")
        reason = (f"shuffle: the smallest group of users on one randomizer in a shuffler's share is n = {n} {what} "
                  f"(round {self.smallest_round}), {pure.reason.split(' messages, ', 1)[-1].split(';')[0]}; "
                  f"each user sends one message in one batch, so the run's guarantee is its worst user's")
        return shuffle.Amplified(pure.eps, delta, float(eps0), float(delta0), n, self.bound, reason)


def smallest_batch(config) -> int:
    """The fewest users a shuffler mixes: each of the S shufflers mixes its share of a round (ldpfed.shuffling), so
    the batch every user is shuffled in is at least the smallest share of the run's smallest round (the last one
    may be short). Users on different randomizers split it further (`shuffle_plan`)."""
    last = config.users - (config.rounds - 1) * config.round_size
    return smallest_share(min(config.round_size, last), config.shufflers)


def _runs(values: np.ndarray) -> tuple:
    """(first, last, value) for each run of equal consecutive values."""
    cuts = np.flatnonzero(np.diff(values)) + 1
    starts, ends = np.concatenate([[0], cuts]), np.concatenate([cuts - 1, [len(values) - 1]])
    return tuple((int(a), int(b), int(values[a])) for a, b in zip(starts, ends))


def shuffle_plan(config, pure: bool, algo=None) -> ShufflePlan:
    """The largest local eps0 (and its delta0) whose worst-off user meets the run's (eps, delta): the user in the
    smallest randomizer group of any round's shuffler share (`algo.randomizer_groups`; without `algo`, every user
    of a round on one randomizer). When that group amplifies too little, `config.small_groups` decides: "refuse"
    (ConfigError naming the algorithm, the round and the group size) or "no-amplification" (eps0 = the target:
    the run's guarantee is the local one, the shuffler changes nothing)."""
    if algo is None:
        smallest = largest = np.full(config.rounds, smallest_batch(config), dtype=np.int64)
    else:
        try:
            smallest, largest = smallest_groups(algo, config.users, config.round_size, config.shufflers)
        except NotImplementedError as error:
            raise ConfigError("trust", "shuffle", f"{error}; the shuffle trust model must know which users a "
                                                  f"shuffled server can tell apart") from None
    r = int(np.argmin(smallest))
    n, top = int(smallest[r]), int(largest.max())
    split = n < smallest_batch(config)      # the schedule, not the round size, made the group small
    base = dict(batch=n, bound=SHUFFLE_BOUND, largest=top, smallest_round=r, group_runs=_runs(smallest))
    delta_pure = config.delta if pure else config.delta / 2.0
    delta0 = 0.0 if pure else (config.delta / 2.0) / ((math.exp(config.eps) + 1.0) * 1.5 * top)

    def too_small(why: str) -> ShufflePlan:
        if config.small_groups == "no-amplification":
            return ShufflePlan(float(config.eps), 0.0 if pure else float(config.delta), delta_pure=config.delta,
                               amplifies=False, **base)
        name = getattr(algo, "name", config.algorithm)
        if split:
            raise ConfigError("small_groups", config.small_groups,
                              f"{name}: round {r} has a group of {n} user{'s' if n != 1 else ''} that the public "
                              f"schedule sets apart from the rest of its batch (a shuffled server tells their "
                              f"messages apart, so only users on the same randomizer hide each other): {why}; "
                              f"--small-groups no-amplification runs every user at the target eps unamplified")
        batch = f"{n} users" if config.shufflers == 1 else \
            f"{n} users (a round split among {config.shufflers} shufflers)"
        fewer = "" if config.shufflers == 1 else " or lower --shufflers"
        raise ConfigError("round_size", config.round_size, f"{name}: round {r}: a shuffled batch of {batch} {why}; "
                                                           f"raise --round-size (or --users){fewer}, or --eps")

    if n < 2:
        return too_small("a batch needs at least 2 users to hide a user among others")
    try:
        eps0 = shuffle.largest_eps0(config.eps, n, delta_pure, bound=SHUFFLE_BOUND)
    except ConfigError as error:
        return too_small(f"cannot reach eps = {config.eps:g} at delta = {config.delta:g} ({error.reason})")
    if eps0 < MIN_GAIN * config.eps:
        return too_small(f"amplifies too little at eps = {config.eps:g}, delta = {config.delta:g}: its largest "
                         f"local eps0 is {eps0:.4g} (less than {MIN_GAIN:g} x eps)")
    return ShufflePlan(eps0, delta0, delta_pure=delta_pure, **base)


def local_config(config, cls, world):
    """(the config the algorithm is built with, the shuffle plan or None). Under "shuffle" the algorithm is first
    built at the target to learn whether its randomizers are pure, then at its local budget; under "central" it is
    built at the run's budget (its mechanisms' twins then add the noise on the server: `central_twins`)."""
    if config.trust == "local":
        return config, None
    if cls.privacy_model != "ldp":
        raise ConfigError("trust", config.trust, f"{cls.name} is not a local-DP algorithm (privacy model "
                                                 f"{cls.privacy_model!r}): there is no local randomizer to "
                                                 f"{'shuffle' if config.trust == 'shuffle' else 'move to the server'}")
    if config.trust == "central":       # built at the run's budget: central_twins checks the built algorithm
        return config, None
    probe = cls(world, config)
    rows = probe.ledger()
    refuse_void(probe, rows, "amplify")
    plan = shuffle_plan(config, pure=all(float(row["delta"]) == 0.0 for row in rows), algo=probe)
    local = config.replace(eps=plan.eps0, delta=plan.delta0 if plan.delta0 else config.delta, trust="local",
                           shufflers=1, small_groups="refuse")
    return local, plan


def check_shuffled(algo) -> None:
    """Under the shuffle model: the server sees each round's messages as a multiset, so the algorithm must be written
    once (its aggregate is then a sum or a fold of the rows) and weigh each row by a public scaling only, which
    the server applies as the round's mean (CompiledAlgorithm.anonymous_sums). ConfigError naming trust otherwise,
    e.g. for the BCO reductions, whose weighted sum multiplies two entries of a message."""
    compiled_steps = getattr(algo, "compiled_steps", None)
    if compiled_steps is None or compiled_steps() is None:
        raise ConfigError("trust", "shuffle", f"{algo.name} is not written as compiled steps "
                                              f"(ldpfed.algorithms.compiled): its aggregate may use who sent what")
    if algo.anonymous_sums():
        weigh, consts, width = algo.steps().weigh, algo.compiled_consts(), algo.layout().width
        for user in (0, max(algo.T - 1, 0)):
            ones, twos = np.ones(width), np.full(width, 2.0)
            weigh(consts, user, ones)
            weigh(consts, user, twos)
            if not np.allclose(twos, 2.0 * ones, rtol=1e-12, atol=0.0):
                raise ConfigError("trust", "shuffle", f"{algo.name} weighs a message by a function of its content "
                                                      f"(not a public scaling): a shuffled server, which cannot "
                                                      f"tell who sent what, cannot apply it")
    if algo.steps().fold is not None:   # the shuffled server folds with no user index (ldpfed.shuffling.UNKNOWN_USER)
        ones = algo.layout().split(np.ones((1, algo.layout().width)))
        sums = [algo.aggregate(ones, np.array([user], dtype=np.int64)) for user in (0, 1, max(algo.T - 1, 0))]
        if any(not all(np.array_equal(other[key], sums[0][key]) for key in sums[0]) for other in sums[1:]):
            raise ConfigError("trust", "shuffle", f"{algo.name} folds a message by its user's index, which a "
                                                  f"shuffled server does not know")


def refuse_void(algo, rows, what: str) -> None:
    """ConfigError naming trust when the algorithm's ledger voids its own claim (nothing to `what`)."""
    if any(row.get("claim_void") for row in rows):
        raise ConfigError("trust", algo.config.trust, f"{algo.name} under profile {algo.config.profile!r} claims no "
                                                      f"guarantee (its ledger is void): nothing to {what}")


def central_twins(algo) -> dict:
    """Under the central trust model: {message field: the central twin of its mechanism} (ldpfed.mechanisms.central).
    The algorithm must be written once (its clipped rows are what a user sends; the twins' means and the server's
    noise are applied around its steps), and an algorithm that folds its rows into an aggregate of other fields
    must say which aggregate field carries which message field (`central_sources`)."""
    refuse_void(algo, algo.ledger(), "move to the server")
    compiled_steps = getattr(algo, "compiled_steps", None)        # a CompiledAlgorithm's
    if compiled_steps is None or compiled_steps() is None:
        raise ConfigError("trust", "central", f"{algo.name} is not written as compiled steps "
                                              f"(ldpfed.algorithms.compiled): the central model adds its noise around "
                                              f"them")
    if algo.central_sources() is None:
        raise ConfigError("trust", "central", f"{algo.name} weighs or folds its rows into its aggregate without "
                                              f"saying which aggregate field carries which message field, and with "
                                              f"what public weight (central_sources)")
    declared = algo._fields or {}
    return {key: central_twin(f.mechanism, f.shape) for key, f in declared.items() if f.mechanism is not None}
