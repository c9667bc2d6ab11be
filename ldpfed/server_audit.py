"""An end-to-end privacy audit of what the server sees: whole rounds, run as the system runs them, on two
neighbouring populations that differ in one canary user, many times; an empirical LOWER bound on the canary's eps
from the server's view under the run's trust model, to hold against the guarantee the run reports.

One round of `users` users (the whole run: T = B = users), built as every engine builds it (`make_algorithm`: the
trust model's local budget, shuffle plan or central twins), simulated by the engine's own population step
(`simulate_population`: contexts, act, rewards, encode) from the published initial model. Per repetition r:

* Both worlds use the same seeds: the users' coins (`derive(seed_r, "privatize", ...)`), the shufflers'
  permutations and the server's noise are the repetition's; everyone's data comes from one fixed stream (the same
  contexts and reward draws every repetition), so the two populations are fixed neighbouring data sets.
* The canary's data is the only difference: reward +c_r in world a, -c_r in world b (two-point feedback: (+c_r,
  -c_r) against (-c_r, +c_r)); its contexts, the same in both worlds, scaled to the public context bound where
  there is one (the reward's message then moves by the most the public bounds allow).
* The canary sits where the claim is weakest: the first user of a smallest randomizer group of its shuffler's
  share (`algo.randomizer_groups`), of those groups the one whose public fields the fewest messages of the share
  show (e.g. user 1 of ldp-mab-ucb and klucb-cf, alone on the arm the public schedule gives it; not user 0, whose
  scheduled arm is also the published one); the last user when every user of the round runs one randomizer.

The server's view, reduced to one feature vector per run:

* "local" (per-user mode): the server gets each message with its user: the canary's message row.
* "shuffle": the server gets the permuted chunks of the canary's shuffler share (`shuffle_share`) and can tell
  apart only what the public fields show: the messages whose public fields (bar `public_draws`, which each user
  draws with its own coins) equal the canary's, aggregated as the server aggregates a chunk (`anonymous_aggregate`).
  A canary alone in its group is then seen as its own message.
* "central": the round's noisy aggregate, as `update` forms it (the aggregate row plus the trust model's `server_noise`).
* "secagg": the masked messages, each uniform in Z_m whatever the data, and their sum, which the masks let through:
  the round's unmasked sum as the server's half decodes it (its noise is the users' shares).

The test: a pilot (its own seeds, `pilot` runs per world) fixes a linear statistic (the feature's mean shift
between the worlds over its variance, coordinate-wise: the likelihood ratio for Gaussian noise, the count for
bits) and the threshold event with the largest pilot bound; on `repetitions` fresh runs per world the event's
counts give the Clopper-Pearson bound `ldpfed.mechanisms.audit.eps_lower_bound` at the run's delta (at least
the claimed delta), confidence 1 - alpha. (eps, delta)-DP implies P_b(E) <= e^eps P_a(E) + delta for every event,
and the pilot only chooses the event, so the bound exceeds the true eps with probability at most alpha whatever
the algorithm. The two worlds' runs share their coins, which changes neither world's own law: each count is binomial,
and the two one-sided intervals (alpha / 2 each) hold jointly by the union bound.

`whole_batch=True` audits the accounting this module is a check on, as it was before randomizer groups: the
shuffle plan computed as if every user of a round ran one randomizer (`shuffle_plan` without the algorithm: eps0
the largest the whole round amplifies to eps), viewed as the shuffled multiset, claiming what that plan reported.
A canary the public schedule sets apart is then seen alone at eps0, and the audit flags the claim.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ldpfed.algorithms import REGISTRY, check_instance, make_algorithm
from ldpfed.trust.shuffling import anonymous_aggregate, check_groups, share_bounds, shuffle_share
from ldpfed.trust import LOCAL, TRUST_MODELS, trust_model
from ldpfed.trust.shuffle import check_shuffled, shuffle_plan
from ldpfed.config import RunConfig
from ldpfed.federation import federation_model
from ldpfed.federation.rounds import round_senders
from ldpfed.engine.core import join_pieces, privacy_summary, shuffler_pieces, simulate_population
from ldpfed.envs import make_env
from ldpfed.mechanisms.audit import eps_lower_bound
from ldpfed.util.errors import ConfigError
from ldpfed.util.rng import derive
from ldpfed.util.threads import limited

AUDIT_ALPHA = 0.01          # the bound exceeds the true eps with probability at most this
REPETITIONS = 4000          # runs per world for the counts
PILOT = 1000                # runs per world that choose the statistic and the event
MAX_THRESHOLDS = 256        # a statistic with more distinct values is cut at quantiles
# the server views (TrustModel.server_view) this audit knows; "masked" is read as the sum the masks let through
VIEWS = ("messages", "shuffled", "aggregate", "masked")
SUMS = ("aggregate", "masked")
# every registered trust model whose view it knows, in the order of the views (local, shuffle, central)
TRUSTS = tuple(sorted((name for name in TRUST_MODELS if TRUST_MODELS[name].server_view in VIEWS),
                      key=lambda name: (VIEWS.index(TRUST_MODELS[name].server_view), name)))


class AuditError(RuntimeError):
    """The round contradicts what the algorithm declares (not a refusal: a finding)."""


def ldp_algorithms() -> list[str]:
    """The registered local-DP algorithms (built-ins and installed plugins), by name."""
    return sorted(name for name in REGISTRY if REGISTRY[name].privacy_model == "ldp")


# ---- the round and its two worlds -----------------------------------------------------------------------------------
class NeighbourEnv:
    """The env as the audit's rounds see it: every user's data from one fixed stream (the `nature` generator the
    population step passes is ignored), the canary's reward set to sign * c_r (a reward of several entries, as
    two-point feedback, with alternating signs) and its contexts scaled to the public bound. The rest is the env's."""

    def __init__(self, env, data_seed: int, position: int, sign: float, c_r: float, context_bound: float | None):
        self.env, self.data_seed, self.position = env, data_seed, position
        self.sign, self.c_r, self.context_bound = sign, c_r, context_bound
        self._nature = None
        self.reward_shape, self.has_contexts = None, None

    def __getattr__(self, name):
        return getattr(self.env, name)

    def contexts(self, users, rng):
        self._nature = derive(self.data_seed, "context", 0, 0)
        self.row = int(np.searchsorted(users, self.position))     # the canary's row among the round's senders
        contexts = self.env.contexts(users, self._nature)
        self.has_contexts = contexts is not None
        if contexts is None or self.context_bound is None:
            return contexts
        contexts = np.array(contexts, dtype=float, copy=True)
        x = contexts[self.row]
        norms = np.linalg.norm(x, axis=-1, keepdims=True)
        # at the bound's edge, a hair inside so that a client's clip leaves it alone
        scale = np.where(norms > 0, self.context_bound * (1 - 1e-12) / np.where(norms > 0, norms, 1.0), 1.0)
        contexts[self.row] = x * scale
        return contexts

    def step(self, contexts, actions, users, rng):
        rewards, regret = self.env.step(contexts, actions, users, self._nature)
        rewards = np.array(rewards, dtype=float, copy=True)
        shape = np.shape(rewards[self.row])
        self.reward_shape = shape
        signs = np.where(np.arange(int(np.prod(shape, dtype=int))) % 2 == 0, 1.0, -1.0).reshape(shape)
        rewards[self.row] = self.sign * self.c_r * signs
        return rewards, regret


