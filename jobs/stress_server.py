#!/usr/bin/env python3
"""Stress the server's aggregation path: many populations send PER-USER messages as fast as they can to S shards.

    python jobs/stress_server.py [--algorithm ldp-ols] [--d 10] [--K 10] [--shards 1,2,4] [--populations 32]
                                 [--users-per-message 50] [--rounds 150] [--senders 2] [--batch 8]
                                 [--max-in-flight 8] [--inject 8] [--max-seconds 300] [--layout population]

The messages are real: each sender actor runs the algorithm's client half (`simulate_population`, with the
per-user privatized messages of `algo.encode`) for its populations, from the run's derived seeds, BEFORE the
clock starts; then, per shard count S, it sends them (split by the shard plan of the Ray engine) as fast as it can,
`--batch` (population, round) messages per call, at most `--max-in-flight` calls outstanding. It also re-sends
`--inject` messages it already sent (duplicates) and `--inject` corrupted ones (a NaN), which must be rejected.

Reported per S: sustained per-user messages per second (from the first send until every fold is done), fold
latency p50/p99 (time a shard spends validating and folding one (population, round) message of
--users-per-message users), delivery latency p50/p99 (send to folded, queueing included), how busy the busiest
shard was (fold time / wall time: near 100% means the shards are the bottleneck, low means the senders and
transport are), peak RSS of the shards, senders and driver. Then the proof: every round's aggregate
collected from the shards must equal an independent single-process recomputation from the same seeds (population
sums added in population order, exactly as run_local does), every (population, round) must be counted once, and
exactly the injected messages must be rejected. Exit status 1 if any check fails or the time bound is exceeded.
Loopback only: it starts a local Ray (or uses RAY_ADDRESS), bounded in count (rounds x populations) and in time.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import ray

from ldpfed.algorithms import REGISTRY, make_algorithm
from ldpfed.config import RunConfig
from ldpfed.engine.core import add_sums, simulate_population
from ldpfed.engine.ray_engine import RemoteShard, ensure_ray
from ldpfed.engine.ray_shard import LatencyHistogram, make_plan, peak_rss_bytes
from ldpfed.envs import make_env
from ldpfed.rng import derive


class Sender:
    """Hosts populations; generates their per-user messages once, then sends them to the shards on demand."""

    def __init__(self, config, populations: list[int]):
        self.config, self.populations = config, populations
        self.env = make_env(config)
        self.algo = make_algorithm(self.env, config)
        model = self.algo.publish(self.algo.initial_state(derive(config.seed, "init")))
        B, P = config.round_size, config.populations
        self.messages = {}    # (round, population) -> per-user messages
        for r in range(config.rounds):
            for p in populations:
                users = _users(config, r, p)
                if len(users):
                    payload, _, _ = simulate_population(self.algo, self.env, model, config.seed, r, p, users,
                                                        pre_aggregate=False)
                    self.messages[(r, p)] = payload
        self.queue = []

    def prepare(self, plan, shards, inject: int, seed: int) -> int:
        """Cut the messages for this plan; returns how many (population, round) messages will be sent."""
        self.shards, self.queue = shards, []
        for (r, p), payload in sorted(self.messages.items()):
            n = len(next(iter(payload.values())))
            for s, part in enumerate(plan.split(payload, n, p)):
                if part is not None:
                    self.queue.append((s, (self.config.algorithm, r, p, part)))
        rng = np.random.default_rng(seed)
        originals = len(self.queue)
        k = min(inject, originals)
        duplicates = [self.queue[i] for i in rng.choice(originals, size=k, replace=False)]
        corrupted = []
        for i in rng.choice(originals, size=k, replace=False):
            s, (algorithm, r, p, part) = self.queue[i]
            bad = {f: v.copy() for f, v in part.items()}
            bad[sorted(bad)[0]].reshape(-1)[0] = np.nan
            corrupted.append((s, (algorithm, r, p, bad)))
        # corrupted copies BEFORE their originals (rejected as non-finite, then the original is accepted),
        # duplicates after them (a shard keeps every round open here); calls from one sender arrive in order
        self.queue = corrupted + self.queue + duplicates
        return originals

    def blast(self, batch: int, max_in_flight: int) -> dict:
        """Send everything as fast as possible; returns when every fold call has completed."""
        started = time.perf_counter()
        by_shard: dict[int, list] = {}
        in_flight, calls = [], 0
        def flush(s):
            nonlocal in_flight, calls
            while len(in_flight) >= max_in_flight:
                _, in_flight = ray.wait(in_flight, num_returns=1)
            in_flight.append(self.shards[s].fold.remote(by_shard.pop(s), sent_at=time.time()))
            calls += 1
        for s, message in self.queue:
            by_shard.setdefault(s, []).append(message)
            if len(by_shard[s]) >= batch:
                flush(s)
        for s in list(by_shard):
            flush(s)
        results = ray.get(in_flight) if in_flight else []
        return {"calls": calls, "seconds": time.perf_counter() - started, "peak_rss": peak_rss_bytes(),
                "tail_results": len(results)}


RemoteSender = ray.remote(Sender)


def _users(config, r, p):
    from ldpfed.engine.core import population_users
    start, stop = r * config.round_size, min(config.users, (r + 1) * config.round_size)
    return population_users(start, stop, p, config.populations)


def recompute(config) -> list[dict]:
    """Independent single-process recomputation of every round's aggregate (population sums in order)."""
    env = make_env(config)
    algo = make_algorithm(env, config)
    model = algo.publish(algo.initial_state(derive(config.seed, "init")))
    out = []
    for r in range(config.rounds):
        sums = None
        for p in range(config.populations):
            users = _users(config, r, p)
            if len(users):
                payload, _, _ = simulate_population(algo, env, model, config.seed, r, p, users, pre_aggregate=True)
                sums = add_sums(sums, payload)
        out.append(sums or {})
    return out


