"""The ideal federation (the default): every user of every round answers, at once. Runs under it are today's runs,
bit for bit: it draws no random number and the engines skip it."""
from __future__ import annotations

from ldpfed.federation.base import IDEAL, Federation


class IdealFederation(Federation):
    """Every user of every round answers, in the round it acts."""

    name = IDEAL
    about = "every user of every round answers, at once (the default)"
    ideal = True
    partial_rounds = False
