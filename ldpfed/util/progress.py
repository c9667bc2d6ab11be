"""Progress displays (tqdm): one run's users, and a sweep's runs.

On a terminal the bar redraws in place; in a log file (CI, `ray job submit`) it prints a line at most every
LOG_INTERVAL seconds and at the end, so logs stay short.

Rates are averages (smoothing=0), not moving averages. While a run goes on, its bar's rate counts from the end of
its first round: that round pays what a run pays once (new actor processes importing and loading compiled code, the
first compile), which would make the first lines' rate and ETA absurd (hours for a run of a minute on Ray); until
the first round is over the bar shows no rate and no ETA. Its last line, like the summary's users/s, counts every
round. An engine calls `progress(0, 0.0)` when it starts its first round, which restarts the bar's clock (Ray
start-up and actor creation before it are not counted, as in the summary).
"""
from __future__ import annotations

import sys
import time

from tqdm import tqdm

LOG_INTERVAL = 30.0


def _live(stream) -> bool:
    return bool(getattr(stream, "isatty", lambda: False)())


class _Lines:
    """For a log file: each of tqdm's in-place redraws becomes one line of its own."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> None:
        text = text.replace("\r", "").rstrip()
        if text:
            self.stream.write(text + "\n")

    def flush(self) -> None:
        self.stream.flush()


class _Bar(tqdm):
    """tqdm whose rate (and so its ETA) can leave out a warm-up while it runs: `warm` = (time, n) at the warm-up's
    end, None while the warm-up lasts (no rate yet), or False (the default: tqdm's own average since the start).
    `projected`, when set, gives the rate instead (None: no rate yet). The last line gives the average since the
    start."""

    warm = False
    projected = None

    @property
    def format_dict(self):
        values = super().format_dict
        if self.total and self.n >= self.total:      # the last line: the whole run's average, as in the summary
            return values
        # a rate of 0 is tqdm's "?" (no rate, no ETA); None would be its average since the start
        if self.projected is not None:
            values["rate"] = self.projected() or 0.0
        elif self.warm is None:
            values["rate"] = 0.0
        elif self.warm:
            since, before = self.warm
            spent = self._time() - since
            values["rate"] = (self.n - before) / spent if spent > 0 and self.n > before else 0.0
        return values


def _bar(total: int, label: str, unit: str, stream, log_interval: float = LOG_INTERVAL) -> tqdm:
    live = _live(stream)
    return _Bar(total=total, desc=label, unit=unit, file=stream if live else _Lines(stream), smoothing=0,
                dynamic_ncols=live, ncols=None if live else 130, mininterval=0.2 if live else log_interval,
                leave=True)


class Progress:
    """`progress(users_done, regret)`: the engines' callback for one run (see ldpfed.engine.run)."""

    def __init__(self, total: int, label: str = "", stream=None):
        stream = stream or sys.stderr
        self.bar = _bar(total, label, "users", stream)

    def __call__(self, done: int, regret: float | None = None) -> None:
        from ldpfed.util.jit import compile_seconds

        if done == 0:
            self.bar.reset()            # the engine starts its first round now: the clock counts from here
            self.bar.warm = None        # no rate until the first round is over
            self._compiled = compile_seconds()
            return
        # numba's compile time during the run is not the simulation's: the summary's users_per_s leaves it out too
        compiled = compile_seconds()
        spent = compiled - getattr(self, "_compiled", compiled)
        shifted = self.bar.start_t + spent
        self.bar.start_t = min(shifted, time.time() - 1e-6)     # never after now: tqdm's elapsed stays positive
        if self.bar.warm is None:
            self.bar.warm = (self.bar._time(), done)          # the first round is over: the rate counts from here
        elif self.bar.warm:
            since, before = self.bar.warm
            self.bar.warm = (min(since + spent, self.bar._time() - 1e-6), before)
        # tqdm's close prints the final line only if a line was printed since its start: keep that order
        self.bar.last_print_t = max(self.bar.last_print_t, self.bar.start_t)
        self._compiled = compiled
        if regret is not None:
            self.bar.set_postfix_str(f"regret {regret:,.1f}", refresh=False)
        self.bar.update(done - self.bar.n)
        if done >= self.bar.total:
            self.bar.close()

    def close(self) -> None:
        self.bar.close()


class SweepProgress:
    """A sweep's bar: runs done out of all, the run(s) in progress, the failures so far, and an ETA.

    Given `algorithms` (the algorithm of each run to do), the ETA tells an algorithm's first run from the others:
    a first run pays what the algorithm costs once (compiling its loops on a new machine, loading them in each
    new process), which made a cold first pass's ETA several times the sweep. The time between one finished run
    and the next is counted as the finishing run's (with several at once, that is the sweep's rate, not one
    run's time); the ETA is the runs left that are not first runs at the average time of those finished so far,
    plus the algorithms not yet seen at the average time of first runs. Until a run that is not an algorithm's
    first has finished the bar shows no ETA; with several runs at once (`at_once`), until as many have (two runs
    that finish together leave a short interval between them: only over as many as run at once does the average
    interval mean the sweep's rate). A sweep run in turn, one algorithm after another, finishes every algorithm's
    first run early. Without `algorithms`: the average time of the finished runs."""

    def __init__(self, total_runs: int, label: str = "sweep", stream=None, algorithms=None, at_once: int = 1):
        stream = stream or sys.stderr
        self.failures = 0
        self.running: list[str] = []
        self.live = _live(stream)
        # in a log file this class decides when to print (when a run starts, so the line names it)
        self.bar = _bar(total_runs, label, "runs", stream, log_interval=1e9)
        self._printed = time.monotonic()
        if algorithms is not None:
            self.unseen = set(algorithms)
            self.algorithms = len(self.unseen)
            self.at_once = max(1, int(at_once))
            self.times = {"first": [], "other": []}    # seconds from the previous finish, by kind of run
            self._last = time.monotonic()
            self.bar.projected = self._rate
        self._show()

    def _rate(self) -> float | None:
        """Runs per second such that the runs left take the ETA of the class docstring; None before it is known."""
        left = self.bar.total - self.bar.n
        others = self.times["other"]
        if left <= 0 or len(others) < self.at_once:
            return None
        first = self.times["first"]
        per_first = sum(first) / len(first) if first else sum(others) / len(others)
        eta = (left - len(self.unseen)) * sum(others) / len(others) + len(self.unseen) * per_first
        return left / eta if eta > 0 else None

    def _show(self) -> None:
        running = ", ".join(self.running[-2:]) + (f" +{len(self.running) - 2}" if len(self.running) > 2 else "")
        # why the ETA is "?" yet, and how far the first runs are
        waiting = (f" | ETA after each algorithm's first run ({self.algorithms - len(self.unseen)}/"
                   f"{self.algorithms})" if self.bar.projected is not None and len(self.times["other"]) < self.at_once else "")
        # no redraw of its own: the next update draws it (a log file gets a line per LOG_INTERVAL, not per run)
        self.bar.set_postfix_str(f"failed {self.failures}{waiting}" + (f" | running {running}" if running else ""),
                                 refresh=False)

    def started(self, name: str) -> None:
        self.running.append(name)
        self._show()
        if self.live or time.monotonic() - self._printed >= LOG_INTERVAL:
            self._printed = time.monotonic()
            self.bar.refresh()

    def finished(self, name: str, failed: bool = False, algorithm: str | None = None) -> None:
        """A run is over (`algorithm`: its algorithm, for the ETA; None for a run finished before a resume)."""
        if name in self.running:
            self.running.remove(name)
        if self.bar.projected is not None and algorithm is not None:
            now = time.monotonic()
            self.times["first" if algorithm in self.unseen else "other"].append(now - self._last)
            self.unseen.discard(algorithm)
            self._last = now
        self.failures += bool(failed)
        self._show()
        self.bar.update(1)
        if failed and not self.live:     # a log file hears of a failure at once
            self.bar.refresh()

    def close(self) -> None:
        self.running = []
        self._show()
        self.bar.close()

    def write(self, text: str) -> None:
        """Print a line above the bar (a failure message) without breaking it."""
        self.bar.write(text, file=sys.stderr)
