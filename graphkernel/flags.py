"""Flags: grammar, config files, environment, precedence, and the effective configuration.

Sources, lowest to highest precedence:

1. built-in defaults (several depend on ``opt_level``);
2. config files: ``--path=FILE`` inside any flag string, ``--config FILE`` on the CLI,
   ``config=`` in the API (JSON or YAML; keys are flag names without ``--``);
3. the environment: ``AUTOFUSE_DFX_FLAGS``, then ``AUTOFUSE_FLAGS``
   (``MS_DEV_GRAPH_KERNEL_FLAGS`` when ``AUTOFUSE_FLAGS`` is unset);
4. explicit flags: ``--flags "..."`` on the CLI, ``flags=`` in the API.

Within the resolution, list keys accumulate and a repeated scalar key keeps the
last value (with a warning when a single source repeats it). A name in an enable list
and in its disable list is settled by precedence too: the higher source wins for that
name (``--enable_pass=cse`` given explicitly overrides ``--disable_pass=cse`` from
``AUTOFUSE_FLAGS``); the same name in both lists of one source is an error. The effective
configuration records where every value came from, like ``git config --show-origin``;
a default that depends on ``opt_level`` reads ``default@opt2``.
"""

from __future__ import annotations

import configparser
import os
import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from graphkernel import limits
from graphkernel.anchors import (
    ALWAYS_PROMOTED,
    ASCIR_OPS,
    AUTOFUSE_GROUPS,
    AUTOFUSE_VOCABULARY,
    KEYS,
    no_effect_keys,
)
from graphkernel.errors import ConfigError, FlagError, did_you_mean
from graphkernel.fileio import DocumentError, read_bounded, read_document


class FlagWarning(UserWarning):
    """A flag note (no-effect compatibility flag, a value given twice); also kept in
    ``Config.warnings`` so that front ends can print it their own way."""

ENV_VARS = ("AUTOFUSE_DFX_FLAGS", "AUTOFUSE_FLAGS")
MS_ENV_VAR = "MS_DEV_GRAPH_KERNEL_FLAGS"
DEFAULT_TARGET = "ascend910b"


def target_names() -> tuple[str, ...]:
    """The targets there are: the spec files of the code generator (asked when a value is
    checked, so the flags do not import the backend)."""
    from graphkernel.codegen.targets import available

    return tuple(available())


_KEY = re.compile(r"^[a-z0-9_]+$")


class FlagValues(BaseModel):
    """Every flag with its type and range as given. ``None`` means "the opt_level default"
    (``FlagSpec.level``) or "the target's cap" (``FlagSpec.cap``); ``Config`` answers with
    the value in effect."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    opt_level: int = Field(2, ge=0, le=3)
    enable_pass: list[str] = []
    disable_pass: list[str] = []
    enable_expand_ops: list[str] = []
    disable_expand_ops: list[str] = []
    enable_expand_ops_only: list[str] = []
    enable_cluster_ops: list[str] = []
    disable_cluster_ops: list[str] = []
    enable_cluster_ops_only: list[str] = []
    disable_fusion_pattern: list[str] = []
    enable_fusion_pattern_only: list[str] = []
    enable_fusion_pattern: list[str] = []  # AutoFuse's autofuse_enable_pass lands here
    composite_op_limit_size: int | None = Field(None, ge=0)  # None: the target's cap
    max_kernel_inputs: int | None = Field(None, ge=0)  # None: the target's cap
    peak_memory_growth: int = Field(-1, ge=-1)
    conv_panel_growth: int = Field(5, ge=-1)
    reduce_fuse_depth: int = Field(10, ge=1)
    broadcast_fuse_depth: int = Field(6, ge=1)
    enable_recompute_fusion: bool | None = None
    enable_parallel_fusion: bool | None = None
    enable_matmul_group: bool | None = None
    enable_single_node_fusion: bool = False
    enable_super_kernel: bool | None = None
    super_kernel_scope: list[str] = []
    enable_low_precision: bool = False
    precision_blacklist: list[str] = []
    precision_blacklist_kernels: list[str] = []  # AutoFuse's: whole kernels of listed ops
    recompute_max_consumers: int = Field(-1, ge=-1)
    target: str = DEFAULT_TARGET
    disable_fallback: bool = False
    dump_as_text: bool = False
    debug_dir: str = "./graph_kernel_dump"
    bisect_limit: int = Field(-1, ge=-1)
    bisect_pass: str = ""
    print_bisect: bool = False
    keep_codegen_project: bool = False
    dump_kernel_graphs: bool = False
    replace_kernel: str = ""
    skip_node_names: list[str] = []
    skip_node_types: list[str] = []


@dataclass(frozen=True)
class FlagSpec:
    """How a key's string value is read, and what it means."""

    kind: str  # int | bool | list | str | choice
    doc: str
    names: str = ""  # what a list names: pass | pattern | op | expand_op
    choices: tuple[str, ...] | Callable[[], tuple[str, ...]] = ()  # (or asked when needed)
    level: int | None = None  # a bool whose default is "opt_level >= level"
    cap: str = ""  # an int whose default is the target's fusion cap of this name

    def options(self) -> tuple[str, ...]:
        """The values a choice accepts."""
        return self.choices() if callable(self.choices) else self.choices


