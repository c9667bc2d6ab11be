#!/usr/bin/env python3
"""A flat round over three transports: Ray calls, the direct transport (ldpfed.engine.channels) and Ray Compiled
Graphs (`ray.dag` with `experimental_compile()`); latency and CPU per round, and the CPU each one burns while idle.

    python jobs/bench_compiled_graphs.py                        # 4 actors; messages of 4 KiB, 64 KiB, 1 MiB
    python jobs/bench_compiled_graphs.py --actors 2 --rounds 100 --sizes 4096,1048576 --repeat 3

The round is the engine's flat round, in small actors of this script (no simulation, so the transport is all
there is to measure): the driver sends the model (--model-bytes, 4 KiB) and the round index to N population actors;
each returns a message of the given size for the shard and a small metrics list for the driver; the shard folds the
N messages (adds them, checking each one's shape) and returns a small total; the driver takes the total and the N
metrics, and checks the total (every transport must compute the same one).
* ray:      `run.options(num_returns=2).remote(request)` per actor, `fold.remote(*messages)`, one `ray.get` (the
            engine's Ray round: the messages go from the actors to the shard as object references);
* direct:   the engine's channels: the driver sends the pickled request once to every actor's socket and the round
            index to the shard's; each actor sends its message to the shard and its metrics to the driver; the shard
            folds them as they arrive (`as_ready`) and sends its total;
* compiled: the same graph compiled once (InputNode -> run (2 returns) -> fold, MultiOutputNode of the total and the
            metrics), then `execute(request)` and `ray.get` per round.
Measured per round (after --warmup rounds): the median and p90 wall time, and the CPU of every process involved
(utime + stime of all its threads from /proc/<pid>/stat: the driver, the actors, Ray's raylet and GCS), divided by
the rounds. Then, with nothing running, the CPU each transport's processes use in --idle-s seconds: a compiled
graph's actors and driver wait for their next input in a read loop, and that loop's CPU is reported apart
("idle cores": CPU seconds per wall second), with what it would cost on nodes of --cores cores.

The transports run one after the other for each size, --repeat times (medians over the repeats): on a shared machine
compare the ratios within one run rather than the absolute times.
"""
from __future__ import annotations

import argparse
import os
import pickle
import platform
import statistics
import sys
import time
import traceback

import numpy as np
import ray

from ldpfed.engine.channels import Serving, as_ready, close_all, connect, new_key, receive

