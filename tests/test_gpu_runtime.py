"""L3: the runtime and the first kernels on a GPU, against ptxgen.formats (bit-exact)."""
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ptxgen import formats
from ptxgen.testing import strategies as S

pytestmark = pytest.mark.gpu


def rt():
    import ptxgen.runtime as r

    return r


@settings(max_examples=30)
@given(data=st.data())
def test_quantize_q8_1_bit_exact(data):
    r = rt()
    t = data.draw(st.sampled_from([1, 2, 7, 64]))
    k = 32 * data.draw(st.integers(1, 20))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    x = (rng.standard_normal((t, k)) * data.draw(st.sampled_from([1e-4, 1.0, 300.0]))).astype(np.float32)
    if data.draw(st.booleans()):
        x[0, :32] = 0  # an all-zero block
    if data.draw(st.booleans()):
        x.flat[rng.integers(0, x.size)] = np.nan
    got = r.quantize_q8_1(x)
    np.testing.assert_array_equal(got, formats.quantize("q8_1", x))


@settings(max_examples=30)
@given(data=st.data(), fmt=st.sampled_from(["q4_K", "q5_K", "q6_K", "q8_0"]))
def test_dequantize_bit_exact(data, fmt):
    """dequantize_<fmt> (one kernel over each format's codec) equals formats' float32 dequant rounded to fp16, bit
    for bit (NaN where it is NaN), on drawn GGUF bytes of every format that has a codec."""
    r = rt()
    m, k = data.draw(S.matrix_shapes(fmt, max_rows=40, max_blocks_per_row=4))
    raw = data.draw(S.raw_matrix(fmt, m, k, max_abs_scale=1000.0))
    w = r.QuantTensor.from_raw(fmt, raw, (m, k))
    got = r.dequantize(w).numpy()
    with np.errstate(over="ignore", invalid="ignore"):
        want = formats.dequantize(fmt, raw, (m, k)).astype(np.float16)
    same = (got.view(np.uint16) == want.view(np.uint16)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), f"{fmt} {m}x{k}: {np.count_nonzero(~same)} of {same.size} differ"


def test_repeated_launches_are_bit_identical_and_poisoned_outputs_are_overwritten():
    r = rt()
    w = r.QuantTensor.from_numpy(np.random.default_rng(0).standard_normal((64, 1024)).astype(np.float32), "q4_K")
    out = r.DeviceArray.empty((64, 1024), np.float16)
    outs = []
    for _ in range(3):
        out.owner.fill_bytes(0xFF)  # NaN poison
        r.dequantize(w, out=out)
        outs.append(out.numpy())
    assert not np.isnan(outs[0]).any()
    for o in outs[1:]:
        np.testing.assert_array_equal(o.view(np.uint16), outs[0].view(np.uint16))


def test_dynamic_shared_memory_above_48k():
    r = rt()
    from ptxgen.arch import get_arch
    from ptxgen.probes import dynamic_smem_kernel

    k = dynamic_smem_kernel(get_arch("sm_89"), 64 * 1024)
    ctx = r.current()
    res = r.compile_ptx(k.ptx(), f"sm_{ctx.sm}", name="dsmem_probe")
    fn = r.driver.Module(res.cubin).function(k.entry, [p.abi() for p in k.params], k.block, 64 * 1024)
    o = r.DeviceArray.empty((256,), np.uint32)
    fn.launch((1,), (o,))
    np.testing.assert_array_equal(o.numpy(), np.arange(255, -1, -1))


def test_cache_second_process_loads_from_disk(tmp_path):
    code = ("import numpy as np, ptxgen.runtime as r; x = np.ones((2, 64), np.float32); r.quantize_q8_1(x); print('ok')")
    env = dict(os.environ, PTXGEN_CACHE_DIR=str(tmp_path), PTXGEN_VERBOSE="1")
    a = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    b = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert "compiled" in a.stderr and "cache disk" in b.stderr and "compiled" not in b.stderr


def test_torch_and_cupy_inputs():
    r = rt()
    torch = pytest.importorskip("torch")
    x = torch.randn(4, 128, device="cuda", dtype=torch.float32)
    q = r.quantize_q8_1(x)
    got = torch.as_tensor(q, device="cuda").cpu().numpy()
    np.testing.assert_array_equal(got, formats.quantize("q8_1", x.cpu().numpy()))
    with pytest.raises(TypeError, match="expected dtype float32, got float16"):
        r.quantize_q8_1(x.half())
    with pytest.raises(ValueError, match="non-contiguous"):
        r.quantize_q8_1(torch.randn(128, 4, device="cuda").t())
    cupy = pytest.importorskip("cupy")
    xc = cupy.asarray(x.cpu().numpy())
    np.testing.assert_array_equal(r.quantize_q8_1(xc).numpy(), got)


def test_gguf_to_gpu_dequant(tmp_path):
    """A GGUF file (ptxgen's writer; the `gguf` package checks the reader in the CPU tier) to the GPU: the bytes
    stay on the host until the first op, which uploads them."""
    from ptxgen.gguf import write_gguf

    r = rt()
    w = np.random.default_rng(5).standard_normal((32, 512)).astype(np.float32)
    raw = formats.quantize("q4_K", w)
    write_gguf(tmp_path / "m.gguf", {"w": (12, (32, 512), raw)})
    t = r.QuantTensor.from_gguf(tmp_path / "m.gguf", "w")
    assert not t.on_device
    np.testing.assert_array_equal(r.dequantize(t).numpy(), formats.dequantize("q4_K", raw, (32, 512)).astype(np.float16))
    assert t.on_device and t.raw().tobytes() == raw.tobytes()


