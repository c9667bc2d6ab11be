"""The example plugin package examples/ldp-egreedy (docs/writing-an-algorithm.md), from the outside:
* installed, it is found through its entry point and runs as a `ray job submit` job on a local 3-node cluster
  (cluster/local_cluster.py: loopback, token auth; the nodes share this venv, so the package is on every node);
* not installed, a copy of it shipped with the job's runtime environment (py_modules, LDPFED_PLUGINS) runs there too;
* LDPFED_PLUGINS adds a class from a module that is not installed (on PYTHONPATH only);
* a plugin that breaks the contract makes `python -m ldpfed run` exit with status 2 and an error naming the field.
The example's own tests (it learns, both engines, the conformance kit) are in examples/ldp-egreedy/tests."""
import json
import os
import shutil
import subprocess
import sys
import textwrap
from importlib.metadata import PackageNotFoundError, version

import pytest

from test_ray_cluster import RAY, ROOT

try:
    version("ldpfed-egreedy")
except PackageNotFoundError:
    pytest.skip("the example plugin is not installed: the README's test command installs it "
                "(pip install -e '.[test]' -e ./examples/ldp-egreedy)", allow_module_level=True)

EXAMPLE = ROOT / "examples" / "ldp-egreedy"
LOCAL_CLUSTER = [sys.executable, str(ROOT / "cluster" / "local_cluster.py")]
NODES = 3


@pytest.fixture(scope="module")
def three_node_cluster(tmp_path_factory):
    """A head and two workers, on free loopback ports with token auth (its own token file), in processes of their
    own; local_cluster.py stops exactly those processes. Yields (cluster.json record, environment for clients)."""
    home = tmp_path_factory.mktemp("three-nodes")
    cluster_dir = home / "cluster"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
    env.update(RAY_AUTH_TOKEN_PATH=str(home / "token"), RAY_DEDUP_LOGS="0")

    def local_cluster(*args, timeout):
        proc = subprocess.run([*LOCAL_CLUSTER, *args, "--dir", str(cluster_dir)], capture_output=True,
                              text=True, env=env, timeout=timeout)
        assert proc.returncode == 0, f"local_cluster.py {args[0]}: {proc.stdout}{proc.stderr}"

    try:
        local_cluster("start", "--workers", str(NODES - 1), "--timeout", "240", timeout=300)
        yield json.loads((cluster_dir / "cluster.json").read_text()), env
    finally:
        if (cluster_dir / "cluster.json").exists():
            local_cluster("stop", "--grace", "5", timeout=120)


def submit_run(cluster, algorithm: str, out, *job_options, cwd=None) -> dict:
    """`ray job submit [job_options] -- python -m ldpfed run ALGORITHM ...` on the cluster, 3,000 users in rounds
    of 100, 3 populations on 3 population actors; asserts that it succeeded; returns the run's summary.json (the
    job runs on this machine). The entrypoint pins RAY_ADDRESS to this cluster's GCS: Ray's job supervisor would
    give the job the address of the latest Ray instance started on the machine, which may be someone else's."""
    record, env = cluster
    entry = ["env", f"RAY_ADDRESS={record['address']}", sys.executable, "-m", "ldpfed", "run", algorithm,
             "--users", "3000", "--round-size", "100", "--engine", "ray", "--actors", "3", "--shards", "2",
             "--populations", "3", "--quiet", "--out", str(out)]
    job = subprocess.run([RAY, "job", "submit", *job_options, "--", *entry], capture_output=True, text=True,
                         timeout=300, cwd=cwd, env=dict(env, RAY_ADDRESS=record["dashboard"], RAY_AUTH_MODE="token"))
    output = job.stdout + job.stderr
    assert job.returncode == 0 and "succeeded" in output, output[-4000:]
    assert f"{algorithm} on bernoulli: T=3,000 B=100" in output and "users/s (ray;" in output, output[-4000:]
    return json.loads((out / "summary.json").read_text())


def assert_spread_over_the_nodes(summary: dict) -> None:
    assert summary["engine"] == "ray" and summary["messages"] == 3000 and summary["rejected_messages"] == 0
    assert len(set(summary["population_nodes"].values())) == NODES       # one population actor per node
    assert summary["nodes"] == NODES


