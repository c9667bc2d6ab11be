"""A real classification data set shipped by an installed package, as a bandit."""

ENVS = {}