SPECS: dict[str, FlagSpec] = {
    "opt_level": FlagSpec("int", "0: fusion off; 1: expanders + basic fusion; 2: + simplification, "
                                 "recompute, mixed precision; 3: + experimental fusions"),
    "enable_pass": FlagSpec("list", "force on passes their level would skip (selectors)", "pass"),
    "disable_pass": FlagSpec("list", "turn off passes (selectors: name, stage.name, S.P, name:N)",
                             "pass"),
    "enable_expand_ops": FlagSpec("list", "also expand these composite ops", "expand_op"),
    "disable_expand_ops": FlagSpec("list", "do not expand these composite ops", "expand_op"),
    "enable_expand_ops_only": FlagSpec("list", "expand exactly these ops (replaces the default "
                                               "list; the other two are ignored)", "expand_op"),
    "enable_cluster_ops": FlagSpec("list", "also allow these ops in fused kernels", "op"),
    "disable_cluster_ops": FlagSpec("list", "keep these ops out of fused kernels", "op"),
    "enable_cluster_ops_only": FlagSpec("list", "allow exactly these ops in fused kernels", "op"),
    "disable_fusion_pattern": FlagSpec("list", "turn off fusion patterns (exact names, prefix*)",
                                       "pattern"),
    "enable_fusion_pattern_only": FlagSpec("list", "run only these fusion patterns", "pattern"),
    "enable_fusion_pattern": FlagSpec("list", "run these fusion patterns whatever their level",
                                      "pattern"),
    "composite_op_limit_size": FlagSpec("int", "most ops in one fused kernel (0: no fusion)",
                                        cap="ops"),
    "max_kernel_inputs": FlagSpec("int", "most inputs of one fused kernel (0: no cap)",
                                  cap="inputs"),
    "peak_memory_growth": FlagSpec("int", "percent a fusion that keeps a tensor alive longer "
                                          "may raise the estimated peak of live memory by (-1: "
                                          "no guard, AutoFuse's default)"),
    "conv_panel_growth": FlagSpec("int", "percent more GM bytes a convolution joined with its "
                                         "epilogue (conv_fusion: an im2col panel written and "
                                         "read back) may move than the two apart (-1: no "
                                         "bound)"),
    "reduce_fuse_depth": FlagSpec("int", "size limit of reduce_fwd patterns"),
    "broadcast_fuse_depth": FlagSpec("int", "size limit of elemwise_broadcast_bwd patterns"),
    "enable_recompute_fusion": FlagSpec("bool", "duplicate cheap producers into consumers",
                                        level=2),
    "enable_parallel_fusion": FlagSpec("bool", "merge independent kernels sharing inputs "
                                               "(horizontal fusion)", level=3),
    "enable_matmul_group": FlagSpec("bool", "run independent products of one operand "
                                            "as one kernel (horizontal matmul fusion)",
                                    level=2),
    "enable_single_node_fusion": FlagSpec("bool", "a lone vector op still becomes a kernel"),
    "enable_super_kernel": FlagSpec("bool", "merge kernels of a scope into one launch",
                                    level=3),
    "super_kernel_scope": FlagSpec("list", "node-name prefixes or globs of SuperKernel scopes"),
    "enable_low_precision": FlagSpec("bool", "compute fp16/bf16 inside kernels"),
    "precision_blacklist": FlagSpec("list", "ops that compute in fp16/bf16 while the rest of "
                                            "their kernel is promoted to fp32 (all: every op)",
                                    "precision_op"),
    "precision_blacklist_kernels": FlagSpec("list", "a kernel whose ops are all listed stays "
                                                    "in fp16/bf16 (all: every op)",
                                            "precision_op"),
    "recompute_max_consumers": FlagSpec("int", "recompute a producer into at most this many "
                                               "consumer kernels (-1: any number)"),
    "target": FlagSpec("choice", "the Ascend target spec", choices=target_names),
    "disable_fallback": FlagSpec("bool", "a cluster codegen cannot handle is an error"),
    "skip_node_names": FlagSpec("list", "nodes never fused (names, or names of your nodes "
                                        "they came from)"),
    "skip_node_types": FlagSpec("list", "ops never fused", "op"),
    "dump_as_text": FlagSpec("bool", "dump IR after every pass, cluster report and kernels"),
    "debug_dir": FlagSpec("str", "where dumps go"),
    "keep_codegen_project": FlagSpec("bool", "also write the kernel project (kernels/, "
                                             "manifest.json) into the dump folder"),
    "dump_kernel_graphs": FlagSpec("bool", "write each kernel's body as a graph file "
                                           "(debug_dir/kernel_graphs/, runnable with "
                                           "`graphkernel run`)"),
    "replace_kernel": FlagSpec("str", "a folder of hand-edited kernel/tiling sources that "
                                      "replace the generated ones of the same file name, "
                                      "each checked in the simulator first"),
    "bisect_limit": FlagSpec("int", "run only the first N rewrite applications (-1: all)"),
    "print_bisect": FlagSpec("bool", "print BISECT: running|NOT running (N) lines"),
    "bisect_pass": FlagSpec("str", "number (and limit) only this pass's applications; the other "
                                   "passes run in full (graphkernel bisect uses it)"),
    "path": FlagSpec("str", "a config file (JSON or YAML) read with file precedence"),
    # the anchors' keys that map onto the keys above (anchors.KEYS says what each does there)
    "enable_autofuse": FlagSpec("bool", "AutoFuse: false -> opt_level 0"),
    "autofuse_enable_pass": FlagSpec("list", "AutoFuse: turn on these extended fusions ("
                                             + "/".join(AUTOFUSE_GROUPS) + ")", "autofuse"),
    "autofuse_disable_pass": FlagSpec("list", "AutoFuse: turn off these extended fusions",
                                      "autofuse"),
    "autofuse_enhance_precision_blacklist": FlagSpec(
        "list", "AutoFuse: a kernel whose ops are all listed stays in fp16/bf16 (AscIR names "
                "such as Le, Sum accepted; all: every op) -> precision_blacklist_kernels",
        "ascir_op"),
    "recomputation_threshold": FlagSpec("int", "AutoFuse: 0..255 -> recompute_max_consumers"),
    "max_fusion_size": FlagSpec("int", "AutoFuse: -> composite_op_limit_size (0: no fusion)"),
    "codegen_compile_debug": FlagSpec("bool", "AutoFuse: -> keep_codegen_project"),
    "disable_lifting": FlagSpec("bool", "AutoFuse: -> enable_single_node_fusion"),
    "subgraph_recover": FlagSpec("bool", "AutoFuse: -> dump_kernel_graphs"),
    "skip_node_names_cfg": FlagSpec("str", "AutoFuse: .ini with [ByNodeName]/[ByNodeType] "
                                           "sections of nodes never fused"),
    "enable_horizontal_fusion": FlagSpec("bool", "MindSpore: -> enable_parallel_fusion"),
    "disable_matmul_post_fusion": FlagSpec("bool", "MindSpore: -> disable_fusion_pattern="
                                                   "matmul_depth"),
}