TICK = os.sysconf("SC_CLK_TCK")
TIMEOUT_S = 120.0     # a round that takes longer fails the script (instead of waiting for ever)
TEARDOWN_S = 10.0     # a compiled graph's actors left running this long after its teardown are killed


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of process `pid` (0.0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def thread_times(pids) -> dict:
    """{(pid, tid): (CPU seconds, voluntary context switches)} of every thread of `pids`."""
    out = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                with open(f"/proc/{pid}/task/{tid}/status") as f:
                    switches = int(next(line.split()[1] for line in f if line.startswith("voluntary_ctxt")))
            except (OSError, StopIteration):
                continue
            out[pid, tid] = ((int(fields[11]) + int(fields[12])) / TICK, switches)
    return out


class Serves:
    """An actor that serves a channel (the direct transport): it closes it on request."""

    serving = None

    def close_channel(self):
        if self.serving is not None:
            self.serving.stop()
            self.serving = None


class Population(Serves):
    """A population actor: for a request (model, round) returns (its message for the shard, its metrics)."""

    def __init__(self, index: int):
        self.index, self.serving = index, None
        self.size(4096)

    def size(self, nbytes: int) -> int:
        self.message = np.full(max(1, nbytes // 8), float(self.index + 1))
        return os.getpid()

    def run(self, request):
        model, r = request
        self.message[0] = r + model[0] + self.index     # a new message every round
        return self.message, [(self.index, r, float(self.message[-1]))]

    def open_channel(self, key: bytes, shard_address):
        """The engine's population channel: connect to the shard (saying which actor this is), take the driver's
        connection, then for each request it sends, send the shard the message and the driver the metrics."""
        self.close_channel()
        serving = self.serving = Serving("127.0.0.1", key)

        def serve():
            shard = serving.connect(shard_address)
            shard.send(self.index)
            driver = serving.accept()
            while (request := driver.recv()) is not None:
                message, metrics = self.run(request)
                shard.send(message)
                driver.send(metrics)

        serving.start(serve, lambda text: None)
        return serving.address


class Shard(Serves):
    """The shard: folds the round's N messages (each checked: shape, finite) into a total; returns a small summary."""

    def __init__(self):
        self.serving = None

    def pid(self) -> int:
        return os.getpid()

    def fold(self, *messages):
        total = np.zeros_like(messages[0])
        for message in messages:
            if message.shape != total.shape or not np.isfinite(message).all():
                raise ValueError("a malformed message")
            total += message
        return float(total[0]), float(total[-1]), len(messages)

    def open_channel(self, key: bytes, actors: int):
        """The engine's shard channel: take the driver's and the N actors' connections, then for each round index the
        driver sends, fold one message from each actor as they arrive and send the total."""
        self.close_channel()
        serving = self.serving = Serving("127.0.0.1", key)

        def serve():
            peers = {}
            while len(peers) < actors + 1:
                conn = serving.accept()
                peers[conn.recv()] = conn
            driver = peers.pop("driver")
            populations = [peers[a] for a in range(actors)]
            while driver.recv() is not None:
                driver.send(self.fold(*as_ready(populations)))

        serving.start(serve, lambda text: None)
        return serving.address


def expected_total(actors: int, nbytes: int, model_first: float, r: int):
    first = sum(r + model_first + a for a in range(actors))
    last = sum(float(a + 1) for a in range(actors)) if nbytes >= 16 else first
    return first, last, actors


class RayCalls:
    name = "ray"

    def __init__(self, pops, shard, nbytes):
        self.pops, self.shard = pops, shard

    def round(self, request):
        outs = [p.run.options(num_returns=2).remote(request) for p in self.pops]
        total = self.shard.fold.remote(*[message for message, _ in outs])
        got = ray.get([total, *[metrics for _, metrics in outs]], timeout=TIMEOUT_S)
        return got[0], got[1:]

    def close(self):
        pass


class Direct:
    name = "direct"

    def __init__(self, pops, shard, nbytes):
        key = new_key()
        shard_address = ray.get(shard.open_channel.remote(key, len(pops)))
        addresses = ray.get([p.open_channel.remote(key, shard_address) for p in pops])
        self.pops, self.shard_actor, self.actors = [connect(a, key) for a in addresses], shard, pops
        self.shard = connect(shard_address, key)
        self.shard.send("driver")

    def round(self, request):
        data = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)    # once for all actors, as the engine does
        for conn in self.pops:
            conn.send_bytes(data)
        self.shard.send(request[1])
        values = receive(self.pops + [self.shard], TIMEOUT_S, lambda n: TimeoutError(f"{n} channels silent"))
        return values[-1], values[:-1]

    def close(self):
        for conn in self.pops + [self.shard]:
            try:
                conn.send(None)
            except OSError:
                pass
        close_all(self.pops + [self.shard])
        ray.get([p.close_channel.remote() for p in self.actors] + [self.shard_actor.close_channel.remote()])


class Compiled:
    name = "compiled"

    def __init__(self, pops, shard, nbytes):
        from ray.dag import InputNode, MultiOutputNode
        with InputNode() as request:
            outs = [p.run.options(num_returns=2).bind(request) for p in pops]
            total = shard.fold.bind(*[message for message, _ in outs])
            dag = MultiOutputNode([total, *[metrics for _, metrics in outs]])
        # channels sized for the round's messages from the start (a resize on the first large message hung here)
        self.dag = dag.experimental_compile(_buffer_size_bytes=nbytes + (64 << 10), _submit_timeout=TIMEOUT_S)

    def round(self, request):
        got = ray.get(self.dag.execute(request), timeout=TIMEOUT_S)
        return got[0], got[1:]

    def close(self):
        # Its actors are killed once their loops have had TEARDOWN_S to end: with 1 MiB messages the shard's
        # reader did not end after teardown() here (Ray 2.60), and teardown() without kill_actors waited for ever.
        self.dag.teardown(kill_actors=True)


def ray_daemons() -> dict:
    """{name: pid} of this Ray instance's raylet and GCS (started by this script)."""
    node = ray._private.worker._global_node
    pids = {}
    for name in ("raylet", "gcs_server"):
        for info in node.all_processes.get(name, []):
            pids[name] = info.process.pid
    return pids


def measure(transport_cls, pops, shard, pids: dict, nbytes: int, model: np.ndarray, rounds: int, warmup: int,
            idle_s: float) -> dict:
    """Latency and CPU per round of `rounds` rounds (after `warmup`), then the CPU of `idle_s` idle seconds."""
    transport = transport_cls(pops, shard, nbytes)
    try:
        for r in range(warmup):
            transport.round((model, r))
        groups = {"driver": [pids["driver"]], "actors": pids["actors"], "ray daemons": pids["daemons"]}
        before = {g: sum(cpu_seconds(p) for p in ps) for g, ps in groups.items()}
        times = []
        began = time.perf_counter()
        for r in range(warmup, warmup + rounds):
            t0 = time.perf_counter()
            total, metrics = transport.round((model, r))
            times.append(time.perf_counter() - t0)
            if tuple(total) != expected_total(len(pops), nbytes, float(model[0]), r) or len(metrics) != len(pops):
                raise AssertionError(f"{transport.name}: round {r} folded {total}, expected "
                                     f"{expected_total(len(pops), nbytes, float(model[0]), r)}")
        wall = time.perf_counter() - began
        after = {g: sum(cpu_seconds(p) for p in ps) for g, ps in groups.items()}
        row = {"transport": transport.name, "bytes": nbytes, "p50_ms": 1e3 * statistics.median(times),
               "p90_ms": 1e3 * float(np.quantile(times, 0.9)), "wall_ms": 1e3 * wall / rounds}
        for g in groups:
            row[f"cpu_ms_{g}"] = 1e3 * (after[g] - before[g]) / rounds
        row["cpu_ms"] = sum(row[f"cpu_ms_{g}"] for g in groups)
        # idle: the transport is set up (a compiled graph compiled, channels open) and nothing runs
        before = {g: sum(cpu_seconds(p) for p in ps) for g, ps in groups.items()}
        threads_before = thread_times(pids["actors"])
        t0 = time.perf_counter()
        time.sleep(idle_s)
        idle = time.perf_counter() - t0
        after = {g: sum(cpu_seconds(p) for p in ps) for g, ps in groups.items()}
        threads_after = thread_times(pids["actors"])
        for g in groups:
            row[f"idle_cores_{g}"] = (after[g] - before[g]) / idle
        row["idle_cores"] = sum(row[f"idle_cores_{g}"] for g in groups)
        # the busiest actor thread while idle: its share of a core, and how often it went to sleep (a thread that
        # waits by blocking sleeps at every wait; one that never does is polling)
        busiest = max(threads_after, key=lambda k: threads_after[k][0] - threads_before.get(k, (0.0, 0))[0])
        row["idle_busiest_thread_cores"] = (threads_after[busiest][0] - threads_before.get(busiest, (0.0, 0))[0]) / idle
        row["idle_busiest_thread_sleeps_per_s"] = (threads_after[busiest][1] -
                                                   threads_before.get(busiest, (0.0, 0))[1]) / idle
        return row
    except BaseException:
        traceback.print_exc()      # before the close, which may wait for the failed transport's processes
        raise
    finally:
        transport.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--actors", type=int, default=4, help="population actors (default 4)")
    parser.add_argument("--sizes", default="4096,65536,1048576", help="message bytes per actor, comma-separated")
    parser.add_argument("--model-bytes", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--idle-s", type=float, default=5.0, help="idle seconds measured per transport")
    parser.add_argument("--transports", default="ray,direct,compiled")
    parser.add_argument("--cores", default="16,64", help="node sizes for the idle-CPU model")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    classes = {"ray": RayCalls, "direct": Direct, "compiled": Compiled}
    chosen = [classes[t] for t in args.transports.split(",")]

    from ray.dag import DAGContext
    DAGContext.get_current().teardown_timeout = TEARDOWN_S
    ray.init(address="local", num_cpus=args.actors + 2, include_dashboard=False, logging_level="ERROR",
             log_to_driver=False, _node_ip_address="127.0.0.1")
    try:
        remote_pop, remote_shard = ray.remote(num_cpus=0)(Population), ray.remote(num_cpus=0)(Shard)

        def start_actors(nbytes):
            pops = [remote_pop.remote(a) for a in range(args.actors)]
            shard = remote_shard.remote()
            return pops, shard, ray.get([p.size.remote(nbytes) for p in pops]) + [ray.get(shard.pid.remote())]

        shared = start_actors(4096)      # the Ray-call and direct rounds' actors, kept for the whole script
        model = np.arange(max(1, args.model_bytes // 8), dtype=float)
        rows = []
        for repeat in range(args.repeat):
            for nbytes in sizes:
                ray.get([p.size.remote(nbytes) for p in shared[0]])
                for cls in chosen:
                    # a compiled graph gets actors of its own, killed after it (see Compiled.close)
                    actors = start_actors(nbytes) if cls is Compiled else shared
                    pids = {"driver": os.getpid(), "actors": actors[2], "daemons": list(ray_daemons().values())}
                    rows.append(measure(cls, actors[0], actors[1], pids, nbytes, model, args.rounds, args.warmup,
                                        args.idle_s))
                    print("  " + " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                                          for k, v in rows[-1].items()), flush=True)
    finally:
        ray.shutdown()

    print(f"\nmachine: {platform.node()} {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the end; "
          f"ray {ray.__version__}; {args.actors} population actors + 1 shard; model {args.model_bytes} B; "
          f"{args.rounds} rounds per measure, medians of {args.repeat}")
    cols = ["p50_ms", "p90_ms", "cpu_ms", "cpu_ms_driver", "cpu_ms_actors", "cpu_ms_ray daemons", "idle_cores",
            "idle_busiest_thread_cores", "idle_busiest_thread_sleeps_per_s"]
    heads = ["p50 ms", "p90 ms", "CPU ms/rd", "driver", "actors", "raylet+GCS", "idle cores", "thread", "sleeps/s"]
    print(f"{'transport':<9} {'msg bytes':>9} " + " ".join(f"{h:>10}" for h in heads) + "   p50/ray  CPU/ray")
    medians = {}
    for nbytes in sizes:
        for cls in chosen:
            mine = [row for row in rows if row["transport"] == cls.name and row["bytes"] == nbytes]
            medians[cls.name, nbytes] = {c: statistics.median(row[c] for row in mine) for c in cols}
        for cls in chosen:
            m, base = medians[cls.name, nbytes], medians.get(("ray", nbytes))
            ratios = (f"   {m['p50_ms'] / base['p50_ms']:7.2f}  {m['cpu_ms'] / base['cpu_ms']:7.2f}"
                      if base else "")
            print(f"{cls.name:<9} {nbytes:>9} " + " ".join(f"{m[c]:>10.3f}" for c in cols) + ratios)

    if "compiled" in [cls.name for cls in chosen]:
        # A compiled graph's actor waits for its next input on a thread that polls its channel without sleeping
        # (the "sleeps/s" column: ~0): it uses whatever core it can get for as long as it waits, in a round (the
        # shard waiting for the populations, the populations for the next round) and between runs alike. Here,
        # with more processes than cores, each got a share of a core; on a node with a core free per actor it
        # would burn a whole core each.
        share = statistics.median(medians["compiled", n]["idle_busiest_thread_cores"] for n in sizes)
        sleeps = statistics.median(medians["compiled", n]["idle_busiest_thread_sleeps_per_s"] for n in sizes)
        idle = statistics.median(medians["compiled", n]["idle_cores"] for n in sizes)
        others = max([medians[key]["idle_cores"] for key in medians if key[0] != "compiled"], default=0.0)
        print(f"\ncompiled graph, idle: {idle:.2f} cores in all ({args.actors + 1} actors; Ray calls / direct: at most "
              f"{others:.2f}); an actor's waiting thread took {share:.2f} of a core and slept {sleeps:.1f} times/s "
              f"(a busy poll: on a free core it takes the whole core)")
        small = sizes[0]
        per_actor = {name: medians[name, small]["cpu_ms"] / (args.actors + 1)
                     for name in ("ray", "direct", "compiled") if (name, small) in medians}
        print(f"CPU per round per actor ({small}-byte messages, measured above, every process of the round counted): "
              + ", ".join(f"{name} {ms:.2f} ms" for name, ms in per_actor.items())
              + " (the compiled figure includes its actors' polling while they waited in the rounds, as much of the"
              " cores as they got here)")
        print("on a node of C cores running C - 1 actors (a core left for the driver and Ray), while the actors wait"
              " (between rounds, in a round while others work):")
        print(f"{'node cores':>10} {'actors':>7} {'polling cores':>14} {'share of node':>14}"
              f" {'spin CPU ms per 10 ms of waiting':>34}")
        for cores in sorted({os.cpu_count(), *(int(c) for c in args.cores.split(","))}):
            actors = max(1, cores - 1)
            print(f"{cores:>10} {actors:>7} {actors:>14} {actors / cores:>14.0%} {actors * 10:>34}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
