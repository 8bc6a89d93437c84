"""The simulator's pipe model and its mask/repeat instructions: a cross-pipe access with no
sync is rejected naming the kernel, the line and both pipes; the same kernel with the
documented sync runs; WholeReduceSum/Max and Brcb match numpy and refuse what the device
would cut or misread."""

from __future__ import annotations

import numpy as np
import pytest

from graphkernel.codegen.sim.runner import SimulatorError, build, launch

pytestmark = pytest.mark.sim  # needs g++: skipped without it (tests/conftest.py)
UB = 196_608
N = 512  # floats of the one GM buffer every kernel here takes


def kernel(name: str, body: str) -> str:
    """A one-core kernel over GM x (N floats) with a TBuf t (no queue) and a VECIN queue q."""
    return (f'extern "C" __global__ __aicore__ void {name}(GM_ADDR x) {{\n'
            f"    GlobalTensor<float> g; g.SetGlobalBuffer((__gm__ float*)x, {N});\n"
            f"    TPipe pipe; TBuf<TPosition::VECCALC> b; TQue<QuePosition::VECIN, 1> q;\n"
            f"    pipe.InitBuffer(b, 4096); pipe.InitBuffer(q, 1, 256);\n"
            f"    LocalTensor<float> t = b.Get<float>();\n{body}\n}}\n"
            f"static void gk_sim_call_{name}(uint8_t** a) {{ {name}(a[0]); }}\n"
            f"GK_SIM_LAUNCHER({name}, 1)\n")


def sync(event: str) -> str:
    return (f"    {{ TEventID e = pipe.FetchEventID(HardEvent::{event});\n"
            f"      SetFlag<HardEvent::{event}>(e); WaitFlag<HardEvent::{event}>(e); }}")


# name: (first access, second access, the pipes in the message, the event that orders them)
RACES = {
    "v_then_s": ("Duplicate(t, 2.0f, 8);", "volatile float v = t.GetValue(0);",
                 "PIPE_S reads UB byte 0 that PIPE_V wrote", "V_S"),
    "s_then_v": ("t.SetValue(0, 2.0f);", "Adds(t[8], t, 1.0f, 8);",
                 "PIPE_V reads UB byte 0 that PIPE_S wrote", "S_V"),
    "s_then_mte3": ("t.SetValue(0, 2.0f);", "DataCopy(g, t, 8);",
                    "PIPE_MTE3 reads UB byte 0 that PIPE_S wrote", "S_MTE3"),
    "mte2_then_v": ("DataCopy(t, g, 8);", "Adds(t[8], t, 1.0f, 8);",
                    "PIPE_V reads UB byte 0 that PIPE_MTE2 wrote", "MTE2_V"),
    "mte2_then_s": ("DataCopy(t, g, 8);", "volatile float v = t.GetValue(0);",
                    "PIPE_S reads UB byte 0 that PIPE_MTE2 wrote", "MTE2_S"),
    "v_then_mte3": ("Duplicate(t, 2.0f, 8);", "DataCopy(g, t, 8);",
                    "PIPE_MTE3 reads UB byte 0 that PIPE_V wrote", "V_MTE3"),
    "v_read_then_mte2_write": ("Adds(t[8], t, 1.0f, 8);", "DataCopy(t, g, 8);",
                               "PIPE_MTE2 overwrites UB byte 0 that PIPE_V reads", "V_MTE2"),
    "mte3_read_then_v_write": ("DataCopy(g, t, 8);", "Duplicate(t, 2.0f, 8);",
                               "PIPE_V overwrites UB byte 0 that PIPE_MTE3 reads", "MTE3_V"),
    "s_write_then_mte2_write": ("t.SetValue(0, 2.0f);", "DataCopy(t, g, 8);",
                                "PIPE_MTE2 overwrites UB byte 0 that PIPE_S wrote", "S_MTE2"),
}
# the race kernels with their sync: the documented event pair, or PipeBarrier<PIPE_ALL>
FIXED = {f"{n}_event": f"    {a}\n{sync(ev)}\n    {b}" for n, (a, b, _, ev) in RACES.items()}
FIXED |= {f"{n}_barrier": f"    {a}\n    PipeBarrier<PIPE_ALL>();\n    {b}"
          for n, (a, b, _, _) in RACES.items()}