# Keys of MindSpore or AutoFuse that graphkernel does not model: accepted (their values
# checked) with a warning that they have no effect (anchors.KEYS says why, key by key).
COMPAT_NO_EFFECT = no_effect_keys()

# Fusion caps per target (AutoFuse's defaults: at most 8 inputs per fused kernel and 64 ops;
# the same on every target graphkernel knows today). A target missing here takes DEFAULT_CAPS.
DEFAULT_CAPS = {"inputs": 8, "ops": 64}
TARGET_CAPS: dict[str, dict[str, int]] = {}


def target_cap(target: str, cap: str) -> int:
    """The fusion cap ``cap`` (inputs | ops) of ``target``."""
    return TARGET_CAPS.get(target, DEFAULT_CAPS)[cap]


_TRUE = {"true", "on", "1"}
_FALSE = {"false", "off", "0"}


# ------------------------------------------------------------------ grammar
@dataclass(frozen=True)
class FlagItem:
    key: str
    value: str | None  # None for a bare ``--key``
    origin: str


def parse_flag_string(text: str, origin: str) -> list[FlagItem]:
    """Split ``"--a=1 --b;--c=x,y"`` into items. Separators: whitespace and ``;``."""
    if len(text) > limits.MAX_FLAG_STRING:
        raise FlagError(f"{origin}: the flag string is {len(text):,} characters long, above the "
                        f"limit of {limits.MAX_FLAG_STRING:,}")
    items = []
    for token in re.split(r"[\s;]+", text.strip()):
        if not token:
            continue
        if not token.startswith("--"):
            raise FlagError(f"{origin}: malformed flag {_short(token)!r}: expected --key=value "
                            "or --key")
        body = token[2:]
        key, eq, value = body.partition("=")
        if not _KEY.fullmatch(key):
            raise FlagError(f"{origin}: malformed flag key {_short(key)!r} in {_short(token)!r}: "
                            "keys are lowercase letters, digits and '_'")
        _check_length(key, value, origin)
        items.append(FlagItem(key, value if eq else None, origin))
    return items


def _short(text: str, n: int = 60) -> str:
    """A long value cut for a message (the message names it; it need not repeat it whole)."""
    return text if len(text) <= n else text[:n] + f"...({len(text):,} characters)"


def _check_length(key: str, value: Any, origin: str) -> None:
    parts = value if isinstance(value, list) else [value]
    size = sum(len(str(p)) for p in parts if p is not None)
    if size > limits.MAX_FLAG_VALUE:
        raise FlagError(f"{origin}: --{key}: the value is {size:,} characters long, above the "
                        f"limit of {limits.MAX_FLAG_VALUE:,}")


def parse_bool(key: str, raw: str | None, origin: str) -> bool:
    if raw is None:
        return True
    v = raw.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise FlagError(f"{origin}: --{key}={raw}: not a boolean (accepted: true/false, on/off, "
                    "1/0, any case)")


def parse_int(key: str, raw: str | None, origin: str) -> int:
    digits = limits.MAX_INT_DIGITS
    if raw is None or not re.fullmatch(rf"\s*[+-]?[0-9]{{1,{digits}}}\s*", raw):
        raise FlagError(f"{origin}: --{key}={_short(raw) if raw is not None else ''}: not an "
                        f"integer (at most {digits} digits)")
    return int(raw)


def parse_list(key: str, raw: Any, origin: str) -> list[str]:
    if isinstance(raw, list):
        parts = [str(p).strip() for p in raw]
    elif raw is None:
        raise FlagError(f"{origin}: --{key} needs a value: a comma-separated list")
    else:
        parts = [p.strip() for p in str(raw).split(",")]
    if any(not p for p in parts):
        raise FlagError(f"{origin}: --{key}={raw}: empty item in list (write a,b,c without "
                        "empty entries)")
    return parts


