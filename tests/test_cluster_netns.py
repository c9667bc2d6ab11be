"""`ray up ray_config.yaml` on a real multi-node cluster: three nodes in network namespaces of this machine, each
with its own address, reached over SSH (cluster/netns_cluster.sh all: up, ray job submit of
cluster/placement_job.py, down). Slow (several minutes) and needs root: run with `pytest -m slow
tests/test_cluster_netns.py`. Asserts populations ran on every node (three distinct addresses), the result equals
run_local's, and that nothing the script created is left (namespaces, state directory, sshd and Ray processes).
The job's runs use the direct transport (transport="direct"): the test asserts that every round of both runs
(pre-aggregated and per-user) went over its sockets (the driver's channel to every population actor and shard
carried bytes in every round, per `ss`), with no fallback to Ray calls, and that those sockets joined the nodes' own
addresses (the driver's channels reach the two workers' addresses, not only its own node's)."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "cluster" / "netns_cluster.sh"


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, sshd)"
    if shutil.which("ip") is None or subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        return "`ip netns` is unavailable"
    for tool in ("unshare", "sshd", "ssh", "ssh-keygen", "rsync"):
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            return f"{tool} is missing (apt-get install -y openssh-server openssh-client rsync)"
    return None


@pytest.mark.slow
@pytest.mark.skipif(_missing() is not None, reason=str(_missing()))
def test_ray_up_on_network_namespaces_places_populations_on_every_node():
    ns, subnet, state = "ldpfed-nt-", "10.200.78", "/run/ldpfed-netns-test"    # apart from a manual run's
    env = dict(os.environ, NS=ns, SUBNET=subnet, STATE=state, WORKERS="2",
               RAY=str(Path(sys.executable).with_name("ray")), PYTHON=sys.executable)
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(["bash", str(SCRIPT), "all"], capture_output=True, text=True, env=env, timeout=3000)
    output = proc.stdout + proc.stderr
    try:
        assert proc.returncode == 0, output[-5000:]
        lines = [line for line in proc.stdout.splitlines() if line.startswith("PLACEMENT ")]
        assert lines, output[-5000:]
        placement = json.loads(lines[-1][len("PLACEMENT "):])
        addresses = set(placement["nodes"].values())
        assert addresses == {f"{subnet}.1", f"{subnet}.2", f"{subnet}.3"}, placement       # three real nodes
        assert placement["driver_node"] == f"{subnet}.1", placement                         # the job runs on the head
        assert [run["mode"] for run in placement["runs"]] == ["pre-aggregated", "per-user"], placement
        for run in placement["runs"]:
            assert set(run["population_nodes"].values()) == addresses, run                  # populations on each
            assert set(run["shard_nodes"]) == addresses, run                                # and shards
            assert run["populations_on_every_node"] and run["same_table_as_run_local"], run
            # every round over the direct transport's sockets, none over Ray calls
            assert run["transport"] == "direct" and run["transport_fallback"] is None, run
            assert run["recoveries"] == 0 and run["rounds"] > 1, run
            assert run["direct_rounds"] == run["rounds"], run
            assert run["direct_rounds_reported"] in (None, run["rounds"]), run
            # those sockets joined the nodes' own addresses: the driver's reach both workers
            assert set(run["driver_channel_peers"]) == addresses, run
            assert run["ok"], run
        assert placement["ok"], placement
        assert "ray up" in output and "ray down" in output
    finally:
        # everything it created is gone, even when a step failed
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert ns not in names, names
        assert not Path(state).exists()
        leftovers = subprocess.run(["pgrep", "-af", state], capture_output=True, text=True).stdout
        assert leftovers.strip() == "", leftovers