@dataclass
class Setup:
    """One audited round: the run's config, its algorithm, the two worlds, the canary, the view and the claim."""
    config: RunConfig
    algo: object
    worlds: tuple            # (NeighbourEnv a, NeighbourEnv b)
    model: dict
    users: np.ndarray
    canary: int
    group: int | None        # the canary's randomizer group in its share (shuffle)
    share: int               # the canary's shuffler
    keys: list               # shuffle: the public fields the server groups messages by
    key_values: np.ndarray | None
    summary: dict            # privacy_summary: the run's reported guarantee
    accounting: str

    @property
    def pair(self) -> str:
        world = self.worlds[0]
        c_r = world.c_r
        pair = f"canary reward +{c_r:g} vs -{c_r:g}" + (" (entries of alternating sign)" if world.reward_shape else "")
        if world.has_contexts and world.context_bound is not None:
            pair += f"; its contexts the same, at norm {world.context_bound:g}"
        return pair


def _whole_batch(config: RunConfig, env, built):
    """The algorithm as a shuffled run built it before randomizer groups: eps0 for the whole round's batch (`built`:
    the run as the system builds it today, whose trust state it takes)."""
    cls, world = REGISTRY[config.algorithm], env.public()
    plan = shuffle_plan(config, pure=all(float(row["delta"]) == 0.0 for row in cls(world, config).ledger()))
    local = config.replace(eps=plan.eps0, delta=plan.delta0 if plan.delta0 else config.delta, trust=LOCAL,
                           trust_options={})
    algo = cls(world, local)
    if "trust" in vars(built):
        algo.trust = built.trust
    algo.shuffle = plan
    check_shuffled(algo)
    check_instance(algo)
    return algo


