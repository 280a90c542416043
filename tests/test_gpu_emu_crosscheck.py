"""L3: the same PTX and inputs on the H200 and in the emulator give bit-identical outputs (deterministic
kernels), so the emulator tier in CI stands for the hardware."""
import numpy as np
import pytest

from ptxgen import formats
from ptxgen.emu import Memory, run_kernel

pytestmark = pytest.mark.gpu

CASES = ["quantize_q8_1", "dequantize_q4_k", "rotate_tq4_1s", "gemv_tq4_1s_t1", "gemv_tq4_1s_t4_fused", "gemv_tq4_1s_t8",
         "gemv_q4_k_t1", "gemv_q4_k_t4", "gemv_tq4_1s_fast_t1", "gemv_tq4_1s_fast_t4", "convert_f16"]


def inputs(name, rng):
    if name == "quantize_q8_1" or name == "rotate_tq4_1s":
        x = rng.standard_normal((3, 256)).astype(np.float32)
        nb = x.size // 32
        out = nb * 36 if name == "quantize_q8_1" else x.nbytes
        return [x], out, ((nb + 7) // 8,), [nb]
    if name == "dequantize_q4_k":
        raw = formats.quantize("q4_K", rng.standard_normal((6, 512)).astype(np.float32))
        ns = 12
        return [raw], 6 * 512 * 2, ((ns + 7) // 8,), [ns]
    if name == "convert_f16":
        x = (rng.standard_normal((5, 256)) * 300).astype(np.float32)
        return [x], x.size * 2, (1,), []  # flag buffer appended by the test
    if "_fast_" in name:  # rotated activation as Q8_1 blocks
        from ptxgen.runtime.kernels import manifest

        t = int(name.rsplit("_t", 1)[1])
        m, k = 37, 768
        raw = formats.quantize("tq4_1s", rng.standard_normal((m, k)).astype(np.float32))
        q = formats.quantize("q8_1", formats.rht_forward(rng.standard_normal((t, k)).astype(np.float32)))
        rows = int(manifest("sm_89")[name]["meta"]["rows_per_cta"])
        return [raw, q], t * m * 4, ((m + rows - 1) // rows,), [m, k, t]
    fmt = "tq4_1s" if "tq4_1s" in name else "q4_K"
    t = int(name.rsplit("_t", 1)[1][0]) if not name.endswith("_fused") else int(name[:-6].rsplit("_t", 1)[1])
    m, k = 37, 768
    raw = formats.quantize(fmt, rng.standard_normal((m, k)).astype(np.float32))
    x = rng.standard_normal((t, k)).astype(np.float32)
    if fmt == "tq4_1s" and "fused" not in name:
        x = formats.rht_forward(x)
    from ptxgen.kernels.gemv import ROWS

    rows = ROWS[t]
    return [raw, x], t * m * 4, ((m + rows - 1) // rows,), [m, k, t]


@pytest.mark.parametrize("name", CASES)
def test_gpu_equals_emulator(name):
    import ptxgen.runtime as r
    from ptxgen.runtime.kernels import ptx_source

    rng = np.random.default_rng(11)
    arrays, out_bytes, grid, scalars = inputs(name, rng)
    fn = r.load(name, "sm_89")
    dev_in = [r.as_device_array(np.ascontiguousarray(a)) for a in arrays]
    dev_out = r.DeviceArray.empty((out_bytes,), np.uint8)
    dev_out.owner.fill_bytes(0xFF)
    extra_dev, extra_emu = [], []
    mem = Memory()
    if name == "convert_f16":  # (x, y, flag, n8)
        flag = r.DeviceArray.empty((1,), np.uint32)
        flag.owner.fill_bytes(0)
        extra_dev, extra_emu, scalars = [flag], [mem.alloc(np.zeros(1, np.uint32))], [arrays[0].size // 8]
    fn.launch(grid, (*dev_in, dev_out, *extra_dev, *scalars))
    gpu = dev_out.numpy()
    addrs = [mem.alloc(np.ascontiguousarray(a)) for a in arrays]
    o = mem.alloc(out_bytes, poison=0xFF)
    run_kernel(ptx_source(name, "sm_89")[0], grid, fn.block, (*addrs, o, *extra_emu, *scalars), mem)
    emu = mem.view(o, np.uint8, (out_bytes,))
    np.testing.assert_array_equal(gpu, emu)
