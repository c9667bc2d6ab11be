"""Reproducing the five papers (jobs/reproduce.py): `papers` what to simulate, `claims` the claims as data with
their tests, `stats` the statistics and tables, `experiments` a paper's run or the price of batching."""
