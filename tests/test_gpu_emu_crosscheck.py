"""L3: every emitted kernel runs on the H200 and in the emulator with the same PTX and the same inputs, and the
outputs are bit-identical (all kernels are deterministic), so the emulator tier in CI stands for the hardware.

The emulator harnesses (ptxgen.emu.harness) draw the inputs and launch; a GPU backend with the same four
methods (memory, alloc/view, run, tensor_map) runs the very same harness code on the device. Tensor-core
kernels included: the emulator follows the tensor cores' own alignment and truncation (emu/tensorcore.py).
"""
import numpy as np
import pytest

from ptxgen.emu.harness import HARNESSES, check_kernel, use_backend
from ptxgen.kernels import KERNELS

pytestmark = pytest.mark.gpu


class GpuMemory:
    def __init__(self):
        self.keep = []

    def alloc(self, data, poison=None):
        import ptxgen.runtime as r

        if isinstance(data, int):
            buf = r.DeviceArray.empty((max(data, 1),), np.uint8)
            buf.owner.fill_bytes(poison or 0)
        else:
            buf = r.as_device_array(np.frombuffer(np.ascontiguousarray(data).tobytes(), np.uint8).copy())
        self.keep.append(buf)
        return buf

    def view(self, buf, dtype, shape):
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        return np.frombuffer(buf.numpy().tobytes()[:n], dtype).reshape(shape).copy()


class GpuBackend:
    """Compiles the harness's PTX text for this GPU (sm_90a PTX for sm_90a, other targets for sm_90) and
    launches it with the parameter ABI read from the PTX itself."""

    def __init__(self):
        self.fns = {}

    def memory(self):
        return GpuMemory()

    def run(self, ptx, grid, block, args, mem, dynamic_smem=0, seed=None, interleave=False, cluster=None):
        import ptxgen.runtime as r
        from ptxgen.emu.parser import parse
        from ptxgen.runtime.compiler import compile_ptx
        from ptxgen.runtime.driver import Module

        fn = self.fns.get(ptx)
        if fn is None:
            mod = parse(ptx)
            target = "sm_90a" if ".target sm_90a" in ptx else "sm_90"
            res = compile_ptx(ptx, target, name=mod.entry)
            params = [{"name": p.name, "type": p.type, "size": p.size} for p in mod.params]
            fn = self.fns[ptx] = Module(res.cubin, mod.entry).function(mod.entry, params, tuple(block), dynamic_smem)
        grid = tuple(grid) + (1,) * (3 - len(tuple(grid)))
        fn.launch(grid, args, block=tuple(block) + (1,) * (3 - len(tuple(block))), cluster=cluster)
        r.synchronize()

    def tensor_map(self, mem, buf, *args):
        from ptxgen.runtime.tma import tensor_map_2d

        return tensor_map_2d(buf.ptr, *args)


CASES = sorted(k for k in KERNELS if k in HARNESSES)


def test_every_kernel_is_cross_checked():
    assert set(KERNELS) == set(CASES)


@pytest.mark.parametrize("name", CASES)
def test_gpu_equals_emulator(name):
    arch = "sm_90a" if "sm_90a" in KERNELS[name].archs else "sm_89"  # sm_89 PTX compiled for the H200
    ptx = KERNELS[name].for_arch(arch).ptx()
    seed = 11
    emu = check_kernel(name, ptx, seed=seed)
    with use_backend(GpuBackend()):
        gpu = check_kernel(name, ptx, seed=seed)
    assert emu.ok, emu.detail
    assert gpu.ok, gpu.detail
    a = np.ascontiguousarray(np.asarray(gpu.got))
    b = np.ascontiguousarray(np.asarray(emu.got))
    assert a.shape == b.shape
    diff = np.count_nonzero(a.view(np.uint8) != b.view(np.uint8))
    if diff and a.nbytes % 4 == 0:  # NaN payloads are no contract (ptxas may compute a product in fp16): any NaN
        wa, wb = a.view(np.uint32).ravel(), b.view(np.uint32).ravel()  # word matches any NaN word
        nan = lambda w: ((w & 0x7F800000) == 0x7F800000) & ((w & 0x007FFFFF) != 0)  # noqa: E731
        diff = 4 * np.count_nonzero((wa != wb) & ~(nan(wa) & nan(wb)))
    print(f"{name} ({arch}): GPU {gpu.detail}; {diff} bytes differ from the emulator")
    assert diff == 0, f"{name}: {diff} bytes of {a.nbytes} differ between the GPU and the emulator"


