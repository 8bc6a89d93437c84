"""The anchors' own flag strings, as their documentation writes them: every key AutoFuse or
MindSpore parses is accepted (honoured, mapped or warned as having no effect, as docs/flags.md
says), AutoFuse's semantics apply to a string in its vocabulary, and `flags --from` reads a
string key by key."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from graphkernel.anchors import AUTOFUSE_GROUPS, KEYS, MAPPED, NO_EFFECT
from graphkernel.api import load_config
from graphkernel.cli import main
from graphkernel.errors import FlagError
from graphkernel.flags import SPECS, FlagWarning

ROOT = Path(__file__).resolve().parent.parent

# AutoFuse's and MindSpore's documented examples, verbatim
AUTOFUSE_EXAMPLES = [
    ("AUTOFUSE_FLAGS", "--enable_autofuse=true;--autofuse_enable_pass=reduce,concat,slice,split,"
                       "gather,transpose;"),
    ("AUTOFUSE_FLAGS", "--enable_autofuse=true;--autofuse_enable_pass=reduce,concat"),
    ("AUTOFUSE_FLAGS", "--enable_autofuse=true;--autofuse_enable_pass=reduce,concat;"),
    ("AUTOFUSE_FLAGS", "--enable_autofuse=true;--autofuse_disable_pass=concat;"),
    ("AUTOFUSE_FLAGS", "--enable_autofuse=true;--autofuse_disable_pass=reduce;"),
    ("AUTOFUSE_FLAGS", "--enable_autofuse=false;"),
    ("AUTOFUSE_FLAGS", "--autofuse_disable_pass=reduce,concat"),
    ("AUTOFUSE_FLAGS", "--autofuse_enhance_precision_blacklist=Le,Where,Sub,Add,Sigmoid"),
    ("AUTOFUSE_FLAGS", "--recomputation_threshold=5"),
    ("AUTOFUSE_FLAGS", "--max_fusion_size=64"),
    ("AUTOFUSE_FLAGS", "--autofuse_enable_pgo=true"),
    ("AUTOFUSE_FLAGS", "--experimental_enable_jit_executor_v2=true"),
    ("AUTOFUSE_DFX_FLAGS", "--att_accuracy_level=1;--att_profiling=true"),
    ("AUTOFUSE_DFX_FLAGS", "--codegen_compile_debug=true;--debug_dir=dumps"),
    ("AUTOFUSE_DFX_FLAGS", "--autofuse_att_algorithm=HighPerf"),
    ("AUTOFUSE_DFX_FLAGS", "--att_enable_multicore_ub_tradeoff=true"),
    ("AUTOFUSE_DFX_FLAGS", "--att_ub_threshold=20"),
    ("AUTOFUSE_DFX_FLAGS", "--att_corenum_threshold=40"),
    ("AUTOFUSE_DFX_FLAGS", "--autofuse_enable_pgo=true --autofuse_pgo_algo=core_select"),
    ("AUTOFUSE_DFX_FLAGS", "--autofuse_enable_pgo=true --autofuse_pgo_algo=pruning "
                           "--autofuse_pgo_step_max=16"),
    ("AUTOFUSE_DFX_FLAGS", "--autofuse_enable_pgo=true --autofuse_pgo_topn=5"),
    ("AUTOFUSE_DFX_FLAGS", "--disable_lifting=true"),
    ("MS_DEV_GRAPH_KERNEL_FLAGS", "--opt_level=2 --dump_as_text"),
    ("MS_DEV_GRAPH_KERNEL_FLAGS", "--enable_expand_ops=Square --enable_cluster_ops=Exp "
                                  "--disable_pass=cse"),
]


@pytest.mark.parametrize("var,text", AUTOFUSE_EXAMPLES)
def test_documented_examples_are_accepted_verbatim(var, text, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for v in ("AUTOFUSE_FLAGS", "AUTOFUSE_DFX_FLAGS", "MS_DEV_GRAPH_KERNEL_FLAGS"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv(var, text)
    assert main(["flags", "--json"]) == 0, capsys.readouterr().err
    assert "error" not in capsys.readouterr().err


# every key the issue lists as refused before, with a value its anchor documents
LISTED = {
    "recomputation_threshold": "5", "autofuse_enhance_precision_blacklist": "Add,Sigmoid",
    "experimental_enable_jit_executor_v2": "true", "autofuse_enable_pgo": "true",
    "disable_lifting": "true", "subgraph_recover": "true", "autofuse_att_algorithm": "HighPerf",
    "att_accuracy_level": "1", "att_enable_small_shape_strategy": "true",
    "att_enable_multicore_ub_tradeoff": "true", "att_ub_threshold": "20",
    "att_corenum_threshold": "40", "att_profiling": "true",
    "autofuse_enable_tiling_cache": "true", "autofuse_pgo_algo": "pruning",
    "autofuse_pgo_step_max": "16", "autofuse_pgo_topn": "5", "replace_kernel": ".",
    "enable_dynamic_shape_fusion": "true", "fusion_ops_level": "1",
    "disable_matmul_post_fusion": "true", "enable_allreduce_prologue_fusion": "true",
    "enable_allreduce_epilogue_fusion": "true", "exact_precision_mode": "true",
    "cpu_refer_thread_num": "8", "repository_path": "repo.json", "target_os": "linux",
    "cpu_arch": "x86_64", "cpu_feature": "avx512", "cpu_type": "skylake-avx512",
    "enable_simplify_exprs_only": "a,b", "disable_simplify_exprs": "a",
    "enable_packet_ops_only": "Shape", "disable_packet_ops": "Shape",
}


def test_the_catalogue_covers_every_listed_key_and_every_key_is_accepted_somewhere():
    assert set(LISTED) <= set(KEYS)
    for k in KEYS.values():  # no effect: checked, then warned; else a flag graphkernel reads
        assert (k.name in SPECS) != (k.verdict == NO_EFFECT), k.name


@pytest.mark.parametrize("key", sorted(LISTED))
def test_every_listed_key_is_honoured_mapped_or_warned_as_docs_say(key):
    item = f"--{key}={LISTED[key]}"
    with pytest.warns(FlagWarning) if KEYS[key].verdict == NO_EFFECT else _no_flag_warning():
        cfg = load_config(item, env={})
    if KEYS[key].verdict == NO_EFFECT:
        assert any(f"--{key} is accepted for compatibility" in w and "no effect" in w
                   for w in cfg.warnings)
    else:  # it set something (a graphkernel key, named in the catalogue's "graphkernel")
        changed = [k for k, e in cfg.to_dict().items() if e["origin"] == "explicit"]
        assert changed and any(c in KEYS[key].graphkernel for c in changed), (key, changed)


class _no_flag_warning:
    def __enter__(self):
        import warnings

        self.cm = warnings.catch_warnings(record=True)
        self.seen = self.cm.__enter__()
        warnings.simplefilter("always")

    def __exit__(self, *exc):
        self.cm.__exit__(*exc)
        assert not [w for w in self.seen if issubclass(w.category, FlagWarning)
                    and "compatibility" in str(w.message)]


@pytest.mark.parametrize("flags,message", [
    ("--att_accuracy_level=2", "--att_accuracy_level=2: out of range (accepted: 0..1)"),
    ("--autofuse_pgo_step_max=12", "(accepted: 2..1024, a power of two)"),
    ("--autofuse_att_algorithm=HighPref", "did you mean 'HighPerf'"),
    ("--att_profiling=maybe", "not a boolean"),
    ("--autofuse_enable_pass=scater", "unknown AutoFuse pass; did you mean"),
    ("--recomputation_threshold=256", "out of range (accepted: 0..255)"),
    ("--autofuse_enhance_precision_blacklist=Sum", "ReduceSum always computes in fp32"),
    ("--att_profilng=true", "unknown flag --att_profilng; did you mean 'att_profiling'"),
])
def test_values_of_anchor_keys_are_still_checked(flags, message):
    with pytest.raises(FlagError) as e:
        load_config(flags, env={})
    assert message in str(e.value)


def test_a_key_no_anchor_knows_still_exits_2(monkeypatch, capsys):
    monkeypatch.setenv("AUTOFUSE_FLAGS", "--enable_autofuse=true;--autofuse_no_such=1")
    assert main(["flags"]) == 2
    assert "unknown flag --autofuse_no_such" in capsys.readouterr().err


def test_autofuse_vocabulary_turns_off_what_it_does_not_list():
    """AutoFuse's rule: reduce, concat, slice, split, gather, transpose, matmul and conv fusion
    are off unless listed in autofuse_enable_pass."""
    plain = load_config("", env={})
    af = load_config(env={"AUTOFUSE_FLAGS": "--enable_autofuse=true;--autofuse_enable_pass=concat"})
    off = set(af.disable_fusion_pattern)
    assert {"reduce_fwd_depth", "reduce_bwd", "slice", "transpose", "matmul_depth"} <= off
    assert "concat" not in off and af.enable_fusion_pattern == ["concat"]
    assert {"ReduceSum", "Transpose", "Slice"} <= set(af.disable_cluster_ops)
    assert not plain.disable_fusion_pattern and not plain.disable_cluster_ops
    assert "AutoFuse semantics" in af.notes["disable_fusion_pattern"]
    assert af.origin("disable_fusion_pattern").startswith("env AUTOFUSE_FLAGS (AutoFuse semantics")
    # a higher source that names a group enables it again
    again = load_config("--autofuse_enable_pass=reduce",
                        env={"AUTOFUSE_FLAGS": "--enable_autofuse=true"})
    assert "reduce_fwd_depth" not in again.disable_fusion_pattern
    assert "ReduceSum" not in again.disable_cluster_ops


def test_autofuse_semantics_change_what_fuses():
    import graphkernel

    ex = "examples/layernorm_residual.json"
    plain = graphkernel.compile(ex, "--disable_pass=codegen", env={})
    af = graphkernel.compile(ex, "--disable_pass=codegen",
                             env={"AUTOFUSE_FLAGS": "--enable_autofuse=true"})
    with_reduce = graphkernel.compile(ex, "--disable_pass=codegen", env={
        "AUTOFUSE_FLAGS": "--enable_autofuse=true;--autofuse_enable_pass=reduce"})

    def fused_reductions(res):
        return sum(m.op == "ReduceSum" for n in res.graph.nodes if n.op == "GraphKernel"
                   for m in n.subgraph.nodes)

    assert fused_reductions(plain) == 2 and fused_reductions(with_reduce) == 2
    assert fused_reductions(af) == 0  # reduce fusion is off unless listed


def test_flags_output_says_per_key_that_autofuse_semantics_applied(monkeypatch, capsys):
    monkeypatch.setenv("AUTOFUSE_FLAGS", "--enable_autofuse=true;--autofuse_enable_pass=reduce")
    assert main(["flags"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("disable_fusion_pattern"))
    assert "AutoFuse semantics" in line
    assert ("note: AutoFuse semantics: concat, slice, split, gather, transpose, matmul fusion "
            "off") in out
    assert main(["flags", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert "reduce" not in d["disable_fusion_pattern"]["note"].split(":")[1].split("fusion")[0]


def test_mapped_keys_switch_what_they_name():
    c = load_config("--disable_lifting=true --disable_matmul_post_fusion --subgraph_recover "
                    "--recomputation_threshold=0 --max_fusion_size=7", env={})
    assert c.enable_single_node_fusion and c.dump_kernel_graphs
    assert c.disable_fusion_pattern == ["matmul_depth"] and c.recompute_max_consumers == 0
    assert c.composite_op_limit_size == 7
    assert load_config("--autofuse_enhance_precision_blacklist=Le,Where,Sub,Add,Sigmoid",
                       env={}).precision_blacklist_kernels == [
        "LessEqual", "Select", "Sub", "Add", "Sigmoid"]


def test_a_flags_file_may_not_choose_kernels_to_build(tmp_path):
    (tmp_path / "f.yaml").write_text("replace_kernel: .\n")
    with pytest.raises(FlagError, match="a flags file may not choose code to build and run"):
        load_config("", tmp_path / "f.yaml", env={})


# ---------------------------------------------------------------- flags --from
def test_flags_from_autofuse_gives_a_verdict_per_key(capsys):
    text = ("--enable_autofuse=true;--autofuse_enable_pass=reduce,concat,slice,split,conv,"
            "gather,transpose;--max_fusion_size=32 --att_profiling=true")
    assert main(["flags", "--from", "autofuse", text, "--json"]) == 0
    t = json.loads(capsys.readouterr().out)
    by = {i["key"]: i for i in t["items"]}
    assert by["enable_autofuse"]["verdict"] == MAPPED
    assert by["autofuse_enable_pass"]["becomes"][0].startswith(
        "--enable_fusion_pattern=reduce_fwd_depth")
    assert by["max_fusion_size"]["becomes"] == ["--composite_op_limit_size=32"]
    assert by["att_profiling"]["verdict"] == NO_EFFECT
    # AutoFuse splits on ';' only: the space-separated pair is one item with two '=' to it
    assert any("AutoFuse does not read this item" in d for d in by["max_fusion_size"]["differs"])
    assert not any("does not read" in d for d in by["enable_autofuse"]["differs"])
    assert any("matmul fusion off" in n for n in t["notes"])
    assert any(n.startswith("conv: no such fusion") for n in t["notes"])
    assert t["effective"]["composite_op_limit_size"] == 32
    assert "--disable_fusion_pattern=matmul_depth" in t["flags"]
    # the effective string reproduces the configuration
    again = load_config(t["flags"], env={})
    assert again.disable_fusion_pattern == ["matmul_depth", "product_views"]


def test_flags_from_mindspore_reads_its_grammar(capsys):
    text = "--opt_level=3 --enable_stitch_fusion --opt_level=1 --disable_matmul_post_fusion=TRUE"
    assert main(["flags", "--from", "mindspore", text]) == 0
    out = capsys.readouterr().out
    assert "MindSpore keeps the first value (3), graphkernel the last" in out
    assert "--enable_stitch_fusion" in out and "no effect: graphkernel has no stitch fusion" in out
    assert "MindSpore does not read the boolean 'TRUE'" in out
    assert re.search(r"opt_level\s+1", out)


def test_flags_from_reads_the_environment_when_no_string_is_given(monkeypatch, capsys):
    monkeypatch.setenv("AUTOFUSE_DFX_FLAGS", "--att_accuracy_level=1;--att_profiling=true")
    monkeypatch.setenv("AUTOFUSE_FLAGS", "--enable_autofuse=true;--codegen_compile_debug=true")
    assert main(["flags", "--from", "autofuse"]) == 0
    out = capsys.readouterr().out
    assert "from AUTOFUSE_DFX_FLAGS" in out and "from AUTOFUSE_FLAGS" in out
    assert "AutoFuse reads this key from AUTOFUSE_DFX_FLAGS only" in out  # codegen_compile_debug
    assert re.search(r"keep_codegen_project\s+true", out)


def test_flags_anchors_table_is_in_the_docs(capsys):
    assert main(["flags", "--anchors", "--markdown"]) == 0
    table = capsys.readouterr().out.strip()
    doc = (ROOT / "docs" / "flags.md").read_text()
    m = re.search(r"<!-- generated by `graphkernel flags --anchors --markdown` -->\n(.*?)\n"
                  r"<!-- end of generated table -->", doc, re.S)
    assert m and m.group(1) == table, "regenerate docs/flags.md's table"
    for name in AUTOFUSE_GROUPS:
        assert f"| `{name}` |" in table
