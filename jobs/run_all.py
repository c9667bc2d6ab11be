#!/usr/bin/env python
"""Run a sweep (algorithms x envs x eps x seeds, from a TOML sweep file) and log it to MLflow.

    python jobs/run_all.py                                   # the preset quick: every algorithm, a few minutes
    python jobs/run_all.py --sweep my-sweep.toml             # a custom sweep (see ldpfed/sweep_spec.py for the keys)
    python jobs/run_all.py --preset example                  # a preset (ldpfed/presets/*.toml)
    python jobs/run_all.py --algorithms ldp-sgd,uniform --eps 0.5,1 --seeds 0-4 --name sgd-vs-uniform
    python jobs/run_all.py --workers 2                       # 2 runs at once, as Ray tasks on a local Ray
    python jobs/run_all.py --address auto                    # on a running Ray cluster, every node (`ray job submit`)

Options given on the command line override the sweep file's keys; the sweep as run is written to the results
folder and the MLflow parent run as `sweep.toml` (rerun it with --sweep). A sweep with overrides but no --name is
named "custom". Each run is one MLflow child run of the sweep's parent run; results are also written under
--out/<name> (a free folder: an earlier sweep's folder is never moved or overwritten; a rerun of the same name
goes to <name>-2, ...). A run that fails is reported and the sweep goes on; the job then exits with status 1.
It ends by printing the results table, the command that opens the MLflow UI and a link to the sweep's runs.
The same as `python -m ldpfed sweep` (ldpfed/sweep_runner.py runs both), with the sweep file as --sweep or --preset.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ldpfed import sweep_spec as sweeps
from ldpfed import sweep_runner
from ldpfed.cli import ExamplesHelp

JOB = sweep_runner.Job(name="run_all", command="python jobs/run_all.py",
                       rerun="python jobs/run_all.py --sweep sweep.toml")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=ExamplesHelp)
    parser.add_argument("--sweep", type=Path, default=None,
                        help="sweep file (TOML); default: the preset named by --preset")
    parser.add_argument("--preset", choices=sorted(sweeps.presets()), default="quick",
                        help="a sweep shipped with ldpfed (ldpfed/presets/), by name (when --sweep is not given)")
    sweeps.add_arguments(parser)
    return parser, parser.parse_args(argv)


def sweep_file(args):
    return args.sweep or sweeps.presets()[args.preset]


def load_sweep(args, resuming: bool = True):
    """The sweep file with the command line's overrides applied, validated; and the file it came from."""
    return sweeps.from_args(args, sweep_file(args), resuming)


def main(argv=None) -> int:
    parser, args = parse_args(argv)
    return sweep_runner.main(parser, args, sweep_file(args), JOB)


if __name__ == "__main__":
    sys.exit(main())