def _smallest_groups(algo, config, users) -> list[tuple[int, int, int]]:
    """(size, first user, shuffler) of the smallest randomizer groups of any share (`algo.randomizer_groups`), or of
    the last user when the round is one randomizer (past any warm-up)."""
    try:
        labels = algo.randomizer_groups(users)
    except NotImplementedError:
        labels = None
    n = len(users)
    if labels is None:
        s = config.shufflers - 1
        lo, hi = share_bounds(n, s, config.shufflers)
        return [(hi - lo, int(users[-1]), s)]
    found = []
    for s in range(config.shufflers):
        lo, hi = share_bounds(n, s, config.shufflers)
        if hi > lo:
            _, first, counts = np.unique(labels[lo:hi], return_index=True, return_counts=True)
            found += [(int(c), int(users[lo + f]), s) for c, f in zip(counts, first)]
    smallest = min(size for size, _, _ in found)
    return sorted(group for group in found if group[0] == smallest)


def build(algorithm: str, trust: str, *, eps: float, delta: float, users: int, seed: int, shufflers: int = 1,
          small_groups: str = "no-amplification", whole_batch: bool = False, env: str | None = None,
          env_params: dict | None = None, params: dict | None = None, canary: int | None = None,
          trust_options: dict | None = None, federation: str = "ideal",
          federation_options: dict | None = None) -> Setup:
    """The audited round (ConfigError when the system refuses the run: the reason names it). Under a federation
    model the round's users are those who send in it (its absent and lost users are in no view): the canary is
    chosen among them, so it always sends."""
    where = trust_model(trust)
    if where.server_view not in VIEWS:
        raise ConfigError("trust", trust, f"the server audit knows the server views {list(VIEWS)}")
    if whole_batch and not where.shuffles:
        raise ConfigError("whole_batch", whole_batch, "the whole-batch accounting is the shuffle model's")
    taken = {name: value for name, value in (("shufflers", shufflers), ("small_groups", small_groups))
             if name in where.options}             # the options only that trust model takes
    config = RunConfig(algorithm, env=env, users=users, round_size=users, eps=eps, delta=delta, seed=seed,
                       env_params=dict(env_params or {}), params=dict(params or {}), trust=trust,
                       trust_options={**taken, **(trust_options or {})}, federation=federation,
                       federation_options=dict(federation_options or {}))
    if federation != "ideal" and config.shufflers != 1:
        raise ConfigError("shufflers", config.shufflers, "the audit under a federation model runs one shuffler")
    real_env = make_env(config)
    algo = make_algorithm(real_env, config)
    if whole_batch:
        algo = _whole_batch(config, real_env, algo)
    if algo.privacy_model != "ldp":
        raise ConfigError("algorithm", algorithm, "not a local-DP algorithm: its users send no randomized message")
    summary = privacy_summary(config, algo)
    round_users = round_senders(federation_model(config), 0, 0, users, 1)
    if canary is not None and int(canary) not in set(round_users.tolist()):
        raise ConfigError("canary", canary, f"does not send in the audited round under the {federation} federation "
                                            f"model: its data reaches no view (choose a user who sends, or none)")
    model = algo.publish(algo.initial_state(derive(seed, "init")))
    c_r = float(algo.world.reward_bound)
    bound = algo.world.context_bound if algo.world.name != "sparse-linear" else None   # sparse: per coordinate
    keys = sorted(key for key in algo.message_spec() if key in algo.public_fields and key not in algo.public_draws)
    accounting = "whole batch" if whole_batch else "randomizer groups"
    candidates = ([(None, int(canary), next(s for s in range(config.shufflers)
                                            if share_bounds(users, s, config.shufflers)[1] > int(canary)))]
                  if canary is not None else _smallest_groups(algo, config, round_users))
    best = None
    for size, user, share in candidates:
        worlds = tuple(NeighbourEnv(real_env, seed, user, sign, c_r, bound) for sign in (1.0, -1.0))
        setup = Setup(config, algo, worlds, model, round_users, user, size if where.shuffles else None, share, keys,
                      None, summary, accounting)
        setup.key_values, alike = _public_values(setup)
        # of the smallest declared groups, the one whose public fields the fewest messages of its share show (a
        # declared group may be finer than what the server tells apart: finer is safe)
        if best is None or alike < best[0]:
            best = (alike, setup)
    return best[1]


