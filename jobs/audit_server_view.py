#!/usr/bin/env python3
"""The end-to-end privacy audit of what the server sees (ldpfed.server_audit), for every local-DP algorithm under
every trust model it accepts: whole rounds on two neighbouring populations that differ in one canary user, an
empirical lower bound on the canary's eps from the server's view (Clopper-Pearson, confidence 1 - alpha), against
the guarantee the run reports. Refused runs are listed with the system's reason.

    python jobs/audit_server_view.py [--algorithms a,b] [--trusts local,shuffle,central] [--repetitions 4000]
                                     [--users 200] [--eps 1] [--delta 1e-6] [--whole-batch klucb-cf,...]
                                     [--federation availability --federation-option p=0.8]
                                     [--trust-option min_participants=0.7 ...] [--out audit.csv]

--federation runs the audited round under a federation model (its users: those it lets send); --trust-option K=V
reaches each trust model that takes option K (e.g. shuffle's min_participants, secagg's min_survivors).

--whole-batch audits, for the listed algorithms, the shuffle accounting as it was before randomizer groups (eps0 for
the whole round's batch, the canary alone on its arm): rows the audit should flag, the check that it can.
Exit status 1 when a row of today's accounting is flagged (its lower bound is above its claim).
"""
from __future__ import annotations

import argparse
import csv
import datetime
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ldpfed.server_audit import (AUDIT_ALPHA, PILOT, REPETITIONS, TRUSTS, audit_server_view,  # noqa: E402
                                 ldp_algorithms)
from ldpfed.trust import TRUST_MODELS  # noqa: E402
from ldpfed.util.errors import ConfigError  # noqa: E402

WHOLE_BATCH = ("klucb-cf", "sw-klucb-cf", "ldp-mab-ucb")     # users the public schedule sets apart (user 1)
COLUMNS = ("algorithm", "trust", "accounting", "claimed_eps", "claimed_delta", "lower_bound", "flagged", "eps0",
           "amplified", "canary", "group", "view", "pair", "event", "counts", "repetitions", "pilot", "users",
           "delta", "alpha", "federation", "senders", "seconds", "refused")


def names(text: str | None, default) -> list[str]:
    if text is None:
        return list(default)
    return [] if text.strip().lower() in ("", "none") else [name.strip() for name in text.split(",") if name.strip()]


def pairs(items) -> dict:
    """K=V pairs as a dict, each value read as a number where it is one."""
    found = {}
    for item in items or []:
        key, _, value = item.partition("=")
        try:
            found[key.strip()] = float(value) if any(c in value for c in ".e") else int(value)
        except ValueError:
            found[key.strip()] = value.strip()
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithms", help="comma-separated (default: every registered local-DP algorithm)")
    parser.add_argument("--trusts", help=f"comma-separated (default: {','.join(TRUSTS)})")
    parser.add_argument("--repetitions", type=int, default=REPETITIONS, help="runs per population for the counts")
    parser.add_argument("--pilot", type=int, default=PILOT, help="runs per population that choose the event")
    parser.add_argument("--users", type=int, default=200, help="users of the one round")
    parser.add_argument("--eps", type=float, default=1.0)
    parser.add_argument("--delta", type=float, default=1e-6)
    parser.add_argument("--alpha", type=float, default=AUDIT_ALPHA)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shufflers", type=int, default=1)
    parser.add_argument("--whole-batch", help=f"algorithms audited under the whole-batch shuffle accounting "
                                              f"(default: {','.join(WHOLE_BATCH)}; 'none': none)")
    parser.add_argument("--federation", default="ideal", help="the federation model of the audited round")
    parser.add_argument("--federation-option", action="append", metavar="K=V", help="a federation model's option")
    parser.add_argument("--trust-option", action="append", metavar="K=V",
                        help="an option of the trust models that take it")
    parser.add_argument("--out", help="write the rows to this CSV file")
    args = parser.parse_args(argv)

    common = dict(eps=args.eps, delta=args.delta, users=args.users, repetitions=args.repetitions,
                  pilot=min(args.pilot, args.repetitions), seed=args.seed, alpha=args.alpha,
                  federation=args.federation, federation_options=pairs(args.federation_option))
    trust_options = pairs(args.trust_option)
    cases = [(name, trust, False) for name in names(args.algorithms, ldp_algorithms())
             for trust in names(args.trusts, TRUSTS)]
    cases += [(name, "shuffle", True) for name in names(args.whole_batch, WHOLE_BATCH)]
    started = time.perf_counter()
    print(f"# server-view audit, {datetime.date.today()}, {os.cpu_count()} cores; eps = {args.eps:g}, delta = "
          f"{args.delta:g}, one round of {args.users} users, {args.repetitions} + {common['pilot']} (pilot) runs per "
          f"population, alpha = {args.alpha:g}, federation {args.federation} {common['federation_options'] or ''}",
          flush=True)
    print(f"{'algorithm':<20} {'trust':<8} {'accounting':<18} {'claimed eps':>11} {'lower bound':>11}  "
          f"{'canary':>6} {'group':>5} {'s':>5}  verdict", flush=True)
    rows = []
    for name, trust, whole_batch in cases:
        try:     # (shufflers reach only a trust model that takes them)
            taken = {key: value for key, value in trust_options.items() if key in TRUST_MODELS[trust].options}
            row = audit_server_view(name, trust, whole_batch=whole_batch, shufflers=args.shufflers,
                                    trust_options=taken, **common)
        except ConfigError as error:
            row = {"algorithm": name, "trust": trust, "accounting": "whole batch" if whole_batch else None,
                   "refused": f"{error.field}: {error.reason}"}
            print(f"{name:<20} {trust:<8} refused: {row['refused'][:150]}", flush=True)
            rows.append(row)
            continue
        verdict = "FLAGGED" if row["flagged"] else "below the claim"
        print(f"{name:<20} {trust:<8} {row['accounting'] or '-':<18} {row['claimed_eps']:>11.4f} "
              f"{row['lower_bound']:>11.4f}  {row['canary']:>6} {row['group'] or '-':>5} {row['seconds']:>5.0f}  "
              f"{verdict}", flush=True)
        rows.append(row)
    elapsed = time.perf_counter() - started
    print(f"# {len(rows)} rows in {elapsed:.0f} s", flush=True)
    if args.out:
        with open(args.out, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=COLUMNS, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
    today = [row for row in rows if not row.get("refused") and row.get("accounting") != "whole batch"]
    return 1 if any(row["flagged"] for row in today) else 0


if __name__ == "__main__":
    sys.exit(main())
