"""The results of a sweep as people read them: a table grouped by env, as Markdown and as an HTML report with the
plots, and the numbers derived from it (each run's regret relative to uniform play on the same world).

The table has one row per (env, algorithm, eps) group of seeds: uniform play first (the reference), then the
other non-private algorithms (eps plays no part in them: "-"), then the private ones by eps and median regret.
"regret / uniform" is the group's median final regret divided by the median final regret of uniform play on the
same env and number of users (below 1: the algorithm learned something).
"""
from __future__ import annotations

import base64
import html
import math
from pathlib import Path

import numpy as np
import pandas as pd

def _finished(summary: pd.DataFrame) -> pd.DataFrame:
    if summary.empty or "final_regret" not in summary.columns:
        return summary.iloc[0:0]
    rows = summary if "status" not in summary.columns else summary[summary["status"] == "FINISHED"]
    rows = rows.copy()
    rows["final_regret"] = pd.to_numeric(rows["final_regret"], errors="coerce")
    if "privacy_model" not in rows.columns:
        rows["privacy_model"] = "unknown"
    rows["privacy_model"] = rows["privacy_model"].fillna("unknown").astype(str)
    rows["eps"] = pd.to_numeric(rows["eps"], errors="coerce")
    return rows


def uniform_medians(summary: pd.DataFrame) -> dict:
    """(env, users) -> median final regret of uniform play there."""
    rows = _finished(summary)
    rows = rows[rows["algorithm"] == "uniform"]
    return {(env, int(users)): float(group["final_regret"].median())
            for (env, users), group in rows.groupby(["env", "users"])}


def relative_to_uniform(summary: pd.DataFrame) -> pd.Series:
    """Each run's final regret divided by the median final regret of uniform play on its env and users (NaN when
    the sweep has no uniform run there, or uniform's regret is 0)."""
    reference = uniform_medians(summary)
    values = []
    for _, row in summary.iterrows():
        base = reference.get((row.get("env"), int(row["users"]) if pd.notna(row.get("users")) else None))
        regret = pd.to_numeric(pd.Series([row.get("final_regret")]), errors="coerce").iloc[0]
        values.append(float(regret) / base if base and pd.notna(regret) else np.nan)
    return pd.Series(values, index=summary.index, dtype=float)


