"""The server side of the Ray engine without Ray: how the aggregates are split into shard keys, and what a shard
does with a message. `ray_engine` wraps `ShardCore` in an actor; tests and jobs can drive it directly.

Keys. The round's aggregate is the dict of field-wise sums that `algo.aggregate` returns. Its fields, flattened
and laid end to end (in sorted field order), are cut into `shards` contiguous ranges of near-equal size; shard s
owns the segments (field, lo, hi) of its range. Every element of the aggregate is therefore folded by exactly one
shard, and a shard folds the populations of a round in population order (out-of-order arrivals wait, as small
population sums, until the ones before them are folded), which is the order `run_local` adds them in: the sums
are bit-identical whatever the number of actors, shards or nodes.

Messages. A message is the tuple (algorithm, round, population, payload); payload maps each field the shard owns
to an array: the population's sum slice, float64 (as run_local adds sums), shape (hi - lo,), in "pre-aggregated"
mode; in "per-user" mode every user's privatized message (or its slice), in the dtype `encode` produces (probed
once at start on real messages), where the shard applies `algo.aggregate` itself (users are public: the shard
derives them from (round, population)).
Per-user mode uses layout "population" by default: population p sends its whole messages to shard p % shards,
which validates and aggregates them into the population's sums (the heavy part); the coordinator then adds the
populations' sums in population order, so the result is bit-identical to run_local's. Layout "block" (key
ranges, as in pre-aggregated mode) is used in per-user mode only when asked for and when `aggregate` gives
bit-identical sums on column slices (checked at start by a probe; not true of e.g. a BLAS product whose rounding
depends on the width); each user's message is then cut into one slice per shard.

Under the shuffle trust model (layout "shuffled", per-user mode only) no population reaches a shard: shuffler
actors send `ShuffledChunk`s (algorithm, round, shuffler, chunk, payload), a permuted chunk of a shuffler's share of
the round with no population and no user index (ldpfed.trust.shuffling fixes the shares, chunk sizes and which
shard gets which chunk). The shard aggregates each chunk without its users (`shuffling.anonymous_aggregate`) and
keeps the sums per (shuffler, chunk); the coordinator adds them in that order, as run_local does
(`core.shuffled_sums`). A chunk's domain checks are those of its users as a multiset (`Domain.anonymous_reason`):
what depends on no user as usual, and a public schedule (exact counts, sent slots, scheduled arms) against the
schedule of the shuffler's users.

A message is REJECTED and COUNTED, the shard's state unchanged, when: it is not a 4-tuple; the algorithm is not
the run's; the round is not open (closed, or beyond the window of open rounds); the population has no users in
that round (shuffled: a chunk the plan does not send this shard); the (population, round) or (shuffler, chunk,
round) was already received; the payload's fields, dtype (float64) or shapes do not
match the plan (derived from `algo.message_spec()` and the probe); a value is not finite; a value lies outside
the field's output domain (below); a domain checks a public choice against the round's published model (a
scheduled arm) and the shard does not hold that model ("no published schedule": not published yet, or forgotten
by a recreated, resumed or rewound shard; the coordinator publishes it with every round's fold call); or
aggregating it fails.

Domains (the shard trusts no client). Per-user mode: every field of every user must lie in the domain the
algorithm declares (`algo.message_domains()`: the output domain of the mechanism that made it, e.g. the l2-ball
sphere, bits, a Gaussian tail bound, or the public schedule: one-hot scheduled arms, public counts, unit
directions; in block layout a slice of a field gets the checks a slice allows, a whole field all of them);
pre-aggregated mode: every population sum must lie in what its n honest users can produce
(`algo.aggregate_bounds(users)`: n B-type norm bounds with the public weights of `aggregate`, [0, n] for bit
sums, exact public counts, Gaussian tail bounds of sums), and a running total must stay finite. Rejected messages
are counted by reason ("out of domain (<field>): <why>"). `check_domains=False` turns this off (for measuring
its cost only).
"""
from __future__ import annotations

import math
import resource
import time
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ldpfed.trust.shuffling import anonymous_aggregate, chunk_bounds, chunks_of_shard, share_bounds
from ldpfed.trust import trust_model
from ldpfed.engine.core import add_sums, on_time_users, round_bounds, sample_messages
from ldpfed.federation.rounds import round_senders
from ldpfed.federation import federation_model
from ldpfed.mechanisms.domains import symmetric_reason

