"""Stragglers against a deadline: real rounds on the Ray engine with a share of the population actors slow
(RayOptions.straggle_share, straggle_s), with and without a round deadline (RayOptions.deadline_s). Per setting:
rounds per second, and the fraction of the messages that missed their round and were folded later, and that never
reached the server in the run (lost, or due after its last round). Without a deadline every round waits for its
slowest actor; with one, a round closes at the deadline and a straggler's messages come later."""
from __future__ import annotations

import time

from ldpfed.config import RunConfig
from ldpfed.engine.ray_engine import run_ray


def straggler_rows(config: RunConfig, actors: int, shares, deadlines, straggle_s: float, late: str = "fold",
                   log=print) -> list[dict]:
    rows = []
    for share in shares:
        for deadline in deadlines:
            began = time.perf_counter()
            result = run_ray(config, actors=actors, shards=2, placement="none", transport="ray", group_size=1,
                             straggle_share=share, straggle_s=straggle_s if share else 0.0, deadline_s=deadline,
                             late=late)
            seconds = time.perf_counter() - began
            table, s = result.table, result.summary
            served = float(table["users"].iloc[-1])
            folded = float(table["late_folded"].sum()) if "late_folded" in table else 0.0
            never = float(s.get("late_messages_never_folded", 0)) + float(table.get("users_lost", table["users"] * 0)
                                                                         .sum())
            # the rounds' rate from the run's own clock (users/s from its first round): not the actors' start
            row = {"stragglers": share, "straggle_s": straggle_s if share else 0.0,
                   "deadline_s": deadline, "late": late if deadline else "-", "rounds": config.rounds,
                   "rounds_per_s": s["users_per_s"] / config.round_size, "late_folded": folded / served,
                   "never_reached": never / served, "seconds": seconds}
            rows.append(row)
            log(f"stragglers {share:.0%} ({row['straggle_s']:g} s)  deadline {deadline if deadline else 'none':<5}  "
                f"{row['rounds_per_s']:6.2f} rounds/s  late, folded later {row['late_folded']:6.1%}  "
                f"never reached the server {row['never_reached']:6.1%}")
    return rows
