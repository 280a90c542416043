"""L3: mul_mat as users call it — on their stream, asynchronous, inside CUDA graphs, from two threads, as a torch
operator (torch.compile). Each case compares bit for bit with a quiet eager call of the same plan."""
import threading

import numpy as np
import pytest

from ptxgen import formats
from ptxgen.testing.strategies import random_raw
from conftest import rel, rel_ref

pytestmark = pytest.mark.gpu


def _torch():
    """torch, imported when a GPU test runs (a machine without torch or a GPU collects this file without a skip)."""
    return pytest.importorskip("torch")

# decode (T = 1, 8), skinny (16, 32) and prefill (512, with the device-side fixup) paths on a 4096 x 4096 Q4_K weight
SHAPE = (4096, 4096)
PATHS = [1, 8, 16, 32, 512]


_W: dict = {}


def weights(seed=0, fmt="q4_K", shape=SHAPE):
    import ptxgen.runtime as r

    key = (seed, fmt, shape)
    if key not in _W:
        raw = random_raw(fmt, *shape, np.random.default_rng(seed))
        _W[key] = (r.QuantTensor.from_raw(fmt, raw, shape).to_device(), raw)
    return _W[key]


def reference(w, x):
    """The quiet eager answer (current stream, synchronized): what every other way of calling must reproduce bit for
    bit (its accuracy against float64 is test_gpu_gemv's and test_gpu_mmq's)."""
    torch = _torch()
    import ptxgen.runtime as r

    y = r.mul_mat(w, x)
    torch.cuda.synchronize()
    return y.clone()


def busy(stream, ms=1.0):
    """Queue about `ms` of GPU time on `stream`."""
    torch = _torch()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(int(ms * 1.5e6))


@pytest.mark.parametrize("t", [1, 16, 512])
def test_input_made_on_a_busy_side_stream(t):
    """x written behind a long chain of work on a torch side stream, then mul_mat inside `with torch.cuda.stream(s)`
    (its default stream is torch's current one): 100 of 100 trials right (x is NaN until the chain ends)."""
    torch = _torch()
    import ptxgen.runtime as r

    w, raw = weights()
    src = torch.randn(t, SHAPE[1], device="cuda")
    want = reference(w, src)
    assert rel_ref(want.cpu(), "q4_K", raw, *SHAPE, src.cpu().numpy()) < 1e-3
    s = torch.cuda.Stream()
    bad = 0
    for _ in range(100):
        x = torch.full_like(src, float("nan"))
        s.wait_stream(torch.cuda.current_stream())
        busy(s, 0.3)
        with torch.cuda.stream(s):
            x.copy_(src)
            y = r.mul_mat(w, x)
        s.synchronize()
        bad += not torch.equal(y, want)
    assert bad == 0, f"{bad} of 100 trials wrong"


def test_two_threads_on_two_streams():
    """Two Python threads, each with its own stream and weights, calling mul_mat at the same time (their
    workspaces are the streams' own): 100 of 100 calls right in each."""
    torch = _torch()
    import ptxgen.runtime as r

    cases = []
    for i in range(2):
        w, _ = weights(seed=10 + i)
        x = torch.randn(16 if i else 512, SHAPE[1], device="cuda")
        cases.append((w, x, reference(w, x)))
    bad, errors = [0, 0], []

    def work(i):
        torch = _torch()
        try:
            w, x, want = cases[i]
            s = torch.cuda.Stream()
            for _ in range(100):
                busy(s, 0.1)
                with torch.cuda.stream(s):
                    y = r.mul_mat(w, x)
                s.synchronize()
                bad[i] += not torch.equal(y, want)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert bad == [0, 0], bad


@pytest.mark.parametrize("t", [1, 512])
def test_the_call_does_not_wait_for_the_gpu(t):
    """Behind 10 ms of work on the same stream, mul_mat returns while the GPU is still busy (no host
    synchronization inside the op, the prefill path's overflow check included), and the result is right."""
    torch = _torch()
    import ptxgen.runtime as r

    w, _ = weights()
    x = torch.randn(t, SHAPE[1], device="cuda")
    want = reference(w, x)
    stream = torch.cuda.current_stream()
    busy(stream, 10.0)
    y = r.mul_mat(w, x)
    still_busy = not stream.query()  # the call came back before the 10 ms ahead of it finished
    torch.cuda.synchronize()
    assert still_busy
    assert torch.equal(y, want)


