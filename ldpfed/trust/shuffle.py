"""The shuffle trust model: each user still privatizes locally, and an anonymizing shuffler mixes each round's
messages before the server sees them, which amplifies privacy (ldpfed.mechanisms.shuffle: Feldman, McMillan,
Talwar, FOCS 2021). `--eps`/`--delta` are then the target of the shuffled batch, and the users' randomizers run at
the largest eps0 whose amplified guarantee at the batch size (users per round; the run's smallest round) meets it.
The algorithm is the same class, built at that local budget (eps0, delta0).

For randomizers that are pure eps0-LDP (every ledger row has delta = 0: the l2-ball, randomized response, Laplace)
the pure bound applies at the whole delta. For approximate (eps0, delta0) randomizers (the Gaussian mechanisms)
FMT's Theorem 3.8 adds (e^eps + 1)(1 + e^-eps0 / 2) n delta0 to delta: half of delta goes to the pure bound, and
delta0 is chosen so that the added term is at most the other half whatever eps0 (e^eps <= e^target and
1 + e^-eps0 / 2 <= 1.5).

Options: `shufflers` (S shufflers, each mixing its share of a round: ldpfed.trust.shuffling) and `small_groups`
(what a run whose smallest group amplifies too little does: "refuse" it, or run it at the target eps with
"no-amplification").
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ldpfed.mechanisms import accounting, shuffle
from ldpfed.trust.base import LOCAL, TrustModel
from ldpfed.federation import federation_of
from ldpfed.trust.shuffling import smallest_groups, smallest_sender_groups, smallest_share
from ldpfed.util.errors import ConfigError
from ldpfed.util.options import Option

# Under "shuffle", what a run does when its smallest group of users on one randomizer (ldpfed.trust.shuffling)
# amplifies too little: "refuse" it before it starts, or run every user at the target eps with "no-amplification".
SMALL_GROUPS = ("refuse", "no-amplification")

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
    # under a federation model whose users drop out: the batch is planned on min_participants of the users; the
    # rounds whose senders' smallest group falls below the plan, and that smallest group (below="report")
    rounds_below: int = 0
    realized_batch: int = 0
    below_round: int = -1

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
    """The fewest users a shuffler mixes: each of the S shufflers mixes its share of a round
    (ldpfed.trust.shuffling), so the batch every user is shuffled in is at least the smallest share of the run's
    smallest round (the last one may be short). Users on different randomizers split it further (`shuffle_plan`)."""
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
    federation = federation_of(config)
    realized = None
    if not federation.ideal:   # plan on the lower bound of the senders; the realized groups are checked below
        realized = smallest_sender_groups(algo, config, federation)
        floor = config.trust_options.get("min_participants", 1.0)
        smallest = np.maximum(1, np.ceil(floor * smallest - 1e-9)).astype(np.int64)
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
            raise ConfigError("trust_options.small_groups", config.small_groups,
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
    if realized is not None:
        below = np.flatnonzero((realized > 0) & (realized < smallest))
        if len(below):
            worst = int(below[np.argmin(realized[below])])
            if config.trust_options.get("below", "refuse") == "refuse":
                raise ConfigError("trust_options.min_participants", config.trust_options.get("min_participants"),
                                  f"round {worst}: under the {federation.name} federation model the smallest group "
                                  f"of its senders on one randomizer in a shuffler's share is {realized[worst]} "
                                  f"user(s), below the {smallest[worst]} the batch is planned on; lower "
                                  f"min_participants, or give below=report to run it at its real guarantee")
            base.update(rounds_below=len(below), realized_batch=int(realized[worst]), below_round=worst)
    return ShufflePlan(eps0, delta0, delta_pure=delta_pure, **base)


def local_config(config, probe):
    """Under the shuffle model: (the config the algorithm is built with, the shuffle plan). `probe`: the algorithm
    built at the target under local, which tells whether its randomizers are pure and how a round's users split
    into randomizer groups; the run's algorithm is then built at its local budget (ShuffleTrust.build)."""
    rows = probe.ledger()
    plan = shuffle_plan(config, pure=all(float(row["delta"]) == 0.0 for row in rows), algo=probe)
    local = config.replace(eps=plan.eps0, delta=plan.delta0 if plan.delta0 else config.delta, trust=LOCAL,
                           trust_options={})
    return local, plan



def void_refusal(algo, what: str) -> str | None:
    """Why a model cannot `what` the algorithm's noise when its ledger voids its own claim (None: it does not)."""
    if any(row.get("claim_void") for row in algo.ledger()):
        return (f"under profile {algo.config.profile!r} it claims no guarantee (its ledger is void): nothing to "
                f"{what}")
    return None


