"""Sparse high-dimensional linear bandits (seed 003) and the arm-pool world of seed 001."""

ENVS = {}
