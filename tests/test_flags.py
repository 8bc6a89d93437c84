"""Flag grammar, config files, environment, precedence, origins and every documented error."""

from __future__ import annotations

import json

import pytest

from graphkernel.api import load_config
from graphkernel.errors import ConfigError, FlagError
from graphkernel.flags import parse_flag_string, resolve
from graphkernel.pipeline import plan

NOENV: dict[str, str] = {}


def cfg(flags="", config=None, env=NOENV):
    return load_config(flags, config, env=env)


@pytest.mark.parametrize("text", [
    "--opt_level=1 --disable_pass=cse",
    "--opt_level=1;--disable_pass=cse",
    "  --opt_level=1 ;; --disable_pass=cse ; ",
    "--opt_level=1\t--disable_pass=cse",
])
def test_separators(text):
    c = cfg(text)
    assert c.opt_level == 1 and c.disable_pass == ["cse"]


@pytest.mark.parametrize("spelling,value", [("true", True), ("TRUE", True), ("on", True),
                                            ("On", True), ("1", True), ("false", False),
                                            ("OFF", False), ("0", False)])
def test_boolean_spellings(spelling, value):
    assert cfg(f"--dump_as_text={spelling}").dump_as_text is value


def test_bare_boolean_is_true():
    assert cfg("--dump_as_text --print_bisect").print_bisect is True


def test_lists_trim_spaces_and_accumulate():
    c = cfg("--disable_pass=cse,dce:2;--disable_pass=cast_elim")
    assert c.disable_pass == ["cse", "dce:2", "cast_elim"]
    c = resolve({"disable_pass": [" cse ", "dce:2"]}, env=NOENV)
    assert c.disable_pass == ["cse", "dce:2"]


def test_repeated_scalar_takes_the_last_value_with_a_warning():
    with pytest.warns(UserWarning, match="given more than once; the last value"):
        c = cfg("--opt_level=1 --opt_level=3")
    assert c.opt_level == 3


def test_path_and_config_files(tmp_path):
    (tmp_path / "f.json").write_text(json.dumps({"opt_level": 1, "disable_pass": ["cse"],
                                                 "dump_as_text": True}))
    (tmp_path / "f.yaml").write_text("opt_level: 3\nreduce_fuse_depth: 4\n")
    c = cfg(f"--path={tmp_path / 'f.json'}")
    assert (c.opt_level, c.disable_pass, c.dump_as_text) == (1, ["cse"], True)
    assert c.origin("opt_level") == f"file {tmp_path / 'f.json'}"
    c = cfg("--opt_level=2", config=tmp_path / "f.yaml")
    assert c.opt_level == 2 and c.origin("opt_level") == "explicit"  # explicit beats file
    assert c.reduce_fuse_depth == 4 and c.origin("reduce_fuse_depth").startswith("file")


def test_precedence_default_file_env_explicit(tmp_path):
    (tmp_path / "f.yaml").write_text("opt_level: 1\nreduce_fuse_depth: 4\nbisect_limit: 7\n")
    env = {"AUTOFUSE_FLAGS": "--opt_level=3 --reduce_fuse_depth=5"}
    c = cfg("--opt_level=0", config=tmp_path / "f.yaml", env=env)
    assert (c.opt_level, c.origin("opt_level")) == (0, "explicit")
    assert (c.reduce_fuse_depth, c.origin("reduce_fuse_depth")) == (5, "env AUTOFUSE_FLAGS")
    assert c.bisect_limit == 7 and c.origin("bisect_limit").startswith("file")
    assert (c.broadcast_fuse_depth, c.origin("broadcast_fuse_depth")) == (6, "default")


def test_env_sources():
    c = cfg(env={"AUTOFUSE_DFX_FLAGS": "--print_bisect --opt_level=1",
                 "AUTOFUSE_FLAGS": "--opt_level=3"})
    assert c.opt_level == 3 and c.print_bisect  # AUTOFUSE_FLAGS after AUTOFUSE_DFX_FLAGS
    c = cfg(env={"MS_DEV_GRAPH_KERNEL_FLAGS": "--opt_level=1"})
    assert c.opt_level == 1 and c.origin("opt_level") == "env MS_DEV_GRAPH_KERNEL_FLAGS"
    c = cfg(env={"MS_DEV_GRAPH_KERNEL_FLAGS": "--opt_level=1", "AUTOFUSE_FLAGS": "--dump_as_text"})
    assert c.opt_level == 2  # MindSpore's variable is read only when AUTOFUSE_FLAGS is unset