FLOAT = np.dtype(np.float64)
MODES = ("pre-aggregated", "per-user")
NO_MODEL = "no published schedule"    # the rejection of a message whose check needs a model the shard lacks


def _reads_model(check) -> bool:
    """Whether a Domain's or SumBounds' check compares a public choice with the round's published model."""
    return getattr(check, "scheduled", None) is not None and getattr(check, "published", None) is not None


class WireMessage(NamedTuple):
    """What a population sends a server shard: the run's algorithm, the round, the population and the payload
    (field -> array: per-user messages in per-user mode, their sums in pre-aggregated mode, for this shard's keys
    only). A shard trusts none of it: `ShardCore.fold` checks every part (any 4-tuple is read the same way)."""

    algorithm: str
    round: int
    population: int
    payload: dict


class ShuffledChunk(NamedTuple):
    """What a shuffler sends a server shard under the shuffle trust model (layout "shuffled"): a chunk of its share of
    a round, permuted, with no population and no user index. (shuffler, chunk) are the chunk's place in the public
    plan (ldpfed.trust.shuffling), which fixes its size and the order of the sums, not who sent it."""

    algorithm: str
    round: int
    shuffler: int
    chunk: int
    payload: dict


@dataclass(frozen=True)
class Segment:
    field: str
    lo: int
    hi: int

    @property
    def size(self) -> int:
        return self.hi - self.lo