# ------------------------------------------------------------------ sources
def read_config_file(path: str | os.PathLike, origin: str) -> list[FlagItem]:
    """A JSON or YAML mapping of flag names (without --) to values."""
    p = Path(path)
    try:
        doc = read_document(p, limits.MAX_FLAGS_FILE_BYTES)
    except FileNotFoundError:
        raise ConfigError(f"{origin}: config file {str(p)!r} does not exist") from None
    except OSError as e:
        raise ConfigError(f"{origin}: config file {str(p)!r} cannot be read: "
                          f"{e.strerror or e}") from None
    except DocumentError as e:
        what = f"not valid {'JSON' if p.suffix == '.json' else 'YAML'}" if e.syntax \
            else "refused"
        raise ConfigError(f"{p}{e.pos}: {what}: {e.detail}") from None
    if doc is None:
        return []
    if not isinstance(doc, dict):
        raise ConfigError(f"{p}: expected a mapping of flag names to values, got "
                          f"{type(doc).__name__}")
    items = []
    src = f"file {p}"
    for key, value in doc.items():
        key = str(key).lstrip("-")
        if key == "path":  # (was ignored: a file pointing at another file is not followed)
            raise ConfigError(f"{p}: key 'path': a flags file may not name another flags file; "
                              "give that file with --config, or --path=FILE in --flags or "
                              "AUTOFUSE_FLAGS")
        if isinstance(value, bool):
            raw: Any = "true" if value else "false"
        elif isinstance(value, int | float | str):
            raw = str(value)
        elif isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
            raw = [str(v) for v in value]
        else:
            raise ConfigError(f"{p}: key {key!r}: value {_short(repr(value))} must be a string, "
                              "number, boolean or list")
        _check_length(key, raw, src)
        items.append(FlagItem(key, raw, src))
    return items


def read_skip_file(path: str, origin: str, follow_links: bool = True
                   ) -> tuple[list[str], list[str]]:
    """AutoFuse's skip list: an .ini with [ByNodeName] and [ByNodeType] sections (a regular
    file; with ``follow_links=False``, as for a list a flags file names, not a link)."""
    cp = configparser.ConfigParser(allow_no_value=True, delimiters=("=",))
    cp.optionxform = str  # node names are case-sensitive
    try:
        cp.read_string(read_bounded(path, limits.MAX_FLAGS_FILE_BYTES,
                                    follow_links=follow_links).decode(), path)
    except FileNotFoundError:
        raise FlagError(f"{origin}: --skip_node_names_cfg={path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise FlagError(f"{origin}: --skip_node_names_cfg={path}: cannot be read: "
                        f"{getattr(e, 'strerror', None) or e}") from None
    except configparser.Error as e:
        raise FlagError(f"{origin}: {path}: malformed skip list ({e.message.splitlines()[0]}); "
                        "expected [ByNodeName] and [ByNodeType] sections, one name per line"
                        ) from None
    unknown = [s for s in cp.sections() if s not in ("ByNodeName", "ByNodeType")]
    if unknown:
        raise FlagError(f"{origin}: {path}: unknown section [{unknown[0]}] (accepted: "
                        "[ByNodeName], [ByNodeType])")
    names = list(cp["ByNodeName"]) if cp.has_section("ByNodeName") else []
    types = list(cp["ByNodeType"]) if cp.has_section("ByNodeType") else []
    return names, types


# ------------------------------------------------------------ effective config
# Where a value came from, lowest precedence first (an origin reads "file PATH", "env VAR", ...).
SOURCES = ("default", "file", "env", "explicit")


def rank(origin: str) -> int:
    """The precedence of an origin: 0 default, 1 file, 2 env, 3 explicit."""
    return SOURCES.index(origin.split(" ", 1)[0].split("@", 1)[0])


@dataclass
class Config:
    """The effective flags: values plus where each came from.

    Attribute access (``cfg.enable_recompute_fusion``) gives the value in effect: a flag
    whose default depends on ``opt_level`` answers with that level's value."""

    values: FlagValues
    origins: dict[str, str]
    warnings: list[str] = field(default_factory=list)
    # list keys: the origin of each name (the highest source that gave it)
    item_origins: dict[str, dict[str, str]] = field(default_factory=dict)
    # enable/disable names settled by precedence (the lower source's entry was dropped)
    overrides: list[str] = field(default_factory=list)
    # per key: how its value was reached when that is not plain (AutoFuse's semantics, ...)
    notes: dict[str, str] = field(default_factory=dict)

    def __getattr__(self, key: str) -> Any:
        if key.startswith("_") or key in ("values", "origins", "warnings", "item_origins",
                                          "overrides", "notes"):
            raise AttributeError(key)
        return self.value(key)

    def value(self, key: str) -> Any:
        """The value in effect (an opt_level default resolved at this config's level, a
        target cap at its target)."""
        v = getattr(self.values, key)
        spec = SPECS.get(key)
        if v is None and spec is not None and spec.level is not None:
            return self.values.opt_level >= spec.level
        if v is None and spec is not None and spec.cap:
            return target_cap(self.values.target, spec.cap)
        return v

    def is_default(self, key: str) -> bool:
        return key not in self.origins

    def origin(self, key: str) -> str:
        """``explicit``, ``env VAR``, ``file PATH`` (joined by `` + `` when a list has items
        from several), ``default``, or ``default@optN`` for a default that depends on the
        level."""
        if key in self.origins:
            return self.origins[key]
        spec = SPECS.get(key)
        if spec and spec.level is not None:
            return f"default@opt{self.values.opt_level}"
        if spec and spec.cap:
            return f"default@{self.values.target}"
        return "default"

    def item_origin(self, key: str, name: str) -> str:
        """Where one name of a list key came from."""
        return self.item_origins.get(key, {}).get(name, self.origin(key))

    def feature(self, key: str, level: int | None = None) -> bool:
        """A feature flag's value in effect (``level``: its opt_level default when the flag
        has none of its own)."""
        v = getattr(self.values, key)
        if v is None and level is not None:
            return self.values.opt_level >= level
        return bool(self.value(key))

    def to_dict(self) -> dict[str, Any]:
        """Every key with the value in effect and its origin (and, for a key no flag names,
        the flag that sets it)."""
        return {k: {"value": self.value(k), "origin": self.origin(k)}
                | ({"set_through": SET_THROUGH[k]} if k in SET_THROUGH else {})
                | ({"note": self.notes[k]} if k in self.notes else {})
                for k in self.values.model_dump()}


