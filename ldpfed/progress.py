"""A progress display for long runs: a live line on a terminal, a line every 10% otherwise (CI logs)."""
from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, label: str = "", stream=None, min_interval: float = 0.5):
        self.total, self.label = total, label
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.started = time.perf_counter()
        self.last_print = 0.0
        self.next_decile = 1
        self.min_interval = min_interval

    def __call__(self, done: int, regret: float | None = None) -> None:
        now = time.perf_counter()
        fraction = done / self.total
        finished = done >= self.total
        if self.live:
            if not finished and now - self.last_print < self.min_interval:
                return
        elif not finished and fraction * 10 < self.next_decile:
            return
        self.next_decile = int(fraction * 10) + 1
        self.last_print = now
        rate = done / max(now - self.started, 1e-9)
        eta = (self.total - done) / rate if rate > 0 else float("inf")
        width = 30
        bar = "#" * int(width * fraction) + "-" * (width - int(width * fraction))
        shown = "" if regret is None else f"  regret {regret:,.1f}"
        line = f"{self.label} [{bar}] {done:,}/{self.total:,} users{shown}  {rate:,.0f} users/s  eta {eta:,.0f}s"
        if self.live:
            self.stream.write("\r" + line + ("\n" if finished else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
