"""docs/api.md is generated from the code's signatures and docstrings (jobs/api_reference.py): it must be what the
code gives today, so the reference cannot drift from the code."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_api_reference_is_what_the_code_gives():
    proc = subprocess.run([sys.executable, str(ROOT / "jobs" / "api_reference.py"), "--check"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_reference_covers_the_plugin_contract():
    text = (ROOT / "docs" / "api.md").read_text()
    for name in ("Algorithm", "CompiledAlgorithm", "Field", "Option", "PublicWorld", "Env", "Mechanism", "Domain",
                 "GaussianMechanism", "SymmetricGaussianMechanism", "TrustModel", "FieldNoise", "RunConfig",
                 "check_algorithm", "ConformanceError"):
        assert f"### `{name}`" in text, name
    assert "(no docstring)" not in text
