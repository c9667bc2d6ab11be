"""A Ray run asks for the CPUs it uses and holds them in a placement group of its own: the share that fits, two runs
at once in disjoint reservations, a run that does not fit waits and says so, and (slow) an autoscaler that adds
nodes for a run that asks for more CPUs than the cluster has, then removes them when idle."""
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ldpfed.util.errors import ConfigError
from test_ray_engine import LDP, assert_same, small

ROOT = Path(__file__).resolve().parents[1]


def test_the_share_that_fits_and_the_cpu_options_are_checked():
    from ldpfed.engine.ray_options import RayOptions
    from ldpfed.engine.ray_placement import fitting_share

    assert fitting_share([2.0], 6) == 0.3333           # 6 actors on one 2-CPU node
    assert fitting_share([1.0, 1.0], 3) == 0.5         # 3 on two 1-CPU nodes: 2/3 each would not fit on either
    assert fitting_share([16.0], 4) == 1.0             # at most one CPU each
    assert fitting_share([0.0, 0.0], 2) == 0.0         # nothing free
    assert RayOptions(actor_cpus=0.25, shard_cpus=2).shard_cpus == 2.0
    for name, value in [("actor_cpus", 0), ("shard_cpus", -1), ("actor_cpus", 0.00001), ("actor_cpus", True),
                        ("placement", "strict"), ("placement_timeout", 0)]:
        with pytest.raises(ConfigError) as error:
            RayOptions(**{name: value})
        assert error.value.field == name


def test_the_command_line_takes_the_cpu_options_and_names_a_bad_one_before_any_work(capsys):
    from ldpfed import cli

    for flag, value in (("--actor-cpus", "0.00001"), ("--shard-cpus", "-1")):
        with pytest.raises(SystemExit) as stopped:
            cli.main(["run", "uniform", "--users", "100", "--engine", "ray", flag, value, "--quiet"])
        assert stopped.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"python -m ldpfed: error: {flag}: "), err
    with pytest.raises(SystemExit):
        cli.main(["run", "uniform", "--engine", "ray", "--placement", "strict"])
    assert "invalid choice: 'strict'" in capsys.readouterr().err


def _placed_cpus(group_id: str) -> float:
    from ray.util.placement_group import placement_group_table

    table = placement_group_table()[group_id]
    assert table["state"] == "CREATED", table
    return sum(bundle.get("CPU", 0.0) for bundle in table["bundles"].values())


def test_two_runs_at_once_hold_disjoint_cpus_and_a_third_that_does_not_fit_waits_then_fails_clearly(ray_session):
    import ray

    from ldpfed.engine import run_local
    from ldpfed.engine.driver import drive
    from ldpfed.engine.ray_engine import RayBackend, RunFault, run_ray

    total = ray.cluster_resources()["CPU"]            # the session's 2
    config = small(LDP[0] if LDP else "uniform")
    local = run_local(config)
    asks = [dict(actors=2, shards=1, actor_cpus=0.5, shard_cpus=0.25),     # 1.25 CPUs
            dict(actors=1, shards=1, actor_cpus=0.25, shard_cpus=0.25)]    # 0.5
    backends = [RayBackend(**ask) for ask in asks]
    halfway, go, results = [threading.Event() for _ in asks], threading.Event(), [None] * len(asks)

    def run(i):
        def hold(done, regret):      # both runs stop between two rounds until the checks below are done
            if done >= config.users // 2 and not halfway[i].is_set():
                halfway[i].set()
                go.wait(300)
        try:
            results[i] = drive(config, backends[i], progress=hold)
        finally:
            backends[i].release(reuse=False)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(asks))]
    for thread in threads:
        thread.start()
    try:
        assert all(event.wait(300) for event in halfway)
        groups = [backend.crew.group.id.hex() for backend in backends]
        assert groups[0] != groups[1]
        held = [_placed_cpus(group) for group in groups]
        assert held == [1.25, 0.5]
        # each run's CPUs are its own: what is left available is the rest, not shared with either
        assert ray.available_resources().get("CPU", 0.0) == pytest.approx(total - sum(held))
        # a third run asking for more than is left waits for it, then fails saying what it waited for
        began = time.perf_counter()
        with pytest.raises(RunFault, match=r"not placed: the cluster has 0.25 of its 2 CPUs available"):
            run_ray(config, actors=1, shards=1, actor_cpus=0.5, shard_cpus=0.5, placement_timeout=2)
        assert time.perf_counter() - began >= 2
    finally:
        go.set()
        for thread in threads:
            thread.join(300)
    for result, ask, group in zip(results, asks, groups):
        assert_same(local, result)
        s = result.summary
        assert s["placement_group"] == group and s["actors_in_group"] == ask["actors"] + ask["shards"]
        assert s["cpus_held"] == pytest.approx(ask["actors"] * ask["actor_cpus"] + ask["shards"] * ask["shard_cpus"])
    # the groups went with their runs: the third run now fits
    assert_same(local, run_ray(config, actors=1, shards=1, actor_cpus=0.5, shard_cpus=0.5, placement_timeout=60))
    assert all(placement["state"] == "REMOVED" for group, placement in ray.util.placement_group_table().items()
               if group in groups)


