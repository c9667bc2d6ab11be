"""Availability: each user of a round answers with a probability, per population, possibly following a daily cycle
over the rounds or a trace of real participation; the others drop out of the round: before it (offline: they
neither act nor send, ldpfed.federation.base) or after acting (their message never reaches the server). The draws
come from the run's seed, one Generator per (population, round) (purpose "federation"), so every engine, a retried
round and a resumed run see the same users.

The probability of round r in population k: p_k (p, or p_by_population[k]); with a cycle,
p_k * (1 + cycle * sin(2 pi (r + phase_k) / period)) clipped to 1 (it stays > 0: cycle < 1); with a trace, the
trace's p for (r, k), the trace's rounds repeating when the run has more. The trace's SHA-256 is an option, filled in
when the run is configured: the config names the trace's content, not only its path."""
from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import numpy as np

from ldpfed.federation.base import LOST, Federation, check_one_per_population, per_population_numbers
from ldpfed.util.errors import ConfigError
from ldpfed.util.options import Option

DROPS = ("before", "after")


def trace_bytes(path) -> bytes:
    """The bytes of a trace file, else ConfigError naming federation_options.trace."""
    file = Path(str(path))
    if not file.is_file():
        raise ConfigError("federation_options.trace", str(path), "no such file")
    return file.read_bytes()


def read_trace(path, populations: int, sha256: str | None = None) -> tuple[np.ndarray, str]:
    """(per-round probabilities, shape (rounds, populations); the SHA-256 of the bytes read) from a CSV or Parquet
    trace with columns `round` and `p` and optionally `population` (one row per round and population). The bytes are
    read once, then hashed and parsed, so the hash names what was parsed; `sha256` given: the bytes must have it
    (the file the run was configured with). ConfigError naming federation_options.trace for whatever is wrong."""
    import pandas as pd

    field = "federation_options.trace"
    data = trace_bytes(path)
    digest = hashlib.sha256(data).hexdigest()
    if sha256 is not None and digest != sha256:
        raise ConfigError(field, str(path), f"its content changed since the run was configured (SHA-256 {digest}, "
                                            f"the run's {sha256}): a run reads the one trace it was configured with")
    parquet = Path(str(path)).suffix.lower() in (".parquet", ".pq")
    try:
        table = pd.read_parquet(io.BytesIO(data)) if parquet else pd.read_csv(io.BytesIO(data))
    except Exception as error:
        raise ConfigError(field, str(path), f"unreadable as {'Parquet' if parquet else 'CSV'}: {error}") from None
    missing = {"round", "p"} - set(table.columns)
    if missing:
        raise ConfigError(field, str(path), f"lacks the column(s) {sorted(missing)} (it needs round and p, and "
                                            f"optionally population)")
    if len(table) == 0:
        raise ConfigError(field, str(path), "has no rows")
    p = pd.to_numeric(table["p"], errors="coerce").to_numpy(dtype=float)
    if not (np.isfinite(p) & (p >= 0) & (p <= 1)).all():
        raise ConfigError(field, str(path), "has a p outside [0, 1] (or not a number)")
    rounds = pd.to_numeric(table["round"], errors="coerce").to_numpy(dtype=float)
    if not (np.isfinite(rounds) & (rounds >= 0) & (rounds == np.round(rounds))).all():
        raise ConfigError(field, str(path), "has a round that is not an integer >= 0")
    rounds = rounds.astype(np.int64)
    if "population" in table.columns:
        pops = pd.to_numeric(table["population"], errors="coerce").to_numpy(dtype=float)
        if not (np.isfinite(pops) & (pops >= 0) & (pops < populations) & (pops == np.round(pops))).all():
            raise ConfigError(field, str(path), f"has a population outside 0..{populations - 1}")
        pops = pops.astype(np.int64)
    else:
        pops = None
    keys = rounds * populations + (0 if pops is None else pops)
    unique, counts = np.unique(keys, return_counts=True)
    if (counts > 1).any():
        twice = int(unique[counts > 1][0])
        raise ConfigError(field, str(path), f"gives round {twice // populations}"
                                            + ("" if pops is None else f", population {twice % populations}")
                                            + " more than one p")
    grid = np.full((int(rounds.max()) + 1, populations), np.nan)
    if pops is None:
        grid[rounds, :] = p[:, None]
    else:
        grid[rounds, pops] = p
    holes = np.argwhere(np.isnan(grid))
    if len(holes):
        r, k = holes[0]
        raise ConfigError(field, str(path), f"has no p for round {r}" + (f", population {k}" if pops is not None
                                                                           else "") + " (every round from 0 to the "
                                                                                      "last needs one)")
    return grid, digest


