"""Configurations that would need more memory than the machine has are refused before anything is allocated,
with exit code 2 and the option named (no traceback): ldpfed/util/memory.py, RunConfig's check, the algorithms that
allocate by a parameter."""
import subprocess
import sys

import pytest

from ldpfed.config import RunConfig, estimate_memory
from ldpfed.util.errors import ConfigError


def cli(*args):
    return subprocess.run([sys.executable, "-m", "ldpfed", "run", *args, "--quiet"], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("args, option", [
    (["ldp-ols", "--env-param", "d=100000"], "--env-param d"),          # d x d state: 80 GB per copy
    (["ldp-sgd", "--users", "1e30"], "--users"),                         # a result row per round
    (["sw-klucb-cf", "--param", "window=1000000000000"], "--param window"),   # the window's ring buffer
    (["ldp-ols", "--env-param", "K=1000000000"], "--env-param K"),       # K contexts per user
    (["sw-klucb-cf", "--env-param", "K=1000000000"], "--env-param K"),   # K-vectors per message
])
def test_cli_refuses_what_cannot_fit(args, option):
    done = cli(*args)
    assert done.returncode == 2, done.stderr[-2000:]
    assert option in done.stderr and "GiB" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_cli_rejects_a_window_that_is_not_an_integer():
    done = cli("sw-klucb-cf", "--param", "window=1e12")                 # JSON 1e12 is a float
    assert done.returncode == 2 and "--param window" in done.stderr and "Traceback" not in done.stderr


def test_the_estimate_names_the_largest_option_and_scales(monkeypatch):
    monkeypatch.setenv("LDPFED_MEMORY_LIMIT", str(2**30))                 # 1 GiB
    with pytest.raises(ConfigError) as error:
        RunConfig("ldp-ols-multi", round_size=100, env_params={"d": 400, "K": 3})
    assert error.value.field == "env_params.d"                          # d^2 K per user, not K or B
    RunConfig("ldp-ols-multi", round_size=100, env_params={"d": 20, "K": 3})   # the paper's setting fits
    sizes = {"users": 1000, "round_size": 10, "env_params.d": 1000, "env_params.K": 5, "env_params.pool": 0}
    ratio = estimate_memory({**sizes, "env_params.d": 2000}, False) / estimate_memory(sizes, False)
    assert 3.9 < ratio < 4.1                                            # (d+1)^2 terms dominate at large d
    ratio = estimate_memory({**sizes, "env_params.K": 50}, True) / estimate_memory({**sizes}, True)
    assert 9.5 < ratio < 10.5                                           # multi: one (d+1)^2 slot per arm
    monkeypatch.setenv("LDPFED_MEMORY_LIMIT", "lots")
    with pytest.raises(ConfigError, match="LDPFED_MEMORY_LIMIT"):
        RunConfig("ldp-ols")


def test_keep_freed_memory_stops_refaulting_freed_arrays():
    # the engines' allocator setting (ldpfed.util.memory.keep_freed_memory): a population's few MB of arrays, freed, are
    # reused by the next population instead of being unmapped and faulted in again (glibc's defaults: ~860 minor
    # faults per cycle below; with the setting 0 after the first cycles)
    import resource

    import numpy as np
    import sys

    from ldpfed.util.memory import keep_freed_memory
    if not sys.platform.startswith("linux") or not keep_freed_memory():
        return                                   # not glibc: nothing to check (the engines then skip it too)
    assert keep_freed_memory()                   # idempotent

    def population():                            # 1 MB + 1 MB + 0.5 MB alive together, then 1 MB more, all freed
        a, b, c = np.ones(2**17), np.ones(2**17), np.ones(2**16)
        return float((a + b)[0] + c[0])

    for _ in range(3):                           # warm the heap
        population()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(50):
        population()
    assert resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before < 50 * 20
