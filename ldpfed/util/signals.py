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


@contextlib.contextmanager
def deferred():
    """Ctrl-C and SIGTERM wait until the block ends (main thread only; elsewhere a no-op).

    For writes that must not stop half way: an exception raised inside numpy's savez leaves its zip file with an
    open member, and closing it then raises a ValueError that hides the interrupt. A signal that arrives inside is
    delivered again to the handler in force before, as the block ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    # a handler set outside Python (getsignal gives None) could not be put back: such a signal is left alone
    previous = {signum: signal.signal(signum, lambda number, frame: arrived.append(number))
                for signum in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(signum) is not None}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(arrived):
            signal.raise_signal(signum)


def install() -> None:
    """For worker processes (e.g. a process pool's initializer): SIGTERM raises Terminated from now on."""
    signal.signal(signal.SIGTERM, _raise_terminated)


def exit_status(error: KeyboardInterrupt) -> int:
    return 143 if isinstance(error, Terminated) else 130