def run_stress(algorithm="ldp-ols", d=10, K=10, shard_counts=(1, 2, 4), populations=32, users_per_message=50,
               rounds=150, senders=2, batch=8, max_in_flight=8, inject=8, max_seconds=300.0, seed=0, log=print,
               layout="population"):
    """Run the stress test; returns (ok, report rows)."""
    config = RunConfig(algorithm, env="linear", users=rounds * populations * users_per_message,
                       round_size=populations * users_per_message, populations=populations, seed=seed,
                       env_params={"d": d, "K": K})
    deadline = time.monotonic() + max_seconds
    env = make_env(config)
    algo = make_algorithm(env, config)
    expected = recompute(config)
    senders = min(senders, populations)
    hosts = [RemoteSender.options(num_cpus=0).remote(config, [p for p in range(populations) if p % senders == a])
             for a in range(senders)]
    ok, rows = True, []
    try:
        ray.get([h.__ray_ready__.remote() for h in hosts], timeout=max(deadline - time.monotonic(), 1))
        for S in shard_counts:
            plan = make_plan(algo, config, S, "per-user", layout)
            shards = [RemoteShard.options(num_cpus=0).remote(config, plan, s, max_open_rounds=config.rounds)
                      for s in range(S)]
            try:
                ray.get([s.__ray_ready__.remote() for s in shards], timeout=max(deadline - time.monotonic(), 1))
                counts = ray.get([h.prepare.remote(plan, shards, inject, seed + a) for a, h in enumerate(hosts)])
                injected = 2 * sum(min(inject, c) for c in counts)
                started = time.perf_counter()
                sent = ray.get([h.blast.remote(batch, max_in_flight) for h in hosts],
                               timeout=max(deadline - time.monotonic(), 1))
                elapsed = time.perf_counter() - started
                stats = ray.get([s.stats.remote() for s in shards])
                totals = [ray.get([s.collect.remote(r) for s in shards]) for r in range(config.rounds)]
                row, errors = _check(config, plan, expected, totals, stats, counts, injected)
                latency, delivery = LatencyHistogram(), LatencyHistogram()
                for st in stats:
                    latency.merge(st["latency_counts"])
                    delivery.merge(st["delivery_counts"])
                user_messages = config.users if not errors else sum(st["user_messages"] for st in stats)
                row.update({
                    "shards": S, "layout": plan.layout, "seconds": elapsed,
                    "user_messages": user_messages, "messages_per_s": user_messages / elapsed,
                    "user_message_slices": sum(st["user_messages"] for st in stats),
                    "population_messages_per_s": sum(st["accepted"] for st in stats) / elapsed,
                    "calls": sum(x["calls"] for x in sent),
                    "fold_p50_ms": latency.quantile(0.5) * 1e3, "fold_p99_ms": latency.quantile(0.99) * 1e3,
                    "delivery_p50_ms": delivery.quantile(0.5) * 1e3, "delivery_p99_ms": delivery.quantile(0.99) * 1e3,
                    "shard_busy": max(st["busy_s"] for st in stats) / elapsed,
                    "peak_rss_shards_mb": max(st["peak_rss"] for st in stats) / 2**20,
                    "peak_rss_senders_mb": max(x["peak_rss"] for x in sent) / 2**20,
                    "peak_rss_driver_mb": peak_rss_bytes() / 2**20,
                })
                rows.append(row)
                log(f"S={S} ({plan.layout}): {row['messages_per_s']:,.0f} user messages/s "
                    f"({row['population_messages_per_s']:,.0f} population messages/s, {row['calls']} calls) "
                    f"fold p50 {row['fold_p50_ms']:.3f} ms p99 {row['fold_p99_ms']:.3f} ms, "
                    f"delivery p50 {row['delivery_p50_ms']:.1f} ms p99 {row['delivery_p99_ms']:.1f} ms, "
                    f"busiest shard folding {100 * row['shard_busy']:.0f}% of the time, "
                    f"peak RSS shards {row['peak_rss_shards_mb']:.0f} MB senders {row['peak_rss_senders_mb']:.0f} MB "
                    f"driver {row['peak_rss_driver_mb']:.0f} MB; {row['user_messages']:,} user messages folded once, "
                    f"{row['rejected']} rejected of {injected} injected: {'OK' if not errors else 'FAIL'}")
                for error in errors:
                    log(f"  FAIL: {error}")
                ok = ok and not errors
            finally:
                for s in shards:
                    ray.kill(s)
    except ray.exceptions.GetTimeoutError:
        log(f"FAIL: time bound of {max_seconds:.0f}s exceeded")
        ok = False
    finally:
        for h in hosts:
            ray.kill(h)
    return ok, rows


