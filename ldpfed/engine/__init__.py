"""Engines run a RunConfig to a RunResult: single process (reference) or Ray (federated)."""
from ldpfed.engine.core import RunResult
from ldpfed.engine.local import run_local

__all__ = ["RunResult", "run_local"]
