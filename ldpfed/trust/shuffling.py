"""The shuffle plan of the "shuffle" trust model, written once: which users of a round go to which shuffler, how a
shuffler permutes its share, how it cuts it into chunks, and which shard gets each chunk. Pure functions of
(seed, round, shuffler) and the public round bounds, so every engine (run_local, the Ray engine's shuffler actors)
and the accounting (the batch of a shuffler) compute the same thing.

* Shuffler s of S gets the round's users at positions [n s // S, n (s + 1) // S) (n users in the round): contiguous
  shares whose sizes differ by at most one (the remainder n mod S is spread one user each, by the floor split:
  10 users among 3 shufflers get 3, 3, 4). The accounting's batch is the smallest share, n // S.
* It permutes its share with `derive(seed, "shuffle", round, shuffler)`, drops who sent what, and cuts the
  permuted messages into chunks of CHUNK_MESSAGES (the last one shorter): chunk c goes to shard (s + c) % shards.
* A shuffler hides a user only among the users of its share that run the same local randomizer (FMT's
  amplification holds among identical randomizers): the algorithm's `randomizer_groups` labels them, and
  `smallest_groups` gives the accounting each round's smallest group. `check_groups` is the shuffler's guard: a
  public field that differs inside a declared group stops the run (the declaration was wrong, the claim false).
* The round's aggregate is the sum of the chunks' aggregates in (shuffler, chunk) order (`core.add_sums`); each
  chunk's aggregate is `anonymous_aggregate`: the server does not know its users.
"""
from __future__ import annotations

import numpy as np

from ldpfed.federation.rounds import round_senders
from ldpfed.util.rng import derive

# Messages per chunk a shuffler forwards. Part of the results' bits (the sums are grouped by chunk), so it is a
# constant, not an engine option: every engine groups the same way.
CHUNK_MESSAGES = 1024
# What the server's `aggregate` is told about the users of a chunk: nothing (an index no user has).
UNKNOWN_USER = -1


def share_bounds(n_users: int, shuffler: int, shufflers: int) -> tuple[int, int]:
    """Positions [lo, hi) within a round of n_users of the users that shuffler `shuffler` of `shufflers` mixes."""
    return n_users * shuffler // shufflers, n_users * (shuffler + 1) // shufflers


def smallest_share(n_users: int, shufflers: int) -> int:
    """The fewest users a shuffler mixes in a round of n_users: the anonymity set (the accounting's batch)."""
    return n_users // shufflers


def group_sizes(labels: np.ndarray | None, size: int) -> np.ndarray:
    """Users per randomizer group among `size` users labelled `labels` (None: one group of all)."""
    if labels is None:
        return np.array([size], dtype=np.int64)
    return np.unique(labels, return_counts=True)[1]


