"""What the stress tests add to the engine's shard actor, and to a local Ray on a shared machine."""
from __future__ import annotations

import time

import ray

from ldpfed.engine.ray_engine import ShardActor, ensure_ray


class StressShard(ShardActor):
    """The engine's shard actor, plus a fold of a BUNDLE of messages (capacity: one object in Ray's store holding
    several clients' messages, each with its own header and scheduled time), and collecting many rounds in one call.

    Busy (capacity): `fold_bundle` times itself from its first line, before it fetches the bundle from the object
    store, to the end of its last message's fold: the shard has messages in hand (fetch, unpickle, the checks of
    `ShardCore.fold`, the domain checks, `aggregate`). Not counted: Ray's own work between two calls in the same
    process (receiving the call, its arguments' headers, sending the reply), which shows in the process CPU time."""

    def configure(self, *args, **kwargs):
        node = super().configure(*args, **kwargs)
        self.call_busy_s, self.calls, self.cpu_started = 0.0, 0, time.process_time()
        self.call_log = []     # per fold_bundle call: start, end (wall clock), users folded, CPU and fold s so far
        return node

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


def start_ray(attempts: int = 3) -> bool:
    """ensure_ray, retried: on a loaded machine a new local Ray can miss its fixed 30 s start-up window.

    A Ray this starts runs its workers (shards, senders) at the caller's own niceness (see ensure_ray)."""
    for attempt in range(attempts):
        try:
            return ensure_ray(None, log_to_driver=False)
        except Exception as error:   # noqa: BLE001 - Ray raises a bare Exception for this
            if attempt == attempts - 1 or "timed out during startup" not in str(error):
                raise
            ray.shutdown()
            print(f"stress: Ray start-up timed out (load average {loadavg()}); retrying", flush=True)
    return False


def loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def cpu_jiffies() -> tuple[int, int, int] | None:
    """(busy, of which niced, total) jiffies of the whole machine (every process, other users' too), /proc/stat."""
    try:
        with open("/proc/stat") as f:
            values = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return sum(values) - idle, values[1], sum(values)
