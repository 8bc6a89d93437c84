"""Accuracy bisection: injected faults are found by pass, application and user node; the
suggested flags fix them; noise is never blamed; the search stays logarithmic."""

from __future__ import annotations

import math
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import graphkernel
from graphkernel import Graph, TensorType, registry
from graphkernel.bisect import bisect, bisect_external, verify
from graphkernel.cli import main
from graphkernel.registry import PassResult

pytestmark = pytest.mark.e2e  # bisect runs, scripts and the simulator


def adds_graph(n: int = 10) -> Graph:
    g = Graph("adds")
    x = g.add_input("x", TensorType((8, 16), "float32"))
    v = x
    for i in range(n):
        v = g.add_node("Add", [v, g.const(np.float32(0.1 * (i + 1)))], name=f"add{i}").output
        v = g.add_node("Exp" if i % 3 == 0 else "Tanh", [v], name=f"act{i}").output
    g.set_outputs([v])
    return g


def bound(g, flags: str = "") -> int:
    """ceil(log2(passes)) + ceil(log2(applications)) + 4, for the run being bisected."""
    rep = graphkernel.compile(g, flags, env={}).report
    passes = sum(1 for p in rep.passes if p.rewrites)
    return (math.ceil(math.log2(max(passes, 1)))
            + math.ceil(math.log2(max(rep.bisect_applications, 1))) + 4)


def test_seventh_add_turned_into_sub(temp_pass, tmp_path):
    @temp_pass("bad_add", stage="simplify", level=2, order=36)
    def bad_add(graph, ctx):
        seen = 0
        for node in graph.nodes:
            if node.op == "Add" and ctx.should_apply(f"{node.name} (Add -> Sub)", [node]):
                seen += 1
                if seen == 7:
                    sub = graph.add_node("Sub", list(node.inputs), origin=node.origin)
                    graph.replace_all_uses(node.output, sub.output)
                    graph.erase_node(node)
        return PassResult(seen > 0, seen)

    g = adds_graph()
    res = bisect(g, repro_dir=tmp_path)
    assert res.mismatch and res.pass_name == "bad_add"
    assert res.application == 7 and res.origin == ["add6"]
    assert res.description == "add6 (Add -> Sub)"
    assert res.flags == "--disable_pass=bad_add"
    assert not verify(g, res.flags).bad
    assert res.repro_reproduces and (tmp_path / "repro.json").exists()
    assert res.evaluations <= bound(g), (res.evaluations, res.steps)


def kernel_graph() -> Graph:
    """Several kernels that each truncate through int32 (a Cast pair) and reduce rows."""
    g = Graph("k")
    x = g.add_input("x", TensorType((16, 16), "float32"))
    outs = []
    for i in range(4):
        s = g.add_node("Mul", [x, g.const(np.float32(3.7 + i))], name=f"scale{i}").output
        t = g.add_node("Cast", [g.add_node("Cast", [s], {"dtype": "int32"}, name=f"trunc{i}")
                                .output], {"dtype": "float32"}, name=f"back{i}").output
        e = g.add_node("Exp", [g.add_node("Neg", [t], name=f"neg{i}").output], name=f"e{i}").output
        outs.append(g.add_node("ReduceSum", [e], {"axis": [1]}, name=f"rows{i}").output)
        x = g.add_node("CumSum", [x], {"axis": 0}, name=f"barrier{i}").output
    g.set_outputs(outs)
    return g


def _kernels_with(graph, op):
    return [n for n in graph.nodes if n.op == "GraphKernel"
            and any(m.op == op for m in n.subgraph.nodes)]


def test_dropped_cast_inside_one_fused_kernel(temp_pass):
    @temp_pass("drop_cast", stage="postfusion", level=1, order=50)
    def drop_cast(graph, ctx):
        done = 0
        for i, k in enumerate(_kernels_with(graph, "Cast")):
            if not ctx.should_apply(f"{k.name}: drop int32 round trip", [k]):
                continue
            if i == 2:  # the third kernel loses its truncation
                sub = k.subgraph
                back = next(m for m in sub.nodes if m.op == "Cast" and
                            m.attrs["dtype"].value == "float32")
                sub.replace_all_uses(back.output, back.inputs[0].producer.inputs[0])
                sub.remove_dead()
                done += 1
        return PassResult(done > 0, done)

    g = kernel_graph()
    res = bisect(g)
    assert res.pass_name == "drop_cast" and res.application == 3, res.steps
    assert {"trunc2", "back2", "e2"} <= set(res.origin)
    assert not verify(g, res.flags).bad
    assert res.evaluations <= bound(g), (res.evaluations, res.steps)