def _flat(fields: dict, keys=None) -> np.ndarray:
    """(n, m): the fields (all, in name order, or `keys`) of n messages side by side, each flattened."""
    names = sorted(fields) if keys is None else keys
    n = len(next(iter(fields.values())))
    return np.concatenate([np.asarray(fields[key], dtype=float).reshape(n, -1) for key in names], axis=1)


def _public_values(setup: Setup) -> tuple[np.ndarray | None, int]:
    """(the canary's public fields the server groups by, how many messages of its share show them). They are
    fixed by the public schedule, so the same in both worlds and every run: checked on a few runs (a field that
    varied would carry the canary's coins or data)."""
    lo, hi = share_bounds(len(setup.users), setup.share, setup.config.shufflers)
    seen, alike = set(), hi - lo
    for r in range(4 if setup.keys else 1):
        for world in setup.worlds:
            messages, _, _ = simulate_population(setup.algo, world, setup.model, _seed(setup.config.seed, 9, r), 0, 0,
                                                 setup.users, pre_aggregate=False)
            if not setup.keys:        # (the run taught the worlds the reward's shape and whether there are contexts)
                return None, alike
            public = _flat(messages, setup.keys)
            values = public[setup.canary]
            seen.add(values.tobytes())
            if r == 0 and world is setup.worlds[0]:
                alike = int((public[lo:hi] == values).all(axis=1).sum())
    if len(seen) != 1:
        raise AuditError(f"{setup.algo.name}: the canary's public fields {setup.keys} change between runs or with its "
                         f"data: they are not fixed by the public schedule (nor declared public_draws)")
    return values, alike


def _seed(seed: int, phase: int, r: int) -> int:
    return int(np.random.SeedSequence([int(seed), 7_400 + phase, int(r)]).generate_state(1, np.uint64)[0])


