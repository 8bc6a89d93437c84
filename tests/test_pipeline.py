"""The pass manager: level gating, selectors, the enable rule, bisect counter, dumps, reports."""

from __future__ import annotations

import numpy as np
import pytest

import graphkernel
from graphkernel import Graph, TensorType, registry
from graphkernel.api import load_config
from graphkernel.codegen import targets
from graphkernel.errors import FlagError, OutputError, PluginError
from graphkernel.interpreter import random_inputs, run_graph
from graphkernel.pipeline import PassFailure, PassManager, build_pipeline, decide, plan
from graphkernel.registry import PassResult

NOENV: dict[str, str] = {}

# The catalogue's levels (passes-and-patterns.md) for the passes this build registers.
CATALOGUE = {"validate": 0, "axis_normalize": 1, "expand": 1, "constant_fold": 2,
             "arith_simplify": 2, "cse": 2, "reshape_elim": 2, "transpose_elim": 2,
             "channels_last": 2, "concat_sink": 2, "cast_elim": 2, "attention": 2,
             "conv_bn_fold": 2, "conv_matmul": 2, "dce": 1,
             "cluster": 1, "split": 1, "recompute": 2,
             "parallel_fusion": 3, "codegen": 1, "super_kernel": 3, "matmul_group": 2,
             "promote_precision": 2, "scan": 2, "matvec": 2, "transpose_view": 2,
             "product_broadcast": 2, "small_ints": 2, "rotary_pairs": 2, "rotary_halves": 2,
             "attention_sinks": 2,
             "moe_routing": 2, "window_fusion": 2, "conv_fusion": 2, "transpose_hoist": 2,
             "product_transpose": 2, "slice_phases": 2, "split_slices": 2,
             "scan_loop": 2, "scan_prologue": 2, "interleaved_columns": 2,
             "pool_into_product": 2, "product_zero_blocks": 2, "scatter_slices": 2,
             "sibling_fusion": 2, "reduce_merge": 2, "movement_gather": 2, "trisolve": 2}


def on_passes(flags: str) -> set[str]:
    return {d.slot.name for d in plan(load_config(flags, env=NOENV)) if d.on}


@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_level_gating_matches_the_catalogue(level):
    want = {n for n, lvl in CATALOGUE.items() if lvl <= level} | {"validate"}
    assert on_passes(f"--opt_level={level}") == want


def test_every_registered_pass_is_in_the_catalogue_with_its_level():
    for name, info in registry.PASSES.items():
        if name in CATALOGUE:
            assert info.level == CATALOGUE[name], name


def test_every_pass_name_equals_its_module_name():
    for name, info in registry.PASSES.items():
        if info.fn.__module__.startswith("graphkernel.passes."):
            assert info.fn.__module__.rsplit(".", 1)[1] == name


# The enable rule as a table: (required, disabled, forced, level, opt_level) -> on
RULE_TABLE = [
    (True, False, False, 0, 0, True), (False, True, False, 1, 3, False),
    (False, False, True, 3, 0, True), (False, False, False, 2, 2, True),
    (False, False, False, 2, 1, False), (False, True, True, 2, 3, False),
]


@pytest.mark.parametrize("required,disabled,forced,level,opt,want", RULE_TABLE)
def test_enable_rule_table(required, disabled, forced, level, opt, want):
    info = registry.PassInfo("p", "simplify", level, 0, required, None, "", lambda g, c: None)
    from graphkernel.pipeline import PassSlot

    slot = PassSlot(info, "simplify", 2, 0, 1, 1)
    cfg = load_config(f"--opt_level={opt}", env=NOENV)
    d = decide(slot, cfg, {id(slot): "p"} if forced else {}, {id(slot): "p"} if disabled else {})
    assert d.on is want


@pytest.mark.parametrize("selector,expect_off", [
    ("cse", {"cse"}), ("simplify.cse", {"cse"}), ("2.2", {"cse"}), ("dce:2", {"dce:2"}),
    ("dce", {"dce:1", "dce:2"}), ("expand.dce", {"dce:1"}), ("1.0", {"expand"}),
])
def test_selector_forms(selector, expect_off):
    decisions = plan(load_config(f"--disable_pass={selector}", env=NOENV))
    off = {d.slot.label for d in decisions if d.reason.startswith("disabled by")}
    assert off == expect_off


