"""``graphkernel flags --from autofuse|mindspore``: an anchor's flag string read key by key.

For each item of the string: what the anchor does with it (by its own grammar: AutoFuse
splits on ``;`` only and needs ``--key=value``; MindSpore splits on spaces, takes ``--key``
for true and keeps the first of a repeated key), and what graphkernel does with it
(``anchors.KEYS``): honoured, mapped to which of its own flags, no effect, or where the two
differ. Then the effective graphkernel configuration the string makes. Neither anchor says
what it ignored; this does.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from graphkernel.anchors import (
    ANCHORS,
    AUTOFUSE,
    AUTOFUSE_DFX,
    AUTOFUSE_GROUPS,
    AUTOFUSE_VOCABULARY,
    HONOURED,
    KEYS,
    NO_EFFECT,
)
from graphkernel.errors import FlagError

OWN = "graphkernel's own"
IGNORED = "ignored by the anchor"


@dataclass
class ItemVerdict:
    """One item of the string."""

    item: str                 # as graphkernel read it: --key=value
    key: str
    verdict: str              # honoured | mapped | no effect | graphkernel's own
    becomes: list[str] = field(default_factory=list)  # the graphkernel flags it sets
    why: str = ""             # what it means in graphkernel (mapped / no effect)
    differs: list[str] = field(default_factory=list)  # where the two readings part


@dataclass
class Translation:
    anchor: str
    sources: list[tuple[str, str]]  # (variable or "argument", the string)
    items: list[ItemVerdict]
    notes: list[str]                # about the string as a whole
    effective: dict[str, Any]       # key -> value of every flag not at its default
    flags: str                      # the same as one graphkernel flag string

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _autofuse_view(text: str) -> dict[str, str]:
    """What AutoFuse's parser reads from ``text``: split on ``;``, each part split on ``=``
    and kept only when that gives exactly two pieces (a bare ``--key`` is dropped)."""
    out = {}
    for part in text.split(";"):
        kv = part.split("=")
        if len(kv) == 2:
            out[kv[0]] = kv[1]
    return out


_MS_BOOLS = {"", "true", "True", "on", "1", "false", "False", "off", "0"}


def _mindspore_view(text: str) -> tuple[dict[str, str], dict[str, list[str]]]:
    """What MindSpore's parser reads from ``text``: split on spaces; ``--key`` (true) or
    ``--key=value`` with one ``=``; a repeated key keeps its first value. Also every value
    each key was given, in order."""
    out: dict[str, str] = {}
    given: dict[str, list[str]] = {}
    for tok in text.split(" "):
        if not tok.startswith("--") or len(tok) <= 2:
            continue
        body = tok[2:]
        if body.count("=") > 1 or body.startswith("="):
            continue
        key, _, value = body.partition("=")
        given.setdefault(key, []).append(value)
        out.setdefault(key, value)
    return out, given


def translate(anchor: str, text: str | None = None,
              env: Mapping[str, str] | None = None) -> Translation:
    """Read ``text`` (or, when None, the anchor's environment variables) as ``anchor`` reads
    it and as graphkernel does."""
    from graphkernel.api import load_config
    from graphkernel.flags import format_value, parse_flag_string

    if anchor not in ANCHORS:
        raise FlagError(f"--from {anchor}: unknown anchor (accepted: {', '.join(ANCHORS)})")
    env = os.environ if env is None else env
    if text is not None:
        sources = [("argument", text)]
    elif anchor == "autofuse":
        sources = [(v, env[v]) for v in (AUTOFUSE_DFX, AUTOFUSE) if env.get(v)]
    else:
        sources = [("MS_DEV_GRAPH_KERNEL_FLAGS", env["MS_DEV_GRAPH_KERNEL_FLAGS"])] \
            if env.get("MS_DEV_GRAPH_KERNEL_FLAGS") else []
    items: list[ItemVerdict] = []
    notes: list[str] = []
    for var, s in sources:
        for it in parse_flag_string(s, f"{var}" if var != "argument" else "explicit"):
            items.append(_verdict(anchor, var, s, it.key, it.value))
    flags = " ".join(f"--{it.key}" + (f"={it.value}" if it.value is not None else "")
                     for _, s in sources for it in parse_flag_string(s, "explicit"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # each item's verdict says it
        cfg = load_config(flags, env={})
    effective = {k: e["value"] for k, e in cfg.to_dict().items()
                 if not e["origin"].startswith("default") and e["value"] != []}
    notes += list(cfg.notes.values())
    notes += _whole_string_notes(anchor, items, cfg)
    flat = " ".join(f"--{k}={format_value(v)}" for k, v in effective.items())
    return Translation(anchor, sources, items, notes, effective, flat)


def _verdict(anchor: str, var: str, text: str, key: str, value: str | None) -> ItemVerdict:
    from graphkernel.flags import SPECS

    item = f"--{key}" + (f"={value}" if value is not None else "")
    known = KEYS.get(key)
    if known is None:
        v = ItemVerdict(item, key, OWN if key in SPECS else "unknown")
        name = "AutoFuse" if anchor == "autofuse" else "MindSpore"
        v.differs.append(f"{name} does not know this key and ignores it; graphkernel "
                         + ("honours it" if key in SPECS else "refuses it (exit 2)"))
        return v
    v = ItemVerdict(item, key, known.verdict, why=known.graphkernel if known.verdict !=
                    HONOURED else "")
    v.becomes = _becomes(key, value)
    if known.differs:
        v.differs.append(known.differs)
    mine = ANCHORS[anchor]
    if not set(known.anchors) & set(mine):
        v.differs.append(f"a key of {', '.join(known.anchors)}, not of "
                         f"{'AutoFuse' if anchor == 'autofuse' else 'MindSpore'}: it ignores "
                         "it; graphkernel reads it from any flag string")
    elif anchor == "autofuse" and var in (AUTOFUSE, AUTOFUSE_DFX) and var not in known.anchors:
        v.differs.append(f"AutoFuse reads this key from {known.anchors[0]} only; in {var} it "
                         "ignores it (graphkernel reads it from either)")
    if anchor == "autofuse":
        seen = _autofuse_view(text)
        if seen.get(f"--{key}") != (value if value is not None else None):
            v.differs.append("AutoFuse does not read this item: it splits the string on ';' "
                             "only and takes --key=value with exactly one '=' (write "
                             f"--{key}={value if value is not None else 'true'}; between "
                             "items)")
    else:
        seen_ms, given = _mindspore_view(text)
        raw = "" if value is None else value
        if key not in seen_ms:
            v.differs.append("MindSpore does not read this item: it splits the string on "
                             "spaces only, and an item with two '=' is dropped")
        elif len(given.get(key, [])) > 1 and seen_ms[key] != raw:
            v.differs.append(f"given more than once: MindSpore keeps the first value "
                             f"({seen_ms[key] or 'true'}), graphkernel the last")
        elif known.kind == "bool" and raw not in _MS_BOOLS and \
                raw.lower() in {"true", "false", "on", "off"}:
            v.differs.append(f"MindSpore does not read the boolean {raw!r} (it takes true, "
                             "True, on, 1, false, False, off, 0) and keeps the default")
    return v


def _becomes(key: str, value: str | None) -> list[str]:
    """The graphkernel flags one item sets, read on its own (AutoFuse's semantics for what a
    string leaves unlisted are a note on the whole string)."""
    from graphkernel.flags import SPECS, FlagItem, _convert, format_value
    from graphkernel.pipeline import name_checker

    if key not in SPECS or key == "path":
        return []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            settings = _convert(FlagItem(key, value, "explicit"), SPECS[key], name_checker(),
                                [])
    except FlagError:
        return []
    return [f"--{k}={format_value(v)}" for k, v in settings]


def _whole_string_notes(anchor: str, items: list[ItemVerdict], cfg: Any) -> list[str]:
    """What the string as a whole means differently to the anchor and to graphkernel."""
    keys = {i.key for i in items}
    notes = []
    if anchor == "autofuse":
        if "--enable_autofuse=true" not in {i.item for i in items}:
            notes.append("without --enable_autofuse=true AutoFuse fuses nothing and ignores "
                         "its other AUTOFUSE_FLAGS keys; graphkernel fuses at opt_level "
                         f"{cfg.opt_level}")
        if keys & AUTOFUSE_VOCABULARY:
            listed = {n for i in items if i.key == "autofuse_enable_pass"
                      for n in (i.item.partition("=")[2].split(","))}
            none = [g for g in listed if g in AUTOFUSE_GROUPS and
                    not AUTOFUSE_GROUPS[g].patterns]
            if none:
                notes.append(f"{', '.join(sorted(none))}: no such fusion in graphkernel "
                             "(accepted, no effect)")
    else:
        if "opt_level" not in keys:
            notes.append("MindSpore's opt_level defaults to 0 (fusion off) unless graph-kernel "
                         "fusion is enabled in its context (then 2); graphkernel's is "
                         f"{cfg.opt_level}")
        if "path" in keys:
            notes.append("with --path MindSpore reads only the file and ignores the rest of "
                         "the string; graphkernel reads the file with file precedence and "
                         "the rest of the string overrides it")
    if any(i.verdict == NO_EFFECT for i in items):
        notes.append("keys marked 'no effect' are accepted (their values checked) and change "
                     "nothing in graphkernel")
    return notes


def format_translation(t: Translation) -> str:
    """The translation as text, one block per item."""
    name = {"autofuse": "AutoFuse", "mindspore": "MindSpore"}[t.anchor]
    lines = []
    if not t.sources:
        env = "AUTOFUSE_FLAGS and AUTOFUSE_DFX_FLAGS are" if t.anchor == "autofuse" else \
            "MS_DEV_GRAPH_KERNEL_FLAGS is"
        lines.append(f"{env} not set: nothing to read (give a string: graphkernel flags "
                     f"--from {t.anchor} \"--key=value ...\")")
    for var, s in t.sources:
        lines.append(f"{name} flags from {var}: {s}")
    width = max((len(i.item) for i in t.items), default=0)
    width = min(width, 48)
    for i in t.items:
        head = i.verdict + (f" to {' '.join(i.becomes)}" if i.verdict == "mapped" and i.becomes
                            else "")
        if i.verdict == NO_EFFECT or (i.verdict == "mapped" and not i.becomes):
            head += f": {i.why}" if i.why else ""
        lines.append(f"  {i.item:<{width}}  {head}")
        for d in i.differs:
            lines.append(f"  {'':<{width}}  differs: {d}")
    for n in t.notes:
        lines.append(f"note: {n}")
    lines.append("effective graphkernel flags (every value not at its default):")
    if t.effective:
        from graphkernel.flags import format_value

        kw = max(len(k) for k in t.effective)
        for k, v in t.effective.items():
            lines.append(f"  {k:<{kw}}  {format_value(v)}")
    else:
        lines.append("  (all defaults)")
    lines.append(f"as one graphkernel flag string: {t.flags or '(empty)'}")
    return "\n".join(lines)
