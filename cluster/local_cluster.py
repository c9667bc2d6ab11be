#!/usr/bin/env python3
"""A local multi-node Ray cluster on one machine: a head and N worker nodes, loopback only, token auth on.

    python cluster/local_cluster.py start [--workers 2] [--cpus-per-node 1] [--port 0] [--dashboard-port 0]
                                          [--dir /tmp/ldpfed-cluster]
    python cluster/local_cluster.py status [--dir ...]
    python cluster/local_cluster.py stop   [--dir ...]

Each node is one `ray start --block` process (head: `ray start --head`; workers: `ray start --address`), started
in its own process group with distinct ports (0 = a free port) and a resource naming it (`ldpfed_head`,
`ldpfed_worker1`, ...). `start` waits until every node has joined and writes `<dir>/cluster.json` (addresses,
process ids) and `<dir>/env.sh` (RAY_ADDRESS, RAY_AUTH_MODE) to source before `ray job submit`.

`stop` ends exactly the processes this script started, by process-group id. It does not call `ray stop`, which
kills every Ray process of the machine (other people's clusters and test sessions included); on a machine of
your own `ray stop` is the blunt equivalent.

Security: RAY_AUTH_MODE=token is set for every node, so every RPC and HTTP request (jobs API, dashboard) needs
the cluster token; the token is read from RAY_AUTH_TOKEN, else the file RAY_AUTH_TOKEN_PATH, else
~/.ray/auth_token, and generated there (`ray get-auth-token --generate`) if none exists. Everything binds to
127.0.0.1 (node IP, dashboard). Pass --no-auth only if you really mean to run an unauthenticated cluster.
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HOST = "127.0.0.1"        # dashboard and jobs API
# The nodes' address: loopback, but not 127.0.0.1, which `ray start` replaces with the machine's outward address
# (services.resolve_ip_for_localhost, for real multi-machine clusters); 127.0.0.2 is loopback and kept as is.
NODE_IP = os.environ.get("LDPFED_NODE_IP", "127.0.0.2")
DEFAULT_DIR = Path(os.environ.get("LDPFED_CLUSTER_DIR", "/tmp/ldpfed-cluster"))


def ray_bin() -> str:
    here = Path(sys.executable).with_name("ray")
    return str(here) if here.exists() else (shutil.which("ray") or "ray")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def port_or_free(port: int) -> int:
    return port if port else free_port()


def auth_env(no_auth: bool) -> dict:
    """The environment every node and client of the cluster gets: token auth on, a token available."""
    env = dict(os.environ)
    # jobs run their entrypoint with the nodes' PATH: make `python` the one that has ray and ldpfed
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    if no_auth:
        env["RAY_AUTH_MODE"] = "disabled"
        return env
    env["RAY_AUTH_MODE"] = "token"
    if env.get("RAY_AUTH_TOKEN"):
        return env
    path = env.get("RAY_AUTH_TOKEN_PATH")
    if path:
        token_file = Path(path)
        if not token_file.exists() or not token_file.read_text().strip():
            token_file.parent.mkdir(parents=True, exist_ok=True)
            token_file.write_text(secrets.token_hex(32))
            token_file.chmod(0o600)
        return env
    # Default path ~/.ray/auth_token: let Ray create it if it does not exist (prints the token: discard it).
    subprocess.run([ray_bin(), "get-auth-token", "--generate"], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return env


def node_ports() -> list[str]:
    """Per-node ports whose defaults are fixed numbers: distinct free ones, so nodes can share a machine."""
    return ["--node-manager-port", str(free_port()), "--object-manager-port", str(free_port()),
            "--metrics-export-port", str(free_port()), "--dashboard-agent-listen-port", str(free_port()),
            "--dashboard-agent-grpc-port", str(free_port()), "--runtime-env-agent-port", str(free_port())]


def spawn(name: str, args: list[str], env: dict, directory: Path) -> int:
    log = open(directory / f"{name}.log", "ab")
    proc = subprocess.Popen([ray_bin(), "start", "--block", *args], env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    return proc.pid


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child of ours counts as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def descendants(pid: int) -> set[int]:
    """pid and all its descendants (from /proc), alive now."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        if p not in found and alive(p):
            found.add(p)
            todo.extend(children.get(p, []))
    return found


def signal_group(pgid: int, sig) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def signal_pid(pid: int, sig) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def count_nodes(address: str, env: dict, timeout: float) -> int:
    """Alive nodes of the cluster, as seen by a driver that connects with the token."""
    code = ("import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False); "
            "print(sum(1 for n in ray.nodes() if n['Alive']))")
    out = subprocess.run([sys.executable, "-c", code, address], env=env, capture_output=True, text=True,
                         timeout=timeout)
    if out.returncode != 0:
        return -1
    return int(out.stdout.strip().splitlines()[-1])