def test_wrong_reduction_axis_in_one_kernel(temp_pass):
    @temp_pass("bad_axis", stage="postfusion", level=1, order=51)
    def bad_axis(graph, ctx):
        n = 0
        for k in _kernels_with(graph, "ReduceSum"):
            n += 1
            if not ctx.should_apply(f"{k.name}: reduce axis", [k]):
                continue
            if n == 4:
                r = next(m for m in k.subgraph.nodes if m.op == "ReduceSum")
                r.attrs = dict(r.attrs, axis=[0])  # [16,16] -> same shape, wrong axis
        return PassResult(n > 0, n)

    g = kernel_graph()
    res = bisect(g)
    assert res.pass_name == "bad_axis" and res.application == 4, res.steps
    assert res.evaluations <= bound(g), (res.evaluations, res.steps)
    assert "rows3" in res.origin
    assert "--disable_pass=bad_axis" in res.flags and not verify(g, res.flags).bad


def test_masked_bug_is_still_found(temp_pass):
    """out = relu(x) + relu(y) is never negative, so `clamp` (a later pass clamping outputs at
    0) is a valid rewrite. drop_relu wrongly removes relu(x); the clamp then hides that
    wherever y <= 0, but not where y > 0 and x < 0."""
    @temp_pass("drop_relu", stage="simplify", level=2, order=37)
    def drop_relu(graph, ctx):
        for node in graph.nodes:
            if node.name == "relu_x" and ctx.should_apply(node.name, [node]):
                graph.replace_all_uses(node.output, node.inputs[0])
                graph.erase_node(node)
                return PassResult(True, 1)
        return PassResult(False, 0)

    @temp_pass("clamp", stage="postfusion", level=2, order=52)
    def clamp(graph, ctx):
        outs = []
        for v in graph.outputs:
            if ctx.should_apply(f"clamp {v.name}"):
                v = graph.add_node("Maximum", [v, graph.const(np.float32(0.0))]).output
            outs.append(v)
        graph.set_outputs(outs)
        return PassResult(True, len(outs))

    g = Graph("m")
    x = g.add_input("x", TensorType((64,), "float32"))
    y = g.add_input("y", TensorType((64,), "float32"))
    zero = g.const(np.float32(0.0))
    rx = g.add_node("Maximum", [x, zero], name="relu_x").output
    ry = g.add_node("Maximum", [y, zero], name="relu_y").output
    g.set_outputs([g.add_node("Add", [rx, ry], name="out").output])
    rng = np.random.default_rng(0)
    masked = {"x": rng.standard_normal(64).astype(np.float32),
              "y": -np.abs(rng.standard_normal(64)).astype(np.float32)}
    assert not verify(g, inputs=masked).bad  # hidden by the later pass on these inputs
    res = bisect(g)  # N(0, 1) inputs: not hidden
    assert res.mismatch and res.pass_name == "drop_relu" and res.origin == ["relu_x"], res.steps
    assert not verify(g, res.flags).bad


def test_no_false_blame_for_fp32_inside_fp16_kernels():
    g = Graph("ln16")
    x = g.add_input("x", TensorType((8, 256), "float16"))
    gam = g.const(np.linspace(0.5, 1.5, 256).astype(np.float16))
    y = g.add_node("LayerNorm", [x, gam, gam], name="ln").outputs[0]
    y = g.add_node("GeLU", [y], {"approximate": "tanh"}, name="act").output
    g.set_outputs([g.add_node("Softmax", [y], name="sm").output])
    compiled = graphkernel.compile(g, env={}).graph
    from graphkernel.interpreter import Interpreter, random_inputs

    feeds = random_inputs(g, 0)
    a, b = Interpreter(g).run(feeds)[0], Interpreter(compiled).run(feeds)[0]
    assert not np.array_equal(a, b)  # it does round differently...
    res = bisect(g)
    assert not res.mismatch and res.evaluations == 1  # ...and that is not a bug


def floor_sin_graph() -> Graph:
    """1.5 / Floor(Sin(x)) in fp16: Floor jumps at sin(x) = 1, Div has a pole at 0."""
    g = Graph("floor_sin")
    x = g.add_input("x", TensorType((4, 16), "float16"))
    s = g.add_node("Sin", [x], name="sin").output
    f = g.add_node("Floor", [s], name="floor").output
    g.set_outputs([g.add_node("Div", [g.const(np.float16(1.5)), f], name="div").output])
    return g