FIXED |= {
    # a queue hands the loaded tile to the vector unit: no event needed
    "queue_hand_over": "    LocalTensor<float> u = q.AllocTensor<float>();\n"
                       "    DataCopy(u, g, 64); q.EnQue(u);\n"
                       "    LocalTensor<float> w = q.DeQue<float>();\n"
                       "    Adds(w, w, 1.0f, 64); q.FreeTensor(w);",
    # an id held by AllocEventID, used twice, then released
    "alloc_event_id": "    TEventID e = pipe.AllocEventID<HardEvent::V_S>();\n"
                      "    for (int i = 0; i < 2; ++i) {\n"
                      "        PipeBarrier<PIPE_V>();  // after the last round's Duplicate\n"
                      "        Duplicate(t, 2.0f, 8);\n"
                      "        SetFlag<HardEvent::V_S>(e); WaitFlag<HardEvent::V_S>(e);\n"
                      "        volatile float v = t.GetValue(0);\n    }\n"
                      "    pipe.ReleaseEventID<HardEvent::V_S>(e);",
    # ordering is transitive: V -> S -> MTE3 through two events
    "chained_events": f"    Duplicate(t, 2.0f, 8);\n{sync('V_S')}\n{sync('S_MTE3')}\n"
                      "    DataCopy(g, t, 8);",
}
# two vector instructions on the same bytes: PipeBarrier<PIPE_V> (or the V_V event pair)
VRACES = {
    "v_then_v": ("Duplicate(t, 2.0f, 8);", "Adds(t[8], t, 1.0f, 8);",
                 "PIPE_V reads UB byte 0 that PIPE_V wrote"),
    "v_read_then_v_write": ("Adds(t[8], t, 1.0f, 8);", "Duplicate(t, 2.0f, 8);",
                            "PIPE_V overwrites UB byte 0 that PIPE_V reads"),
    "v_write_then_v_write": ("Duplicate(t, 2.0f, 8);", "Duplicate(t, 3.0f, 8);",
                             "PIPE_V overwrites UB byte 0 that PIPE_V wrote"),
}
FIXED |= {f"{n}_barrier_v": f"    {a}\n    PipeBarrier<PIPE_V>();\n    {b}"
          for n, (a, b, _) in VRACES.items()}
