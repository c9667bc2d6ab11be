"""How one round's work reaches a run's actors and comes back: `Rounds`, with two implementations the backend
calls alike, `RayCalls` (Ray calls and objects; flat or the tree shape) and `Channels` (the direct transport:
authenticated sockets, ldpfed.engine.channels). Both give the round's aggregate and metrics, the same bits."""
from __future__ import annotations

import contextlib
import math
import pickle
import time
from dataclasses import dataclass

import numpy as np
import ray

from ldpfed.engine.channels import ChannelBroken, close_all, connect, new_key, receive, watchdog
from ldpfed.engine.ray_faults import RoundTimeout
from ldpfed.util.errors import describe_error

# Models up to this size travel inside the calls (Ray inlines call arguments below 100 KiB): cheaper than a put.
INLINE_MODEL_BYTES = 64 * 2**10

# Below this many population actors a round is flat (the driver calls every actor); from it on, the actors are in
# groups of ~sqrt(actors) whose leaders the driver calls (PopulationActor.run_group). Measured (jobs/bench_driver.py
# --shape flat,tree, 1 shard, 2-core VM, idle; docs/scaling.md): the driver's CPU per round, flat / tree, was
# 5.2 / 6.2 ms at 8 actors, 8.8 / 8.2 at 16, 19.1 / 13.3 at 32, 44.9 / 17.7 at 64. A group's call costs the driver
# ~3 actors' calls, and the tree adds a hop (leader, then members) and doubles the actors' own CPU for Ray's calls:
# below 32 actors it saves too little.
TREE_FROM_ACTORS = 32


def tree_group_size(actors: int) -> int:
    """ceil(sqrt(actors)): about as many groups as actors per group, so the driver's calls and each leader's are
    balanced."""
    return math.isqrt(actors - 1) + 1


def auto_group_size(actors: int) -> int:
    """The default group size: 1 (flat) below TREE_FROM_ACTORS actors, else tree_group_size(actors)."""
    return 1 if actors < TREE_FROM_ACTORS else tree_group_size(actors)


def model_bytes(model) -> float:
    """The size of a published model's arrays, strings and numbers (nested dicts, lists, tuples); anything else
    counts as unbounded (it is then stored with `ray.put`, as before)."""
    if isinstance(model, np.ndarray):
        return float("inf") if model.dtype.hasobject else model.nbytes
    if isinstance(model, dict):
        return sum(model_bytes(key) + model_bytes(value) for key, value in model.items())
    if isinstance(model, (list, tuple)):
        return sum(model_bytes(value) for value in model)
    if isinstance(model, (str, bytes)):
        return len(model)
    if model is None or isinstance(model, (bool, int, float, np.generic)):
        return 8
    return float("inf")


def left(deadline: float) -> float:
    return max(0.0, deadline - time.perf_counter())


def gather(refs: list, deadline: float, r: int) -> list:
    """ray.get of `refs`, raising as soon as one fails, or RoundTimeout at the deadline."""
    values, pending = {}, list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=left(deadline))
        if not ready:
            raise RoundTimeout(f"round {r}: {len(pending)} of {len(refs)} calls not done at the timeout")
        more, pending = ray.wait(pending, num_returns=len(pending), timeout=0) if pending else ([], [])
        for ref, value in zip(ready + more, ray.get(ready + more)):
            values[ref] = value
    return [values[ref] for ref in refs]


@dataclass(frozen=True)
class Shape:
    """A run's rounds as the backend set them up at open: the actors, the groups of the tree shape (one actor per
    group: flat), the population calls in flight at once, the shard plan, the shards that get messages, and whether
    the shards are handed each round's model (when a message domain checks a public choice against it)."""

    actors: int
    shards: int
    shufflers: int
    groups: list
    max_in_flight: int
    plan: object
    active: list
    check_model: bool

    @property
    def leaders(self) -> set:
        return {("population", group[0]) for group in self.groups}

    def assemble(self, r: int, folded: dict, metric_batches: list):
        """The round's aggregate and metrics from {shard: what its fold_round returned} and the actors' metrics."""
        rejected = sum(result[2] for result in folded.values())
        if rejected:
            raise RuntimeError(f"round {r}: the shards rejected {rejected} of the engine's messages")
        totals = [folded[s][0] if s in folded else {} for s in range(self.shards)]
        return self.plan.assemble(totals), [m for batch in metric_batches for m in batch]


