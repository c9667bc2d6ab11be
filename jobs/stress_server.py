#!/usr/bin/env python3
"""Stress the server's aggregation path: exactness under load and attack, poisoning within the domain, capacity.

    python jobs/stress_server.py [--algorithm ldp-ols] [--d 10] [--K 10] [--shards 1,2,4] [--populations 32]
                                 [--users-per-message 50] [--rounds 150] [--senders 2] [--batch 8]
                                 [--max-in-flight 8] [--inject 8] [--max-seconds 300] [--layout population]
                                 [--attack out-of-domain --fraction 0.1]
    python jobs/stress_server.py --attack in-domain [--fraction 0.001,0.003,0.01,0.03,0.1] [--plot out.png]
    python jobs/stress_server.py --capacity [--algorithm ldp-sgd --users-per-message 1250 --populations 8]
                                 [--shards 1,2,4] [--levels 25,50,75,100,125] [--level-seconds 4]
                                 [--batch 256] [--linger-ms 20] [--max-in-flight 2] [--probe-rounds 8000]
    add --no-domain-checks to any of them to measure what the shards' domain checks cost (that measurement only)

Exactness (default, and --attack out-of-domain). The messages are real: each sender actor runs the algorithm's
client half (`simulate_population`, with the per-user privatized messages of `algo.encode`) for its populations,
from the run's derived seeds, BEFORE the clock starts; then, per shard count S, it sends them (split by the shard
plan of the Ray engine) as fast as it can, `--batch` (population, round) messages per call, at most
`--max-in-flight` calls outstanding. It also re-sends `--inject` messages it already sent (duplicates) and
`--inject` corrupted ones (a NaN), which must be rejected; with `--attack out-of-domain --fraction f` it adds
f x (its messages) out-of-domain copies (an entry beyond the field's bound, a public count changed, an l2-ball
output inside the ball, ...), sent before the genuine ones. The proof: every round's aggregate collected from the
shards must equal an independent single-process recomputation from the same seeds (population sums added in
population order, exactly as run_local does), every (population, round) must be counted once, and exactly the
injected messages must be rejected (100% of the bad ones, 0 honest ones). Reported per S: sustained per-user
messages per second, fold latency p50/p99, delivery latency p50/p99, how busy the busiest shard was, peak RSS.

Poisoning within the domain (--attack in-domain): a fraction f of the users (a fixed random set, nested as f grows)
send valid-looking messages chosen to pull the estimate one way (ldp-sgd: every l2-ball output the same point of
the sphere; ldp-ols: u at the Gaussian tail bound of every coordinate, one sign; sw-klucb-cf: feedback 1 exactly
when the pulled arm is the worst arm). Every message goes through a shard's per-user domain check (in process)
and must be ACCEPTED: LDP protocols are manipulable within the domain. Reported per f: how far the final estimate
moved from the honest run's (same seeds), its error, the cumulative regret and its ratio to the honest run.

Capacity (--capacity): an open-loop load generator. A message is one population's users of one round
(--users-per-message users, 1,250 by default: the engine's own message at its benchmark setting, B = 10,000 users per
round from 8 populations, each population sending its round's users in ONE message). Each sender generates a small
pool of its populations' real messages (`simulate_population`, per-user privatized outputs) and puts bundles of them
(1, 2, 4, ... --batch messages in one object; a call of n messages refers to the smallest bundle of at least n and
the shard folds its first n, so when calls are not full it also unpickles up to n - 1 payloads it does not fold:
counted as busy, not as folding; full calls above capacity use an exact bundle) in Ray's object store ONCE, before
any clock starts; then it schedules message k at t0 + k / rate whatever happened before (open loop) and sends
references: a shard's due messages leave in one call (headers, scheduled times, a bundle reference) when --batch of
them are due or the oldest has waited --linger-ms (Kafka's batch.size / linger.ms), with at most --max-in-flight
calls outstanding per sender and shard (back-pressure: above capacity the backlog waits at the sender, unsent;
nothing is dropped and no queue grows without bound). This is what makes the load generator cheap (a call per up to
--batch messages, no pickling of payloads), not the server's work: the shard fetches the bundle from the object store
and folds EVERY message on its own through `ShardCore.fold` (header checks, dtype and shape, the domain checks on
every user's output, `aggregate`), as a client's message; after every level the driver collects every round's
aggregate from the shards and compares it, bit for bit, with its own recomputation from the seeds (the pool entry
each message carried, aggregated with that message's users, added in population order). Per S, a closed-loop probe
(everything due at once) measures the capacity C; then the levels run at --levels percent of C and report sustained
per-user messages/s, latency p50/p99 from a message's SCHEDULED time to the end of its fold (batching and waiting in
the bounded queue count, every message of the level), and per shard the figures below. Rates, busy and CPU are taken
over the level's steady window: from t0 to the end of the first shard's last call, while every shard still had work
(`steady_window`; after it the shards drain their backlogs unevenly and the first done sits idle); the whole level's
rate is printed too.
  busy  = the fraction of the window the shard had messages in hand: from the first line of its handler
          (before fetching the bundle) to the end of its last fold. Ray's own work between two calls (receiving the
          call, sending the reply) is not counted; "folding" is the part spent in `ShardCore.fold` itself;
  CPU   = the shard process's CPU time / the window (that Ray work included). On 2 cores, S shards plus the senders
          and Ray's daemons share the CPU, so with S >= 2 a shard can be busy (a message in hand) while it waits for
          a core: its CPU share is then below its busy fraction (at most ~2/S of a core each).
also the senders' CPU share and the whole machine's CPU use (every process, other users' too, from /proc/stat;
"niced": the part used by processes at a positive nice, i.e. others' background jobs that yield to this one).
Loopback only: it starts a local Ray (or uses RAY_ADDRESS), bounded in count and in time.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import ray

from ldpfed.algorithms import REGISTRY, make_algorithm
from ldpfed.config import RunConfig
from ldpfed.engine.core import add_sums, simulate_population
from ldpfed.engine.ray_engine import ShardActor, ensure_ray
from ldpfed.engine.ray_shard import LatencyHistogram, ShardCore, make_plan, peak_rss_bytes
from ldpfed.envs import make_env
from ldpfed.rng import derive


class Sender:
    """Hosts populations; generates their per-user messages once, then sends them to the shards on demand."""

    def __init__(self, config, populations: list[int]):
        self.config, self.populations = config, populations
        self.env = make_env(config)
        self.algo = make_algorithm(self.env, config)
        model = self.algo.publish(self.algo.initial_state(derive(config.seed, "init")))
        self.messages = {}    # (round, population) -> per-user messages
        for r in range(config.rounds):
            for p in populations:
                users = _users(config, r, p)
                if len(users):
                    payload, _, _ = simulate_population(self.algo, self.env, model, config.seed, r, p, users,
                                                        pre_aggregate=False)
                    self.messages[(r, p)] = payload
        self.queue = []

    def prepare(self, plan, shards, inject: int, seed: int, attack_fraction: float = 0.0,
                check_domains: bool = True) -> tuple:
        """Cut the messages for this plan; returns (how many (population, round) messages will be sent once, how
        many out-of-domain copies are added)."""
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
        # out-of-domain copies of a fraction of the messages (every one must be rejected, then its original accepted)
        bad = []
        if attack_fraction > 0:
            domains = self.algo.message_domains()
            for j, i in enumerate(rng.choice(originals, size=int(round(attack_fraction * originals)), replace=False)):
                s, (algorithm, r, p, part) = self.queue[i]
                bad.append((s, (algorithm, r, p, out_of_domain(part, domains, plan.users_of(r, p), j, rng))))
        # corrupted and out-of-domain copies BEFORE their originals (rejected, then the original is accepted),
        # duplicates after them (a shard keeps every round open here); calls from one sender arrive in order
        self.queue = corrupted + bad + self.queue + duplicates
        return originals, len(bad)

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


def out_of_domain(payload: dict, domains: dict, users, j: int, rng) -> dict:
    """A copy of a per-user payload (population layout: whole messages) that no honest population can send:
    kind j % 3: 0: one entry of one user beyond the field's bound (the largest |bound| x 10 + 1; an exact public
    count + 1); 1: one user's row of a sphere field (l2-ball, unit direction) scaled by 0.5, else a bound x 1e6
    entry; 2: the whole field of every user multiplied by 1e6 (plus 1e6: never all zeros)."""
    bad = {f: np.array(v, copy=True) for f, v in payload.items()}
    fields = sorted(bad)
    field = fields[j % len(fields)]
    value, domain = bad[field], domains[field]
    flat = value.reshape(len(value), -1)
    user, entry = int(rng.integers(len(value))), int(rng.integers(flat.shape[1]))
    reach = float(np.max(np.abs(np.concatenate([domain.low, domain.high])))) if domain.bounded else 1.0
    kind = j % 3
    if not np.issubdtype(value.dtype, np.floating):     # e.g. a public arm index
        flat[user, entry] = int(10 * reach + 1)
    elif domain.exact is not None:
        flat[user, entry] += 1
    elif kind == 1 and domain.radius is not None:
        flat[user] *= 0.5
    elif kind == 2:
        flat *= 1e6
        flat += 1e6
    else:
        flat[user, entry] = 10 * reach + 1 if kind == 0 else 1e6 * reach + 1
    return bad


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
               layout="population", attack_fraction=0.0, check_domains=True):
    """Run the stress test; returns (ok, report rows). attack_fraction: out-of-domain copies per message."""
    if attack_fraction and layout != "population":
        raise ValueError("out-of-domain copies are built on whole messages: use layout 'population'")
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
            shards = [RemoteStressShard.options(num_cpus=0).remote(config, plan, s, max_open_rounds=config.rounds)
                      for s in range(S)]
            try:
                ray.get([s.set_check_domains.remote(check_domains) for s in shards],
                        timeout=max(deadline - time.monotonic(), 1))
                prepared = ray.get([h.prepare.remote(plan, shards, inject, seed + a, attack_fraction)
                                    for a, h in enumerate(hosts)])
                counts = [c for c, _ in prepared]
                bad_sent = sum(b for _, b in prepared)
                injected = 2 * sum(min(inject, c) for c in counts) + bad_sent
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
                out_of_domain_rejected = sum(v for st in stats for k, v in st["rejected_by_reason"].items()
                                             if k.startswith("out of domain"))
                row.update({
                    "shards": S, "layout": plan.layout, "seconds": elapsed, "check_domains": check_domains,
                    "out_of_domain_sent": bad_sent, "out_of_domain_rejected": out_of_domain_rejected,
                    "honest_rejected": row["rejected"] - injected if not errors else None,
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
                    f"{row['rejected']} rejected of {injected} injected"
                    + (f" ({out_of_domain_rejected} of {bad_sent} out-of-domain copies rejected as out of domain, "
                       f"{row['honest_rejected']} honest messages rejected)" if bad_sent else "")
                    + f": {'OK' if not errors else 'FAIL'}")
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


class StressShard(ShardActor):
    """The engine's shard actor, plus what the stress job needs: the domain-check switch (for measuring their
    cost only), a fold of a BUNDLE of messages (capacity: one object in Ray's store holding several clients'
    messages, each with its own header and scheduled time), and collecting many rounds in one call.

    Busy (capacity): `fold_bundle` times itself from its first line, before it fetches the bundle from the object
    store, to the end of its last message's fold: the shard has messages in hand (fetch, unpickle, the checks of
    `ShardCore.fold`, the domain checks, `aggregate`). Not counted: Ray's own work between two calls in the same
    process (receiving the call, its arguments' headers, sending the reply), which shows in the process CPU time."""

    def configure(self, *args, **kwargs):
        node = super().configure(*args, **kwargs)
        self.call_busy_s, self.calls, self.cpu_started = 0.0, 0, time.process_time()
        self.call_log = []     # per fold_bundle call: start, end (wall clock), users folded, CPU and fold s so far
        return node

    def set_check_domains(self, on: bool) -> bool:
        self.core.check_domains = bool(on) and self.core.algo is not None
        self.core.domains = self.core.algo.cached_domains() if self.core.check_domains else {}
        return self.core.check_domains

    def fold_bundle(self, headers, scheduled, bundle):
        """Fold message i = (*headers[i], payloads[i]) for every header, payloads = the object `bundle[0]` (a list;
        passed inside a list so that Ray does not fetch it before the clock starts). Every message goes through
        `ShardCore.fold` on its own, exactly as a client's message would."""
        started, wall, users = time.perf_counter(), time.time(), self.core.user_messages
        payloads = ray.get(bundle[0])
        accepted = rejected = 0
        for i, ((algorithm, r, p), at) in enumerate(zip(headers, scheduled)):
            a, b = self.core.fold([(algorithm, r, p, payloads[i] if i < len(payloads) else None)], sent_at=at)
            accepted += a
            rejected += b
        self.call_busy_s += time.perf_counter() - started
        self.calls += 1
        self.call_log.append((wall, time.time(), self.core.user_messages - users,
                              time.process_time() - self.cpu_started, self.core.busy_s))
        return accepted, rejected

    def collect_rounds(self, rounds: int) -> list:
        """collect(r) for r = 0 .. rounds - 1 (closes them): the totals the coordinator would read."""
        return [self.core.collect(r) for r in range(rounds)]

    def stats(self) -> dict:
        return {**super().stats(), "call_busy_s": self.call_busy_s, "calls": self.calls,
                "cpu_s": time.process_time() - self.cpu_started, "call_log": self.call_log}


RemoteStressShard = ray.remote(StressShard)


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


# ---- capacity: an open-loop load generator ----------------------------------------------------------------------

def bundle_sizes(max_batch: int) -> list[int]:
    """The bundle objects a sender keeps: 1, 2, 4, ... and max_batch (a call of n messages uses the smallest >= n)."""
    sizes, n = [], 1
    while n < max_batch:
        sizes.append(n)
        n *= 2
    return sizes + [max_batch]


class Batcher:
    """When each message of an open-loop schedule is sent, and with which others (pure: no Ray, no clock).

    Message k (0 <= k < len(shard_of)) goes to shard shard_of[k] and is due at t0 + k * interval (interval 0: all
    due at t0, the closed-loop probe), whatever happened before (open loop). A shard's due messages leave in one
    call, in order, when `max_batch` of them are due or the oldest has waited `linger` seconds (Kafka's batch.size
    and linger.ms), and only while that shard has fewer than `max_in_flight` calls outstanding (back-pressure:
    above capacity the backlog waits here, at the sender, in a queue of messages not yet generated: nothing is
    dropped and no queue grows without bound anywhere else)."""

    def __init__(self, shard_of, interval: float, t0: float, max_batch: int, linger: float, max_in_flight: int):
        shard_of = np.asarray(shard_of, dtype=np.int64)
        self.shards = int(shard_of.max()) + 1 if len(shard_of) else 0
        self.ks = [np.flatnonzero(shard_of == s) for s in range(self.shards)]      # each shard's messages, in order
        self.t0, self.interval = t0, interval
        self.due = [self.due_of(k) for k in self.ks]
        self.sent = [0] * self.shards
        self.in_flight = [0] * self.shards
        self.max_batch, self.linger, self.max_in_flight = max_batch, linger, max_in_flight

    def due_of(self, k):
        return self.t0 + k * self.interval

    def ready(self, now: float) -> list[tuple[int, np.ndarray]]:
        """The calls to make now: (shard, message indices); counts them as in flight."""
        calls = []
        for s in range(self.shards):
            due = int(np.searchsorted(self.due[s], now, side="right"))
            while self.in_flight[s] < self.max_in_flight and due > self.sent[s] and (
                    due - self.sent[s] >= self.max_batch or now >= self.due[s][self.sent[s]] + self.linger):
                n = min(due - self.sent[s], self.max_batch)
                calls.append((s, self.ks[s][self.sent[s]:self.sent[s] + n]))
                self.sent[s] += n
                self.in_flight[s] += 1
        return calls

    def completed(self, shard: int) -> None:
        self.in_flight[shard] -= 1

    def next_deadline(self) -> float | None:
        """The earliest time a call may become ready without a completion (None: only completions can)."""
        times = []
        for s in range(self.shards):
            i, n = self.sent[s], len(self.ks[s])
            if i < n and self.in_flight[s] < self.max_in_flight:
                full = self.due[s][i + self.max_batch - 1] if i + self.max_batch <= n else np.inf
                times.append(min(self.due[s][i] + self.linger, full))
        return min(times) if times else None

    def done(self) -> bool:
        return all(self.sent[s] == len(self.ks[s]) for s in range(self.shards))


class LoadSender:
    """Hosts populations: generates a pool of their real per-user messages (one population's users of one round in
    one message), and puts `bundle_sizes(max_batch)` bundles of them in Ray's object store ONCE, before any clock
    starts; then sends references to them open loop (`run`). Message i of a call carries pool entry i % len(pool)
    (all entries have the same number of users); `run` returns which entry each message carried, so the driver can
    recompute every round's aggregate from the seeds."""

    def __init__(self, config, populations: list[int], pool_rounds: int, max_batch: int):
        env = make_env(config)
        algo = make_algorithm(env, config)
        model = algo.publish(algo.initial_state(derive(config.seed, "init")))
        self.config, self.populations = config, populations
        self.pool = [(r, p) for r in range(pool_rounds) for p in populations]   # what each entry was made for
        payloads = [simulate_population(algo, env, model, config.seed, r, p, _users(config, r, p),
                                        pre_aggregate=False)[0] for r, p in self.pool]
        self.bundles = {n: ray.put([payloads[i % len(payloads)] for i in range(n)]) for n in bundle_sizes(max_batch)}

    def run(self, shards: list, rate: float, rounds: int, max_batch: int, linger: float, max_in_flight: int,
            t0: float) -> dict:
        """Send rounds x (this sender's populations) messages, message k = (round k // m, population
        populations[k % m]) due at t0 + k / rate (rate in messages/s; inf: all due at t0, the closed-loop probe),
        batched and back-pressured by `Batcher`. Returns when every call has completed."""
        m, S, algorithm = len(self.populations), len(shards), self.config.algorithm
        total = rounds * m
        shard_of = np.array([self.populations[k % m] % S for k in range(total)])
        batcher = Batcher(shard_of, 0.0 if not np.isfinite(rate) else 1.0 / rate, t0, max_batch, linger,
                          max_in_flight)
        sizes = bundle_sizes(max_batch)
        entry = np.full(total, -1)                 # pool entry each message carried (-1: not sent)
        in_flight, finished, waited = {}, [], []
        cpu = time.process_time()
        while not batcher.done() or in_flight:
            now = time.time()
            for s, ks in batcher.ready(now):
                due = batcher.due_of(ks)
                size = next(n for n in sizes if n >= len(ks))
                entry[ks] = np.arange(len(ks)) % len(self.pool)
                ref = shards[s].fold_bundle.remote([(algorithm, int(k // m), self.populations[k % m]) for k in ks],
                                                   due.tolist(), [self.bundles[size]])
                in_flight[ref] = s
                waited.append(now - due[0])          # how long the call's oldest message waited at the sender
            deadline = batcher.next_deadline()
            timeout = None if deadline is None else max(deadline - time.time(), 0.0)
            if in_flight:
                ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=timeout)
                for ref in ready:
                    batcher.completed(in_flight.pop(ref))
                    finished.append(ref)
            elif timeout:
                time.sleep(timeout)
        results = ray.get(finished)
        return {"messages": total, "accepted": sum(a for a, _ in results), "rejected": sum(b for _, b in results),
                "finished": time.time(), "calls": len(results), "entry": entry, "pool": self.pool,
                "waited_p99_s": float(np.quantile(waited, 0.99)) if waited else 0.0,
                "cpu_s": time.process_time() - cpu, "peak_rss": peak_rss_bytes()}


RemoteLoadSender = ray.remote(LoadSender)


class PoolRecomputation:
    """The driver's own copy of the senders' pools (from the seeds) and the honest aggregate of every round."""

    def __init__(self, config, algo):
        self.config, self.algo = config, algo
        self.env = make_env(config)
        self.model = algo.publish(algo.initial_state(derive(config.seed, "init")))
        self.payloads = {}

    def payload(self, made_for: tuple) -> dict:
        if made_for not in self.payloads:
            r, p = made_for
            self.payloads[made_for] = simulate_population(self.algo, self.env, self.model, self.config.seed, r, p,
                                                          _users(self.config, r, p), pre_aggregate=False)[0]
        return self.payloads[made_for]

    def check(self, plan, rounds: int, populations_of: list, sent: list, totals: list) -> list[str]:
        """Errors: round r's aggregate assembled from the shards' totals (totals[s][r]) must equal, bit for bit, the
        sum in population order of aggregate(the message population p sent in round r, its users)."""
        errors = []
        position = {p: (a, i) for a, pops in enumerate(populations_of) for i, p in enumerate(pops)}
        for r in range(rounds):
            want = None
            for p in range(self.config.populations):
                a, i = position[p]
                k = r * len(populations_of[a]) + i
                q = int(sent[a]["entry"][k])
                if q < 0:
                    errors.append(f"round {r} population {p}: never sent")
                    continue
                users = plan.users_of(r, p)
                sums = self.algo.aggregate(self.payload(tuple(sent[a]["pool"][q])), users)
                want = add_sums(want, {f: np.asarray(v, dtype=float).reshape(-1) for f, v in sums.items()})
            got = plan.assemble([shard[r] for shard in totals])
            want = {f: v.reshape(plan.sum_spec[f]) for f, v in (want or {}).items()}
            if set(got) != set(want) or not all(np.array_equal(got[f], want[f]) for f in want):
                errors.append(f"round {r}: the shards' aggregate differs from the recomputation")
            if len(errors) >= 5:
                break
        return errors


def steady_window(t0: float, call_logs: list[list]) -> dict:
    """Rates over the level's steady window: from t0 to the end of the first shard's last call, i.e. while every
    shard still had work (after it, the shards drain their backlogs unevenly and the first done sits idle; that tail
    is left out of the rates but not of the checks: every message of the level is counted and verified). Per shard:
    busy = time inside its calls, clipped to the window / window; folding and CPU = its fold and process CPU time
    up to its last call that ended inside the window / window. user_messages: those of calls ended in the window."""
    end = min(max(c[1] for c in log) for log in call_logs)
    seconds = max(end - t0, 1e-9)
    busy, folding, cpu, users = [], [], [], 0
    for log in call_logs:
        inside = [c for c in log if c[1] <= end]
        busy.append(sum(max(0.0, min(c[1], end) - max(c[0], t0)) for c in log) / seconds)
        folding.append((inside[-1][4] if inside else 0.0) / seconds)
        cpu.append((inside[-1][3] if inside else 0.0) / seconds)
        users += sum(c[2] for c in inside)
    return {"seconds": seconds, "busy": busy, "folding": folding, "cpu": cpu, "user_messages": users}


def capacity_table(rows: list[dict]) -> list[str]:
    """The capacity table of docs/figures.md (markdown) from run_capacity's rows: per S and level, the sustained per-user
    messages/s, p50 / p99 latency, and the shards' busy fraction and CPU share (lowest-highest shard)."""
    span = lambda xs: (f"{100 * min(xs):.0f}%" if round(100 * min(xs)) == round(100 * max(xs))   # noqa: E731
                       else f"{100 * min(xs):.0f}-{100 * max(xs):.0f}%")
    levels = list(dict.fromkeys(r["level"] for r in rows))
    names = ["capacity (closed-loop probe)" if lv == "probe" else lv for lv in levels]
    lines = ["| shards | " + " | ".join(names) + " |",
             "| ---: | " + " | ".join("---" for _ in levels) + " |"]
    for S in dict.fromkeys(r["shards"] for r in rows):
        cells = []
        for lv in levels:
            r = next((x for x in rows if x["shards"] == S and x["level"] == lv), None)
            if r is None:
                cells.append("")
                continue
            cell = f"{r['user_messages_per_s']:,.0f}/s"
            if r["p50_ms"] is not None:
                cell += f", {r['p50_ms']:,.0f} / {r['p99_ms']:,.0f} ms"
            cells.append(cell + f", busy {span(r['shard_busy'])} (CPU {span(r['shard_cpu'])})")
        lines.append(f"| {S} | " + " | ".join(cells) + " |")
    return lines


def _cpu_jiffies() -> tuple[int, int, int] | None:
    """(busy, of which niced, total) jiffies of the whole machine (every process, other users' too), /proc/stat."""
    try:
        with open("/proc/stat") as f:
            values = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return sum(values) - idle, values[1], sum(values)


def run_capacity(algorithm="ldp-sgd", d=10, K=10, shard_counts=(1, 2, 4), populations=8, users_per_message=1250,
                 senders=2, batch=256, max_in_flight=2, levels=(25, 50, 75, 100, 125), level_seconds=4.0,
                 probe_rounds=8000, pool_rounds=2, max_rounds=40000, linger_ms=20.0, check_domains=True, seed=0,
                 log=print):
    """The capacity curve: per S, a closed-loop probe measures the capacity C (per-user messages/s), then open-loop
    levels at `levels` percent of C. After every level, every round's aggregate is collected from the shards and
    compared with the driver's recomputation. Returns (ok, rows); ok iff every message of every level was accepted
    once and every aggregate is exact."""
    B = populations * users_per_message
    config = RunConfig(algorithm, env="linear", users=max_rounds * B, round_size=B, populations=populations,
                       seed=seed, env_params={"d": d, "K": K})
    algo = make_algorithm(make_env(config), config)
    recomputation = PoolRecomputation(config, algo)
    senders = min(senders, populations)
    # contiguous blocks of populations per sender, so that every shard (population p goes to shard p % S) is fed by
    # every sender and one sender's hiccup does not starve a shard
    populations_of = [[p for p in range(populations) if p * senders // populations == a] for a in range(senders)]
    hosts = [RemoteLoadSender.options(num_cpus=0).remote(config, pops, pool_rounds, batch) for pops in populations_of]
    ray.get([h.__ray_ready__.remote() for h in hosts])
    ok, rows = True, []
    try:
        for S in shard_counts:
            plan = make_plan(algo, config, S, "per-user", "population")
            shards = [RemoteStressShard.options(num_cpus=0).remote(config, plan, s, max_open_rounds=max_rounds)
                      for s in range(S)]
            try:
                capacity = None
                for label in ["probe"] + [f"{level:g}%" for level in levels]:
                    level = None if label == "probe" else float(label[:-1])
                    rate_users = np.inf if level is None else capacity * level / 100.0
                    rounds = probe_rounds if level is None else max(2, int(rate_users * level_seconds / B))
                    rounds = min(rounds, max_rounds)
                    ray.get([s.configure.remote(config, plan, i, max_rounds) for i, s in enumerate(shards)])
                    ray.get([s.set_check_domains.remote(check_domains) for s in shards])
                    per_sender = rate_users / users_per_message / senders
                    t0 = time.time() + 0.2
                    load, jiffies = _loadavg(), _cpu_jiffies()
                    sent = ray.get([h.run.remote(shards, per_sender, rounds, batch, linger_ms / 1e3, max_in_flight,
                                                 t0) for h in hosts])
                    stats = ray.get([s.stats.remote() for s in shards])
                    jiffies_after = _cpu_jiffies()
                    wall = max(x["finished"] for x in sent) - t0
                    totals = ray.get([s.collect_rounds.remote(rounds) for s in shards])
                    errors = recomputation.check(plan, rounds, populations_of, sent, totals)
                    accepted = sum(x["accepted"] for x in sent)
                    messages = sum(x["messages"] for x in sent)
                    delivery = LatencyHistogram()
                    for st in stats:
                        delivery.merge(st["delivery_counts"])
                    window = steady_window(t0, [st["call_log"] for st in stats])
                    throughput = window["user_messages"] / window["seconds"]
                    if level is None:
                        capacity = throughput
                    lost = messages - accepted
                    machine = niced = None
                    if jiffies and jiffies_after and jiffies_after[2] > jiffies[2]:
                        machine, niced = [(jiffies_after[i] - jiffies[i]) / (jiffies_after[2] - jiffies[2])
                                          for i in (0, 1)]
                    row = {"shards": S, "level": label, "target_user_messages_per_s": None if level is None else
                           rate_users, "user_messages_per_s": throughput, "window_s": window["seconds"],
                           "whole_level_user_messages_per_s": accepted * users_per_message / wall,
                           "population_messages": messages,
                           "users_per_message": users_per_message, "accepted": accepted, "lost_or_rejected": lost,
                           "aggregates_exact": not errors, "errors": errors,
                           "seconds": wall, "p50_ms": None if level is None else delivery.quantile(0.5) * 1e3,
                           "p99_ms": None if level is None else delivery.quantile(0.99) * 1e3,
                           "shard_busy": window["busy"], "shard_folding": window["folding"],
                           "shard_cpu": window["cpu"],
                           "whole_level_shard_busy": [st["call_busy_s"] / wall for st in stats],
                           "whole_level_shard_cpu": [st["cpu_s"] / wall for st in stats],
                           "messages_per_call": accepted / max(sum(st["calls"] for st in stats), 1),
                           "sender_cpu": [x["cpu_s"] / wall for x in sent],
                           "sender_waited_p99_ms": max(x["waited_p99_s"] for x in sent) * 1e3,
                           "machine_cpu": machine, "machine_cpu_niced": niced, "check_domains": check_domains,
                           "load_average": load}
                    rows.append(row)
                    ok = ok and lost == 0 and sum(st["rejected"] for st in stats) == 0 and not errors
                    pct = lambda xs: ", ".join(f"{100 * x:.0f}%" for x in xs)   # noqa: E731
                    log(f"S={S} {label:>5}: " + ("" if level is None else f"target {rate_users:,.0f}, ") +
                        f"sustained {throughput:,.0f} user messages/s over {window['seconds']:.2f} s (whole level "
                        f"{row['whole_level_user_messages_per_s']:,.0f}/s: {messages} messages of {users_per_message} "
                        f"users, {row['messages_per_call']:.1f} per call, {wall:.2f} s), " + ("" if level is None
                        else f"latency p50 {row['p50_ms']:.1f} ms p99 {row['p99_ms']:.1f} ms, ") +
                        f"shards busy {pct(row['shard_busy'])} (folding {pct(row['shard_folding'])}, "
                        f"CPU {pct(row['shard_cpu'])}), senders CPU {pct(row['sender_cpu'])}, machine CPU "
                        f"{'?' if machine is None else f'{100 * machine:.0f}% (niced {100 * niced:.0f}%)'} of "
                        f"{os.cpu_count()} cores, "
                        f"{'all accepted once' if lost == 0 else f'{lost} NOT accepted'}, aggregates "
                        f"{'exact' if not errors else 'WRONG'}; load average {load}")
                    for error in errors:
                        log(f"  FAIL: {error}")
            finally:
                for s in shards:
                    ray.kill(s)
    finally:
        for h in hosts:
            ray.kill(h)
    return ok, rows


def _start_ray(attempts: int = 3) -> bool:
    """ensure_ray, retried: on a loaded machine a new local Ray can miss its fixed 30 s start-up window.

    A Ray this job starts runs its workers (shards, senders) at the job's own niceness: Ray's default renices them
    to 15, which on a shared machine makes the benchmark compete with other users' background (nice 19) jobs on
    almost equal terms. RAY_worker_niceness set by the caller wins."""
    os.environ.setdefault("RAY_worker_niceness", str(os.nice(0)))
    for attempt in range(attempts):
        try:
            return ensure_ray(None, log_to_driver=False)
        except Exception as error:   # noqa: BLE001 - Ray raises a bare Exception for this
            if attempt == attempts - 1 or "timed out during startup" not in str(error):
                raise
            ray.shutdown()
            print(f"stress: Ray start-up timed out (load average {_loadavg()}); retrying", flush=True)
    return False


def _loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


# ---- poisoning within the domain -------------------------------------------------------------------------------

def poison(algorithm: str, algo, env, messages: dict, users: np.ndarray, bad: np.ndarray) -> None:
    """Replace the messages of the users `bad` (boolean) by valid-looking ones that pull one way (in place)."""
    if algorithm == "ldp-sgd":
        # every output the same point of the sphere: theta <- theta - eta Z moves against the truth
        direction = env.theta / np.linalg.norm(env.theta)
        messages["Z"][bad] = algo.mech.B * direction
    elif algorithm == "ldp-ols":
        # u at the Gaussian tail bound of every coordinate, against the sign of the truth
        high = algo.message_domains()["u"].high
        messages["u"][bad] = -high * np.where(env.theta >= 0, 1.0, -1.0)
    elif algorithm in ("sw-klucb-cf", "klucb-cf"):
        # feedback 0 when the pulled arm is the best arm of the moment, 1 otherwise (bits in the pulled slot: in the
        # domain): the best arm is demoted, the others promoted
        pulls = messages["pulls"][bad]
        best = np.argmax(env.means_at(users[bad]), axis=1)
        messages["feedback"][bad] = pulls * (np.argmax(pulls, axis=1) != best)[:, None]
    else:
        raise ValueError(f"no in-domain attack written for {algorithm}")


# The papers' settings (seed 000: d = 2, K = 10; seed 004: K = 5, 4 breakpoints). sw-klucb-cf runs rounds of 10
# users: with rounds of 100 its window (348 users at T = 1e5) holds only a few rounds, arms with no pull in the window
# get the largest index, and the arms are played in turn whatever the feedback says (nothing to poison).
IN_DOMAIN = {"ldp-sgd": {"env_params": {"d": 2, "K": 10}}, "ldp-ols": {"env_params": {"d": 2, "K": 10}},
             "sw-klucb-cf": {"env_params": {"K": 5, "breakpoints": 4}, "round_size": 10}}


def run_in_domain(algorithms=tuple(IN_DOMAIN), fractions=(0.001, 0.003, 0.01, 0.03, 0.1), users=100_000,
                  round_size=100, seeds=(0, 1, 2), log=print):
    """Per algorithm and fraction f: runs with f of the users poisoning within the domain (the same seeds as the
    honest runs, f = 0), every message checked and accepted by a shard (per-user mode, in process); figures are
    means over the seeds. Returns (ok, rows), ok iff no poisoned message was rejected (they are all in the domain)."""
    rows, ok = [], True
    for algorithm in algorithms:
        honest = {}
        for f in (0.0, *fractions):
            runs = []
            for seed in seeds:
                run, accepted = _poisoned_run(algorithm, f, users, round_size, seed, log)
                ok = ok and accepted
                if f == 0.0:
                    honest[seed] = run
                runs.append(run)
            has_estimate = runs[0]["estimate"] is not None
            mean = lambda key: float(np.mean([run[key] for run in runs]))   # noqa: E731
            row = {"algorithm": algorithm, "fraction": f, "attackers": runs[0]["attackers"], "users": users,
                   "round_size": runs[0]["round_size"],
                   "seeds": len(seeds), "regret": mean("regret"),
                   "regret_ratio": mean("regret") / float(np.mean([honest[s]["regret"] for s in seeds])),
                   "estimation_error": mean("error") if has_estimate else None,
                   "estimate_shift": float(np.mean([np.linalg.norm(run["estimate"] - honest[s]["estimate"])
                                                    for run, s in zip(runs, seeds)])) if has_estimate else None,
                   "rejected": sum(run["rejected"] for run in runs)}
            rows.append(row)
            log(f"{algorithm} f={100 * f:g}% ({row['attackers']} of {users} users, {len(seeds)} seeds): regret "
                f"{row['regret']:,.1f} (x{row['regret_ratio']:.2f})" + ("" if not has_estimate else
                f", estimate moved {row['estimate_shift']:.3f}, error {row['estimation_error']:.3f}") +
                f"; poisoned messages rejected: {row['rejected']}")
    return ok, rows


def _poisoned_run(algorithm, f, users, round_size, seed, log):
    setting = dict(IN_DOMAIN.get(algorithm, {}))
    config = RunConfig(algorithm, users=users, round_size=setting.pop("round_size", round_size), populations=1,
                       seed=seed, **setting)
    env = make_env(config)
    algo = make_algorithm(env, config)
    plan = make_plan(algo, config, 1, "per-user", "population")
    core = ShardCore(plan, 0, algo)
    attackers = np.random.default_rng([seed, 12]).permutation(users) < round(f * users)   # nested as f grows
    state = algo.initial_state(derive(config.seed, "init"))
    regret, accepted = 0.0, True
    for r in range(config.rounds):
        start, stop = plan.round_bounds(r)
        users_r = np.arange(start, stop)
        messages, round_regret, _ = simulate_population(algo, env, algo.publish(state), config.seed, r, 0, users_r,
                                                        pre_aggregate=False)
        bad = attackers[users_r]
        if bad.any():
            poison(algorithm, algo, env, messages, users_r, bad)
        if core.fold([(algorithm, r, 0, messages)]) != (1, 0):
            log(f"FAIL: {algorithm} f={f} seed {seed}: round {r} rejected: {core.rejected_by_reason}")
            return {"regret": regret, "estimate": None, "error": None, "attackers": int(attackers.sum()),
                    "rejected": core.rejected, "round_size": config.round_size}, False
        state = algo.update(state, plan.assemble([core.collect(r)]), start, stop, derive(config.seed, "server", r))
        regret += round_regret
    estimate = algo.estimate(state)
    return {"regret": regret, "estimate": None if estimate is None else np.asarray(estimate),
            "round_size": config.round_size,
            "error": env.estimation_error(estimate) if estimate is not None else None,
            "attackers": int(attackers.sum()), "rejected": core.rejected}, accepted


def plot_in_domain(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for algorithm in dict.fromkeys(r["algorithm"] for r in rows):
        mine = [r for r in rows if r["algorithm"] == algorithm and r["fraction"] > 0]
        f = [100 * r["fraction"] for r in mine]
        axes[0].plot(f, [r["regret_ratio"] for r in mine], marker="o", label=algorithm)
        if mine[0]["estimate_shift"] is not None:
            axes[1].plot(f, [r["estimate_shift"] for r in mine], marker="o", label=algorithm)
    axes[0].set(xscale="log", xlabel="poisoning users (%)", ylabel="regret / honest regret",
                title="regret under in-domain poisoning")
    axes[1].set(xscale="log", xlabel="poisoning users (%)", ylabel="||estimate - honest estimate||",
                title="estimate moved")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithm", default=None,
                        help="default ldp-ols (exactness), ldp-sgd (capacity); in-domain: ldp-sgd,ldp-ols,sw-klucb-cf")
    parser.add_argument("--d", type=int, default=10)
    parser.add_argument("--K", type=int, default=10)
    parser.add_argument("--shards", default="1,2,4", help="comma-separated shard counts")
    parser.add_argument("--populations", type=int, default=None, help="default 32 (exactness), 8 (capacity)")
    parser.add_argument("--users-per-message", type=int, default=None,
                        help="users per (population, round) message; default 50 (exactness), 1250 (capacity)")
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--senders", type=int, default=2, help="sender (population) actors")
    parser.add_argument("--batch", type=int, default=None,
                        help="messages per fold call (default 8); capacity: at most this many (default 256)")
    parser.add_argument("--layout", default="population", choices=["population", "block"],
                        help="population: whole messages to shard p %% S; block: every message cut by key ranges")
    parser.add_argument("--max-in-flight", type=int, default=None,
                        help="fold calls outstanding per sender (capacity: per sender and shard); default 8 (2)")
    parser.add_argument("--linger-ms", type=float, default=20.0,
                        help="capacity: a call leaves when --batch messages are due or its oldest waited this long")
    parser.add_argument("--inject", type=int, default=8, help="duplicates and corrupted messages per sender")
    parser.add_argument("--attack", choices=["out-of-domain", "in-domain"], default=None)
    parser.add_argument("--fraction", default=None, help="out-of-domain: bad copies per message (default 0.1); "
                        "in-domain: comma-separated fractions of poisoning users (default 0.001,0.003,0.01,0.03,0.1)")
    parser.add_argument("--users", type=int, default=100_000, help="in-domain: users per run")
    parser.add_argument("--round-size", type=int, default=100, help="in-domain: users per round")
    parser.add_argument("--seeds", type=int, default=3, help="in-domain: seeds per fraction (figures are means)")
    parser.add_argument("--plot", default=None, help="in-domain: write the PNG plot here")
    parser.add_argument("--capacity", action="store_true", help="the open-loop capacity curve")
    parser.add_argument("--levels", default="25,50,75,100,125", help="capacity: percent of the measured capacity")
    parser.add_argument("--level-seconds", type=float, default=4.0, help="capacity: seconds of load per level")
    parser.add_argument("--probe-rounds", type=int, default=8000,
                        help="capacity: rounds of the closed-loop probe (8000 x 10,000 users by default)")
    parser.add_argument("--no-domain-checks", action="store_true",
                        help="turn the shards' domain checks off: ONLY to measure what they cost")
    parser.add_argument("--max-seconds", type=float, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="write the report rows here")
    args = parser.parse_args(argv)
    shard_counts = [int(x) for x in args.shards.split(",") if x.strip()]
    log = lambda line: print(line, flush=True)   # noqa: E731
    checks = not args.no_domain_checks
    if args.attack == "in-domain":
        algorithms = args.algorithm.split(",") if args.algorithm else list(IN_DOMAIN)
        fractions = [float(x) for x in (args.fraction or "0.001,0.003,0.01,0.03,0.1").split(",")]
        print(f"stress: in-domain poisoning of {algorithms}, {args.users:,} users, rounds of {args.round_size}, "
              f"fractions {fractions}", flush=True)
        seeds = list(range(args.seed, args.seed + args.seeds))
        ok, rows = run_in_domain(algorithms, fractions, args.users, args.round_size, seeds, log=log)
        if args.plot:
            plot_in_domain(rows, args.plot)
            print(f"stress: plot written to {args.plot}")
    else:
        started = _start_ray()
        try:
            if args.capacity:
                algorithm = args.algorithm or "ldp-sgd"
                P, upm = args.populations or 8, args.users_per_message or 1250
                batch, in_flight = args.batch or 256, args.max_in_flight or 2
                print(f"stress: capacity of {algorithm} d={args.d} per-user messages, {P} populations x {upm} users "
                      f"per message (a round of {P * upm:,} users), {args.senders} senders, up to {batch} messages "
                      f"per call (linger {args.linger_ms:g} ms), {in_flight} calls in flight per sender and shard, "
                      f"domain checks "
                      f"{'on' if checks else 'OFF'}; load average {_loadavg()}", flush=True)
                ok, rows = run_capacity(algorithm, args.d, args.K, shard_counts, P, upm, args.senders, batch, in_flight,
                                        [float(x) for x in args.levels.split(",") if x.strip()], args.level_seconds,
                                        probe_rounds=args.probe_rounds, linger_ms=args.linger_ms, check_domains=checks,
                                        seed=args.seed, log=log)
                print("\n".join(["stress: the capacity table (docs/figures.md):"] + capacity_table(rows)), flush=True)
            else:
                algorithm = args.algorithm or ("ldp-ols" if "ldp-ols" in REGISTRY else "uniform")
                P, upm = args.populations or 32, args.users_per_message or 50
                batch, in_flight = args.batch or 8, args.max_in_flight or 8
                fraction = float(args.fraction or 0.1) if args.attack == "out-of-domain" else 0.0
                print(f"stress: {algorithm} d={args.d} K={args.K}, {P} populations x {upm} users x {args.rounds} "
                      f"rounds = {P * upm * args.rounds:,} per-user messages per shard count; {args.senders} senders, "
                      f"batch {batch}, {in_flight} calls in flight each; out-of-domain copies: {fraction:g} per "
                      f"message; domain checks {'on' if checks else 'OFF'}", flush=True)
                ok, rows = run_stress(algorithm, args.d, args.K, shard_counts, P, upm, args.rounds, args.senders,
                                      batch, in_flight, args.inject, args.max_seconds, args.seed, log=log,
                                      layout=args.layout, attack_fraction=fraction, check_domains=checks)
        finally:
            if started:
                ray.shutdown()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2, default=str)
    print("stress: OK" if ok else "stress: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