NameCheck = Callable[[str, str, str], str | None]


def _check_names(key: str, names: list[str], origin: str, checker: NameCheck | None) -> list[str]:
    if checker is None:
        return names
    out = []
    for n in names:
        canonical = checker(SPECS[key].names, n, f"{origin}: --{key}")
        out.append(canonical if canonical is not None else n)
    return out


def resolve(flags: str | Mapping[str, Any] | None = None,
            config: str | os.PathLike | None = None,
            env: Mapping[str, str] | None = None,
            name_check: NameCheck | None = None) -> Config:
    """Build the effective configuration from every source, in precedence order.

    ``env`` defaults to ``os.environ``; pass ``{}`` to ignore the environment.
    ``name_check(kind, name, where)`` validates pass/pattern/op names in list flags and
    returns the canonical spelling (the pipeline supplies it).
    """
    env = os.environ if env is None else env
    files: list[FlagItem] = []
    if config is not None:
        files += read_config_file(config, "--config")
    env_items: list[FlagItem] = []
    for var in ENV_VARS:
        if env.get(var):
            env_items += parse_flag_string(env[var], f"env {var}")
    if not env.get("AUTOFUSE_FLAGS") and env.get(MS_ENV_VAR):
        env_items += parse_flag_string(env[MS_ENV_VAR], f"env {MS_ENV_VAR}")
    if isinstance(flags, Mapping):
        explicit = [FlagItem(str(k).lstrip("-"), _mapping_value(v), "explicit")
                    for k, v in flags.items()]
        for it in explicit:
            _check_length(it.key, it.value, it.origin)
    else:
        explicit = parse_flag_string(flags or "", "explicit")
    # --path=FILE items (anywhere) load with file precedence
    for src in (env_items, explicit):
        for it in src:
            if it.key == "path":
                if not it.value:
                    raise FlagError(f"{it.origin}: --path needs a file name")
                files += read_config_file(it.value, f"{it.origin} --path")
    levels = [("file", files), ("env", env_items), ("explicit", explicit)]
    return _apply(levels, name_check)


def _mapping_value(v: Any) -> Any:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list | tuple):
        return [str(x) for x in v]
    return None if v is None else str(v)


def _apply(levels: list[tuple[str, list[FlagItem]]], name_check: NameCheck | None) -> Config:
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    item_origins: dict[str, dict[str, str]] = {}
    notes: list[str] = []
    seen_in_source: dict[tuple[str, str], str] = {}
    for _level, items in levels:
        for it in autofuse_semantics(items):
            if it.key == "path":
                continue
            if it.key in COMPAT_NO_EFFECT:
                check_no_effect(it)
                msg = (f"{it.origin}: --{it.key} is accepted for compatibility with "
                       f"{_anchor_names(it.key)} and has no effect in graphkernel: "
                       f"{KEYS[it.key].graphkernel}")
                notes.append(msg)
                warnings.warn(msg, FlagWarning, stacklevel=3)
                continue
            if it.key not in SPECS:
                raise FlagError(f"{it.origin}: unknown flag --{it.key}"
                                + did_you_mean(it.key, [*SPECS, *COMPAT_NO_EFFECT])
                                + "; run `graphkernel flags` to list every flag")
            spec = SPECS[it.key]
            settings = _convert(it, spec, name_check, notes)
            prev = next((seen_in_source[k, it.origin] for k, _ in settings
                         if (k, it.origin) in seen_in_source), None)
            if prev is not None and spec.kind != "list":
                msg = (f"{it.origin}: --{it.key} is given more than once; the last value "
                       f"({it.value}) wins over {prev}")
                notes.append(msg)
                warnings.warn(msg, FlagWarning, stacklevel=3)
            for key, val in settings:
                if isinstance(val, list):
                    item_origins.setdefault(key, {}).update((v, it.origin) for v in val)
                if isinstance(val, list) and isinstance(values.get(key), list) and \
                        it.key != "skip_node_names_cfg":  # (a file: given again, it replaces)
                    values[key] = values[key] + [v for v in val if v not in values[key]]
                    origins[key] = _join_origin(origins[key], it.origin)
                else:
                    values[key] = val
                    origins[key] = it.origin
                seen_in_source[(key, it.origin)] = str(it.value)
    overrides = _settle_conflicts(values, origins, item_origins)
    try:
        fv = FlagValues(**values)
    except ValidationError as e:
        err = e.errors()[0]
        key = str(err["loc"][0])
        rng = _range_text(key)
        raise FlagError(f"{origins.get(key, 'default')}: --{key}={values.get(key)}: "
                        f"{err['msg'].lower()}{rng}") from None
    names = target_names()
    if fv.target not in names:
        raise FlagError(f"--target={fv.target}: unknown target" + did_you_mean(fv.target, names)
                        + f" (accepted: {', '.join(names)})")
    return Config(fv, origins, notes, item_origins, overrides, _key_notes(item_origins))


