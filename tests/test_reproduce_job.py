"""jobs/reproduce.py: every claim it quotes is in the paper's text, every simulation it plans is a valid config,
and a tiny end-to-end run writes the claims table (seed 004 at T = 600, 2 seeds, no MLflow)."""
import importlib.util
import inspect
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SEEDS = Path("/work/shared/seeds")


def _job():
    spec = importlib.util.spec_from_file_location("reproduce", ROOT / "jobs" / "reproduce.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["reproduce"] = module          # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_paper_plans_valid_configs():
    job = _job()
    for paper_id, paper in job.PAPERS.items():
        for preset in (job.QUICK, job.FULL):
            jobs = job.jobs_for(paper, preset)
            assert jobs, paper_id
            for j in jobs:                              # RunConfig validated them; round sizes as documented
                assert j["config"].round_size in (1, job.FALLBACK_ROUND_SIZE, job.UNIFORM_ROUND_SIZE) or \
                    j["config"].round_size == j["config"].users


@pytest.mark.skipif(not SEEDS.exists(), reason="the papers' text is not on this machine")
def test_quotes_are_in_the_papers():
    job = _job()
    source = inspect.getsource(job.claim_rows)
    quotes = re.findall(r"""quote\(["'](\d+)["'], ["']((?:[^"'\\]|\\.)*)["']\)""", source)
    assert len(quotes) >= 10
    for paper_id, needle in quotes:
        job.quote(paper_id, bytes(needle, "utf-8").decode("unicode_escape"))   # raises if absent
    with pytest.raises(KeyError):
        job.quote("000", "a sentence no paper contains")


@pytest.mark.skipif(not SEEDS.exists(), reason="the papers' text is not on this machine")
def test_tiny_end_to_end(tmp_path):
    job = _job()
    code = job.main(["--paper", "004", "--quick", "--users", "600", "--seeds", "2", "--slope-T", "300,600",
                     "--no-tracking", "--out", str(tmp_path)])
    assert code == 0
    claims = (tmp_path / "paper-004" / "claims.md").read_text()
    assert "| claim | measured | reproduced | why not |" in claims and "Corollary 2" in claims
    assert (tmp_path / "paper-004" / "plots" / "regret_curves.png").exists()