class Rounds:
    """The rounds of a run over one transport. `run` does one round by `deadline` (a FAULTS error if an actor died,
    its objects were lost or it stayed silent); `reset` is called when some actors were replaced (recovery, moves):
    nothing sent to the old ones is used again; `settle` collects a failed round's calls; `close` ends the
    transport. `handles` is the run's {(kind, index): actor handle}, kept up to date by its `Crew`."""

    name = ""

    def __init__(self, handles: dict, shape: Shape):
        self.handles, self.shape = handles, shape
        self.fold_calls = 0

    def run(self, model, r: int, start: int, stop: int, deadline: float):
        raise NotImplementedError

    def reset(self) -> None:
        pass

    def settle(self, timeout: float) -> None:
        pass

    def close(self) -> None:
        pass


class RayCalls(Rounds):
    """Ray calls and objects: one call per population actor (or per group's leader, the tree shape), one per
    shuffler, one per shard, whose calls get the references of the objects they fold (Ray moves them)."""

    name = "ray"

    def __init__(self, handles: dict, shape: Shape):
        super().__init__(handles, shape)
        self.in_flight: list = []    # the current round's calls
        self.led: set = set()        # the leaders that have their group's handles (sent again after a change)

    def reset(self) -> None:
        self.led = set()             # some actors are new: every leader gets its group's handles again

    def settle(self, timeout: float) -> None:
        """Collect the failed round's calls that have ended (their errors are expected, not news), drop the rest."""
        ready, _ = ray.wait(self.in_flight, num_returns=len(self.in_flight), timeout=timeout) \
            if self.in_flight else ([], [])
        for ref in ready:
            try:
                ray.get(ref)
            except Exception:
                pass
        self.in_flight = []

    def run(self, model, r, start, stop, deadline):
        shape, pops, shard_actors = self.shape, self.handles, self.handles
        shards = shape.shards
        model_ref = model if model_bytes(model) <= INLINE_MODEL_BYTES else ray.put(model)
        metric_refs, shard_refs = [], [[] for _ in range(shards)]
        # the population actors' objects go to the shards, or under the shuffle model to the shufflers
        receivers = shape.shufflers or shards
        sent_refs = shard_refs if not shape.shufflers else [[] for _ in range(shape.shufflers)]
        tree = len(shape.groups) < shape.actors
        for group in shape.groups:       # groups of one actor: the flat shape
            if len(metric_refs) >= shape.max_in_flight:      # bound the driver's population calls in flight
                _, running = ray.wait(metric_refs, num_returns=len(metric_refs), timeout=0)
                while len(running) >= shape.max_in_flight:
                    done, running = ray.wait(running, num_returns=1, timeout=left(deadline))
                    if not done:
                        raise RoundTimeout(f"round {r}: population calls still running at the timeout")
                    ray.get(done)      # raises at once if that actor died
            leader, call = pops[("population", group[0])], dict(num_returns=receivers + 1)
            if tree:   # the leader calls its members: the driver's work is per group, not per actor
                members = None if group[0] in self.led else [pops[("population", a)] for a in group[1:]]
                refs = leader.run_group.options(**call).remote((model_ref,), r, start, stop, members)
                self.led.add(group[0])
            else:
                refs = leader.run_round.options(**call).remote(model_ref, r, start, stop)
            metric_refs.append(refs[receivers])
            for s in range(receivers):
                sent_refs[s].append(refs[s])
        for s in range(shape.shufflers):      # each shuffler's chunks, one object per shard
            refs = self.handles[("shuffler", s)].shuffle_round.options(num_returns=shards).remote(r, *sent_refs[s])
            for k, ref in enumerate(refs if shards > 1 else [refs]):
                shard_refs[k].append(ref)
        # Each shard gets the references (Ray moves the data from the actors to it when they are ready, without
        # the driver), folds them in population order and returns the round's totals for its keys.
        published = model_ref if shape.check_model else None
        round_refs = {s: shard_actors[("shard", s)].fold_round.remote(r, *shard_refs[s], model=published, grouped=tree)
                      for s in shape.active}
        self.fold_calls += len(round_refs)
        self.in_flight = metric_refs + list(round_refs.values())
        values = gather(self.in_flight, deadline, r)
        self.in_flight = []
        return shape.assemble(r, dict(zip(round_refs, values[len(metric_refs):])), values[:len(metric_refs)])


class ChannelsUnavailable(Exception):
    """The direct transport could not open its channels before the run's first round (and was not asked for by
    name): the backend goes on with Ray calls. `cause`: the ChannelBroken."""

    def __init__(self, cause: ChannelBroken):
        super().__init__(str(cause))
        self.cause = cause


