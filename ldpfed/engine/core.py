"""What both engines share: how a round's users are split, what a population does, how results are kept."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import pandas as pd

from ldpfed.algorithms import make_algorithm
from ldpfed.trust.shuffling import anonymous_aggregate, check_groups, share_bounds, shuffle_share
from ldpfed.trust import trust_model
from ldpfed.envs import make_env
from ldpfed.federation.base import LOST
from ldpfed.federation.rounds import (message_delays, on_time_users, population_edges,  # noqa: F401
                                     population_users, round_users)
from ldpfed.util.jit import compile_seconds
from ldpfed.util.rng import derive


# The per-round table's first columns, in order (metric counters follow): what every engine's RunResult.table has.
TABLE_COLUMNS = ("round", "users", "regret", "cumulative_regret", "estimation_error")


def round_bounds(round_index: int, round_size: int, users: int) -> tuple[int, int]:
    """The users [start, stop) of round `round_index`: rounds of `round_size`, the last one possibly shorter.
    The one place round bounds are computed (engines, shard plans, jobs)."""
    start = round_index * round_size
    return start, min(users, start + round_size)


class LateSum(NamedTuple):
    """Messages of one population's users of one round that reach the server `arrival` rounds later: their sum
    (post-processing of privatized values) and their users (public), for the server's check of the sum."""

    arrival: int
    users: np.ndarray
    sums: dict


def population_round(federation, algo, env, model, seed: int, round_index: int, population: int,
                     users: np.ndarray, pre_aggregate: bool = True):
    """One population's present users for one round under the run's federation model: (payload of the messages on
    time, regret, metrics, late sums, the users on time). The population's own world acts (federation.world); the
    messages of late users are summed per arrival round (LateSum); lost ones are dropped. Without delays this is
    simulate_population."""
    world = env if federation is None else federation.world(env, population)
    delays = message_delays(federation, round_index, population, users)
    if delays is None:
        payload, regret, metrics = simulate_population(algo, world, model, seed, round_index, population, users,
                                                       pre_aggregate)
        if federation is not None and (federation.late or federation.loses):
            metrics = {**metrics, "users_late": 0, "users_lost": 0}
        return payload, regret, metrics, (), users
    messages, regret, metrics = simulate_population(algo, world, model, seed, round_index, population, users,
                                                    pre_aggregate=False)
    metrics = {**metrics, "users_late": int((delays > 0).sum()), "users_lost": int((delays == LOST).sum())}
    late = []
    for delay in np.unique(delays[delays > 0]):
        keep = delays == delay
        if messages:
            late.append(LateSum(round_index + int(delay), users[keep],
                                algo.aggregate({k: v[keep] for k, v in messages.items()}, users[keep])))
    keep = delays == 0
    on_time = users[keep]
    payload = {k: v[keep] for k, v in messages.items()} if messages and len(on_time) else {}
    if payload and pre_aggregate:
        payload = algo.aggregate(payload, on_time)
    return payload, regret, metrics, tuple(late), on_time


def empty_aggregate(algo) -> dict:
    """The aggregate of a round in which no user took part (a federation model's empty round): zeros of the shapes
    of the algorithm's aggregate (read from the aggregate of one zero message), as float64 sums, so the server's
    update runs on its clock as in any round."""
    spec = algo.message_spec()
    if not spec:
        return {}
    probe = algo.aggregate({key: np.zeros((1, *shape)) for key, shape in spec.items()}, np.zeros(1, dtype=np.int64))
    return {key: np.zeros(np.shape(value)) for key, value in probe.items()}


def simulate_population(algo, env, model, seed: int, round_index: int, population: int, users: np.ndarray,
                        pre_aggregate: bool = True):
    """One population's users for one round: contexts, arms, rewards, privatized messages.

    Returns (payload, regret_sum, metrics): payload is the per-user messages, or their sums when pre_aggregate
    (post-processing of privatized values, so the same privacy). Regret and metrics are simulation-only.
    """
    nature = derive(seed, "context", population, round_index)   # contexts and rewards: same for every algorithm
    client = derive(seed, "privatize", population, round_index)  # the users' own randomness
    contexts = env.contexts(users, nature)
    actions = algo.act(model, contexts, users, client)
    rewards, regret = env.step(contexts, actions, users, nature)
    messages, metrics = algo.encode(model, contexts, actions, rewards, users, client)
    payload = algo.aggregate(messages, users) if pre_aggregate else messages
    return payload, float(regret.sum()), metrics


def sample_messages(config, n_users: int) -> tuple[np.ndarray, dict]:
    """(users, per-user messages) of the first `n_users` users of round 0 in population 0, from a separate
    instance of the algorithm (a probe must not disturb the run's server half): what plans are built from."""
    env = make_env(config)
    client = make_algorithm(env, config)
    users = np.arange(min(config.users, n_users), dtype=np.int64)
    model = client.publish(client.initial_state(derive(config.seed, "init")))
    messages, _, _ = simulate_population(client, env, model, config.seed, 0, 0, users, pre_aggregate=False)
    return users, messages