def test_opt_level_defaults_of_feature_flags():
    assert not cfg("--opt_level=1").feature("enable_recompute_fusion", 2)
    assert cfg("--opt_level=2").feature("enable_recompute_fusion", 2)
    assert cfg("--opt_level=1 --enable_recompute_fusion").feature("enable_recompute_fusion", 2)


@pytest.mark.parametrize("flags,message", [
    ("--disable_pas=cse", "unknown flag --disable_pas; did you mean 'disable_pass'"),
    ("--opt_level=4", "--opt_level=4: input should be less than or equal to 3 (accepted: 0..3)"),
    ("--opt_level=-1", "(accepted: 0..3)"),
    ("--opt_level=2x", "--opt_level=2x: not an integer"),
    ("--dump_as_text=maybe", "not a boolean (accepted: true/false, on/off, 1/0"),
    ("--disable_pass=cse,,dce", "empty item in list"),
    ("--disable_pass=cs", "pass selector 'cs' matches no pass; did you mean 'cse'"),
    ("--disable_pass=validate", "pass 'validate' is required"),
    ("--disable_pass=9.9", "pass selector '9.9' matches no pass"),
    ("--disable_pass=cse:2", "pass selector 'cse:2' matches no pass"),
    ("--enable_pass=cse --disable_pass=cse", "'cse' is in both --enable_pass"),
    ("--disable_cluster_ops=Adx", "unknown op 'Adx'; did you mean 'Add'"),
    ("--enable_expand_ops=Add", "'Add' has no expander"),
    ("--disable_expand_ops=GeLu", "unknown op 'GeLu'; did you mean 'GeLU'"),
    ("--target=ascend910x", "unknown value; did you mean 'ascend910b'"),
    ("--reduce_fuse_depth=0", "(accepted: >= 1)"),
    ("opt_level=1", "malformed flag 'opt_level=1': expected --key=value"),
    ("--Opt_Level=1", "malformed flag key 'Opt_Level'"),
    ("--autofuse_disable_pass=reduse",
     "--autofuse_disable_pass=reduse: unknown AutoFuse pass; did you mean 'reduce'"),
    ("--skip_node_names_cfg=/no/such.ini", "no such file"),
])
def test_errors_name_the_item_and_suggest(flags, message):
    with pytest.raises(FlagError) as e:
        cfg(flags)
    assert message in str(e.value)


def test_unknown_key_in_env_names_the_variable():
    with pytest.raises(FlagError, match="env AUTOFUSE_FLAGS: unknown flag --opt_levle"):
        cfg(env={"AUTOFUSE_FLAGS": "--opt_levle=1"})


def test_compat_keys_warn_not_fail():
    with pytest.warns(UserWarning, match="online_tuning is accepted for compatibility"):
        c = cfg("--online_tuning=1 --opt_level=1")
    assert c.opt_level == 1 and any("online_tuning" in w for w in c.warnings)


def test_autofuse_keys_are_mapped(tmp_path):
    c = cfg("--enable_autofuse=false")
    assert c.opt_level == 0 and c.origin("opt_level") == "explicit"
    assert cfg("--enable_autofuse=true --opt_level=3").opt_level == 3
    c = cfg("--autofuse_disable_pass=reduce,slice;--autofuse_enable_pass=concat")
    assert {"reduce_fwd_depth", "reduce_fwd_width", "slice"} <= set(c.disable_fusion_pattern)
    assert {"ReduceSum", "Slice"} <= set(c.disable_cluster_ops)
    assert c.enable_fusion_pattern == ["concat"] and "concat" not in c.disable_fusion_pattern
    c = cfg("--max_fusion_size=32 --codegen_compile_debug")
    assert c.composite_op_limit_size == 32 and c.keep_codegen_project
    ini = tmp_path / "skip.ini"
    ini.write_text("[ByNodeName]\nfc_bias_add\nln_sum\n[ByNodeType]\nReduceSum\n")
    c = cfg(f"--skip_node_names_cfg={ini}")
    assert c.skip_node_names == ["fc_bias_add", "ln_sum"] and c.skip_node_types == ["ReduceSum"]
    bad = tmp_path / "bad.ini"
    bad.write_text("[Nodes]\nx\n")
    with pytest.raises(FlagError, match=r"unknown section \[Nodes\]"):
        cfg(f"--skip_node_names_cfg={bad}")