def test_no_blame_for_inf_the_reference_has_too():
    """fp16 rounds sin(1.576) = 0.99998 up to 1.0, so the op-by-op run gets 1.5 / 1; the
    fused kernel computes in fp32 and gets 1.5 / 0 = Inf, as the float32 reference does."""
    from graphkernel.interpreter import Interpreter

    g = floor_sin_graph()
    xs = np.full((4, 16), -0.5, np.float16)
    xs[1, 3] = 1.576
    feeds = {"x": xs}
    compiled = graphkernel.compile(g, "--opt_level=2", env={}).graph
    assert Interpreter(g).run(feeds)[0][1, 3] == 1.5
    assert np.isinf(Interpreter(compiled).run(feeds)[0][1, 3])
    assert np.isinf(Interpreter(g, "float32").run(feeds)[0][1, 3])
    j = verify(g, "--opt_level=2", inputs=feeds)
    assert not j.bad, j.reason
    assert not verify(g, "--opt_level=2", inputs=feeds, backend="sim").bad


def test_inf_the_reference_does_not_have_is_a_mismatch():
    from graphkernel.bisect import Evaluator

    g = floor_sin_graph()
    feeds = {"x": np.full((4, 16), -0.5, np.float16)}  # Floor -1 everywhere: no pole
    ev = Evaluator(g, feeds)
    out = ev.base[0].copy()
    out[2, 5] = np.inf
    j = ev.judge([out])
    assert j.bad and "1 NaN/Inf neither the unoptimized run nor the reference" in j.reason
    out[2, 5] = -np.inf  # the reference's own Inf, with the wrong sign, is new as well
    ev.ref[0][2, 5] = np.inf
    assert ev.judge([out]).bad


def test_verify_cli_exit_codes(tmp_path, capsys):
    plugin = tmp_path / "fault.py"
    plugin.write_text(open("examples/faulty_pass.py").read())
    assert main(["verify", "examples/mlp_gelu.json"]) == 0
    assert main(["verify", "examples/mlp_gelu.json", "--plugin", str(plugin)]) == 1
    assert "MISMATCH" in capsys.readouterr().out
    registry.PASSES.pop("swap_add_sub", None)
    assert main(["verify", "examples/mlp_gelu.json", "--backend", "sim"]) == 0