@pytest.mark.slow     # a 3-node cluster: ~2 min; run by jobs/slow_tests.py
def test_ray_job_submit_runs_the_installed_plugin_on_three_nodes(three_node_cluster, tmp_path):
    assert len(three_node_cluster[0]["nodes"]) == NODES
    assert_spread_over_the_nodes(submit_run(three_node_cluster, "ldp-egreedy", tmp_path / "run"))


@pytest.mark.slow     # a 3-node cluster: ~2 min; run by jobs/slow_tests.py
def test_a_plugin_shipped_with_the_jobs_runtime_env_runs_on_three_nodes(three_node_cluster, tmp_path):
    """A copy of the example package under another import name (importable nowhere but through py_modules),
    its class renamed so that it does not clash with the installed ldp-egreedy."""
    shutil.copytree(EXAMPLE / "ldp_egreedy", tmp_path / "shipped_egreedy",
                    ignore=shutil.ignore_patterns("__pycache__"))
    with open(tmp_path / "shipped_egreedy" / "__init__.py", "a") as init:
        init.write("\n\nclass Shipped(LdpEpsGreedy):\n    name = \"shipped-egreedy\"\n")
    runtime_env = {"py_modules": ["./shipped_egreedy"], "env_vars": {"LDPFED_PLUGINS": "shipped_egreedy:Shipped"}}
    summary = submit_run(three_node_cluster, "shipped-egreedy", tmp_path / "run", "--runtime-env-json",
                         json.dumps(runtime_env), cwd=tmp_path)
    assert_spread_over_the_nodes(summary)


PLUGIN_MODULE = '''
from ldp_egreedy import LdpEpsGreedy
from ldpfed.algorithms.fields import Field


class Copy(LdpEpsGreedy):
    name = "egreedy-copy"


class NoDomain(LdpEpsGreedy):
    """A public message field declared without its domain."""
    name = "egreedy-no-domain"

    def fields(self):
        return {**super().fields(), "hint": Field((1,))}


class NotAnAlgorithm:
    name = "not-an-algorithm"
'''


@pytest.fixture
def cli_with_plugins(tmp_path):
    """`python -m ldpfed ARGS` with the module above on PYTHONPATH (not installed) and LDPFED_PLUGINS=reference."""
    (tmp_path / "my_plugins.py").write_text(textwrap.dedent(PLUGIN_MODULE))

    def cli(reference, *args):
        env = dict(os.environ, PYTHONPATH=str(tmp_path), LDPFED_PLUGINS=f"my_plugins:{reference}")
        return subprocess.run([sys.executable, "-m", "ldpfed", *args], capture_output=True, text=True, env=env,
                              cwd=tmp_path, timeout=120)

    return cli


def test_ldpfed_plugins_adds_an_uninstalled_class(cli_with_plugins):
    listing = cli_with_plugins("Copy", "list")
    assert listing.returncode == 0, listing.stderr
    assert "egreedy-copy" in listing.stdout and "ldp-egreedy" in listing.stdout     # beside the installed one
    ran = cli_with_plugins("Copy", "run", "egreedy-copy", "--users", "300", "--round-size", "10", "--quiet")
    assert ran.returncode == 0, ran.stderr
    assert "egreedy-copy on bernoulli: T=300 B=10" in ran.stdout


def test_a_broken_plugin_exits_with_status_2_naming_the_field(cli_with_plugins):
    broken = cli_with_plugins("NoDomain", "run", "egreedy-no-domain", "--users", "300", "--quiet")
    assert broken.returncode == 2, broken.stdout + broken.stderr
    assert "message field 'hint' declares no domain" in broken.stderr, broken.stderr
    # LDPFED_PLUGINS may list algorithms and envs; a class that is neither is refused, naming the reference
    stranger = cli_with_plugins("NotAnAlgorithm", "run", "not-an-algorithm", "--users", "300", "--quiet")
    assert stranger.returncode == 2, stranger.stdout + stranger.stderr
    assert "'my_plugins:NotAnAlgorithm'" in stranger.stderr and "not a subclass of" in stranger.stderr, \
        stranger.stderr
