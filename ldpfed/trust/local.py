"""The local trust model (the papers'): no one is trusted; each user privatizes its message with the run's
(eps, delta). Every hook of the door is the default (ldpfed.trust.base)."""
from __future__ import annotations

from ldpfed.trust.base import LOCAL, TrustModel


class LocalTrust(TrustModel):
    """The papers' model: no one is trusted; each user privatizes its message with the run's (eps, delta)."""

    name = LOCAL
    about = "no one is trusted: each user privatizes its own message at --eps/--delta (the papers' model)"

    def label_rows(self, algo, rows):
        """The mechanisms' own rows: the model every algorithm's ledger is written for."""
        return rows