class PopulationRow(NamedTuple):
    """What one population reports to the driver for one round, beside its messages: simulation-only numbers that
    never go to the server."""

    population: int
    regret: float          # the population's pseudo-regret this round
    metrics: dict          # counters of the client half (e.g. clipped users)
    sending: int           # users whose messages were sent in the round (0 when the algorithm sent nothing)
    served: int = 0        # users who took part (acted) this round
    late: tuple = ()       # LateSums: this round's messages that reach the server in a later round

    @classmethod
    def of(cls, population: int, users, payload, regret: float, metrics: dict, late: tuple = (),
           on_time=None) -> "PopulationRow":
        """users: who acted; on_time: whose messages are in the round's payload (default: all of them)."""
        sent = len(users if on_time is None else on_time)
        return cls(population, regret, metrics, sent if payload else 0, len(users), late)


def combine_populations(rows) -> tuple[float, dict, int]:
    """A round's (regret, metric counters, users that sent messages) from its PopulationRows, added in population
    order: both engines add in this one order, which keeps their results bit-identical."""
    regret, metrics, sending = 0.0, {}, 0
    for row in sorted(rows, key=lambda row: row.population):
        regret += row.regret
        sending += row.sending
        for key, value in row.metrics.items():
            metrics[key] = metrics.get(key, 0) + value
    return regret, metrics, sending


def add_sums(total: dict | None, part: dict) -> dict:
    """Field-wise sum of aggregated messages (shapes must agree field by field): `total` (None: nothing yet) plus
    `part`, in place, as float64. The one place two message dicts are added (engines, shards, jobs), so every
    sum is taken in the same order with the same dtype, which keeps the engines bit-identical."""
    if total is None:
        return {key: np.array(value, dtype=float, copy=True) for key, value in part.items()}
    for key, value in part.items():
        if key in total:
            total[key] += value
        else:
            total[key] = np.array(value, dtype=float, copy=True)
    return total


# ---- the shuffle trust model (ldpfed.trust.shuffling): what populations, shufflers and the reference engine do
def shuffler_pieces(payload: dict, users: np.ndarray, start: int, stop: int, shufflers: int) -> list[dict | None]:
    """One population's messages (of its sending users, in user order) cut by shuffler share: one piece per shuffler
    (None: none of the population's senders is in that share)."""
    positions = np.asarray(users, dtype=np.int64) - start     # sorted; a gap where a user did not send
    pieces = []
    for s in range(shufflers):
        lo, hi = share_bounds(stop - start, s, shufflers)
        a, b = np.searchsorted(positions, lo), np.searchsorted(positions, hi)
        pieces.append({key: value[a:b] for key, value in payload.items()} if a < b else None)
    return pieces


def join_pieces(pieces: list) -> dict:
    """A shuffler's share from its pieces, given in population order (which is user order)."""
    return {key: np.concatenate([piece[key] for piece in pieces]) for key in pieces[0]}


def shuffled_sums(algo, config, round_index: int, populations: list) -> dict:
    """The round's aggregate under the shuffle model, as the shuffler actors and shards of the Ray engine compute it:
    populations = [(users, messages)] in population order; each shuffler's share permuted and cut into chunks
    (ldpfed.trust.shuffling), each chunk aggregated without its users, the chunks added in (shuffler, chunk)
    order."""
    if not populations:
        return {}
    start, stop = round_bounds(round_index, config.round_size, config.users)
    cut = [shuffler_pieces(messages, users, start, stop, config.shufflers) for users, messages in populations]
    total = None
    for s in range(config.shufflers):
        parts = [pieces[s] for pieces in cut if pieces[s] is not None]
        if not parts:           # no one of this share sent (a federation model's dropouts)
            continue
        share = join_pieces(parts)
        lo, hi = share_bounds(stop - start, s, config.shufflers)
        senders = np.concatenate([users for users, _ in populations])
        check_groups(algo, round_index, senders[(senders >= start + lo) & (senders < start + hi)], share)
        for chunk in shuffle_share(config.seed, round_index, s, share):
            total = add_sums(total, anonymous_aggregate(algo, chunk))
    return total


def checkpoint_rounds(rounds: int, points: int = 2000) -> set[int]:
    """Rounds at which the (costly) estimation error is measured: evenly spread, always the last."""
    return set(np.unique(np.linspace(0, rounds - 1, min(rounds, points)).astype(int)).tolist())


def privacy_summary(config, algo) -> dict:
    """One user's guarantee over the whole run, as the run's trust model accounts it (the summary entries; empty
    without privacy). Every engine calls it before simulating anyone: a run whose guarantee exceeds the configured
    (eps, delta) is refused (ConfigError naming eps or delta)."""
    return (algo.trust or trust_model(config)).summary(config, algo)