def test_enable_pass_forces_a_pass_its_level_skips():
    d = {x.slot.label: x for x in plan(load_config("--opt_level=1 --enable_pass=cse", env=NOENV))}
    assert d["cse"].on and d["cse"].reason == "forced by --enable_pass=cse (explicit)"
    assert not d["arith_simplify"].on


def test_numeric_indices_are_stage_and_position():
    slots = build_pipeline()
    assert [s.index for s in slots if s.stage == "preprocess"] == ["0.0", "0.1"]
    assert {s.stage_index for s in slots if s.stage == "simplify"} == {2}


def graph_with_rewrites() -> Graph:
    """A graph on which the simplification passes make several rewrites."""
    g = Graph("rw")
    x = g.add_input("x", TensorType((4, 8), "float32"))
    one = g.const(np.float32(1.0))
    a = g.add_node("Mul", [x, one], name="mul1").output
    b = g.add_node("Neg", [g.add_node("Neg", [a], name="neg1").output], name="neg2").output
    c = g.add_node("Exp", [b], name="exp1").output
    d = g.add_node("Exp", [b], name="exp2").output
    e = g.add_node("Add", [c, d], name="add").output
    r = g.add_node("Reshape", [g.add_node("Reshape", [e], {"shape": [32]}).output],
                   {"shape": [4, 8]}, name="rs").output
    t = g.add_node("Transpose", [g.add_node("Transpose", [r], {"perm": [1, 0]}).output],
                   {"perm": [1, 0]}, name="tt").output
    s = g.add_node("ReduceSum", [t], {"axis": [-1], "keep_dims": False}, name="sum").output
    g.set_outputs([s])
    return g


def test_bisect_limit_gives_a_monotone_sequence_of_graphs():
    g = graph_with_rewrites()
    full = graphkernel.compile(g, "--opt_level=2", env=NOENV)
    total = full.report.bisect_applications
    assert total >= 8
    feeds = random_inputs(g, 0)
    want = run_graph(g, feeds)[0]
    full_log: list[str] = []
    graphkernel.compile(g, "--opt_level=2 --print_bisect", env=NOENV, log=full_log.append)
    sizes = []
    for k in range(total + 1):
        log: list[str] = []
        res = graphkernel.compile(g, f"--opt_level=2 --bisect_limit={k} --print_bisect",
                                  env=NOENV, log=log.append)
        # the first k applications are exactly the full run's first k; the rest are refused
        assert log[:k] == full_log[:k]
        assert res.report.bisect_refused == res.report.bisect_applications - k
        assert all("NOT running" in ln for ln in log[k:])
        sizes.append(len(res.graph))
        np.testing.assert_allclose(run_graph(res.graph, feeds)[0], want, rtol=1e-5)
    assert sizes == sorted(sizes, reverse=True) and sizes[0] > sizes[-1]
    assert str(graphkernel.compile(g, f"--bisect_limit={total}", env=NOENV).graph) == \
        str(full.graph)


def test_bisect_numbering_is_deterministic():
    g = graph_with_rewrites()
    logs = []
    for _ in range(2):
        lines: list[str] = []
        graphkernel.compile(g, "--print_bisect --bisect_limit=3", env=NOENV, log=lines.append)
        logs.append(lines)
    assert logs[0] == logs[1]


def test_bisect_trace_format():
    lines: list[str] = []
    graphkernel.compile(graph_with_rewrites(), "--print_bisect --bisect_limit=2", env=NOENV,
                        log=lines.append)
    bisect = [ln for ln in lines if ln.startswith("BISECT:")]
    assert bisect[0].startswith("BISECT: running (1) axis_normalize on ")
    assert bisect[1].startswith("BISECT: running (2) ")
    assert bisect[2].startswith("BISECT: NOT running (3) ")
    import re

    assert all(re.match(r"^BISECT: (running|NOT running) \(\d+\) [a-z_]+ on .+$", ln)
               for ln in bisect)


def test_dumps_are_named_and_ordered(tmp_path):
    res = graphkernel.compile(graph_with_rewrites(),
                              f"--dump_as_text --debug_dir={tmp_path} --disable_pass=cse",
                              env=NOENV)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names[0] == "0000_input.txt" and "flags.json" in names and "report.json" in names
    dumps = [n for n in names if n[:4].isdigit() and n != "0000_input.txt"]
    changed = [p for p in res.report.passes if p.changed]
    assert len(dumps) == len(changed)
    assert not any("_cse" in n for n in dumps)
    for n in dumps:
        seq, stage, rest = n.split("_", 2)
        assert stage in registry.STAGES and rest.endswith(".txt")
    assert dumps == sorted(dumps)
    text = (tmp_path / dumps[0]).read_text()
    assert text.startswith("graph rw(") and "= ReduceSum(" in text


