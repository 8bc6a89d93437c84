"""pyproject.toml ships the whole package: every folder of Python modules is a listed package
and every data file the code reads (templates, included C++ fragments, target files, the
simulator's headers) is matched by its package's package-data, so ``pip install .`` gives a
tree that runs like the source tree."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _dirs() -> dict[str, Path]:
    cfg = _setuptools()
    dirs = {name: ROOT / name.replace(".", "/") for name in cfg["packages"]}
    return dirs | {name: ROOT / d for name, d in cfg.get("package-dir", {}).items()}


def test_every_folder_of_modules_is_a_listed_package():
    dirs = _dirs()
    listed = {d.resolve() for d in dirs.values()}
    for d in list(dirs.values()):
        for init in d.rglob("__init__.py"):
            if "__pycache__" in init.parts:
                continue
            assert init.parent.resolve() in listed, f"{init.parent} is not in pyproject's packages"


def test_every_data_file_is_package_data():
    cfg = _setuptools()
    data = cfg.get("package-data", {})
    dirs = _dirs()
    missing = []
    for name, d in dirs.items():
        own = {p.resolve() for n, q in dirs.items() if n != name and q != d
               for p in q.rglob("*") if q.resolve().is_relative_to(d.resolve())}
        for f in d.rglob("*"):
            if not f.is_file() or f.suffix in (".py", ".pyc") or "__pycache__" in f.parts \
                    or f.resolve() in own:
                continue
            rel = f.relative_to(d).as_posix()
            if not any(fnmatch.fnmatch(rel, pat) for pat in data.get(name, [])):
                missing.append(f"{name}: {rel}")
    assert not missing, f"data files pip install would leave out: {missing}"