def test_the_next_run_of_the_same_shape_takes_the_held_group_and_its_warm_actors(ray_session):
    """A run that ends well leaves its placement group held, its actors idle in their bundles; the next run of the
    same shape takes both (no new processes, the same CPUs), a run of another shape ends them and frees the CPUs, and
    a run that fails hands nothing back."""
    import ray
    from ray.util.placement_group import placement_group_table

    from ldpfed.engine import run_local
    from ldpfed.engine.ray_engine import IDLE_ACTORS, run_ray

    IDLE_ACTORS.clear_groups()
    shape = dict(actors=2, shards=1, actor_cpus=0.25, shard_cpus=0.25, spares=1)
    first = run_ray(small("uniform"), **shape)
    other_seed = small(LDP[0] if LDP else "uniform", seed=8)
    second = run_ray(other_seed, **shape)
    assert_same(run_local(other_seed), second)
    group = first.summary["placement_group"]
    assert second.summary["placement_group"] == group
    assert second.summary["actor_pids"] == first.summary["actor_pids"]      # the same processes, warm
    held = 3 * 0.25 + 2 * 0.25                                               # 3 actors and a spare of each kind
    assert ray.available_resources().get("CPU", 0.0) == pytest.approx(ray.cluster_resources()["CPU"] - held)
    # another shape: the held group is removed before the new one is reserved
    third = run_ray(small("uniform"), **{**shape, "actors": 1})
    assert third.summary["placement_group"] != group
    assert placement_group_table()[group]["state"] == "REMOVED"
    # a run that fails ends its actors and removes its group instead of holding them
    with pytest.raises(Exception):
        run_ray(small("uniform"), **{**shape, "actors": 1},
                progress=lambda done, regret: (_ for _ in ()).throw(RuntimeError("stop")) if done else None)
    assert not IDLE_ACTORS.groups


def test_without_a_group_runs_ask_for_no_cpus_and_reuse_processes_across_shapes(ray_session):
    """placement "none": no group, nothing reserved; a run of another shape takes the idle processes of its kinds
    that the last run left, and the results stay run_local's."""
    import ray

    from ldpfed.engine import run_local
    from ldpfed.engine.ray_engine import IDLE_ACTORS, run_ray

    IDLE_ACTORS.clear()
    first = run_ray(small("uniform"), actors=2, shards=2, placement="none")
    assert first.summary["placement_group"] is None and first.summary["cpus_held"] == 0
    assert first.summary["actors_in_group"] == 0
    assert ray.available_resources().get("CPU", 0.0) == ray.cluster_resources()["CPU"]
    config = small(LDP[0] if LDP else "uniform", seed=8)
    second = run_ray(config, actors=1, shards=2, placement="none")          # another shape
    assert_same(run_local(config), second)
    pids = second.summary["actor_pids"]
    assert set(pids["population"]) < set(first.summary["actor_pids"]["population"])
    assert sorted(pids["shard"]) == sorted(first.summary["actor_pids"]["shard"])
    with pytest.raises(ConfigError) as error:
        run_ray(config, placement="none", actor_cpus=0.5)
    assert error.value.field == "placement"