def smallest_groups(algo, n_users: int, round_size: int, shufflers: int) -> tuple[np.ndarray, np.ndarray]:
    """(smallest, largest): per round, the fewest and the most users one shuffler's share holds of one randomizer
    group (`algo.randomizer_groups`): the anonymity set of the round's worst-off user, and the largest batch any
    user is shuffled in. Labels are computed round by round, so memory follows the round size."""
    rounds = -(-n_users // round_size)
    smallest, largest = np.empty(rounds, dtype=np.int64), np.empty(rounds, dtype=np.int64)
    for r in range(rounds):
        start = r * round_size
        stop = min(start + round_size, n_users)
        labels = algo.randomizer_groups(np.arange(start, stop, dtype=np.int64))
        sizes = []
        for s in range(shufflers):
            lo, hi = share_bounds(stop - start, s, shufflers)
            if hi > lo:
                sizes.append(group_sizes(None if labels is None else labels[lo:hi], hi - lo))
        sizes = np.concatenate(sizes)
        smallest[r], largest[r] = sizes.min(), sizes.max()
    return smallest, largest


def smallest_sender_groups(algo, config, federation) -> np.ndarray:
    """Per round, the fewest senders one shuffler's share holds of one randomizer group under a federation model
    (its absent and lost users send nothing, so they hide no one); 0 for a round in which no one sends. The
    federation's draws are the run's seed's, so this is known before the run."""
    smallest = np.zeros(config.rounds, dtype=np.int64)
    for r in range(config.rounds):
        start = r * config.round_size
        stop = min(start + config.round_size, config.users)
        senders = round_senders(federation, r, start, stop, config.populations)
        labels = None if algo is None or not len(senders) else algo.randomizer_groups(senders)
        sizes = []
        for s in range(config.shufflers):
            lo, hi = share_bounds(stop - start, s, config.shufflers)
            inside = (senders >= start + lo) & (senders < start + hi)
            if inside.any():
                sizes.append(group_sizes(None if labels is None else labels[inside], int(inside.sum())))
        smallest[r] = np.concatenate(sizes).min() if sizes else 0
    return smallest


class GroupsBroken(RuntimeError):
    """A shuffled share whose public fields tell apart users the algorithm declared alike: its privacy claim
    would be false, so the run stops before the share reaches the server."""


def check_groups(algo, round_index: int, users: np.ndarray, share: dict) -> None:
    """GroupsBroken when a public field that is not a common draw (`public_draws`) differs between two users of
    one randomizer group (`algo.randomizer_groups`) in this share (messages in user order)."""
    plan = getattr(algo, "shuffle", None)
    if plan is not None and not plan.amplifies:     # nothing is claimed of the shuffle: the local guarantee holds
        return
    fixed = [key for key in share if key in algo.public_fields and key not in algo.public_draws]
    if not fixed or not len(users):
        return
    labels = algo.randomizer_groups(np.asarray(users, dtype=np.int64))
    if labels is None:
        labels = np.zeros(len(users), dtype=np.int64)
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    leader = first[inverse.reshape(-1)]
    for key in fixed:
        values = np.asarray(share[key]).reshape(len(users), -1)
        differ = np.flatnonzero((values != values[leader]).any(axis=1))
        if differ.size:
            user = int(users[differ[0]])
            raise GroupsBroken(f"round {round_index}: public field {key!r} of user {user} differs from that of user "
                               f"{int(users[leader[differ[0]]])}, which {algo.name} declares the same randomizer "
                               f"(randomizer_groups): the server could tell them apart, so the shuffle's "
                               f"amplification does not hold for them")


def permutation(seed: int, round_index: int, shuffler: int, size: int) -> np.ndarray:
    """The order in which shuffler `shuffler` forwards the `size` messages of its share of round `round_index`."""
    return derive(seed, "shuffle", round_index, shuffler).permutation(size)


def chunk_bounds(size: int) -> list[tuple[int, int]]:
    """[lo, hi) of each chunk of a permuted share of `size` messages."""
    return [(lo, min(lo + CHUNK_MESSAGES, size)) for lo in range(0, size, CHUNK_MESSAGES)]


def shard_of_chunk(shuffler: int, chunk: int, shards: int) -> int:
    return (shuffler + chunk) % shards


def chunks_of_shard(share_sizes: list, shards: int, shard: int) -> list[tuple[int, int]]:
    """The (shuffler, chunk) keys shard `shard` receives in a round whose shuffler shares hold `share_sizes`
    messages, in fold order."""
    keys = []
    for s, size in enumerate(share_sizes):
        keys += [(s, c) for c in range(len(chunk_bounds(size))) if shard_of_chunk(s, c, shards) == shard]
    return keys


def shuffle_share(seed: int, round_index: int, shuffler: int, messages: dict) -> list[dict]:
    """A shuffler's work on its share (field -> (n, ...) arrays, in user order): the messages permuted, cut into
    chunks; nothing else (no population, no user index) goes on."""
    size = len(next(iter(messages.values()))) if messages else 0
    order = permutation(seed, round_index, shuffler, size)
    permuted = {key: np.ascontiguousarray(value[order]) for key, value in messages.items()}
    return [{key: value[lo:hi] for key, value in permuted.items()} for lo, hi in chunk_bounds(size)]


def anonymous_aggregate(algo, chunk: dict) -> dict:
    """The server's aggregate of a chunk of shuffled messages: `algo.aggregate` without the users (under the shuffle
    model it is a sum or a fold of the rows: CompiledAlgorithm.anonymous_sums). The one call both engines make."""
    n = len(next(iter(chunk.values())))
    return algo.aggregate(chunk, np.full(n, UNKNOWN_USER, dtype=np.int64))
