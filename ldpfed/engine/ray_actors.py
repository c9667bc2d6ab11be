"""The Ray engine's actors: population actors (simulate their users' round), shuffler actors (the shuffle trust
model's mixers) and server shard actors (validate and fold messages: `ray_shard.ShardCore`). Each is a plain class,
usable without Ray (tests and the stress tools drive them in-process), and its `Remote*` actor class.

An actor process can be configured again (`configure` replaces everything): a spare process takes over a dead
actor's part without a new Python process to start."""
from __future__ import annotations

import os
import threading
import time

import ray

from ldpfed.algorithms import make_algorithm
from ldpfed.engine.channels import RemoteError, Serving, as_ready
from ldpfed.engine.core import PopulationRow, join_pieces, population_round, round_users, shuffler_pieces
from ldpfed.engine.ray_shard import LatencyHistogram, ShardCore, ShuffledChunk, WireMessage, current_rss_bytes, \
    peak_rss_bytes
from ldpfed.trust.shuffling import check_groups, shard_of_chunk, shuffle_share
from ldpfed.envs import make_env
from ldpfed.federation import federation_model
from ldpfed.util.memory import keep_freed_memory
from ldpfed.util.threads import limit as limit_threads


def placed() -> dict:
    """What Ray gave this actor process: its placement group (None outside one) and the CPUs it holds."""
    if not ray.is_initialized() or ray.get_runtime_context().get_actor_id() is None:
        return {"placement_group": None, "cpus": None}      # driven in-process (tests, stress tools)
    context = ray.get_runtime_context()
    return {"placement_group": context.get_placement_group_id(),
            "cpus": context.get_assigned_resources().get("CPU", 0.0)}


class ServesRounds:
    """What the actors that serve rounds over channels (transport "direct") share: one `Serving` at a time, closed
    before the next one and before the actor is configured for another run."""

    serving = None

    def _serve(self, key: bytes, serve):
        """Run serve(serving, coordinator) on a new Serving's thread; `coordinator` is the list that holds the
        coordinator's connection once the loop accepted it, where an exception's traceback goes. Returns the
        address it listens on."""
        self.close_channel()
        serving = self.serving = Serving(ray.util.get_node_ip_address(), key)
        coordinator = []
        serving.start(lambda: serve(serving, coordinator),
                      lambda text: coordinator and coordinator[0].send(RemoteError(text)))
        return serving.address

    def close_channel(self) -> None:
        if self.serving is not None:
            self.serving.stop()
            self.serving = None


