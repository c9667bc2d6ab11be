"""The privacy guarantee of one mechanism, as recorded in a run's privacy ledger."""

from __future__ import annotations

from dataclasses import asdict, dataclass

MECHANISMS = (
    "gaussian",
    "symmetric-gaussian",
    "laplace",
    "l2-ball",
    "randomized-response",
    "tree-gaussian",
    "tree-laplace",
    "wishart",
    "sparse-vector",
    "skellam",
)


@dataclass(frozen=True)
class Guarantee:
    """What one mechanism guarantees.

    mechanism: one of MECHANISMS. model: "ldp" (per user message) or "central" (per release of the server).
    eps, delta: the (eps, delta)-DP claim (delta 0.0 for pure DP). sensitivity: the sensitivity or input bound
    the calibration used, measured in `norm` ("l1", "l2", or "none" when the mechanism has no such notion).
    """

    mechanism: str
    model: str
    eps: float
    delta: float
    sensitivity: float
    norm: str

    def as_dict(self) -> dict:
        return asdict(self)
