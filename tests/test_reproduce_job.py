"""jobs/reproduce.py: every claim it quotes is in the paper's text, every simulation it plans is a valid config,
and a tiny end-to-end run writes the claims table (seed 004 at T = 600, 2 seeds, no MLflow)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ldpfed.reproduce import claims
from ldpfed.reproduce.papers import FALLBACK_ROUND_SIZE, FULL, PAPERS, QUICK, UNIFORM_ROUND_SIZE, jobs_for

ROOT = Path(__file__).resolve().parents[1]
PAPERS_DIR = claims.default_papers_dir()


def test_every_paper_plans_valid_configs():
    for paper_id, paper in PAPERS.items():
        for preset in (QUICK, FULL):
            jobs = jobs_for(paper, preset)
            assert jobs, paper_id
            for j in jobs:                              # RunConfig validated them; round sizes as documented
                assert j["config"].round_size in (1, FALLBACK_ROUND_SIZE, UNIFORM_ROUND_SIZE) or \
                    j["config"].round_size == j["config"].users


def test_every_claim_has_a_test_and_the_papers_have_claims():
    assert {c.paper for c in claims.CLAIMS} == set(PAPERS)
    assert all(callable(c.test) and ("{quote}" in c.text) == (c.quote is not None) for c in claims.CLAIMS)


@pytest.mark.skipif(not PAPERS_DIR.exists(), reason="the papers' text is not on this machine")
def test_quotes_are_in_the_papers():
    quoted = [c for c in claims.CLAIMS if c.quote is not None]
    assert len(quoted) >= 10
    for claim in quoted:
        claims.quote(claim.paper, claim.quote, PAPERS_DIR)   # raises if absent
    with pytest.raises(KeyError):
        claims.quote("000", "a sentence no paper contains", PAPERS_DIR)


def test_without_the_papers_the_quotes_are_not_checked(tmp_path):
    assert claims.quote("000", "a sentence no paper contains", tmp_path) == "a sentence no paper contains"


@pytest.mark.slow     # the reproduce job end to end: ~20 s; run by jobs/slow_tests.py
def test_tiny_end_to_end(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "jobs" / "reproduce.py"), "--paper", "004", "--quick",
                           "--users", "600", "--seeds", "2", "--slope-T", "300,600", "--no-tracking", "--out",
                           str(tmp_path)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    text = (tmp_path / "paper-004" / "claims.md").read_text()
    assert "| claim | measured | reproduced | why not |" in text and "Corollary 2" in text
    assert (tmp_path / "paper-004" / "plots" / "regret_curves.png").exists()
