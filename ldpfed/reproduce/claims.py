"""The papers' claims as data: each `Claim` quotes its paper and names the test that decides it on the runs.

A claim's row of the claims table reads: its text (with "{quote}" replaced by the quoted words, checked against
the paper's text when the papers are at hand: a claim must be quoted, not invented) followed by the tag its test
gives, the measured figures, reproduced or not, and why not. A test is `test(runs, slopes, **args)` yielding
(tag, measured, reproduced, why not) rows; one claim may give several rows (one per eps, per profile, ...).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np

from ldpfed.reproduce.papers import PIECEWISE, SWAP
from ldpfed.reproduce.stats import less, num, spread, values

PAPERS_ENV = "LDPFED_PAPERS"
SEED_FILES = {"000": "000_8e49bbe7304106c3.txt", "001": "001_ef734e0ecc6b6b32.txt",
              "002": "002_4bd54db6dba9a5a7.txt", "003": "003_0e0650e4a805769f.txt",
              "004": "004_b4c4ff454604dde5.txt"}


def default_papers_dir() -> Path:
    """Where the papers' text is read from: $LDPFED_PAPERS, else shared/seeds beside the repository's folder."""
    return Path(os.environ.get(PAPERS_ENV) or Path(__file__).resolve().parents[3] / "shared" / "seeds")


def quote(paper_id: str, needle: str, papers: Path | None = None) -> str:
    """`needle`, once found in the paper's text (KeyError if not). Without the paper's text at hand (no file
    under `papers`, default `default_papers_dir()`), the quote is returned unchecked."""
    path = (papers or default_papers_dir()) / SEED_FILES[paper_id]
    if path.exists() and needle not in path.read_text(errors="replace"):
        raise KeyError(f"paper {paper_id}: quote not found: {needle!r}")
    return needle


class Pick(NamedTuple):
    """Which runs' figures a test compares (`stats.values`; eps and the profile come from the test's loop)."""
    algorithm: str
    env: str | None = None
    label: str | None = None
    column: str = "final_regret"

    def of(self, runs, eps, profile="paper"):
        return values(runs, self.algorithm, eps, profile, column=self.column, env=self.env, label=self.label)


@dataclass(frozen=True)
class Claim:
    paper: str
    text: str                         # as the table shows it; "{quote}" stands for the quoted words
    test: Callable                    # test(runs, slopes, **args) -> rows (tag, measured, reproduced, why not)
    args: dict = field(default_factory=dict)
    quote: str | None = None          # the paper's own words (None: the claim is stated in ours)


# ---- tests ------------------------------------------------------------------------------------------------------

def slope(runs, slopes, algorithm, theory, tol=0.1):
    """The log-log slope of the median final regret over T is at most the theory's exponent + tol."""
    hit = slopes[slopes["algorithm"] == algorithm]
    if not len(hit):
        return
    s, row = float(hit["slope_of_medians"].iloc[0]), hit.iloc[0]
    ok = s <= theory + tol
    yield "", (f"{algorithm}: slope {s:.2f} over T = {row['T']} (per seed {row['per_seed_slopes']}); "
               f"theory {theory:g}"), ok, \
        "" if ok else f"measured growth faster than T^{theory:g} over this range (pre-asymptotic: see text)"


def below(runs, slopes, a, b, tag, measured, why, eps=(1.0,), profiles=("paper",), also=None, skip_empty=True):
    """a below b (`less`: medians ordered, one-sided Mann-Whitney at 5%) per profile and eps. The templates may
    name {a}, {b} and each of `also` (their spreads), {p}, {eps}, {profile}; skip_empty: no row when a or b has
    no runs."""
    for profile in profiles:
        for e in eps:
            va, vb = a.of(runs, e, profile), b.of(runs, e, profile)
            if skip_empty and not (len(va) and len(vb)):
                continue
            ok, p = less(va, vb)
            shown = {"a": spread(va), "b": spread(vb), "p": p, "eps": e, "profile": profile,
                     **{k: spread(pick.of(runs, e, profile)) for k, pick in (also or {}).items()}}
            yield tag.format(**shown), measured.format(**shown), ok, "" if ok else why.format(**shown)


def all_below(runs, slopes, ours, theirs, eps, profiles, where):
    """Every algorithm of `ours` below every one of `theirs`."""
    for profile in profiles:
        for e in eps:
            mine = {a: values(runs, a, e, profile) for a in ours}
            other = {a: values(runs, a, e, profile) for a in theirs}
            if not all(len(v) for v in (*mine.values(), *other.values())):
                continue
            tests = [(o, t, *less(mine[o], other[t])) for o in mine for t in other]
            ok = all(t[2] for t in tests)
            failed = [f"{o} vs {t} (p={p:.2g})" for o, t, good, p in tests if not good]
            shown = "; ".join(f"{a} {spread(v)}" for a, v in {**mine, **other}.items())
            yield f" [{profile}, eps={e:g}, {where}]", shown, ok, "" if ok else "not significantly lower: " + ", ".join(
                failed)