def test_a_held_group_gives_its_cpus_back_to_tasks_and_after_a_while(ray_session, monkeypatch, tmp_path):
    """A held group does not starve other work: a sweep's Ray tasks end it before they ask for CPUs, and a group
    nobody takes ends after HOLD_S seconds."""
    import ray

    import ldpfed
    from ldpfed.engine import ray_placement
    from ldpfed.engine.ray_engine import IDLE_ACTORS, run_ray

    total = ray.cluster_resources()["CPU"]
    shape = dict(actors=1, shards=1, actor_cpus=0.5, shard_cpus=0.5, spares=1)      # holds all 2 CPUs
    run_ray(small("uniform"), **shape)
    assert IDLE_ACTORS.groups and ray.available_resources().get("CPU", 0.0) == pytest.approx(0.0)
    result = ldpfed.sweep(algorithms="uniform", envs="linear", seeds=[0, 1], users=300, round_size=100,
                          engine="local", workers=2, tracking=False, out=str(tmp_path), progress=False,
                          verbose=False)
    assert len(result.table) == 2 and not result.failures and not IDLE_ACTORS.groups
    monkeypatch.setattr(ray_placement, "HOLD_S", 1.0)
    run_ray(small("uniform"), **shape)
    assert IDLE_ACTORS.groups
    waited = time.perf_counter()
    while ray.available_resources().get("CPU", 0.0) < total and time.perf_counter() - waited < 30:
        time.sleep(0.1)
    assert not IDLE_ACTORS.groups and ray.available_resources().get("CPU", 0.0) == pytest.approx(total)


def test_by_default_a_run_takes_the_share_of_the_cpus_that_fits(ray_session):
    import ray

    from ldpfed.engine import run_local
    from ldpfed.engine.ray_engine import IDLE_ACTORS, run_ray

    config = small("uniform", users=240, round_size=60, populations=4)
    IDLE_ACTORS.clear_groups()      # earlier tests' runs may have left a group held for the next of their shape
    # the share is of what is available when the run starts: an earlier run's group is released asynchronously
    total, waited = ray.cluster_resources()["CPU"], time.perf_counter()
    while ray.available_resources().get("CPU", 0.0) < total and time.perf_counter() - waited < 60:
        time.sleep(0.2)
    remote = run_ray(config, actors=4, shards=2, mode="per-user")     # 6 actors on the session's 2 CPUs
    assert_same(run_local(config), remote)
    s = remote.summary
    share = round(total / 6 - 0.00005, 4)
    assert s["actor_cpus"] == s["shard_cpus"] == share and s["actors_in_group"] == 6
    assert s["cpus_held"] == pytest.approx(6 * share)


# ---- an autoscaling cluster of its own (slow) -----------------------------------------------------------------
# ray.cluster_utils.AutoscalingCluster cannot be used here: Ray 2.60's wheel lacks the fake provider's example.yaml
# it reads, and its start and shutdown run `ray stop --force`, which ends every Ray instance on the machine. So this
# test starts the head itself, `ray start --head --block` with cluster/autoscaling.yaml's node types on Ray's
# fake_multinode provider (nodes are processes of this machine), in a process group of its own that it ends.
LOOPBACK = "127.0.0.2"

AUTOSCALED_RUN = r"""
import json, signal, sys, time
import ray
from ldpfed.config import RunConfig
from ldpfed.engine import run_local
from ldpfed.engine.ray_engine import run_ray

for attempt in range(120):          # the head may still be starting
    try:
        ray.init(address=sys.argv[1], _node_ip_address=sys.argv[2], log_to_driver=False, logging_level="ERROR")
        break
    except Exception:
        time.sleep(1)
else:
    sys.exit("the head did not start")
signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))     # Ray's own handler would abort

def alive():
    return [n["NodeID"] for n in ray.nodes() if n["Alive"]]

out = {"nodes_before": len(alive())}
config = RunConfig(sys.argv[3], env="linear", users=2000, round_size=100, populations=4, seed=3,
                   env_params={"d": 3, "K": 4})
began = time.time()
remote = run_ray(config, actors=4, shards=2, actor_cpus=1, shard_cpus=1, placement_timeout=400)
s = remote.summary
out.update(run_s=time.time() - began, same=bool(run_local(config).table.equals(remote.table)),
           nodes_used=s["nodes"], nodes_after_run=len(alive()), actors_in_group=s["actors_in_group"],
           cpus_held=s["cpus_held"], head=[n["NodeID"] for n in ray.nodes() if n["Alive"]
                                           and "node:__internal_head__" in n["Resources"]],
           actor_nodes=sorted(set(s["population_nodes"].values()) | set(s["shard_nodes"])))
ended = time.time()
while len(alive()) > out["nodes_before"] and time.time() < ended + 240:
    time.sleep(2)
out.update(nodes_at_end=len(alive()), idle_removed_s=time.time() - ended)
print("RESULT " + json.dumps(out), flush=True)
ray.shutdown()
"""


