"""Who of a round acts and whose messages reach the server in it, under a federation model: the one place a round's
users are formed, for the engines' populations and shard plans and for the trust models' accounting alike."""
from __future__ import annotations

import numpy as np

from ldpfed.federation.base import LOST


def population_users(start: int, stop: int, population: int, populations: int, shares=None) -> np.ndarray:
    """Global indices of the users of round [start, stop) that belong to `population`: equal shares, or the
    relative sizes `shares` (one positive number per population: a federation model's `shares()`)."""
    n = stop - start
    if shares is None:
        return np.arange(start + n * population // populations, start + n * (population + 1) // populations)
    edges = population_edges(n, shares)
    return np.arange(start + edges[population], start + edges[population + 1])


def population_edges(n: int, shares) -> np.ndarray:
    """Where n users are cut into populations of relative sizes `shares`: P + 1 integer edges, 0 first, n last."""
    cumulative = np.cumsum(np.asarray(shares, dtype=float))
    return np.concatenate([[0], np.floor(n * cumulative / cumulative[-1] + 1e-9).astype(np.int64)]).clip(0, n)


def round_users(federation, round_index: int, start: int, stop: int, population: int, populations: int) -> np.ndarray:
    """The users of round [start, stop) in `population` who take part under the run's federation model
    (ldpfed.federation; None or an ideal one: all of them). The one place a round's users are formed, for the local
    backend, the Ray population actors and the shard plans alike: a user not in it neither acts nor sends."""
    if federation is None or federation.ideal:
        return population_users(start, stop, population, populations)
    users = population_users(start, stop, population, populations, federation.shares())
    if len(users) == 0:
        return users
    return federation.present(round_index, population, users)


def message_delays(federation, round_index: int, population: int, users: np.ndarray) -> np.ndarray | None:
    """Per present user, the rounds its message is late (0 on time, federation.LOST never), or None: all on time."""
    if federation is None or federation.ideal or len(users) == 0:
        return None
    delays = federation.delays(round_index, population, users)
    if delays is None:
        return None
    delays = np.asarray(delays, dtype=np.int64)
    if delays.shape != users.shape or (delays < LOST).any():
        raise ValueError(f"federation model {federation.name}: delays must be one int >= {LOST} per present user")
    return None if not delays.any() else delays


def on_time_users(federation, round_index: int, start: int, stop: int, population: int, populations: int):
    """The users of a population's share of a round whose messages reach the server in that round: what a shard
    of the Ray engine expects from the population."""
    users = round_users(federation, round_index, start, stop, population, populations)
    delays = message_delays(federation, round_index, population, users)
    return users if delays is None else users[delays == 0]


def round_senders(federation, round_index: int, start: int, stop: int, populations: int) -> np.ndarray:
    """The users of round [start, stop) whose messages reach the server in that round, every population's, in user
    order (a population's users are a contiguous block of the round, in population order). The last round asked
    for is kept on the model: a round's shard plan, shufflers and secure aggregation ask for it again and again."""
    key = (round_index, start, stop, populations)
    kept = federation.__dict__.get("_round_senders")
    if kept is not None and kept[0] == key:
        return kept[1]
    parts = [on_time_users(federation, round_index, start, stop, p, populations) for p in range(populations)]
    senders = np.concatenate(parts) if parts else np.arange(0)
    senders.setflags(write=False)          # shared by every caller of the round
    federation._round_senders = (key, senders)
    return senders
