"""Randomness derived from (run seed, population, round, purpose).

Every random draw of a run comes from a Generator built here, so a result does not depend on how many
population actors, server shards or nodes did the work, and a retried round reproduces itself.
"""
import numpy as np

# Fixed integer codes: changing one changes every result, so only append.
PURPOSES = {
    "env": 0,        # ground truth of the world (theta*, arm pool, breakpoints)
    "context": 1,    # contexts seen by users
    "act": 2,        # the user's own randomness when choosing an arm
    "reward": 3,     # reward noise
    "privatize": 4,  # local randomizer
    "server": 5,     # server-side noise (central DP) and server randomness
    "init": 6,       # initial model
    "sequential-world": 7,   # the sequential engine: contexts and reward noise of a chunk of users
    "sequential-client": 8,  # the sequential engine: the local randomizers' draws for a chunk of users
    "sequential-server": 9,  # the sequential engine: the server's draws (draw_server) for a chunk of users
    "sequential-between": 10,  # the sequential engine: a compiled algorithm's `between` step after a user
    "shuffle": 11,   # a shuffler's permutation of a round's share (ldpfed.trust.shuffling), by (round, shuffler)
    "secagg": 12,    # secure aggregation (ldpfed.trust.secagg): the masks' key, and each round's drop-outs
    "federation": 13,  # a federation model's draws (ldpfed.federation), e.g. who is available, by (population, round)
}


def derive(seed: int, purpose: str, *keys: int) -> np.random.Generator:
    """A Generator for `purpose`, keyed by e.g. (population, round)."""
    entropy = [int(seed), PURPOSES[purpose], *(int(k) for k in keys)]
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))
