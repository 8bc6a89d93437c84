"""The surface users see is honest: every flag does something, every command a message or
document suggests exists."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from graphkernel.cli import build_parser
from graphkernel.flags import FlagValues

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [p for d in ("graphkernel", "passes", "expanders", "patterns", "codegen")
           for p in sorted((ROOT / d).rglob("*.py"))]


def _commands() -> set[str]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    names = set(sub.choices)
    for name, p in sub.choices.items():  # nested commands, as in `bisect run`
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                names |= {f"{name} {n}" for n in a.choices}
    return names


def test_every_suggested_command_exists():
    files = [*SOURCES, ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    suggested = {}
    for f in files:
        for m in re.finditer(r"`graphkernel ([a-z][a-z_-]*)", f.read_text()):
            suggested.setdefault(m.group(1), f.relative_to(ROOT))
    assert len(suggested) >= 5, suggested  # the scan found the messages it is meant to check
    missing = {c: str(f) for c, f in suggested.items() if c not in _commands()}
    assert not missing, f"commands suggested but not in the CLI: {missing}"


def test_every_config_key_is_read_outside_the_flag_table():
    """A key that nothing but graphkernel/flags.py mentions cannot change what a run does."""
    text = "\n".join(p.read_text() for p in SOURCES if p.name != "flags.py")
    unread = [k for k in FlagValues.model_fields if not re.search(rf"\b{k}\b", text)]
    assert not unread, f"flags nothing reads: {unread}"