def start(args) -> int:
    directory = Path(args.dir)
    if (directory / "cluster.json").exists():
        print(f"a cluster is recorded in {directory}/cluster.json: stop it first", file=sys.stderr)
        return 1
    directory.mkdir(parents=True, exist_ok=True)
    env = auth_env(args.no_auth)
    port, dashboard_port = port_or_free(args.port), port_or_free(args.dashboard_port)
    address = f"{NODE_IP}:{port}"
    record = {"address": address, "dashboard": f"http://{HOST}:{dashboard_port}", "auth": env["RAY_AUTH_MODE"],
              "nodes": []}
    head_args = ["--head", "--node-ip-address", NODE_IP, "--port", str(port), "--dashboard-host", HOST,
                 "--dashboard-port", str(dashboard_port), "--ray-client-server-port", str(free_port()),
                 "--num-cpus", str(args.cpus_per_node), "--resources", json.dumps({"ldpfed_head": 1}),
                 *node_ports()]
    if args.no_dashboard:
        head_args += ["--include-dashboard", "false"]
    record["nodes"].append({"name": "head", "pid": spawn("head", head_args, env, directory)})
    (directory / "cluster.json").write_text(json.dumps(record, indent=2))
    deadline = time.monotonic() + args.timeout
    # the head is up when a driver can connect; then the workers join
    while count_nodes(address, env, timeout=60) < 1:
        if time.monotonic() > deadline or not alive(record["nodes"][0]["pid"]):
            print(f"the head did not come up; see {directory}/head.log", file=sys.stderr)
            stop(args)
            return 1
        time.sleep(1)
    for i in range(1, args.workers + 1):
        name = f"worker{i}"
        worker_args = ["--address", address, "--node-ip-address", NODE_IP, "--num-cpus", str(args.cpus_per_node),
                       "--resources", json.dumps({f"ldpfed_{name}": 1}), *node_ports()]
        record["nodes"].append({"name": name, "pid": spawn(name, worker_args, env, directory)})
        (directory / "cluster.json").write_text(json.dumps(record, indent=2))
    while (n := count_nodes(address, env, timeout=60)) < args.workers + 1:
        if time.monotonic() > deadline:
            print(f"only {n} of {args.workers + 1} nodes joined; see {directory}/*.log", file=sys.stderr)
            stop(args)
            return 1
        time.sleep(1)
    exports = {"RAY_ADDRESS": record["dashboard"], "RAY_AUTH_MODE": env["RAY_AUTH_MODE"]}
    if env.get("RAY_AUTH_TOKEN_PATH"):
        exports["RAY_AUTH_TOKEN_PATH"] = env["RAY_AUTH_TOKEN_PATH"]
    (directory / "env.sh").write_text("".join(f"export {k}={v}\n" for k, v in exports.items()))
    print(json.dumps(record))
    print(f"cluster up: {args.workers + 1} nodes, GCS {address}, dashboard/jobs {record['dashboard']} "
          f"(auth: {env['RAY_AUTH_MODE']}); `source {directory}/env.sh` then `ray job submit -- python ...`")
    return 0


def stop(args) -> int:
    directory = Path(args.dir)
    path = directory / "cluster.json"
    if not path.exists():
        print(f"no cluster recorded in {directory}")
        return 0
    record = json.loads(path.read_text())
    nodes = list(reversed(record["nodes"]))   # workers first, the head last
    # Every process this script started, by id: each node's process group, plus descendants that left the group
    # (Ray's worker processes start their own sessions).
    pids = set()
    for node in nodes:
        pids |= descendants(node["pid"])
    for node in nodes:
        signal_group(node["pid"], signal.SIGTERM)
    for pid in pids:
        signal_pid(pid, signal.SIGTERM)
    deadline = time.monotonic() + args.grace
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    for node in nodes:
        signal_group(node["pid"], signal.SIGKILL)
    for pid in pids:
        if alive(pid):
            signal_pid(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    path.unlink()
    (directory / "env.sh").unlink(missing_ok=True)
    # `ray start --head` left the address where a plain `ray.init()` looks for "the" local cluster; `ray stop`
    # would remove it: do the same if it still points at this cluster, so nobody connects to a dead one.
    current = Path(os.environ.get("RAY_TMPDIR", "/tmp")) / "ray" / "ray_current_cluster"
    try:
        if current.read_text().strip().rsplit(":", 1)[-1] == record["address"].rsplit(":", 1)[-1]:
            current.unlink()
    except (OSError, IndexError):
        pass
    print(f"stopped {len(nodes)} nodes")
    return 0


def status(args) -> int:
    path = Path(args.dir) / "cluster.json"
    if not path.exists():
        print("no cluster")
        return 1
    record = json.loads(path.read_text())
    env = dict(os.environ, RAY_AUTH_MODE=record.get("auth", "token"))
    for node in record["nodes"]:
        print(f"{node['name']}: pid {node['pid']} {'alive' if alive(node['pid']) else 'gone'}")
    print(f"nodes in the cluster: {count_nodes(record['address'], env, timeout=60)}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_start = sub.add_parser("start")
    p_start.add_argument("--workers", type=int, default=2, help="worker nodes besides the head")
    p_start.add_argument("--cpus-per-node", type=float, default=1)
    p_start.add_argument("--port", type=int, default=0, help="GCS port of the head (0: a free one)")
    p_start.add_argument("--dashboard-port", type=int, default=0, help="dashboard and jobs API port (0: a free one)")
    p_start.add_argument("--no-dashboard", action="store_true", help="no dashboard (then no `ray job submit`)")
    p_start.add_argument("--no-auth", action="store_true", help="turn token authentication OFF (not recommended)")
    p_start.add_argument("--timeout", type=float, default=180)
    for p in (p_start, sub.add_parser("stop"), sub.add_parser("status")):
        p.add_argument("--dir", default=str(DEFAULT_DIR), help="where the cluster's record and logs live")
        p.add_argument("--grace", type=float, default=20, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    return {"start": start, "stop": stop, "status": status}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
