"""A message field declared once.

An algorithm that declares its message as `fields()` -> {name: Field} states, per field, everything the rest of
the system needs, in one place:

* its per-user `shape` (the message spec: the same for every user, whatever their data),
* what makes it: a `mechanism` (its outputs fill the field; its guarantee is a ledger row), or nothing, for a
  public field (a public schedule, a public count), which then states its `domain`; `raw=True` marks a field
  that no mechanism makes and that is not public either: the user's clipped data sent to a trusted server (the
  central model, whose mechanisms are the server's releases); under local DP the contract refuses it,
* the public `data_bound` on each entry of what the mechanism privatizes (additive-noise mechanisms need it for
  their output domain; the l2-ball and randomized response do not),
* the `schedule` of the field (e.g. `slots=` for the arm slots only some of which carry data),
* how many of the mechanism's outputs one user's data can change (`per_user`) and why (`composition`).

From that the base class derives message_spec, message_domains (what the server shards check), public_fields,
mechanisms and the ledger rows; the aggregate bounds follow from the domains for plain sums. An algorithm that
writes those methods itself (the older style) declares no fields.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ldpfed.mechanisms import Domain
from ldpfed.mechanisms.protocol import DataBoundRequired


@dataclass(frozen=True)
class Field:
    shape: tuple                       # per-user shape, e.g. (d,) or (K, d) or () for a scalar
    mechanism: object = None           # the mechanism whose outputs fill the field; None: a public field
    data_bound: object = None          # |entry| <= data_bound before noise (public); additive-noise mechanisms
    domain: Domain | None = None       # a public field's domain (required without a mechanism)
    schedule: dict = field(default_factory=dict)   # passed to the mechanism's output_domain (e.g. slots=)
    per_user: int = 1                  # outputs of the mechanism one user's data can change
    composition: str | None = None     # why per_user is right (None: the algorithm's default reason)
    raw: bool = False                  # no mechanism, yet not public: sent raw to a trusted (central-model) server

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))

    @property
    def public(self) -> bool:
        return self.mechanism is None and not self.raw

    def make_domain(self) -> Domain:
        """The values an honest client's field can take: the public domain, or the mechanism's output domain."""
        if self.mechanism is None:
            if self.domain is None:
                raise NotImplementedError("a public field (no mechanism) must state its domain")
            return self.domain
        try:
            return self.mechanism.output_domain(self.shape, self.data_bound, **self.schedule)
        except DataBoundRequired as error:
            raise NotImplementedError(f"{error.reason}: give the Field a data_bound") from None
