"""``replace_kernel=DIR``: hand-edited kernel or tiling sources in place of generated ones.

AutoFuse's ``replace_kernel`` lets a user build with an edited kernel or tiling (to try a
fix or an optimisation without changing the generator). Here a file in DIR replaces the
generated file of the same name, as ``compile -o OUT`` writes them under ``OUT/kernels/``
(``gk_<kernel>_<hash>.cpp``, ``..._tiling.h``, ``..._tiling.cpp``): copy one, edit it, and
compile again with ``--replace_kernel=DIR``. The hash in the name is the generated code's,
so an edit made for other code (the model or the flags changed) matches nothing and is
reported, never built silently.

A replacement is accepted only once the simulator has built the kernel with it and run it
on seeded random inputs, and its outputs matched the kernel's reference (the numpy
interpreter on the kernel's body) within the tolerance of their dtype; otherwise the compile
stops with the reason. Accepted replacements are in ``CompileResult.replacements``: the
written project and ``--backend sim`` use them.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from graphkernel import limits
from graphkernel.errors import FlagError, GraphKernelError, printable
from graphkernel.fileio import read_bounded


def load(folder: str) -> dict[str, str]:
    """The regular files directly in ``folder``: file name -> text."""
    root = Path(folder)
    if not root.is_dir():
        raise FlagError(f"--replace_kernel={printable(folder)}: no such folder (give the "
                        "folder holding the edited kernel files)")
    files = {}
    for p in sorted(root.iterdir()):
        if p.is_file() and p.suffix in (".cpp", ".h"):
            try:
                files[p.name] = read_bounded(p, limits.MAX_FLAGS_FILE_BYTES * 16).decode()
            except (OSError, UnicodeDecodeError) as e:
                raise FlagError(f"--replace_kernel: {printable(str(p))}: cannot be read: "
                                f"{getattr(e, 'strerror', None) or e}") from None
    return files


def check_replacements(result: Any, folder: str) -> dict[str, dict[str, str]]:
    """The replacements in ``folder`` for ``result``'s generated kernels, each checked in the
    simulator: kernel symbol -> {file name: text}. A file that names no generated file is
    reported with a warning; one that does not build, or computes other values than the
    kernel's reference, is an error (FlagError: the file is the user's input)."""
    from graphkernel.codegen.backend import render_all, schedules, shared_kernels
    from graphkernel.flags import FlagWarning

    given = load(folder)
    rendered = render_all(schedules(result), shared_kernels(result))
    owner = {fname: r for r in rendered for fname in r.files}
    for fname in given:
        if fname not in owner:
            near = [f for f in owner if f.rsplit("_", 1)[0] == fname.rsplit("_", 1)[0]]
            hint = f" (the kernel's files are now {', '.join(sorted(near))})" if near else ""
            warnings.warn(f"--replace_kernel: {folder}/{fname} matches no generated file and "
                          f"is not used{hint}; file names are those `graphkernel compile -o "
                          "OUT` writes under OUT/kernels/", FlagWarning, stacklevel=2)
    out: dict[str, dict[str, str]] = {}
    for r in rendered:
        mine = {f: t for f, t in given.items() if f in r.files and t != r.files[f]}
        if mine:
            _check(result, dataclasses.replace(r, files={**r.files, **mine}), folder, mine)
            out[r.name] = mine
    return out


def _check(result: Any, r: Any, folder: str, mine: dict[str, str]) -> None:
    """Build ``r`` (a kernel with replaced files) in the simulator and compare its outputs
    with the kernel's reference on seeded random inputs: within the tolerance of their
    dtype, or no further from the reference than the generated kernel's (twice its error:
    an edit may round differently)."""
    from graphkernel.codegen import targets
    from graphkernel.codegen.backend import render_all, schedules
    from graphkernel.codegen.sim.execute import SimLibrary
    from graphkernel.interpreter import Interpreter, random_inputs
    from graphkernel.verify import compare

    names = ", ".join(f"{folder}/{f}" for f in sorted(mine))
    node = result.graph.node(r.schedule.node)
    sub = node.subgraph
    feeds = random_inputs(sub, seed=0)
    expected = Interpreter(sub).run(feeds)
    spec = targets.load(result.config.target)
    args = [feeds[v.name] for v in sub.inputs]
    shapes = [e.shape for e in expected]
    try:
        got = SimLibrary([r]).run(r.name, args, spec, shapes).outputs
    except GraphKernelError as e:
        lines = str(e).splitlines()
        first_error = next((x.strip() for x in lines if "error" in x), "")
        raise FlagError(f"--replace_kernel: {names} (kernel {node.name}): rejected, the "
                        f"simulator cannot build or run it: {lines[0]} {first_error}".rstrip()
                        ) from None
    generated = None
    for i, (v, want) in enumerate(zip(sub.outputs, expected, strict=True)):
        m = compare(np.asarray(got[i]), want, v.dtype, name=v.name)
        if m.passed:
            continue
        if generated is None:
            own = render_all({r.schedule.node: schedules(result)[r.schedule.node]})[0]
            generated = SimLibrary([own]).run(own.name, args, spec, shapes).outputs
        g = compare(np.asarray(generated[i]), want, v.dtype, name=v.name)
        if m.max_abs_err > 2 * g.max_abs_err + m.atol or m.new_nan_inf > g.new_nan_inf:
            raise FlagError(f"--replace_kernel: {names} (kernel {node.name}): rejected, output "
                            f"{v.name} differs from the kernel's reference: {m.line()}")
