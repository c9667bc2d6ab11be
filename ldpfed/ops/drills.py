"""Fault drills (jobs/fault_drill.py, tests/test_faults.py): a fault injected into a real run, with the time to
detect it and to recover. Only processes a drill started are ever signalled (the actors of its own Ray, by the
pids the engine reports; the servers and subprocesses it spawned, by their own process groups).

The driver and MLflow drills run `python -m ldpfed` and jobs/run_all.py in subprocesses, from the repository this
package is in (ROOT): they are drills of a checkout, not of an installed package.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd

from ldpfed.tracking import local_server

ROOT = Path(__file__).resolve().parents[2]   # the checkout this package is in (two folders up)


def actor_fault(config, kind: str, how: str, at_round: int, options: dict) -> dict:
    """The first `kind` actor ("population", "shuffler" or "shard") of a Ray run SIGKILLed (how="kill") or SIGSTOPped
    ("freeze", SIGCONT 60 s later) after round `at_round`: the result, the time to detect and to recover."""
    from ldpfed.engine.driver import drive
    from ldpfed.engine.ray_engine import RayBackend

    backend = RayBackend(**options)
    injected = {}
    at_users = (at_round + 1) * config.round_size

    def progress(done, regret):
        if done == at_users and not injected:
            pid = backend.pids()[kind][0]
            injected["at"] = time.time()
            os.kill(pid, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
            injected["pid"] = pid
            if how == "freeze":
                def thaw():
                    try:
                        os.kill(pid, signal.SIGCONT)
                    except ProcessLookupError:
                        pass
                threading.Timer(60.0, thaw).start()

    started = time.perf_counter()
    try:
        result = drive(config, backend, progress=progress)
    finally:
        backend.release(reuse=False)
    events = result.summary["recovery_events"]
    first = events[0] if events else None
    return {"result": result, "wall_s": time.perf_counter() - started, "recoveries": len(events),
            "detect_s": None if first is None else first["detected_at"] - injected["at"],
            "recover_s": None if first is None else first["recover_s"],
            "redo_rounds": len(events)}


def driver_kill(config, every_rounds: int = 10) -> dict:
    """`python -m ldpfed run --out` in a subprocess, SIGKILLed after its checkpoint passes a third of the rounds,
    then `--resume`d: the resumed run's wall time and the rounds it had to redo."""
    from ldpfed.engine.checkpoint import load

    work = Path(tempfile.mkdtemp(prefix="ldpfed-drill-"))
    out = work / "out"
    cmd = [sys.executable, "-m", "ldpfed", "run", config.algorithm, "--env", config.env, "--users", str(config.users),
           "--round-size", str(config.round_size), "--populations", str(config.populations), "--seed",
           str(config.seed), "--quiet", "--out", str(out), "--checkpoint-every-rounds", str(every_rounds)]
    for key, value in config.env_params.items():
        cmd += ["--env-param", f"{key}={value}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.perf_counter()
    subprocess.run(cmd + ["--out", str(work / "whole")], env=env, check=True, stdout=subprocess.DEVNULL)
    whole_s = time.perf_counter() - started
    child = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    checkpoint = out / "checkpoint" / "checkpoint.npz"
    killed_at = 0
    while child.poll() is None:    # kill it once its checkpoint passes a third of the rounds
        try:
            killed_at = load(checkpoint)["next_round"] if checkpoint.exists() else 0
        except Exception:  # noqa: BLE001 - being replaced right now
            pass
        if killed_at >= config.rounds // 3:
            child.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    child.wait()
    if killed_at == 0 or (out / "results.parquet").exists():
        raise RuntimeError("the run ended before the drill could kill it: use more users")
    restarted = time.perf_counter()
    subprocess.run(cmd + ["--resume", str(out)], env=env, check=True, stdout=subprocess.DEVNULL, timeout=1800)
    resumed_s = time.perf_counter() - restarted
    return {"table": pd.read_parquet(out / "results.parquet"), "recover_s": resumed_s, "resumed_from": killed_at,
            "whole_s": whole_s, "wall_s": resumed_s}


# ---- MLflow outage -------------------------------------------------------------------------------------------
def start_mlflow(root: Path, port: int) -> subprocess.Popen:
    """`mlflow server` on 127.0.0.1:port, SQLite and artifacts under root, in its own process group; returns once
    it answers /health (killed if it stays silent for ldpfed.util.waits.HANG_S, a bound on a hang only)."""
    proc = local_server.spawn(root, port)
    try:
        local_server.wait_healthy(proc, root, port)
    except RuntimeError:
        signal_group(proc, signal.SIGKILL)
        raise
    return proc


def signal_group(proc: subprocess.Popen, sig) -> None:
    """Signal the server's own process group (it was started in a new session: only its processes)."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    if sig == signal.SIGKILL:
        proc.wait()


def mlflow_outage(root: Path, how: str = "kill", runs: int = 5, users: int = 20_000, log=print) -> dict:
    """A sweep of `runs` runs logging to a real server that is killed (or frozen: SIGSTOP) after 2 runs; the
    sweep must finish locally; the server is restarted (or thawed) and `ldpfed sync` repairs MLflow. Returns
    the figures and what MLflow holds at the end."""
    import json

    from mlflow import MlflowClient

    root.mkdir(parents=True, exist_ok=True)
    port = local_server.free_port()
    uri = f"http://127.0.0.1:{port}"
    server = start_mlflow(root, port)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    sweep_cmd = [sys.executable, str(ROOT / "jobs" / "run_all.py"), "--engine", "local", "--algorithms", "ldp-sgd",
                 "--users", str(users), "--round-size", "50", "--seeds", f"0-{runs - 1}", "--eps", "1",
                 "--tracking-uri", uri, "--out", str(root / "out"), "--name", "outage", "--experiment", "drill"]
    folder = root / "out" / "outage"
    try:
        sweep = subprocess.Popen(sweep_cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        logged = []
        while sweep.poll() is None:          # wait for 2 runs in MLflow, then take the server away
            try:
                logged = [v for v in json.loads((folder / "sweep.json").read_text())["runs"].values() if v]
            except (OSError, ValueError, KeyError):
                pass
            if len(logged) >= 2:
                break
            time.sleep(0.1)
        hit = time.time()
        signal_group(server, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        detected = None
        while sweep.poll() is None:
            try:
                if detected is None and json.loads((folder / "sweep.json").read_text()).get("mlflow_errors"):
                    detected = time.time()
            except (OSError, ValueError):
                pass
            time.sleep(0.1)
        out, err = sweep.communicate()
        if detected is None and json.loads((folder / "sweep.json").read_text()).get("mlflow_errors"):
            detected = time.time()
        local_ok = (folder / "report" / "regret_table.md").exists()
        if how == "kill":
            server = start_mlflow(root, port)
        else:
            signal_group(server, signal.SIGCONT)
        back = time.perf_counter()
        sync = subprocess.run([sys.executable, "-m", "ldpfed", "sync", str(folder), "--tracking-uri", uri], env=env,
                              capture_output=True, text=True, timeout=600)
        sync_s = time.perf_counter() - back
        again = subprocess.run([sys.executable, "-m", "ldpfed", "sync", str(folder), "--tracking-uri", uri], env=env,
                               capture_output=True, text=True, timeout=600)
        client = MlflowClient(tracking_uri=uri)
        experiment = client.get_experiment_by_name("drill")
        index = json.loads((folder / "sweep.json").read_text())
        parent = client.get_run(index["parent_run_id"])
        children = client.search_runs([experiment.experiment_id],
                                      f"tags.`ldpfed.sweep_id` = '{index['parent_run_id']}'")
        children = [r for r in children if r.info.run_id != parent.info.run_id]
        figures = {"sweep_exit": sweep.returncode, "sweep_err": err[-3000:], "sync_out": sync.stdout + sync.stderr,
                   "sync_again_out": again.stdout, "sync_exit": sync.returncode, "local_report": local_ok,
                   "runs_before": len(logged), "detect_s": None if detected is None else detected - hit,
                   "sync_s": sync_s, "parent_status": parent.info.status,
                   "children": sorted((r.data.tags.get("ldpfed.key"), r.info.status) for r in children),
                   "runs": runs}
        log(f"  MLflow server {'killed' if how == 'kill' else 'frozen'} after {len(logged)} of {runs} runs: the "
            f"sweep went local-only {figures['detect_s'] or float('nan'):.1f} s later (exit {sweep.returncode}, "
            f"regret_table.md written: {local_ok}); `ldpfed sync` after the restart: {sync_s:.1f} s; MLflow "
            f"then holds {sum(s == 'FINISHED' for _, s in figures['children'])}/{runs} FINISHED runs, parent "
            f"{parent.info.status}")
        return figures
    finally:
        signal_group(server, signal.SIGCONT)
        signal_group(server, signal.SIGKILL)


# ---- nodes: a cluster of its own (ray.cluster_utils), in a process where Ray is not started yet ----------------
LOOPBACK = "127.0.0.2"     # 127.0.0.1 would be replaced by the machine's outward address


class LocalNodes:
    """A head and `workers` worker nodes of one CPU each on this machine (ray.cluster_utils.Cluster), this process
    its driver; `kill(i)` ends worker i's raylet and every worker process it started, `freeze(i)` SIGSTOPs them
    (SIGCONT on `close`), `add()` starts a new worker node (a lost node coming back)."""

    def __init__(self, workers: int = 2):
        import ray
        from ray.cluster_utils import Cluster

        self.cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                                     "node_ip_address": LOOPBACK})
        self.workers = [self.cluster.add_node(num_cpus=1, node_ip_address=LOOPBACK) for _ in range(workers)]
        self.cluster.wait_for_nodes()
        self.stopped: list[int] = []
        self.lost: list[float] = []      # when the nodes killed and not yet replaced were killed
        ray.init(address=self.cluster.address, _node_ip_address=LOOPBACK, log_to_driver=False,
                 logging_level="ERROR")

    def alive(self) -> list:
        return [w for w in self.workers if w is not None]

    def _processes(self, index: int) -> list:
        """The pids of worker node `index`: its raylet, then the processes it started (the actors' workers)."""
        raylet = self.workers[index].all_processes["raylet"][0].process.pid
        return [raylet] + [int(pid) for pid in Path(f"/proc/{raylet}/task/{raylet}/children").read_text().split()]

    def kill(self, index: int) -> None:
        node, pids = self.workers[index], self._processes(index)
        self.cluster.remove_node(node, allow_graceful=False)
        for pid in pids[1:]:         # the actors die with their machine, not when they notice the raylet is gone
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        node.all_processes = {}      # what Ray's exit hook of a removed node reads (else an AttributeError at exit)
        self.workers[index] = None

    def freeze(self, index: int) -> None:
        pids = self._processes(index)
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        self.stopped.extend(pids)

    def add(self) -> None:
        self.workers.append(self.cluster.add_node(num_cpus=1, node_ip_address=LOOPBACK))

    def close(self) -> None:
        import ray

        for pid in self.stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        ray.shutdown()
        self.cluster.shutdown()


def node_fault(config, how: str, at_round: int, options: dict) -> dict:
    """On a 3-node local cluster of its own (call it where Ray is not started): the last worker node, which hosts a
    population actor and a shard, killed (how="kill") or frozen ("freeze") after round `at_round`. The result, the
    time to detect and to recover."""
    from ldpfed.engine.ray_engine import RayBackend

    nodes = LocalNodes(workers=2)
    injected = {}
    at_users = (at_round + 1) * config.round_size

    def progress(done, regret):
        if done == at_users and not injected:
            injected["at"] = time.time()
            (nodes.kill if how == "kill" else nodes.freeze)(1)

    result, wall_s = _drive_on(nodes, config, RayBackend(**{"actors": 3, "shards": 3, **options}), progress)
    events = result.summary["recovery_events"]
    first = events[0] if events else None
    return {"result": result, "wall_s": wall_s, "recoveries": len(events),
            "moved": [(a["kind"], a["old_node"] != a["new_node"]) for e in events for a in e["actors"]],
            "detect_s": None if first is None else first["detected_at"] - injected["at"],
            "recover_s": None if first is None else first["recover_s"]}


def chaos_soak(config, every_s: float, seed: int, options: dict, node_share: float = 0.3, progress=None) -> dict:
    """A run on a 3-node local cluster of its own while a seeded schedule injects a fault every `every_s` seconds
    (between rounds): SIGKILL of a random actor of the run, or (with probability node_share, while a worker node is
    left) a random worker node killed, replaced by a new node from the next fault `every_s` / 2 later on. Returns
    the result and the faults injected, with the recoveries the engine made."""
    from ldpfed.engine.ray_engine import RayBackend

    nodes = LocalNodes(workers=2)
    # every fault is a recovery: the run's limit on recoveries is lifted (a fault every every_s seconds)
    backend = RayBackend(**{"actors": 3, "shards": 3, "max_recoveries": 10**6, **options})
    rng = np.random.default_rng(seed)
    faults = []

    next_at = [None]

    def tick(done, regret):
        """Between rounds, in the driver's main thread (Ray starts nodes from there only): the next fault when it
        is due; the schedule's clock starts after the first round (the actors started)."""
        now = time.time()
        if next_at[0] is None:
            next_at[0] = now + every_s
        elif now >= next_at[0]:
            next_at[0] = now + every_s
            inject(now)
        if progress is not None:
            progress(done, regret)

    def inject(now):
        if nodes.lost and now >= nodes.lost[0] + every_s / 2:
            nodes.add()                   # a lost node comes back (a new machine)
            nodes.lost.pop(0)
        if rng.random() < node_share and nodes.alive():
            index = nodes.workers.index(nodes.alive()[int(rng.integers(len(nodes.alive())))])
            nodes.kill(index)
            nodes.lost.append(now)
            faults.append({"at": now, "fault": f"worker node {index} killed"})
            return
        pids = [pid for kind in ("population", "shard") for pid in backend.pids()[kind] if pid]
        pid = int(pids[int(rng.integers(len(pids)))])
        try:
            os.kill(pid, signal.SIGKILL)
            faults.append({"at": now, "fault": f"actor pid {pid} killed"})
        except ProcessLookupError:
            faults.append({"at": now, "fault": f"actor pid {pid} already gone"})

    result, wall_s = _drive_on(nodes, config, backend, tick)
    return {"result": result, "wall_s": wall_s, "faults": faults, "recoveries": result.summary["recovery_events"]}


def _drive_on(nodes, config, backend, progress):
    """(result, wall seconds) of `drive` on the nodes' cluster; the run's actors and the cluster end with it."""
    from ldpfed.engine.driver import drive

    started = time.perf_counter()
    try:
        result = drive(config, backend, progress=progress)
    finally:
        backend.release(reuse=False)
        nodes.close()
    return result, time.perf_counter() - started