def test_failing_run_leaves_no_partial_file(tmp_path, monkeypatch):
    import graphkernel.fileio as fileio

    calls = {"n": 0}
    real = fileio.os.replace

    def flaky_replace(src, dst):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("disk full")
        return real(src, dst)

    monkeypatch.setattr(fileio.os, "replace", flaky_replace)
    with pytest.raises(OutputError, match="disk full"):
        graphkernel.compile(graph_with_rewrites(), f"--dump_as_text --debug_dir={tmp_path}",
                            env=NOENV)
    leftovers = [p.name for p in tmp_path.iterdir()]
    assert len(leftovers) == 2 and not any(n.endswith(".tmp") for n in leftovers)




def test_third_party_pass_registers_and_is_selectable(temp_pass):
    @temp_pass("fold_exp_neg", stage="simplify", level=3, order=70)
    def fold_exp_neg(graph, ctx):
        """Rewrite nothing; counts Exp nodes (a third-party example)."""
        n = sum(1 for node in graph.nodes if node.op == "Exp" and ctx.should_apply(node.name))
        return PassResult(False, n)

    assert "fold_exp_neg" in on_passes("--opt_level=3")
    assert "fold_exp_neg" not in on_passes("--opt_level=2")
    res = graphkernel.compile(graph_with_rewrites(), "--opt_level=2 --enable_pass=fold_exp_neg",
                              env=NOENV)
    rec = next(p for p in res.report.passes if p.name == "fold_exp_neg")
    assert rec.ran and rec.rewrites == 1  # cse merged exp1 and exp2 earlier


def test_broken_pass_is_named(temp_pass):
    @temp_pass("break_uses", stage="simplify", level=1, order=95)
    def break_uses(graph, ctx):
        graph.nodes[-1].inputs[0].uses.clear()
        return PassResult(True, 1)

    cfg = load_config("", env=NOENV)
    # registered from outside graphkernel: a plugin's pass, so the plugin is blamed
    with pytest.raises(PluginError, match=r"plugin .*test_pipeline\.py: pass break_uses left an "
                                          "invalid graph"):
        PassManager(cfg, targets.load(cfg.target), check_each_pass=True,
                    log=lambda m: None).run(graph_with_rewrites())


def test_crashing_plugin_pass_is_reported_as_the_plugins(temp_pass):
    @temp_pass("crash", stage="simplify", level=1, order=96)
    def crash(graph, ctx):
        raise KeyError("boom")

    with pytest.raises(PluginError, match=r"plugin .*test_pipeline\.py: pass crash \(simplify\) "
                                          r"failed: KeyError: 'boom' \(raised at .*test_pipeline"
                                          r"\.py:\d+\).*--disable_pass=crash") as info:
        graphkernel.compile(graph_with_rewrites(), "", env=NOENV, log=lambda m: None)
    assert info.value.exit_code == 1 and "bug in graphkernel" not in str(info.value)


def test_crashing_builtin_pass_is_a_bug_in_graphkernel(monkeypatch):
    # a pass defined in a graphkernel module (as the built-in passes are)
    ns = {"__name__": "graphkernel.passes.crash_demo"}
    exec(compile("def crash(graph, ctx):\n    return {}['boom']\n",
                 "graphkernel/passes/crash_demo.py", "exec"), ns)
    monkeypatch.setitem(registry.PASSES, "crash_demo", registry.PassInfo(
        "crash_demo", "simplify", 1, 96, False, None, "", ns["crash"]))
    with pytest.raises(PassFailure, match=r"pass crash_demo \(simplify\) failed: KeyError.*passes "
                                          r"run before it: .*bug in graphkernel.*"
                                          "--disable_pass=crash_demo") as info:
        graphkernel.compile(graph_with_rewrites(), "", env=NOENV, log=lambda m: None)
    assert info.value.exit_code == 3


def test_report_records_each_pass():
    res = graphkernel.compile(graph_with_rewrites(), "--opt_level=2 --disable_pass=cse",
                              env=NOENV)
    d = res.report.to_dict()
    assert d["flags"]["disable_pass"] == {"value": ["cse"], "origin": "explicit"}
    rows = {p["label"]: p for p in d["passes"]}
    assert rows["cse"]["ran"] is False and "disabled" in rows["cse"]["reason"]
    assert rows["arith_simplify"]["changed"] and rows["arith_simplify"]["rewrites"] >= 2
    assert all(p["seconds"] >= 0 for p in d["passes"])