def server_view(setup: Setup, world: int, seed_r: int) -> np.ndarray:
    """One run of the round in world 0 (a) or 1 (b) with repetition seed seed_r: the server's view as a flat vector."""
    algo, config, users = setup.algo, setup.config, setup.users
    view = trust_model(config).server_view
    payload, _, _ = simulate_population(algo, setup.worlds[world], setup.model, seed_r, 0, 0, users,
                                        pre_aggregate=view in SUMS)
    if view == "messages":
        row = int(np.searchsorted(users, setup.canary))      # the canary's message (users: the senders, in order)
        return _flat({key: value[row:row + 1] for key, value in payload.items()})[0]
    if view in SUMS:        # the round's sum as the server's half forms it (ldpfed.trust.base's hooks)
        trust = algo.trust_model()
        aggregate = trust.decode(algo, algo.sum_layout().join(payload), 0, config.users)    # the round's clock
        noise = trust.server_noise(algo, payload, 0, config.users, derive(seed_r, "server", 0))
        return aggregate if noise is None else aggregate + noise
    # shuffle: the canary's shuffler share, as shuffled_sums cuts, checks and permutes it
    n, s = len(users), setup.share
    share = join_pieces([shuffler_pieces(payload, users, 0, n, config.shufflers)[s]])
    lo, hi = share_bounds(n, s, config.shufflers)
    check_groups(algo, 0, users[lo:hi], share)
    chunks = shuffle_share(seed_r, 0, s, share)
    multiset = {key: np.concatenate([chunk[key] for chunk in chunks]) for key in share}
    if setup.keys:         # what the server tells apart: the public fields that no user draws
        mask = (_flat(multiset, setup.keys) == setup.key_values).all(axis=1)
        multiset = {key: value[mask] for key, value in multiset.items()}
    aggregate = anonymous_aggregate(algo, multiset)
    return _flat({key: np.asarray(value)[None] for key, value in aggregate.items()})[0]