@pytest.mark.slow     # a head and autoscaled worker nodes on this machine: minutes; run by jobs/slow_tests.py
def test_a_run_that_asks_for_more_cpus_than_the_cluster_has_makes_the_autoscaler_add_nodes_then_remove_them():
    import shutil
    import signal
    import socket
    import tempfile

    import yaml

    from ldpfed.engine.ray_security import disable_metrics_export, enable_token_auth

    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        port = probe.getsockname()[1]
    config = yaml.safe_load((ROOT / "cluster" / "autoscaling.yaml").read_text())
    types = config["available_node_types"]
    head_cpus = types[config["head_node_type"]]["resources"]["CPU"]
    worker_cpus = types["worker_4cpu"]["resources"]["CPU"]
    # the file's node types and limits; the fake provider (no machines, no SSH), workers idle after 6 s
    config.update(provider={"type": "fake_multinode", "gcs_address": f"{LOOPBACK}:{port}",
                            "disable_node_updaters": True, "use_node_id_as_ip": True, "disable_launch_config_check": True},
                  idle_timeout_minutes=0.1, auth={"ssh_user": "unused"}, file_mounts={}, cluster_synced_files=[],
                  file_mounts_sync_continuously=False, rsync_exclude=[], rsync_filter=[],
                  initialization_commands=[], setup_commands=[], head_setup_commands=[], worker_setup_commands=[],
                  head_start_ray_commands=[], worker_start_ray_commands=[])
    for node_type in types.values():
        node_type["node_config"] = {}
    # a short folder: Ray's socket paths under it must stay within AF_UNIX's 107 bytes (pytest's tmp_path may not)
    tmp_path = Path(tempfile.mkdtemp(prefix="ldpfed-as-", dir="/tmp"))
    (tmp_path / "autoscaling.json").write_text(json.dumps(config))
    env = dict(os.environ, RAY_FAKE_CLUSTER="1", AUTOSCALER_UPDATE_INTERVAL_S="1", RAY_DEDUP_LOGS="0")
    env.pop("RAY_ADDRESS", None)
    saved = dict(os.environ)
    try:                       # the head and the driver with a private token and no metrics exporter, as ensure_ray
        enable_token_auth()
        disable_metrics_export()
        env.update({key: os.environ[key] for key in os.environ if key not in saved or os.environ[key] != saved[key]})
    finally:
        os.environ.clear()
        os.environ.update(saved)
    head = subprocess.Popen(
        [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block", f"--port={port}",
         f"--node-ip-address={LOOPBACK}", f"--num-cpus={head_cpus}", "--include-dashboard=false",
         f"--autoscaling-config={tmp_path / 'autoscaling.json'}", f"--temp-dir={tmp_path / 'ray'}"],
        env=env, start_new_session=True, stdout=open(tmp_path / "head.log", "w"), stderr=subprocess.STDOUT)
    try:
        algorithm = LDP[0] if LDP else "uniform"
        proc = subprocess.run([sys.executable, "-c", AUTOSCALED_RUN, f"{LOOPBACK}:{port}", LOOPBACK, algorithm],
                              capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    finally:
        os.killpg(head.pid, signal.SIGKILL)      # the head's processes and the worker nodes its autoscaler started
        head.wait(30)
        log = (tmp_path / "head.log").read_text()[-3000:]
        shutil.rmtree(tmp_path, ignore_errors=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stdout[-3000:] + proc.stderr[-3000:] + log
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["same"] and out["nodes_before"] == 1
    assert out["actors_in_group"] == 6 and out["cpus_held"] == 6.0
    # 6 CPUs asked for, none on the head: the autoscaler added at least 6 / 4 -> 2 workers, and the actors run there
    assert out["nodes_used"] >= -(-6 // worker_cpus) and not set(out["actor_nodes"]) & set(out["head"])
    assert out["nodes_after_run"] >= 3
    assert out["nodes_at_end"] == 1          # idle workers removed (idle_timeout_minutes 0.1)