def test_required_pass_cannot_be_disabled():
    with pytest.raises(FlagError, match="'validate' is required"):
        graphkernel.compile(graph_with_rewrites(), "--disable_pass=validate", env=NOENV)


def test_collector_paused_promotes_what_it_allocated_and_keeps_a_users_freeze():
    import gc
    import weakref

    from graphkernel.pipeline import collector_paused

    class Cycle:
        pass

    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        c = Cycle()
        c.me = c
        alive = weakref.ref(c)
        kept = [[i] for i in range(5000)]
        del c
    assert gc.isenabled() and gc.get_count()[0] < 100  # nothing left to scan as young
    assert alive() is not None  # the cycle waits for a full collection
    gc.collect()
    assert alive() is None and len(kept) == 5000
    gc.freeze()  # the program's own frozen objects stay frozen
    try:
        frozen = gc.get_freeze_count()
        with collector_paused():
            _ = [[i] for i in range(100)]
        # neither released (0) nor grown by the block's 101 lists; a frozen object that
        # reference counting frees meanwhile leaves the count
        assert frozen - 20 <= gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()


def test_a_compile_leaves_no_erased_node_alive():
    """Nodes the passes erase are freed as the compile goes (the cyclic collector is paused
    meanwhile): none is left once it returns, the nodes replaced by kernels included, nor
    any other cycle for the collector (a node outside every kernel included)."""
    import gc

    from graphkernel.ir import Node

    g = Graph("g")
    x = g.add_input("x", TensorType((4, 8), "float32"))
    y = g.add_node("Exp", [x]).output
    y = g.add_node("Add", [y, g.add_node("Exp", [x]).output]).output  # cse erases one
    y = g.add_node("Mul", [y, g.add_node("Tanh", [y]).output]).output
    y = g.add_node("CumSum", [y], {"axis": 1}).output  # in no kernel
    y = g.add_node("Exp", [y]).output
    g.set_outputs([y])
    gc.collect()

    def erased() -> dict[int, Node]:
        return {id(o): o for o in gc.get_objects() if type(o) is Node and o.graph is None}

    before = erased()  # what earlier tests keep alive (a torch backend's caches, say)
    gc.disable()
    try:
        res = graphkernel.compile(g, "--opt_level=2 --disable_pass=codegen", env={})
        assert any(n.op == "GraphKernel" for n in res.graph.nodes)
        assert [o for k, o in erased().items() if k not in before] == []
        # no cycle of graphkernel's objects is left for the collector (other threads of the
        # process -- a test runner's, torch's -- may leave cycles of their own meanwhile)
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        ours = [o for o in gc.garbage
                if type(o).__module__.split(".")[0] in ("graphkernel", "passes", "patterns",
                                                        "codegen", "expanders")]
        assert ours == []
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def graph_with_history() -> Graph:
    """A graph whose bookkeeping a copy would not keep: a hole in a family of names (the
    node ``n_1`` made and erased, so the name counter of ``n`` has moved past it), users
    recorded out of node order, nodes out of order (a rewired input)."""
    g = Graph("history")
    x = g.add_input("x", TensorType((4, 8), "float32"))
    n = g.add_node("Mul", [x, g.const(-1.0)], name=g.fresh_name("n")).output  # x * -1
    g.erase_node(g.add_node("Exp", [x], name=g.fresh_name("n")))  # n_1, erased
    b = g.add_node("Exp", [x], name=g.fresh_name("n")).output  # n_2
    late = g.add_node("Tanh", [x], name="late").output
    t = g.add_node("Add", [b, n], name="t").output
    g.replace_input(t.producer, 0, late)  # t reads a later node; x's users: Mul, Tanh, Exp
    g.replace_input(t.producer, 0, b)
    y = g.add_node("Sub", [t, g.add_node("Neg", [late], name="neg").output], name="y").output
    g.set_outputs([y, n])
    return g


@pytest.mark.parametrize("flags, made", [("--opt_level=2 --disable_pass=codegen", "n_1"),
                                         ("--opt_level=1", None)])