def test_config_file_errors(tmp_path):
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="expected a mapping of flag names"):
        cfg(config=tmp_path / "list.yaml")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ConfigError, match="not valid JSON"):
        cfg(config=tmp_path / "bad.json")
    with pytest.raises(ConfigError, match="does not exist"):
        cfg("--path=/nope/flags.yaml")
    (tmp_path / "typo.yaml").write_text("opt_levl: 1\n")
    with pytest.raises(FlagError, match="unknown flag --opt_levl; did you mean 'opt_level'"):
        cfg(config=tmp_path / "typo.yaml")


def test_origins_are_recorded_for_every_key():
    c = cfg("--opt_level=1", env={"AUTOFUSE_FLAGS": "--disable_pass=cse"})
    d = c.to_dict()
    assert d["opt_level"] == {"value": 1, "origin": "explicit"}
    assert d["disable_pass"]["origin"] == "env AUTOFUSE_FLAGS"
    assert all(set(v) - {"set_through"} == {"value", "origin"} for v in d.values())


def test_every_key_flags_shows_can_be_set_by_a_flag():
    """A key of the Config is either a flag or names the AutoFuse flag that sets it, and that
    flag does set it."""
    from graphkernel.flags import SET_THROUGH, SPECS

    d = cfg("").to_dict()
    assert all(k in SPECS or d[k]["set_through"] in SPECS for k in d)
    c = cfg("--autofuse_enable_pass=concat --codegen_compile_debug")
    key = "enable_fusion_pattern"
    assert c.to_dict()[key]["set_through"] == SET_THROUGH[key]
    assert c.value(key) and c.origin(key) == "explicit"
    assert c.value("keep_codegen_project") and c.origin("keep_codegen_project") == "explicit"


def test_parse_items_keep_their_origin():
    items = parse_flag_string("--a=1;--b", "env X")
    assert [(i.key, i.value, i.origin) for i in items] == [("a", "1", "env X"),
                                                           ("b", None, "env X")]


# ------------------------------------------------------- effective values and precedence
@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_level_defaults_show_the_value_in_effect_and_the_level(level):
    d = cfg(f"--opt_level={level}").to_dict()
    assert d["enable_recompute_fusion"] == {"value": level >= 2, "origin": f"default@opt{level}"}
    assert d["enable_super_kernel"] == {"value": level >= 3, "origin": f"default@opt{level}"}
    assert d["reduce_fuse_depth"] == {"value": 10, "origin": "default"}  # not level-dependent
    assert all(v["value"] is not None for v in d.values())


def test_a_level_default_given_explicitly_keeps_its_origin():
    c = cfg("--opt_level=3", env={"AUTOFUSE_FLAGS": "--enable_recompute_fusion=false"})
    assert c.enable_recompute_fusion is False
    assert c.origin("enable_recompute_fusion") == "env AUTOFUSE_FLAGS"
    d = {x.slot.name: x for x in plan(c)}
    assert not d["recompute"].on and d["recompute"].reason == "--enable_recompute_fusion=false"


SOURCES = ("file", "env", "explicit")


def _sources(tmp_path, enable: str | None, disable: str | None, name="cse", keys=None):
    """Flags, config file and environment that enable/disable ``name`` from the given sources."""
    en_key, dis_key = keys or ("enable_pass", "disable_pass")
    flags, env, doc = ["--opt_level=1"], {}, {}
    for key, src in ((en_key, enable), (dis_key, disable)):
        if src == "explicit":
            flags.append(f"--{key}={name}")
        elif src == "env":
            env["AUTOFUSE_FLAGS"] = (env.get("AUTOFUSE_FLAGS", "") + f" --{key}={name}").strip()
        elif src == "file":
            doc[key] = [name]
    path = tmp_path / "flags.json"
    path.write_text(json.dumps(doc))
    return " ".join(flags), path, env


