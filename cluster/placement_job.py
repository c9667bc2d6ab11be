#!/usr/bin/env python3
"""Small ldpfed runs spread over every node of the Ray cluster they run on, over the direct transport; meant for
`ray job submit`.

    ray job submit --working-dir . -- python cluster/placement_job.py [--algorithm ldp-ols] [--users 3000]

One population actor and one server shard per alive node (the Ray engine places them round robin, one per node),
two populations per node, `run_ray(..., transport="direct")`: each round's messages go over the direct transport's
sockets (ldpfed/engine/channels.py), from the driver to the population actors and shards and from every population
actor to every shard, so most of them cross from one node's address to another's. Two runs: pre-aggregated (small
messages) and per-user (every user's message goes to the shards: larger ones).

After every round (the run's progress callback) the job reads the driver's TCP connections to the channel ports
(LDPFED_CHANNEL_PORTS, set by ray_config.yaml's start commands) with `ss`: a round counts as a direct round when the
driver had a channel to every population actor and every shard and each one carried bytes back during that round.
It also lists the channels between other processes of the job's node (population actors on the head connect to the
shards on the workers).

Prints one line `PLACEMENT {json}`: the nodes (id -> address), per run the node of every population (the engine's
summary["population_nodes"]) and of every shard, the transport and its fallback, the rounds and the direct rounds,
the peer addresses of the channels seen, and whether the result table equals `run_local`'s for the same config.
Exits 1 unless, for every run: populations ran on every node, shards on more than one node, the transport stayed
direct (no fallback), every round was a direct round, channels went to other nodes' addresses, and the tables are
equal.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

import ray

from ldpfed.config import RunConfig
from ldpfed.engine import run_local
from ldpfed.engine.ray_engine import ensure_ray, run_ray

PORTS_VAR = "LDPFED_CHANNEL_PORTS"


def _address(text: str) -> tuple[str, int]:
    host, port = text.rsplit(":", 1)
    host = host.strip("[]")
    return host.removeprefix("::ffff:"), int(port)


def channel_sockets(ports: range) -> list[dict]:
    """The node's established TCP connections with one end on a channel port (`ss -tinp`): local and peer address,
    the owning pid, bytes sent and received."""
    out = subprocess.run(["ss", "-tinpH", "state", "established"], capture_output=True, text=True,
                         check=True).stdout
    sockets, current = [], None
    for line in out.splitlines():
        if not line.startswith((" ", "\t")):        # a connection: recv-q send-q local peer users:(...)
            fields = line.split()
            local, peer = _address(fields[2]), _address(fields[3])
            pid = re.search(r"pid=(\d+)", line)
            current = {"local": local, "peer": peer, "pid": int(pid.group(1)) if pid else None,
                       "sent": 0, "received": 0}
            if local[1] in ports or peer[1] in ports:
                sockets.append(current)
        elif current is not None:                 # its TCP details
            for key, name in (("sent", "bytes_sent"), ("received", "bytes_received")):
                found = re.search(rf"\b{name}:(\d+)", line)
                if found:
                    current[key] = int(found.group(1))
    return sockets


class ChannelWatch:
    """A progress callback that samples this node's channel sockets after every round."""

    def __init__(self, ports: range):
        self.ports, self.samples = ports, []

    def __call__(self, users_done, regret) -> None:
        self.samples.append(channel_sockets(self.ports))

    def direct_rounds(self, expected_channels: int) -> int:
        """Rounds after which the driver held `expected_channels` channels (to each population actor and shard),
        every one of which received bytes during the round (the first sample is taken before the first round)."""
        def driver_channels(sample):
            return {(s["local"], s["peer"]): s["received"] for s in sample
                    if s["pid"] == os.getpid() and s["peer"][1] in self.ports}
        count, before = 0, driver_channels(self.samples[0]) if self.samples else {}
        for sample in self.samples[1:]:
            mine = driver_channels(sample)
            if len(mine) == expected_channels and all(got > before.get(key, 0) for key, got in mine.items()):
                count += 1
            before = mine
        return count

    def peers(self, driver_only: bool) -> list[str]:
        me = os.getpid()
        return sorted({s["peer"][0] for sample in self.samples for s in sample
                       if (s["pid"] == me) == driver_only and s["peer"][1] in self.ports})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithm", default="ldp-ols")
    parser.add_argument("--users", type=int, default=3000, help="users of the pre-aggregated run")
    parser.add_argument("--round-size", type=int, default=100, help="round size of the pre-aggregated run")
    parser.add_argument("--per-user-users", type=int, default=12000)
    parser.add_argument("--per-user-round-size", type=int, default=2000)
    parser.add_argument("--compare-ray", action="store_true",
                        help="after each run, the same config over Ray calls (transport 'ray') and over the direct "
                             "transport again, both on warm actors: their median round time and CPU in the run's "
                             "'compare'")
    args = parser.parse_args(argv)

    spec = os.environ.get(PORTS_VAR, "")
    if not re.fullmatch(r"\d+-\d+", spec):
        print(f"{PORTS_VAR} is not set to a port range in the job's environment (ray_config.yaml sets it)",
              file=sys.stderr)
        return 1
    low, high = (int(p) for p in spec.split("-"))
    ports = range(low, high + 1)

    ensure_ray(None, log_to_driver=False)        # the job's cluster (RAY_ADDRESS, set by `ray job submit`)
    nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()
             if n["Alive"] and n.get("Resources", {}).get("CPU", 0) > 0}
    here = ray.util.get_node_ip_address()
    runs, ok = [], True
    for mode, users, round_size in (("pre-aggregated", args.users, args.round_size),
                                    ("per-user", args.per_user_users, args.per_user_round_size)):
        config = RunConfig(args.algorithm, env="linear", users=users, round_size=round_size,
                           populations=2 * len(nodes), seed=5, env_params={"d": 3, "K": 4})
        watch = ChannelWatch(ports)
        remote = run_ray(config, actors=len(nodes), shards=len(nodes), mode=mode, transport="direct",
                         progress=watch)
        local = run_local(config)
        summary = remote.summary
        population_nodes = summary["population_nodes"]
        rounds = -(-users // round_size)
        driver_peers = watch.peers(driver_only=True)
        run = {"mode": mode, "users": users, "round_size": round_size,
               "population_nodes": {str(p): nodes.get(node, node) for p, node in population_nodes.items()},
               "shard_nodes": [nodes.get(node, node) for node in summary["shard_nodes"]],
               "transport": summary["transport"], "transport_fallback": summary["transport_fallback"],
               "recoveries": summary["recoveries"], "rounds": rounds,
               "direct_rounds": watch.direct_rounds(len(nodes) * 2),
               "direct_rounds_reported": summary.get("direct_rounds"),
               "driver_channel_peers": driver_peers, "other_channel_peers": watch.peers(driver_only=False),
               "populations_on_every_node": set(population_nodes.values()) == set(nodes),
               "same_table_as_run_local": bool(local.table.equals(remote.table)),
               "final_regret": summary["final_regret"]}
        run["ok"] = bool(run["populations_on_every_node"] and len(set(run["shard_nodes"])) > 1
                         and run["transport"] == "direct" and run["transport_fallback"] is None
                         and run["direct_rounds"] == rounds
                         and run["direct_rounds_reported"] in (None, rounds)
                         and set(driver_peers) - {here}
                         and run["same_table_as_run_local"])
        if args.compare_ray:
            run["compare"] = {}
            for transport in ("ray", "direct"):
                stamps = []
                again = run_ray(config, actors=len(nodes), shards=len(nodes), mode=mode, transport=transport,
                                progress=lambda users_done, regret: stamps.append(time.perf_counter()))
                # a round's wall time: between two progress calls, after the first round (which opens the channels)
                round_ms = sorted(1e3 * (b - a) for a, b in zip(stamps[1:], stamps[2:]))
                run["compare"][transport] = {
                    "round_ms_median": round_ms[len(round_ms) // 2] if round_ms else None,
                    **{key: again.summary[key] for key in ("transport", "elapsed_s", "cpu_s_driver",
                                                           "cpu_s_populations", "cpu_s_shards")}}
                run["compare"][transport]["same_table_as_run_local"] = bool(local.table.equals(again.table))
                run["ok"] = run["ok"] and run["compare"][transport]["same_table_as_run_local"]
        ok = ok and run["ok"]
        runs.append(run)
    print("PLACEMENT " + json.dumps({"nodes": nodes, "driver_node": here, "channel_ports": spec, "runs": runs,
                                     "ok": ok}), flush=True)
    ray.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
