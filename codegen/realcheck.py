"""The real-header check: every generated kernel type-checked against the Ascend C headers.

The CPU simulator (``sim/``) is graphkernel's own model of the Ascend C API; this module holds
the generated code to the real one. The API's headers are public (the Ascend C devkit's
``include/`` and ``impl/``, tikicpulib's CPU-debug headers and a CANN toolkit's ``stub_fun.h``,
the intrinsics' declarations), and with ``ASCENDC_CPU_DEBUG=1`` they compile with g++ on any
machine: ``g++ -std=c++17 -fsyntax-only`` then instantiates every API template a kernel uses
with the kernel's own types, so a call the real API does not provide (a Cast between two
types it has no instruction for, a removed function, a wrong argument) fails here as it
would in a device build. A call to a deprecated function is reported too.

Each kernel is compiled in the modes its kind runs in (``KIND_MODES``): the vector pass (AIV:
the macros ``__DAV_C220_VEC__``/``__DAV_VEC__``), the cube pass (AIC: ``__DAV_C220_CUBE__``/
``__DAV_CUBE__``, for cube-only kernels) and the mixed build that tikicpulib's CPU-debug
build is (neither side's macro: the core type is chosen at run time, as for a MIX kernel's
cube and vector halves). The host tiling sources compile as plain host C++ with the devkit's
``kernel_tiling/kernel_tiling.h`` on the include path (``host``). The recipe — defines,
include folders in order, modes per kind — is data below (``RECIPES``), read by the check and
by the CPU-model harness's build (``harness.py``).

Kernels are compiled many per g++ run (the headers take seconds to parse, a kernel a tenth
of that); an error is attributed to the kernel whose source line it comes from (directly, or
the ``required from here`` line of a template instantiation). Results are cached by the hash
of everything that went into the compile. What this proves and what it does not:
docs/codegen.md, "The real-header check".
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from graphkernel.errors import ConfigError

ENV = "GRAPHKERNEL_ASCEND_HEADERS"        # a folder holding the three header sets
CANN_ENV = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")  # a CANN install (set by set_env.sh)


@dataclass(frozen=True)
class Recipe:
    """How to compile for one NPU architecture (``npu_arch`` in the target file)."""

    arch: int
    defines: tuple[str, ...]                     # every device pass
    modes: Mapping[str, tuple[str, ...]]         # extra defines per mode
    cpu_model: str                               # tikicpulib's CMake target of the architecture


RECIPES: dict[int, Recipe] = {
    # dav-c220: Atlas A2 / A3 (910B, 910_93). The CPU-debug build's definitions are
    # tikicpulib's (ASCENDC_CPU_DEBUG, the architecture macros); the vector and cube passes
    # add the side's macros as the device compiler does when it splits a kernel.
    2201: Recipe(2201, ("ASCENDC_CPU_DEBUG=1", "__NPU_ARCH__=2201", "__DAV_C220__",
                        "__CCE_AICORE__=220"),
                 {"vector": ("__DAV_C220_VEC__", "__DAV_VEC__"),
                  "cube": ("__DAV_C220_CUBE__", "__DAV_CUBE__"),
                  "mix": ()}, "ascend910B1"),
}
# The modes each kind of kernel is compiled in. A MIX kernel is not compiled as the cube pass:
# under ASCENDC_CPU_DEBUG the API registers a Matmul object for both sides at once (the side
# is a run-time value there), which needs the vector side's declarations.
KIND_MODES: dict[str, tuple[str, ...]] = {
    "vector": ("vector", "mix"),
    "cube": ("cube", "mix"),
    "mix": ("vector", "mix"),
    "host": ("host",),
    "driver": ("mix",),  # a CPU-model driver (codegen/harness.py): tikicpulib's own build
}
CXX_FLAGS = ("-std=c++17", "-fsyntax-only", "-fdiagnostics-plain-output",
             "-fno-diagnostics-show-caret")
PER_RUN = 24  # kernels per g++ run: the headers parse once per run


# ----------------------------------------------------------------------------- headers
@dataclass(frozen=True)
class Headers:
    """Where the three header sets are (each a folder), and how they were found."""

    devkit: Path      # holds include/kernel_operator.h (and impl/ beside include/)
    tikicpulib: Path  # holds tikicpulib.h, stub_def.h, kern_fwk.h
    stub_fun: Path    # holds stub_fun.h (the intrinsics' declarations)
    tiling: Path      # holds kernel_tiling/kernel_tiling.h
    matmul: Path      # holds lib/matmul_intf.h, or adv_api/matmul/matmul_intf.h (devkit)
    origin: str       # how they were found: the option, the variable, the CANN install
    securec: Path | None = None  # holds securec.h (CANN's include/): tikicpulib's launch uses it

    def include_dirs(self, shim: Path | None) -> list[Path]:
        """The include folders, in order: tikicpulib first (its stub_def.h defines the
        CPU-debug types the API's headers use), the devkit's root, include/ and the folders
        its headers include from, the tiling structs, then the Matmul API."""
        inc = self.devkit / "include"
        dirs = [self.tikicpulib, self.stub_fun, self.devkit, inc, inc / "basic_api",
                inc / "adv_api", self.tiling, self.matmul, *([self.securec] if self.securec
                                                              else [])]
        if shim is not None:
            dirs.append(shim)
        out: list[Path] = []
        for d in dirs:
            if d.is_dir() and d not in out:
                out.append(d)
        return out

    def key(self) -> str:
        """What identifies these headers for the result cache: the folders and the size and
        time of the headers a kernel includes first."""
        parts = [self.origin]
        for p in (self.devkit / "include" / "kernel_operator.h", self.tikicpulib / "tikicpulib.h",
                  self.stub_fun / "stub_fun.h", self.tiling / "kernel_tiling" / "kernel_tiling.h"):
            st = p.stat()
            parts.append(f"{p}:{st.st_size}:{st.st_mtime_ns}")
        return "\n".join(parts)


# the marker files of each set: (field, relative path whose folder is the set's folder)
_MARKERS = (("devkit", "include/kernel_operator.h"), ("tikicpulib", "tikicpulib.h"),
            ("stub_fun", "stub_fun.h"), ("tiling", "kernel_tiling/kernel_tiling.h"),
            ("matmul", "lib/matmul_intf.h"), ("matmul", "adv_api/matmul/matmul_intf.h"),
            ("securec", "securec.h"))
_SKIP = {".git", "__pycache__", "docs", "examples", "tests", "python", "opp", "lib64",
         "bin", "samples", "scripts", "toolkit", "tools-legacy"}


def _scan(roots: Iterable[Path], max_depth: int = 8) -> dict[str, Path]:
    """The first folder of each header set under ``roots`` (breadth first, so the shallowest
    wins): a devkit is a folder with include/kernel_operator.h whose include/basic_api exists."""
    found: dict[str, Path] = {}
    queue = [(r, 0) for r in roots if r.is_dir()]
    while queue and len(found) < 6:
        d, depth = queue.pop(0)
        for name, rel in _MARKERS:
            if name not in found and (d / rel).is_file():
                if name == "devkit" and not (d / "include" / "basic_api").is_dir():
                    continue
                found[name] = d
        if depth < max_depth:
            try:
                subs = sorted(p for p in d.iterdir() if p.is_dir() and p.name not in _SKIP)
            except OSError:
                continue
            queue += [(p, depth + 1) for p in subs]
    return found


def _cann_roots(home: Path) -> list[Path]:
    """The folders of a CANN install that hold the Ascend C headers (for both processor
    architectures; CANN 8 and later install the devkit as ``<arch>-linux/asc``) and
    tikicpulib (``tools/tikicpulib``)."""
    out = [home / "tools" / "tikicpulib", home / "include"]
    for arch in ("x86_64-linux", "aarch64-linux"):
        out += [home / arch / "asc", home / arch / "ascendc" / "include",
                home / arch / "tikcpp" / "tikcfw"]
    out += [home / "compiler" / "tikcpp" / "tikcfw", home / "compiler" / "ascendc" / "include"]
    return [p for p in out if p.is_dir()]


HOW = ("give --ascend-headers DIR (or set GRAPHKERNEL_ASCEND_HEADERS) to a folder holding the "
       "Ascend C devkit (include/, impl/), tikicpulib's CPU-debug headers, stub_fun.h and "
       "kernel_tiling/kernel_tiling.h, or source a CANN install's set_env.sh "
       "(ASCEND_HOME_PATH); docs/codegen.md, \"The real-header check\"")


def find_headers(folder: str | os.PathLike | None = None,
                 env: Mapping[str, str] | None = None) -> Headers | None:
    """The Ascend C headers: from ``folder`` (the command's option), else the folder in
    GRAPHKERNEL_ASCEND_HEADERS, else a CANN install (ASCEND_HOME_PATH, ASCEND_TOOLKIT_HOME).
    None when nothing is given; a folder given that lacks a set is a ConfigError naming
    what is missing."""
    env = os.environ if env is None else env
    if folder is not None:
        roots, origin = [Path(folder)], f"--ascend-headers {folder}"
    elif env.get(ENV):
        roots, origin = [Path(env[ENV])], f"{ENV}={env[ENV]}"
    else:
        home = next(((k, env[k]) for k in CANN_ENV if env.get(k)), None)
        if home is None:
            return None
        roots, origin = _cann_roots(Path(home[1])), f"{home[0]}={home[1]}"
        if not roots:
            raise ConfigError(f"{origin}: no Ascend C headers under it (looked for "
                              "<arch>-linux/asc, tikcpp/tikcfw and tools/tikicpulib); " + HOW)
    if (folder is not None or env.get(ENV)) and not roots[0].is_dir():
        raise ConfigError(f"{origin}: not a folder; " + HOW)
    found = _scan(roots)
    missing = [what for name, what in (
        ("devkit", "the Ascend C devkit (include/kernel_operator.h with include/basic_api)"),
        ("tikicpulib", "tikicpulib's CPU-debug headers (tikicpulib.h)"),
        ("stub_fun", "stub_fun.h (a CANN toolkit's tools/tikicpulib/lib/include)"),
        ("tiling", "kernel_tiling/kernel_tiling.h (installed with CANN; from a devkit "
                   "checkout, generate it with impl/adv_api/cmake/scripts/"
                   "gen_kernel_tiling_data_def.py include/adv_api OUT/kernel_tiling/"
                   "kernel_tiling.h)"),
        ("matmul", "the Matmul API (lib/matmul_intf.h or adv_api/matmul/matmul_intf.h)"))
        if name not in found]
    if missing:
        raise ConfigError(f"{origin}: missing {'; '.join(missing)}; " + HOW)
    return Headers(found["devkit"], found["tikicpulib"], found["stub_fun"], found["tiling"],
                   found["matmul"], origin, found.get("securec"))


# ----------------------------------------------------------------------------- units
@dataclass(frozen=True)
class Unit:
    """One source to check: a kernel (or a SuperKernel, or a host tiling file) and the
    folder holding it and everything it includes."""

    name: str      # the kernel's name (or the tiling file's)
    kind: str      # vector, cube, mix or host
    source: Path   # the file compiled
    alone: bool = False  # includes other kernels' sources: compiled in a run of its own
    include: Path | None = None  # a folder to search besides its own (a driver: the kernels)

    @property
    def modes(self) -> tuple[str, ...]:
        return KIND_MODES[self.kind]


def project_units(kernels_dir: Path, manifest: Mapping) -> list[Unit]:
    """The units of a written project (``-o DIR``): each distinct kernel, each SuperKernel and
    each host tiling file, as its ``manifest.json`` lists them."""
    units = []
    for k in manifest.get("kernels", []):
        kind = k.get("kind", "vector")
        units.append(Unit(k["name"], kind, kernels_dir / f"{k['name']}.cpp"))
        for f in k.get("sources", []):
            if f.endswith("_tiling.cpp"):
                units.append(Unit(f[:-4], "host", kernels_dir / f))
    for sk in manifest.get("super_kernels", []):  # vector kernels only (codegen/superkernel)
        units.append(Unit(sk["name"], "vector", kernels_dir / f"{sk['name']}.cpp", alone=True))
    for h in manifest.get("cpu_model", []):  # each a program of its own (main)
        if h.get("driver"):
            units.append(Unit(f"{h['kernel']}_cpu", "driver",
                              kernels_dir.parent / h["driver"], alone=True, include=kernels_dir))
    return units


def write_units(rendered: Sequence, supers: Sequence, folder: Path) -> list[Unit]:
    """Rendered kernels (and SuperKernels) written into ``folder`` as a project would be, and
    their units. Equal names with other text (another target's numbers) go to a subfolder."""
    units: list[Unit] = []
    written: dict[str, str] = {}
    for r in rendered:
        home = folder
        if any(written.get(f, t) != t for f, t in r.files.items()):
            home = folder / f"{r.name}.{len(units)}"
        home.mkdir(parents=True, exist_ok=True)
        for f, t in r.files.items():
            (home / f).write_text(t)
            if home == folder:
                written[f] = t
        units.append(Unit(r.name, r.manifest.get("kind", "vector"), home / f"{r.name}.cpp"))
        units += [Unit(f[:-4], "host", home / f) for f in sorted(r.files)
                  if f.endswith("_tiling.cpp")]
    for sr in supers:
        head = "#define GK_NO_ENTRY\n" + "".join(
            f'#include "{m.name}.cpp"\n' for m in sr.members) + "#undef GK_NO_ENTRY\n"
        (folder / f"{sr.name}.cpp").write_text(head + sr.source)
        units.append(Unit(sr.name, "vector", folder / f"{sr.name}.cpp", alone=True))
    return list({(u.name, u.kind, u.source): u for u in units}.values())


# ----------------------------------------------------------------------------- results
@dataclass
class Result:
    """One unit in one mode: OK, or its first error (``file:line: message``)."""

    unit: Unit
    mode: str
    error: str | None = None
    deprecated: list[str] = field(default_factory=list)  # calls of deprecated API functions

    @property
    def ok(self) -> bool:
        return self.error is None and not self.deprecated

    def line(self) -> str:
        state = "OK" if self.ok else (self.error or "deprecated: " + self.deprecated[0])
        return f"{self.unit.name:<48} {self.mode:<6} {state}"


_DIAG = re.compile(r"^(?P<path>[^:\s][^:]*):(?P<line>\d+):(?:\d+:)?\s*(?P<rest>.*)$")


def _diagnostics(text: str, files: Mapping[Path, Unit]) -> tuple[dict[Unit, str],
                                                                 dict[Unit, list[str]], bool]:
    """g++'s output read back: each unit's first error, its deprecation warnings, and whether
    an error could not be attributed to any unit. An error in a header belongs to the unit
    whose line led to it (the last unit line since the previous diagnostic: a ``required from
    here`` or ``In file included from``)."""
    errors: dict[Unit, str] = {}
    deprecated: dict[Unit, list[str]] = {}
    unattributed = False
    context: tuple[Unit, str] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("In file included from") or line.startswith("from "):
            m = re.search(r"(?:from )(\S+?):(\d+)", line)
            path, lineno = (m.group(1), m.group(2)) if m else ("", "")
            rest = ""
        else:
            m = _DIAG.match(line)
            if not m:
                continue
            path, lineno, rest = m.group("path"), m.group("line"), m.group("rest")
        unit = files.get(Path(path).resolve()) if path else None
        is_error = rest.startswith("error:") or rest.startswith("fatal error:")
        is_warning = rest.startswith("warning:")
        if unit is not None and not (is_error or is_warning):
            context = (unit, f"{Path(path).name}:{lineno}")
            continue
        if is_warning and "[-Wdeprecated-declarations]" in rest and unit is not None:
            deprecated.setdefault(unit, []).append(f"{Path(path).name}:{lineno}: {rest}")
        if is_error:
            msg = rest.split(":", 1)[1].strip()
            if unit is not None:
                errors.setdefault(unit, f"{Path(path).name}:{lineno}: {msg}")
            elif context is not None:
                errors.setdefault(context[0], f"{context[1]}: {msg} (in {Path(path).name}:"
                                              f"{lineno})")
            else:
                unattributed = True
        if is_error or is_warning:
            context = None
    return errors, deprecated, unattributed


def cache_dir() -> Path:
    from graphkernel.codegen.sim.runner import cache_dir as sim_cache

    d = sim_cache() / "realcheck"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _shim(headers: Headers) -> Path | None:
    """A folder whose ``lib/matmul_intf.h`` includes the devkit's Matmul API, for a devkit
    checkout (an installed CANN has ``lib/`` itself): the kernels include the API by the
    installed name."""
    if (headers.matmul / "lib" / "matmul_intf.h").is_file():
        return None
    d = cache_dir() / ("shim-" + hashlib.sha256(str(headers.matmul).encode()).hexdigest()[:12])
    (d / "lib").mkdir(parents=True, exist_ok=True)
    target = headers.matmul / "adv_api" / "matmul" / "matmul_intf.h"
    text = f'// the installed name of the Matmul API\n#include "{target}"\n'
    f = d / "lib" / "matmul_intf.h"
    if not f.is_file() or f.read_text() != text:
        f.write_text(text)
    return d


_QUOTED = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def _closure(unit: Unit) -> str:
    """The unit's source and every generated file it includes (quoted includes found beside
    it or in its extra folder), for the result cache's key."""
    dirs = [unit.source.parent, *([unit.include] if unit.include else [])]
    seen: dict[Path, str] = {}
    todo = [unit.source]
    while todo:
        f = todo.pop()
        if f in seen or not f.is_file():
            continue
        seen[f] = f.read_text()
        for name in _QUOTED.findall(seen[f]):
            todo += [d / name for d in dirs if (d / name).is_file()][:1]
    return "\0".join(f"{p.name}\0{text}" for p, text in sorted(seen.items()))


def command(headers: Headers, recipe: Recipe, mode: str, source: Path,
            extra: Sequence[Path] = ()) -> list[str]:
    """The g++ command line of one run (``source``: a file including the units; ``extra``:
    folders searched first)."""
    cxx = shutil.which("g++") or shutil.which("c++") or "g++"
    defs = [] if mode == "host" else [*recipe.defines, *recipe.modes[mode]]
    return [cxx, *CXX_FLAGS, *(f"-D{d}" for d in defs), *(f"-I{d}" for d in extra),
            *(f"-I{d}" for d in headers.include_dirs(_shim(headers))), str(source)]


def _run(headers: Headers, recipe: Recipe, mode: str, units: Sequence[Unit]
         ) -> tuple[dict[Unit, str], dict[Unit, list[str]], bool]:
    """One g++ run over ``units`` (cached by the hash of its inputs)."""
    body = "".join(f'#include "{u.source.resolve()}"\n' for u in units)
    texts = "\0".join(_closure(u) for u in units)
    extra = sorted({u.include for u in units if u.include is not None})
    # the key: what is compiled and how, not where (a temporary folder differs every time)
    flags = " ".join(command(headers, recipe, mode, Path("-"), ()))
    names = "\0".join(f"{u.name}|{u.kind}|{u.source.name}|{u.include is not None}"
                      for u in units)
    key = hashlib.sha256("\0".join([headers.key(), mode, flags, names, texts]).encode()
                         ).hexdigest()[:32]
    cached = cache_dir() / f"r_{key}.json"
    files = {u.source.resolve(): u for u in units}
    by_name = {u.name + "|" + u.kind: u for u in units}
    if cached.is_file():
        data = json.loads(cached.read_text())
        return ({by_name[k]: v for k, v in data["errors"].items()},
                {by_name[k]: v for k, v in data["deprecated"].items()}, data["unattributed"])
    src = cache_dir() / f"u_{key}.cpp"
    src.write_text(body)
    proc = subprocess.run(command(headers, recipe, mode, src, extra), capture_output=True,
                          text=True)
    src.unlink(missing_ok=True)
    errors, deprecated, unattributed = _diagnostics(proc.stderr, files)
    if proc.returncode != 0 and not errors and not unattributed:
        unattributed = True
    if unattributed and len(units) == 1:  # a unit on its own: the run's error is its error
        first = next((ln for ln in proc.stderr.splitlines() if "error" in ln), proc.stderr)
        errors[units[0]] = first.strip()[-400:] or f"g++ exited with {proc.returncode}"
        unattributed = False
    cached.write_text(json.dumps({
        "errors": {f"{u.name}|{u.kind}": e for u, e in errors.items()},
        "deprecated": {f"{u.name}|{u.kind}": d for u, d in deprecated.items()},
        "unattributed": unattributed}))
    return errors, deprecated, unattributed


def _runs(units: Sequence[Unit], mode: str) -> list[list[Unit]]:
    """The g++ runs of one mode: units that can share a translation unit, PER_RUN at a time.
    Cube-only kernels define ASCENDC_CUBE_ONLY before the API's headers, so they share runs
    with each other only; a unit including other kernels' sources runs alone."""
    todo = [u for u in units if mode in u.modes]
    groups: dict[str, list[Unit]] = {}
    runs: list[list[Unit]] = []
    for u in todo:
        if u.alone:
            runs.append([u])
        else:
            groups.setdefault(u.kind, []).append(u)
    for g in groups.values():
        runs += [g[i:i + PER_RUN] for i in range(0, len(g), PER_RUN)]
    return runs


def check(units: Sequence[Unit], headers: Headers, arch: int = 2201,
          jobs: int | None = None) -> list[Result]:
    """Every unit compiled in each of its modes; one Result per unit and mode, in the order
    of ``units``. A run whose error cannot be tied to one unit is run again unit by unit."""
    from graphkernel.codegen.sim.runner import default_jobs

    if arch not in RECIPES:
        raise ConfigError(f"no real-header recipe for NPU architecture {arch} (known: "
                          f"{', '.join(map(str, RECIPES))})")
    recipe = RECIPES[arch]
    jobs = max(1, jobs if jobs is not None else default_jobs())
    if headers.securec is None and any(u.kind == "driver" for u in units):
        raise ConfigError(f"{headers.origin}: no securec.h (CANN's include/ folder), which "
                          "tikicpulib's launch macro includes; add it to check the CPU-model "
                          "drivers")
    plan = [(mode, run) for mode in ("vector", "cube", "mix", "host")
            for run in _runs(units, mode)]
    out: dict[tuple[Unit, str], Result] = {}

    def go(item: tuple[str, list[Unit]]) -> list[tuple[str, list[Unit], tuple]]:
        """A run, then again without the units that failed until one compiles: g++ reports
        an error in a template once per translation unit, for the first kernel that
        instantiates it, so a second kernel with the same mistake shows only when the first
        is gone."""
        mode, run = item
        out: list[tuple[str, list[Unit], tuple]] = []
        while run:
            errors, deprecated, unattributed = _run(headers, recipe, mode, run)
            if unattributed:  # each unit alone
                return out + [(mode, [u], _run(headers, recipe, mode, [u])) for u in run]
            out.append((mode, run, (errors, deprecated, False)))
            run = [u for u in run if u not in errors]
            if not errors:
                break
        return out

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for batch in pool.map(go, plan):
            for mode, run, (errors, deprecated, _) in batch:  # later rounds: fewer units
                for u in run:
                    r = out.setdefault((u, mode), Result(u, mode))
                    r.error = r.error or errors.get(u)
                    r.deprecated = r.deprecated or deprecated.get(u, [])
    return [out[(u, m)] for u in units for m in u.modes if (u, m) in out]


def check_project(folder: str | os.PathLike, headers: Headers, jobs: int | None = None
                  ) -> list[Result]:
    """Every kernel of a written project (``graphkernel compile -o DIR``), by its manifest."""
    from graphkernel import limits
    from graphkernel.codegen import targets
    from graphkernel.fileio import read_bounded
    from graphkernel.flags import DEFAULT_TARGET

    root = Path(folder)
    man = root / "manifest.json"
    if not man.is_file():
        raise ConfigError(f"{root}: no manifest.json (a folder written by `graphkernel compile "
                          "MODEL -o DIR`)")
    try:
        manifest = json.loads(read_bounded(man, limits.MAX_MANIFEST_BYTES))
    except (OSError, ValueError) as e:
        raise ConfigError(f"{man}: not a readable manifest ({e})") from None
    if not isinstance(manifest, dict):
        raise ConfigError(f"{man}: not a graphkernel manifest (a JSON object is expected)")
    target = targets.load(str(manifest.get("target", DEFAULT_TARGET)))
    return check(project_units(root / "kernels", manifest), headers, target.npu_arch, jobs)


def check_rendered(rendered: Sequence, headers: Headers, supers: Sequence = (),
                   arch: int = 2201, jobs: int | None = None) -> list[Result]:
    """Rendered kernels (``backend.render_all``) checked from a temporary folder."""
    with tempfile.TemporaryDirectory(prefix="gk-realcheck-") as tmp:
        return check(write_units(rendered, supers, Path(tmp)), headers, arch, jobs)


def summary(results: Sequence[Result]) -> dict[str, object]:
    """Counts for a report: units and results, failures by their message's gist."""
    failed = [r for r in results if not r.ok]
    causes: dict[str, int] = {}
    for r in failed:
        gist = re.sub(r"^[^:]+:\d+: ", "", r.error or r.deprecated[0])
        gist = re.sub(r" \(in [^)]*\)$", "", gist)
        gist = re.sub(r"\bgk_\w+", "<kernel>", gist)
        causes[gist[:160]] = causes.get(gist[:160], 0) + 1
    kinds: dict[str, set[str]] = {}
    for r in results:
        kinds.setdefault(r.unit.kind, set()).add(r.unit.name)
    kernels = {n for k, names in kinds.items() if k not in ("host", "driver") for n in names}
    bad = {r.unit.name for r in failed}
    return {"kernels": len(kernels), "failed_kernels": len(bad & kernels),
            "tiling_files": len(kinds.get("host", ())), "drivers": len(kinds.get("driver", ())),
            "failed_other": len(bad - kernels), "results": len(results),
            "failed_results": len(failed), "causes": causes}
