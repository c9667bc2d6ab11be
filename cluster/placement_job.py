#!/usr/bin/env python3
"""A small ldpfed run spread over every node of the Ray cluster it runs on; meant for `ray job submit`.

    ray job submit --working-dir . -- python cluster/placement_job.py [--algorithm ldp-ols] [--users 3000]

One population actor and one server shard per alive node (the Ray engine places them round robin, one per node),
two populations per node. Prints one line `PLACEMENT {json}`: the nodes (id -> address), the node of every
population (the engine's summary["population_nodes"]) and of every shard, and whether the result table equals
`run_local`'s for the same config. Exits 1 unless populations ran on every node and the tables are equal.
"""
from __future__ import annotations

import argparse
import json
import sys

import ray

from ldpfed.config import RunConfig
from ldpfed.engine import run_local
from ldpfed.engine.ray_engine import ensure_ray, run_ray


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithm", default="ldp-ols")
    parser.add_argument("--users", type=int, default=3000)
    parser.add_argument("--round-size", type=int, default=100)
    parser.add_argument("--mode", default="pre-aggregated", choices=["pre-aggregated", "per-user"])
    args = parser.parse_args(argv)

    ensure_ray(None, log_to_driver=False)        # the job's cluster (RAY_ADDRESS, set by `ray job submit`)
    nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()
             if n["Alive"] and n.get("Resources", {}).get("CPU", 0) > 0}
    config = RunConfig(args.algorithm, env="linear", users=args.users, round_size=args.round_size,
                       populations=2 * len(nodes), seed=5, env_params={"d": 3, "K": 4})
    remote = run_ray(config, actors=len(nodes), shards=len(nodes), mode=args.mode)
    local = run_local(config)
    population_nodes = remote.summary["population_nodes"]
    out = {"nodes": nodes,
           "population_nodes": {str(p): nodes.get(node, node) for p, node in population_nodes.items()},
           "shard_nodes": [nodes.get(node, node) for node in remote.summary["shard_nodes"]],
           "populations_on_every_node": set(population_nodes.values()) == set(nodes),
           "same_table_as_run_local": bool(local.table.equals(remote.table)),
           "final_regret": remote.summary["final_regret"]}
    print("PLACEMENT " + json.dumps(out), flush=True)
    ray.shutdown()
    return 0 if out["populations_on_every_node"] and out["same_table_as_run_local"] else 1


if __name__ == "__main__":
    sys.exit(main())
