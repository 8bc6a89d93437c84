"""The simulator's build cache holds code graphkernel loads, so another local user must not be
able to plant it: the folder is the user's own (0700, owner checked, refused otherwise),
files are written under fresh names and renamed (a planted link is replaced, not followed),
and a library is loaded only when its content has the digest recorded when it was built.
A second user is simulated with folders of the wrong mode or owner and files planted
between graphkernel's steps."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from graphkernel.codegen.sim import runner
from graphkernel.codegen.sim.runner import SimulatorError

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
SOURCE = "extern \"C\" int gk_cache_probe() { return 42; }"

PLANTED_C = r"""
#include <cstdio>
__attribute__((constructor)) static void planted() {
    FILE* f = std::fopen(MARKER, "w");
    if (f) { std::fputs("the planted constructor ran", f); std::fclose(f); }
}
extern "C" int gk_cache_probe() { return 666; }
"""


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """No library loaded in this process yet; the cache where XDG_CACHE_HOME says."""
    monkeypatch.setattr(runner, "_LIBS", {})
    monkeypatch.delenv("GRAPHKERNEL_SIM_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "graphkernel" / "sim"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """SOURCE built once for the module (g++ compiles the simulator header with it: seconds),
    in a cache folder of its own: the library, its recorded digest and its source."""
    folder = tmp_path_factory.mktemp("built") / "sim"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runner, "_LIBS", {})
        mp.setenv("GRAPHKERNEL_SIM_CACHE", str(folder))
        assert runner.build([SOURCE]).gk_cache_probe() == 42
    return folder


def _built_before(built: Path) -> Path:
    """The cache as an earlier run left it: SOURCE's library, digest and source in it (as
    ``runner.build`` wrote them), none loaded in this process yet."""
    folder = runner.cache_dir()
    for f in built.iterdir():
        shutil.copy2(f, folder / f.name)
    return folder


def _no_compiler(monkeypatch):
    def refuse(*a, **kw):
        raise AssertionError("g++ must not run for a refused cache folder")

    monkeypatch.setattr(runner.subprocess, "Popen", refuse)


def _planted(tmp_path: Path) -> tuple[Path, Path]:
    marker = tmp_path / "marker"
    (tmp_path / "planted.cpp").write_text(PLANTED_C)
    so = tmp_path / "planted.so"
    subprocess.run(["g++", "-shared", "-fPIC", f'-DMARKER="{marker}"', str(tmp_path /
                    "planted.cpp"), "-o", str(so)], check=True)
    return so, marker


def test_the_cache_is_a_private_folder_in_the_users_cache(fresh):
    assert runner.cache_dir() == fresh
    st = os.lstat(fresh)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700
    assert st.st_uid == os.geteuid()


def test_without_xdg_the_cache_is_under_home(monkeypatch, tmp_path):
    monkeypatch.delenv("GRAPHKERNEL_SIM_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert runner.cache_dir() == tmp_path / ".cache" / "graphkernel" / "sim"


@pytest.mark.parametrize("mode", [0o777, 0o755, 0o770, 0o701])
def test_a_folder_others_can_use_is_refused(fresh, monkeypatch, mode):
    fresh.mkdir(parents=True)
    fresh.chmod(mode)
    _no_compiler(monkeypatch)
    with pytest.raises(SimulatorError, match=rf"has mode {mode:04o}: others can use it"):
        runner.build([SOURCE])


def test_a_folder_of_another_user_is_refused(fresh, monkeypatch):
    fresh.mkdir(parents=True, mode=0o700)
    fresh.chmod(0o700)
    if os.geteuid() == 0:  # a real second user
        os.chown(fresh, 65534, 65534)
    else:  # as this user, seen as someone else
        uid = os.geteuid()
        monkeypatch.setattr(runner.os, "geteuid", lambda: uid + 1)
    _no_compiler(monkeypatch)
    with pytest.raises(SimulatorError, match="is owned by user id .*, not by you"):
        runner.build([SOURCE])


def test_a_link_as_the_folder_is_refused(fresh, monkeypatch, tmp_path):
    (tmp_path / "theirs").mkdir(mode=0o700)
    fresh.parent.mkdir(parents=True)
    fresh.symlink_to(tmp_path / "theirs")
    _no_compiler(monkeypatch)
    with pytest.raises(SimulatorError, match="is a symbolic link"):
        runner.build([SOURCE])


@needs_gxx
@pytest.mark.sim
def test_a_library_without_its_recorded_digest_is_never_loaded(fresh, built, tmp_path,
                                                               monkeypatch):
    _built_before(built)
    lib = runner.build([SOURCE])
    assert lib.gk_cache_probe() == 42
    (so,) = fresh.glob("k_*.so")
    planted, marker = _planted(tmp_path)
    for record in ("deleted", "kept"):
        monkeypatch.setattr(runner, "_LIBS", {})
        # its content differs from what was recorded, or no record. Planted as a new file
        # renamed over the old one: writing into the library this process has mapped would
        # change its code under it (the exit handlers then run the planted bytes)
        os.replace(shutil.copy(planted, tmp_path / "swap.so"), so)
        if record == "deleted":
            (fresh / (so.name + ".sha256")).unlink()
        lib = runner.build([SOURCE])
        assert not marker.exists(), record
        assert lib.gk_cache_probe() == 42  # rebuilt from the source


@needs_gxx
@pytest.mark.sim
def test_the_library_loaded_is_the_one_checked(fresh, built, tmp_path, monkeypatch):
    """A library swapped in after graphkernel checked its digest is not what it loads."""
    _built_before(built)
    assert runner.build([SOURCE]).gk_cache_probe() == 42
    (so,) = fresh.glob("k_*.so")
    planted, marker = _planted(tmp_path)
    monkeypatch.setattr(runner, "_LIBS", {})
    checked = runner._verified

    def check_then_swap(folder, key):
        fd = checked(folder, key)
        os.replace(shutil.copy(planted, tmp_path / "swap.so"), so)
        return fd

    monkeypatch.setattr(runner, "_verified", check_then_swap)
    lib = runner.build([SOURCE])
    assert lib.gk_cache_probe() == 42 and not marker.exists()


@needs_gxx
@pytest.mark.sim
def test_a_planted_link_in_the_cache_is_replaced_not_followed(fresh, built, tmp_path):
    _built_before(built)
    assert runner.build([SOURCE]).gk_cache_probe() == 42
    (src,) = fresh.glob("k_*.cpp")
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    for name in (src.name, src.name[:-4] + ".so", src.name[:-4] + ".so.sha256"):
        (fresh / name).unlink()
        (fresh / name).symlink_to(victim)
    runner._LIBS.clear()
    assert runner.build([SOURCE]).gk_cache_probe() == 42
    assert victim.read_text() == "keep"
    assert not any(p.is_symlink() for p in fresh.iterdir())


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_a_cache_in_a_folder_others_can_write_is_refused(monkeypatch, tmp_path, mode):
    """The cache folder itself is checked, but a folder above it that others can write lets
    them rename it away and put their own in its place after the check (then they could
    replace what g++ wrote before it is hashed and loaded)."""
    monkeypatch.setattr(runner, "_LIBS", {})
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    monkeypatch.setenv("GRAPHKERNEL_SIM_CACHE", str(shared / "sim"))
    _no_compiler(monkeypatch)
    with pytest.raises(SimulatorError, match=rf"lies in {shared}, which has mode {mode:04o} "
                       r"\(others may write in it\)"):
        runner.build([SOURCE])
    # the same folder through a link (the link's target is what is checked)
    (tmp_path / "link").symlink_to(shared)
    monkeypatch.setenv("GRAPHKERNEL_SIM_CACHE", str(tmp_path / "link" / "sim"))
    with pytest.raises(SimulatorError, match=rf"lies in {tmp_path / 'link'}, which has mode "
                       f"{mode:04o}"):
        runner.cache_dir()


def test_a_cache_in_a_sticky_shared_folder_is_accepted(monkeypatch, tmp_path):
    """/tmp's sticky bit keeps others from renaming what they do not own."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    monkeypatch.setenv("GRAPHKERNEL_SIM_CACHE", str(shared / "sim"))
    assert runner.cache_dir() == shared / "sim"


def test_a_cache_below_another_users_folder_is_refused(monkeypatch, tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sim").mkdir(mode=0o700)
    if os.geteuid() == 0:  # a real second user
        os.chown(theirs, 65534, 65534)
    else:
        uid = os.geteuid()
        real_stat = os.stat
        monkeypatch.setattr(runner.os, "stat", lambda p, *a, **kw: os.stat_result(
            (*real_stat(p)[:4], 65534, *real_stat(p)[5:])) if Path(p) == theirs
            else real_stat(p, *a, **kw))
        assert uid != 65534
    monkeypatch.setenv("GRAPHKERNEL_SIM_CACHE", str(theirs / "sim"))
    with pytest.raises(SimulatorError, match=rf"lies in {theirs}, which is owned by user id "
                       "65534"):
        runner.cache_dir()