@dataclass(frozen=True)
class ShardPlan:
    algorithm: str
    mode: str
    shards: int
    users: int                   # T
    round_size: int              # B
    populations: int             # P
    message_spec: dict           # field -> per-user shape (algo.message_spec())
    sum_spec: dict               # field -> shape of the aggregated field
    segments: tuple              # per shard: tuple of Segment
    layout: str                  # "block" (key ranges), "population" (per-user mode, whole messages by population)
                                 # or "shuffled" (per-user mode through shufflers: whole messages by chunk)
    message_dtypes: dict = None  # field -> dtype of the per-user messages `encode` produces (per-user wire format)
    shufflers: int = 0           # S under the shuffle trust model (layout "shuffled"), else 0
    federation: object = None    # the run's federation model (ldpfed.federation): who of a round takes part

    # ---- what a round looks like ---------------------------------------------------------------
    def round_bounds(self, round_index: int) -> tuple[int, int]:
        return round_bounds(round_index, self.round_size, self.users)

    @property
    def rounds(self) -> int:
        return -(-self.users // self.round_size)

    def users_of(self, round_index: int, population: int) -> np.ndarray:
        start, stop = self.round_bounds(round_index)
        return on_time_users(self.federation, round_index, start, stop, population, self.populations)

    def populations_of(self, round_index: int, shard: int | None = None) -> list[int]:
        """Populations with at least one user in the round (sending to `shard`), in order."""
        start, stop = self.round_bounds(round_index)
        n = stop - start
        P = self.populations
        partial = self.federation is not None and not self.federation.ideal   # a population may have no one there
        return [p for p in range(P) if (len(self.users_of(round_index, p)) if partial else n * (p + 1) // P > n * p // P)
                and (shard is None or self.sends_to(p, shard))]

    def sends_to(self, population: int, shard: int) -> bool:
        if not self.segments[shard] or self.layout == "shuffled":     # shuffled: populations send to shufflers
            return False
        return self.layout != "population" or population % self.shards == shard

    # ---- shuffled layout (ldpfed.trust.shuffling) -------------------------------------------------------
    def share_users(self, round_index: int, shuffler: int) -> np.ndarray:
        """The users shuffler `shuffler` mixes in round `round_index` (public), in user order: the round's users in
        its share of positions, those who send in the round under the federation model."""
        start, stop = self.round_bounds(round_index)
        lo, hi = share_bounds(stop - start, shuffler, self.shufflers)
        if self.federation is None or self.federation.ideal:
            return np.arange(start + lo, start + hi)
        senders = round_senders(self.federation, round_index, start, stop, self.populations)
        return senders[(senders >= start + lo) & (senders < start + hi)]

    def chunks_of(self, round_index: int, shard: int) -> list[tuple[int, int]]:
        """The (shuffler, chunk) keys shard `shard` receives in round `round_index`, in fold order."""
        sizes = [len(self.share_users(round_index, s)) for s in range(self.shufflers)]
        return chunks_of_shard(sizes, self.shards, shard)

    def senders_of(self, round_index: int, shard: int) -> list:
        """What shard `shard` must receive to close round `round_index`: (shuffler, chunk) keys (shuffled layout)
        or populations."""
        if self.layout == "shuffled":
            return self.chunks_of(round_index, shard)
        return self.populations_of(round_index, shard)

    def active_shards(self) -> list[int]:
        return [s for s, segs in enumerate(self.segments) if segs]

    # ---- population side -----------------------------------------------------------------------
    def split(self, payload: dict, n_users: int, population: int) -> list[dict | None]:
        """One population's payload (its sums, or its users' messages) cut into per-shard payloads (None: none)."""
        parts = []
        for s, segs in enumerate(self.segments):
            if not self.sends_to(population, s):
                parts.append(None)
            elif self.mode == "pre-aggregated":
                parts.append({seg.field: np.ascontiguousarray(
                    np.asarray(payload[seg.field], dtype=FLOAT).reshape(-1)[seg.lo:seg.hi]) for seg in segs})
            elif self.layout == "block":
                parts.append({seg.field: np.ascontiguousarray(np.asarray(payload[seg.field], dtype=self.dtype_of(
                    seg.field)).reshape(n_users, -1)[:, seg.lo:seg.hi]) for seg in segs})
            else:   # population layout: the whole messages
                parts.append({f: np.ascontiguousarray(payload[f], dtype=self.dtype_of(f)) for f in self.message_spec})
        return parts

    # ---- coordinator side ----------------------------------------------------------------------
    def assemble(self, totals: list[dict]) -> dict:
        """The round's aggregate from the shards' totals ({field: flat segment} per shard)."""
        if self.layout in ("population", "shuffled"):   # the shards' sums, added in population / (shuffler, chunk)
            sums: dict = {}                               # order (ldpfed.trust.shuffling)
            key = "chunks" if self.layout == "shuffled" else "populations"
            for _, part in sorted((item for shard in totals for item in shard.get(key, ())),
                                  key=lambda item: item[0]):
                sums = add_sums(sums, part)
            return {f: sums[f].reshape(shape) for f, shape in self.sum_spec.items() if f in sums}
        pieces: dict[str, list] = {}
        for s, segs in enumerate(self.segments):
            for seg in segs:
                pieces.setdefault(seg.field, []).append((seg.lo, totals[s][seg.field]))
        sums = {}
        for field in self.sum_spec:
            if field not in pieces:
                continue
            parts = sorted(pieces[field], key=lambda item: item[0])
            flat = parts[0][1] if len(parts) == 1 else np.concatenate([v for _, v in parts])
            sums[field] = np.array(flat, dtype=FLOAT).reshape(self.sum_spec[field])
        return sums

    def dtype_of(self, field: str) -> np.dtype:
        """The wire dtype of a field: float64 for sums (as run_local adds them); per-user, what `encode` makes."""
        if self.mode == "pre-aggregated" or not self.message_dtypes:
            return FLOAT
        return np.dtype(self.message_dtypes.get(field, FLOAT))

    def expected_shapes(self, shard: int, n_users: int) -> dict:
        segs = self.segments[shard]
        if self.mode == "pre-aggregated":
            return {seg.field: (seg.size,) for seg in segs}
        if self.layout == "block":
            return {seg.field: (n_users, seg.size) for seg in segs}
        return {f: (n_users, *shape) for f, shape in self.message_spec.items()}   # whole messages


def _shape(value) -> tuple:
    return tuple(int(x) for x in value)


def _cut(sum_spec: dict, shards: int) -> tuple:
    """Contiguous ranges of the concatenated flattened fields, one per shard, as segments."""
    fields = [(f, int(np.prod(shape, dtype=np.int64))) for f, shape in sum_spec.items()]
    total = sum(size for _, size in fields)
    segments = []
    for s in range(shards):
        lo, hi = total * s // shards, total * (s + 1) // shards
        segs, offset = [], 0
        for field, size in fields:
            a, b = max(lo, offset), min(hi, offset + size)
            if a < b:
                segs.append(Segment(field, a - offset, b - offset))
            offset += size
        segments.append(tuple(segs))
    return tuple(segments)


def make_plan(algo, config, shards: int, mode: str, layout: str | None = None) -> ShardPlan:
    """Probe the algorithm's message spec and aggregate, and split the server's work among `shards`.

    pre-aggregated: layout "block" (key ranges). per-user: layout "population" by default (population p's messages
    go whole to shard p % shards: one message per population and round, whatever the number of shards), or
    "block" if asked for and `aggregate` is bit-identical on column slices (else "population"). Under the shuffle
    trust model: layout "shuffled" (per-user mode only: whole messages, by shuffled chunk).
    """
    shuffled = trust_model(config).shuffles
    if shuffled and mode != "per-user":
        raise ValueError("the shuffle trust model runs in per-user mode (its shufflers mix users' messages)")
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: choose from {list(MODES)}")
    if layout not in (None, "block", "population"):
        raise ValueError(f"layout={layout!r}: choose from ['block', 'population']")
    spec = {str(f): _shape(shape) for f, shape in sorted(algo.message_spec().items())}
    # Real messages of a few users: their dtypes are the per-user wire format, and `aggregate` is probed on them.
    users, probe = sample_messages(config, 64)
    probe = {str(f): np.asarray(v) for f, v in probe.items()}
    if set(probe) != set(spec) or any(probe[f].shape != (len(users), *spec[f]) for f in spec):
        raise ValueError(f"{config.algorithm}: messages {({f: v.shape for f, v in probe.items()})} do not match "
                         f"message_spec() {spec} (per user)")
    dtypes = {f: probe[f].dtype.str for f in spec}
    n = len(users)
    full = algo.aggregate(probe, users) if spec else {}
    sum_spec = {str(f): np.shape(v) for f, v in sorted(full.items())}
    segments = _cut(sum_spec, shards)
    chosen = "block"
    if mode == "per-user" and spec:
        exact = (not shuffled and layout == "block" and set(sum_spec) == set(spec)
                 and all(sum_spec[f] == spec[f] for f in spec))
        for segs in segments if exact else ():
            try:
                part = algo.aggregate({s.field: np.ascontiguousarray(probe[s.field].reshape(n, -1)[:, s.lo:s.hi])
                                       for s in segs}, users)
                part = {f: np.asarray(v) for f, v in part.items()}
                exact = all(np.array_equal(np.asarray(part[s.field], dtype=FLOAT).reshape(-1),
                                           np.asarray(full[s.field], dtype=FLOAT).reshape(-1)[s.lo:s.hi]) for s in segs)
            except Exception:   # an aggregate that needs whole messages
                exact = False
            if not exact:
                break
        if not exact:
            chosen = "shuffled" if shuffled else "population"
            whole = tuple(Segment(f, 0, int(np.prod(shape, dtype=np.int64))) for f, shape in sum_spec.items())
            segments = (whole,) * shards
    layout = chosen
    return ShardPlan(algorithm=config.algorithm, mode=mode, shards=shards, users=config.users,
                     round_size=config.round_size, populations=config.populations, message_spec=spec,
                     sum_spec=sum_spec, segments=segments, layout=layout, message_dtypes=dtypes,
                     shufflers=config.shufflers if shuffled else 0, federation=federation_model(config))


class LatencyHistogram:
    """Log-spaced histogram of durations (2% bins from 100 ns to ~1 day): bounded memory, mergeable."""

    BASE, RATIO, BINS = 1e-7, 1.02, 1500

    def __init__(self):
        self.counts = np.zeros(self.BINS, dtype=np.int64)

    def add(self, seconds: float) -> None:
        k = 0 if seconds <= self.BASE else int(math.log(seconds / self.BASE) / math.log(self.RATIO)) + 1
        self.counts[min(k, self.BINS - 1)] += 1

    def merge(self, other: "LatencyHistogram | np.ndarray") -> None:
        self.counts += other.counts if isinstance(other, LatencyHistogram) else np.asarray(other)

    @property
    def count(self) -> int:
        return int(self.counts.sum())

    def quantile(self, q: float) -> float | None:
        """Upper edge of the bin holding the q-quantile, in seconds (at most 2% above the true value)."""
        total = self.count
        if total == 0:
            return None
        k = int(np.searchsorted(np.cumsum(self.counts), math.ceil(q * total)))
        return self.BASE * self.RATIO ** k


def peak_rss_bytes() -> int:
    """This process's peak resident set size (Linux reports KiB)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def current_rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except OSError:
        return peak_rss_bytes()


class _Round:
    __slots__ = ("order", "index", "pending", "seen", "totals")

    def __init__(self, order: list[int]):
        self.order = order        # populations expected, in fold order
        self.index = 0            # how many of them are folded
        self.pending: dict = {}   # population -> its (small) aggregated segments, waiting for earlier ones
        self.seen: set = set()
        self.totals: dict = {}


class ShardCore:
    """One server shard: validates and folds messages for its keys; idempotent per (population, round)."""

    def __init__(self, plan: ShardPlan, shard: int, algo=None, max_open_rounds: int = 1, first_round: int = 0,
                 check_domains: bool = True):
        if plan.segments[shard] and algo is None and (plan.mode == "per-user" or check_domains):
            raise ValueError("a shard needs the algorithm: its aggregate (per-user mode) and its message domains")
        self.plan, self.shard, self.algo = plan, shard, algo
        self.check_domains = bool(check_domains) and bool(plan.segments[shard])
        self.domains = algo.cached_domains() if self.check_domains else {}
        if self.check_domains and set(self.domains) != set(plan.message_spec):
            raise ValueError(f"{plan.algorithm}: message_domains() {sorted(self.domains)} do not cover the message "
                             f"fields {sorted(plan.message_spec)}")
        # Per-user fields whose check reads the round's published model: a shard without that model rejects their
        # messages (a check without its input must not pass). In block layout only a segment that is a whole field
        # checks the scheduled arm; pre-aggregated mode decides on each message's bounds (_domain_reason).
        self.model_fields = () if plan.mode != "per-user" else tuple(
            f for f, d in self.domains.items() if _reads_model(d) and (plan.layout != "block" or any(
                seg.field == f and seg.lo == 0 and seg.hi == d.size for seg in plan.segments[shard])))
        self.segments = plan.segments[shard]
        self.max_open_rounds = max_open_rounds
        self.next_round = first_round  # rounds below are closed (a recreated or resumed shard starts later)
        self.rounds: dict[int, _Round] = {}
        self.models: dict = {}        # round -> the model the server published for it (public schedules)
        self.closing: dict = {}       # round -> the populations the coordinator closes it with (deadline mode)
        self.accepted = 0             # (population, round) messages folded
        self.user_messages = 0        # users those messages carried
        self.rejected = 0
        self.rejected_by_reason: dict[str, int] = {}
        self.latency = LatencyHistogram()          # time to validate and fold one message
        self.delivery = LatencyHistogram()         # from the sender's timestamp to folded (when given)
        self.busy_s = 0.0

    # ---- folding ----------------------------------------------------------------------------------
    def publish(self, round_index: int, model) -> None:
        """The model the server published for round `round_index`: what the users of the round saw, so that the
        messages' public choices (a published arm) are checked against it, not only against each other. Until it
        is published (again, after a rewind), such messages are rejected: "no published schedule"."""
        self.models[int(round_index)] = model

    def fold(self, messages, sent_at: float | None = None) -> tuple[int, int]:
        """Fold a batch of messages; returns (accepted, rejected) of this batch."""
        accepted = rejected = 0
        if not isinstance(messages, (list, tuple)):
            messages = [messages]
        for message in messages:
            started = time.perf_counter()
            reason = self._fold_one(message)
            now = time.perf_counter()
            self.busy_s += now - started
            if reason is None:
                accepted += 1
                self.latency.add(now - started)
                if sent_at is not None:
                    self.delivery.add(max(time.time() - sent_at, 0.0))
            else:
                rejected += 1
                self.rejected += 1
                self.rejected_by_reason[reason] = self.rejected_by_reason.get(reason, 0) + 1
        return accepted, rejected

    def _fold_one(self, message) -> str | None:
        """None if folded, else the reason it was rejected (and nothing changed)."""
        plan = self.plan
        shuffled = plan.layout == "shuffled"
        if not isinstance(message, tuple) or len(message) != (5 if shuffled else 4):
            return "malformed"
        # a WireMessage (a ShuffledChunk when shuffled), or anything a client sent
        algorithm, round_index, payload = message[0], message[1], message[-1]
        if algorithm != plan.algorithm:
            return "unknown algorithm"
        if isinstance(round_index, bool) or not isinstance(round_index, (int, np.integer)):
            return "unknown round"
        round_index = int(round_index)
        if round_index < 0 or round_index >= min(self.next_round + self.max_open_rounds, plan.rounds):
            return "unknown round"
        if round_index < self.next_round:
            return "closed round"
        if shuffled:    # users: the shuffler's whole share (public); which of them sent this chunk is unknown
            sender, users, size = self._chunk_sender(round_index, message[2], message[3])
            if sender is None:
                return "unknown chunk"
        else:
            sender = message[2]
            if isinstance(sender, bool) or not isinstance(sender, (int, np.integer)) \
                    or not 0 <= int(sender) < plan.populations:
                return "unknown population"
            sender = int(sender)
            users = plan.users_of(round_index, sender)
            size = len(users)
            if size == 0 or not plan.sends_to(sender, self.shard) or (
                    round_index in self.closing and sender not in self.closing[round_index]):
                return "unknown population"
        state = self.rounds.get(round_index)
        if state is not None and sender in state.seen:
            return "duplicate"
        if not isinstance(payload, dict):
            return "malformed"
        expected = plan.expected_shapes(self.shard, size)
        if set(payload) != set(expected):
            return "wrong fields"
        for field, shape in expected.items():
            value = payload[field]
            if not isinstance(value, np.ndarray) or value.dtype != plan.dtype_of(field):
                return "wrong dtype"
            if value.shape != shape:
                return "wrong shape"
        # Every domain is bounded or exact, so a payload inside its domains is finite: with the checks on, the
        # finiteness pass runs only to name the reason of a rejection.
        reason = self._domain_reason(payload, users, self.models.get(round_index)) if self.check_domains else None
        if reason is not None or not self.check_domains:
            if not all(np.isfinite(payload[field]).all() for field in expected):
                return "non-finite"
            if reason is not None:
                return reason
        if plan.mode == "pre-aggregated":
            part = {seg.field: payload[seg.field] for seg in self.segments}
        else:
            try:
                sums = anonymous_aggregate(self.algo, payload) if shuffled else self.algo.aggregate(payload, users)
                part = {}
                for seg in self.segments:
                    flat = np.asarray(sums[seg.field], dtype=FLOAT).reshape(-1)
                    if flat.shape != (seg.size,):
                        return "wrong shape"
                    part[seg.field] = flat
            except Exception:
                return "aggregate failed"
            if not all(np.isfinite(v).all() for v in part.values()):
                return "non-finite"
            for field, value in part.items():     # symmetric fields: checked on the aggregate (symmetric_reason)
                domain = self.domains.get(field)
                if domain is not None and domain.symmetric and plan.layout != "block" and \
                        symmetric_reason(value, domain.shape) is not None:
                    return f"out of domain ({field}): not symmetric"
        if state is not None and plan.layout == "block" and not self._totals_stay_finite(state, part):
            return "total would overflow"     # checked before adding: a running total stays finite
        # Accepted: only now does the state change.
        if state is None:
            state = self.rounds[round_index] = _Round(self._senders(round_index))
        state.seen.add(sender)
        state.pending[sender] = part
        self.accepted += 1
        self.user_messages += size
        if plan.layout != "block":   # kept per population (chunk); the coordinator adds them in that order
            return None
        while state.index < len(state.order) and state.order[state.index] in state.pending:
            state.totals = add_sums(state.totals, state.pending.pop(state.order[state.index]))
            state.index += 1
        return None

    def _chunk_sender(self, round_index: int, shuffler, chunk):
        """((shuffler, chunk), the users of the shuffler's share, the chunk's size) of a chunk this shard receives in
        round `round_index` under the public plan; (None, None, 0) for any other."""
        if any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in (shuffler, chunk)):
            return None, None, 0
        key = (int(shuffler), int(chunk))
        if key not in self.plan.chunks_of(round_index, self.shard):
            return None, None, 0
        users = self.plan.share_users(round_index, key[0])
        lo, hi = chunk_bounds(len(users))[key[1]]
        return key, users, hi - lo

    @staticmethod
    def _totals_stay_finite(state: _Round, part: dict) -> bool:
        """|total| + |pending| + |part| finite for every field: whatever the fold order, the total stays finite."""
        with np.errstate(over="ignore"):
            return all(np.isfinite(np.abs(state.totals.get(f, 0.0)) + np.abs(v)
                                   + sum(np.abs(p[f]) for p in state.pending.values() if f in p)).all()
                       for f, v in part.items())

    def _domain_reason(self, payload: dict, users: np.ndarray, model=None) -> str | None:
        """None if the payload could come from honest users who saw `model`, else why not (see the module
        docstring). model None: not known to this shard; a payload whose check needs it is rejected."""
        plan = self.plan
        if plan.mode == "pre-aggregated":
            bounds = self.algo.sum_bounds(users)
            if model is None and any(_reads_model(bounds[seg.field]) and seg.lo == 0
                                     and seg.hi == bounds[seg.field].size for seg in self.segments):
                return NO_MODEL     # (the published arm is checked on a whole field only)
            for seg in self.segments:
                why = bounds[seg.field].reason(payload[seg.field], seg.lo, seg.hi, model=model)
                if why is not None:
                    return f"out of domain ({seg.field}): {why}"
            return None
        if model is None and self.model_fields:
            return NO_MODEL
        if plan.layout == "shuffled":   # `users`: the shuffler's share; the chunk is some of them, in unknown order
            for field, value in payload.items():
                why = self.domains[field].anonymous_reason(value, users, model=model)
                if why is not None:
                    return f"out of domain ({field}): {why}"
            return None
        if plan.layout == "population":
            for field, value in payload.items():
                why = self.domains[field].reason(value, users, model=model)
                if why is not None:
                    return f"out of domain ({field}): {why}"
            return None
        for seg in self.segments:    # a segment that is a whole field gets every check (a scheduled arm too)
            domain = self.domains[seg.field]
            cols = () if seg.lo == 0 and seg.hi == domain.size else (seg.lo, seg.hi)
            why = domain.reason(payload[seg.field], users, *cols, model=model)
            if why is not None:
                return f"out of domain ({seg.field}): {why}"
        return None

    # ---- closing a round --------------------------------------------------------------------------
    def expect(self, round_index: int, populations) -> None:
        """Close round `round_index` with these populations only (deadline mode: the others missed it); a message
        of any other population for that round is then rejected, as one of a population with no users."""
        self.closing[round_index] = [p for p in self.plan.senders_of(round_index, self.shard) if p in set(populations)]

    def _senders(self, round_index: int) -> list:
        if round_index in self.closing:
            return self.closing[round_index]
        return self.plan.senders_of(round_index, self.shard)

    def collect(self, round_index: int) -> dict:
        """The totals of a complete round ({field: flat segment}); closes it. Rounds close in order."""
        if round_index != self.next_round:
            raise RuntimeError(f"shard {self.shard}: collect({round_index}) but round {self.next_round} is next")
        expected = self._senders(round_index)
        self.closing.pop(round_index, None)
        self.models.pop(round_index, None)
        if not expected:
            self.next_round += 1
            self.rounds.pop(round_index, None)
            return {}
        state = self.rounds.get(round_index)
        missing = [p for p in expected if state is None or p not in state.seen]
        if missing:
            raise RuntimeError(f"shard {self.shard}: round {round_index} incomplete, missing {missing}")
        del self.rounds[round_index]
        self.next_round += 1
        if self.plan.layout != "block":
            key = "chunks" if self.plan.layout == "shuffled" else "populations"
            return {key: [(sender, state.pending[sender]) for sender in state.order]}
        return state.totals

    def rewind(self, round_index: int) -> None:
        """Forget round `round_index` and every later one (folded or closed), so they can be folded again: how the
        coordinator redoes a round after a fault. Only the last closed round or an open one can be redone."""
        if not self.next_round - 1 <= round_index <= self.next_round:
            raise RuntimeError(f"shard {self.shard}: cannot rewind to round {round_index} (next is {self.next_round})")
        for r in [r for r in self.rounds if r >= round_index]:
            del self.rounds[r]
        for r in [r for r in self.models if r >= round_index]:    # the redone rounds are published again
            del self.models[r]
        self.next_round = round_index

    def peek(self, round_index: int) -> dict:
        """A copy of the current totals of an open round (for tests)."""
        state = self.rounds.get(round_index)
        if state is None:
            return {}
        return {"totals": {f: v.copy() for f, v in state.totals.items()}, "seen": sorted(state.seen),
                "folded": state.index, "pending": sorted(state.pending)}

    def stats(self) -> dict:
        return {"shard": self.shard, "accepted": self.accepted, "user_messages": self.user_messages,
                "rejected": self.rejected, "rejected_by_reason": dict(self.rejected_by_reason),
                "latency_counts": self.latency.counts, "delivery_counts": self.delivery.counts,
                "busy_s": self.busy_s, "open_rounds": len(self.rounds), "next_round": self.next_round,
                "peak_rss": peak_rss_bytes(), "rss": current_rss_bytes()}
