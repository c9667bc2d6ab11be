#!/usr/bin/env python3
"""Writes docs/api.md, the reference of ldpfed's public API, from the code's own signatures and docstrings, so the
page cannot drift from the code: a test (tests/test_api_reference.py) fails when the page differs from what this
writes.

    python jobs/api_reference.py            # (re)write docs/api.md
    python jobs/api_reference.py --check    # exit 1 if docs/api.md is not what the code gives

What is listed, and in which order, is PAGES below: the contract an algorithm or env plugin implements, what it is
given (the public world, fields, options, domains, mechanisms, the trust model's noise) and the calls a user makes
(run, check_algorithm, check_env). A class shows its docstring and the public methods it defines itself (an
inherited method is listed under the class that defines it).
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "api.md"

# (section, intro, [dotted names])
PAGES = [
    ("Algorithms: the contract a plugin implements",
     "An algorithm is a subclass of `Algorithm` (or of `CompiledAlgorithm`, for the fast paths); its messages are "
     "declared as `Field`s, its options as `Option`s. [writing-an-algorithm.md](writing-an-algorithm.md) walks "
     "through an example.",
     ["ldpfed.algorithms.base.Algorithm", "ldpfed.algorithms.compiled.CompiledAlgorithm",
      "ldpfed.algorithms.compiled.Steps", "ldpfed.algorithms.fields.Field", "ldpfed.util.options.Option"]),
    ("The world an algorithm sees",
     "An algorithm is built on a `PublicWorld` (never the env): sizes and public bounds. An env plugin subclasses "
     "`Env`: [writing-an-env.md](writing-an-env.md) walks through an example.",
     ["ldpfed.envs.base.PublicWorld", "ldpfed.envs.base.Env", "ldpfed.envs.base.EnvSteps",
      "ldpfed.envs.build_env"]),
    ("Mechanisms and domains",
     "Every mechanism carries its guarantee; `Domain` is what the server checks a message field against.",
     ["ldpfed.mechanisms.protocol.Mechanism", "ldpfed.mechanisms.guarantee.Guarantee",
      "ldpfed.mechanisms.domains.Domain", "ldpfed.mechanisms.gaussian.GaussianMechanism",
      "ldpfed.mechanisms.gaussian.SymmetricGaussianMechanism", "ldpfed.mechanisms.laplace.LaplaceMechanism",
      "ldpfed.mechanisms.l2ball.L2BallMechanism", "ldpfed.mechanisms.rr.RandomizedResponse",
      "ldpfed.mechanisms.tree.TreeMechanism"]),
    ("Trust models",
     "Where the noise is added and what the server sees: [trust-models.md](trust-models.md).",
     ["ldpfed.trust.TrustModel", "ldpfed.trust.FieldNoise"]),
    ("Federation models",
     "Which of a round's users take part: [federation.md](federation.md).",
     ["ldpfed.federation.Federation"]),
    ("Running and checking",
     "A run's configuration, the call that runs it, and the conformance kits a plugin's tests call.",
     ["ldpfed.config.RunConfig", "ldpfed.engine.run", "ldpfed.testing.check_algorithm",
      "ldpfed.testing.ConformanceError", "ldpfed.testing.CHECKS", "ldpfed.testing.check_env",
      "ldpfed.testing.EnvConformanceError", "ldpfed.testing.ENV_CHECKS"]),
]


def resolve(dotted: str):
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def signature(obj) -> str:
    """The signature as text, without what changes from one process to the next (addresses of defaults)."""
    try:
        text = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"
    text = re.sub(r"CPUDispatcher\(<function (\w+) at 0x[0-9a-f]+>\)", r"\1", text)
    text = re.sub(r"<function (\w+) at 0x[0-9a-f]+>", r"\1", text)
    return re.sub(r"ForwardRef\('([^']*)'\)", r"\1", text)


def doc_block(obj) -> list[str]:
    doc = inspect.getdoc(obj)
    return ["```text", doc, "```", ""] if doc else ["(no docstring)", ""]


def own_methods(cls) -> list[tuple[str, object]]:
    """Public methods and properties cls defines itself, in definition order (inherited ones are listed under
    the base class that defines them)."""
    out = []
    for name, member in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(member, (staticmethod, classmethod)):
            member = member.__func__
        if inspect.isfunction(member) or isinstance(member, property):
            out.append((name, member))
    return out


def entry(dotted: str) -> list[str]:
    obj = resolve(dotted)
    short = dotted.rsplit(".", 1)[1]
    source = inspect.getsourcefile(obj) if (inspect.isclass(obj) or inspect.isfunction(obj)) else None
    where = f", in `{Path(source).relative_to(ROOT).as_posix()}`" if source else ""
    if inspect.isclass(obj):
        lines = [f"### `{short}`", "", f"`{dotted}{signature(obj)}`{where}", ""] + doc_block(obj)
        for name, member in own_methods(obj):
            if isinstance(member, property):
                lines += [f"* **`{name}`** (property)"]
                doc = inspect.getdoc(member)
            else:
                lines += [f"* **`{name}{signature(member)}`**"]
                doc = inspect.getdoc(member)
            if doc:
                lines += ["", "  ```text", *(f"  {line}" if line else "" for line in doc.splitlines()), "  ```"]
            lines.append("")
        return lines
    if callable(obj):
        return [f"### `{short}`", "", f"`{dotted}{signature(obj)}`{where}", ""] + doc_block(obj)
    return [f"### `{short}`", "", f"`{dotted} = {obj!r}`", ""]


def render() -> str:
    lines = ["# API reference", "",
             "Generated from the code's signatures and docstrings by `python jobs/api_reference.py`; a test fails "
             "when this page and the code differ. The guides: [writing-an-algorithm.md](writing-an-algorithm.md), "
             "[trust-models.md](trust-models.md), [architecture.md](architecture.md).", ""]
    for title, intro, names in PAGES:
        lines += [f"* [{title}](#{anchor(title)})"]
    lines.append("")
    for title, intro, names in PAGES:
        lines += [f"## {title}", "", intro, ""]
        for dotted in names:
            lines += entry(dotted)
    return "\n".join(line.rstrip() for line in lines).rstrip() + "\n"


def anchor(title: str) -> str:
    return "".join(c for c in title.lower().replace(" ", "-") if c.isalnum() or c == "-")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page differs from the code's")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not PAGE.exists() or PAGE.read_text() != text:
            print(f"{PAGE.relative_to(ROOT)} differs from the code's docstrings: run python jobs/api_reference.py",
                  file=sys.stderr)
            return 1
        print(f"{PAGE.relative_to(ROOT)} matches the code")
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
