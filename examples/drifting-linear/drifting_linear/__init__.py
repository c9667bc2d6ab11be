"""Example ldpfed env plugin: a linear bandit whose parameter drifts over the horizon (see env.py)."""
from .env import DriftingLinear

__all__ = ["DriftingLinear"]
