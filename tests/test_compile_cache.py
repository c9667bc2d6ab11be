"""The compile cache (ldpfed.util.jit): the loops around the compiled steps are compiled once per machine (a second
process loads them from disk), under a key that changes with anything they inline; runs report numba's compile time
apart from the simulation's rate; `python -m ldpfed warmup` compiles ahead."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from numba import njit

from ldpfed.cli import main
from ldpfed.config import RunConfig
from ldpfed.engine import run
from ldpfed.util import jit

ROOT = Path(__file__).resolve().parents[1]

PROBE = textwrap.dedent("""
    import json
    from ldpfed.config import RunConfig
    from ldpfed.engine import run
    from ldpfed.util import jit

    result = run(RunConfig("ucb", users=200))       # round size 1: the sequential engine's loop
    print(json.dumps({"compile_s": result.summary["compile_s"], "dir": str(jit.cache_dir()), **jit.loop_counts()}))
""")


def _probe(cache: Path) -> dict:
    env = {**os.environ, jit.CACHE_ENV: str(cache), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_the_loops_from_disk(tmp_path):
    first, second = _probe(tmp_path), _probe(tmp_path)
    assert first["dir"] == second["dir"] == str(tmp_path)
    assert first["compiled"] >= 1 and first["loaded"] == 0, first
    assert second["compiled"] == 0 and second["loaded"] == first["compiled"], second
    assert list(tmp_path.glob("run_users_*.py")), sorted(p.name for p in tmp_path.iterdir())
    # what is left of compile_s is numba's one-off set-up per process and the loads; a ratio, so it holds on a
    # machine of any speed (on 2 idle cores: ~0.1 against several seconds)
    assert second["compile_s"] < 0.5 * first["compile_s"], (first, second)


# ---- the key ------------------------------------------------------------------------------------------------------
def _compiled(source: str, name: str, **namespace):
    """A compiled function made from source text (a stand-in for an edited step)."""
    scope = {"njit": njit, "np": np, **namespace}
    exec(textwrap.dedent(source), scope)
    return scope[name]


def _loop_over(step):
    """What the engines' builds look like: a loop calling `step`, inlined."""
    def build(use):
        one = use(step)

        @njit
        def run_all(x):
            for i in range(x.shape[0]):
                x[i] = one(x[i])

        return run_all

    return build


def _key(step) -> str:
    return jit.cache_key([_loop_over(step)(jit.inlined)])


STEP = """
@njit
def step(v):
    return v + SHIFT
"""


def test_the_key_changes_when_an_inlined_function_changes():
    plus_one = _compiled(STEP, "step", SHIFT=1.0)
    assert _key(plus_one) == _key(_compiled(STEP, "step", SHIFT=1.0))     # the same code: the same key
    assert _key(plus_one) != _key(_compiled(STEP, "step", SHIFT=2.0))     # a global constant it reads
    assert _key(plus_one) != _key(_compiled(STEP.replace("v + SHIFT", "v - SHIFT"), "step", SHIFT=1.0))
    options = _compiled(STEP.replace("@njit", "@njit(fastmath=True)"), "step", SHIFT=1.0)
    assert _key(plus_one) != _key(options)                                 # its compile options


def test_the_key_changes_when_an_inlined_function_moves_to_another_module():
    """numba's cached code imports the modules of the functions it calls by name: the same code under another
    module's name must not load an entry that names the old one."""
    here, moved = (_compiled(STEP, "step", SHIFT=1.0, __name__=module) for module in ("pkg.clip", "pkg.mech.clip"))
    assert _key(here) != _key(moved)
    assert _key(here) == _key(_compiled(STEP, "step", SHIFT=1.0, __name__="pkg.clip"))


def test_the_key_changes_when_a_function_it_calls_changes():
    outer = """
    @njit
    def step(v):
        return helper(v) * 2.0
    """
    inner = "@njit\ndef helper(v):\n    return v + {}\n"
    one, two = (_compiled(outer, "step", helper=_compiled(inner.format(k), "helper")) for k in ("1.0", "2.0"))
    assert _key(one) != _key(two)
    assert _key(one) == _key(_compiled(outer, "step", helper=_compiled(inner.format("1.0"), "helper")))


def test_a_cached_loop_is_written_once_and_runs(tmp_path, monkeypatch):
    monkeypatch.setenv(jit.CACHE_ENV, str(tmp_path))
    step = _compiled(STEP, "step", SHIFT=3.0)
    monkeypatch.setattr(jit, "_LOOPS", {})
    loop = jit.loops(("test-loop", step), _loop_over(step))
    x = np.zeros(4)
    loop(x)
    assert x.tolist() == [3.0] * 4
    written = list(tmp_path.glob("run_all_*.py"))
    assert [p.name for p in written] == [f"run_all_{_key(step)}.py"]
    assert written[0].stat().st_mtime == jit.MTIME          # numba's cache checks it: fixed, whoever writes it
    assert "def run_all(x):" in written[0].read_text()


def test_a_cache_that_cannot_be_written_falls_back_to_compiling_here(tmp_path, monkeypatch):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setenv(jit.CACHE_ENV, str(blocked / "cache"))
    monkeypatch.setattr(jit, "_LOOPS", {})
    step = _compiled(STEP, "step", SHIFT=5.0)
    loop = jit.loops(("test-loop", step), _loop_over(step))
    x = np.zeros(2)
    loop(x)
    assert x.tolist() == [5.0, 5.0]
    (entry,) = jit._LOOPS.values()
    assert entry["path"] is None and entry["uncached"]


def test_the_cache_can_be_turned_off(monkeypatch):
    monkeypatch.setenv(jit.CACHE_ENV, "off")
    assert jit.cache_dir() is None
    monkeypatch.delenv(jit.CACHE_ENV)
    monkeypatch.setenv("NUMBA_CACHE_DIR", "/somewhere")
    assert jit.cache_dir() == Path("/somewhere/ldpfed")


# ---- compile time in the summary, warmup ----------------------------------------------------------------------------
@pytest.mark.parametrize("round_size", [1, 50])
def test_the_summary_reports_compile_time_apart(monkeypatch, round_size):
    monkeypatch.setattr(jit, "_LOOPS", {})        # this run loads its loops again (from disk) or compiles them
    summary = run(RunConfig("ucb", users=500, round_size=round_size)).summary
    assert summary["compile_s"] > 0
    assert summary["compile_s"] < summary["elapsed_s"]
    assert summary["users_per_s"] == pytest.approx(500 / (summary["elapsed_s"] - summary["compile_s"]), rel=1e-9)
    assert summary["messages_per_s"] == pytest.approx(summary["messages"] /
                                                      (summary["elapsed_s"] - summary["compile_s"]), rel=1e-9)


def test_the_run_line_shows_the_rate_and_the_compile_time(capsys):
    assert main(["run", "ucb", "--users", "300", "--quiet"]) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if "users/s" in ln][-1]
    assert "users/s (sequential; numba's compile, " in line and " s, not counted)" in line


def test_warmup_compiles_one_algorithm(capsys):
    assert main(["warmup", "ucb", "--users", "40"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("compile cache: ")
    assert "ucb" in out and "bernoulli" in out and "loaded from the cache" in out and "warmup: " in out


def test_warmup_names_an_unknown_algorithm():
    with pytest.raises(SystemExit) as stop:
        main(["warmup", "no-such-algorithm"])
    assert stop.value.code == 2
