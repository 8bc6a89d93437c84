"""The package layout: the subpackages beside ``graphkernel/`` in a source tree are found
without the repository root joining the package's search path, so walking the package
terminates (``TORCH_LOGS=graphkernel`` walks it while ``import torch`` runs)."""

from __future__ import annotations

import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import graphkernel

ROOT = Path(__file__).parents[2]


def test_the_package_path_holds_only_the_package_folder():
    assert [Path(p).resolve() for p in graphkernel.__path__] == \
        [Path(graphkernel.__file__).resolve().parent]


def test_walking_the_package_finishes_without_recursing():
    names = [m.name for m in pkgutil.walk_packages(graphkernel.__path__, "graphkernel.")]
    assert "graphkernel.frontends.json_format" in names
    assert not any(n.startswith("graphkernel.graphkernel") for n in names)
    assert len(names) < 500


def test_subpackages_come_from_the_same_checkout():
    import graphkernel.codegen.sim.runner as runner
    import graphkernel.passes as passes

    here = Path(graphkernel.__file__).resolve().parents[1]
    assert Path(passes.__file__).resolve() == here / "passes" / "__init__.py"
    assert Path(runner.__file__).resolve() == here / "codegen" / "sim" / "runner.py"


@pytest.mark.slow
def test_torch_logs_naming_graphkernel_does_not_hang_import_torch():
    pytest.importorskip("torch")
    env = dict(os.environ, TORCH_LOGS="graphkernel",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", "import torch, graphkernel; print('imported')"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "imported" in proc.stdout, proc.stderr[-2000:]