@pytest.mark.parametrize("t", PATHS)
def test_torch_cuda_graph_replays_the_eager_bits(t):
    """A loop of mul_mat calls captured with torch.cuda.graph: the graph holds the kernels (replay writes the
    NaN-poisoned outputs), replays bit-identical to eager, again and again, with new inputs copied in."""
    torch = _torch()
    import ptxgen.runtime as r

    ws = [weights(seed=20 + i)[0] for i in range(3)]
    x = torch.randn(t, SHAPE[1], device="cuda")
    ys = [torch.empty(t, SHAPE[0], device="cuda") for _ in ws]
    s = torch.cuda.Stream()  # warm up (plans, kernels) on a side stream, as torch recommends
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for w, y in zip(ws, ys):
            r.mul_mat(w, x, out=y)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for w, y in zip(ws, ys):
            r.mul_mat(w, x, out=y)
    for trial in range(3):
        x.copy_(torch.randn(t, SHAPE[1], device="cuda"))
        for y in ys:
            y.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        for w, y in zip(ws, ys):
            assert torch.equal(y, reference(w, x)), (t, trial)


@pytest.mark.parametrize("t", PATHS)
def test_stream_capture_through_cuda_python_records_every_kernel(t):
    """Plain stream capture (cuda-python) of one mul_mat: the graph has at least as many nodes as the plan has
    kernels, and its launch gives the eager bits."""
    torch = _torch()
    from cuda.bindings import driver as drv

    import ptxgen.runtime as r
    from ptxgen.runtime import ops

    w, _ = weights()
    x = torch.randn(t, SHAPE[1], device="cuda")
    y = torch.empty(t, SHAPE[0], device="cuda")
    want = reference(w, x)
    err, stream = drv.cuStreamCreate(1)
    assert int(err) == 0
    r.mul_mat(w, x, out=y, stream=stream)  # warm-up on the stream to be captured
    drv.cuStreamSynchronize(stream)
    assert int(drv.cuStreamBeginCapture(stream, drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL)[0]) == 0
    r.mul_mat(w, x, out=y, stream=stream)
    err, graph = drv.cuStreamEndCapture(stream)
    assert int(err) == 0
    err, _, n = drv.cuGraphGetNodes(graph, 0)
    assert int(err) == 0 and n >= len(ops.mul_mat_plan(w, t).kernels), n
    err, exe = drv.cuGraphInstantiate(graph, 0)
    assert int(err) == 0
    y.fill_(float("nan"))
    torch.cuda.synchronize()
    assert int(drv.cuGraphLaunch(exe, stream)[0]) == 0
    drv.cuStreamSynchronize(stream)
    assert torch.equal(y, want)
    drv.cuGraphExecDestroy(exe)
    drv.cuGraphDestroy(graph)
    drv.cuStreamDestroy(stream)


def test_an_overflowing_token_is_fixed_on_the_device_inside_a_graph():
    """The prefill GEMM's overflow fixup decides on the device: in a replayed graph, a token past fp16 comes out
    exact (fp32 recompute), the others as eager, and the next replay without it gives the eager bits again."""
    torch = _torch()
    import ptxgen.runtime as r

    w, raw = weights()
    t = 512
    x = torch.randn(t, SHAPE[1], device="cuda")
    clean = x.clone()
    y = torch.empty(t, SHAPE[0], device="cuda")
    r.mul_mat(w, x, out=y)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        r.mul_mat(w, x, out=y)
    x[7, 100] = 1e6
    g.replay()
    torch.cuda.synchronize()
    want = formats.gemm_ref("q4_K", raw, *SHAPE, x[6:9].cpu().numpy())
    assert rel(y[7].cpu(), want[1]) <= 1e-5
    assert rel(y[6].cpu(), want[0]) <= 1e-3
    x.copy_(clean)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, reference(w, clean))


