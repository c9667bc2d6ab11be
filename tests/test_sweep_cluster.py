"""A sweep on a 3-node local cluster (ray.cluster_utils.Cluster, 1 CPU per node, in a subprocess: never the
session's Ray): its runs go to every node, and with a worker node removed mid-sweep every run still ends equal to
the same sweep run in one process, bit for bit (the lost node's runs are retried on the others)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import json, sys, threading, time
from pathlib import Path

import pandas as pd
import ray
from ray.cluster_utils import Cluster

import ldpfed

LOOPBACK = "127.0.0.2"    # 127.0.0.1 would be replaced by the machine's outward address
out = Path(sys.argv[1])
SWEEP = dict(algorithms=["ldp-sgd", "ldp-ols"], eps=[1.0], seeds="0-5", users=6000, round_size=50,
             engine="local", tracking=False, progress=False, verbose=False, out=out, checkpoint_every_s=0.5)
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                       "node_ip_address": LOOPBACK})
workers = [cluster.add_node(num_cpus=1, node_ip_address=LOOPBACK) for _ in range(2)]
cluster.wait_for_nodes()


def same(a, b):
    left, right = a.table.set_index("key").sort_index(), b.table.set_index("key").sort_index()
    if list(left.index) != list(right.index) or not (left["status"] == "FINISHED").all():
        return False
    if not left["final_regret"].equals(right["final_regret"]):
        return False
    return all(pd.read_parquet(a.folder / "runs" / key / "table.parquet").equals(
        pd.read_parquet(b.folder / "runs" / key / "table.parquet")) for key in left.index)


try:
    ray.init(address=cluster.address, _node_ip_address=LOOPBACK, log_to_driver=False, logging_level="ERROR")
    alone = ldpfed.sweep(name="alone", workers=1, **SWEEP)                 # in this process: the reference
    spread = ldpfed.sweep(name="spread", address=cluster.address, **SWEEP)  # workers: the cluster's 3 CPUs

    lost = []
    def remove_a_worker_node():     # once 3 runs are done, while others run: its raylet and workers killed
        summary = out / "lossy" / "summary" / "summary.parquet"
        while True:
            try:
                if len(pd.read_parquet(summary)) >= 3:
                    break
            except Exception:
                pass
            time.sleep(0.1)
        lost.append(workers[0].node_id)
        cluster.remove_node(workers[0], allow_graceful=False)

    threading.Thread(target=remove_a_worker_node, daemon=True).start()
    lossy = ldpfed.sweep(name="lossy", address=cluster.address, **SWEEP)
    print("RESULT " + json.dumps({
        "runs": len(alone.table), "spread_nodes": spread.table["node_id"].nunique(),
        "spread_same": same(alone, spread), "lossy_same": same(alone, lossy), "lost": lost,
        "lossy_nodes": sorted(lossy.table["node_id"].unique()),
        "lossy_ok": lossy.ok, "resumed": int(lossy.table.get("resumed_from_round", pd.Series()).notna().sum())}))
finally:
    ray.shutdown()
    cluster.shutdown()
"""


@pytest.mark.slow     # a 3-node cluster and three sweeps of 12 runs: minutes on 2 cores; run by jobs/slow_tests.py
def test_a_sweep_fills_every_node_and_survives_a_lost_node(tmp_path):
    env = dict(os.environ, RAY_DEDUP_LOGS="0")
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True,
                          timeout=900, env=env, cwd=ROOT)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["runs"] == 12
    assert out["spread_nodes"] == 3 and out["spread_same"]            # every node ran runs; the same bits
    assert out["lossy_ok"] and out["lossy_same"] and len(out["lost"]) == 1
    assert 2 <= len(out["lossy_nodes"]) <= 3
