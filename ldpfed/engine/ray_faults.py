"""What goes wrong in a Ray run, as the engine sees it: a round that timed out, a fault it could not recover, and
the errors that mean "a worker or its objects are gone" (the round is redone) rather than "the code is wrong"."""
from __future__ import annotations

import ray

from ldpfed.engine.channels import ChannelBroken


class RoundTimeout(Exception):
    """A round that did not complete within its timeout (a frozen actor, a partitioned node): handled as a death."""


class RunFault(RuntimeError):
    """A run the Ray engine could not recover (too many faults in a row, or an actor that cannot be recreated)."""


# Errors that mean "a worker or its objects are gone", not "the code is wrong": the round is redone.
FAULTS = (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError, ray.exceptions.WorkerCrashedError,
          ray.exceptions.GetTimeoutError, RoundTimeout, ChannelBroken)
