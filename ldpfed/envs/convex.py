"""Convex losses for bandit convex optimization (seed 002). Owner: seed-002 work."""

ENVS = {}
