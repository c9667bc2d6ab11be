#!/usr/bin/env python
"""Reproduce the five papers: each paper's experiments on its setting, a claims table, curves, slopes.

    python jobs/reproduce.py --paper 000 --quick        # minutes: 3 seeds, small T (a smoke run of the pipeline)
    python jobs/reproduce.py --paper all                # the full reproduction (see REPRODUCTION.md for its cost)
    python jobs/reproduce.py --batching                 # the price of batching (round sizes 1 .. 10,000)

Per paper, one MLflow parent run (experiment "reproduce", sweep "paper-<id>", one child run per simulation, as
jobs/run_all.py), and under results/reproduce/paper-<id>/:
    claims.md            the claims table: claim quoted from the paper (its text under --papers), the measured
                         figure with its spread (median [25%-75%] over seeds), reproduced or not, why not
    slopes.md            log-log slope of the final regret over T (per-seed fit, median [quartiles]) next to the
                         theory's rate
    plots/regret_curves.png    cumulative regret, median over seeds with a 25-75% band, a panel per (world,
                               profile, eps)
    plots/final_regret_vs_eps.png, plots/slopes.png
    runs.csv             one row per simulation (what the tables are computed from)
What is simulated: ldpfed/reproduce/papers.py; the claims and their tests: ldpfed/reproduce/claims.py. Round size:
1 (the papers are sequential) on the compiled sequential engine, else 10 users per round (the price-of-batching
table in REPRODUCTION.md shows where B = 10 leaves the regret unchanged).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ldpfed.reproduce.claims import PAPERS_ENV, default_papers_dir
from ldpfed.reproduce.experiments import price_of_batching, reproduce_paper
from ldpfed.reproduce.papers import BATCH_ALGORITHMS, BATCH_OTHERS, FULL, PAPERS, QUICK
from ldpfed.tracking import Tracker, TrackingUnavailable


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--paper", choices=[*PAPERS, "all"], default=None)
    parser.add_argument("--quick", action="store_true", help="small T, 3 seeds: a smoke run of the pipeline")
    parser.add_argument("--users", type=int, default=None, help="T of the main experiments (override)")
    parser.add_argument("--seeds", type=int, default=None, help="seeds of the main experiments (override)")
    parser.add_argument("--slope-T", default=None, help="comma-separated horizons of the slope fits (override)")
    parser.add_argument("--round-size", type=int, default=None, help="users per round of every run (override)")
    parser.add_argument("--eps", default=None, help="comma-separated eps values of every setting (override)")
    parser.add_argument("--lasso-T", default=None, help="seed 003's support grid: comma-separated T (override)")
    parser.add_argument("--lasso-eps", default=None, help="seed 003's support grid: comma-separated eps (override)")
    parser.add_argument("--lasso-seeds", type=int, default=None, help="seed 003's support grid: seeds (override)")
    parser.add_argument("--batching", action="store_true", help="the price-of-batching experiment")
    parser.add_argument("--batch-users", type=int, default=1_000_000,
                        help="T of seed 000/002's contextual algorithms")
    parser.add_argument("--batch-users-others", type=int, default=100_000,
                        help="T of the other families (MAB, piecewise, LinUCB, BCO); 0 skips them")
    parser.add_argument("--batch-seeds", type=int, default=5)
    parser.add_argument("--batch-algorithms", default=None,
                        help="comma-separated algorithms of the experiment to run (default: all of them), to rerun "
                             "the rows of one whose bits moved")
    parser.add_argument("--workers", type=int, default=1, help="parallel processes (the machine is shared)")
    parser.add_argument("--papers", type=Path, default=None,
                        help=f"folder of the papers' text, to check the claims' quotes (default ${PAPERS_ENV}, else "
                             f"{default_papers_dir()}); without it the quotes are not checked")
    parser.add_argument("--tracking-uri", default=None)
    parser.add_argument("--experiment", default="reproduce")
    parser.add_argument("--out", default="results/reproduce")
    parser.add_argument("--no-tracking", action="store_true")
    parser.add_argument("--max-points", type=int, default=200, help="points per logged curve")
    args = parser.parse_args(argv)
    if args.paper is None and not args.batching:
        parser.error("give --paper or --batching")
    if args.batch_algorithms is not None:
        known = [a[0] for a in BATCH_ALGORITHMS + BATCH_OTHERS]
        args.batch_algorithms = [a.strip() for a in args.batch_algorithms.split(",") if a.strip()]
        unknown = [a for a in args.batch_algorithms if a not in known]
        if unknown or not args.batch_algorithms:
            parser.error(f"--batch-algorithms: {', '.join(unknown) or 'none given'}: not in the experiment "
                         f"(one of {', '.join(known)})")
    return parser, args


def preset_of(args) -> dict:
    """The preset (QUICK or FULL) with the command line's overrides."""
    preset = dict(QUICK if args.quick else FULL)
    if args.users:
        preset["users"], preset["forced"] = args.users, True       # every setting
    if args.seeds:
        preset["seeds"] = args.seeds
    if args.eps:
        preset["eps"] = tuple(float(e) for e in args.eps.split(","))
    if args.lasso_T:
        preset["lasso_T"] = tuple(int(float(t)) for t in args.lasso_T.split(","))
    if args.lasso_eps:
        preset["lasso_eps"] = tuple(float(e) for e in args.lasso_eps.split(","))
    if args.lasso_seeds:
        preset["lasso_seeds"] = args.lasso_seeds
    if args.round_size:
        preset["round_size"] = args.round_size
    if args.slope_T:
        preset["slope_T"] = tuple(int(float(t)) for t in args.slope_T.split(","))
        preset["forced_T"] = True
    return preset


def main(argv=None) -> int:
    parser, args = parse_args(argv)
    command = " ".join(["python jobs/reproduce.py", *(sys.argv[1:] if argv is None else argv)])
    preset = preset_of(args)
    papers = args.papers or default_papers_dir()
    if args.paper and not papers.is_dir():
        print(f"reproduce: no papers' text at {papers} (--papers, ${PAPERS_ENV}): the claims' quotes are not checked",
              flush=True)
    try:
        # Curves of at most 200 points per child run: thousands of runs, each logged to MLflow, on a shared machine.
        tracker = Tracker(experiment=args.experiment, tracking_uri=args.tracking_uri, out_dir=args.out,
                          enabled=not args.no_tracking, max_points=args.max_points)
    except TrackingUnavailable as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n(use --no-tracking to keep local results only)\n")
    if args.paper:
        for paper_id in (PAPERS if args.paper == "all" else [args.paper]):
            reproduce_paper(paper_id, preset, tracker, command, quick=args.quick, workers=args.workers, papers=papers)
    if args.batching:
        T, T_others, seeds = args.batch_users, args.batch_users_others, args.batch_seeds
        only = args.batch_algorithms
        price_of_batching(tracker, T, T_others, seeds, f"python jobs/reproduce.py --batching --batch-users {T} "
                          f"--batch-users-others {T_others} --batch-seeds {seeds}"
                          + (f" --batch-algorithms {','.join(only)}" if only else ""), only=only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