@pytest.mark.parametrize("enable", [None, *SOURCES])
@pytest.mark.parametrize("disable", [None, *SOURCES])
def test_enable_and_disable_pass_follow_precedence_per_pass(tmp_path, enable, disable):
    # cse is off at opt_level 1, so enabling it shows; every combination of sources
    flags, path, env = _sources(tmp_path, enable, disable)
    if enable is not None and enable == disable:
        with pytest.raises(FlagError, match="'cse' is in both --enable_pass"):
            cfg(flags, config=path, env=env)
        return
    c = cfg(flags, config=path, env=env)
    d = {x.slot.label: x for x in plan(c)}["cse"]
    rank = {None: -1, "file": 1, "env": 2, "explicit": 3}
    if enable is None and disable is None:
        assert not d.on and d.reason == "level 2 > opt_level 1"
    elif rank[enable] > rank[disable]:
        assert d.on and d.reason.startswith("forced by --enable_pass=cse (" + enable)
    else:
        assert not d.on and d.reason.startswith("disabled by --disable_pass=cse (" + disable)
    if enable is not None and disable is not None:
        assert len(c.overrides) == 1 and "overrides" in c.overrides[0]


def test_overlapping_selectors_follow_their_sources():
    # every run of dce disabled in the environment; its second run re-enabled explicitly
    c = cfg("--enable_pass=dce:2", env={"AUTOFUSE_FLAGS": "--disable_pass=dce"})
    d = {x.slot.label: x for x in plan(c)}
    assert not d["dce:1"].on and d["dce:2"].on
    # the other way round: the explicit disable of every run wins over the env's dce:2
    c = cfg("--disable_pass=dce", env={"AUTOFUSE_FLAGS": "--enable_pass=dce:2"})
    d = {x.slot.label: x for x in plan(c)}
    assert not d["dce:1"].on and not d["dce:2"].on
    # one source naming both: disabling wins
    d = {x.slot.label: x for x in plan(cfg("--disable_pass=dce --enable_pass=dce:2"))}
    assert not d["dce:2"].on


@pytest.mark.parametrize("keys,name", [(("enable_expand_ops", "disable_expand_ops"), "Erf"),
                                       (("enable_cluster_ops", "disable_cluster_ops"), "Exp")])
def test_other_enable_disable_lists_follow_precedence_too(tmp_path, keys, name):
    flags, path, env = _sources(tmp_path, "explicit", "env", name, keys)
    c = cfg(flags, config=path, env=env)
    assert getattr(c, keys[0]) == [name] and getattr(c, keys[1]) == []
    flags, path, env = _sources(tmp_path, "file", "env", name, keys)
    c = cfg(flags, config=path, env=env)
    assert getattr(c, keys[0]) == [] and getattr(c, keys[1]) == [name]


def test_mindspore_flag_names_switch_what_they_name(tmp_path):
    """enable_horizontal_fusion is MindSpore's name for the parallel (horizontal) fusion pass;
    enable_stitch_fusion is accepted with a warning that it does nothing here."""
    c = cfg("--opt_level=3 --enable_horizontal_fusion=false")
    assert c.enable_parallel_fusion is False and c.origin("enable_parallel_fusion") == "explicit"
    on = {d.slot.name for d in plan(c) if d.on}
    assert "parallel_fusion" not in on
    assert "parallel_fusion" in {d.slot.name for d in plan(cfg("--opt_level=3")) if d.on}
    with pytest.warns(UserWarning, match="enable_stitch_fusion is accepted for compatibility"):
        cfg("--enable_stitch_fusion=true")


def test_keep_codegen_project_writes_the_kernel_project_with_the_dumps(tmp_path):
    from graphkernel.api import compile as gk_compile

    keep = tmp_path / "dumps"
    gk_compile("examples/layernorm_residual.json",
               f"--codegen_compile_debug --debug_dir={keep}", env=NOENV)
    manifest = json.loads((keep / "manifest.json").read_text())
    sources = sorted(p.name for p in (keep / "kernels").glob("*.cpp"))
    assert manifest["kernels"] and sources
    assert {k["name"] + ".cpp" for k in manifest["kernels"]} <= set(sources)
    gk_compile("examples/layernorm_residual.json", f"--debug_dir={tmp_path / 'none'}", env=NOENV)
    assert not (tmp_path / "none").exists()