def test_torch_operator_under_torch_compile_and_cuda_graphs():
    """ptxgen.torch.QuantLinear through torch.compile(fullgraph=True), with and without mode="reduce-overhead"
    (CUDA graphs): the eager bits, for decode and prefill token counts."""
    torch = _torch()
    from ptxgen.torch import QuantLinear

    w, _ = weights()
    layer = QuantLinear.from_quant_tensor(w).cuda()
    compiled = torch.compile(layer, fullgraph=True)
    graphed = torch.compile(layer, fullgraph=True, mode="reduce-overhead")
    for t in (1, 16, 512):
        x = torch.randn(t, SHAPE[1], device="cuda")
        want = reference(w, x)
        assert torch.equal(layer(x), want)
        assert torch.equal(compiled(x), want)
        for _ in range(3):  # cudagraph trees record on a later call, then replay
            got = graphed(x).clone()
        assert torch.equal(got, want), t


def test_quant_linear_of_several_gguf_tensors_is_their_layers_side_by_side(tmp_path):
    """QuantLinear.from_gguf(path, [names]): the tensors' rows as one layer (QuantTensor.cat); its output split by
    the tensors' rows is each tensor's own layer's output (within 1e-5: the splits may differ with M)."""
    torch = _torch()
    import ptxgen.runtime as r
    from ptxgen.torch import QuantLinear

    rng = np.random.default_rng(5)
    names = {"blk.0.attn_q.weight": 512, "blk.0.attn_k.weight": 128}
    r.write_gguf(tmp_path / "m.gguf", {n: r.QuantTensor.from_raw("q4_K", random_raw("q4_K", m, 1024, rng), (m, 1024))
                                       for n, m in names.items()})
    fused = QuantLinear.from_gguf(tmp_path / "m.gguf", list(names)).cuda()
    assert (fused.out_features, fused.in_features) == (640, 1024)
    x = torch.randn(3, 1024, device="cuda")
    q, k = torch.split(fused(x), list(names.values()), dim=1)
    for part, n in zip((q, k), names):
        want = QuantLinear.from_gguf(tmp_path / "m.gguf", n).cuda()(x)
        assert (part - want).norm() <= 1e-5 * want.norm()


def test_weights_still_on_the_host_are_refused_while_capturing():
    """An upload is not allowed while a stream captures: mul_mat says what to do instead of breaking the capture
    with a synchronous copy; the same weights work once uploaded."""
    torch = _torch()
    from cuda.bindings import driver as drv

    import ptxgen.runtime as r

    raw = random_raw("q4_K", 256, 512, np.random.default_rng(3))
    w = r.QuantTensor.from_raw("q4_K", raw, (256, 512))
    x = torch.randn(1, 512, device="cuda")
    y = torch.empty(1, 256, device="cuda")
    err, stream = drv.cuStreamCreate(1)
    drv.cuStreamBeginCapture(stream, drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL)
    with pytest.raises(RuntimeError, match="not on the GPU yet"):
        r.mul_mat(w, x, out=y, stream=stream)
    err, graph = drv.cuStreamEndCapture(stream)
    assert int(err) == 0 and not w.on_device
    w.to_device()
    r.mul_mat(w, x, out=y, stream=stream)
    drv.cuStreamSynchronize(stream)
    assert rel_ref(y.cpu().numpy(), "q4_K", raw, 256, 512, x.cpu().numpy()) < 1e-5
    drv.cuGraphDestroy(graph)
    drv.cuStreamDestroy(stream)


def test_a_numpy_x_with_a_torch_out_returns_that_out():
    """A synchronous call (NumPy x) that writes the caller's `out` returns the caller's object, whatever its kind."""
    torch = _torch()
    import ptxgen.runtime as r

    w, raw = weights()
    x = np.random.default_rng(5).standard_normal((2, SHAPE[1])).astype(np.float32)
    out = torch.full((2, SHAPE[0]), float("nan"), device="cuda")
    assert r.mul_mat(w, x, out=out) is out
    assert rel_ref(out.cpu().numpy(), "q4_K", raw, *SHAPE, x) < 1e-5


