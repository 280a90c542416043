"""L3: the same PTX and inputs on the H200 and in the emulator give bit-identical outputs (deterministic
kernels), so the emulator tier in CI stands for the hardware."""
import numpy as np
import pytest

from ptxgen import formats
from ptxgen.emu import Memory, run_kernel

pytestmark = pytest.mark.gpu

CASES = ["prep_tq4_1s", "prep_tq4_1s_q8", "prep_q8_lanes", "gemv_tq4_1s_t2", "gemv_tq4_1s_fast_t8", "gemv_q8_0_t1",
         "gemv_q8_0_t4", "gemv_q4_k_fast_t1", "gemv_q4_k_fast_t8", "quantize_q8_1", "dequantize_q4_k", "rotate_tq4_1s", "gemv_tq4_1s_t1", "gemv_tq4_1s_t2_fused", "gemv_tq4_1s_t8",
         "gemv_q4_k_t1", "gemv_q4_k_t4", "gemv_tq4_1s_fast_t1", "gemv_tq4_1s_fast_t4", "convert_f16"]


def inputs(name, rng):
    from ptxgen.runtime.kernels import manifest

    if name.startswith("prep_"):
        from ptxgen.formats import tq4_1s as T4

        x = rng.standard_normal((3, 1440)).astype(np.float32)
        per = T4.LANE_GROUP_Q8 if name.endswith("_q8") else T4.LANE_GROUP_F32
        return [x], 3 * T4.lane_groups(1440) * per, ((x.size // 32 + 7) // 8,), [x.size // 32, 1440]
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
    if name.startswith(("gemv_q8_0", "gemv_q4_k_fast")):  # int8 x Q8_1 in the lane layout
        from ptxgen.formats import tq4_1s as T4

        fmt = "q8_0" if "q8_0" in name else "q4_K"
        t = int(name.rsplit("_t", 1)[1])
        m, k = 37, 768
        raw = formats.quantize(fmt, rng.standard_normal((m, k)).astype(np.float32))
        q = T4.to_lanes_q8(formats.quantize("q8_1", rng.standard_normal((t, k)).astype(np.float32)), k)
        rows = int(manifest("sm_89")[name]["meta"]["rows_per_cta"])
        return [raw, q], t * m * 4, ((m + rows - 1) // rows,), [m, k, t]
    if "_fast_" in name:  # rotated activation as Q8_1 blocks
        from ptxgen.runtime.kernels import manifest

        t = int(name.rsplit("_t", 1)[1])
        m, k = 37, 768
        raw = formats.quantize("tq4_1s", rng.standard_normal((m, k)).astype(np.float32))
        from ptxgen.formats import tq4_1s as T4

        q = T4.to_lanes_q8(formats.quantize("q8_1", formats.rht_forward(rng.standard_normal((t, k)).astype(np.float32))), k)
        rows = int(manifest("sm_89")[name]["meta"]["rows_per_cta"])
        return [raw, q], t * m * 4, ((m + rows - 1) // rows,), [m, k, t]
    fmt = "tq4_1s" if "tq4_1s" in name else "q4_K"
    t = int(name.rsplit("_t", 1)[1][0]) if not name.endswith("_fused") else int(name[:-6].rsplit("_t", 1)[1])
    m, k = 37, 768
    raw = formats.quantize(fmt, rng.standard_normal((m, k)).astype(np.float32))
    x = rng.standard_normal((t, k)).astype(np.float32)
    if fmt == "tq4_1s" and "fused" not in name:
        from ptxgen.formats import tq4_1s as T4

        x = T4.to_lanes_f32(formats.rht_forward(x))
    from ptxgen.runtime.kernels import manifest

    rows = int(manifest("sm_89")[name]["meta"]["rows_per_cta"])
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
    tail_dev, tail_emu = [], []
    if "split_k" in fn.meta:  # two K splits: the last warp of each row group sums them (in z order)
        grid = (grid[0], 2)
        part = r.DeviceArray.empty((2 * out_bytes // 4,), np.float32)
        cnt = r.DeviceArray.empty((grid[0] * int(fn.meta["warps"]),), np.uint32)
        cnt.owner.fill_bytes(0)
        tail_dev = [part, cnt]
        tail_emu = [mem.alloc(2 * out_bytes, poison=0xFF), mem.alloc(np.zeros(grid[0] * int(fn.meta["warps"]), np.uint32))]
    fn.launch(grid, (*dev_in, dev_out, *extra_dev, *scalars, *tail_dev))
    gpu = dev_out.numpy()
    addrs = [mem.alloc(np.ascontiguousarray(a)) for a in arrays]
    o = mem.alloc(out_bytes, poison=0xFF)
    run_kernel(ptx_source(name, "sm_89")[0], grid, fn.block, (*addrs, o, *extra_emu, *scalars, *tail_emu), mem)
    emu = mem.view(o, np.uint8, (out_bytes,))
    np.testing.assert_array_equal(gpu, emu)


@pytest.mark.parametrize("name,arch", [("mmq_q4_k_f16_n32", "sm_89"), ("mmq_q4_k_wgmma_n32", "sm_90a"),
                                       ("mmq_q4_k_wgmma_n128", "sm_90a")])
def test_gpu_equals_emulator_mmq(name, arch):
    """The tensor-core GEMMs: same PTX, same raw Q4_K and activations, two persistent CTAs sharing the
    queue. The emulator models an mma/wgmma as exact products summed and rounded once to fp32 per
    instruction; this records whether the H200's tensor cores round the same way (bit-identical)."""
    import ptxgen.runtime as r
    from ptxgen.emu.hopper import tensor_map_2d as emu_map
    from ptxgen.runtime.kernels import ptx_source
    from ptxgen.runtime.tma import tensor_map_2d as gpu_map

    rng = np.random.default_rng(5)
    m, t, k = 131, 45, 512
    raw = formats.quantize("q4_K", rng.standard_normal((m, k)).astype(np.float32))
    x = rng.standard_normal((t, k)).astype(np.float32)
    fn = r.load(name, arch)
    bn = int(fn.meta["bn"])
    tiles_n = (t + bn - 1) // bn
    wd, yd, qd = r.as_device_array(raw), r.DeviceArray.empty((t * m,), np.float32), r.DeviceArray.empty((2,), np.uint32)
    yd.owner.fill_bytes(0xFF)
    qd.owner.fill_bytes(0)
    mem = Memory()
    wa, ya, qa = mem.alloc(raw), mem.alloc(t * m * 4, poison=0xFF), mem.alloc(8, poison=0)
    if "wgmma" in name:
        x16 = x.astype(np.float16)
        xd, xa = r.as_device_array(x16), mem.alloc(x16)
        maps = [(gpu_map(wd.ptr, "u8", m, k // 256 * 144, 128, 16, "none"), emu_map(wa, "u8", m, k // 256 * 144, 128, 16, "none")),
                (gpu_map(xd.ptr, "f16", t, k, bn, 64, "128B"), emu_map(xa, "f16", t, k, bn, 64, "128B"))]
        rest = (m, k, t, k // 64, None, tiles_n, 1)
        dev_args = (maps[0][0], maps[1][0], yd, *rest[:4], qd, *rest[5:])
        emu_args = (maps[0][1], maps[1][1], ya, *rest[:4], qa, *rest[5:])
    else:
        xd, xa = r.as_device_array(x), mem.alloc(x)
        fd, fa = r.DeviceArray.empty((1,), np.uint32), mem.alloc(4, poison=0)
        fd.owner.fill_bytes(0)
        dev_args = (wd, xd, yd, fd, m, k, t, k // 64, qd, tiles_n, 1)
        emu_args = (wa, xa, ya, fa, m, k, t, k // 64, qa, tiles_n, 1)
    fn.launch((2,), dev_args)
    gpu = yd.numpy().reshape(t, m)
    run_kernel(ptx_source(name, arch)[0], (2,), fn.block, emu_args, mem, dynamic_smem=int(fn.meta["dynamic_smem"]))
    emu = mem.view(ya, np.float32, (t, m))
    assert np.isfinite(gpu).all() and np.isfinite(emu).all()
    diff = np.count_nonzero(gpu.view(np.uint32) != emu.view(np.uint32))
    rel = float(np.abs(gpu.astype(np.float64) - emu).max() / np.abs(emu).max())
    print(f"{name}: {diff} of {gpu.size} outputs differ in bits, max |gpu - emu| / max|y| = {rel:.1e}")
    assert diff == 0, f"{diff} of {gpu.size} outputs differ (max relative {rel:.1e})"
