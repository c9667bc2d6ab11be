"""Replay: the delays a deadline run on Ray recorded (RayOptions.deadline_record, `run --deadline-s ... --out DIR`
writes DIR/deadline-record.json), as a federation model: every user of a recorded population round sends its
message `arrival - round` rounds late, or loses it (arrival null). Under it the single-process engine (or Ray
without a deadline) gives the deadline run's table bit for bit: the same users act, the same late sums are folded
in the same rounds and order."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ldpfed.federation.base import LOST, Federation
from ldpfed.util.errors import ConfigError
from ldpfed.util.options import Option

FORMAT = "ldpfed-deadline-record-1"


def read_record(path) -> dict:
    """{(round, population): delay (LOST: never)} from a deadline record; ConfigError naming
    federation_options.record for a missing or malformed one."""
    field = "federation_options.record"
    file = Path(str(path))
    if not file.is_file():
        raise ConfigError(field, str(path), "no such file")
    try:
        data = json.loads(file.read_text())
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')!r}, not {FORMAT!r}")
        delays = {}
        for entry in data["late_population_rounds"]:
            r, p, arrival = int(entry["round"]), int(entry["population"]), entry["arrival"]
            if arrival is not None and int(arrival) <= r:
                raise ValueError(f"round {r}, population {p} arrives in round {arrival}, not later")
            delays[(r, p)] = LOST if arrival is None else int(arrival) - r
        return delays
    except (ValueError, KeyError, TypeError) as error:
        raise ConfigError(field, str(path), f"not a deadline record: {error}") from None


class Replay(Federation):
    """The late and lost population rounds of a recorded deadline run, replayed."""

    name = "replay"
    about = "replays a deadline run's record (record=PATH): its late population rounds' messages arrive as they did"
    options = {"record": Option(None, kind="any", doc="the deadline record (deadline-record.json) of a deadline run")}
    late = True

    def __init__(self, seed=0, populations=1, options=None):
        super().__init__(seed, populations, options)
        self.recorded = read_record(self.options["record"])

    @classmethod
    def checked_options(cls, given) -> dict:
        options = super().checked_options(given)
        if options["record"] is None:
            raise ConfigError("federation_options.record", None, "give the deadline record to replay (record=PATH)")
        read_record(options["record"])
        return options

    @property
    def loses(self) -> bool:
        return any(delay == LOST for delay in self.recorded.values())

    def delays(self, round_index, population, users):
        delay = self.recorded.get((round_index, population))
        return None if delay is None else np.full(len(users), delay, dtype=np.int64)