def test_compile_without_a_copy_gives_the_compile_of_a_copy(flags, made):
    from graphkernel.frontends.json_format import graph_to_dict

    def outcome(res) -> tuple:
        report = res.report.to_dict()
        for p in report["passes"]:
            p.pop("seconds", None)
        report.pop("seconds", None)
        return (str(res.graph), graph_to_dict(res.graph, nested=True),
                [(a.pass_name, a.description) for a in res.applications], report)

    copied = graphkernel.compile(graph_with_history(), flags, env=NOENV)
    g = graph_with_history()
    in_place = graphkernel.compile(g, flags, env=NOENV, copy=False)
    assert in_place.graph is g
    if made:  # the name the rewrite of n (x * -1 -> -x) takes in a copy
        assert f"{made}: " in str(copied.graph)
    assert outcome(in_place) == outcome(copied)


def test_compile_leaves_its_input_untouched_by_default():
    from graphkernel.frontends.json_format import graph_to_dict

    g = graph_with_history()

    def state(g: Graph) -> tuple:
        return (str(g), graph_to_dict(g, nested=True), [n._seq for n in g._nodes.values()],
                {v.name: [(u.name, i) for u, i in v.uses] for v in g._values.values()},
                list(g._values), list(g._node_names), dict(g._name_counters).keys())

    before = state(g)
    res = graphkernel.compile(g, "--opt_level=2", env=NOENV)
    assert res.graph is not g and len(res.graph) != len(g)
    assert state(g) == before


def test_hooks_see_every_pass_that_runs_and_time_them(tmp_path):
    """Timing, validation and dumps are hooks of the manager; any other hook sees the same
    calls (before/after each pass that runs, begin and end of the run)."""
    from graphkernel.pipeline import Dumps, PassHook, Timing, Validation

    seen = []

    class Recorder(PassHook):
        def begin(self, graph, ctx, report):
            seen.append("begin")

        def before(self, slot, graph, ctx):
            seen.append(("before", slot.label, ctx.current_pass))

        def after(self, slot, graph, ctx, record, result):
            seen.append(("after", slot.label, record.seconds > 0, result.modified))

        def end(self, graph, ctx, report):
            seen.append("end")

    cfg = load_config(f"--dump_as_text --debug_dir={tmp_path}", env=NOENV)
    pm = PassManager(cfg, targets.load(cfg.target), log=lambda m: None, hooks=[Recorder()],
                     check_each_pass=True)
    kinds = [type(h) for h in pm.hooks]
    assert kinds[0] is Timing and Recorder in kinds and Validation in kinds and Dumps in kinds
    report = pm.run(graph_with_rewrites())
    ran = [r for r in report.passes if r.ran]
    assert seen[0] == "begin" and seen[-1] == "end"
    assert [x[1] for x in seen if x[0] == "before"] == [r.label for r in ran]
    assert all(x[2] for x in seen if x[0] == "after")  # timed before the others saw it
    assert all(r.seconds > 0 for r in ran) and report.seconds >= sum(r.seconds for r in ran)
    changed = [r for r in ran if r.changed]
    assert len(list(tmp_path.glob("0*_*.txt"))) == len(changed) + 1  # + the input


def test_no_module_switch_turns_validation_on():
    from graphkernel import pipeline

    assert not hasattr(pipeline, "CHECK_EACH_PASS")
    assert any(isinstance(h, pipeline.Validation) for h in registry.HOOKS)  # tests' conftest


def test_every_pass_gets_the_target_loaded_once(temp_pass):
    got = []

    @temp_pass("see_target", stage="simplify", level=1, order=97)
    def see_target(graph, ctx):
        got.append(ctx.target)
        return PassResult(False)

    res = graphkernel.compile(graph_with_rewrites(), "--target=ascend910b3", env=NOENV)
    assert got and got[0] is targets.load("ascend910b3") and res.config.target == "ascend910b3"


def test_the_report_figures_are_typed():
    from graphkernel.analyses import ReportFigures

    res = graphkernel.compile(graph_with_rewrites(), "", env=NOENV)
    figures = res.report.figures
    assert isinstance(figures, ReportFigures) and figures.kernels_fused is not None
    assert res.report.extra["kernels_fused"] == figures.kernels_fused
    assert "gm_bytes_fused" in res.report.to_dict()
    with pytest.raises(AttributeError):
        figures.kernels_fuzed = 3  # a misspelt figure is no new key
    figures.more["plugin_figure"] = 1  # a plugin's own figures go under their own names
    assert res.report.to_dict()["plugin_figure"] == 1