def test_a_reserved_workspace_moves_and_the_plans_bound_to_it_follow():
    """Workspace.reserve() reallocates in place; a plan bound before re-packs against the new memory (its result
    stays bit-identical), so nothing writes into the freed buffers."""
    torch = _torch()
    import ptxgen.runtime as r
    from ptxgen.runtime.plans import Workspace

    w, _ = weights()
    x = torch.randn(512, SHAPE[1], device="cuda")
    ws = Workspace()
    ws.reserve(w, 16)
    before = r.mul_mat(w, x[:16], workspace=ws).clone()
    epoch, scratch = ws.epoch, ws.scratch_ptr
    ws.reserve(w, [16, 512])
    assert ws.epoch == epoch + 1 and ws.scratch_ptr != scratch
    assert torch.equal(r.mul_mat(w, x[:16], workspace=ws), before)


def test_a_device_array_out_written_on_another_stream_reads_back_after_that_op():
    """out= a DeviceArray allocated on one stream, written by mul_mat on a busy other stream: out.numpy() waits for
    the op (it follows the stream that wrote it)."""
    torch = _torch()
    import ptxgen.runtime as r

    w, _ = weights()
    x = torch.randn(16, SHAPE[1], device="cuda")
    want = reference(w, x).cpu().numpy()
    out = r.DeviceArray.empty((16, SHAPE[0]), np.float32, stream=torch.cuda.current_stream().cuda_stream)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    busy(side, 10.0)
    r.mul_mat(w, x, out=out, stream=side)
    np.testing.assert_array_equal(out.numpy(), want)


@pytest.fixture
def counted_records(monkeypatch):
    """The few-token preps and GEMVs of Q4_K and Q8_0 at 1-2 tokens built with gemv_t1.T1_FLAG (the records handed
    over by a count, not by griddepcontrol.wait: a probe's builds, not in emitted/) and loaded in place of the
    emitted ones for the test; the DSL caches cleared on both sides."""
    from ptxgen.kernels import gemv_t1
    from ptxgen.runtime import kernels

    names = {f"{k}_t{n}" for k in ("prep_q4k", "gemv_q4_k_mma", "prep_sub16", "gemv_q8_0_mma") for n in (1, 2)}
    real = kernels.load

    def load(kernel, arch=None, source="emitted"):
        return real(kernel, arch, "dsl" if kernel in names else source)

    def clear():
        kernels._BEST.clear()
        kernels._built.cache_clear()
    clear()
    monkeypatch.setattr(gemv_t1, "T1_FLAG", True)
    monkeypatch.setattr(kernels, "load", load)
    yield names
    monkeypatch.undo()
    clear()


def test_counted_record_hand_over_in_a_graph_of_distinct_ops(counted_records, monkeypatch):
    """gemv_t1.T1_FLAG's builds under real concurrency (the emulator runs one op at a time): a CUDA graph of 12
    consecutive decode ops — Q4_K and Q8_0, 1 and 2 tokens, K of 4096 and 14336 (so consecutive ops' counts differ
    and either may be the larger), each with its own x — sharing one workspace and so one ready word, replayed
    with new inputs, then eagerly with the two-kernel launch: every y bit for bit what the same op gives alone on
    a quiet stream (no op passing on another's count, none hanging; the flagged builds' bits equal the shipped
    ones' in the emulator, test_emu)."""
    torch = _torch()
    import ptxgen.runtime as r
    from ptxgen import tuning
    from conftest import setknob

    shapes = [("q4_K", 1024, 4096, 1), ("q4_K", 4096, 14336, 2), ("q8_0", 2048, 4096, 1), ("q4_K", 4096, 4096, 1),
              ("q8_0", 4096, 14336, 2), ("q4_K", 14336, 4096, 1)] * 2
    ws = [weights(seed=40 + i, fmt=f, shape=(m, k))[0] for i, (f, m, k, _) in enumerate(shapes)]
    xs = [torch.randn(t, k, device="cuda") for _, _, k, t in shapes]
    ys = [torch.empty(t, m, device="cuda") for _, m, _, t in shapes]
    with tuning.override(codec_few_max_tokens={"q5_K": 32, "q8_0": 8}, codec_few_t1_min_weights=0,
                         codec_gemv_t1_max_weights={"q4_K": 0},  # Q4_K 1024x4096: the few build, not small_gemv
                         few_i8_max_tokens={"q4_K": 0}):  # (the fp16 builds: the int8 ones have no T1_FLAG build)
        setknob(monkeypatch, "PTXGEN_Q4K_FUSED", "0")  # eager calls run the pair too
        for w, x in zip(ws, xs):
            plan = r.mul_mat_plan(w, x.shape[0], graph=True)
            assert any(ln.fn.meta.get("ready_flag") for ln in plan.launches), plan.kernels

        def want():  # each op alone, quiet: the count has nothing to race
            return [reference(w, x) for w, x in zip(ws, xs)]
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for w, x, y in zip(ws, xs, ys):
                r.mul_mat(w, x, out=y)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for w, x, y in zip(ws, xs, ys):
                r.mul_mat(w, x, out=y)
        for trial in range(4):
            for x in xs:
                x.copy_(torch.randn_like(x))
            for y in ys:
                y.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            for i, (got, exp) in enumerate(zip(ys, want())):
                assert torch.equal(got, exp), (trial, i, shapes[i])
        for y in ys:  # eager, back to back on one stream
            y.fill_(float("nan"))
        for w, x, y in zip(ws, xs, ys):
            r.mul_mat(w, x, out=y)
        torch.cuda.synchronize()
        for i, (got, exp) in enumerate(zip(ys, want())):
            assert torch.equal(got, exp), ("eager", i, shapes[i])