def _check(config, plan, expected, totals, stats, counts, injected):
    errors = []
    for r in range(config.rounds):
        got = plan.assemble(totals[r])
        want = expected[r]
        if set(got) != set(want):
            errors.append(f"round {r}: fields {sorted(got)} != {sorted(want)}")
            continue
        for field in want:
            if not np.array_equal(got[field], want[field]):
                diff = float(np.max(np.abs(got[field] - want[field])))
                errors.append(f"round {r} field {field}: differs from the recomputation (max |diff| {diff:.3g})")
    routed = sum(counts)
    accepted = sum(st["accepted"] for st in stats)
    if accepted != routed:
        errors.append(f"{accepted} (population, round) messages accepted, {routed} sent once")
    for st in stats:    # every user's message (slice) folded exactly once by every shard it was routed to
        s = st["shard"]
        users = sum(len(_users(config, r, p)) for r in range(config.rounds) for p in range(config.populations)
                    if plan.sends_to(p, s))
        if st["user_messages"] != users:
            errors.append(f"shard {s}: {st['user_messages']} user messages folded, {users} sent once")
    rejected = sum(st["rejected"] for st in stats)
    if rejected != injected:
        errors.append(f"{rejected} messages rejected, {injected} injected ({[st['rejected_by_reason'] for st in stats]})")
    return {"accepted": accepted, "rejected": rejected, "errors": errors}, errors


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithm", default="ldp-ols" if "ldp-ols" in REGISTRY else "uniform")
    parser.add_argument("--d", type=int, default=10)
    parser.add_argument("--K", type=int, default=10)
    parser.add_argument("--shards", default="1,2,4", help="comma-separated shard counts")
    parser.add_argument("--populations", type=int, default=32)
    parser.add_argument("--users-per-message", type=int, default=50, help="users per (population, round) message")
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--senders", type=int, default=2, help="sender (population) actors")
    parser.add_argument("--batch", type=int, default=8, help="messages per fold call")
    parser.add_argument("--layout", default="population", choices=["population", "block"],
                        help="population: whole messages to shard p %% S; block: every message cut by key ranges")
    parser.add_argument("--max-in-flight", type=int, default=8, help="fold calls outstanding per sender")
    parser.add_argument("--inject", type=int, default=8, help="duplicates and corrupted messages per sender")
    parser.add_argument("--max-seconds", type=float, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="write the report rows here")
    args = parser.parse_args(argv)
    shard_counts = [int(x) for x in args.shards.split(",") if x.strip()]
    started = ensure_ray(None, log_to_driver=False)
    try:
        print(f"stress: {args.algorithm} d={args.d} K={args.K}, {args.populations} populations x "
              f"{args.users_per_message} users x {args.rounds} rounds = "
              f"{args.populations * args.users_per_message * args.rounds:,} per-user messages per shard count; "
              f"{args.senders} senders, batch {args.batch}, {args.max_in_flight} calls in flight each", flush=True)
        ok, rows = run_stress(args.algorithm, args.d, args.K, shard_counts, args.populations, args.users_per_message,
                              args.rounds, args.senders, args.batch, args.max_in_flight, args.inject,
                              args.max_seconds, args.seed, log=lambda line: print(line, flush=True),
                              layout=args.layout)
    finally:
        if started:
            ray.shutdown()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2, default=str)
    print("stress: OK, nothing lost or counted twice" if ok else "stress: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
