"""Stopping cleanly: SIGTERM (a scheduler, `kill`, a container stop) handled like Ctrl-C.

Inside `interruptible()`, SIGTERM raises `Terminated`, a KeyboardInterrupt, in the main thread; so one `except
KeyboardInterrupt` (or a `finally`) covers both signals: the engine's driver writes its checkpoint, a sweep marks
its parent run KILLED, Ray is shut down. Exit status: 130 for Ctrl-C, 143 for SIGTERM (the shell's convention).
"""
from __future__ import annotations

import contextlib
import signal
import threading


class Terminated(KeyboardInterrupt):
    """The process received SIGTERM."""


def _raise_terminated(signum, frame):
    raise Terminated(f"received {signal.Signals(signum).name}")


@contextlib.contextmanager
def interruptible():
    """SIGTERM raises Terminated while inside (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def install() -> None:
    """For worker processes (e.g. a process pool's initializer): SIGTERM raises Terminated from now on."""
    signal.signal(signal.SIGTERM, _raise_terminated)


def exit_status(error: KeyboardInterrupt) -> int:
    return 143 if isinstance(error, Terminated) else 130