# ------------------------------------------------------------- the anchors' keys
# the origin of what a string that speaks AutoFuse turns off without naming it
IMPLIED = " (AutoFuse semantics: off unless listed in --autofuse_enable_pass)"


def autofuse_semantics(items: list[FlagItem]) -> list[FlagItem]:
    """``items`` and, for each flag string among them that uses AutoFuse's vocabulary
    (``enable_autofuse``, ``autofuse_enable_pass``, ``autofuse_disable_pass``), AutoFuse's
    rule that its extended fusions are off unless listed in ``autofuse_enable_pass``: one
    more item turning off the others, from that string (tagged ``IMPLIED``, so that a name
    the string itself enables another way wins over it)."""
    by_origin: dict[str, list[FlagItem]] = {}
    for it in items:
        by_origin.setdefault(it.origin, []).append(it)
    out = list(items)
    for origin, its in by_origin.items():
        if not any(it.key in AUTOFUSE_VOCABULARY for it in its):
            continue
        enabled: set[str] = set()
        for it in its:
            if it.key == "autofuse_enable_pass":
                enabled.update(parse_list(it.key, it.value, origin))
        off = [g for g, grp in AUTOFUSE_GROUPS.items()
               if g not in enabled and (grp.patterns or grp.ops)]
        if off:
            out.append(FlagItem("autofuse_disable_pass", off, origin + IMPLIED))
    return out


def _key_notes(item_origins: dict[str, dict[str, str]]) -> dict[str, str]:
    """Per key, what AutoFuse's semantics put in it (for `graphkernel flags`)."""
    notes = {}
    for key, names in item_origins.items():
        implied = {n for n, o in names.items() if o.endswith(IMPLIED)}
        groups = [g for g, grp in AUTOFUSE_GROUPS.items()
                  if implied & {*grp.patterns, *grp.ops}]
        if groups:
            notes[key] = (f"AutoFuse semantics: {', '.join(groups)} fusion off (the string "
                          "uses AutoFuse's keys and does not list them in "
                          "--autofuse_enable_pass)")
    return notes


def _anchor_names(key: str) -> str:
    names = {"AUTOFUSE_FLAGS": "AutoFuse", "AUTOFUSE_DFX_FLAGS": "AutoFuse"}
    return "/".join(dict.fromkeys(names.get(a, a) for a in KEYS[key].anchors))


def check_no_effect(it: FlagItem) -> None:
    """A no-effect key's value is still checked: a typo in it is an error, as anywhere."""
    k = KEYS[it.key]
    raw = ",".join(it.value) if isinstance(it.value, list) else it.value
    if k.kind == "bool":
        parse_bool(it.key, raw, it.origin)
    elif k.kind == "int":
        v = parse_int(it.key, raw, it.origin)
        if (k.lo is not None and v < k.lo) or (k.hi is not None and v > k.hi) or \
                (k.power_of_two and v & (v - 1)):
            rng = f"{'' if k.lo is None else k.lo}..{'' if k.hi is None else k.hi}"
            two = ", a power of two" if k.power_of_two else ""
            raise FlagError(f"{it.origin}: --{it.key}={v}: out of range (accepted: {rng}{two})")
    elif k.kind == "list":
        parse_list(it.key, it.value, it.origin)
    elif raw is None or raw == "":
        raise FlagError(f"{it.origin}: --{it.key} needs a value")
    elif k.kind == "choice" and raw not in k.choices:
        raise FlagError(f"{it.origin}: --{it.key}={raw}: unknown value"
                        + did_you_mean(raw, k.choices) + f" (accepted: {', '.join(k.choices)})")


def _join_origin(a: str, b: str) -> str:
    parts = a.split(" + ")
    return a if b in parts else f"{a} + {b}"


def _range_text(key: str) -> str:
    f = FlagValues.model_fields.get(key)
    if f is None:
        return ""
    lo = hi = None
    for m in f.metadata:
        lo = getattr(m, "ge", lo)
        hi = getattr(m, "le", hi)
    if lo is not None and hi is not None:
        return f" (accepted: {lo}..{hi})"
    if lo is not None:
        return f" (accepted: >= {lo})"
    return ""


