"""The memory a run's largest arrays need, estimated before anything is allocated: a configuration that cannot fit
is refused with a ConfigError naming its option, instead of a traceback from numpy (or a machine swapping to death).

The estimate is deliberately coarse (an upper bound of the right order, not an accounting of every array): what
matters is telling `--env-param d=100000` or `--users 1e30` (terabytes) apart from any run that fits.
"""
from __future__ import annotations

import ctypes
import os

from ldpfed.util.errors import ConfigError

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


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_allocator_tuned = False


def keep_freed_memory(mmap_bytes: int = 32 * 2**20, trim_bytes: int = 256 * 2**20) -> bool:
    """Let this process reuse the memory of freed arrays instead of returning it to the OS (glibc only; elsewhere a
    no-op returning False). Why: a population's arrays are a few MB each (contexts, per-user messages, noise) and
    die every population; with glibc's defaults they are mmap-ed and unmapped, or trimmed off the heap, so every
    population faults its pages in again (ldp-ols, 1e6 users, d = 10: ~670,000 page faults, ~40% of its CPU time).
    Arrays below `mmap_bytes` come from the heap, and up to `trim_bytes` of freed heap stay mapped (bounded: peak
    memory does not grow with users). Called by the engines in the processes that simulate populations; once per
    process is enough (idempotent)."""
    global _allocator_tuned
    if _allocator_tuned:
        return True
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _allocator_tuned = (mallopt(_M_MMAP_THRESHOLD, int(mmap_bytes)) == 1
                        and mallopt(_M_TRIM_THRESHOLD, int(trim_bytes)) == 1)
    return _allocator_tuned
