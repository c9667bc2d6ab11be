"""Exactness under load and attack: every message folded once, exactly the bad ones rejected, the sums exact.

The messages are real: each sender actor runs the algorithm's client half (`simulate_population`, with the
per-user privatized messages of `algo.encode`) for its populations, from the run's derived seeds, BEFORE the clock
starts; then, per shard count S, it sends them (split by the shard plan of the Ray engine) as fast as it can,
`batch` (population, round) messages per call, at most `max_in_flight` calls outstanding. It also re-sends
`inject` messages it already sent (duplicates) and `inject` corrupted ones (a NaN), which must be rejected; with
attack_fraction f it adds f x (its messages) out-of-domain copies (`ldpfed.stress.attacks.out_of_domain`), sent before
the genuine ones. The proof: every round's aggregate collected from the shards must equal an independent
recomputation by the single-process engine's backend from the same seeds, every (population, round) must be
counted once, and exactly the injected messages must be rejected (100% of the bad ones, 0 honest ones). Reported
per S: sustained per-user messages per second, fold latency p50/p99, delivery latency p50/p99, how busy the
busiest shard was, peak RSS.
"""
from __future__ import annotations

import time

import numpy as np
import ray

from ldpfed.algorithms import make_algorithm
from ldpfed.config import RunConfig
from ldpfed.engine.core import population_users, round_bounds, simulate_population
from ldpfed.engine.local import LocalBackend
from ldpfed.engine.ray_shard import LatencyHistogram, make_plan, peak_rss_bytes
from ldpfed.envs import make_env
from ldpfed.stress.attacks import out_of_domain
from ldpfed.stress.shard import RemoteStressShard
from ldpfed.util.rng import derive


class Sender:
    """Hosts populations; generates their per-user messages once, then sends them to the shards on demand."""

    def __init__(self, config, populations: list[int]):
        self.config, self.populations = config, populations
        self.env = make_env(config)
        self.algo = make_algorithm(self.env, config)
        model = self.algo.publish(self.algo.initial_state(derive(config.seed, "init")))
        self.messages = {}    # (round, population) -> per-user messages
        for r in range(config.rounds):
            start, stop = round_bounds(r, config.round_size, config.users)
            for p in populations:
                users = population_users(start, stop, p, config.populations)
                if len(users):
                    payload, _, _ = simulate_population(self.algo, self.env, model, config.seed, r, p, users,
                                                        pre_aggregate=False)
                    self.messages[(r, p)] = payload
        self.queue = []

    def prepare(self, plan, shards, inject: int, seed: int, attack_fraction: float = 0.0) -> tuple:
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


def recompute(config) -> list[dict]:
    """Every round's aggregate under the initial model (what the senders' messages were made with), by the
    single-process engine's backend (population sums added in population order, as run_local adds them)."""
    env = make_env(config)
    algo = make_algorithm(env, config)
    model = algo.publish(algo.initial_state(derive(config.seed, "init")))
    local = LocalBackend()
    local.open(config, algo, env, 0)
    return [local.simulate(model, r, *round_bounds(r, config.round_size, config.users))[0]
            for r in range(config.rounds)]


def check(config, plan, expected, totals, stats, counts, injected):
    """(figures, errors) of one shard count: the aggregates assembled from the shards' totals (totals[r][s])
    against `expected` (recompute), every message sent once folded once, exactly `injected` rejected."""
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
        users = sum(len(plan.users_of(r, p)) for r in range(config.rounds) for p in range(config.populations)
                    if plan.sends_to(p, s))
        if st["user_messages"] != users:
            errors.append(f"shard {s}: {st['user_messages']} user messages folded, {users} sent once")
    rejected = sum(st["rejected"] for st in stats)
    if rejected != injected:
        reasons = [st["rejected_by_reason"] for st in stats]
        errors.append(f"{rejected} messages rejected, {injected} injected ({reasons})")
    return {"accepted": accepted, "rejected": rejected, "errors": errors}, errors


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
            shards = [RemoteStressShard.options(num_cpus=0).remote(config, plan, s, max_open_rounds=config.rounds,
                                                                   check_domains=check_domains)
                      for s in range(S)]
            try:
                ray.get([s.__ray_ready__.remote() for s in shards], timeout=max(deadline - time.monotonic(), 1))
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
                row, errors = check(config, plan, expected, totals, stats, counts, injected)
                row.update(_figures(S, plan, elapsed, check_domains, bad_sent, injected, row, errors, stats, sent,
                                    config.users))
                rows.append(row)
                _log_row(log, row, injected, bad_sent, errors)
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


def _figures(S, plan, elapsed, check_domains, bad_sent, injected, row, errors, stats, sent, users) -> dict:
    latency, delivery = LatencyHistogram(), LatencyHistogram()
    for st in stats:
        latency.merge(st["latency_counts"])
        delivery.merge(st["delivery_counts"])
    user_messages = users if not errors else sum(st["user_messages"] for st in stats)
    return {
        "shards": S, "layout": plan.layout, "seconds": elapsed, "check_domains": check_domains,
        "out_of_domain_sent": bad_sent, "out_of_domain_rejected": sum(
            v for st in stats for k, v in st["rejected_by_reason"].items() if k.startswith("out of domain")),
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
    }


def _log_row(log, row, injected, bad_sent, errors) -> None:
    log(f"S={row['shards']} ({row['layout']}): {row['messages_per_s']:,.0f} user messages/s "
        f"({row['population_messages_per_s']:,.0f} population messages/s, {row['calls']} calls) "
        f"fold p50 {row['fold_p50_ms']:.3f} ms p99 {row['fold_p99_ms']:.3f} ms, "
        f"delivery p50 {row['delivery_p50_ms']:.1f} ms p99 {row['delivery_p99_ms']:.1f} ms, "
        f"busiest shard folding {100 * row['shard_busy']:.0f}% of the time, "
        f"peak RSS shards {row['peak_rss_shards_mb']:.0f} MB senders {row['peak_rss_senders_mb']:.0f} MB "
        f"driver {row['peak_rss_driver_mb']:.0f} MB; {row['user_messages']:,} user messages folded once, "
        f"{row['rejected']} rejected of {injected} injected"
        + (f" ({row['out_of_domain_rejected']} of {bad_sent} out-of-domain copies rejected as out of domain, "
           f"{row['honest_rejected']} honest messages rejected)" if bad_sent else "")
        + f": {'OK' if not errors else 'FAIL'}")
    for error in errors:
        log(f"  FAIL: {error}")