FIXED |= {f"{n}_event": f"    {a}\n{sync('V_V')}\n    {b}" for n, (a, b, _) in VRACES.items()}
FIXED |= {  # an instruction reading and writing the same bytes; disjoint bytes need nothing
    "v_in_place": "    Duplicate(t, 2.0f, 8);\n    PipeBarrier<PIPE_V>();\n"
                  "    Adds(t, t, 1.0f, 8);",
    "v_disjoint": "    Duplicate(t, 2.0f, 8);\n    Duplicate(t[8], 3.0f, 8);\n"
                  "    Adds(t[16], t[24], 1.0f, 8);",
}
# name: (body whose last line is the offending call, the message)
BROKEN = {f"race_{n}": (f"    {a}\n    {b}", msg) for n, (a, b, msg, _) in RACES.items()}
BROKEN |= {f"race_{n}": (f"    {a}\n    {b}", msg) for n, (a, b, msg) in VRACES.items()}
BROKEN |= {
    # PipeBarrier<PIPE_V> orders vector instructions only: the scalar read still races
    "barrier_v_is_not_v_to_s": ("    Duplicate(t, 2.0f, 8);\n    PipeBarrier<PIPE_V>();\n"
                                "    volatile float v = t.GetValue(0);",
                                "PIPE_S reads UB byte 0 that PIPE_V wrote"),
    "wrong_direction": (f"    Duplicate(t, 2.0f, 8);\n{sync('S_V')}\n"
                        "    volatile float v = t.GetValue(0);",
                        "PIPE_S reads UB byte 0 that PIPE_V wrote"),
    "queue_grants_its_consumer_only": ("    LocalTensor<float> u = q.AllocTensor<float>();\n"
                                       "    DataCopy(u, g, 64); q.EnQue(u);\n"
                                       "    LocalTensor<float> w = q.DeQue<float>();\n"
                                       "    volatile float v = w.GetValue(0);",
                                       "PIPE_S reads UB byte 4096 that PIPE_MTE2 wrote"),
    "literal_event_id": ("    SetFlag<HardEvent::V_S>(0);", "SetFlag with a literal event id"),
    "set_without_wait": ("    TEventID e = pipe.FetchEventID(HardEvent::V_S);\n"
                         "    SetFlag<HardEvent::V_S>(e);",
                         "SetFlag<HardEvent::V_S> has no WaitFlag before the kernel ends"),
    "wait_without_set": ("    TEventID e = pipe.FetchEventID(HardEvent::V_S);\n"
                         "    WaitFlag<HardEvent::V_S>(e);",
                         "with no SetFlag before it: PIPE_S would wait forever"),
    "id_of_another_event": ("    TEventID e = pipe.FetchEventID(HardEvent::V_S);\n"
                            "    SetFlag<HardEvent::S_V>(e);",
                            "SetFlag<HardEvent::S_V> with an id taken for V_S"),
    "set_twice": ("    TEventID e = pipe.FetchEventID(HardEvent::V_S);\n"
                  "    SetFlag<HardEvent::V_S>(e);\n    SetFlag<HardEvent::V_S>(e);",
                  "again while the SetFlag at line"),
    "barrier_s": ("    PipeBarrier<PIPE_S>();", "PipeBarrier<PIPE_S> is a hardware error"),
    "all_ids_allocated": ("    for (int i = 0; i < 9; ++i) pipe.AllocEventID<HardEvent::V_S>();",
                          "AllocEventID: all 8 ids of HardEvent::V_S are allocated"),
    # the mask/repeat forms' documented limits
    "repeat_over_255": ("    Adds(t, t, 1.0f, 64, 256, UnaryRepeatParams());",
                        "repeat 256 is outside 0..255"),
    "mask_over_repeat": ("    Adds(t, t, 1.0f, 65, 1, UnaryRepeatParams());",
                         "mask 65 is outside 1..64"),
    "rep_stride_over_8_bits": ("    Add(t, t, t, 64, 1, BinaryRepeatParams(1, 1, 1, 256, 8, 8));",
                               "dstRepStride 256 is outside 0..255"),
    "whole_reduce_source_unaligned": ("    WholeReduceSum(t, t[1], 8, 1, 1, 1, 8);",
                                      "is not 32-byte aligned"),
    "whole_reduce_overrun": ("    WholeReduceSum(t, t[512], 64, 9, 1, 1, 8);",
                             "overruns a buffer of 4096 bytes"),
    "whole_reduce_max_with_index": ("    WholeReduceMax(t, t, 8, 1, 1, 1, 8);",
                                    "ORDER_ONLY_VALUE only"),
    "brcb_overlap": ("    Brcb(t, t[8], 1, BrcbRepeatParams(1, 8));",
                     "Brcb with source and destination sharing UB"),
}