class Channels(Rounds):
    """The direct transport: the coordinator sends each population actor (model, round, users) and each shard
    (round, published model) on its channel, and reads back the metrics and the shards' totals; the actors send
    each other the messages. The channels are opened for the first round and after every `reset`."""

    name = "direct"

    def __init__(self, handles: dict, shape: Shape, asked: bool):
        super().__init__(handles, shape)
        self.asked = asked           # asked for by name: channels that cannot open are a fault, not a fallback
        self.channels = None         # the coordinator's connections, opened for the first round
        self.rounds_done = 0

    def run(self, model, r, start, stop, deadline):
        shape = self.shape
        if self.channels is None:
            try:
                self._open(deadline)
            except ChannelBroken as error:
                if self.rounds_done or self.asked:
                    raise      # channels that worked in this run, or were asked for: a fault
                self.close()   # the default transport could not connect: the backend goes on with Ray calls
                raise ChannelsUnavailable(error) from error
        populations, shards = self.channels
        conns = populations + list(shards.values())
        published = model if shape.check_model else None
        request = pickle.dumps((model, r, start, stop), protocol=pickle.HIGHEST_PROTOCOL)    # once for all actors
        # A send blocks only when its peer stopped reading (a frozen actor) and the request is larger than what the
        # sockets buffer (a few hundred KiB on Linux): a large one goes under a watchdog that ends it at the
        # round's deadline (a thread per round: not for the small requests of most rounds)
        guard = watchdog(conns, left(deadline)) if len(request) > INLINE_MODEL_BYTES else contextlib.nullcontext()
        try:
            with guard:
                for conn in populations:
                    conn.send_bytes(request)
                for conn in shards.values():
                    conn.send((r, published))
        except OSError as error:
            raise ChannelBroken(f"round {r}: {describe_error(error)}") from error
        values = receive(conns, left(deadline),
                         lambda n: RoundTimeout(f"round {r}: {n} channels silent at the timeout"))
        self.fold_calls += len(shards)
        self.rounds_done += 1
        return shape.assemble(r, dict(zip(shards, values[len(populations):])), values[:len(populations)])

    def _open(self, deadline: float) -> None:
        """Every actor serves this run's rounds on a new channel (a new key); the coordinator connects to them."""
        self.close()
        key, active, actors = new_key(), list(self.shape.active), self.shape.actors
        try:
            shard_refs = [self.handles[("shard", s)].open_channel.remote(key, actors) for s in active]
            shard_addresses = dict(zip(active, ray.get(shard_refs, timeout=left(deadline))))
            pop_refs = [self.handles[("population", a)].open_channel.remote(key, shard_addresses, a)
                        for a in range(actors)]
            opened = [], {}
            self.channels = opened     # what is connected so far is closed if the rest fails
            for address in ray.get(pop_refs, timeout=left(deadline)):
                opened[0].append(connect(address, key))
            for s in active:
                opened[1][s] = connect(shard_addresses[s], key)
                opened[1][s].send("coordinator")
        except (OSError, EOFError) as error:      # incl. a failed handshake (multiprocessing's AuthenticationError)
            raise ChannelBroken(f"opening the round channels: {describe_error(error)}") from error

    def reset(self) -> None:
        self.close()                 # opened again, to the actors as they are now, by the next round

    def close(self) -> None:
        """Close the coordinator's channels: each actor's serving thread then ends (it reads the end of its
        channel, or fails to write to it)."""
        if self.channels is not None:
            populations, shards = self.channels
            close_all(populations + list(shards.values()))
            self.channels = None