class Availability(Federation):
    """Each user of a round answers with its population's probability of the round; the others drop out."""

    name = "availability"
    about = ("each user of a round answers with probability p (per population: p_by_population; over the rounds: a "
             "daily cycle or a trace file); the others drop out, before acting or after (their message lost)")
    options = {
        "p": Option(0.9, low=0, high=1, low_open=True,
                    doc="the probability that a user of a round is available (answers)"),
        "p_by_population": Option(None, kind="any",
                                  doc="a list of one probability in (0, 1] per population, in population order "
                                      "(overrides p); none: p for every population"),
        "cycle": Option(0.0, low=0, high=1, high_open=True,
                        doc="amplitude of a daily cycle: p x (1 + cycle sin(2 pi (round + phase) / period)), "
                            "clipped to 1; 0: none"),
        "period": Option(24, kind="int", low=2, doc="rounds per cycle (a day)"),
        "phase_by_population": Option(None, kind="any",
                                      doc="a list of one offset in rounds per population (time zones); none: 0"),
        "trace": Option(None, kind="any",
                        doc="a CSV or Parquet file of per-round participation: columns round, p and optionally "
                            "population; its rounds repeat when the run has more; none: p (and the cycle)"),
        "trace_sha256": Option(None, kind="any",
                               doc="the SHA-256 the trace file must have; none: the file's, filled in when the run is "
                                   "configured, so the config names the trace's content (a resume or a worker that "
                                   "finds other content is refused)"),
        "drop": Option("before", kind="choice", choices=DROPS,
                       doc="where an unavailable user drops: before the round (it neither acts nor sends) or after "
                           "acting (its message never reaches the server)"),
    }

    def __init__(self, seed=0, populations=1, options=None):
        super().__init__(seed, populations, options)
        per = self.options["p_by_population"]
        self.probabilities = (np.full(self.populations, self.options["p"]) if per is None
                              else np.asarray(per, dtype=float))
        phase = self.options["phase_by_population"]
        self.phases = np.zeros(self.populations) if phase is None else np.asarray(phase, dtype=float)
        trace = self.options["trace"]   # read once, here; its SHA-256 is an option, so it is in the summary
        self.trace = None if trace is None else read_trace(trace, self.populations, self.options["trace_sha256"])[0]

    @classmethod
    def checked_options(cls, given) -> dict:
        options = super().checked_options(given)
        if options["p_by_population"] is not None:
            options["p_by_population"] = per_population_numbers(options["p_by_population"], "p_by_population",
                                                                "numbers in (0, 1]", 0.0, 1.0, low_open=True)
        if options["phase_by_population"] is not None:
            options["phase_by_population"] = per_population_numbers(options["phase_by_population"],
                                                                    "phase_by_population", "finite numbers of rounds",
                                                                    -float("inf"), float("inf"), low_open=True)
        if isinstance(options["trace"], os.PathLike):      # a pathlib.Path from Python: recorded as text
            options["trace"] = os.fspath(options["trace"])
        if options["trace"] is not None:
            if not isinstance(options["trace"], str):
                raise ConfigError("federation_options.trace", options["trace"], "must be a file path")
            if options["cycle"] > 0:
                raise ConfigError("federation_options.cycle", options["cycle"],
                                  "a trace gives each round's probability: drop the cycle, or the trace")
        sha256 = options["trace_sha256"]
        if sha256 is not None and (options["trace"] is None or not isinstance(sha256, str) or len(sha256) != 64
                                   or not set(sha256) <= set("0123456789abcdef")):
            raise ConfigError("federation_options.trace_sha256", sha256,
                              "must be the 64 lowercase hex digits of a trace file's SHA-256, with a trace")
        if options["trace"] is not None and sha256 is None:      # checked against the bytes when the model is built
            options["trace_sha256"] = hashlib.sha256(trace_bytes(options["trace"])).hexdigest()
        return options

    def check(self, config) -> None:
        super().check(config)
        check_one_per_population(self.options, config, {"p_by_population": "values", "phase_by_population": "values"})

    @property
    def late(self) -> bool:
        return False          # a user's message arrives in its round, or (drop=after) never

    @property
    def loses(self) -> bool:
        return self.options["drop"] == "after"

    def probability(self, round_index: int, population: int) -> float:
        """The probability that a user of this population answers in this round (module doc)."""
        if self.trace is not None:
            return float(self.trace[round_index % len(self.trace), population])
        p = self.probabilities[population]
        cycle = self.options["cycle"]
        if cycle > 0:
            angle = 2 * np.pi * (round_index + self.phases[population]) / self.options["period"]
            p = min(1.0, p * (1 + cycle * np.sin(angle)))     # > 0, since p > 0 and cycle < 1
        return float(p)

    def answers(self, round_index, population, users) -> np.ndarray | None:
        """Which of the users answer (a boolean mask), or None: all of them (p >= 1: no draw)."""
        p = self.probability(round_index, population)
        if p >= 1.0:
            return None
        return self.stream("present", population, round_index).random(len(users)) < p

    def present(self, round_index, population, users):
        if self.options["drop"] == "after":
            return super().present(round_index, population, users)
        answers = self.answers(round_index, population, users)
        return users if answers is None else users[answers]

    def delays(self, round_index, population, users):
        if self.options["drop"] == "before":
            return super().delays(round_index, population, users)
        answers = self.answers(round_index, population, users)
        return None if answers is None else np.where(answers, 0, LOST).astype(np.int64)