def grouped_table(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per (env, algorithm, eps) over the finished seeds, ordered as the module docstring says
    (final_regret_by_seed: the group's final regrets in the order of their seeds)."""
    rows = _finished(summary)
    columns = ["env", "users", "algorithm", "privacy", "eps", "seeds", "median_final_regret", "q25", "q75",
               "regret_vs_uniform", "median_final_estimation_error", "users_per_s", "final_regret_by_seed",
               "round_size", "round_size_caveat"]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    reference = uniform_medians(rows)
    out = []
    keys = ["env", "users", "algorithm", "privacy_model", "eps"]
    for (env, users, algorithm, privacy, eps), group in rows.groupby(keys, dropna=False, sort=False):
        regret = group["final_regret"]
        by_seed = tuple(group.sort_values("seed")["final_regret"]) if "seed" in group.columns else ()
        base = reference.get((env, int(users)))
        error = pd.to_numeric(group.get("final_estimation_error", pd.Series(dtype=float)), errors="coerce")
        rate = pd.to_numeric(group.get("users_per_s", pd.Series(dtype=float)), errors="coerce")
        out.append({"env": env, "users": int(users), "algorithm": algorithm, "privacy": privacy,
                    "eps": float(eps) if pd.notna(eps) else np.nan, "seeds": len(group),
                    "median_final_regret": float(regret.median()), "q25": float(regret.quantile(0.25)),
                    "q75": float(regret.quantile(0.75)),
                    "regret_vs_uniform": float(regret.median()) / base if base else np.nan,
                    "median_final_estimation_error": float(error.median()) if error.notna().any() else np.nan,
                    "users_per_s": float(rate.median()) if rate.notna().any() else np.nan,
                    "final_regret_by_seed": by_seed, "round_size": _round_size(group),
                    "round_size_caveat": _first_text(group, "round_size_caveat")})
    table = pd.DataFrame(out, columns=columns)
    table["_rank"] = [0 if a == "uniform" else (1 if p == "none" else 2)
                      for a, p in zip(table["algorithm"], table["privacy"])]
    table = table.sort_values(["env", "users", "_rank", "eps", "median_final_regret"], na_position="first",
                              kind="stable")
    return table.drop(columns="_rank").reset_index(drop=True)


def _round_size(group: pd.DataFrame) -> int | None:
    sizes = pd.to_numeric(group.get("round_size", pd.Series(dtype=float)), errors="coerce").dropna()
    return int(sizes.max()) if len(sizes) else None


def section_title(env, users: int, block: pd.DataFrame) -> str:
    """An env's section: "linear (T = 10,000 users, rounds of 500)" (the round sizes its rows ran at)."""
    sizes = sorted({int(b) for b in block.get("round_size", pd.Series(dtype=float)).dropna()})
    rounds = "" if not sizes else f", rounds of {' and '.join(f'{b:,}' for b in sizes)}"
    return f"{env} (T = {users:,} users{rounds})"


def _first_text(group: pd.DataFrame, column: str) -> str | None:
    values = [v for v in group.get(column, pd.Series(dtype=object)) if isinstance(v, str) and v]
    return values[0] if values else None


# A private group this close to uniform play's regret, or above it, gets a note saying so
NEAR_UNIFORM = 0.95


def notes(block: pd.DataFrame) -> list[str]:
    """What a reader of one env's rows (`grouped_table`) should know before comparing them: first what the round
    size does to an algorithm that says so (`Algorithm.round_size_caveat`, which then explains its rows), then,
    read off the numbers, private groups no better than uniform play and algorithms whose runs came out the same,
    seed for seed, at every eps (their decisions did not change with eps at this number of users)."""
    out = []
    caveats = block.get("round_size_caveat", pd.Series(None, index=block.index, dtype=object))
    caveated = set()
    for algorithm, caveat in zip(block["algorithm"], caveats):
        if isinstance(caveat, str) and caveat and algorithm not in caveated:
            caveated.add(algorithm)
            out.append(f"{algorithm}: {caveat}.")
    private = block[block["eps"].notna() & ~block["algorithm"].isin(caveated)]
    references = block[block["eps"].isna() & (block["algorithm"] != "uniform")]
    best = references.loc[references["regret_vs_uniform"].idxmin()] if references["regret_vs_uniform"].notna().any() \
        else None
    for algorithm, rows in private.groupby("algorithm", sort=False):
        close = rows[rows["regret_vs_uniform"] >= NEAR_UNIFORM]
        if len(close):
            users = int(rows["users"].iloc[0])
            said = (f"{algorithm} at eps {', '.join(f'{e:g}' for e in close['eps'])}: regret "
                    f"{', '.join(f'{v:.3f}' for v in close['regret_vs_uniform'])} of uniform play's.")
            if best is not None and best["regret_vs_uniform"] >= NEAR_UNIFORM:
                said += (f" So is the best non-private algorithm here ({best['algorithm']}, "
                         f"{best['regret_vs_uniform']:.3f}): at {users:,} users no algorithm separates from "
                         f"guessing on this world.")
            elif best is not None:
                said += (f" The best non-private algorithm here reaches {best['regret_vs_uniform']:.3f} "
                         f"({best['algorithm']}): at {users:,} users the privacy noise outweighs what it learned; "
                         f"more users or a larger eps separate it from guessing.")
            else:
                said += f" At {users:,} users it does not separate from guessing."
            out.append(said)
        seeds = rows["final_regret_by_seed"].tolist()
        if len(rows) > 1 and seeds[0] and all(s == seeds[0] for s in seeds[1:]):
            out.append(f"{algorithm}: the same final regret, seed for seed, at every eps "
                       f"({', '.join(f'{e:g}' for e in rows['eps'])}): at this number of users and rounds its "
                       f"decisions did not change with eps.")
    return out


def _num(value, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:,.{digits}f}"


def _rows(table: pd.DataFrame) -> list[list[str]]:
    rows = []
    for r in table.itertuples(index=False):
        rows.append([r.algorithm, r.privacy, "-" if not math.isfinite(r.eps) else f"{r.eps:g}", str(r.seeds),
                     _num(r.median_final_regret), f"{_num(r.q25)} - {_num(r.q75)}",
                     "1 (reference)" if r.algorithm == "uniform" else _num(r.regret_vs_uniform, 3),
                     _num(r.median_final_estimation_error, 4), _num(r.users_per_s, 0)])
    return rows


HEADER = ["algorithm", "privacy", "eps", "seeds", "median final regret", "25%-75%", "regret / uniform",
          "final est. error", "users/s"]


def markdown_table(summary: pd.DataFrame) -> str:
    """The grouped table as Markdown: a section per env (and number of users T), uniform first."""
    table = grouped_table(summary)
    if table.empty:
        return "(no run finished)"
    parts = []
    for (env, users), block in table.groupby(["env", "users"], sort=False):
        parts.append(f"### {section_title(env, users, block)}\n")
        parts.append("| " + " | ".join(HEADER) + " |")
        parts.append("|" + "---|" * len(HEADER))
        parts += ["| " + " | ".join(row) + " |" for row in _rows(block)]
        parts.append("")
        said = notes(block)
        parts += [f"* {note}" for note in said] + ([""] if said else [])
    parts.append("Median and 25%-75% quantiles over seeds of the final cumulative regret; regret / uniform: the "
                 "median divided by uniform play's median on the same env (below 1: better than guessing); eps "
                 "\"-\": not private, run once per seed.")
    return "\n".join(parts)


def html_report(title: str, description: str, summary: pd.DataFrame, plots: list[Path]) -> str:
    """A self-contained HTML page: the description, the grouped table per env and the plots (embedded PNGs), so
    MLflow's artifact viewer shows it as is."""
    table = grouped_table(summary)
    body = [f"<h1>{html.escape(title)}</h1>", f"<p>{html.escape(description)}</p>"]
    for (env, users), block in table.groupby(["env", "users"], sort=False):
        body.append(f"<h2>{html.escape(section_title(env, users, block))}</h2><table><tr>"
                    + "".join(f"<th>{html.escape(h)}</th>" for h in HEADER) + "</tr>")
        for row, algorithm in zip(_rows(block), block["algorithm"]):
            style = ' class="ref"' if algorithm == "uniform" else ""
            body.append(f"<tr{style}>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>")
        body.append("</table>")
        said = notes(block)
        if said:
            body.append("<ul>" + "".join(f"<li>{html.escape(note)}</li>" for note in said) + "</ul>")
    if table.empty:
        body.append("<p>(no run finished)</p>")
    for path in plots:
        data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
        body.append(f"<h2>{html.escape(Path(path).stem.replace('_', ' '))}</h2>"
                    f'<img alt="{html.escape(Path(path).name)}" src="data:image/png;base64,{data}">')
    style = ("body{font-family:sans-serif;font-size:13px;margin:1em;color:#222}h1{font-size:20px}"
             "h2{font-size:16px;margin:1.2em 0 .4em}table{border-collapse:collapse;margin-bottom:1em}"
             "td,th{border:1px solid #ccc;padding:2px 7px;text-align:right;white-space:nowrap}"
             "td:first-child,th:first-child,td:nth-child(2){text-align:left}th{background:#f4f4f4}"
             "tr.ref{background:#eee}img{max-width:100%}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>")