def test_verify_names_the_unoptimized_runs_own_cosine(tmp_path, capsys):
    """(x + 1e8) - 1e8 loses x in float32 before any rewrite: verify says MATCH and shows that
    the unoptimized run is as far from the float64 reference as the compiled one."""
    from graphkernel.frontends.json_format import save_graph

    g = Graph("cancel")
    x = g.add_input("x", TensorType((64,), "float32"))
    c = g.add_node("Constant", [], {"value": np.float32(1e8)}).output
    g.set_outputs([g.add_node("Sub", [g.add_node("Add", [x, c]).output, c]).output])
    save_graph(g, tmp_path / "cancel.json")
    assert main(["verify", str(tmp_path / "cancel.json")]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    compiled, unopt = (float(t.split()[-1].rstrip(")")) for t in last.split(",")[-2:])
    assert last.startswith("MATCH") and unopt < 0.9 and compiled == pytest.approx(unopt)


def test_bisect_cli_reports_and_writes_json(tmp_path, capsys):
    plugin = tmp_path / "fault.py"
    plugin.write_text(open("examples/faulty_pass.py").read())
    try:
        assert main(["bisect", "examples/mlp_gelu.json", "--plugin", str(plugin), "--report",
                     str(tmp_path / "r.json"), "--repro-dir", str(tmp_path / "repro")]) == 0
    finally:
        registry.PASSES.pop("swap_add_sub", None)
    out = capsys.readouterr().out
    assert "culprit: pass swap_add_sub" in out and "avoid it with: --disable_pass=swap_add_sub" \
        in out
    assert "[step 2/~" in out and "gelu_add1" in out
    import json

    assert json.loads((tmp_path / "r.json").read_text())["origin"] == ["gelu_add1"]


def test_external_driver_on_a_script(tmp_path, capsys, monkeypatch):
    """``graphkernel bisect run -- python train.py`` finds the faulty pass and prints the flag
    avoiding it; the search (its ExternalResult, kept as the command makes it) is
    logarithmic. One bisection: the command line runs the library's driver in-process."""
    import graphkernel.bisect as gb

    made = []

    def keep(*a, **k):
        made.append(bisect_external(*a, **k))
        return made[-1]

    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import sys, numpy as np
        sys.path.insert(0, {str(tmp_path)!r})
        import runpy; runpy.run_path({str(tmp_path / 'fault.py')!r})
        import graphkernel
        from graphkernel.frontends import load_model
        from graphkernel.interpreter import Interpreter, random_inputs
        g = load_model({str(__import__('os').path.abspath('examples/mlp_gelu.json'))!r})
        res = graphkernel.compile(g)               # flags come from AUTOFUSE_FLAGS
        feeds = random_inputs(g, 0)
        ok = np.allclose(Interpreter(res.graph).run(feeds)[0], Interpreter(g).run(feeds)[0],
                         rtol=1e-4, atol=1e-5)
        sys.exit(0 if ok else 1)                   # the user's own accuracy check
    """))
    (tmp_path / "fault.py").write_text(open("examples/faulty_pass.py").read())
    monkeypatch.setattr(gb, "bisect_external", keep)
    rc = main(["bisect", "run", "--", sys.executable, str(script)])
    out = capsys.readouterr().out
    (r,) = made
    assert r.found and r.culprit_line.startswith(f"BISECT: running ({r.limit}) swap_add_sub on")
    assert r.runs <= math.ceil(math.log2(max(r.upper, 1))) + 3
    assert rc == 0 and "swap_add_sub" in out
    assert 'AUTOFUSE_FLAGS="--disable_pass=swap_add_sub"' in out


def layers_graph() -> Graph:
    rng = np.random.default_rng(0)
    g = Graph("kl")
    h = g.add_input("x", TensorType((16, 32), "float32"))
    for i in range(6):  # six layers: each vector epilogue is its own kernel
        w = g.const((rng.standard_normal((32, 32)) / 6).astype(np.float32))
        b = g.const(rng.standard_normal(32).astype(np.float32))
        mm = g.add_node("MatMul", [h, w], name=f"mm{i}").output
        h = g.add_node("Tanh", [g.add_node("Add", [mm, b], name=f"bias{i}").output],
                       name=f"act{i}").output
    g.set_outputs([h])
    return g


def test_kernel_level_finds_a_miscompiled_kernel(tmp_path):
    """A test hook corrupts one kernel's generated code (its Add becomes Sub); the reference
    backend sees nothing wrong, --backend sim bisection names that kernel."""
    import shutil

    import pytest

    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    from graphkernel.codegen import backend as cg

    g = layers_graph()
    compiled = graphkernel.compile(g, "--opt_level=2", env={}).graph
    kernels = [k for k in compiled.nodes if k.op == "GraphKernel"]
    target = next(k for k in kernels if "bias3" in k.origin)

    def corrupt(name, files):
        if name.startswith(f"gk_{target.name}_"):
            files = {f: t.replace("Add(", "Sub(") for f, t in files.items()}
        return files

    cg.CORRUPT.append(corrupt)
    try:
        assert not verify(g, "--opt_level=2").bad  # op by op: nothing wrong
        assert verify(g, "--opt_level=2", backend="sim").bad
        res = bisect(g, flags="--opt_level=2", backend="sim", repro_dir=tmp_path)
    finally:
        cg.CORRUPT.remove(corrupt)
    assert res.mismatch and res.kernel == target.name, res.summary()
    assert "bias3" in res.origin and res.pass_name == "codegen"
    # the halving over kernels, plus: full run, all op by op, confirm x2, one flag check
    assert res.evaluations <= math.ceil(math.log2(len(kernels))) + 5, res.steps
    assert res.flags, res.steps  # a flag string verified to avoid it
    print(res.summary())


def test_simulator_error_is_localised_to_the_kernel(tmp_path):
    """A kernel that reads past its input (a test hook shifts its load by one row) is a
    simulator error, not a crash: --backend sim bisection names the kernel and the rule."""
    import shutil

    import pytest

    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    from graphkernel.codegen import backend as cg

    g = layers_graph()
    compiled = graphkernel.compile(g, "--opt_level=2", env={}).graph
    target = next(k for k in compiled.nodes if k.op == "GraphKernel" and "bias4" in k.origin)

    def overrun(name, files):
        if name.startswith(f"gk_{target.name}_"):  # a vector kernel's load, or a MIX
            # kernel's loads of its epilogue inputs (the bias row), one row further on
            files = {f: re.sub(r"(gi\d+\[offX\d+ \+ gcol)\]", r"\1 + t.N]", t.replace(
                "gi0[r0 * t_.L + c0]", "gi0[r0 * t_.L + c0 + t_.L]")) for f, t in files.items()}
        return files

    cg.CORRUPT.append(overrun)
    try:
        j = verify(g, "--opt_level=2", backend="sim")
        res = bisect(g, flags="--opt_level=2", backend="sim", repro_dir=tmp_path)
    finally:
        cg.CORRUPT.remove(overrun)
    assert j.bad and "out of bounds" in j.sim_error, j.reason
    assert res.mismatch and res.kernel == target.name, res.summary()
    assert res.pass_name == "codegen" and "bias4" in res.origin
    assert "simulator error" in res.with_it and "out of bounds" in res.with_it
    assert res.without_it.startswith("ok")
    assert res.repro_reproduces and res.replay.startswith("graphkernel verify ")


def _scale_plugin(path) -> str:
    path.write_text(textwrap.dedent("""
        import numpy as np

        from graphkernel.registry import PassResult, register_pass


        @register_pass("scale_one_add", stage="simplify", level=2, order=37)
        def scale_one_add(graph, ctx):
            \"\"\"Scale the second operand of the 5th Add by 1.02 (wrong on purpose).\"\"\"
            adds = [n for n in graph.nodes if n.op == "Add"]
            if len(adds) < 5:
                return PassResult(False, 0)
            node = adds[4]
            x = node.inputs[1]
            if x.producer is not None and x.producer.name.startswith("scaled_"):
                return PassResult(False, 0)
            if not ctx.should_apply(f"{node.name} (scale an operand by 1.02)", [node]):
                return PassResult(False, 0)
            k = graph.const(np.asarray(1.02, dtype=x.dtype.np))
            mul = graph.add_node("Mul", [x, k], name=graph.fresh_name(f"scaled_{node.name}"),
                                 origin=node.origin)
            graph.replace_input(node, 1, mul.output)
            return PassResult(True, 1)
    """))
    return str(path)


def test_subtle_fault_in_a_transformer_gives_a_reproducer_that_replays(tmp_path, capsys):
    """One Add of GPT-2 off by 2 %: bisect names it, and the reproducer it writes (a cut
    subgraph if one still mismatches, else the whole model) replays the mismatch through the
    printed command, and the fixing flags avoid it."""
    import shlex

    plugin = _scale_plugin(tmp_path / "scale.py")
    out = tmp_path / "repro"
    try:
        assert main(["bisect", "examples/models/gpt2.json", "--plugin", plugin, "--repro-dir",
                     str(out), "--report", str(tmp_path / "r.json")]) == 0
    finally:
        registry.PASSES.pop("scale_one_add", None)
    text = capsys.readouterr().out
    import json

    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["pass_name"] == "scale_one_add" and rep["repro_reproduces"], text
    assert rep["repro_kind"] in ("cut subgraph", "whole model")
    assert f"reproducer ({rep['repro_kind']})" in text and "replay it: " in text
    # probe lines say what moved, not an unchanging cosine
    assert re.search(r"-> mismatch \(max abs [0-9.e-]+ > tol [0-9.e-]+ on output \w+", text)
    assert re.search(r"-> ok \(max abs [0-9.e-]+ <= tol", text)
    if rep["repro_kind"] == "whole model":
        assert "'--disable_pass=scale_one_add' avoids it (re-checked)" in rep["repro_note"]
        assert "--bisect_pass=scale_one_add --bisect_limit=0" in rep["repro_note"]
    cmd = shlex.split(rep["replay"])
    assert cmd[:2] == ["graphkernel", "verify"] and plugin in cmd
    replay = [sys.executable, "-m", "graphkernel.cli", *cmd[1:]]
    r = subprocess.run(replay, capture_output=True, text=True)
    assert r.returncode == 1 and "MISMATCH" in r.stdout, r.stdout + r.stderr
    fixed = subprocess.run([*replay, "--flags=--disable_pass=scale_one_add"],
                           capture_output=True, text=True)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr


def test_bisect_run_missing_or_non_executable_command_is_exit_2(tmp_path, capsys):
    assert main(["bisect", "run", "--", "/no/such/cmd"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "/no/such/cmd: no such file" in err
    script = tmp_path / "s.sh"
    script.write_text("#!/bin/sh\nexit 1\n")
    assert main(["bisect", "run", "--", str(script)]) == 2
    assert "not executable" in capsys.readouterr().err
    assert main(["bisect", "run", "--", "no-such-program-here"]) == 2
    assert "not found on PATH" in capsys.readouterr().err


def test_bisect_run_that_cannot_bisect_is_exit_1_with_the_childs_stderr(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import sys
        import graphkernel
        from graphkernel import Graph, TensorType
        g = Graph("g")
        x = g.add_input("x", TensorType((4, 4), "float32"))
        g.set_outputs([g.add_node("Exp", [g.add_node("Neg", [x]).output]).output])
        graphkernel.compile(g)
        print("loss went NaN at step 3", file=sys.stderr)
        sys.exit(1)                                # fails whatever graphkernel does
    """))
    rc = main(["bisect", "run", "--report", str(tmp_path / "r.json"), "--",
               sys.executable, str(script)])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert ("could not bisect: the program fails (exit 1) with every rewrite refused, and "
            "(exit 1) with graphkernel off too") in out and "not graphkernel's" in out
    assert "  | loss went NaN at step 3" in out
    import json

    report = json.loads((tmp_path / "r.json").read_text())
    assert report["stderr"] == ["loss went NaN at step 3"]
    assert report["passes_with_graphkernel_off"] is False