def test_cluster_launch():
    """Function.launch(cluster=...) sets the cluster dimension: ranks 0,1 within each pair of CTAs."""
    r = rt()
    from ptxgen.arch import get_arch
    from ptxgen.probes import cluster_rank_kernel

    ctx = r.current()
    if ctx.sm < 90:
        pytest.skip("thread-block clusters need sm_90 or newer")
    k = cluster_rank_kernel(get_arch("sm_90a"))
    res = r.compile_ptx(k.ptx(), f"sm_{ctx.sm}a", name="cluster_probe")
    fn = r.driver.Module(res.cubin).function(k.entry, [p.abi() for p in k.params], k.block, 0)
    o = r.DeviceArray.empty((8, 3), np.uint32)
    o.owner.fill_bytes(0xFF)
    fn.launch((8,), (o,), cluster=(2, 1, 1))
    got = o.numpy()
    np.testing.assert_array_equal(got[:, 0], [0, 1] * 4)
    np.testing.assert_array_equal(got[:, 1], [0, 0, 1, 1, 2, 2, 3, 3])
    np.testing.assert_array_equal(got[:, 2], [2] * 8)


def test_dlpack_only_input_and_a_stream():
    """An object with only __dlpack__ (no CUDA array interface) is accepted; a launch on a created stream."""
    r = rt()
    torch = pytest.importorskip("torch")

    class OnlyDLPack:
        def __init__(self, t):
            self.t, self.shape = t, tuple(t.shape)

        def __dlpack__(self, *a, **kw):
            return self.t.__dlpack__(*a, **kw)

        def __dlpack_device__(self):
            return self.t.__dlpack_device__()

    x = np.random.default_rng(4).standard_normal((3, 256)).astype(np.float32)
    xd = OnlyDLPack(torch.from_numpy(x).cuda())
    assert not hasattr(xd, "__cuda_array_interface__")
    got = r.quantize_q8_1(xd).numpy()
    np.testing.assert_array_equal(got, formats.quantize("q8_1", x))
    drv = r.driver._drv()
    stream = r.driver.check(drv.cuStreamCreate(0), "cuStreamCreate")
    fn = r.load("quantize_q8_1")
    o = r.DeviceArray.empty((3, 8 * 36), np.uint8)
    fn.launch((3,), (r.as_device_array(x), o, 24), stream=stream)  # 8 blocks per CTA
    r.driver.check(drv.cuStreamSynchronize(stream), "cuStreamSynchronize")
    np.testing.assert_array_equal(o.numpy().reshape(3, -1), formats.quantize("q8_1", x))


def test_out_of_memory_is_a_python_exception():
    """An allocation the GPU cannot hold raises (naming the call), and the runtime keeps working after it."""
    r = rt()
    with pytest.raises((r.CudaError, MemoryError), match="(?i)out of memory|cuMemAlloc"):
        r.DeviceBuffer(1 << 50)  # 1 PiB
    x = np.ones((2, 64), np.float32)
    np.testing.assert_array_equal(r.quantize_q8_1(x), formats.quantize("q8_1", x))


def test_smem_for_residency_limits_resident_ctas():
    """Function.smem_for_residency(n): the least dynamic shared memory at which the occupancy calculator puts at
    most n CTAs of the kernel on an SM (16 bytes less allows more); mul_mat launches the Q4_K tensor-core GEMV
    with it where a 3-per-SM grid fills the GPU better."""
    rt()
    from cuda.bindings import driver as drv

    from ptxgen.runtime import kernels
    from ptxgen.runtime.driver import current

    if current().sm != 90:
        pytest.skip("gemv_q4_k_mma is built for sm_90a")
    fn = kernels.load("gemv_q4_k_mma")
    full = fn.resident_per_sm()
    smem = fn.smem_for_residency(full - 1)
    occ = lambda nb: drv.cuOccupancyMaxActiveBlocksPerMultiprocessor(fn.handle, 128, nb)[1]  # noqa: E731
    assert smem > fn.dynamic_smem and occ(smem) == full - 1 and occ(smem - 16) == full
    assert fn.smem_for_residency(full) == fn.dynamic_smem


def test_resident_clusters_is_bounded_by_the_ctas_that_fit():
    """Function.resident_clusters(2) for the cluster MMQ (one CTA per SM): at least one cluster, at most
    sm_count x resident_per_sm / 2 (a cluster's CTAs share a GPC, so the driver may report fewer); mmq_launch
    sizes the static cluster schedule's grid by it."""
    rt()
    from ptxgen.runtime import kernels
    from ptxgen.runtime.driver import current

    if current().sm != 90:
        pytest.skip("the cluster MMQ is built for sm_90a")
    fn = kernels.load("mmq_q4_k_wgmma_ra_n256_mc2")
    n = fn.resident_clusters(2)
    assert 1 <= n <= current().sm_count * fn.resident_per_sm() // 2
    assert fn.resident_clusters(2) == n  # cached


def test_a_fresh_process_may_start_with_any_entry_point():
    """The first runtime call of a process may be mul_mat_plan, a capture query or an op on host weights: each
    initialises the driver itself."""
    code = ("import numpy as np, ptxgen.runtime as r; from ptxgen.runtime import ops, driver\n"
            "w = r.QuantTensor.from_numpy(np.ones((128, 256), np.float32), 'q4_K')\n"
            "print(ops.mul_mat_plan(w, 1).kernels[-1], driver.capture_id(2))\n"
            "print(float(r.mul_mat(w, np.ones((1, 256), np.float32))[0, 0]))")
    for first in (code, code.replace("print(ops.mul_mat_plan(w, 1).kernels[-1], driver.capture_id(2))\n", "")):
        p = subprocess.run([sys.executable, "-c", first], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr[-1500:]