class PopulationActor(ServesRounds):
    """Hosts a fixed set of logical populations; builds its env and algorithm (client half) once per run.

    An actor process can be configured again (`configure` replaces everything): a run's spare takes over a dead
    actor's part, since starting a Python worker that imports numpy, scipy and pandas costs seconds on a busy
    machine.
    """

    def __init__(self, config=None, populations=(), plan=None):
        if config is not None:
            self.configure(config, populations, plan)

    def configure(self, config, populations: list[int], plan) -> tuple[str, int]:
        """(node id, pid) of this actor once it is ready for the run."""
        self.close_channel()    # a previous run's rounds, if any, end before its env is replaced
        self.config, self.populations, self.plan = config, list(populations), plan
        limit_threads()         # one BLAS thread: the actor's CPU is its users' work (ldpfed.util.threads)
        keep_freed_memory()     # the populations' arrays reuse freed memory instead of faulting in new pages
        self.env = make_env(config)
        self.algo = make_algorithm(self.env, config)
        self.federation = federation_model(config)
        self.pre_aggregate = plan.mode == "pre-aggregated"
        self.shards = plan.shards
        self.shufflers = plan.shufflers      # > 0: the messages go to the shufflers, not to the shards
        self.members = None                  # a leader's group (run_group), sent again by the driver after a change
        return self.node(), os.getpid()

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def run_round(self, model, round_index: int, start: int, stop: int):
        """All users of this actor's populations for one round: (*one object per shard, metrics); under the shuffle
        trust model (*one object per shuffler: [(population, its users' messages in that shuffler's share)],
        metrics)."""
        config, plan = self.config, self.plan
        outgoing = [[] for _ in range(self.shufflers or self.shards)]   # per shard, or per shuffler
        metrics = []
        for p in self.populations:
            users = round_users(self.federation, round_index, start, stop, p, config.populations)
            if len(users) == 0:
                continue
            payload, regret, pop_metrics, late, on_time = population_round(
                self.federation, self.algo, self.env, model, config.seed, round_index, p, users,
                pre_aggregate=self.pre_aggregate)
            # late messages travel with the population's row to the coordinator, which folds them on arrival
            metrics.append(PopulationRow.of(p, users, payload, regret, pop_metrics, late, on_time))
            if payload and self.shufflers:     # the shuffler knows who sent a piece; it tells no one
                for s, piece in enumerate(shuffler_pieces(payload, on_time, start, stop, self.shufflers)):
                    if piece is not None:
                        outgoing[s].append((p, piece))
            elif payload and plan.sum_spec:
                for s, part in enumerate(plan.split(payload, len(on_time), p)):
                    if part is not None:
                        outgoing[s].append(WireMessage(config.algorithm, round_index, p, part))
        return (*outgoing, metrics)

    def open_channel(self, key: bytes, shard_addresses: dict, index: int):
        """Serve this run's rounds over channels (transport "direct", ldpfed.engine.channels): connect to each
        active shard (saying which actor this is), take the coordinator's connection, then for each (model, round,
        start, stop) it sends, run the round, send each shard its objects and the coordinator the metrics.
        Returns the address the coordinator connects to."""
        def serve(serving, coordinator):
            shards = {s: serving.connect(address) for s, address in shard_addresses.items()}
            for conn in shards.values():
                conn.send(index)
            coordinator.append(serving.accept())
            while (request := coordinator[0].recv()) is not None:
                *objects, metrics = self.run_round(*request)
                for s, conn in shards.items():
                    conn.send(objects[s])
                coordinator[0].send(metrics)

        return self._serve(key, serve)

    def run_group(self, boxed_model, round_index: int, start: int, stop: int, members: list | None):
        """The round of a group of actors whose leader this one is (the tree shape): (*one ref per shard, to the
        list of the refs of the group's objects for that shard in actor order, this actor's first; the group's
        metrics). boxed_model: (model,) or (the ref it was stored under,), passed on to the members as is (one copy
        in the object store). members: the handles of the group's other actors in actor order, or None: the same
        as in the previous call (the driver sends them once, not every round)."""
        if members is not None:
            self.members = members
        if self.members is None:
            raise RuntimeError("run_group: this leader was never given its members")
        (model,) = boxed_model
        returns = self.shards + 1
        calls = [m.run_round.options(num_returns=returns).remote(model, round_index, start, stop)
                 for m in self.members]
        *own, metrics = self.run_round(ray.get(model) if isinstance(model, ray.ObjectRef) else model, round_index,
                                       start, stop)     # while the members run theirs
        # The lists of refs are put here, not returned: refs inside a call's result cost the driver (their
        # borrower) ~0.1 ms each (measured), refs inside an object this actor put never reach it.
        refs = [ray.put([ray.put(batch)] + [call[s] for call in calls]) for s, batch in enumerate(own)]
        # A member's death fails this call (so the driver redoes the round); its objects never come here.
        for batch in ray.get([call[-1] for call in calls]):
            metrics.extend(batch)
        return (*refs, metrics)

    def stats(self) -> dict:
        return {"peak_rss": peak_rss_bytes(), "rss": current_rss_bytes(), "pid": os.getpid(),
                "cpu_s": time.process_time(), **placed()}


class ShufflerActor:
    """A shuffler of the shuffle trust model: mixes its share of each round (ldpfed.trust.shuffling) and
    forwards it to the shards in chunks that carry no population and no user index (`ShuffledChunk`). It keeps
    nothing between rounds, so a recreated one simply redoes the round."""

    def __init__(self, config=None, plan=None, shuffler: int = 0):
        if config is not None:
            self.configure(config, plan, shuffler)

    def configure(self, config, plan, shuffler: int) -> tuple[str, int]:
        limit_threads()
        self.config, self.plan, self.shuffler = config, plan, shuffler
        # the algorithm's randomizer groups and public fields: what the shuffler checks before it forwards a share
        self.algo = make_algorithm(make_env(config), config)
        self.messages, self.busy_s = 0, 0.0
        self.latency = LatencyHistogram()          # time to mix and cut one round's share
        return self.node(), os.getpid()

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def shuffle_round(self, round_index: int, *batches):
        """batches: one list of (population, messages) per population actor. Returns one list of ShuffledChunks per
        shard (a single list with one shard)."""
        began = time.perf_counter()
        pieces = sorted((item for batch in batches for item in batch), key=lambda item: item[0])
        users = self.plan.share_users(round_index, self.shuffler)
        share = join_pieces([piece for _, piece in pieces]) if pieces else {}
        got = len(next(iter(share.values()))) if share else 0
        if got != len(users):     # the engine's own populations: a wrong count is a bug, not an attack
            raise RuntimeError(f"shuffler {self.shuffler}: round {round_index} has {got} messages for "
                               f"{len(users)} users")
        check_groups(self.algo, round_index, users, share)
        per_shard = [[] for _ in range(self.plan.shards)]
        for c, chunk in enumerate(shuffle_share(self.config.seed, round_index, self.shuffler, share)):
            per_shard[shard_of_chunk(self.shuffler, c, self.plan.shards)].append(
                ShuffledChunk(self.config.algorithm, round_index, self.shuffler, c, chunk))
        self.messages += got
        took = time.perf_counter() - began
        self.busy_s += took
        self.latency.add(took)
        return tuple(per_shard) if self.plan.shards > 1 else per_shard[0]

    def stats(self) -> dict:
        return {"messages": self.messages, "busy_s": self.busy_s, "latency_counts": self.latency.counts,
                "peak_rss": peak_rss_bytes(), "pid": os.getpid(), "cpu_s": time.process_time(), **placed()}