def _torch_script(tmp_path, body: str):
    script = tmp_path / "step.py"
    script.write_text(textwrap.dedent("""
        import copy, sys, torch
        import graphkernel.torch  # noqa: F401  (the backend)
        from graphkernel.frontends import fx
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        twin = copy.deepcopy(m)
        x = torch.randn(4, 8)
    """) + textwrap.dedent(body) + textwrap.dedent("""
        m(x).sum().backward()
        torch.compile(twin, backend="graphkernel")(x).sum().backward()
        same = all(torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-6)
                   for a, b in zip(m.parameters(), twin.parameters()))
        sys.exit(0 if same and OK else 1)   # the user's own gradient check
    """))
    return script


def test_external_driver_blames_graphkernel_when_it_fails_only_with_graphkernel_on(tmp_path):
    """A fault before any rewrite (the import of an op doubles it): every rewrite refused
    still fails, graphkernel off (torch's AOT-eager path) passes: graphkernel's, not the
    program's. (A program that fails with graphkernel off too is not graphkernel's: the
    test above.)"""
    pytest.importorskip("torch")
    broken = _torch_script(tmp_path, """
        OK = True
        handler = fx.ATEN["aten.tanh.default"]
        def doubled(c):
            y = handler(c)
            return c.emit("Mul", [y, c.const(2.0, y.dtype)])
        fx.ATEN["aten.tanh.default"] = doubled
    """)
    r = bisect_external([sys.executable, str(broken)])
    assert not r.found and r.passes_with_graphkernel_off is True
    assert "graphkernel's, before any rewrite" in r.message


