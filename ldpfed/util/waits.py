"""Waiting for another process to get somewhere (a server to answer, a file to appear), with one rule for how long:
a wait on a start bounds only a hang, never a loaded machine's slowness. A start on a machine whose cores other
work holds (imports, a database's migration, a compile, at a fraction of a core) takes minutes, not seconds; a
process that dies is noticed at once (`exited`), so the bound is reached only by a process that is alive and
stuck."""
from __future__ import annotations

import time
from typing import Callable

# The bound on a wait for a start (seconds): a start on a loaded machine has taken over 120 s
HANG_S = 400.0


class WaitFailed(RuntimeError):
    """What was awaited did not come: its process exited first, or it stayed away for the whole bound."""


def wait_until(ready: Callable[[], bool], what: str, timeout: float = HANG_S, *,
               exited: Callable[[], int | None] | None = None, detail: Callable[[], str] | None = None,
               every: float = 0.25) -> float:
    """Poll `ready()` every `every` seconds until it is true; return the seconds waited. WaitFailed if `exited()`
    (e.g. Popen.poll) returns a status first, or after `timeout` seconds; its message names `what` (e.g. "the MLflow
    UI on port 5000 to answer"), the status or the seconds waited, then `detail()` (e.g. the process's log)."""
    started = time.monotonic()
    while True:
        if ready():
            return time.monotonic() - started
        waited = time.monotonic() - started
        code = exited() if exited is not None else None
        if code is not None and ready():        # got there, then exited, between the two looks
            return waited
        if code is not None:
            problem = f"waited {waited:.0f} s for {what}: its process exited ({code})"
        elif waited > timeout:
            problem = f"waited {waited:.0f} s for {what} (the bound: {timeout:g} s)"
        else:
            time.sleep(every)
            continue
        extra = detail() if detail is not None else ""
        raise WaitFailed(f"{problem}:\n{extra}" if extra else problem)
