"""Clusters of their own, each in a subprocess (never the session's Ray instance):
* a 2-node ray.cluster_utils.Cluster: populations are placed on BOTH nodes and the result equals run_local's;
* `ray job submit` of a small job to a local cluster started on free loopback ports by cluster/local_cluster.py,
  with token authentication on (a wrong token is refused), private files, no token warning, then stopped by
  process group."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ldpfed.algorithms import REGISTRY

ROOT = Path(__file__).resolve().parents[1]
ALGORITHM = "ldp-ols" if "ldp-ols" in REGISTRY else "uniform"
RAY = str(Path(sys.executable).with_name("ray"))

# A 2-node ray.cluster_utils.Cluster (head and one worker, 1 CPU each) and this script connected to it; a script goes
# on inside the `try` and ends with `CLUSTER_DOWN`.
TWO_NODE_CLUSTER = r"""
import json, sys
import ray
from ray.cluster_utils import Cluster
from ldpfed.config import RunConfig
from ldpfed.engine import run_local
from ldpfed.engine.ray_engine import cluster_nodes, run_ray

LOOPBACK = "127.0.0.2"    # 127.0.0.1 would be replaced by the machine's outward address
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                       "node_ip_address": LOOPBACK})
cluster.add_node(num_cpus=1, node_ip_address=LOOPBACK)
cluster.wait_for_nodes()
try:
    ray.init(address=cluster.address, _node_ip_address=LOOPBACK, log_to_driver=False, logging_level="ERROR")
"""
CLUSTER_DOWN = r"""
finally:
    ray.shutdown()
    cluster.shutdown()
"""

TWO_NODES = TWO_NODE_CLUSTER + r"""
    assert cluster.address.startswith(LOOPBACK), cluster.address
    nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
    config = RunConfig(sys.argv[1], env="linear", users=400, round_size=50, populations=4, seed=11,
                       env_params={"d": 3, "K": 4})
    local = run_local(config)
    out = {"nodes": nodes, "runs": []}
    for shards, mode in [(2, "pre-aggregated"), (2, "per-user")]:
        remote = run_ray(config, actors=2, shards=shards, mode=mode)
        out["runs"].append({"shards": shards, "mode": mode,
                            "population_nodes": remote.summary["population_nodes"],
                            "shard_nodes": remote.summary["shard_nodes"], "nodes_used": remote.summary["nodes"],
                            "same_table": bool(local.table.equals(remote.table)),
                            "regret": [local.summary["final_regret"], remote.summary["final_regret"]]})
    print("RESULT " + json.dumps(out))
""" + CLUSTER_DOWN


NODE_LOSS = r"""
import json, sys
from ldpfed.config import RunConfig
from ldpfed.engine import run_local
from ldpfed.ops.drills import node_fault

algorithm, mode, fault = sys.argv[1:4]
config = RunConfig(algorithm, env="linear", users=3000, round_size=100, populations=6, seed=5,
                   env_params={"d": 3, "K": 4})
out = node_fault(config, fault, at_round=9, options={"mode": mode, "round_timeout": 5.0})
s = out["result"].summary
print("RESULT " + json.dumps({"same": bool(run_local(config).table.equals(out["result"].table)),
                              "recoveries": out["recoveries"], "moved": out["moved"], "nodes": s["nodes"]}))
"""


NODE_JOINS = TWO_NODE_CLUSTER + r"""
    config = RunConfig(sys.argv[1], env="linear", users=3000, round_size=100, populations=6, seed=5,
                       env_params={"d": 3, "K": 4})
    before, joined = cluster_nodes(), []

    def progress(users_done, regret):      # a third of the way in, a third node joins the cluster
        if users_done >= 1000 and not joined:
            cluster.add_node(num_cpus=1, node_ip_address=LOOPBACK)
            cluster.wait_for_nodes()
            joined.extend(n for n in cluster_nodes() if n not in before)

    remote = run_ray(config, actors=2, shards=1, progress=progress, rebalance_every=0)
    s = remote.summary
    print("RESULT " + json.dumps({"same": bool(run_local(config).table.equals(remote.table)), "joined": joined,
                                  "rebalances": s["rebalances"], "population_nodes": s["population_nodes"],
                                  "shard_nodes": s["shard_nodes"], "nodes": s["nodes"], "before": before}))
