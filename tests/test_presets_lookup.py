"""The sweep presets are found through the installed package's resources, whatever folder a command starts from;
when they cannot be found, the commands that do not need them still work and the ones that do stop with one line
and exit status 2."""
from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from ldpfed import cli
from ldpfed import sweep_spec as sweeps


def _run(args, cwd):
    return subprocess.run([sys.executable, "-m", "ldpfed", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_commands_work_beside_a_folder_named_ldpfed(tmp_path):
    # A folder holding a clone of the repository: tmp/ldpfed has no __init__.py, so Python takes it for a
    # namespace package `ldpfed` when a command starts from tmp.
    clone = tmp_path / "ldpfed"
    (clone / "ldpfed").mkdir(parents=True)
    (clone / "pyproject.toml").write_text("")
    listing = _run(["list"], tmp_path)
    assert listing.returncode == 0, listing.stderr
    assert "ldp-sgd" in listing.stdout
    help_text = _run(["sweep", "--help"], tmp_path)
    assert help_text.returncode == 0, help_text.stderr
    assert "a preset: example, paper, quick" in " ".join(help_text.stdout.split())
    unknown = _run(["sweep", "no-such-preset"], tmp_path)
    assert unknown.returncode == 2
    assert unknown.stderr.strip().count("\n") == 0 and "not a preset (example, paper, quick)" in unknown.stderr


def test_presets_not_found_one_line_and_status_2(monkeypatch, capsys):
    def missing(package):
        raise ModuleNotFoundError(f"No module named {package!r}")

    monkeypatch.setattr(sweeps, "resources", SimpleNamespace(files=missing))   # sweep.py's view only
    with pytest.raises(sweeps.ConfigError, match="presets"):
        sweeps.presets()
    assert cli.main(["describe", "ldp-sgd"]) == 0              # a command that does not need them
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        cli.main(["sweep", "quick", "--no-tracking"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "presets" in err and "not found" in err and "Traceback" not in err
