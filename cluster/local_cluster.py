#!/usr/bin/env python3
"""A local multi-node Ray cluster on one machine: a head and N worker nodes, loopback only, token auth on.

    python cluster/local_cluster.py start [--workers 2] [--cpus-per-node 1] [--port 0] [--dashboard-port 0]
                                          [--dir ~/.ldpfed/cluster] [--timeout 180]
    python cluster/local_cluster.py status [--dir ...]
    python cluster/local_cluster.py stop   [--dir ...]
    python cluster/local_cluster.py token      # create the cluster token (mode 0600) if missing; fix its mode

Each node is one `ray start --block` process (head: `ray start --head`; workers: `ray start --address`), started
in its own process group with distinct ports (0 = a free port) and a resource naming it (`ldpfed_head`,
`ldpfed_worker1`, ...). `start` waits until every node has joined, as reported by Ray itself (`ray.nodes()` in a
probe process that prints one marked line; log lines cannot be mistaken for it), and writes `<dir>/cluster.json`
(addresses, process ids) and `<dir>/env.sh` (RAY_ADDRESS, RAY_AUTH_MODE) to source before `ray job submit`.
What is transient is retried: a probe that fails or times out (the head still starting), a node that exits before
joining (a free port taken meanwhile: restarted on new ports, up to --attempts times). If `start` fails anyway, or
is interrupted, it stops every node it started and leaves no record behind.

`stop` ends exactly the processes this script started, by process-group id and pid (checked against each
process's start time, so a reused pid is never signalled), and says what it waits for. It does not call
`ray stop`, which kills every Ray process of the machine (other people's clusters and test sessions included).

Security:
* RAY_AUTH_MODE=token for every node and client: every RPC and HTTP request (jobs API, dashboard) needs the
  cluster token, read from RAY_AUTH_TOKEN, else the file RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token; the file is
  created with mode 0600 if missing (Ray's own generation would leave it 0644) and narrowed to 0600 if wider.
* The cluster's directory (its record, env.sh, logs) is private: created with mode 0700, and refused if it exists
  but is not a directory owned by you with no group/other permissions (the default is in your home directory, not
  in the shared temp directory, where anyone could create it first).
* Everything that can be bound to loopback is: the nodes' address (127.0.0.2), dashboard and jobs API
  (127.0.0.1). The per-node metrics exporter is turned off (it would listen on all interfaces without the token).
  Ray's gRPC ports (GCS, raylets, workers) listen on all interfaces whatever the node IP: the token protects them;
  see the README's port list for what to firewall.
Pass --no-auth only if you really mean to run an unauthenticated cluster.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))       # this checkout's ldpfed, whatever is installed
from ldpfed.engine.ray_security import AUTH_MODE, disable_metrics_export, ensure_private_token  # noqa: E402

HOST = "127.0.0.1"        # dashboard and jobs API
# The nodes' address: loopback, but not 127.0.0.1, which `ray start` replaces with the machine's outward address
# (services.resolve_ip_for_localhost, for real multi-machine clusters); 127.0.0.2 is loopback and kept as is.
NODE_IP = os.environ.get("LDPFED_NODE_IP", "127.0.0.2")
DEFAULT_DIR = Path(os.environ.get("LDPFED_CLUSTER_DIR") or Path.home() / ".ldpfed" / "cluster")
PROBE_MARKER = "LDPFED_CLUSTER_PROBE "   # the probe's one answer line starts with this


class StartFailed(Exception):
    pass


def ray_bin() -> str:
    here = Path(sys.executable).with_name("ray")
    return str(here) if here.exists() else (shutil.which("ray") or "ray")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def port_or_free(port: int) -> int:
    return port if port else free_port()


def private_dir(path: Path, create: bool = True) -> Path:
    """`path` as a directory only this user can enter: created 0700; an existing one must be a real directory
    (not a symlink) owned by this user with no group/other permissions, else PermissionError."""
    path = Path(path).expanduser()
    if create:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            os.mkdir(path, 0o700)       # the mode is applied at creation (less the umask, which only narrows it)
        except FileExistsError:
            pass
    info = os.lstat(path)
    problem = None
    if not stat.S_ISDIR(info.st_mode):
        problem = "is not a directory (or is a symlink)"
    elif info.st_uid != os.getuid():
        problem = f"is owned by uid {info.st_uid}, not by you (uid {os.getuid()})"
    elif info.st_mode & 0o077:
        problem = f"has mode {stat.S_IMODE(info.st_mode):o}: other users can reach it (`chmod 700` it if it is yours)"
    if problem:
        raise PermissionError(f"refusing to use {path} as the cluster's directory: it {problem}")
    return path


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` atomically (a temp file renamed over it), mode 0600."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def cluster_env(no_auth: bool) -> dict:
    """The environment every node and client of the cluster gets: token auth on with a private token, no metrics
    exporter on all interfaces."""
    env = dict(os.environ)
    # jobs run their entrypoint with the nodes' PATH: make `python` the one that has ray and ldpfed
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    disable_metrics_export(env)
    if no_auth:
        env[AUTH_MODE] = "disabled"
        return env
    env[AUTH_MODE] = "token"
    ensure_private_token(env)
    return env


def node_ports() -> list[str]:
    """Per-node ports whose defaults are fixed numbers: distinct free ones, so nodes can share a machine."""
    return ["--node-manager-port", str(free_port()), "--object-manager-port", str(free_port()),
            "--metrics-export-port", str(free_port()), "--dashboard-agent-listen-port", str(free_port()),
            "--dashboard-agent-grpc-port", str(free_port()), "--runtime-env-agent-port", str(free_port())]


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot, /proc/PID/stat field 22): pid plus start time names one
    process, even after the pid is reused. None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def spawn(name: str, args: list[str], env: dict, directory: Path) -> dict:
    fd = os.open(directory / f"{name}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "ab") as log:
        proc = subprocess.Popen([ray_bin(), "start", "--block", *args], env=env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    return {"name": name, "pid": proc.pid, "start_time": start_time(proc.pid), "args": args}


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
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def ours(node: dict) -> bool:
    """The node's process is still the one we started (same pid AND start time) and has not exited."""
    recorded = node.get("start_time")
    return alive(node["pid"]) and (recorded is None or start_time(node["pid"]) == recorded)