def test_a_step_after_a_correctly_rounded_value_is_not_blamed():
    """A fp16 quotient of 22.997 is 23.0 correctly rounded to fp16 (a fused kernel computing
    it in fp32 and storing it in its fp16 type) but 22.98 op by op in fp16: Floor makes that
    1.0 apart. Both are the program's answer within its working precision, so the judge
    accepts either rounding of a step's input; a wrong step is still bad (the fuzzer's seed
    91 under its flags of the time)."""
    import numpy as np

    from graphkernel import Graph, TensorType
    from graphkernel.bisect import Evaluator

    g = Graph("steps")
    x = g.add_input("x", TensorType((4,), "float16"))
    m = g.add_node("Abs", [g.add_node("Maximum", [x, g.const(np.float16(1.3154296875))]).output])
    a = g.add_node("Add", [m.output, g.const(np.float16(1.505859375))]).output
    q = g.add_node("Div", [a, x]).output
    g.set_outputs([g.add_node("Floor", [q]).output])
    xs = np.array([0.1227, 0.004436, 1.0, 2.0], np.float16)
    ev = Evaluator(g, {"x": xs})
    exact = (np.abs(np.maximum(xs.astype(np.float64), 1.3154296875)) + 1.505859375) / xs
    fused = np.floor(exact.astype(np.float32).astype(np.float16)).astype(np.float16)
    in_kernel = np.floor(exact.astype(np.float32)).astype(np.float16)
    assert not np.array_equal(fused, ev.base[0])  # the rounding moves the step
    assert not ev.judge([fused]).bad and not ev.judge([in_kernel]).bad
    assert ev.judge([(fused + 1).astype(np.float16)]).bad