def compiled_refusal(algo, why: str) -> str | None:
    """Why a model that works around an algorithm's compiled steps cannot run it (None: it is written as steps)."""
    compiled_steps = getattr(algo, "compiled_steps", None)        # a CompiledAlgorithm's
    if compiled_steps is None or compiled_steps() is None:
        return f"it is not written as compiled steps (ldpfed.algorithms.compiled): {why}"
    return None


def shuffle_refusal(algo) -> str | None:
    """Why a shuffled server cannot run the algorithm: it sees each round's messages as a multiset, so the
    algorithm must be written once (its aggregate is then a sum or a fold of the rows), weigh each row by a public
    scaling only, which the server applies as the round's mean (CompiledAlgorithm.anonymous_sums), and fold with
    no user index. E.g. the BCO reductions, whose weighted sum multiplies two entries of a message."""
    why = compiled_refusal(algo, "its aggregate may use who sent what")
    if why:
        return why
    steps, consts, width = algo.steps(), algo.compiled_consts(), algo.layout().width
    if steps.fold is None:
        for user in (0, max(algo.T - 1, 0)):
            ones, twos = np.ones(width), np.full(width, 2.0)
            steps.weigh(consts, user, ones)
            steps.weigh(consts, user, twos)
            if not np.allclose(twos, 2.0 * ones, rtol=1e-12, atol=0.0):
                return ("it weighs a message by a function of its content (not a public scaling): a shuffled "
                        "server, which cannot tell who sent what, cannot apply it")
        return None
    # the shuffled server folds with no user index (ldpfed.trust.shuffling.UNKNOWN_USER)
    ones = algo.layout().split(np.ones((1, width)))
    sums = [algo.aggregate(ones, np.array([user], dtype=np.int64)) for user in (0, 1, max(algo.T - 1, 0))]
    if any(not all(np.array_equal(other[key], sums[0][key]) for key in sums[0]) for other in sums[1:]):
        return "it folds a message by its user's index, which a shuffled server does not know"
    return None


def check_shuffled(algo) -> None:
    """ConfigError naming trust when a shuffled server cannot run the algorithm (shuffle_refusal)."""
    why = shuffle_refusal(algo)
    if why:
        raise ConfigError("trust", "shuffle", f"{algo.name}: {why}")