def below_both(runs, slopes, a, b, c, eps):
    """a below b and below c."""
    va, vb, vc = (values(runs, x, eps) for x in (a, b, c))
    ok1, p1 = less(va, vb)
    ok2, p2 = less(va, vc)
    yield (f" [eps={eps:g}, delta=0.1]", f"{a} {spread(va)}; {b} {spread(vb)}; {c} {spread(vc)}", ok1 and ok2,
           "" if ok1 and ok2 else f"p = {p1:.2g} (vs DGS), {p2:.2g} (vs private LinUCB)")


def dgs_below_private(runs, slopes, eps):
    """linucb-dgs below private-linucb; shown with the paper's own (under-noised) Laplace calibration beside."""
    for e in eps:
        d, p_ = values(runs, "linucb-dgs", e), values(runs, "private-linucb", e)
        ok, p = less(d, p_)
        lap = values(runs, "linucb-dgs-paper-laplace", e)
        ok_lap, p_lap = less(lap, p_) if len(lap) else (False, float("nan"))
        yield (f" [eps={e:g}]", f"linucb-dgs {spread(d)}; private-linucb {spread(p_)} (p={p:.2g}); with the "
               f"paper's Laplace calibration (not eps-DP) {spread(lap)} (p={p_lap:.2g})", ok,
               "" if ok else ("the privacy fix: with the paper's under-noised calibration DGS is below" if ok_lap else
                              "DGS is not significantly below private LinUCB on this world, not even with the "
                              "paper's under-noised calibration (see text)"))


def decreasing_in_eps(runs, slopes, algorithm, eps, tag, why, label=None, name_eps=False):
    """The median final regret does not increase with eps."""
    meds = [float(np.median(values(runs, algorithm, e, label=label))) for e in eps]
    ok = all(x >= y for x, y in zip(meds, meds[1:]))
    shown = [f"eps={e:g}: {num(m)}" if name_eps else num(m) for e, m in zip(eps, meds)]
    yield tag, " / ".join(shown), ok, "" if ok else why


def ratio_to_uniform(runs, slopes, algorithms, eps, env, at_most, why):
    """Each algorithm's median final regret at most `at_most` times uniform play's; why: per profile."""
    for profile, why_not in why.items():
        uni = values(runs, "uniform", None, profile, env=env)
        for a in algorithms:
            v = values(runs, a, eps, profile)
            if len(v) and len(uni):
                ratio = float(np.median(v) / np.median(uni))
                ok = ratio <= at_most
                yield (f" [{profile}, eps={eps:g}: {a} at most {at_most:g} of uniform play]",
                       f"{a} {spread(v)}; uniform {spread(uni)}; ratio {ratio:.2f}", ok, "" if ok else why_not)


def within_variance_factor(runs, slopes, private, plain, eps, delta):
    """The LDP bound is the non-private one times (1 + sigma^2/c_r^2), sigma the reward noise std (Gaussian)."""
    for e in eps:
        ldp, base = values(runs, private, e), values(runs, plain, e)
        if len(ldp) and len(base):
            ratio = float(np.median(ldp) / np.median(base))
            sigma = 2 * math.sqrt(2 * math.log(1.25 / delta)) / e
            ok = ratio <= 1 + sigma ** 2
            yield (f" [MAB, UCB black box, eps={e:g}: regret ratio within the variance factor "
                   f"1 + sigma^2/c_r^2 = {1 + sigma ** 2:.0f}]",
                   f"{private} {spread(ldp)}; {plain} {spread(base)}; ratio {ratio:.1f}", ok,
                   "" if ok else "the private UCB pays more than the variance factor")


def support_found(runs, slopes):
    """The smallest (T, eps) of the support grid where at least half the seeds' final support holds the truth."""
    support = runs[runs["part"] == "support"]
    if len(support):
        grid = support.groupby(["users", "eps"])["support_contains"].mean()
        found = [(t, e) for (t, e), frac in grid.items() if frac >= 0.5]
        first = min(found, key=lambda te: (te[0], te[1])) if found else None
        yield ("", "smallest (T, eps) of the grid where >= half the seeds' final support contains the true support: "
               + (f"T = {first[0]:,}, eps = {first[1]:g}" if first else "none in the grid"), bool(found),
               "" if found else "never within the grid (the sparse vector threshold's noise margin dominates)")


