"""The memory a run's largest arrays need, estimated before anything is allocated: a configuration that cannot fit
is refused with a ConfigError naming its option, instead of a traceback from numpy (or a machine swapping to death).

The estimate is deliberately coarse (an upper bound of the right order, not an accounting of every array): what
matters is telling `--env-param d=100000` or `--users 1e30` (terabytes) apart from any run that fits.
"""
from __future__ import annotations

import os

from ldpfed.errors import ConfigError

FLOAT = 8                  # bytes of a float64
BYTES_PER_ROUND = 512      # one row of the result table, kept until the run ends (tuple + metrics dict + frame)
ROUND_COPIES = 4           # working copies of a round's arrays (contexts, scores, messages, noisy messages)
STATE_COPIES = 4           # copies of the server state during an update (old, new, temporaries)


def memory_limit() -> int:
    """Bytes a run may use: LDPFED_MEMORY_LIMIT (bytes) if set, else the physical memory of this machine."""
    override = os.environ.get("LDPFED_MEMORY_LIMIT")
    if override:
        try:
            value = int(float(override))
        except ValueError:
            raise ConfigError("LDPFED_MEMORY_LIMIT", override, "must be a number of bytes") from None
        if value < 1:
            raise ConfigError("LDPFED_MEMORY_LIMIT", override, "must be a positive number of bytes")
        return value
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.3g} GiB"


def check_allocation(field: str, value, nbytes: float, what: str) -> None:
    """ConfigError naming `field` when `nbytes` (for `what`) exceeds memory_limit()."""
    limit = memory_limit()
    if nbytes > limit:
        raise ConfigError(field, value, f"{what} needs about {gib(nbytes)}, more than the {gib(limit)} this "
                                        f"machine has (LDPFED_MEMORY_LIMIT overrides the limit)")
