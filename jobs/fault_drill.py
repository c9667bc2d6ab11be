#!/usr/bin/env python
"""Fault drill: inject each fault into a real run and measure the time to detect it and to recover.

    python jobs/fault_drill.py                       # ldp-ols, d=10, K=10, 2e5 users in rounds of 2,000
    python jobs/fault_drill.py --users 2000000       # the issue's size

Scenarios (each run is compared, table bit for bit, with an undisturbed run of the same config):
* population actor SIGKILLed, shard actor SIGKILLed (Ray engine, 2 actors, 2 shards): detect = from the kill to
  the engine noticing; recover = from then to the recreated actor being ready (the round is then redone).
* actor frozen with SIGSTOP (SIGCONT later), default timeout (10x the slowest recent round, >= 5 s) or
  --round-timeout: detect = from the SIGSTOP to the timeout firing.
* driver SIGKILLed (a subprocess running `python -m ldpfed run --checkpoint-dir`): detect is whoever restarts
  it; recover = from the restart to the resumed run passing the round it was killed at; lost = rounds redone.
Only processes this job started are ever signalled (the actors of its own Ray, by the pids the engine reports).
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ldpfed.config import RunConfig  # noqa: E402
from ldpfed.engine import run_local  # noqa: E402
from ldpfed.tracking import local_server  # noqa: E402


def actor_fault(config, kind: str, how: str, at_round: int, options: dict) -> dict:
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
    it answers /health (killed if it does not within 180 s)."""
    proc = local_server.spawn(root, port)
    try:
        local_server.wait_healthy(proc, root, port, timeout=180)
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithm", default="ldp-ols")
    parser.add_argument("--users", type=int, default=200_000)
    parser.add_argument("--round-size", type=int, default=2000)
    parser.add_argument("--populations", type=int, default=4)
    parser.add_argument("--d", type=int, default=10)
    parser.add_argument("--K", type=int, default=10)
    parser.add_argument("--round-timeout", type=float, default=None, help="fixed round timeout (default: derived)")
    parser.add_argument("--at-round", type=int, default=None, help="round after which to inject (default: T/B/3)")
    parser.add_argument("--skip-actors", action="store_true")
    parser.add_argument("--skip-driver", action="store_true")
    parser.add_argument("--skip-mlflow", action="store_true")
    args = parser.parse_args(argv)
    config = RunConfig(args.algorithm, env="linear", users=args.users, round_size=args.round_size,
                       populations=args.populations, env_params={"d": args.d, "K": args.K})
    at_round = args.at_round if args.at_round is not None else config.rounds // 3
    from ldpfed.engine.ray_engine import ensure_ray
    import ray

    print(f"fault drill: {config.algorithm} d={args.d} K={args.K} T={config.users:,} B={config.round_size} "
          f"({config.rounds} rounds), fault after round {at_round}; load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs (shared machine)", flush=True)
    t0, c0 = time.perf_counter(), time.process_time()
    reference = run_local(config)
    print(f"undisturbed single-process run: {time.perf_counter() - t0:.1f} s wall, "
          f"{time.process_time() - c0:.1f} s CPU", flush=True)
    options = {"actors": 2, "shards": 2}
    if args.round_timeout is not None:
        options["round_timeout"] = args.round_timeout
    rows = []
    ensure_ray(None)
    try:
        for name, kind, how, spares in () if args.skip_actors else (
                ("population actor killed", "population", "kill", 0),
                ("shard actor killed", "shard", "kill", 0),
                ("population actor frozen", "population", "freeze", 0),
                ("shard actor frozen", "shard", "freeze", 0),
                ("population actor killed, 1 spare", "population", "kill", 1),
                ("shard actor killed, 1 spare", "shard", "kill", 1)):
            out = actor_fault(config, kind, how, at_round, {**options, "spares": spares})
            same = out["result"].table.equals(reference.table)
            rows.append((name, out["detect_s"], out["recover_s"], out["wall_s"], same))
            print(f"  {name}: detected in {out['detect_s']:.2f} s, recovered in {out['recover_s']:.2f} s "
                  f"(+ the round redone), run {out['wall_s']:.1f} s, identical table: {same}", flush=True)
    finally:
        ray.shutdown()
    if not args.skip_driver:
        driver_config = config.replace(round_size=max(config.populations, config.round_size // 10))
        out = driver_kill(driver_config)
        same = out["table"].equals(run_local(driver_config).table)
        rows.append((f"driver SIGKILLed (B={driver_config.round_size}), `--resume`", None, out["recover_s"],
                     out["wall_s"], same))
        print(f"  driver killed after checkpoint round {out['resumed_from']} of {driver_config.rounds}: the resumed "
              f"run took {out['recover_s']:.1f} s (a whole run {out['whole_s']:.1f} s, both with interpreter start), "
              f"identical table: {same}", flush=True)
    if not args.skip_mlflow:
        for how in ("kill", "freeze"):
            with tempfile.TemporaryDirectory(prefix="ldpfed-drill-mlflow-") as tmp:
                out = mlflow_outage(Path(tmp), how)
            same = out["parent_status"] == "FINISHED" and len(out["children"]) == out["runs"] and all(
                status == "FINISHED" for _, status in out["children"]) and out["local_report"]
            rows.append((f"MLflow server {'killed' if how == 'kill' else 'frozen'} (sync after restart)",
                         out["detect_s"], out["sync_s"], None, same))
    print("\n| scenario | time to detect (s) | time to recover (s) | run wall (s) | identical to undisturbed |")
    print("|---|---|---|---|---|")
    for name, detect, recover, wall, same in rows:
        d = "-" if detect is None else f"{detect:.2f}"
        w = "-" if wall is None else f"{wall:.1f}"
        print(f"| {name} | {d} | {recover:.2f} | {w} | {same} |")
    return 0 if all(row[-1] for row in rows) else 1


if __name__ == "__main__":
    from ldpfed.signals import exit_status, interruptible

    try:
        with interruptible():      # SIGTERM too runs the `finally`s: Ray and the MLflow servers stop with the job
            sys.exit(main())
    except KeyboardInterrupt as stop:
        sys.exit(exit_status(stop))