def _convert(it: FlagItem, spec: FlagSpec, name_check: NameCheck | None,
             notes: list[str]) -> list[tuple[str, Any]]:
    """The (FlagValues key, value) settings one flag makes: usually one, none for a flag that
    keeps the default, two for a skip file (names and types)."""
    key, raw, origin = it.key, it.value, it.origin
    if spec.kind == "bool":
        val: Any = parse_bool(key, raw if not isinstance(raw, list) else ",".join(raw), origin)
    elif spec.kind == "int":
        val = parse_int(key, raw if not isinstance(raw, list) else ",".join(raw), origin)
    elif spec.kind == "list":
        val = _check_names(key, parse_list(key, raw, origin), origin, name_check)
    else:
        if raw is None or raw == "" or isinstance(raw, list):
            raise FlagError(f"{origin}: --{key} needs a value")
        val = raw
        if spec.kind == "choice" and val not in spec.options():
            raise FlagError(f"{origin}: --{key}={val}: unknown value"
                            + did_you_mean(val, spec.options())
                            + f" (accepted: {', '.join(spec.options())})")
    # the anchors' keys map onto graphkernel's own
    if key == "enable_autofuse":  # true keeps the opt_level; false turns fusion off
        return [("opt_level", 0)] if not val else []
    if key == "max_fusion_size":
        if val < 0:
            raise FlagError(f"{origin}: --max_fusion_size={val}: must be >= 0")
        return [("composite_op_limit_size", val)]
    if key == "recomputation_threshold":
        if not 0 <= val <= 255:
            raise FlagError(f"{origin}: --recomputation_threshold={val}: out of range "
                            "(accepted: 0..255)")
        return [("recompute_max_consumers", val)]
    if key in ("autofuse_enable_pass", "autofuse_disable_pass"):
        return _fusion_groups(it, val, notes)
    if key in ("precision_blacklist", "precision_blacklist_kernels",
               "autofuse_enhance_precision_blacklist"):
        ops = _precision_ops(it, val, name_check)
        return [("precision_blacklist" if key == "precision_blacklist"
                 else "precision_blacklist_kernels", ops)]
    mapped = {"codegen_compile_debug": "keep_codegen_project",
              "enable_horizontal_fusion": "enable_parallel_fusion",
              "disable_lifting": "enable_single_node_fusion",
              "subgraph_recover": "dump_kernel_graphs"}
    if key in mapped:
        return [(mapped[key], val)]
    if key == "disable_matmul_post_fusion":
        return [("disable_fusion_pattern", ["matmul_depth"])] if val else []
    if key == "skip_node_names_cfg":
        from_file = origin.startswith("file ")
        path = _file_beside(origin, val) if from_file else val
        names, types = read_skip_file(path, origin, follow_links=not from_file)
        return [("skip_node_names", names), ("skip_node_types", types)]
    if key == "debug_dir" and origin.startswith("file "):
        _check_file_debug_dir(val, origin)
    if key == "replace_kernel" and origin.startswith("file "):
        raise FlagError(f"{origin}: --replace_kernel={val}: a flags file may not choose code "
                        "to build and run; give the folder with --flags or AUTOFUSE_DFX_FLAGS")
    return [(key, val)]


def _fusion_groups(it: FlagItem, names: list[str], notes: list[str]) -> list[tuple[str, Any]]:
    """AutoFuse's extended fusion names -> graphkernel's patterns (and, to turn a kind of
    fusion off, its ops: AutoFuse does not lower them into fused graphs at all)."""
    pats: list[str] = []
    ops_off: list[str] = []
    for v in names:
        if v not in AUTOFUSE_GROUPS:
            raise FlagError(f"{it.origin}: --{it.key}={v}: unknown AutoFuse pass"
                            + did_you_mean(v, AUTOFUSE_GROUPS)
                            + f" (accepted: {', '.join(AUTOFUSE_GROUPS)})")
        group = AUTOFUSE_GROUPS[v]
        pats += group.patterns
        ops_off += group.ops
        if not group.patterns and not it.origin.endswith(IMPLIED):
            msg = f"{it.origin}: --{it.key}={v} has no effect in graphkernel: {group.note}"
            notes.append(msg)
            warnings.warn(msg, FlagWarning, stacklevel=4)
    # the names come from graphkernel's own table, not from the user: no registry check
    if it.key == "autofuse_enable_pass":  # (its ops too: a lower source may have left them out)
        return [("enable_fusion_pattern", pats), ("enable_cluster_ops", ops_off)]
    return [("disable_fusion_pattern", pats), ("disable_cluster_ops", ops_off)]


def _precision_ops(it: FlagItem, names: list[str], name_check: NameCheck | None) -> list[str]:
    """The op names of a precision blacklist (``all`` stays as it is; AutoFuse's AscIR names
    are read as graphkernel's)."""
    out = []
    for name in names:
        if name == "all":
            out.append(name)
            continue
        if it.key == "autofuse_enhance_precision_blacklist":
            name = ASCIR_OPS.get(name, name)
        canon = name_check("op", name, f"{it.origin}: --{it.key}") if name_check else name
        canon = canon or name
        if canon in ALWAYS_PROMOTED:
            raise FlagError(f"{it.origin}: --{it.key}={name}: {canon} always computes in fp32 "
                            "(a low-precision sum or product loses digits; AutoFuse's rule "
                            "too); remove it from the list")
        out.append(canon)
    return out


