"""The validate pass trusts a graph as the model loader built it (``checked_on_load``): the
same compile, and every broken file still refused, by the loader, on that path."""

from __future__ import annotations

import copy
import json

import pytest

from graphkernel import api
from graphkernel.cli import main
from graphkernel.errors import GraphError
from graphkernel.frontends import load_model
from graphkernel.ir import TensorType

EX = "examples/layernorm_residual.json"


def _validate_record(report):
    (rec,) = [p for p in report.passes if p.name == "validate"]
    return rec


@pytest.mark.parametrize("model", [EX, "examples/attention.json", "examples/mlp_gelu.json"])
def test_trusted_load_compiles_the_same(model):
    checked = api.compile(load_model(model), copy=False, checked_on_load=True)
    plain = api.compile(load_model(model), copy=False)
    assert _validate_record(checked.report).summary == "checked by the model loader"
    assert _validate_record(plain.report).summary == ""
    assert str(checked.graph) == str(plain.graph)


def test_only_the_first_validate_is_skipped():
    """A later validate (``check_each_pass``'s, after every pass) still runs: a graph broken
    by a pass is named."""
    from graphkernel.codegen import targets
    from graphkernel.pipeline import PassManager

    g = load_model(EX)
    cfg = api.load_config("")
    pm = PassManager(cfg, targets.load(cfg.target), check_each_pass=True, checked_on_load=True)
    pm.run(g)
    assert pm.ctx.checked_on_load is False


def test_untrusted_graph_is_still_validated():
    """Without the caller's word, a graph changed after loading is checked: an output type
    edited by hand is named."""
    g = load_model(EX)
    n = next(n for n in g.nodes if n.op == "Add")
    n.outputs[0].type = TensorType((3,), n.outputs[0].type.dtype)
    with pytest.raises(GraphError, match="do not match inferred"):
        api.compile(g, copy=False)


def test_compile_from_a_path_trusts_its_own_load():
    res = api.compile(EX)
    assert _validate_record(res.report).summary == "checked by the model loader"