# GM x[0:256) as 4 rows of a 64-float pitch, 40 valid columns; the results go to x[256:512).
SEMANTICS = r"""
    DataCopy(t, g, 256);
""" + sync("MTE2_V") + r"""
    WholeReduceSum(t[256], t, 40, 4, 1, 1, 8);   // 4 row sums, one after another
    WholeReduceMax(t[264], t, 40, 4, 2, 1, 8, ReduceOrder::ORDER_ONLY_VALUE);  // every 2nd
    PipeBarrier<PIPE_V>();
    Brcb(t[320], t[256], 1, BrcbRepeatParams(1, 8));  // 8 sums/maxes, a block each
    PipeBarrier<PIPE_V>();
    // rows 0 and 1 minus their sums: block stride 0 reads the row's block of t[320] again
    // for each of the row's 8 blocks
    Sub(t[384], t, t[320], 64, 2, BinaryRepeatParams(1, 1, 0, 8, 8, 1));
""" + sync("V_MTE3") + r"""
    DataCopy(g[256], t[256], 256);
"""


@pytest.fixture(scope="module")
def lib():
    sources = [kernel(n, b) for n, (b, _) in BROKEN.items()]
    sources += [kernel(n, b) for n, b in FIXED.items()]
    sources.append(kernel("semantics", SEMANTICS))
    return build(sources)


def run(lib, name: str, x: np.ndarray | None = None) -> np.ndarray:
    x = np.arange(N, dtype=np.float32) if x is None else x
    launch(lib, name, [x], 1, UB)
    return x


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_unsynced_or_out_of_limit_kernels_are_rejected_naming_kernel_and_line(lib, name):
    body, message = BROKEN[name]
    with pytest.raises(SimulatorError) as e:
        run(lib, name)
    text = str(e.value)
    assert text.startswith(f"{name}: line ") and message in text, text
    src = kernel(name, body).splitlines()
    line = int(text.split("line ")[1].split(":")[0])
    assert src[line - 1].strip() == body.splitlines()[-1].strip(), (line, src[line - 1])


@pytest.mark.parametrize("name", sorted(RACES))
def test_a_race_names_the_line_of_the_earlier_access_and_the_event_that_fixes_it(lib, name):
    first, _, _, event = RACES[name]
    with pytest.raises(SimulatorError) as e:
        run(lib, f"race_{name}")
    src = kernel(f"race_{name}", f"    {first}\n    x").splitlines()
    first_line = next(i for i, ln in enumerate(src, 1) if ln.strip() == first)
    assert f"at line {first_line}," in str(e.value)
    assert f"SetFlag/WaitFlag<HardEvent::{event}>" in str(e.value)


@pytest.mark.parametrize("name", sorted(VRACES))
def test_a_vector_race_asks_for_a_vector_barrier(lib, name):
    with pytest.raises(SimulatorError, match=r"no sync in between \(PipeBarrier<PIPE_V>\)"):
        run(lib, f"race_{name}")


@pytest.mark.parametrize("name", sorted(FIXED))
def test_the_same_accesses_with_their_sync_run(lib, name):
    run(lib, name)


def test_synced_scalar_write_reaches_gm(lib):
    x = run(lib, "s_then_mte3_event")
    assert x[0] == 2.0 and x[8] == 8.0  # the copied element, then GM beyond the copy


def test_whole_reduce_and_brcb_match_numpy(lib):
    x0 = np.random.default_rng(0).standard_normal(N).astype(np.float32)
    x = run(lib, "semantics", x0.copy())
    rows = x0[:256].reshape(4, 64)[:, :40]
    sums, maxes = x[256:260], x[264:272:2]
    np.testing.assert_allclose(sums, rows.sum(axis=1), rtol=1e-5)
    np.testing.assert_array_equal(maxes, rows.max(axis=1))
    spread = x[320:384].reshape(8, 8)  # Brcb: block k holds element k of t[256:264)
    np.testing.assert_array_equal(spread, np.repeat(x[256:264, None], 8, axis=1))
    np.testing.assert_allclose(x[384:512].reshape(2, 64),
                               x0[:128].reshape(2, 64) - sums[:2, None], rtol=1e-6)
