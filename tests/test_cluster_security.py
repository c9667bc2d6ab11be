"""Hardening of the Ray set-up (token authentication, loopback-only services) and the local cluster script's robustness:
* the cluster token file is private (0600) in every path that creates it or finds it wider; a token file or
  cluster directory owned by someone else, or a symlink, is refused;
* the cluster's directory is created 0700 and refused when other users could reach it;
* a Ray run started by ldpfed prints no token warning and leaves a 0600 token;
* the start script reads only its probe's marked line (never a log line), retries nodes that exit before
  joining, and cleans up everything it started when it fails."""
import importlib.util
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ldpfed.engine import ray_security
from ldpfed.engine.ray_security import ensure_private_token

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "cluster" / "local_cluster.py"
spec = importlib.util.spec_from_file_location("local_cluster", SCRIPT)
local_cluster = importlib.util.module_from_spec(spec)
spec.loader.exec_module(local_cluster)

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# ---- the token file -----------------------------------------------------------------------------------------
def test_token_is_created_private_even_with_a_permissive_umask(tmp_path):
    path = tmp_path / "ray" / "auth_token"
    old = os.umask(0)
    try:
        assert ensure_private_token({"RAY_AUTH_TOKEN_PATH": str(path)}) == path
    finally:
        os.umask(old)
    assert mode(path) == 0o600
    token = path.read_text()
    assert len(token) == 64 and int(token, 16) >= 0        # 256 bits, hex, as Ray's own generator
    # a second call keeps the token (the cluster's nodes already use it)
    ensure_private_token({"RAY_AUTH_TOKEN_PATH": str(path)})
    assert path.read_text() == token


def test_a_world_readable_token_is_narrowed_and_an_empty_one_filled(tmp_path):
    path = tmp_path / "auth_token"
    path.write_text("abc123")
    path.chmod(0o644)                 # what `ray get-auth-token --generate` leaves with the usual umask
    ensure_private_token({"RAY_AUTH_TOKEN_PATH": str(path)})
    assert mode(path) == 0o600 and path.read_text() == "abc123"
    path.write_text("")
    ensure_private_token({"RAY_AUTH_TOKEN_PATH": str(path)})
    assert mode(path) == 0o600 and len(path.read_text()) == 64


def test_ray_get_auth_token_generate_leaves_0644_and_our_token_command_fixes_it(tmp_path):
    """The problem, shown with Ray's own command in a scratch HOME, and the fix (`local_cluster.py token`)."""
    env = dict(os.environ, HOME=str(tmp_path))
    for key in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        env.pop(key, None)
    ray = str(Path(sys.executable).with_name("ray"))
    subprocess.run(["sh", "-c", f"umask 022; exec {ray} get-auth-token --generate"], env=env, check=True,
                   capture_output=True, timeout=120)
    path = tmp_path / ".ray" / "auth_token"
    assert mode(path) == 0o644
    out = subprocess.run([sys.executable, str(SCRIPT), "token"], env=env, check=True, capture_output=True,
                         text=True, timeout=120)
    assert mode(path) == 0o600 and str(path) in out.stdout


def test_no_file_when_the_token_is_in_the_environment(tmp_path):
    assert ensure_private_token({"RAY_AUTH_TOKEN": "x", "RAY_AUTH_TOKEN_PATH": str(tmp_path / "t")}) is None
    assert not (tmp_path / "t").exists()


def test_a_token_symlink_is_refused(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("t")
    link = tmp_path / "auth_token"
    link.symlink_to(target)
    with pytest.raises(PermissionError, match="not a regular file owned"):
        ensure_private_token({"RAY_AUTH_TOKEN_PATH": str(link)})


@needs_root
def test_someone_elses_token_is_refused_and_left_alone(tmp_path):
    path = tmp_path / "auth_token"
    path.write_text("theirs")
    path.chmod(0o644)
    os.chown(path, NOBODY, NOBODY)
    with pytest.raises(PermissionError, match="owned by uid"):
        ensure_private_token({"RAY_AUTH_TOKEN_PATH": str(path)})
    assert mode(path) == 0o644 and path.read_text() == "theirs"


def test_enable_token_auth_respects_an_explicit_disabled(monkeypatch, tmp_path):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "t"))
    assert ray_security.enable_token_auth() is False
    assert not (tmp_path / "t").exists() and os.environ["RAY_AUTH_MODE"] == "disabled"