@dataclass
class RunResult:
    config: object
    table: pd.DataFrame          # one row per round
    ledger: list                 # privacy guarantees of the mechanisms that ran, with message counts
    summary: dict                # final regret, users per second, counters
    env: dict = field(default_factory=dict)
    state: object = None         # the server's final state (for inspection and tests)


class RoundRecorder:
    """Collects per-round simulation metrics and builds the result table; memory grows with rounds, not users."""

    def __init__(self, config, algo, env):
        self.config, self.algo, self.env = config, algo, env
        self.rows: list[tuple] = []
        self.metric_rows: list[dict] = []
        self.cumulative = 0.0
        self.checkpoints = checkpoint_rounds(config.rounds)
        self.privacy = privacy_summary(config, algo)     # refuses an overspending run before any user
        self.started = time.perf_counter()
        self.compiled_before = compile_seconds()        # numba's compile time in this process so far
        self.messages = 0

    def record(self, round_index, stop, regret, metrics, state, users_with_messages):
        self.cumulative += regret
        self.messages += users_with_messages
        error = np.nan
        if round_index in self.checkpoints:
            value = self.env.estimation_error(self.algo.estimate(state))
            error = np.nan if value is None else value
        self.rows.append((round_index, stop, regret, self.cumulative, error))
        self.metric_rows.append(metrics)

    def snapshot(self) -> dict:
        """What a checkpoint keeps to continue the table bit for bit: the rows as columns, the metric counters
        (plain Python numbers, which build the same table), the running sums."""
        columns = list(zip(*self.rows)) if self.rows else [()] * 5
        table = {name: np.asarray(values, dtype=dtype) for name, values, dtype in zip(
            TABLE_COLUMNS, columns,
            (np.int64, np.int64, np.float64, np.float64, np.float64))}
        plain = [{k: (v.item() if isinstance(v, np.generic) else v) for k, v in m.items()} for m in self.metric_rows]
        return {"table": table, "metric_rows": plain, "cumulative": self.cumulative, "messages": self.messages}

    def restore(self, snapshot: dict) -> None:
        table = snapshot["table"]
        self.rows = list(zip(*(table[c].tolist() for c in TABLE_COLUMNS)))
        self.metric_rows = list(snapshot["metric_rows"])
        self.cumulative, self.messages = float(snapshot["cumulative"]), int(snapshot["messages"])

    def result(self, state, engine: str, extra: dict | None = None) -> RunResult:
        elapsed = time.perf_counter() - self.started
        table = pd.DataFrame(self.rows, columns=list(TABLE_COLUMNS))
        metrics = pd.DataFrame(self.metric_rows).fillna(0)
        for column in metrics.columns:
            table[column] = metrics[column].to_numpy()
        return make_result(self.config, self.algo, self.env, table, state, engine=engine, elapsed=elapsed,
                           final_regret=self.cumulative, privacy=self.privacy, messages=self.messages, extra=extra,
                           compile_s=compile_seconds() - self.compiled_before)


def make_result(config, algo, env, table: pd.DataFrame, state, *, engine: str, elapsed: float, final_regret: float,
                privacy: dict, messages: int, extra: dict | None = None, compile_s: float = 0.0) -> RunResult:
    """The RunResult of a finished run from its per-round table (TABLE_COLUMNS, then the metric counters): the one
    place the summary's keys are made, for every engine. `elapsed`: the run's wall time; `compile_s`: the part of it
    numba spent compiling or loading compiled code in this process (ldpfed.util.jit.compile_seconds; a Ray run's actors
    compile in their own), which the rates (users_per_s, messages_per_s) leave out: they are the simulation's."""
    errors = table["estimation_error"].dropna()
    simulated = elapsed - min(max(compile_s, 0.0), elapsed)
    rate = (lambda count: count / simulated if simulated > 0 else float("inf"))  # noqa: E731
    counters = [c for c in table.columns if c not in TABLE_COLUMNS]
    summary = {
        "algorithm": config.algorithm, "env": config.env, "eps": config.eps,
        "delta": config.delta, "seed": config.seed, "users": config.users,
        "round_size": config.round_size, "engine": engine,
        "final_regret": float(final_regret),
        "final_estimation_error": float(errors.iloc[-1]) if len(errors) else None,
        "elapsed_s": elapsed, "compile_s": compile_s, "users_per_s": rate(config.users),
        **{f"total_{c}": float(table[c].sum()) for c in counters},
        **privacy,
        **(extra or {}),
    }
    if "messages_per_s" in summary:
        summary["messages_per_s"] = rate(messages)
    caveat = algo.round_size_caveat()
    if caveat:
        summary["round_size_caveat"] = str(caveat)
    ledger = [{**row, "users_sending": messages} for row in algo.ledger()] + \
        (algo.trust or trust_model(config)).ledger_rows(algo)
    return RunResult(config, table, ledger, summary, env.describe(), state)