class ShardActor(ServesRounds):
    """A server shard: keeps the aggregates of its keys (see `ray_shard.ShardCore`)."""

    def __init__(self, config=None, plan=None, shard: int = 0, max_open_rounds: int = 1, first_round: int = 0,
                 check_domains: bool = True):
        self.lock = threading.Lock()   # the shard's state: its channel's thread folds, Ray calls rewind and read it
        if config is not None:
            self.configure(config, plan, shard, max_open_rounds, first_round, check_domains)

    def configure(self, config, plan, shard: int, max_open_rounds: int = 1, first_round: int = 0,
                  check_domains: bool = True) -> tuple[str, int]:
        """(node id, pid) of this shard once it is ready to fold from round `first_round` on. check_domains=False:
        only to measure what the domain checks cost (ShardCore)."""
        self.close_channel()
        limit_threads()
        algo = None
        if plan.segments[shard]:   # its `aggregate` (public per-user weights) and its message domains
            algo = make_algorithm(make_env(config), config)
        self.core = ShardCore(plan, shard, algo, max_open_rounds=max_open_rounds, first_round=first_round,
                              check_domains=check_domains)
        return self.node(), os.getpid()

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def fold(self, *batches, sent_at=None):
        return self._fold_each(batches, sent_at)

    def _fold_each(self, batches, sent_at=None) -> tuple[int, int]:
        """(accepted, rejected) of folding `batches`, any iterable (the direct transport's receives each batch when it
        is its turn, so the first is folded while the next is still on its way)."""
        accepted = rejected = 0
        for batch in batches:
            a, r = self.core.fold(batch, sent_at=sent_at)
            accepted += a
            rejected += r
        return accepted, rejected

    def collect(self, round_index: int) -> dict:
        return self.core.collect(round_index)

    def publish(self, round_index: int, model) -> None:
        self.core.publish(round_index, model)

    def fold_round(self, round_index: int, *batches, model=None, grouped: bool = False, senders=None):
        """Fold one round's batches (one per population actor) and close it: (totals, accepted, rejected). model:
        what the server published for the round, when the message domains check public choices against it.
        grouped: each batch is a ref to a list of object refs (a group's, in actor order; `PopulationActor.run_group`),
        fetched here from the actors, so the batches are the same and in the same order as with one per actor."""
        if grouped:
            batches = ray.get([ref for refs in ray.get(list(batches)) for ref in refs])
        if senders is not None:     # deadline mode: the populations whose messages made the round
            with self.lock:
                self.core.expect(round_index, senders)
        return self._fold_round(round_index, batches, model)

    def _fold_round(self, round_index: int, batches, model):
        """fold_round's work, on any iterable of batches (`_fold_each`)."""
        if model is not None:
            self.core.publish(round_index, model)
        accepted, rejected = self._fold_each(batches)
        return self.core.collect(round_index), accepted, rejected

    def rewind(self, round_index: int) -> None:
        # The round is redone: a serving thread still waiting for it (for a population actor on a frozen node, whose
        # socket stays open and which Ray cannot kill yet) is stopped first, so it neither holds the lock nor folds
        # late; the coordinator opens new channels for the redone round.
        self.close_channel()
        with self.lock:
            self.core.rewind(round_index)

    def peek(self, round_index: int) -> dict:
        with self.lock:
            return self.core.peek(round_index)

    def stats(self) -> dict:
        self.close_channel()      # asked at the end of a run (or before its channels open): its rounds are over
        with self.lock:
            return {**self.core.stats(), "pid": os.getpid(), "cpu_s": time.process_time(), **placed()}

    def open_channel(self, key: bytes, actors: int):
        """Serve this run's rounds over channels (transport "direct", ldpfed.engine.channels): take the connections
        of the coordinator and of the `actors` population actors (each says who it is), then for each (round,
        published model) the coordinator sends, fold one batch from each population actor as they arrive (added in
        actor order all the same: `ShardCore.fold`), and send the coordinator what `fold_round` returns. Returns the
        address to connect to."""
        def serve(serving, coordinator):
            peers = {}
            while len(peers) < actors + 1:
                conn = serving.accept()
                peers[conn.recv()] = conn
            coordinator.append(peers.pop("coordinator"))
            populations = [peers[a] for a in range(actors)]
            while (request := coordinator[0].recv()) is not None:
                round_index, model = request
                with self.lock:
                    result = self._fold_round(round_index, as_ready(populations), model)
                coordinator[0].send(result)

        return self._serve(key, serve)



RemotePopulation = ray.remote(PopulationActor)
RemoteShuffler = ray.remote(ShufflerActor)
RemoteShard = ray.remote(ShardActor)
