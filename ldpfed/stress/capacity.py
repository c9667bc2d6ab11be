"""The capacity curve of the server shards, measured by an open-loop load generator.

A message is one population's users of one round (--users-per-message users, 1,250 by default: the engine's own
message at its benchmark setting, B = 10,000 users per round from 8 populations, each population sending its
round's users in ONE message). Each sender generates a small
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
"""
from __future__ import annotations

import os
import time

import numpy as np
import ray

from ldpfed.algorithms import make_algorithm
from ldpfed.config import RunConfig
from ldpfed.engine.core import add_sums, population_users, round_bounds, simulate_population
from ldpfed.engine.ray_shard import LatencyHistogram, make_plan, peak_rss_bytes
from ldpfed.envs import make_env
from ldpfed.stress.shard import RemoteStressShard, cpu_jiffies, loadavg
from ldpfed.util.rng import derive


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
        payloads = [simulate_population(algo, env, model, config.seed, r, p, population_users(
            *round_bounds(r, config.round_size, config.users), p, config.populations), pre_aggregate=False)[0]
            for r, p in self.pool]
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
            users = population_users(*round_bounds(r, self.config.round_size, self.config.users), p,
                                     self.config.populations)
            self.payloads[made_for] = simulate_population(self.algo, self.env, self.model, self.config.seed, r, p,
                                                          users, pre_aggregate=False)[0]
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
    """The capacity table of docs/figures.md (markdown) from run_capacity's rows: per S and level, the sustained
    per-user messages/s, p50 / p99 latency, and the shards' busy fraction and CPU share (lowest-highest shard)."""
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
                    ray.get([s.configure.remote(config, plan, i, max_rounds, check_domains=check_domains)
                             for i, s in enumerate(shards)])
                    per_sender = rate_users / users_per_message / senders
                    t0 = time.time() + 0.2
                    load, jiffies = loadavg(), cpu_jiffies()
                    sent = ray.get([h.run.remote(shards, per_sender, rounds, batch, linger_ms / 1e3, max_in_flight,
                                                 t0) for h in hosts])
                    stats = ray.get([s.stats.remote() for s in shards])
                    jiffies_after = cpu_jiffies()
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