class ShuffleTrust(TrustModel):
    """Local randomizers at the largest eps0 whose worst-off user's shuffled group meets the run's (eps, delta)
    (module doc, `shuffle_plan`)."""

    name = "shuffle"
    about = ("each user privatizes locally and a shuffler mixes each round's messages: --eps/--delta are the "
             "shuffled batch's target, the users' randomizers run at the largest eps0 that meets it")
    shuffles = True
    server_view = "shuffled"
    options = {
        "shufflers": Option(1, kind="int", low=1,
                            doc="S shufflers, each mixing its share of a round (round size // S users): a user "
                                "hides among its share only, so the anonymity set shrinks with S"),
        "min_participants": Option(1.0, low=0, high=1, low_open=True,
                                   doc="under a federation model whose users drop out: the fraction of each randomizer "
                                       "group's users the batch is planned on (the guarantee assumes at least that "
                                       "many senders hide each user)"),
        "below": Option("refuse", kind="choice", choices=("refuse", "report"),
                        doc="a round whose senders fall below min_participants: 'refuse' the run before it starts, "
                            "or 'report' the worst round's real (weaker) guarantee"),
        "small_groups": Option("refuse", kind="choice", choices=SMALL_GROUPS,
                               doc="a user hides only among the users of its batch on the same randomizer; when "
                                   "the smallest such group amplifies too little: 'refuse' the run, or run every "
                                   "user at the target eps ('no-amplification': the local guarantee)"),
    }

    def federation_refusal(self, federation) -> str | None:
        if federation.late:
            return ("a late message would join a later round's aggregate outside its shuffled batch, so the "
                    "batch's amplification would not cover it; run it under a federation model without delays")
        return None

    def refusal(self, algo) -> str | None:
        if algo.privacy_model != "ldp":
            return (f"it is not a local-DP algorithm (privacy model {algo.privacy_model!r}): there is no local "
                    f"randomizer to shuffle")
        return void_refusal(algo, "amplify") or shuffle_refusal(algo)

    def build(self, cls, world, config):
        probe = cls(world, config.replace(trust=LOCAL, trust_options={}))
        why = self.refusal(probe)
        if why:
            raise self.refuse(probe, why)
        local, plan = local_config(config, probe)
        algo = cls(world, local)
        algo.trust, algo.shuffle = self, plan
        check_shuffled(algo)
        return algo

    def summary(self, config, algo) -> dict:
        plan = algo.shuffle
        local = accounting.compose(algo.ledger(), algo.delta)
        shuffled = {"privacy_trust": self.name, "privacy_eps0": local.eps, "privacy_delta0": local.delta,
                    "privacy_eps0_dp_accounting": local.eps_pld, "privacy_shuffle_batch": plan.batch,
                    "privacy_shuffle_round": plan.smallest_round, "privacy_shuffle_amplified": plan.amplifies,
                    "privacy_shufflers": config.shufflers, "privacy_shuffle_bound": plan.bound,
                    **self.summary_labels(config)}
        if not plan.amplifies:      # the run's randomizers are at the target: the local guarantee, nothing more
            accounting.check_budget(local, config.eps, config.delta, config.algorithm)
            return {**local.summary(), **shuffled}
        accounting.check_budget(local, plan.eps0, algo.delta, config.algorithm)
        if plan.rounds_below:       # below="report": the worst round's real guarantee, whatever the target
            shuffled.update(privacy_shuffle_rounds_below=plan.rounds_below,
                            privacy_shuffle_realized_batch=plan.realized_batch, privacy_shuffle_below_target=True)
            if plan.realized_batch < 2:     # a user alone in its group hides among no one: its local guarantee
                return {**local.summary(), **shuffled}
            real = plan.amplified(local.eps, local.delta if plan.delta0 else 0.0, plan.realized_batch)
            return {"privacy_eps_composed": max(real.eps, config.eps), "privacy_delta_composed": real.delta,
                    "privacy_eps_dp_accounting": None, **shuffled}
        amplified = plan.amplified(local.eps, local.delta if plan.delta0 else 0.0)
        accounting.check_budget(accounting.Composition(amplified.eps, amplified.delta, config.delta, None,
                                                       (amplified.reason,)), config.eps, config.delta,
                                config.algorithm)
        return {"privacy_eps_composed": amplified.eps, "privacy_delta_composed": amplified.delta,
                "privacy_eps_dp_accounting": None, **shuffled}

    def ledger_rows(self, algo) -> list[dict]:
        """Per run of rounds with the same smallest randomizer group: that group and its worst-off user's
        (eps, delta)."""
        plan = algo.shuffle
        local = accounting.compose(algo.ledger(), algo.delta)
        rows = []
        for first, last, n in plan.group_runs:
            if plan.amplifies:
                got = plan.amplified(local.eps, local.delta if plan.delta0 else 0.0, n)
                eps, delta = got.eps, got.delta
            else:
                eps, delta = local.eps, local.delta
            rows.append({"message": f"shuffled rounds {first}-{last}", "rounds": [first, last],
                         "smallest_group": n, "eps": eps, "delta": delta, "trust": self.name,
                         "amplified": plan.amplifies,
                         "scope": "the worst-off user of these rounds: the smallest group of users on one "
                                  "randomizer in a shuffler's share"})
        return rows

    def describe(self, s: dict, config) -> str:
        among = "" if s.get("privacy_shufflers", 1) == 1 else f" (a round among {s['privacy_shufflers']} shufflers)"
        smallest = (f"the smallest group of users on one randomizer in a shuffled batch{among}: "
                    f"{s['privacy_shuffle_batch']:,} (round {s['privacy_shuffle_round']})")
        if not s.get("privacy_shuffle_amplified", True):
            return (f"privacy (shuffle): no amplification: {smallest} is too small, so every user's randomizer "
                    f"runs at the target; (eps, delta) = ({s['privacy_eps_composed']:.6g}, "
                    f"{s['privacy_delta_composed']:.3g}), as under --trust local")
        return (f"privacy (shuffle): each user's randomizer at eps0 = {s['privacy_eps0']:.4g} (delta0 = "
                f"{s['privacy_delta0']:.3g}); {smallest} gives the worst-off user (eps, delta) = "
                f"({s['privacy_eps_composed']:.6g}, {s['privacy_delta_composed']:.3g}) "
                f"({s['privacy_shuffle_bound']} bound, Feldman-McMillan-Talwar 2021)")


    def label_rows(self, algo, rows: list) -> list:
        """The rows are the local randomizer's; the shuffled batch amplifies them."""
        plan = algo.shuffle
        note = (f"local randomizer of the shuffle trust model: each user sends one message in one shuffled batch "
                f"of >= {plan.batch} users on its randomizer, so the run's guarantee is its worst-off user's "
                f"batch's (the summary's privacy_eps_composed, {plan.bound} bound of Feldman, McMillan, Talwar "
                f"2021)") if plan.amplifies else (
                f"local randomizer of the shuffle trust model, at the target: a group of {plan.batch} user(s) on "
                f"one randomizer (round {plan.smallest_round}) amplifies too little, so no user's guarantee counts "
                f"on the shuffle")
        return [{**row, "trust": self.name, "scope": note} for row in rows]