def views(setup: Setup, phase: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(world a's views, world b's views), (count, m) each; run r of both worlds shares its seed."""
    a, b = [], []
    for r in range(count):
        seed_r = _seed(setup.config.seed, phase, r)
        a.append(server_view(setup, 0, seed_r))
        b.append(server_view(setup, 1, seed_r))
    return np.asarray(a, dtype=float), np.asarray(b, dtype=float)


# ---- the test -------------------------------------------------------------------------------------------------------
def statistic(pilot_a: np.ndarray, pilot_b: np.ndarray):
    """(centre, direction) of the linear statistic (view - centre) @ direction, or None when no coordinate moves:
    the mean shift over the variance, per coordinate (a coordinate without noise weighs most)."""
    shift = (pilot_b - pilot_a).mean(axis=0)
    var = 0.5 * (pilot_a.var(axis=0) + pilot_b.var(axis=0))
    positive = var[var > 0]
    direction = shift / np.maximum(var, 1e-6 * float(positive.min()) if positive.size else 1.0)
    if not np.isfinite(direction).all() or not direction.any():
        return None
    return 0.5 * (pilot_a.mean(axis=0) + pilot_b.mean(axis=0)), direction


def choose_event(stat_a: np.ndarray, stat_b: np.ndarray, delta: float, alpha: float):
    """(tau, upper, pilot bound): the threshold event with the largest bound on the pilot; upper: "stat > tau"
    (likelier in world b), else "stat <= tau" (likelier in world a)."""
    pooled = np.concatenate([stat_a, stat_b])
    values = np.unique(pooled)
    if len(values) < 2:
        return None
    if len(values) <= MAX_THRESHOLDS:
        taus = 0.5 * (values[1:] + values[:-1])
    else:
        q = np.concatenate([[0.001, 0.002, 0.005], np.linspace(0.01, 0.99, 99), [0.995, 0.998, 0.999]])
        taus = np.unique(np.quantile(pooled, q))
    a, b = np.sort(stat_a), np.sort(stat_b)
    best = (float(np.median(pooled)), True, 0.0)      # when the pilot shows nothing: the median
    for tau in taus:
        above_a = len(a) - np.searchsorted(a, tau, side="right")
        above_b = len(b) - np.searchsorted(b, tau, side="right")
        for upper, (k_hi, n_hi, k_lo, n_lo) in ((True, (above_b, len(b), above_a, len(a))),
                                                (False, (len(a) - above_a, len(a), len(b) - above_b, len(b)))):
            bound = eps_lower_bound(k_hi, n_hi, k_lo, n_lo, delta, alpha)
            if bound > best[2]:
                best = (float(tau), upper, bound)
    return best


def describe_view(setup: Setup) -> str:
    view = trust_model(setup.config).server_view
    if view == "messages":
        return "the canary's message (per-user mode)"
    if view == "aggregate":
        return "the round's noisy aggregate"
    if view == "masked":
        return "the round's unmasked sum (masked messages are uniform in Z_m whatever the data)"
    by = f" with the canary's {', '.join(setup.keys)}" if setup.keys else ""
    return f"the shuffled share: aggregate of its messages{by}"


def audit_server_view(algorithm: str, trust: str, *, eps: float = 1.0, delta: float = 1e-5, users: int = 100,
                      repetitions: int = REPETITIONS, pilot: int | None = None, seed: int = 0,
                      alpha: float = AUDIT_ALPHA, **options) -> dict:
    """The audit of one algorithm under one trust model (see the module doc); options: shufflers, small_groups,
    whole_batch, env, env_params, params, canary. ConfigError when the system refuses the run.

    Returns {algorithm, trust, claimed_eps, claimed_delta, lower_bound, flagged (lower_bound > claimed_eps), canary,
    group, view, eps0 (the users' local randomizer), amplified, accounting, pair, event, counts (k in the likelier
    world, k in the other), repetitions, pilot, users, delta, alpha, seconds}."""
    started = time.perf_counter()
    pilot = min(repetitions, PILOT) if pilot is None else int(pilot)
    with limited():
        setup = build(algorithm, trust, eps=eps, delta=delta, users=users, seed=seed, **options)
        summary = setup.summary
        result = {"algorithm": algorithm, "trust": trust, "claimed_eps": float(summary["privacy_eps_composed"]),
                  "claimed_delta": float(summary["privacy_delta_composed"]), "lower_bound": 0.0, "flagged": False,
                  "canary": setup.canary, "group": setup.group, "view": describe_view(setup),
                  "eps0": float(setup.algo.eps), "amplified": summary.get("privacy_shuffle_amplified"),
                  "accounting": setup.accounting if trust_model(trust).shuffles else None, "pair": setup.pair,
                  "event": None, "counts": None, "repetitions": int(repetitions), "pilot": pilot, "users": users,
                  "delta": float(delta), "alpha": float(alpha)}
        pilot_a, pilot_b = views(setup, 1, pilot)
        chosen = statistic(pilot_a, pilot_b)
        if chosen is not None:
            centre, direction = chosen
            event = choose_event((pilot_a - centre) @ direction, (pilot_b - centre) @ direction, delta, alpha)
            if event is not None:
                tau, upper, _ = event
                final_a, final_b = views(setup, 2, repetitions)
                stat_a, stat_b = (final_a - centre) @ direction, (final_b - centre) @ direction
                if upper:
                    k_hi, k_lo = int(np.count_nonzero(stat_b > tau)), int(np.count_nonzero(stat_a > tau))
                else:
                    k_hi, k_lo = int(np.count_nonzero(stat_a <= tau)), int(np.count_nonzero(stat_b <= tau))
                bound = eps_lower_bound(k_hi, repetitions, k_lo, repetitions, delta, alpha)
                result.update(lower_bound=float(bound), flagged=bool(bound > result["claimed_eps"]),
                              event=f"statistic {'>' if upper else '<='} {tau:.4g}", counts=(k_hi, k_lo))
    result["seconds"] = time.perf_counter() - started
    return result


def audit_table(algorithms=None, trusts=None, **options) -> list[dict]:
    """audit_server_view for every algorithm (default: every LDP one) under every trust model; a refused run is a
    row {algorithm, trust, refused: the reason}."""
    rows = []
    for name in algorithms or ldp_algorithms():
        for trust in (trusts or TRUSTS):
            try:
                rows.append(audit_server_view(name, trust, **options))
            except ConfigError as error:
                rows.append({"algorithm": name, "trust": trust, "refused": error.reason, "field": error.field})
    return rows
