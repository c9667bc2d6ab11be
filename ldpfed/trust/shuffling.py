"""The shuffle plan of the "shuffle" trust model, written once: which users of a round go to which shuffler, how a
shuffler permutes its share, how it cuts it into chunks, and which shard gets each chunk. Pure functions of
(seed, round, shuffler) and the public round bounds, so every engine (run_local, the Ray engine's shuffler actors)
and the accounting (the batch of a shuffler) compute the same thing.

* Shuffler s of S gets the round's users at positions [n s // S, n (s + 1) // S) (n users in the round): contiguous
  shares whose sizes differ by at most one (the remainder n mod S is spread one user each, by the floor split:
  10 users among 3 shufflers get 3, 3, 4). The accounting's batch is the smallest share, n // S. Under a federation
  model whose rounds lose users a share holds the senders at its positions (`share_senders`): fewer, never others.
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


def share_senders(senders: np.ndarray, start: int, n_users: int, shuffler: int, shufflers: int) -> np.ndarray:
    """The senders (users of round [start, start + n_users) whose messages are in the round, in user order) that
    shuffler `shuffler` mixes: those at positions [lo, hi) of its share. Shares are cut on the round's positions, not
    on who sends, so a user's shuffler does not depend on who else takes part."""
    lo, hi = share_bounds(n_users, shuffler, shufflers)
    a, b = np.searchsorted(senders, [start + lo, start + hi])
    return senders[a:b]


def smallest_groups(algo, n_users: int, round_size: int, shufflers: int,
                    senders=None) -> tuple[np.ndarray, np.ndarray]:
    """(smallest, largest): per round, the fewest and the most users one shuffler's share holds of one randomizer
    group (`algo.randomizer_groups`): the anonymity set of the round's worst-off user, and the largest batch any
    user is shuffled in. `senders(round, start, stop)`: the users whose messages are in the round (None: every
    user of the round); a group none of whose users sends counts for nothing, a round with no sender is 0. Labels
    are computed round by round, so memory follows the round size."""
    rounds = -(-n_users // round_size)
    smallest, largest = np.empty(rounds, dtype=np.int64), np.empty(rounds, dtype=np.int64)
    for r in range(rounds):
        start = r * round_size
        stop = min(start + round_size, n_users)
        users = np.arange(start, stop, dtype=np.int64) if senders is None else \
            np.asarray(senders(r, start, stop), dtype=np.int64)
        labels = algo.randomizer_groups(users) if len(users) else None
        sizes = []
        for s in range(shufflers):
            lo, hi = share_bounds(stop - start, s, shufflers)
            a, b = np.searchsorted(users, [start + lo, start + hi])
            if b > a:
                sizes.append(group_sizes(None if labels is None else labels[a:b], b - a))
        sizes = np.concatenate(sizes) if sizes else np.zeros(1, dtype=np.int64)
        smallest[r], largest[r] = sizes.min(), sizes.max()
    return smallest, largest


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


def chunks_of_shard(n_users: int, shufflers: int, shards: int, shard: int, sizes=None) -> list[tuple[int, int]]:
    """The (shuffler, chunk) keys shard `shard` receives in a round of n_users, in fold order. sizes: the messages
    in each shuffler's share when not every user of the round sends (None: the shares' full sizes)."""
    keys = []
    for s in range(shufflers):
        lo, hi = share_bounds(n_users, s, shufflers)
        size = hi - lo if sizes is None else int(sizes[s])
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