class DeadlineCalls(RayCalls):
    """Ray calls whose rounds close at a wall-clock deadline (RayOptions.deadline_s; pre-aggregated, flat), or that
    wait for injected stragglers (deadline_s None: every round waits for its slowest actor, as RayCalls).

    Each population actor simulates its populations and returns their rows (regret, counters: the simulation's
    bookkeeping, never the server's) and its messages for the shards; a straggler's messages (`straggle_share` of
    the actors, chosen from the run's seed) reach the coordinator `straggle_s` seconds after its work is done (the
    injected network delay, applied where they are received). The coordinator waits `deadline_s` from sending the round, then closes it with the
    actors whose messages are in: the shards fold those populations only (`ShardCore.expect`). A late actor's
    messages are lost ("drop") or, when they come in, given to the coordinator as LateSums of the round they arrive
    in ("fold"; the population's sums from its per-shard slices, with their users), which `InFlight` checks and
    folds as it does the seeded latency's. `record` says which population rounds missed their round and where they
    went: the `replay` federation model turns it into the same delays on any engine."""

    def __init__(self, handles: dict, shape: Shape, options, config):
        super().__init__(handles, shape)
        self.deadline_s, self.late = options.deadline_s, options.late
        slow = int(round(options.straggle_share * shape.actors))
        order = np.random.default_rng([int(config.seed), 14]).permutation(shape.actors)
        self.slow = {int(a): options.straggle_s for a in order[:slow]}
        self.rounds_total = config.rounds
        self.populations = [[p for p in range(config.populations) if p % shape.actors == a]
                            for a in range(shape.actors)]
        self.waiting: list = []       # (round sent, actor, its objects' delivery ref)
        self.arrived: list = []       # this round's arrivals: LateSum rows, made by run
        self.record: list = []        # {"round", "population", "arrival"} (arrival None: lost)

    def run(self, model, r, start, stop, deadline):
        from ldpfed.engine.core import LateSum, PopulationRow
        shape, plan = self.shape, self.shape.plan
        shards = shape.shards
        model_ref = model if model_bytes(model) <= INLINE_MODEL_BYTES else ray.put(model)
        metric_refs, objects = [], []
        for a in range(shape.actors):
            refs = self.handles[("population", a)].run_round.options(num_returns=shards + 1).remote(
                model_ref, r, start, stop)
            metric_refs.append(refs[shards])
            objects.append(list(refs[:shards]))
        sent = time.perf_counter()
        self.in_flight = list(metric_refs)
        done_at, pending = {}, {ref: a for a, ref in enumerate(metric_refs)}
        while pending:                   # when each actor's work is done
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=left(deadline))
            if not ready:
                raise RoundTimeout(f"round {r}: {len(pending)} population calls not done at the timeout")
            for ref in ready:
                done_at[pending.pop(ref)] = time.perf_counter()
        rows = [row for batch in ray.get(metric_refs) for row in batch]
        # A straggler's messages leave it straggle_s after its work is done (its network, simulated where they
        # are received: no process of its own to start on a loaded machine).
        arrives = [done_at[a] + self.slow.get(a, 0.0) for a in range(shape.actors)]
        close_at = (deadline if self.deadline_s is None else min(deadline, sent + self.deadline_s))
        # until the last message is in, or the deadline (none: the round timeout) closes the round
        time.sleep(max(0.0, min(max(arrives), close_at) - time.perf_counter()))
        sending, on_time, late_pops = [[] for _ in range(shards)], [], set()
        for a in range(shape.actors):
            if arrives[a] > close_at:
                late_pops.update(self.populations[a])
                if self.late == "fold":
                    self.waiting.append((r, a, objects[a], arrives[a]))
                else:
                    self.record += [{"round": r, "population": p, "arrival": None} for p in self.populations[a]
                                    if len(plan.users_of(r, p))]
                continue
            for s in range(shards):
                sending[s].append(objects[a][s])
            on_time += self.populations[a]
        # earlier rounds' late messages that are in by now arrive in this round
        arrivals, still = [], []
        for item in self.waiting:
            if item[0] < r and item[3] <= time.perf_counter():
                arrivals.append(item)
            else:
                still.append(item)
        self.waiting = still
        published = model_ref if shape.check_model else None
        round_refs = {s: self.handles[("shard", s)].fold_round.remote(r, *sending[s], model=published,
                                                                       senders=sorted(on_time))
                      for s in shape.active}
        self.fold_calls += len(round_refs)
        values = gather(list(round_refs.values()), deadline, r)
        aggregate = shape.assemble(r, dict(zip(round_refs, values)), [])[0] if on_time else {}
        if self.deadline_s is None:      # stragglers without a deadline: every round waits for its slowest
            self.in_flight = []
            return aggregate, rows
        patched = []
        for row in rows:                 # the counters a federation model with delays gives its rows
            late = row.population in late_pops
            counts = {"users_late": row.served if late and self.late == "fold" else 0,
                      "users_lost": row.served if late and self.late == "drop" else 0}
            patched.append(row._replace(metrics={**row.metrics, **counts}, sending=0 if late else row.sending))
        for sent_round, a, refs, _ in arrivals:
            objects = ray.get(refs)
            for p in self.populations[a]:
                users = plan.users_of(sent_round, p)
                if not len(users):
                    continue
                parts = [next((m[3] for m in objects[s] if m[2] == p), {}) for s in range(shards)]
                sums = plan.assemble(parts)
                patched.append(PopulationRow(p, 0.0, {}, 0, 0, (LateSum(r, users, sums, sent_round),)))
                self.record.append({"round": sent_round, "population": p, "arrival": r})
        self.in_flight = []
        return aggregate, patched

    def finish(self) -> None:
        """The run is over: what is still on its way never arrives in a round of the run."""
        for sent_round, a, _, _ in self.waiting:
            self.record += [{"round": sent_round, "population": p, "arrival": self.rounds_total}
                            for p in self.populations[a] if len(self.shape.plan.users_of(sent_round, p))]
        self.waiting = []