def reap(nodes: list[dict]) -> None:
    """Collect exited children of this process (the nodes it spawned), so they do not linger as zombies."""
    for node in nodes:
        try:
            os.waitpid(node["pid"], os.WNOHANG)
        except ChildProcessError:
            pass


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


PROBE = f"""
import json, sys
import ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
names = sorted(key for node in ray.nodes() if node["Alive"] for key in node["Resources"] if key.startswith("ldpfed_"))
print({PROBE_MARKER!r} + json.dumps(names), flush=True)
ray.shutdown()
"""


def probe_nodes(address: str, env: dict, timeout: float) -> list[str] | None:
    """The names (`ldpfed_head`, `ldpfed_worker1`, ...) of the cluster's alive nodes, as Ray's own `ray.nodes()`
    reports them to a driver that connects with the token; None if that failed this time (head not up yet, a
    timeout): the caller retries. Only the one line starting with PROBE_MARKER is read, never a log line."""
    try:
        out = subprocess.run([sys.executable, "-c", PROBE, address], env=env, capture_output=True, text=True,
                             timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None
    answers = [line for line in out.stdout.splitlines() if line.startswith(PROBE_MARKER)]
    if out.returncode != 0 or len(answers) != 1:
        return None
    try:
        names = json.loads(answers[0][len(PROBE_MARKER):])
    except json.JSONDecodeError:
        return None
    return names if isinstance(names, list) else None


def wait_for(names: set[str], record: dict, env: dict, directory: Path, deadline: float, attempts: int,
             respawn) -> None:
    """Wait until every node in `names` has joined; restart a node whose process exited before joining (on new
    ports: the usual cause is a port taken since `free_port` chose it), at most `attempts` starts per node."""
    tries = {node["name"]: 1 for node in record["nodes"]}
    while True:
        joined = probe_nodes(record["address"], env, timeout=max(5.0, min(60.0, deadline - time.monotonic())))
        if joined is not None and names <= {n.removeprefix("ldpfed_") for n in joined}:
            return
        reap(record["nodes"])
        for i, node in enumerate(record["nodes"]):
            if not ours(node):
                if tries[node["name"]] >= attempts:
                    raise StartFailed(f"node {node['name']} exited {attempts} times before joining; see "
                                      f"{directory}/{node['name']}.log")
                tries[node["name"]] += 1
                print(f"node {node['name']} (pid {node['pid']}) exited before joining; starting it again on new "
                      f"ports (attempt {tries[node['name']]} of {attempts})", file=sys.stderr)
                record["nodes"][i] = respawn(node["name"])
                write_private(directory / "cluster.json", json.dumps(record, indent=2))
        if time.monotonic() > deadline:
            have = "none" if joined is None else ", ".join(sorted(joined)) or "none"
            raise StartFailed(f"not every node joined within the timeout (joined: {have}); see {directory}/*.log")
        time.sleep(1)


def start(args) -> int:
    try:
        directory = private_dir(Path(args.dir))
    except PermissionError as err:
        print(err, file=sys.stderr)
        return 1
    if (directory / "cluster.json").exists():
        print(f"a cluster is recorded in {directory}/cluster.json: stop it first", file=sys.stderr)
        return 1
    env = cluster_env(args.no_auth)
    record = {"address": None, "dashboard": None, "auth": env[AUTH_MODE], "nodes": []}

    def head_args():
        # the head's ports are chosen anew on every start of the head (unless given), like the other nodes'
        port, dashboard_port = port_or_free(args.port), port_or_free(args.dashboard_port)
        record["address"], record["dashboard"] = f"{NODE_IP}:{port}", f"http://{HOST}:{dashboard_port}"
        extra = ["--include-dashboard", "false"] if args.no_dashboard else []
        return ["--head", "--node-ip-address", NODE_IP, "--port", str(port), "--dashboard-host", HOST,
                "--dashboard-port", str(dashboard_port), "--ray-client-server-port", str(free_port()),
                "--num-cpus", str(args.cpus_per_node), "--resources", json.dumps({"ldpfed_head": 1}),
                *node_ports(), *extra]

    def worker_args(name):
        return ["--address", record["address"], "--node-ip-address", NODE_IP,
                "--num-cpus", str(args.cpus_per_node),
                "--resources", json.dumps({f"ldpfed_{name}": 1}), *node_ports()]

    def respawn(name):
        node = spawn(name, head_args() if name == "head" else worker_args(name), env, directory)
        print(f"started {name}: pid {node['pid']}, log {directory}/{name}.log", file=sys.stderr, flush=True)
        return node

    deadline = time.monotonic() + args.timeout
    try:
        record["nodes"].append(respawn("head"))
        write_private(directory / "cluster.json", json.dumps(record, indent=2))
        # the head is up when a driver can connect and sees it; then the workers join
        wait_for({"head"}, record, env, directory, deadline, args.attempts, respawn)
        workers = [f"worker{i}" for i in range(1, args.workers + 1)]
        for name in workers:
            record["nodes"].append(respawn(name))
            write_private(directory / "cluster.json", json.dumps(record, indent=2))
        wait_for({"head", *workers}, record, env, directory, deadline, args.attempts, respawn)
        exports = {"RAY_ADDRESS": record["dashboard"], AUTH_MODE: env[AUTH_MODE]}
        for key in ("RAY_AUTH_TOKEN_PATH", "RAY_enable_metrics_collection"):
            if env.get(key):
                exports[key] = env[key]
        write_private(directory / "env.sh", "".join(f"export {k}={v}\n" for k, v in exports.items()))
    except BaseException as err:          # a failure, or Ctrl-C: leave nothing running and no record behind
        reason = str(err) if isinstance(err, StartFailed) else f"{type(err).__name__}: {err}"
        print(f"start failed ({reason}); stopping the {len(record['nodes'])} node(s) it started", file=sys.stderr)
        stop(args, record=record)
        if isinstance(err, (StartFailed, Exception)):
            return 1
        raise
    print(json.dumps(record))
    print(f"cluster up: {args.workers + 1} nodes, GCS {record['address']}, dashboard/jobs {record['dashboard']} "
          f"(auth: {env[AUTH_MODE]}); `source {directory}/env.sh` then `ray job submit -- python ...`")
    return 0


def stop(args, record: dict | None = None) -> int:
    directory = Path(args.dir).expanduser()
    path = directory / "cluster.json"
    if record is None:
        if not path.exists():
            print(f"no cluster recorded in {directory}")
            return 0
        try:
            private_dir(directory, create=False)
        except PermissionError as err:
            print(err, file=sys.stderr)
            return 1
        record = json.loads(path.read_text())
    nodes = [node for node in reversed(record["nodes"])]   # workers first, the head last
    gone = [node["name"] for node in nodes if not ours(node)]
    nodes = [node for node in nodes if ours(node)]
    if gone:
        print(f"already gone: {', '.join(gone)}")
    # Every process this script started, by id: each node's process group, plus descendants that left the group
    # (Ray's worker processes start their own sessions).
    pids = set()
    for node in nodes:
        pids |= descendants(node["pid"])
    if nodes:
        named = ", ".join(f"{node['name']} (pid {node['pid']})" for node in nodes)
        print(f"stopping {named}: SIGTERM to their process "
              f"groups and {len(pids)} processes; waiting up to {args.grace:g} s for them to exit", flush=True)
    for node in nodes:
        signal_group(node["pid"], signal.SIGTERM)
    for pid in pids:
        signal_pid(pid, signal.SIGTERM)
    begun = time.monotonic()
    deadline = begun + args.grace
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        reap(nodes)
        time.sleep(0.2)
    left = sorted(pid for pid in pids if alive(pid))
    if left:
        print(f"{len(left)} processes still running after {args.grace:g} s (pids {left[:10]}"
              f"{' ...' if len(left) > 10 else ''}): SIGKILL", flush=True)
        for node in nodes:
            signal_group(node["pid"], signal.SIGKILL)
        for pid in left:
            signal_pid(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            reap(nodes)
            time.sleep(0.1)
    elif pids:
        print(f"all {len(pids)} processes exited after {time.monotonic() - begun:.1f} s")
    still = sorted(pid for pid in pids if alive(pid))
    path.unlink(missing_ok=True)
    (directory / "env.sh").unlink(missing_ok=True)
    # `ray start --head` left the address where a plain `ray.init()` looks for "the" local cluster; `ray stop`
    # would remove it: do the same if it still points at this cluster, so nobody connects to a dead one.
    current = Path(os.environ.get("RAY_TMPDIR", "/tmp")) / "ray" / "ray_current_cluster"
    try:
        if record["address"] and current.read_text().strip() == record["address"]:
            current.unlink()
    except (OSError, IndexError):
        pass
    if still:
        print(f"stopped {len(nodes)} nodes, but {len(still)} processes survived SIGKILL: {still}", file=sys.stderr)
        return 1
    print(f"stopped {len(nodes)} nodes")
    return 0


def status(args) -> int:
    directory = Path(args.dir).expanduser()
    path = directory / "cluster.json"
    if not path.exists():
        print("no cluster")
        return 1
    record = json.loads(path.read_text())
    env = dict(os.environ, **{AUTH_MODE: record.get("auth", "token")})
    for node in record["nodes"]:
        print(f"{node['name']}: pid {node['pid']} {'alive' if ours(node) else 'gone'}")
    joined = probe_nodes(record["address"], env, timeout=60)
    print("nodes in the cluster: " + ("(could not ask Ray)" if joined is None else ", ".join(joined) or "none"))
    return 0


def token(args) -> int:
    path = ensure_private_token()
    print(f"cluster token: {path} (mode 0600)" if path else "cluster token: in RAY_AUTH_TOKEN (no file)")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_start = sub.add_parser("start")
    p_start.add_argument("--workers", type=int, default=2, help="worker nodes besides the head")
    p_start.add_argument("--cpus-per-node", type=int, default=1)
    p_start.add_argument("--port", type=int, default=0, help="GCS port of the head (0: a free one)")
    p_start.add_argument("--dashboard-port", type=int, default=0, help="dashboard and jobs API port (0: a free one)")
    p_start.add_argument("--no-dashboard", action="store_true", help="no dashboard (then no `ray job submit`)")
    p_start.add_argument("--no-auth", action="store_true", help="turn token authentication OFF (not recommended)")
    p_start.add_argument("--timeout", type=float, default=180, help="seconds for every node to join")
    p_start.add_argument("--attempts", type=int, default=3, help="starts per node that exits before joining")
    for p in (p_start, sub.add_parser("stop"), sub.add_parser("status")):
        p.add_argument("--dir", default=str(DEFAULT_DIR), help="where the cluster's record and logs live (private)")
        p.add_argument("--grace", type=float, default=20, help="seconds between SIGTERM and SIGKILL on stop")
    sub.add_parser("token")
    args = parser.parse_args(argv)
    return {"start": start, "stop": stop, "status": status, "token": token}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