# kernels whose sm_89 build is a different lowering from the sm_90a one the test above runs (cp.async, not TMA;
# or another ring depth)
SM89_LOWERINGS = ["gemv_q4_k_mma", "gemv_q4_k_mma_n16",  # gemv_q4_k_mma_t*: fewer ring stages and CTAs
                  "gemv_q4_k_mma_t1", "gemv_q4_k_mma_t2", "gemv_q4_k_mma_t4", "gemv_q4_k_mma_t8",
                  "gemv_q4_k_mma_t16h", "mmq_q4_k_rega_n32", "gemv_q6_k_mma_t1", "gemv_q8_0_mma_t1", "gemv_tq4_1s_mma_t1",
                  "gemv_q4_k_mma_t8s", "gemv_q6_k_mma_t16h"]


@pytest.mark.parametrize("name", SM89_LOWERINGS)
def test_gpu_equals_emulator_sm89_lowering(name):
    ptx = KERNELS[name].for_arch("sm_89").ptx()
    emu = check_kernel(name, ptx, seed=12)
    with use_backend(GpuBackend()):
        gpu = check_kernel(name, ptx, seed=12)
    assert emu.ok and gpu.ok, (emu.detail, gpu.detail)
    a, b = (np.ascontiguousarray(np.asarray(o.got)) for o in (gpu, emu))
    assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), f"{name} (sm_89): the GPU and the emulator differ"


NAN_PTX = """.version 8.7
.target sm_89
.address_size 64
.visible .entry nan_probe(
\t.param .u64 io
)
{
\t.reg .b32 %r<8>;
\t.reg .f32 %f<12>;
\t.reg .b64 %rd<4>;
\tld.param.u64 %rd1, [io];
\tmov.u32 %r1, %tid.x;
\tmul.wide.u32 %rd2, %r1, 32;
\tadd.s64 %rd3, %rd1, %rd2;
\tld.global.f32 %f1, [%rd3];
\tld.global.f32 %f2, [%rd3+4];
\tld.global.f32 %f3, [%rd3+8];
\tmul.rn.f32 %f4, %f1, %f2;
\tadd.rn.f32 %f5, %f1, %f2;
\tsub.rn.f32 %f6, %f1, %f2;
\tfma.rn.f32 %f7, %f1, %f2, %f3;
\tst.global.f32 [%rd3+12], %f4;
\tst.global.f32 [%rd3+16], %f5;
\tst.global.f32 [%rd3+20], %f6;
\tst.global.f32 [%rd3+24], %f7;
\tret;
}
"""


def test_fp32_nan_results_match_the_gpu():
    """NaN payloads out of mul/add/sub/fma (NaN operands, inf·0, inf − inf): the emulator's model
    (emu.machine._canonical_nan: always 0x7FFFFFFF) against the H200, bit for bit."""
    from ptxgen.emu.harness import _memory, _run

    vals = np.array([1.0, 0.0, np.inf, -np.inf, 2.5], np.float32).view(np.uint32).tolist()
    vals += [0x7FC00001, 0xFFC12345, 0x7FFFE000, 0x7F800001]  # quiet NaNs with payloads, a signalling NaN
    rows = [(a, b, c) for a in vals for b in vals for c in (vals[0], vals[5], vals[6])]
    io = np.zeros((len(rows), 8), np.uint32)
    io[:, :3] = rows
    outs = []
    for backend in (None, GpuBackend()):
        def go():
            mem = _memory()
            buf = mem.alloc(io)
            _run(NAN_PTX, (1,), (len(rows),), (buf,), mem)
            return mem.view(buf, np.uint32, io.shape)
        if backend is None:
            outs.append(go())
        else:
            with use_backend(backend):
                outs.append(go())
    emu, gpu = outs
    bad = np.nonzero((emu != gpu).any(axis=1))[0]
    for i in bad[:12]:
        print("a b c", [hex(v) for v in io[i, :3]], "gpu mul add sub fma", [hex(v) for v in gpu[i, 3:7]],
              "emu", [hex(v) for v in emu[i, 3:7]])
    assert bad.size == 0, f"{bad.size} of {len(rows)} rows differ"
