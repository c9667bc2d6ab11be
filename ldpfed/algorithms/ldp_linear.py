"""Placeholder: filled by its owner."""

ALGORITHMS = []