def test_cli_compile_trusts_its_load(tmp_path, capsys):
    assert main(["compile", EX, "-q", "-o", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    (rec,) = [p for p in report["passes"] if p["name"] == "validate"]
    assert rec["summary"] == "checked by the model loader"


def _broken_files():
    """The invariants ``Graph.validate`` checks, each broken in a file: the loader must name
    each (on the path where the validate pass is skipped). The model repeats its first
    node, so a broken repeat goes through the loader's shortcut for repeated nodes too."""
    base = {"format": "graphkernel/1", "name": "g",
            "inputs": [{"name": "x", "shape": [2, 4], "dtype": "float32"}],
            "nodes": [{"name": "a", "op": "Exp", "inputs": ["x"], "outputs": ["a"]},
                      {"name": "b", "op": "Exp", "inputs": ["a"], "outputs": ["b"]},
                      {"name": "c", "op": "Add", "inputs": ["a", "b"], "outputs": ["c"]}],
            "outputs": ["c"]}

    def edit(fn):
        doc = copy.deepcopy(base)
        fn(doc)
        return doc

    def typed(doc, i, shape):
        doc["nodes"][i]["outputs"] = [{"name": doc["nodes"][i]["name"], "shape": shape,
                                       "dtype": "float32"}]

    return [
        ("declared type", edit(lambda d: typed(d, 1, [3])), "differs from the inferred"),
        ("declared type, first", edit(lambda d: typed(d, 0, [2, 5])),
         "differs from the inferred"),
        ("dangling input", edit(lambda d: d["nodes"][1].update(inputs=["nope"])), "dangling"),
        ("cycle", edit(lambda d: d["nodes"][0].update(inputs=["b"])), "cycle"),
        ("arity", edit(lambda d: d["nodes"][2].update(inputs=["a"])), "input"),
        ("value defined twice", edit(lambda d: d["nodes"][1].update(outputs=["a"])),
         "defined twice"),
        ("node name twice", edit(lambda d: d["nodes"][1].update(name="a")), "already exists"),
        ("unknown output", edit(lambda d: d.update(outputs=["zz"])), "unknown value"),
        ("shapes", edit(lambda d: d["inputs"].append(
            {"name": "y", "shape": [3], "dtype": "float32"}) or d["nodes"][2].update(
            inputs=["a", "y"])), "broadcast"),
    ]


@pytest.mark.parametrize("case,doc,message", _broken_files(), ids=lambda x: x
                         if isinstance(x, str) else "")
def test_broken_file_refused_on_the_trusted_path(tmp_path, capsys, case, doc, message):
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(doc))
    out = tmp_path / "out"
    assert main(["compile", str(path), "-q", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not out.exists()  # nothing half-written


@pytest.mark.parametrize("nodes", [[("Add", ["x", "w"], ["z"])],  # dangling
                                   [("Exp", ["z"], ["a"]), ("Exp", ["a"], ["z"])]])  # cycle
def test_broken_onnx_refused_on_the_trusted_path(tmp_path, capsys, nodes):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 4])
    graph = helper.make_graph([helper.make_node(*n) for n in nodes], "g", [x], [z])
    path = tmp_path / "broken.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), path)
    assert main(["compile", str(path), "-q", "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "is not defined by any earlier node" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def _bookkeeping(g):
    """Everything ``Graph.settle`` brings into order, as names."""
    nodes = g.nodes
    return ([(n.name, n._seq) for n in nodes],
            [(v.name, [(u.name, i) for u, i in v.uses])
             for v in [*g.inputs, *(o for n in nodes for o in n.outputs)]],
            list(g._values), list(g._node_names), g._name_counters,
            [str(n.subgraph) for n in nodes if n.op == "GraphKernel"])


@pytest.mark.parametrize("model", [EX, "examples/attention.json", "compiled"])
def test_settle_of_a_loaded_graph_is_settle(tmp_path, model):
    """A graph as the file loader built it is settled already: ``built_in_order`` leaves it
    as the whole ``settle`` makes it (a compiled graph's kernel bodies copied as well)."""
    from graphkernel.frontends.json_format import BUILT_IN_ORDER, save_graph

    if model == "compiled":
        model = tmp_path / "k.json"
        save_graph(api.compile(EX).graph, model)
    quick, whole = load_model(model), load_model(model)
    assert quick in BUILT_IN_ORDER
    bodies = [n.subgraph for n in quick.nodes if n.op == "GraphKernel"]
    quick.fresh_name(quick.nodes[0].name)  # (a name counter, restarted by both)
    whole.fresh_name(whole.nodes[0].name)
    quick.settle(built_in_order=True)
    whole.settle()
    assert _bookkeeping(quick) == _bookkeeping(whole)
    assert all(n.subgraph is not b for n, b in zip(
        [n for n in quick.nodes if n.op == "GraphKernel"], bodies, strict=True))
    assert quick._name_counters == {}


def test_settle_in_order_only_for_a_graph_as_built():
    """A graph rewired after loading is settled in full even when asked for the quick way:
    its order is dirty."""
    g = load_model(EX)
    add = next(n for n in g.nodes if n.op == "Add" and n.inputs[0].producer is not None)
    late = g.add_node("Exp", [g.inputs[0]], name="late")
    g.replace_input(add, 0, late.output)  # (now read before it is made)
    g.settle(built_in_order=True)
    names = [n.name for n in g.nodes]
    assert names.index("late") < names.index(add.name)
    assert [n._seq for n in g.nodes] == list(range(1, len(g) + 1))


def test_onnx_graph_is_not_taken_as_built_in_order(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    from graphkernel.frontends.json_format import BUILT_IN_ORDER

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 4])
    graph = helper.make_graph([helper.make_node("Exp", ["x"], ["z"])], "g", [x], [z])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), path)
    assert load_model(path) not in BUILT_IN_ORDER  # (its loader erases and rewires)
