"""The shuffler stage of the capacity curve (the shuffle trust model): how many per-user messages per second S
shuffler actors mix and cut into chunks, and how long a share takes.

Each population's real messages of one round (per-user privatized outputs under `--trust shuffle`), cut by
shuffler share as the engine's population actors cut them (`PopulationActor.run_round`, run in this process), are
put in Ray's object store ONCE, before any clock starts. Then, closed loop for --level-seconds, every shuffler actor (the engine's own `ShufflerActor`, its
`shuffle_round`: join the pieces, permute with the round's stream, cut into chunks of 1,024 messages) gets round after
round of its share, with at most --max-in-flight calls outstanding each (the round index changes, so every call
draws a new permutation). Reported per S: messages/s (users mixed per second, all shufflers together), the latency
of a call from its submission to its chunks being ready (p50/p99: queueing in the actor included), the shufflers'
own time per share (p50), their busy fraction and CPU share. The chunks are not folded here (the shards' capacity is
the curve of `capacity.py`); before the clock starts, round 0's chunks are compared bit for bit with
`shuffling.shuffle_share` recomputed in the driver.
"""
from __future__ import annotations

import time

import numpy as np
import ray

from ldpfed.algorithms import make_algorithm
from ldpfed.trust.shuffling import shuffle_share
from ldpfed.config import RunConfig
from ldpfed.engine.core import join_pieces
from ldpfed.engine.ray_engine import IDLE_ACTORS, PopulationActor, RemoteShuffler, cluster_nodes
from ldpfed.engine.ray_shard import LatencyHistogram, make_plan
from ldpfed.envs import make_env
from ldpfed.stress.shard import loadavg

ROUNDS = 10_000     # rounds the plan allows (each call uses the next one: a new permutation)


def _pieces(config, algo, plan) -> list[list]:
    """Per shuffler, [(population, its users' messages in the share)] of round 0: what the engine's population
    actors send the shufflers (`PopulationActor.run_round`, all populations in this process)."""
    model = algo.publish(algo.initial_state(np.random.default_rng(config.seed)))
    *per_shuffler, _ = PopulationActor(config, range(config.populations), plan).run_round(model, 0, 0,
                                                                                           config.round_size)
    return per_shuffler


def measure_shufflers(algorithm: str, d: int, K: int, shufflers: int, round_users: int, populations: int,
                      seconds: float, in_flight: int, seed: int = 0, log=print) -> dict:
    """One row of the shuffler stage: S = `shufflers` actors for `seconds` (see the module doc)."""
    config = RunConfig(algorithm, env_params={"d": d, "K": K}, users=round_users * ROUNDS, round_size=round_users,
                       populations=populations, eps=1.0, delta=1e-6, seed=seed, trust="shuffle",
                       trust_options={"shufflers": shufflers})
    env = make_env(config)
    algo = make_algorithm(env, config)
    plan = make_plan(algo, config, 1, "per-user")
    pieces = _pieces(config, algo, plan)
    refs = [ray.put(batch) for batch in pieces]
    nodes = cluster_nodes()
    # the session's idle shuffler processes if any (as the engine reuses them), given back at the end
    homes = [nodes[s % len(nodes)] for s in range(shufflers)]
    placed = [(node, IDLE_ACTORS.take(RemoteShuffler, node)) for node in homes]
    actors = [actor for _, actor in placed]
    ray.get([a.configure.remote(config, plan, s) for s, a in enumerate(actors)])
    for s, actor in enumerate(actors):      # exactness: the actor's chunks are the plan's
        got = ray.get(actor.shuffle_round.remote(0, refs[s]))
        want = shuffle_share(seed, 0, s, join_pieces([piece for _, piece in pieces[s]]))
        if len(got) != len(want) or any(not all(np.array_equal(c.payload[f], w[f]) for f in w)
                                        for c, w in zip(got, want)):
            raise AssertionError(f"shuffler {s}: its chunks are not the plan's")
    share = [sum(len(next(iter(piece.values()))) for _, piece in batch) for batch in pieces]
    before = ray.get([a.stats.remote() for a in actors])
    latency, outstanding, done = LatencyHistogram(), {}, [0] * shufflers
    next_round = 1
    t0 = time.perf_counter()
    deadline = t0 + seconds

    def submit(s):
        nonlocal next_round
        outstanding[actors[s].shuffle_round.remote(next_round % ROUNDS, refs[s])] = (s, time.perf_counter())
        next_round += 1

    for s in range(shufflers):
        for _ in range(in_flight):
            submit(s)
    while outstanding:
        ready, _ = ray.wait(list(outstanding), num_returns=1)
        for ref in ready:
            s, sent = outstanding.pop(ref)
            ray.get(ref)      # raises if the call failed; the chunks are dropped with the ref
            latency.add(time.perf_counter() - sent)
            done[s] += 1
            if time.perf_counter() < deadline:
                submit(s)
    elapsed = time.perf_counter() - t0
    after = ray.get([a.stats.remote() for a in actors])
    mixing = LatencyHistogram()
    for st in after:
        mixing.merge(st["latency_counts"])
    for st in before:
        mixing.counts -= st["latency_counts"]
    for node, actor in placed:
        IDLE_ACTORS.give_back(RemoteShuffler, node, actor)
    messages = sum(n * size for n, size in zip(done, share))
    busy = sum(a["busy_s"] - b["busy_s"] for a, b in zip(after, before)) / (elapsed * shufflers)
    cpu = sum(a["cpu_s"] - b["cpu_s"] for a, b in zip(after, before)) / (elapsed * shufflers)
    row = {"stage": "shufflers", "algorithm": algorithm, "shufflers": shufflers, "round_users": round_users,
           "share_users": min(share), "calls": sum(done), "seconds": elapsed, "messages_per_s": messages / elapsed,
           "latency_p50_ms": latency.quantile(0.5) * 1e3, "latency_p99_ms": latency.quantile(0.99) * 1e3,
           "mix_p50_ms": mixing.quantile(0.5) * 1e3, "busy": busy, "cpu": cpu, "load": loadavg()}
    log(f"  S={shufflers} shufflers: {row['messages_per_s']:,.0f} messages/s ({sum(done)} shares of "
        f"{min(share):,}+ users in {elapsed:.1f} s), latency p50 {row['latency_p50_ms']:.1f} ms p99 "
        f"{row['latency_p99_ms']:.1f} ms, mixing a share p50 {row['mix_p50_ms']:.1f} ms, busy {busy:.0%}, "
        f"CPU {cpu:.0%} of a core each; load {row['load']}")
    return row


def shuffler_table(rows: list[dict]) -> list[str]:
    lines = ["| S shufflers | users per share | messages/s | latency p50 (ms) | latency p99 (ms) | mixing a share "
             "p50 (ms) | busy | CPU per shuffler |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['shufflers']} | {r['share_users']:,} | {r['messages_per_s']:,.0f} | "
                     f"{r['latency_p50_ms']:.1f} | {r['latency_p99_ms']:.1f} | {r['mix_p50_ms']:.1f} | "
                     f"{r['busy']:.0%} | {r['cpu']:.0%} |")
    return lines
