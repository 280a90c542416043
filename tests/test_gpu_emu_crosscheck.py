"""L3: the same PTX and inputs on the H200 and in the emulator give bit-identical outputs (deterministic
kernels), so the emulator tier in CI stands for the hardware."""
import numpy as np
import pytest

from ptxgen import formats
from ptxgen.emu import Memory, run_kernel

pytestmark = pytest.mark.gpu

CASES = ["quantize_q8_1", "dequantize_q4_k", "rotate_tq4_1s", "gemv_tq4_1s_t1", "gemv_tq4_1s_t4_fused", "gemv_tq4_1s_t8",
         "gemv_q4_k_t1", "gemv_q4_k_t4"]


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
    fn.launch(grid, (*dev_in, dev_out, *scalars))
    gpu = dev_out.numpy()
    mem = Memory()
    addrs = [mem.alloc(np.ascontiguousarray(a)) for a in arrays]
    o = mem.alloc(out_bytes, poison=0xFF)
    run_kernel(ptx_source(name, "sm_89")[0], grid, (256,), (*addrs, o, *scalars), mem)
    emu = mem.view(o, np.uint8, (out_bytes,))
    np.testing.assert_array_equal(gpu, emu)