def swap_world(runs, slopes, eps):
    """sw-klucb-cf below klucb-cf on the swap world, where never switching arms costs linear regret."""
    for e in eps:
        sw, cf = values(runs, "sw-klucb-cf", e, label=SWAP), values(runs, "klucb-cf", e, label=SWAP)
        swe = values(runs, "sw-klucb-cf-eps", e, label=SWAP)
        if not len(sw):
            continue
        users = int(runs.loc[runs["label"] == SWAP, "users"].iloc[0])
        linear = 0.2 * (users // 2)     # the second half's gap times its users: a learner that never switches
        ok, p = less(sw, cf)
        yield (f" [swap world, eps={e:g}]",
               f"sw-klucb-cf {spread(sw)}; eps-aware window {spread(swe)}; klucb-cf {spread(cf)} (p={p:.2g}); "
               f"never switching costs {num(linear)}", ok,
               "" if ok else "the paper's window is too short for the randomized-response gap at this eps; see "
                             "the eps-aware window")


# ---- the claims ------------------------------------------------------------------------------------------------
BOTH = ("paper", "authors-code")
EPS3 = (0.5, 1.0, 2.0)
ERROR = "final_estimation_error"
VS_UNIFORM = "{a} learns at eps={eps:g} (below uniform play; the paper's contextual algorithms)"
PIECEWISE_MEASURED = "sw-klucb-cf {a}; eps-aware window {swe}; klucb-cf {b} (p={p:.2g})"

CLAIMS = [
    Claim("000", "{quote} (single parameter, no margin)", slope, dict(algorithm="ldp-sgd", theory=0.5),
          quote="Theorem 3.1\t$\\tilde{O}(T^{1/2}/\\varepsilon)$"),
    Claim("000", "(same row, LDP-OLS)", slope, dict(algorithm="ldp-ols", theory=0.5)),
    Claim("000", "{quote}", all_below, dict(ours=("ldp-ols", "ldp-sgd"), theirs=("ldp-ucb", "ldp-gloc"),
                                            eps=(0.5, 1.0), profiles=BOTH, where="single parameter"),
          quote="our methods significantly outperform existing ones in all settings consistently"),
    Claim("000", "{quote}", below, dict(
        a=Pick("ldp-sgd"), b=Pick("ldp-ols"), eps=(0.5,), profiles=BOTH,
        tag=" [{profile}, eps=0.5: LDP-SGD below LDP-OLS]",
        measured="ldp-sgd {a}; ldp-ols {b} (Mann-Whitney p={p:.2g})",
        why="LDP-SGD is not significantly below LDP-OLS at eps = 0.5"),
          quote="LDP-SGD achieves better performance under more stringent privacy requirements"),
    Claim("000", "{quote} (multi-parameter)", ratio_to_uniform, dict(
        algorithms=("ldp-ols-multi", "ldp-sgd-multi"), eps=1.0, env="linear-multi", at_most=0.4,
        why={"paper": "signal-to-noise limit of unit contexts in d = 20 at this T (REPRODUCTION.md, multi parameter)",
             "authors-code": "not at this T (the warm-up alone is 3,000 users)"}),
          quote="Theorem 4.1\t$O((\\log T/\\varepsilon)^2)$"),

    Claim("001", "{quote}", below_both, dict(a="linucb", b="linucb-dgs", c="private-linucb", eps=1.0),
          quote="We observe that the non-private LinUCB performs better than its two private variants"),
    Claim("001", "{quote}", dgs_below_private, dict(eps=EPS3),
          quote="Our private LinUCB-DGS performs much better than private LinUCB"),
    Claim("001", "{quote}", below, dict(
        a=Pick("linucb-dgs", column=ERROR), b=Pick("private-linucb", column=ERROR),
        skip_empty=False, tag=" [final ||theta - theta*||, eps=1]", measured="linucb-dgs {a}; private-linucb {b}",
        why="not significantly smaller (p={p:.2g})"),
          quote="Compared with private LinUCB, our model parameter converges faster"),
    Claim("001", "{quote}", decreasing_in_eps, dict(
        algorithm="linucb-dgs", eps=EPS3, tag=" [linucb-dgs, eps 0.5 / 1 / 2]",
        why="regret is not monotone in eps over seeds (differences within the spread)"),
          quote="Stronger privacy requirement (i.e., a smaller ) requires the privacy mechanism to inject more "
                "noise, which results in larger regret"),

    Claim("002", "{quote} (MP-BCO, two-point, log T: slope ~ 0)", slope,
          dict(algorithm="ldp-bco-two-point", theory=0.0, tol=0.25),
          quote="Strongly Convex\t$\\tilde{O}(\\log T/\\varepsilon^2)$"),
    Claim("002", "{quote} (one-point)", slope, dict(algorithm="ldp-bco-one-point", theory=0.75),
          quote="BCO\tConvex\t$\\tilde{O}(T^{3/4}/\\varepsilon)$"),
    Claim("002", "{quote}", below, dict(
        a=Pick("ldp-bco-two-point"), b=Pick("ldp-bco-one-point"), skip_empty=False, tag=" [eps=1]",
        measured="two-point {a}; one-point {b} (p={p:.2g})", why="not significant"),
          quote="there is also a significant difference about regret bounds between BCO and Multi-Point BCO under "
                "LDP setting"),
    Claim("002", "{quote}", slope, dict(algorithm="ldp-ucb", theory=0.75),
          quote="Contextual Linear Bandits\t\t$\\tilde{O}(T^{3/4}/\\varepsilon)$"),
    Claim("002", "{quote}", slope, dict(algorithm="ldp-gloc", theory=0.75),
          quote="Generalize Linear Bandits\t\t$\\tilde{O}(T^{3/4}/\\varepsilon)$"),
    Claim("002", "{quote}", within_variance_factor, dict(private="ldp-mab-ucb", plain="ucb", eps=(0.5, 1.0),
                                                         delta=0.01),
          quote="Equipped with different non-private algorithms, the utility of our framework can match "
                "corresponding best non-private performances"),
    *(Claim("002", "", below, dict(
        a=Pick(algorithm, env=env), b=Pick("uniform", env=env), eps=(0.5, 1.0),
        tag=VS_UNIFORM.replace("{a}", algorithm), measured=algorithm + " {a}; uniform {b} (p={p:.2g})",
        why="not below uniform play at this T: the T^{{3/4}}/eps regime needs larger T"))
      for env, algorithm in (("linear", "ldp-ucb"), ("logistic", "ldp-gloc"))),

    Claim("003", "{quote} ... achieves regret O(s0^{3/2} log^3 T / eps) under the margin condition (Theorem 2)",
          below, dict(a=Pick("private-lasso"), b=Pick("uniform", env="sparse-linear"), eps=(1.0, 4.0),
                      also={"plain": Pick("lasso-bandit")}, tag=" [eps={eps:g}: learns, i.e. below uniform play]",
                      measured="private-lasso {a}; lasso-bandit {plain}; uniform {b} (p={p:.2g})",
                      why="the private support never contains the true support at this (T, eps): see the support "
                          "table"),
          quote="We then perform privacy and regret analysis of the PrivateLASSO algorithm"),
    Claim("003", "Support recovery: 'the algorithm first estimates the s0-sparse support of theta' (Section 1)",
          support_found),

    Claim("004", "Theorem 1: the regret of SW-KLUCB-CF ... at time T {quote} O~(sum_a sqrt(L_T T) + ...) "
                 "(slope 1/2 in T)", slope, dict(algorithm="sw-klucb-cf", theory=0.5),
          quote="is upper-bounded by"),
    Claim("004", "{quote}: the gap term scales as 1/tanh(eps/2)^2 (regret decreases with eps)", decreasing_in_eps,
          dict(algorithm="sw-klucb-cf", eps=EPS3, label=PIECEWISE, tag="", why="not monotone in eps", name_eps=True),
          quote="Corollary 2"),
    Claim("004", "{quote}... (the window is what handles the changes: SW-KLUCB-CF below the stationary KLUCB-CF on "
                 "a piecewise world)", below, dict(
        a=Pick("sw-klucb-cf", label=PIECEWISE), b=Pick("klucb-cf", label=PIECEWISE), eps=EPS3, skip_empty=False,
        also={"swe": Pick("sw-klucb-cf-eps", label=PIECEWISE)}, tag=" [eps={eps:g}]", measured=PIECEWISE_MEASURED,
        why="the paper's window is too short for the randomized-response gap (tanh(eps/2)); see the eps-aware "
            "window"),
          quote="a naive strategy of restarting an algorithm"),
    Claim("004", "{quote} ... will suffer regret linear in the number of time steps T (KLUCB-CF), SW-KLUCB-CF "
                 "sub-linear", swap_world, dict(eps=EPS3),
          quote="it is easy to construct non-stationary environments for which the algorithms proposed in"),
]


def claim_rows(paper_id: str, runs, slopes, papers: Path | None = None) -> list[dict]:
    """The claims table's rows of one paper, in the order of CLAIMS."""
    rows = []
    for claim in CLAIMS:
        if claim.paper != paper_id:
            continue
        text = claim.text if claim.quote is None else \
            claim.text.replace("{quote}", quote(claim.paper, claim.quote, papers))
        for tag, measured, ok, why in claim.test(runs, slopes, **claim.args):
            rows.append({"claim": text + tag, "measured": measured, "reproduced": "yes" if ok else "no",
                         "why not": why})
    return rows