def test_buffers_dropped_inside_a_capture_keep_the_graph(monkeypatch):
    """A GC pass can run inside any Python call, and a captured mul_mat makes many objects: a ptxgen buffer freed by
    cuMemFree then (weights, workspaces) goes at once with the thread's capture mode relaxed — in CUDA's default
    global mode the free would invalidate the capture ("operation failed due to a previous error during capture": a
    GPU tier lost a graph so, 2026-12-06) — and one the legacy stream would free waits until the op has recorded
    (driver._HELD). A buffer the caller's own code drops inside the capture, outside any op, is freed at once by the
    same relaxed cuMemFree. The graph replays the eager bits, and synchronize() after the capture frees what was
    held."""
    torch = _torch()
    import gc

    import ptxgen.runtime as r
    from ptxgen.runtime import driver, ops

    w, _ = weights(seed=11, shape=(512, 1024))
    x = torch.randn(512, 1024, device="cuda")
    want = r.mul_mat(w, x).cpu().numpy()
    side = torch.cuda.Stream()
    y = torch.empty((512, 512), device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        r.mul_mat(w, x, out=y)  # (warm-up, as torch recommends)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    workspace_for, held = ops.workspace_for, []

    def after_a_gc_pass(*a, **kw):  # every captured call binds its workspace inside the op, in global mode
        gc.collect()
        held.extend(driver._HELD)
        return workspace_for(*a, **kw)
    monkeypatch.setattr(ops, "workspace_for", after_a_gc_pass)

    class Cycle:  # unreachable once dropped: freed by a GC pass only
        pass
    junk = Cycle()
    junk.me, junk.bufs = junk, [r.DeviceBuffer(1 << 20), r.DeviceBuffer(1 << 16, stream=driver.LEGACY_STREAM)]
    sync_ptr, legacy_ptr = (b.ptr for b in junk.bufs)
    mine = [r.DeviceBuffer(1 << 20)]
    driver.synchronize()
    g = torch.cuda.CUDAGraph()
    gc.disable()  # (no automatic pass between the drop and the op; torch's own at the capture's start keeps junk)
    try:
        with torch.cuda.graph(g):
            del junk
            r.mul_mat(w, x, out=y)
            mine.clear()  # (the caller's own drop, outside the op: cuMemFree, relaxed)
    finally:
        gc.enable()
    assert legacy_ptr in held and sync_ptr not in held, (sync_ptr, legacy_ptr, held)
    y.fill_(float("nan"))
    g.replay()
    driver.synchronize()  # (frees what was held)
    np.testing.assert_array_equal(y.cpu().numpy().view(np.uint32), want.view(np.uint32))
    assert legacy_ptr not in driver._HELD