def _check_file_debug_dir(path: str, origin: str) -> None:
    """A flags file is data: it may not choose a place to write outside the current folder
    (the user's own --flags and environment may): a folder below it, reached through no
    symbolic link. ``compile -o DIR`` further confines it to DIR (``confine_to``)."""
    p = Path(path)
    if p.is_absolute() or ".." in p.parts or "\0" in path or not p.parts:
        raise FlagError(f"{origin}: --debug_dir={path}: a flags file may only name a folder "
                        "inside the current one (a relative path without '..', not '.'); give "
                        "other places with --flags or AUTOFUSE_FLAGS")
    for i in range(1, len(p.parts) + 1):
        if Path(*p.parts[:i]).is_symlink():
            raise FlagError(f"{origin}: --debug_dir={path}: {Path(*p.parts[:i])} is a symbolic "
                            "link; a path named by a flags file may not go through one")


def confine_to(cfg: Config, folder: str | os.PathLike, option: str) -> None:
    """A ``debug_dir`` that came from a flags file must lie inside ``folder`` (the output
    folder the user gave as ``option``): a flags file may not make graphkernel write
    elsewhere. Paths from the user's own flags and environment are theirs to choose."""
    origin = cfg.origin("debug_dir")
    if not origin.startswith("file "):
        return
    root = os.path.realpath(folder)
    target = os.path.realpath(cfg.debug_dir)
    if os.path.commonpath([root, target]) != root:
        raise FlagError(f"{origin}: --debug_dir={cfg.debug_dir}: a flags file may only name a "
                        f"folder inside the output folder ({option} {folder}); give other "
                        "places with --flags or AUTOFUSE_FLAGS")


def _file_beside(origin: str, name: str) -> str:
    """A file a flags file names: a plain file name in the flags file's own folder."""
    if name in (".", "..") or os.path.basename(name) != name or "\\" in name or "\0" in name:
        raise FlagError(f"{origin}: --skip_node_names_cfg={name}: a flags file may only name a "
                        "file next to it (a plain file name, no folders)")
    return str(Path(origin.removeprefix("file ")).parent / name)


# keys of the Config an anchor's key also sets (shown by `flags`)
SET_THROUGH = {"enable_fusion_pattern": "autofuse_enable_pass",
               "skip_node_names": "skip_node_names_cfg", "skip_node_types": "skip_node_names_cfg",
               "precision_blacklist_kernels": "autofuse_enhance_precision_blacklist"}

ENABLE_DISABLE = (("enable_pass", "disable_pass"), ("enable_expand_ops", "disable_expand_ops"),
                  ("enable_cluster_ops", "disable_cluster_ops"),
                  ("enable_fusion_pattern", "disable_fusion_pattern"))


def _settle_conflicts(values: dict[str, Any], origins: dict[str, str],
                      item_origins: dict[str, dict[str, str]]) -> list[str]:
    """A name in both an enable list and its disable list: the higher source wins for that
    name and the other entry is dropped; both from one source is an error. Returns a note
    per settled name."""
    notes = []
    for en, dis in ENABLE_DISABLE:
        for name in sorted(set(values.get(en, [])) & set(values.get(dis, []))):
            o_en, o_dis = item_origins[en][name], item_origins[dis][name]
            if rank(o_en) == rank(o_dis) and o_dis.endswith(IMPLIED) != o_en.endswith(IMPLIED):
                # what a string names wins over what AutoFuse's semantics turn off for it
                lose = dis if o_dis.endswith(IMPLIED) else en
                values[lose] = [v for v in values[lose] if v != name]
                del item_origins[lose][name]
                continue
            if rank(o_en) == rank(o_dis):
                raise FlagError(f"{name!r} is in both --{en} ({o_en}) and --{dis} ({o_dis}); "
                                "remove it from one of them")
            (win, o_win), (lose, o_lose) = sorted([(en, o_en), (dis, o_dis)],
                                                  key=lambda e: -rank(e[1]))
            values[lose] = [v for v in values[lose] if v != name]
            del item_origins[lose][name]
            notes.append(f"--{win}={name} ({o_win}) overrides --{lose}={name} ({o_lose})")
    return notes


def format_value(value: Any) -> str:
    """A value as it would be written in a flag string (``true``, ``a,b``, ``""``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(map(str, value)) if value else "[]"
    if value == "":
        return '""'
    return str(value)


def markdown_table() -> str:
    """Every key a user can set, as the README's table: type, default, meaning."""
    names = {"pass": "pass selectors", "pattern": "pattern names", "op": "op names",
             "expand_op": "op names", "precision_op": "op names", "ascir_op": "op names",
             "autofuse": "AutoFuse pass names"}
    defaults = FlagValues().model_dump()
    rows = ["| flag | type | default | meaning |", "|---|---|---|---|"]
    for key, spec in SPECS.items():
        kind = f"list of {names.get(spec.names, 'strings')}" if spec.kind == "list" else \
            "one of " + ", ".join(spec.options()) if spec.kind == "choice" else \
            spec.kind + _range_text(key).replace(" (accepted: ", " ").rstrip(")")
        if spec.level is not None:
            default = f"on from opt_level {spec.level}"
        elif spec.cap:
            default = f"the target's cap ({DEFAULT_CAPS[spec.cap]})"
        elif key in defaults:
            default = format_value(defaults[key]).replace("[]", "(empty)")
        else:
            default = "—"
        rows.append(f"| `{key}` | {kind} | {default} | {spec.doc.replace('|', '/')} |")
    return "\n".join(rows)