# ---- the cluster's directory --------------------------------------------------------------------------------
def test_cluster_dir_is_created_0700(tmp_path):
    old = os.umask(0)
    try:
        path = local_cluster.private_dir(tmp_path / "a" / "cluster")
    finally:
        os.umask(old)
    assert mode(path) == 0o700 and mode(tmp_path / "a") == 0o700


def test_cluster_dir_reachable_by_others_is_refused(tmp_path):
    path = tmp_path / "cluster"
    path.mkdir(mode=0o755)
    path.chmod(0o755)
    with pytest.raises(PermissionError, match="mode 755"):
        local_cluster.private_dir(path)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "cluster")
    with pytest.raises(PermissionError, match="not a directory"):
        local_cluster.private_dir(link)


@needs_root
def test_cluster_dir_owned_by_someone_else_is_refused_by_start(tmp_path):
    path = tmp_path / "cluster"
    path.mkdir(mode=0o700)
    os.chown(path, NOBODY, NOBODY)      # e.g. created first in a shared temp dir by another user
    with pytest.raises(PermissionError, match="owned by uid 65534"):
        local_cluster.private_dir(path)
    out = subprocess.run([sys.executable, str(SCRIPT), "start", "--workers", "0", "--dir", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "refusing to use" in out.stderr
    assert os.listdir(path) == []       # nothing written into it


# ---- the start script's probe and retries -------------------------------------------------------------------
FAKE_PROBE = """#!/bin/sh
echo "2026-11-22 INFO worker.py:2038 -- Connecting to existing Ray cluster at address: 127.0.0.2:6379..."
echo "[2026-11-22 22:01:03,112 I 4242 4242] raylet.cc:123: 42 nodes"
echo "7"
{extra}
"""


@pytest.mark.parametrize("extra, code, expected", [
    ("", 0, None),                                                      # log lines only: no answer
    ('echo \'LDPFED_CLUSTER_PROBE ["ldpfed_head", "ldpfed_worker1"]\'', 0, ["ldpfed_head", "ldpfed_worker1"]),
    ('echo \'LDPFED_CLUSTER_PROBE ["ldpfed_head"]\'', 1, None),         # the driver failed: retry
    ('echo "LDPFED_CLUSTER_PROBE [\\"x\\""', 0, None),                  # a garbled answer: retry
    ("sleep 5", 0, None),                                               # a timeout: retry
])
def test_probe_reads_only_its_marked_line(tmp_path, monkeypatch, extra, code, expected):
    fake = tmp_path / "python"
    fake.write_text(FAKE_PROBE.format(extra=extra) + f"exit {code}\n")
    fake.chmod(0o700)
    monkeypatch.setattr(local_cluster.sys, "executable", str(fake))
    assert local_cluster.probe_nodes("127.0.0.2:1", dict(os.environ), timeout=2) == expected


def test_a_node_that_exits_before_joining_is_restarted_then_given_up(tmp_path, monkeypatch):
    done = subprocess.Popen(["true"])
    done.wait()
    me = {"name": "worker1", "pid": os.getpid(), "start_time": local_cluster.start_time(os.getpid())}
    record = {"address": "127.0.0.2:1", "nodes": [{"name": "head", **me}, {"name": "worker1", "pid": done.pid,
                                                                               "start_time": 1}]}
    answers = iter([None, ["ldpfed_head"], ["ldpfed_head", "ldpfed_worker1"]])
    monkeypatch.setattr(local_cluster, "probe_nodes", lambda *a, **k: next(answers))
    monkeypatch.setattr(local_cluster.time, "sleep", lambda s: None)
    respawned = []

    def respawn(name):
        respawned.append(name)
        return dict(me, name=name)
    local_cluster.wait_for({"head", "worker1"}, record, {}, tmp_path, time.monotonic() + 60, 3, respawn)
    assert respawned == ["worker1"] and record["nodes"][1]["pid"] == os.getpid()
    assert json.loads((tmp_path / "cluster.json").read_text())["nodes"][1]["pid"] == os.getpid()
    assert mode(tmp_path / "cluster.json") == 0o600

    # a node that keeps exiting: given up after `attempts` starts, with its log named
    dead = {"name": "worker1", "pid": done.pid, "start_time": 1}
    record = {"address": "127.0.0.2:1", "nodes": [{"name": "head", **me}, dict(dead)]}
    monkeypatch.setattr(local_cluster, "probe_nodes", lambda *a, **k: ["ldpfed_head"])
    with pytest.raises(local_cluster.StartFailed, match="worker1 exited 2 times.*worker1.log"):
        local_cluster.wait_for({"head", "worker1"}, record, {}, tmp_path, time.monotonic() + 60, 2,
                               lambda name: dict(dead))


@pytest.mark.slow     # starts cluster nodes: ~17 s; run by jobs/slow_tests.py
def test_a_failed_start_stops_every_node_it_started(tmp_path):
    """A timeout too short for the nodes to join: start fails, stops every node it started (the head alone, or
    the head and the worker when the head joined within the second: a fast machine), leaves no record."""
    directory = tmp_path / "cluster"
    env = dict(os.environ, RAY_AUTH_TOKEN_PATH=str(tmp_path / "token"))
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run([sys.executable, str(SCRIPT), "start", "--workers", "1", "--dir", str(directory),
                          "--timeout", "1", "--grace", "10"], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "waiting up to 10 s" in out.stdout, out.stdout        # stop says what it waits for
    pids = [int(line.split("pid ")[1].split(",")[0]) for line in out.stderr.splitlines()
            if line.startswith("started ")]
    assert pids, out.stderr
    assert "start failed" in out.stderr and f"stopping the {len(pids)} node(s)" in out.stderr, out.stderr
    for pid in pids:
        assert not local_cluster.alive(pid)
    assert not (directory / "cluster.json").exists() and not (directory / "env.sh").exists()
    assert mode(directory) == 0o700 and mode(tmp_path / "token") == 0o600


# ---- a run started by ldpfed: no token warning, a private token ----------------------------------------------
def test_a_ray_run_prints_no_token_warning_and_keeps_the_token_private(tmp_path):
    env = dict(os.environ, HOME=str(tmp_path), RAY_DEDUP_LOGS="0")
    for key in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH",
                "RAY_enable_metrics_collection"):
        env.pop(key, None)
    out = subprocess.run([sys.executable, "-m", "ldpfed", "run", "uniform", "--env", "linear", "--users", "200",
                          "--round-size", "50", "--populations", "2", "--engine", "ray", "--actors", "1"],
                         capture_output=True, text=True, env=env, timeout=400, cwd=ROOT)
    output = out.stdout + out.stderr
    assert out.returncode == 0, output[-3000:]
    assert "final cumulative regret" in output
    assert "Token authentication" not in output and "RAY_AUTH_MODE=disabled" not in output, output[-3000:]
    token = tmp_path / ".ray" / "auth_token"
    assert mode(token) == 0o600 and len(token.read_text()) == 64


# ---- ray_config.yaml ----------------------------------------------------------------------------------------
def test_ray_config_is_valid_pins_its_ports_and_lists_each_one():
    """The launcher config passes Ray's own schema; every port its start commands pin is named in its firewall list
    (and in the README's); token auth on and the metrics exporter off on every node."""
    import re

    import yaml
    from ray.autoscaler._private.util import prepare_config, validate_config

    text = (ROOT / "ray_config.yaml").read_text()
    config = yaml.safe_load(text)
    validate_config(prepare_config(yaml.safe_load(text)))
    comments = "\n".join(line for line in text.splitlines() if line.lstrip().startswith("#"))
    readme = (ROOT / "README.md").read_text()
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        start = config[key][-1]
        assert "RAY_AUTH_MODE=token" in start and "RAY_enable_metrics_collection=0" in start
        assert "--dashboard-host=127.0.0.1" in start or key.startswith("worker")
        ports = re.findall(r"--[a-z-]*port=(\d+)", start)
        assert len(ports) >= 6, start
        for port in ports:
            assert re.search(rf"\b{port}\b", comments) and re.search(rf"\b{port}\b", readme), port
        # the direct transport's channels listen in a pinned range, named in both lists too
        channel_ports = re.search(r"LDPFED_CHANNEL_PORTS=(\d+-\d+)", start).group(1)
        assert channel_ports in comments and channel_ports in readme
    assert "chmod 600 ~/.ray/auth_token" in " ".join(config["setup_commands"])