""" + CLUSTER_DOWN


@pytest.mark.slow     # a 2-node cluster that grows to 3: ~30 s; run by jobs/slow_tests.py
def test_a_node_that_joins_mid_run_takes_a_population_actor_and_the_run_ends_bit_identical():
    """The head (a population actor and the shard) and a worker (the other population actor); a third node joins a
    third of the way in. At the next round the head's population actor moves to it (the head has two of the run's
    actors, the new node none); the shard stays; the table is the undisturbed one."""
    env = dict(os.environ, RAY_DEDUP_LOGS="0")
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-c", NODE_JOINS, ALGORITHM], capture_output=True, text=True,
                          timeout=400, env=env, cwd=ROOT)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["same"] and len(out["joined"]) == 1
    (move,) = out["rebalances"]
    head, new = out["before"][0], out["joined"][0]
    assert (move["kind"], move["index"], move["old_node"], move["new_node"]) == ("population", 0, head, new)
    assert 10 <= move["round"] <= 12        # the round after the join, not before
    assert out["shard_nodes"] == [head] and out["nodes"] == 3
    assert {out["population_nodes"][str(p)] for p in (0, 2, 4)} == {new}


@pytest.mark.slow     # a 3-node cluster per case: ~70 s in all; run by jobs/slow_tests.py
@pytest.mark.parametrize("fault, mode", [("kill", "per-user"), ("freeze", "pre-aggregated")])
def test_a_lost_node_is_left_behind_and_the_run_ends_bit_identical(fault, mode):
    """A 3-node cluster (ray.cluster_utils, in a subprocess): a third of the way in, the node hosting a population
    actor and a shard is killed (its raylet and workers gone) or frozen (SIGSTOP on all of them: a partition).
    Ray has not marked the node dead when the engine recovers, so the replacements must be placed elsewhere (placed
    by Ray alone, a replacement could go back to the dead node, and ActorDiedError would end the run)."""
    env = dict(os.environ, RAY_DEDUP_LOGS="0")
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-c", NODE_LOSS, ALGORITHM, mode, fault], capture_output=True, text=True,
                          timeout=400, env=env, cwd=ROOT)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["same"] and out["recoveries"] >= 1
    assert sorted(out["moved"]) == [["population", True], ["shard", True]]     # both left the lost node
    assert out["nodes"] == 2


@pytest.mark.slow     # a 2-node cluster: ~20 s; run by jobs/slow_tests.py
def test_two_node_cluster_uses_both_nodes_and_equals_single_process():
    env = dict(os.environ, RAY_DEDUP_LOGS="0")
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-c", TWO_NODES, ALGORITHM], capture_output=True, text=True, timeout=400,
                          env=env, cwd=ROOT)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert len(out["nodes"]) == 2
    for run in out["runs"]:
        used = set(run["population_nodes"].values())
        assert used == set(out["nodes"]), run        # populations on BOTH nodes
        assert set(run["shard_nodes"]) == set(out["nodes"]) and run["nodes_used"] == 2
        assert run["same_table"], run
        assert run["regret"][0] == run["regret"][1]


@pytest.fixture
def local_cluster(tmp_path):
    directory = tmp_path / "cluster"
    env = dict(os.environ, RAY_AUTH_TOKEN_PATH=str(tmp_path / "token"), RAY_DEDUP_LOGS="0")
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_AUTH_TOKEN", None)
    start = subprocess.run([sys.executable, str(ROOT / "cluster" / "local_cluster.py"), "start", "--workers", "0",
                            "--dir", str(directory), "--timeout", "240"], capture_output=True, text=True, env=env,
                           timeout=300)
    try:
        assert start.returncode == 0, start.stdout + start.stderr
        record = json.loads((directory / "cluster.json").read_text())
        yield record, env
    finally:
        stop = subprocess.run([sys.executable, str(ROOT / "cluster" / "local_cluster.py"), "stop", "--dir",
                               str(directory), "--grace", "5"], capture_output=True, text=True, env=env, timeout=120)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert "waiting up to 5 s" in stop.stdout and "stopped 1 nodes" in stop.stdout, stop.stdout
    for node in record["nodes"]:
        assert not Path(f"/proc/{node['pid']}").exists() or \
            Path(f"/proc/{node['pid']}/stat").read_text().split(")")[-1].split()[0] == "Z"


@pytest.mark.slow     # a local cluster and a Ray job: ~18 s; run by jobs/slow_tests.py
def test_ray_job_submit_to_a_local_cluster_with_token_auth(local_cluster):
    record, env = local_cluster
    dashboard = record["dashboard"]
    assert dashboard.startswith("http://127.0.0.1:") and record["address"].startswith("127.0.0.2:")  # loopback
    assert record["auth"] == "token"
    # private: the directory, its files and the token are readable by their owner only
    directory = Path(env["RAY_AUTH_TOKEN_PATH"]).parent / "cluster"
    for path in [directory, *directory.iterdir(), Path(env["RAY_AUTH_TOKEN_PATH"])]:
        assert path.stat().st_mode & 0o077 == 0, path
    job_env = dict(env, RAY_ADDRESS=dashboard, RAY_AUTH_MODE="token")
    entry = [sys.executable, "-m", "ldpfed", "run", ALGORITHM, "--env", "linear", "--env-param", "d=3",
             "--env-param", "K=4", "--users", "300", "--round-size", "50", "--populations", "4", "--engine", "ray",
             "--actors", "2", "--shards", "2", "--quiet"]
    proc = subprocess.run([RAY, "job", "submit", "--", *entry], capture_output=True, text=True, env=job_env,
                          timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert "succeeded" in output
    assert f"{ALGORITHM} on linear: T=300 B=50" in output
    assert "users/s (ray;" in output and "final cumulative regret" in output
    assert "Token authentication" not in output          # the token is set up: Ray has nothing to warn about

    # the same request with a wrong token is refused
    wrong = dict(job_env, RAY_AUTH_TOKEN="not-the-cluster-token")
    denied = subprocess.run([RAY, "job", "list"], capture_output=True, text=True, env=wrong, timeout=120)
    assert denied.returncode != 0
    assert "Authentication" in denied.stdout + denied.stderr
