"""`python -m ldpfed sweep` and `python -m ldpfed ui`: a preset runs from a folder outside the repository (the
presets are package data), and the UI starts on loopback for the store the sweep wrote, with a link to the sweep."""
import json
import os
import signal
import subprocess
import sys
import tomllib
import urllib.request
from fnmatch import fnmatch
from pathlib import Path

import pandas as pd
import pytest

from ldpfed import sweep_spec as sweeps
from ldpfed.cli import main
from ldpfed.tracking import local_server, ui
from ldpfed.util.errors import ConfigError
from ldpfed.util.waits import HANG_S, WaitFailed, wait_until

ROOT = Path(__file__).resolve().parents[1]


def _env():
    """The installed package alone: nothing of the repository on the path, no tracking store or Ray from outside."""
    env = {**os.environ}
    for name in ("PYTHONPATH", "MLFLOW_TRACKING_URI", "RAY_ADDRESS"):
        env.pop(name, None)
    return env


def _ldpfed(*args, cwd, timeout=300):
    return subprocess.run([sys.executable, "-m", "ldpfed", *args], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """A small sweep of the quick preset, run from a folder outside the repository, logged to its ./mlflow.db."""
    folder = tmp_path_factory.mktemp("elsewhere")
    assert not folder.resolve().is_relative_to(ROOT)
    done = _ldpfed("sweep", "quick", "--users", "2000", "--algorithms", "ols,uniform", "--engine", "local",
                   "--name", "outside", cwd=folder)
    assert done.returncode == 0, done.stderr[-3000:]
    return folder, done


def test_a_preset_runs_from_a_folder_outside_the_repository(swept):
    folder, done = swept
    results = folder / "results" / "run_all" / "outside"
    summary = pd.read_parquet(results / "summary" / "summary.parquet")
    assert set(summary["algorithm"]) == {"ols", "uniform"} and (summary["users"] == 2000).all()
    assert (summary["status"] == "FINISHED").all() and set(summary["seed"]) == {0, 1}
    kept = (results / "sweep.toml").read_text()
    assert "from quick.toml" in kept and "round_size = 500" in kept        # the preset's keys, overridden
    assert (folder / "mlflow.db").is_file()
    assert done.stdout.startswith("ldpfed sweep: sweep 'outside'")
    # printed with this interpreter's path, so it runs as printed without activating the environment
    assert f"{sys.executable} -m ldpfed ui {Path('results') / 'run_all' / 'outside'}" in done.stdout


def test_the_presets_are_package_data():
    assert sorted(sweeps.presets()) == ["example", "paper", "quick"]
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["ldpfed"]
    package = Path(sweeps.__file__).parent
    for preset in sweeps.presets().values():
        relative = Path(str(preset)).relative_to(package).as_posix()
        assert any(fnmatch(relative, glob) for glob in globs), relative
    assert sweeps.locate("quick").name == "quick.toml"
    with pytest.raises(ConfigError, match="not a preset"):
        sweeps.locate("nope")


def test_help_shows_defaults_and_examples(capsys):
    for command, shown in (("sweep", ["(default: quick)", "(default: results/run_all)", "sweep quick --users 2000"]),
                           ("ui", ["(default: 5000)", "python -m ldpfed ui results/run_all/quick"])):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = capsys.readouterr().out
        assert "examples:" in out and all(text in out for text in shown), out


def test_bad_input_exits_2_naming_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for args, message in ((["sweep", "nope"], "not a preset"), (["sweep", "quick", "--seeds", "3-1"], "seeds"),
                          (["ui"], "no MLflow store"), (["ui", str(tmp_path)], "no sweep.json")):
        with pytest.raises(SystemExit) as exit_:
            main(args)
        assert exit_.value.code == 2
        assert message in capsys.readouterr().err
    (tmp_path / "local" / "s").mkdir(parents=True)
    (tmp_path / "local" / "s" / "sweep.json").write_text(json.dumps({"sweep": "s", "tracking_uri": None}))
    with pytest.raises(ConfigError, match="not logged to MLflow"):
        ui.find_store(str(tmp_path / "local"))


def test_a_results_folder_names_its_store_and_its_sweep(swept):
    folder, _ = swept
    results = folder / "results" / "run_all"
    index = json.loads((results / "outside" / "sweep.json").read_text())
    store = ui.find_store(str(results))           # a folder of sweeps: the newest
    assert store.uri == f"sqlite:///{(folder / 'mlflow.db').resolve()}" and store.sweep == index
    assert ui.latest_sweep(store.uri) == ("run_all", index["parent_run_id"], "outside")
    shown = dict(ui.links(store, 5123))
    assert shown["Its runs"].startswith("http://127.0.0.1:5123/#/experiments/")
    assert index["parent_run_id"] in shown["Its runs"] and shown["Sweep"].startswith("outside")


def test_ui_starts_on_loopback_and_prints_the_latest_sweep(swept):
    folder, _ = swept
    parent = json.loads((folder / "results" / "run_all" / "outside" / "sweep.json").read_text())["parent_run_id"]
    port = local_server.free_port()
    out = folder / "ui.out"
    with open(out, "w") as stream:
        proc = subprocess.Popen([sys.executable, "-m", "ldpfed", "ui", "--port", str(port)], cwd=folder, env=_env(),
                                stdout=stream, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # bounds only a hang, not a loaded machine's start (the MLflow server's imports and its database migration
        # take minutes on a machine whose cores the rest of the suite holds)
        try:
            wait_until(lambda: "Its runs:" in out.read_text(), f"`ldpfed ui --port {port}` to print its links",
                       HANG_S, exited=proc.poll, detail=out.read_text)
        except WaitFailed as failed:
            pytest.fail(str(failed))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as page:
            assert page.status == 200 and b"<html" in page.read().lower()
        text = out.read_text()
        assert f"http://127.0.0.1:{port}/#/experiments/" in text and parent in text
        proc.send_signal(signal.SIGTERM)            # stops the UI it started, then itself
        assert proc.wait(timeout=60) == 143
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.slow
def test_the_quick_preset_as_documented_from_outside_the_repository(tmp_path):
    """As the README documents it: `python -m ldpfed sweep quick --users 2000` (every algorithm on Ray, 98 runs)."""
    done = _ldpfed("sweep", "quick", "--users", "2000", cwd=tmp_path, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = pd.read_parquet(tmp_path / "results" / "run_all" / "quick+users2000" / "summary" / "summary.parquet")
    assert (summary["status"] == "FINISHED").all() and (summary["users"] == 2000).all()
