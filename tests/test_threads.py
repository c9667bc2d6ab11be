"""Simulation processes run with one BLAS thread by default (ldpfed.util.threads), restored after the run."""
import pytest
from threadpoolctl import threadpool_info

from ldpfed.config import RunConfig
from ldpfed.engine import run
from ldpfed.util.errors import ConfigError
from ldpfed.util.threads import blas_threads


def _blas_threads():
    return {pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"}


@pytest.mark.parametrize("round_size", [100, 1])     # the round engine (drive), the sequential engine
@pytest.mark.parametrize("threads", [None, "2"])
def test_a_run_uses_the_configured_blas_threads_and_gives_them_back(monkeypatch, threads, round_size):
    if threads is not None:
        monkeypatch.setenv("LDPFED_BLAS_THREADS", threads)
    before, seen = _blas_threads(), []
    run(RunConfig("ldp-ols", users=200, round_size=round_size), progress=lambda *_: seen.append(_blas_threads()))
    assert seen and all(s == {int(threads or 1)} for s in seen)
    assert _blas_threads() == before


@pytest.mark.parametrize("text", ["0", "two", "-1"])
def test_a_bad_thread_count_is_refused_by_name(monkeypatch, text):
    monkeypatch.setenv("LDPFED_BLAS_THREADS", text)
    with pytest.raises(ConfigError, match="LDPFED_BLAS_THREADS"):
        blas_threads()
