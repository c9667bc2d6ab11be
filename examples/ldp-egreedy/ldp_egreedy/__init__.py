"""Example ldpfed plugin: LDP epsilon-greedy with randomized-response rewards (see algorithm.py)."""
from .algorithm import LdpEpsGreedy

__all__ = ["LdpEpsGreedy"]
