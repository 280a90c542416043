"""The emulator: instruction semantics against hand-computed results (edge cases included), its error
reporting, and every emitted kernel × arch run through it against the NumPy references (the CI tier that
checks kernel numerics without a GPU)."""
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ptxgen.emu import EmulationError, Emulator, Memory, Unsupported
from ptxgen.emu.harness import HARNESSES, UNCOVERED, check_kernel, gemv_codec_case
from ptxgen.kernels import KERNELS

HEADER = """.version 8.7
.target sm_89
.address_size 64
.visible .entry t(
\t.param .u64 out
)
{
\t.reg .pred %p<8>;
\t.reg .b16 %h<8>;
\t.reg .b32 %r<32>;
\t.reg .f32 %f<32>;
\t.reg .b64 %rd<8>;
\t.shared .align 16 .b8 sm[1024];
"""


def run(body: str, threads: int = 32, out_bytes: int = 4096, seed=None):
    ptx = HEADER + "\tmov.u32 %r31, %tid.x;\n" + "\n".join("\t" + line for line in body.strip().splitlines()) + "\n\tret;\n}\n"
    mem = Memory()
    o = mem.alloc(out_bytes)
    emu = Emulator(ptx)
    emu.run((1,), (threads,), (o,), mem, seed=seed)
    return emu, mem, o


def reg(emu, name, t="u32"):
    from ptxgen.emu.machine import typed

    return typed(emu.cta.regs[name], t)


def f32bits(x):
    return "0f%08X" % np.float32(x).view(np.uint32)


def test_integer_alu_and_wide_multiply():
    emu, *_ = run("""
mov.u32 %r1, 0xFFFFFFFF;
add.u32 %r2, %r1, 2;
mul.lo.u32 %r3, %r1, 3;
mul.wide.u32 %rd1, %r1, 3;
mad.lo.u32 %r4, %r31, 10, 7;
mad.wide.u32 %rd2, %r31, 4, %rd1;
shr.s32 %r5, %r1, 4;
shr.u32 %r6, %r1, 28;
shl.b32 %r7, %r31, 31;
sub.s32 %r8, 0, %r31;
""")
    assert reg(emu, "%r2")[0] == 1 and reg(emu, "%r3")[0] == 0xFFFFFFFD
    assert reg(emu, "%rd1", "u64")[0] == 3 * 0xFFFFFFFF
    np.testing.assert_array_equal(reg(emu, "%r4"), np.arange(32) * 10 + 7)
    assert reg(emu, "%rd2", "u64")[3] == 3 * 0xFFFFFFFF + 12
    assert reg(emu, "%r5", "s32")[0] == -1 and reg(emu, "%r6")[0] == 15
    assert reg(emu, "%r7")[1] == 0x80000000 and reg(emu, "%r8", "s32")[5] == -5


def test_float_edge_cases():
    nan, inf = "0f7FC00000", "0f7F800000"
    emu, *_ = run(f"""
max.f32 %f1, {nan}, 0f3F800000;
max.NaN.f32 %f2, {nan}, 0f3F800000;
max.f32 %f3, 0f80000000, 0f00000000;
min.f32 %f4, 0f80000000, 0f00000000;
div.rn.f32 %f5, 0f3F800000, 0f40400000;
div.rn.f32 %f6, 0f3F800000, 0f00000000;
setp.gt.f32 %p1, {nan}, 0f00000000;
setp.ne.f32 %p2, {nan}, 0f00000000;
abs.f32 %f7, 0fBF800000;
add.rn.f32 %f8, {inf}, 0fFF800000;
""")
    assert reg(emu, "%f1", "f32")[0] == 1 and np.isnan(reg(emu, "%f2", "f32")[0])
    assert not np.signbit(reg(emu, "%f3", "f32")[0]) and np.signbit(reg(emu, "%f4", "f32")[0])
    assert reg(emu, "%f5", "f32")[0] == np.float32(1) / np.float32(3) and reg(emu, "%f6", "f32")[0] == np.inf
    assert not reg(emu, "%p1", "pred")[0] and not reg(emu, "%p2", "pred")[0]
    assert reg(emu, "%f7", "f32")[0] == 1 and np.isnan(reg(emu, "%f8", "f32")[0])


def test_fma_rounds_once():
    a = np.float32(1 + 2**-12)
    c = np.float32(-(1 + 2**-11))
    # a*a = 1 + 2^-11 + 2^-24: fused keeps 2^-24; mul then add rounds it away first
    emu, *_ = run(f"fma.rn.f32 %f1, {f32bits(a)}, {f32bits(a)}, {f32bits(c)};\n"
                  f"mul.rn.f32 %f2, {f32bits(a)}, {f32bits(a)};\nadd.rn.f32 %f3, %f2, {f32bits(c)};")
    assert reg(emu, "%f1", "f32")[0] == np.float32(2**-24)
    assert reg(emu, "%f3", "f32")[0] == 0


def test_packed_half_arithmetic():
    """f16x2 mul/sub/fma per half with one rounding (mul.f16x2 was once computed as an integer product)."""
    h = lambda lo, hi: int(np.float16(lo).view(np.uint16)) | int(np.float16(hi).view(np.uint16)) << 16  # noqa: E731
    emu, *_ = run(f"""
mul.rn.f16x2 %r1, {h(3.0, 1 / 16)}, {h(-1024.0, 63.0)};
sub.rn.f16x2 %r2, {h(1025.0, 1039.0)}, {h(1024.0, 1024.0)};
fma.rn.f16x2 %r3, {h(1039.0, 1264.0)}, {h(63.0, 63 / 16)}, {h(-64512.0, -4032.0)};
mul.rn.f16x2 %r4, {h(1 + 2**-10, 1.0)}, {h(1 + 2**-10, 65504.0)};
""")
    halves = lambda r: np.array([r & 0xFFFF, r >> 16], np.uint16).view(np.float16).tolist()  # noqa: E731
    assert halves(int(reg(emu, "%r1")[0])) == [-3072.0, 63 / 16]
    assert halves(int(reg(emu, "%r2")[0])) == [1.0, 15.0]
    assert halves(int(reg(emu, "%r3")[0])) == [945.0, 945.0]  # (1024 + q)·sc − 1024·sc: exact only when fused
    assert halves(int(reg(emu, "%r4")[0])) == [1 + 2**-9, 65504.0]  # 1 + 2^-9 + 2^-20 rounds to 1 + 2^-9


def test_conversions_rounding_and_saturation():
    emu, *_ = run(f"""
cvt.rni.s32.f32 %r1, {f32bits(2.5)};
cvt.rni.s32.f32 %r2, {f32bits(-3.5)};
cvt.rzi.s32.f32 %r3, {f32bits(-3.7)};
cvt.rni.s32.f32 %r4, 0f7FC00000;
cvt.rni.s32.f32 %r5, {f32bits(3e10)};
cvt.rn.f16.f32 %h1, {f32bits(1 + 2**-11)};
cvt.rn.f16.f32 %h2, {f32bits(1e6)};
cvt.rn.f16.f32 %h3, 0f7FC00001;
cvt.f32.f16 %f1, %h1;
cvt.rn.f16x2.f32 %r6, {f32bits(2.0)}, {f32bits(1.0)};
cvt.sat.u8.s32 %r7, 300;
cvt.rn.f32.u32 %r8, 16777217;
""")
    assert list(reg(emu, "%r1", "s32")[:1]) == [2] and reg(emu, "%r2", "s32")[0] == -4
    assert reg(emu, "%r3", "s32")[0] == -3 and reg(emu, "%r4", "s32")[0] == 0 and reg(emu, "%r5", "s32")[0] == 2**31 - 1
    assert reg(emu, "%h1", "u16")[0] == 0x3C00  # tie to even
    assert reg(emu, "%h2", "u16")[0] == 0x7C00 and reg(emu, "%h3", "u16")[0] == 0x7FFF
    assert reg(emu, "%r6")[0] == 0x40003C00
    assert reg(emu, "%r7")[0] == 255 and reg(emu, "%r8", "f32")[0] == 16777216.0


def test_bit_manipulation():
    emu, *_ = run("""
bfe.u32 %r1, 0xABCD1234, 8, 8;
bfe.s32 %r2, 0x0000F000, 12, 4;
bfe.u32 %r3, 0xABCD1234, 28, 8;
bfi.b32 %r4, 0x5, 0xFFFF0000, 4, 3;
prmt.b32 %r5, 0x807F01FF, 0x0, 0x3210;
prmt.b32 %r6, 0x807F01FF, 0x0, 0xB9A8;
prmt.b32 %r7, 0x44332211, 0x88776655, 0x7654;
lop3.b32 %r8, 0xF0F0F0F0, 0xCCCCCCCC, 0xAAAAAAAA, 0x96;
lop3.b32 %r9, 0xFF00FF00, 0x0F0F0F0F, 0x0, 0xC0;
""")
    assert reg(emu, "%r1")[0] == 0x12 and reg(emu, "%r2", "s32")[0] == -1 and reg(emu, "%r3")[0] == 0xA
    assert reg(emu, "%r4")[0] == 0xFFFF0050
    assert reg(emu, "%r5")[0] == 0x807F01FF and reg(emu, "%r6")[0] == 0xFF0000FF
    assert reg(emu, "%r7")[0] == 0x88776655
    assert reg(emu, "%r8")[0] == 0xF0F0F0F0 ^ 0xCCCCCCCC ^ 0xAAAAAAAA and reg(emu, "%r9")[0] == 0x0F000F00


def test_funnel_shift_and_rz_conversion():
    emu, *_ = run(f"""
shf.l.wrap.b32 %r1, 0x89ABCDEF, 0x01234567, 8;
shf.r.wrap.b32 %r2, 0x89ABCDEF, 0x01234567, 36;
shf.r.clamp.b32 %r3, 0x89ABCDEF, 0x01234567, 40;
cvt.rz.f16.f32 %h1, {f32bits(1 + 2**-11 + 2**-13)};
cvt.rn.f16.f32 %h2, {f32bits(1 + 2**-11 + 2**-13)};
cvt.rz.f16.f32 %h3, {f32bits(1e6)};
""")
    assert reg(emu, "%r1")[0] == 0x23456789 and reg(emu, "%r2")[0] == 0x789ABCDE and reg(emu, "%r3")[0] == 0x01234567
    assert reg(emu, "%h1", "u16")[0] == 0x3C00 and reg(emu, "%h2", "u16")[0] == 0x3C01
    assert reg(emu, "%h3", "u16")[0] == 0x7BFF  # rz saturates to the largest finite half


def test_shuffles_and_selp():
    emu, *_ = run("""
shfl.sync.bfly.b32 %r1, %r31, 1, 31, 0xFFFFFFFF;
shfl.sync.down.b32 %r2, %r31, 4, 31, 0xFFFFFFFF;
shfl.sync.idx.b32 %r3, %r31, 7, 31, 0xFFFFFFFF;
setp.lt.u32 %p1, %r31, 3;
selp.b32 %r4, 100, 200, %p1;
""", threads=64)
    lanes = np.arange(64) % 32
    np.testing.assert_array_equal(reg(emu, "%r1"), np.arange(64) ^ 1)
    np.testing.assert_array_equal(reg(emu, "%r2"), np.where(lanes + 4 <= 31, np.arange(64) + 4, np.arange(64)))
    np.testing.assert_array_equal(reg(emu, "%r3"), (np.arange(64) // 32) * 32 + 7)
    assert list(reg(emu, "%r4")[:4]) == [100, 100, 100, 200]


def test_memory_vectors_and_divergent_branches():
    emu, mem, o = run("""
mov.u32 %r1, sm;
mad.lo.u32 %r2, %r31, 8, %r1;
mov.u32 %r3, 0x11111111;
st.shared.v2.u32 [%r2], {%r31, %r3};
bar.sync 0;
ld.shared.v2.u32 {%r4, %r5}, [%r2];
ld.param.u64 %rd1, [out];
mad.wide.u32 %rd2, %r31, 4, %rd1;
setp.lt.u32 %p1, %r31, 5;
@%p1 bra $L_small;
st.global.u32 [%rd2], %r4;
bra $L_end;
$L_small:
add.u32 %r6, %r4, 1000;
st.global.u32 [%rd2], %r6;
$L_end:
""")
    got = mem.view(o, np.uint32, (1024,))[:32]
    np.testing.assert_array_equal(got, np.where(np.arange(32) < 5, np.arange(32) + 1000, np.arange(32)))


def test_errors_name_the_problem():
    with pytest.raises(EmulationError, match="reads shared byte .* nothing wrote"):
        run("mov.u32 %r1, sm;\nld.shared.u32 %r2, [%r1+64];")
    with pytest.raises(EmulationError, match="out-of-bounds"):
        run("ld.param.u64 %rd1, [out];\nst.global.u32 [%rd1+4096], %r31;")
    with pytest.raises(EmulationError, match="misaligned"):
        run("ld.param.u64 %rd1, [out];\nst.global.u32 [%rd1+2], %r31;")
    with pytest.raises(EmulationError, match="divergent shfl"):
        run("setp.lt.u32 %p1, %r31, 16;\n@%p1 bra $L_x;\nshfl.sync.bfly.b32 %r1, %r31, 1, 31, 0xFFFFFFFF;\n$L_x:")
    with pytest.raises(EmulationError, match="divergent bar.sync"):
        run("setp.lt.u32 %p1, %r31, 16;\n@%p1 bra $L_x;\nbar.sync 0;\n$L_x:\nbar.sync 0;")
    with pytest.raises(EmulationError, match="bra.uni diverges"):
        run("setp.lt.u32 %p1, %r31, 16;\n@%p1 bra.uni $L_x;\n$L_x:")
    with pytest.raises(Unsupported, match="does not implement tex.1d"):
        run("tex.1d.v4.s32.s32 {%r1, %r2, %r3, %r4}, [tx, {%r5}];")
    with pytest.raises(EmulationError, match="read before it was written"):
        run("add.u32 %r1, %r9, 1;")


def test_cp_async_lands_at_its_wait():
    body = """
ld.param.u64 %rd1, [out];
mov.u32 %r1, sm;
mad.lo.u32 %r2, %r31, 16, %r1;
mul.wide.u32 %rd3, %r31, 16;
add.s64 %rd2, %rd1, %rd3;
cp.async.cg.shared.global [%r2], [%rd2], 16;
cp.async.commit_group;
{wait}
ld.shared.u32 %r3, [%r2];
"""
    run(body.replace("{wait}", "cp.async.wait_group 0;\nbar.sync 0;"))
    with pytest.raises(EmulationError, match="nothing wrote"):
        run(body.replace("{wait}", ""))  # a missing wait is caught
    run(body.replace("{wait}", "cp.async.wait_group 0;"), seed=3)


def test_mma_sync_s8_against_layout_model():
    from ptxgen import layouts

    rng = np.random.default_rng(0)
    A = rng.integers(-128, 128, (16, 32)).astype(np.int8)
    B = rng.integers(-128, 128, (32, 8)).astype(np.int8)
    la, lb, lc = layouts.mma_a_layout("m16n8k32"), layouts.mma_b_layout("m16n8k32"), layouts.mma_c_layout()
    afrag = A[la[..., 0], la[..., 1]].reshape(32, 4, 4).view(np.uint32).reshape(32, 4)
    bfrag = B[lb[..., 0], lb[..., 1]].reshape(32, 2, 4).view(np.uint32).reshape(32, 2)
    frag = np.concatenate([afrag, bfrag], axis=1)  # [lane, 6 words]
    body = "ld.param.u64 %rd1, [out];\nmul.wide.u32 %rd2, %r31, 24;\nadd.s64 %rd3, %rd1, %rd2;\n"
    body += "\n".join(f"ld.global.u32 %r{i}, [%rd3+{4 * i}];" for i in range(6))
    body += "\nmov.u32 %r10, 0;\nmma.sync.aligned.m16n8k32.row.col.satfinite.s32.s8.s8.s32 {%r11,%r12,%r13,%r14}, {%r0,%r1,%r2,%r3}, {%r4,%r5}, {%r10,%r10,%r10,%r10};"
    ptx = HEADER + "\tmov.u32 %r31, %tid.x;\n" + "\n".join("\t" + x for x in body.splitlines()) + "\n\tret;\n}\n"
    mem = Memory()
    o = mem.alloc(frag)
    emu = Emulator(ptx)
    emu.run((1,), (32,), (o,), mem)
    D = np.zeros((16, 8), np.int64)
    for i in range(4):
        D[lc[:, i, 0], lc[:, i, 1]] = reg(emu, f"%r{11 + i}", "s32")
    np.testing.assert_array_equal(D, A.astype(np.int64) @ B.astype(np.int64))


CASES = [(k, a) for k in KERNELS for a in KERNELS[k].archs]
# builds whose emulation takes seconds, left to the slow tier; the fast tier runs a cheaper build of each family
# (the mma.sync MMQ as n32, the register-A wgmma MMQ as n64 / n16, the tensor-core TQ4_1S GEMV as its m16 build)
SLOW_TO_EMULATE = {
    "mmq_q4_k_f16_n128", "mmq_q4_k_f16_n128_x16", "mmq_q4_k_f16_n64", "mmq_q4_k_f16_n64_x16", "mmq_q4_k_f16_n32_x16",
    "mmq_q4_k_rega_n32", "gemv_tq4_1s_mma", "mmq_q4_k_wgmma_ra_n256_cx", "mmq_q4_k_wgmma_ra_n256_mc2",
    "mmq_q4_k_wgmma_ra_n256", "mmq_q4_k_wgmma_n256", "mmq_q4_k_wgmma_pre_n256_cx", "mmq_q4_k_wgmma_f16a_n256_cx",
    "mmq_q4_k_wgmma_ra_n192",
    "mmq_q4_k_wgmma_ra_n128_cx", "mmq_q4_k_wgmma_ra_n128_mc2", "mmq_q4_k_wgmma_n128", "mmq_q4_k_wgmma_ra_n128",
    "mmq_q4_k_q8_n64", "mmq_q4_k_q8_n64_pre", "mmq_q4_k_q8_n32_pre"} | {
    f"mmq_{f}_wgmma_ra_n{bn}" for f in ("q5_k", "q8_0", "q6_k", "tq4_1s") for bn in (128, 256)} | {  # n64 fast
    f"mmq_{f}_wgmma_ra_n{bn}_cx" for f in ("q5_k", "q8_0") for bn in (64, 128, 256)} | {  # (test_emu_hopper: cx)
    f"mmq_{f}_wgmma_ra_n256_sk" for f in ("q4_k", "q5_k", "q8_0", "q6_k", "tq4_1s")} | {  # stream-K: n128 fast
    "mmq_q4_k_wgmma_ra_n256_cs", "mmq_q6_k_wgmma_ra_n128_cs", "mmq_q6_k_wgmma_ra_n256_cs"} | {  # cluster split: n128
    f"mmq_q6_k_wgmma_ra_n{bn}_g8{cs}" for bn in (128, 256) for cs in ("", "_cs")} | {  # row groups: n64 fast
    "mmq_q6_k_wgmma_ra_n64_g8_moe", "mmq_q6_k_wgmma_ra_n128_g8_moe"} | {  # (their MoE builds: n32 fast)
    f"mmq_{f}_wgmma_ra_n{bn}_moe" for f in ("q4_k", "q5_k", "q8_0", "q6_k") for bn in (64, 128)} | {  # MoE: n32 fast
    f"mmq_{f}_f16_n{bn}{x}" for f in ("q5_k", "q6_k", "q8_0", "tq4_1s") for bn in (32, 64, 128) for x in ("", "_x16")
    if (bn, x) != (32, "")}  # the codecs' mma.sync GEMMs: n32 fast
FAST_CASES = [(k, KERNELS[k].archs[0]) for k in KERNELS if k not in SLOW_TO_EMULATE]


@pytest.mark.parametrize("kernel,arch", FAST_CASES)
def test_each_kernel_once_in_the_emulator(kernel, arch):
    """The fast tier: every kernel family's emitted PTX, one build on one seed, against the reference (the slow
    tier below runs every build on every target, on drawn seeds)."""
    out = check_kernel(kernel, KERNELS[kernel].for_arch(arch).ptx(), seed=1)
    assert out.ok, out.detail


@pytest.mark.parametrize("kernel,k", [("gemv_q6_k_f32_t1", 2304), ("gemv_q5_k_f32_t2", 2304), ("gemv_q6_k_f32_t8", 2304),
                                      ("gemv_q8_0_f32_t1", 1312)])
def test_codec_gemv_whole_steps_then_the_partial_tail(kernel, k):
    """The codec GEMV's K walk (kernels/gemv_codec.py PEEL): the steps whose groups lie inside the row run without
    per-lane predicates, the rest (a partial group: 9 blocks in groups of 2, 41 in groups of 8) predicated as
    before — within 1e-5 of float64 for every token count the build takes."""
    meta = dict(KERNELS[kernel].for_arch("sm_90a").meta, name=kernel)
    ptx = KERNELS[kernel].for_arch("sm_90a").ptx()
    for n in sorted({1, meta["tokens"]}):
        out = gemv_codec_case(ptx, meta, np.random.default_rng(n), shape=(21, k), ntok=n, seed=n)
        assert out.ok, out.detail


@pytest.mark.parametrize("kernel", ["gemv_q4_k_f32_t1", "gemv_q6_k_f32_t1", "gemv_q4_k_f32_t1_x16"] + [
    pytest.param(n, marks=pytest.mark.slow) for n in ("gemv_q5_k_f32_t1", "gemv_q8_0_f32_t1", "gemv_q6_k_f32_t1_x16",
                                                      "gemv_q8_0_f32_t1_x16")])
def test_codec_gemv_k_parts_inside_the_cta(kernel):
    """The one-token codec GEMVs' kparts parameter: the CTA's warps as WARPS / kparts row groups of kparts warps,
    each over a contiguous range of the row's groups, the parts' sums added through shared memory after the CTA
    barrier — within 1e-5 of float64 (unwritten outputs fail), with parts past the row's groups (K = 256: one group)
    and warps past M at the barrier. The CTA's warps run one at a time between waits (warp_serial), so a missing or
    misplaced barrier reads shared memory nothing wrote; kparts 1 branches around the barrier."""
    k = KERNELS[kernel].for_arch("sm_90a")
    ptx = k.ptx()
    assert k.meta["kparts_param"] and k.meta["rows_per_cta"] == 8 * k.meta["rows_per_warp"]
    assert "bar.sync" in ptx and re.search(r"\.param \.u32 \w*kparts\s*\)", ptx)
    alone = re.search(r"setp\.eq\.u32 (%p\d+), %r\d+, 1;\s*@\1 bra(\.uni)? \$L_k_parts_alone\w*;", ptx)
    assert alone and ptx.index(alone.group(0)) < ptx.index("bar.sync"), "kparts 1 must skip the barrier"
    from ptxgen.emu.harness import EmulatorBackend, use_backend

    with use_backend(EmulatorBackend(warp_serial=True)):
        for i, shape in enumerate(((21, 2304), (1, 256))):  # (21 rows: a CTA past M at every kparts)
            for parts in (1, 2, 4, 8):
                out = check_kernel(kernel, ptx, seed=10 * parts + i, shape=shape, ntok=1, kparts=parts)
                assert out.ok, (parts, shape, out.detail)


def test_codec_gemv_k_parts_plan():
    """ops.codec_gemv_k_parts: the most parts (≤ 4 and the row's groups) whose grid stays within the format's
    RULES.codec_gemv_t1_max_ctas (as measured, 256: Q4_K 1024x4096 4 parts, Q6_K 1024x4096 2, 2048x4096 1); a format the
    rule does not list: 1; and mul_mat's plan launches the grid and the parameter it names."""
    from ptxgen import tuning
    from runtime.ops import codec_gemv_k_parts

    meta = lambda n: KERNELS[n].for_arch("sm_90a").meta  # noqa: E731
    q4, q6, q8 = meta("gemv_q4_k_f32_t1"), meta("gemv_q6_k_f32_t1"), meta("gemv_q8_0_f32_t1")
    with tuning.override(codec_gemv_t1_max_ctas={"q4_K": 256, "q6_K": 256}):
        assert [codec_gemv_k_parts(q4, m, 4096) for m in (512, 1024, 2048, 4096)] == [4, 4, 2, 1]
        assert [codec_gemv_k_parts(q6, m, 4096) for m in (512, 1024, 2048, 4096)] == [4, 2, 1, 1]
        assert codec_gemv_k_parts(q4, 512, 256) == 1  # one group a row: nothing to split
    with tuning.override(codec_gemv_t1_max_ctas={"q4_K": 256}):
        assert codec_gemv_k_parts(q8, 512, 4096) == 1


def test_kquant_wide_lanes_convert_by_prmt_to_the_same_bits(monkeypatch):
    """codecs._common.PRMT_CONVERT (the 4/5-bit values to f32 by PRMT under 2^23 and one FADD instead of I2F.U8):
    the GEMV's outputs bit for bit those of the conversion it replaces, within 1e-5 of float64."""
    from ptxgen.codecs import _common

    got, cvts = [], []
    for prmt in (False, True):
        monkeypatch.setattr(_common, "PRMT_CONVERT", prmt)
        k = KERNELS["gemv_q5_k_f32_t2"].for_arch("sm_90a")
        cvts.append(k.ptx().count("cvt.rn.f32.u32"))
        out = gemv_codec_case(k.ptx(), dict(k.meta, name=k.name), np.random.default_rng(7), shape=(21, 2304), ntok=2,
                              seed=7)
        assert out.ok, out.detail
        got.append(out.got)
    assert cvts[1] < cvts[0]
    np.testing.assert_array_equal(got[0].view(np.uint64), got[1].view(np.uint64))


def test_q8_0_lanes_convert_by_i2f_or_prmt_to_the_same_bits(monkeypatch):
    """codecs.q8_0.F32_I2F (how many of a lane's 8 int8 values convert by I2F.S8; the rest by PRMT under 2^23 and one
    FADD): every split gives the same q, so the GEMV's outputs bit for bit, within 1e-5 of float64."""
    from ptxgen.codecs import q8_0

    got = []
    for n in (0, 3, 8):
        monkeypatch.setattr(q8_0, "F32_I2F", n)
        k = KERNELS["gemv_q8_0_f32_t2"].for_arch("sm_90a")
        assert k.ptx().count("cvt.rn.f32.s32") >= n and ("prmt.b32" in k.ptx()) == (n < 8)
        out = gemv_codec_case(k.ptx(), dict(k.meta, name=k.name), np.random.default_rng(3), shape=(21, 544), ntok=2,
                              seed=3)
        assert out.ok, out.detail
        got.append(out.got)
    for g in got[1:]:
        np.testing.assert_array_equal(got[0].view(np.uint64), g.view(np.uint64))


def test_every_kernel_has_a_harness():
    assert set(KERNELS) <= set(HARNESSES) | set(UNCOVERED)


@pytest.mark.slow
@pytest.mark.parametrize("kernel,arch", CASES)
@settings(max_examples=5)
@given(seed=st.integers(0, 2**31 - 1))
def test_emitted_kernels_match_reference_in_emulator(kernel, arch, seed):
    if kernel in UNCOVERED:
        pytest.skip(f"{kernel}: {UNCOVERED[kernel]}")
    ptx = KERNELS[kernel].for_arch(arch).ptx()
    out = check_kernel(kernel, ptx, seed=seed)
    assert out.ok, out.detail
    # the GPU crosscheck (test_gpu_emu_crosscheck) diffs `got` byte for byte against the GPU's: it must be numbers
    assert np.asarray(out.got).dtype != object and np.asarray(out.got).size > 0, f"{kernel}: no output bytes to compare"


def test_a_broken_dequant_sequence_fails_in_the_emulator(monkeypatch):
    """Swap the nibble order in the Q4_K dequant sequence: the emulator must catch it."""
    from ptxgen import dsl
    from ptxgen.ir import Imm

    def swapped(self, b, env):
        w = env[self.word]
        for half, name in enumerate(self.out):
            env[name] = [b.op("bfe.u32", w, Imm(8 * byte + 4 * (1 - half), "u32"), Imm(4, "u32")) for byte in range(4)]

    monkeypatch.setattr(dsl.UnpackNibbles, "lower", swapped)
    ptx = KERNELS["dequantize_q4_k"].for_arch("sm_89").ptx()
    assert not check_kernel("dequantize_q4_k", ptx, seed=1).ok


def test_ldmatrix_and_mma_f16_against_layout_model():
    """ldmatrix.x4 from a row-major 16×16 fp16 tile gives the mma A fragment; mma.sync f16 then equals A·B
    (fp16 products are exact, so the only rounding is the final fp32 one)."""
    from ptxgen import layouts

    rng = np.random.default_rng(1)
    A = rng.integers(-8, 8, (16, 16)).astype(np.float16)
    B = rng.integers(-8, 8, (16, 8)).astype(np.float16)
    lb = layouts.mma_b_layout("m16n8k16")
    bfrag = B[lb[..., 0], lb[..., 1]].reshape(32, 2, 2).view(np.uint32).reshape(32, 2)
    body = """
ld.param.u64 %rd1, [out];
mov.u32 %r20, sm;
mad.lo.u32 %r21, %r31, 16, %r20;
mul.wide.u32 %rd2, %r31, 16;
add.s64 %rd3, %rd1, %rd2;
ld.global.v4.u32 {%r0, %r1, %r2, %r3}, [%rd3];
st.shared.v4.u32 [%r21], {%r0, %r1, %r2, %r3};
bar.sync 0;
and.b32 %r22, %r31, 15;
shr.u32 %r23, %r31, 4;
mad.lo.u32 %r24, %r22, 32, %r20;
mad.lo.u32 %r24, %r23, 16, %r24;
ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r4, %r5, %r6, %r7}, [%r24];
mul.wide.u32 %rd4, %r31, 8;
add.s64 %rd5, %rd1, %rd4;
ld.global.v2.u32 {%r8, %r9}, [%rd5+512];
mov.f32 %f0, 0f00000000;
mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f1,%f2,%f3,%f4}, {%r4,%r5,%r6,%r7}, {%r8,%r9}, {%f0,%f0,%f0,%f0};
"""
    ptx = HEADER + "\tmov.u32 %r31, %tid.x;\n" + "\n".join("\t" + x for x in body.strip().splitlines()) + "\n\tret;\n}\n"
    mem = Memory()
    # 512 bytes of A rows (row r at 32 r: 16 halves), then B fragments
    o = mem.alloc(np.concatenate([A.reshape(-1).view(np.uint8), bfrag.view(np.uint8).reshape(-1)]))
    emu = Emulator(ptx)
    emu.run((1,), (32,), (o,), mem)
    lc = layouts.mma_c_layout()
    D = np.zeros((16, 8), np.float32)
    for i in range(4):
        D[lc[:, i, 0], lc[:, i, 1]] = reg(emu, f"%f{1 + i}", "f32")
    np.testing.assert_array_equal(D, (A.astype(np.float32) @ B.astype(np.float32)))


def test_mma_rounding_matches_the_h200_bit_for_bit():
    """256 mma.sync m16n8k16 recorded on the H200 (bench/probe_mma_rounding.py: random fragments, exponent
    spreads up to 2^30 in the accumulator): the emulator running the probe's PTX gives the same bits. The
    naive model (exact sum, one rounding) disagrees on many of them, so this test can fail."""
    import pathlib
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "bench"))
    from probe_mma_rounding import PTX

    z = np.load(pathlib.Path(__file__).parent / "data" / "mma_h200_probe.npz")
    a, b, c, d = z["a"], z["b"], z["c"], z["d"]
    n = a.shape[0]
    mem = Memory()
    args = [mem.alloc(np.ascontiguousarray(x)) for x in (a, b, c)] + [mem.alloc(d.nbytes, poison=0xFF)]
    Emulator(PTX.replace(".target sm_90", ".target sm_89")).run((n,), (32,), args, mem)
    got = mem.view(args[3], np.uint32, d.shape)
    assert np.array_equal(got, d.view(np.uint32)), f"{np.count_nonzero(got != d.view(np.uint32))} outputs differ"
    from ptxgen import layouts  # the probe really exercises rounding: the naive model misses often

    la, lb, lc = layouts.mma_a_layout("m16n8k16"), layouts.mma_b_layout("m16n8k16"), layouts.mma_c_layout()
    misses = 0
    for i in range(n):
        A, B, C = np.zeros((16, 16)), np.zeros((16, 8)), np.zeros((16, 8))
        A[la[..., 0], la[..., 1]] = a[i]
        B[lb[..., 0], lb[..., 1]] = b[i]
        C[lc[..., 0], lc[..., 1]] = c[i]
        misses += np.count_nonzero((A @ B + C).astype(np.float32)[lc[..., 0], lc[..., 1]] != d[i])
    assert misses > 1000


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["mmq_q4_k_q8_n32", "mmq_q4_k_q8_n64_pre"])
def test_q8_mmq_split_k_and_non_finite_activations(kernel):
    """The int8 MMQ over 3 K-splits, and with a NaN / an Inf in x: the same outputs non-finite as in the
    Q8_1 reference, the rest within 1e-5."""
    ptx = KERNELS[kernel].for_arch("sm_89").ptx()
    for kw in (dict(shape=(129, 20, 1024), splits=3), dict(shape=(130, 9, 512), poison_x=(2, 100, np.nan)),
               dict(shape=(130, 9, 512), poison_x=(4, 7, np.inf))):
        out = check_kernel(kernel, ptx, seed=3, **kw)
        assert out.ok, (kw, out.detail)


def test_q8_mmq_flags_a_q8_1_scale_overflow():
    """|x| > 65504·127 makes amax/127 overflow fp16: the fused kernel raises the flag (the harness checks
    it is raised exactly when the reference quantizer overflows)."""
    out = check_kernel("mmq_q4_k_q8_n32", KERNELS["mmq_q4_k_q8_n32"].for_arch("sm_89").ptx(), seed=2,
                       shape=(130, 9, 512), poison_x=(3, 11, 1e10))
    assert out.ok and "flagged" in out.detail, out.detail


def test_q8_mmq_with_a_wrong_nibble_mask_fails():
    """The A fragments are the raw qs bytes masked to nibbles: a mask that drops one bit must be caught."""
    ptx = KERNELS["mmq_q4_k_q8_n32"].for_arch("sm_89").ptx()
    assert "0xF0F0F0F;" in ptx
    out = check_kernel("mmq_q4_k_q8_n32", ptx.replace("0xF0F0F0F;", "0xF0F0F0E;"), seed=0)
    assert not out.ok, out.detail


def test_quantize_q8_1_mmq_flags_a_scale_overflow():
    out = check_kernel("quantize_q8_1_mmq", KERNELS["quantize_q8_1_mmq"].for_arch("sm_89").ptx(), seed=1, big=True)
    assert out.ok, out.detail


@pytest.mark.parametrize("kernel,shape,splits", [("mmq_q6_k_wgmma_ra_n64", (131, 69, 2048), 5),
                                                 ("mmq_q6_k_wgmma_ra_n64", (259, 40, 2048), 3),
                                                 ("mmq_q6_k_wgmma_ra_n32_moe", None, 1),
                                                 ("mmq_q8_0_wgmma_ra_n64", (131, 69, 2048), 5),
                                                 ("mmq_q8_0_wgmma_ra_n64", (259, 40, 2048), 3),
                                                 ("mmq_q8_0_wgmma_ra_n32_moe", None, 1)])
def test_codec_block_box_with_items_starting_mid_block(kernel, shape, splits):
    """Q6_K's and Q8_0's register-A builds keep one box a block in A slots for its 4 K-steps (the codecs'
    RA_BOX_STEPS; Q8_0's 272-byte box through a u32 map): split-K items that start and end mid-block (32 steps in 5
    or 3 splits), CTAs taking turns, and the grouped build stay within the fp16 GEMMs' bar of the float64
    reference."""
    kw = dict(shape=shape, splits=splits, ctas=3, interleave=True) if shape else {}
    k = KERNELS[kernel].for_arch("sm_90a")
    ptx = k.ptx()
    assert "a_ring" in k.manifest(ptx)["meta"]
    out = check_kernel(kernel, ptx, seed=4, **kw)
    assert out.ok, out.detail


@pytest.mark.parametrize("kernel,kw", [("mmq_q5_k_wgmma_ra_n64", dict(shape=(131, 69, 1536), splits=5, ctas=3)),
                                       ("mmq_q4_k_wgmma_ra_n64", dict(shape=(259, 40, 1536), splits=3, ctas=2)),
                                       ("mmq_q5_k_wgmma_ra_n32_moe", {}), ("mmq_q4_k_wgmma_ra_n64_moe", {})])
def test_nibble_codecs_block_box_gives_the_step_layouts_bits(monkeypatch, kernel, kw):
    """mmq.NIBBLE_BLOCK_BOX: Q4_K's / Q5_K's register-A builds with a block's rows in an A slot (one TMA box, rows
    ROW_BOX_PITCH bytes apart; Q4_K's box reads 16 bytes of the next block, zero past the row end) for its 4 K-steps
    (split items starting and ending mid-block, CTAs taking turns) give y bit for bit as the builds that load 3 / 5
    16-byte columns a step. (The −m_lo MMA needs the block box, so it is off on both sides: the decode's
    roundings are the same.)"""
    from ptxgen.kernels import mmq

    monkeypatch.setattr(mmq, "RA_MIN_LO_MMA", False)
    kw = dict(kw, interleave=bool(kw))
    got = {}
    for boxed in (False, True):
        for fmt in ("q4_K", "q5_K"):
            monkeypatch.setitem(mmq.NIBBLE_BLOCK_BOX, fmt, ("dense", "grouped") if boxed else ())
        k = KERNELS[kernel].for_arch("sm_90a")
        ptx = k.ptx()
        assert ("a_ring" in k.manifest(ptx)["meta"]) == boxed
        out = check_kernel(kernel, ptx, seed=9, **kw)
        assert out.ok, out.detail
        got[boxed] = np.asarray(out.got)
    assert np.array_equal(got[False].view(np.uint8), got[True].view(np.uint8))


@pytest.mark.parametrize("fmt", ["q5_k", "q6_k", "q8_0", "tq4_1s"])
@pytest.mark.parametrize("variant,arch", [("", "sm_89"), ("_x16", "sm_120a")])
def test_codec_mma_sync_mmq_split_tail_and_fp16_overflow(fmt, variant, arch):
    """The fp16 mma.sync MMQ on another codec's blocks (decoded by its run8 straight from global memory, no raw
    ring; kernels/mmq.py F16_CODECS), on fp32 x (sm_89) and on convert_f16's x (sm_120a: the same cp.async
    build): two whole tiles then a tail split in three, three CTAs taking turns, within 1e-3 of the float64
    reference with the counters back at zero; a value past fp16 in x raises the overflow flag (the codec's fixup
    then recomputes that token). TQ4_1S: on the rotated x (its planted value spreads over the block's 32 rotated
    values, ÷√32: past fp16 there only from ~3.7e5)."""
    name = f"mmq_{fmt}_f16_n32{variant}"
    ptx = KERNELS[name].for_arch(arch).ptx()
    out = check_kernel(name, ptx, seed=4, shape=(129, 40, 1024), whole=2, splits=3, per=6, ctas=3, interleave=True,
                       run_seed=2)
    assert out.ok, out.detail
    out = check_kernel(name, ptx, seed=5, shape=(130, 9, 512), poison_x=(3, 100, 8e5 if fmt == "tq4_1s" else 7e4))
    assert out.ok and "flagged" in out.detail, out.detail


@pytest.mark.parametrize("kernel,shape,plan", [
    ("mmq_q4_k_f16_n32", (129, 40, 1024), dict(splits=3)),  # every tile split, evenly (6, 6, 4 K-steps)
    ("mmq_q4_k_f16_n32", (129, 40, 1024), dict(whole=2, splits=3, per=6)),  # two whole tiles, then the tail split
    ("mmq_q4_k_f16_n32", (129, 40, 1024), dict(whole=3, splits=2, per=12)),  # uneven: 12 + 4 K-steps
    ("mmq_q4_k_f16_n32", (129, 40, 1280), dict(whole=1, splits=5, per=4)),  # five splits
    ("mmq_q4_k_f16_n128", (130, 131, 512), dict(whole=1, splits=2, per=5))])
@pytest.mark.parametrize("arch", ["sm_89", "sm_120a"])
@pytest.mark.slow
def test_mmq_whole_tiles_then_split_tail(kernel, shape, plan, arch):
    """The fp16 mma.sync MMQ's queue: whole tiles first, then the rest split in K (partials in fragment order, the
    last CTA of a tile sums them in z order around its own, counters back to zero). Correct, and bit-identical
    whichever CTA arrives last at a tile (one CTA; three taking turns in a drawn order); on sm_120a through its TMA
    ring, which runs on across a CTA's items."""
    ptx = KERNELS[kernel].for_arch(arch).ptx()
    outs = [check_kernel(kernel, ptx, seed=4, shape=shape, ctas=ctas, interleave=ctas > 1, run_seed=2, **plan)
            for ctas in (1, 3)]
    assert all(o.ok for o in outs), [o.detail for o in outs]
    assert np.array_equal(outs[0].got, outs[1].got)


@pytest.mark.parametrize("kernel", ["mmq_q4_k_f16_n32", "mmq_q4_k_f16_n32_x16"])
def test_mmq_tma_ring_on_sm_120a_gives_the_cp_async_builds_bits(kernel):
    """sm_120a's fp16 mma.sync MMQ brings its raw weight tiles (and the x16 build its fp16 activations) by TMA into
    an mbarrier ring whose position and phases run on across a CTA's items: three CTAs taking turns over a whole
    tile (12 K-steps) and split items of 5, 5 and 2 K-steps (the ring wraps inside items; a split shorter than the
    ring leaves stages unissued) give the bits of the sm_89 cp.async build, and its tile counters back at zero."""
    plan = dict(seed=4, shape=(129, 40, 768), whole=1, splits=3, per=5, ctas=3, interleave=True, run_seed=2)
    ref = check_kernel(kernel, KERNELS[kernel].for_arch("sm_89").ptx(), **plan)
    out = check_kernel(kernel, KERNELS[kernel].for_arch("sm_120a").ptx(), **plan)
    assert ref.ok and out.ok, (ref.detail, out.detail)
    assert np.array_equal(ref.got, out.got)


def test_mmq_split_tail_last_arrival_waits_for_the_others_partials(monkeypatch):
    """A split tile's last CTA counts in before the others may have stored and published their partials; it
    then polls the counter until they have. Sixteen CTAs taking turns meet that case in some run seeds' orders
    (the poll runs more than once per tile); which seeds do depends on the kernel's instruction count, so the
    test takes the first of a few that does. The result is correct and bit-identical to one CTA's, whose last
    arrivals find every partial published at the first poll."""
    from ptxgen.emu import machine

    polls = []
    op_ld = machine.Emulator._op_ld

    def counting_ld(self, ins, ex, grp):
        polls.append(ins.opcode.startswith("ld.acquire.gpu"))  # the split counter's poll
        return op_ld(self, ins, ex, grp)

    monkeypatch.setattr(machine.Emulator, "_op_ld", counting_ld)
    ptx = KERNELS["mmq_q4_k_f16_n32"].for_arch("sm_89").ptx()
    plan = dict(seed=4, shape=(129, 40, 512), whole=0, splits=4, per=2)  # 4 tiles, every one split
    one = check_kernel("mmq_q4_k_f16_n32", ptx, ctas=1, **plan)
    assert one.ok and sum(polls) == 4, (one.detail, sum(polls))
    for run_seed in range(3, 11):
        polls.clear()
        many = check_kernel("mmq_q4_k_f16_n32", ptx, ctas=16, interleave=True, run_seed=run_seed, spread=False, **plan)
        assert many.ok and np.array_equal(one.got, many.got), (run_seed, many.detail)
        if sum(polls) > 4:
            break
    assert sum(polls) > 4, "no run seed of 3-10 had a last arrival poll before the others published"


@pytest.mark.parametrize("kernel,shape,plan,ctas", [
    ("mmq_q4_k_f16_n32", (129, 40, 512), dict(whole=0, splits=4, per=2), 16),  # 4 tiles x 4 splits: one each
    ("mmq_q4_k_f16_n32", (129, 40, 1024), dict(whole=1, splits=3, per=6), 12),  # 3 split tiles: 6, 6, 4 K-steps
    ("mmq_q4_k_f16_n64_x16", (250, 70, 512), dict(whole=2, splits=2, per=5), 6),
    ("mmq_q4_k_f16_n128", (130, 131, 512), dict(whole=1, splits=2, per=5), 7)])
@pytest.mark.parametrize("arch", ["sm_89", "sm_120a"])
@pytest.mark.slow
def test_mmq_spread_fixup_sums_each_splits_rows_with_the_last_ctas_bits(kernel, shape, plan, ctas, arch, monkeypatch):
    """The spread split fixup (every split item holds a CTA): each split stores the rows the others own, waits
    until all have counted in, sums its own rows (i % splits == z) in z order and stores only those. Correct,
    counters back at zero, and bit-identical to the last CTA summing everything (one CTA, no spread) whatever
    the order the CTAs take turns in; every CTA polls at least once."""
    from ptxgen.emu import machine

    polls = []
    op_ld = machine.Emulator._op_ld

    def counting_ld(self, ins, ex, grp):
        polls.append(ins.opcode.startswith("ld.acquire.gpu"))  # the split counter's poll
        return op_ld(self, ins, ex, grp)

    ptx = KERNELS[kernel].for_arch(arch).ptx()
    one = check_kernel(kernel, ptx, seed=4, shape=shape, ctas=1, spread=False, **plan)
    assert one.ok, one.detail
    monkeypatch.setattr(machine.Emulator, "_op_ld", counting_ld)
    for run_seed in (2, 5):
        polls.clear()
        many = check_kernel(kernel, ptx, seed=4, shape=shape, ctas=ctas, interleave=True, run_seed=run_seed,
                            spread=True, **plan)
        assert many.ok, many.detail
        assert np.array_equal(one.got, many.got)
        tiles = -(-shape[0] // 128) * -(-shape[1] // KERNELS[kernel].for_arch("sm_89").meta["bn"])
        assert sum(polls) >= (tiles - plan["whole"]) * plan["splits"]


def _cta_barrier_kernels():
    """(kernel, arch) of every emulator-covered kernel without wgmma whose build has a CTA barrier (bar.sync): the
    ones whose warps share shared memory; where that build copies by cp.async and the sm_120a one by TMA (another
    pipeline), the sm_120a build too."""
    out = []
    for name in HARNESSES:
        if "wgmma" in name or name not in KERNELS:
            continue
        arch = "sm_89" if "sm_89" in KERNELS[name].archs else KERNELS[name].archs[0]
        ptx = KERNELS[name].for_arch(arch).ptx()
        if "bar.sync" in ptx:
            out.append((name, arch))
            tma_on_120a = "sm_120a" in KERNELS[name].archs and "cp.async.bulk.tensor" in KERNELS[name].for_arch(
                "sm_120a").ptx()
            if tma_on_120a and "cp.async.bulk.tensor" not in ptx:
                out.append((name, "sm_120a"))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("kernel,arch", _cta_barrier_kernels())
def test_cta_barrier_kernels_pass_with_warps_run_one_at_a_time(kernel, arch):
    """With the emulator running a CTA's warps one at a time between waits (warp_serial), a missing bar.sync
    shows up as a read of shared memory nothing wrote yet (or stale data); every kernel with CTA barriers passes
    its harness that way too."""
    from ptxgen.emu.harness import EmulatorBackend, use_backend

    with use_backend(EmulatorBackend(warp_serial=True)):
        out = check_kernel(kernel, KERNELS[kernel].for_arch(arch).ptx(), seed=3)
    assert out.ok, out.detail


@pytest.mark.slow
def test_warp_serial_emulation_finds_a_missing_barrier():
    """The skinny GEMM without its per-step bar.sync passes the default (lockstep) emulation — which is why the
    warp-serial mode exists — and fails warp-serial (records read before other warps' copies landed)."""
    from ptxgen.emu.harness import EmulatorBackend, use_backend

    ptx = KERNELS["mmq_q4_k_rega_n32"].for_arch("sm_90a").ptx()
    bad = ptx.replace("bar.sync 0;", "// (barrier removed)")
    assert bad != ptx
    kw = dict(seed=1, shape=(140, 1280), ntok=40, splits=2)
    assert check_kernel("mmq_q4_k_rega_n32", bad, **kw).ok  # lockstep warps hide it
    with use_backend(EmulatorBackend(warp_serial=True)):
        assert check_kernel("mmq_q4_k_rega_n32", ptx, **kw).ok
        with pytest.raises(EmulationError, match="nothing wrote"):
            check_kernel("mmq_q4_k_rega_n32", bad, **kw)


@pytest.mark.slow
@pytest.mark.parametrize("kernel,splits", [("mmq_q4_k_f16_n32", 1), ("mmq_q4_k_f16_n32", 2), ("mmq_q4_k_q8_n16", 1)])
def test_mmq_item_raster_covers_every_item_once(monkeypatch, kernel, splits):
    """The mma.sync MMQs' item raster (bands of token tiles, the last band partial): built with RASTER_BYTES
    small enough for bands of 2 token tiles at K = 512, 7 token tiles, 3 M tiles — every output written once and
    right (NaN-poisoned y), with and without K splits."""
    from ptxgen.kernels import mmq

    bn = int(kernel.split("_n")[1])
    plain = KERNELS[kernel].for_arch("sm_89").ptx()
    monkeypatch.setattr(mmq, "RASTER_BYTES", 2 * 4 * bn * 512)
    ptx = KERNELS[kernel].for_arch("sm_89").ptx()
    assert ptx != plain  # the band size is in the code
    t = 7 * bn - 3
    out = check_kernel(kernel, ptx, seed=6, shape=(300, t, 512), **({"splits": splits} if splits > 1 else {}))
    assert out.ok, out.detail


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["gemv_tq4_1s_tma_t1", "gemv_tq4_1s_tma_t2", "gemv_tq4_1s_tma_t8"])
def test_tma_gemv_ring_wraps_splits_and_zero_fills(kernel):
    """The TMA-fed TQ4_1S GEMV over more steps than its ring has stages (6 full steps and a 4-block tail per
    row, the tail and the rows past M zero-filled by TMA), whole and in 2 and 3 K-splits (the tail step
    after an even and an odd number of full steps: T = 1 alternates two activation register sets), with M
    not a multiple of a warp's rows."""
    ptx = KERNELS[kernel].for_arch("sm_90a").ptx()
    for splits in (1, 2, 3):
        out = check_kernel(kernel, ptx, seed=5 + splits, shape=(41, 32 * 32 * 6 + 128), splits=splits)
        assert out.ok, (splits, out.detail)


@pytest.mark.slow
@pytest.mark.parametrize("tokens", [1, 2])
def test_tma_gemv_pair_table_gives_the_16_entry_tables_bits(tokens):
    """The T ≤ 2 TMA GEMVs look codebook values up two at a time (one LDS.64 per qs byte from the pair table, 16
    copies): same FFMA order, so the same bits as the 16-entry-table build of the same CTA shape, whole and in 3
    K-splits, over a ring that wraps and a zero-filled tail; a pair table with 8 entries wrong (of 256) fails the
    1e-5 bar."""
    from ptxgen.arch import get_arch
    from ptxgen.formats import tq4_1s as T4
    from ptxgen.kernels import gemv

    name, arch = f"gemv_tq4_1s_tma_t{tokens}", get_arch("sm_90a")
    copies, warps, stages, ctas = gemv.TMA_PAIRS[tokens]
    ptx = KERNELS[name].for_arch("sm_90a").ptx()
    assert "ld.shared.v2.f32" in ptx
    with pytest.MonkeyPatch.context() as mp:  # the 16-entry-table build with the pair build's CTA shape
        mp.setattr(gemv, "TMA_WARPS", warps)
        mp.setattr(gemv, "TMA_STAGES", stages)
        mp.setitem(gemv.TMA_MIN_CTAS, tokens, ctas)
        lut_ptx = gemv.build_tma_lanes(arch, tokens).ptx()
    assert "ld.shared.v2.f32" not in lut_ptx
    for splits in (1, 3):
        kw = dict(seed=11 + splits, shape=(37, 32 * 32 * 3 + 128), splits=splits)
        a, b = check_kernel(name, ptx, **kw), check_kernel(name, lut_ptx, **kw)
        assert a.ok and b.ok, (a.detail, b.detail)
        assert np.array_equal(a.got.view(np.uint64), b.got.view(np.uint64))
    # mutation: the first store of C[5] as a pair's high value (bytes 0x50-0x57, every copy) writes C[6]
    c5, c6 = (f"0f{np.float32(v).view(np.uint32):08X}" for v in T4.CODEBOOK[5:7])
    assert c5 in ptx
    bad = ptx.replace(c5, c6, 1)
    out = check_kernel(name, bad, seed=12, shape=(37, 1024), splits=1)
    assert not out.ok and "relative error" in out.detail


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["gemv_tq4_1s_mma", "gemv_tq4_1s_mma_m16"])
def test_tensor_core_tq4_1s_gemv_tokens_splits_and_non_finite(kernel):
    """gemv_tq4_1s_mma (32-row warps, 4-block steps) and gemv_tq4_1s_mma_m16 (16-row warps, 8-block steps), fp16
    hi/lo split on mma.sync: 1, 5 and 8 tokens, several steps with a short last one (the B-tile prefetch
    predicated off past the end), 1-3 K-splits, rows past M, within 1e-5 of the float64 reference; an inf or
    a NaN in x gives the same non-finite outputs as the reference."""
    ptx = KERNELS[kernel].for_arch("sm_90a").ptx()
    for kw in (dict(shape=(70, 32 * 16 * 4 + 128), splits=1, ntok=8), dict(shape=(150, 32 * 16 * 4 + 128), splits=3, ntok=5),
               dict(shape=(33, 1024), ntok=1, splits=2)):
        out = check_kernel(kernel, ptx, seed=3, **kw)
        assert out.ok, (kw, out.detail)
    for bad in (np.inf, np.nan):
        out = check_kernel(kernel, ptx, seed=4, shape=(40, 512), ntok=3, splits=1, poison_x=(1, 77, bad))
        assert out.ok, (bad, out.detail)


@pytest.mark.slow
@pytest.mark.parametrize("small", [False, True])
def test_tensor_core_gemv_pair_table_gives_the_element_tables_bits(monkeypatch, small):
    """gemv_tq4_1s_mma{,_m16} read both elements' A words of a qs byte in one LDS.64 from the pair table
    (gemv.MMA_PAIRS): the same MMAs on the same operands as the per-element (hi, lo) table and two prmt per byte,
    so the same bits at the same CTA shape (8 tokens, 2 K-splits; 5 tokens, 3 splits)."""
    from ptxgen.arch import get_arch
    from ptxgen.kernels import gemv

    copies, warps, stages, ctas = gemv.MMA_PAIRS
    name = "gemv_tq4_1s_mma_m16" if small else "gemv_tq4_1s_mma"
    ptx = KERNELS[name].for_arch("sm_90a").ptx()
    assert "ld.shared.v2.u32" in ptx
    monkeypatch.setattr(gemv, "MMA_WARPS", warps)
    monkeypatch.setattr(gemv, "MMA_STAGES", stages)
    monkeypatch.setattr(gemv, "MMA_CTAS", ctas)
    elem_ptx = gemv.build_mma_gemv(get_arch("sm_90a"), small, pairs=None).ptx()
    assert "ld.shared.v2.u32" not in elem_ptx
    for kw in (dict(shape=(70, 32 * 16 * 4 + 128), splits=2, ntok=8), dict(shape=(150, 1024), splits=3, ntok=5)):
        a, b = check_kernel(name, ptx, seed=9, **kw), check_kernel(name, elem_ptx, seed=9, **kw)
        assert a.ok and b.ok, (kw, a.detail, b.detail)
        assert np.array_equal(a.got.view(np.uint64), b.got.view(np.uint64)), kw


def test_tensor_core_gemv_without_the_lo_term_fails(monkeypatch):
    """Mutation: dropping A_lo·B_hi (codebook in fp16 only, ~2^-11) must fail the 1e-5 bar."""
    from ptxgen import ir
    from ptxgen.arch import get_arch
    from ptxgen.kernels import gemv

    real = ir.mma_sync
    calls = []

    def every_third_dropped(*args, **kw):
        calls.append(1)
        ins = real(*args, **kw)
        if len(calls) % 3 == 0:  # the A_lo x B_hi product of each half block (D is C): a no-op instead
            c = ins.operands[3].regs[0]
            return ir.Instr("mov.b32", (c, c))
        return ins

    monkeypatch.setattr(gemv, "mma_sync", every_third_dropped)
    ptx = gemv.build_mma_gemv(get_arch("sm_90a")).ptx()
    out = check_kernel("gemv_tq4_1s_mma", ptx, seed=3, shape=(40, 1024), ntok=4, splits=1)
    assert not out.ok and "relative error" in out.detail


def test_tma_box_starting_off_a_16_byte_boundary_is_an_error(monkeypatch):
    """6-block steps (boxes 120 bytes apart in the row) stopped the H200 with an illegal instruction: the
    emulator must reject a TMA box whose innermost coordinate is not 16-byte aligned, not run it."""
    from ptxgen.arch import get_arch
    from ptxgen.emu.machine import EmulationError
    from ptxgen.kernels import gemv

    monkeypatch.setattr(gemv, "MMA_STEP", 6)
    monkeypatch.setattr(gemv, "MMA_ROW_WORDS", 36)
    monkeypatch.setattr(gemv, "MMA_SETS", 3)
    ptx = gemv.build_mma_gemv(get_arch("sm_90a")).ptx()
    with pytest.raises(EmulationError, match="16-byte aligned"):
        check_kernel("gemv_tq4_1s_mma", ptx, seed=3, shape=(40, 1024), ntok=2, splits=1)


def test_prep_mma_f16_is_bit_exact_to_the_numpy_model():
    """prep_mma_f16 (the Q4_K tensor-core GEMV's activation): tiles, factors and min-term fragments bit for bit
    against to_mma_tiles(x, Q4K_GROUP) and mma_min_fragments of the unrotated x, with a zero, a tiny and a huge
    block and a quiet super-block."""
    ptx = KERNELS["prep_mma_f16"].for_arch("sm_90a").ptx()
    for shape in ((3, 512), (8, 256), (5, 1024)):
        out = check_kernel("prep_mma_f16", ptx, seed=2, shape=shape)
        assert out.ok, (shape, out.detail)


@pytest.mark.parametrize("kernel,tokens,arch", [("gemv_q4_k_mma", (8, 5, 1, 2), "sm_90a"),
                                               ("gemv_q4_k_mma", (8, 5, 1, 2), "sm_89"),
                                               ("gemv_q4_k_mma_n16", (16, 9, 12, 10), "sm_90a"),
                                               ("gemv_q4_k_mma_n16", (16, 9, 12, 10), "sm_89")])
@pytest.mark.slow
def test_q4_k_tensor_core_gemv_tokens_splits_and_non_finite(kernel, tokens, arch):
    """gemv_q4_k_mma (integer nibbles x fp16 hi/lo activation on mma.sync) and its two-group build for 9-16
    tokens: several super-blocks, 1-3 K-splits, M not a multiple of the CTA's rows, within 1e-5 of the float64
    reference; an inf or a NaN in x gives non-finite outputs exactly where the reference has them. sm_89: the
    cp.async lowering (each lane copies 16-byte chunks; rows past M read row M − 1)."""
    ptx = KERNELS[kernel].for_arch(arch).ptx()
    for n, kw in zip(tokens, (dict(shape=(70, 256 * 5), splits=1), dict(shape=(70, 256 * 5), splits=3),
                              dict(shape=(33, 1024), splits=2), dict(shape=(129, 2048), splits=2))):
        out = check_kernel(kernel, ptx, seed=3, ntok=n, **kw)
        assert out.ok, (n, kw, out.detail)
    for bad in (np.inf, np.nan):
        out = check_kernel(kernel, ptx, seed=4, shape=(40, 512), ntok=tokens[1], splits=1, poison_x=(1, 77, bad))
        assert out.ok, (bad, out.detail)


@pytest.mark.parametrize("sfx", ["t1", "t2", "t4", "t8", "t16h", "t32h"])
def test_prep_q4k_records_are_bit_exact_to_the_numpy_model(sfx):
    """prep_q4k_t{1,2,4,8} and prep_q4k_t16h (the few-token Q4_K tensor-core GEMVs' activation; t16h: hi parts
    only): records bit for bit against formats.tq4_1s.q4k_mma_records, with a zero, a tiny, a huge and a quiet
    block and an inf, and with fewer tokens than the build holds (the rest zeros)."""
    nt = int(sfx[1:].rstrip("h"))
    ptx = KERNELS[f"prep_q4k_{sfx}"].for_arch("sm_89").ptx()
    for shape in ((nt, 768), (max(1, nt - 1), 256), (1, 1536)):
        out = check_kernel(f"prep_q4k_{sfx}", ptx, seed=2, shape=shape)
        assert out.ok, (shape, out.detail)


@pytest.mark.parametrize("sfx,arch", [("t1", "sm_90a"), ("t1", "sm_89"), ("t1", "sm_120a"), ("t2", "sm_90a"),
                                      ("t2", "sm_89"), ("t4", "sm_90a"), ("t4", "sm_120a"), ("t8", "sm_90a"),
                                      ("t8", "sm_89"), ("t16h", "sm_90a"), ("t16h", "sm_120a")])
@pytest.mark.slow
def test_q4_k_few_token_tensor_core_gemv(sfx, arch):
    """gemv_q4_k_mma_t{1,2,4,8} (token n's hi and lo in B columns 2n, 2n + 1; t8: two n8 tiles; a lane's qs chunk
    of two rows; cp.async ring) and gemv_q4_k_mma_t16h (token n's fp16 hi in column n): one to several
    super-blocks, 1-3 K-splits, M not a multiple of the CTA's 64 rows, 1 to nt tokens, activations of every scale,
    within 1e-5 (t16h: 1e-3) of the float64 reference (outputs NaN-poisoned first); an inf or a NaN in the last
    token's x gives non-finite outputs exactly where the reference has them (that token's only). sm_89 / sm_120a:
    fewer ring stages."""
    nt = int(sfx[1:].rstrip("h"))
    _few_token_cases(f"gemv_q4_k_mma_{sfx}", arch, nt)


# Q6_K's few-token builds: rows a multiple of 4 bytes (an even number of 210-byte super-blocks), m·row_bytes of 16
# — rows of 420, 840, 1260 and 1680 bytes: every 4-byte phase of a row's start, both 2-byte phases of its steps
_Q6_FEW_CASES = (dict(shape=(72, 1536), splits=1), dict(shape=(36, 1024), splits=3), dict(shape=(129, 2048), splits=2),
                 dict(shape=(8, 512), splits=1))


def _few_token_cases(name, arch, nt, cases=None):
    """A few-token GEMV build's emulator cases (its PTX for `arch`): one to several super-blocks, 1-3 K-splits, M
    not a multiple of the CTA's rows, 1 to nt tokens (or `cases`); an inf and a NaN in the last token. Returns the
    PTX."""
    ptx = KERNELS[name].for_arch(arch).ptx()
    for i, kw in enumerate(cases or (dict(shape=(70, 256 * 5), splits=1), dict(shape=(70, 256 * 5), splits=3),
                                     dict(shape=(33, 1024), splits=2), dict(shape=(129, 2048), splits=2),
                                     dict(shape=(5, 256), splits=1))):
        out = check_kernel(name, ptx, seed=3 + i, ntok=max(1, nt - i % 2), **kw)
        assert out.ok, (kw, out.detail)
    for bad in (np.inf, np.nan):
        out = check_kernel(name, ptx, seed=4, shape=(40, 512), ntok=nt, splits=1, poison_x=(nt - 1, 77, bad))
        assert out.ok, (bad, out.detail)
    return ptx


@pytest.mark.parametrize("name,arch", [("permute_f16", "sm_90a"), ("convert_f32", "sm_89"), ("convert_f32", "sm_90a"),
                                       ("copy_f16", "sm_90a"), ("copy_f16", "sm_120a")])
def test_fp16_activation_kernels_are_bit_exact(name, arch):
    """permute_f16 (an fp16 x into the register-A wgmma GEMM's K order: the bytes convert_f16_perm writes for the
    same values), copy_f16 (as it is, where a natural-order fp16 GEMM's tensor map points) and convert_f32 (fp16 →
    fp32 for the kernels that read fp32 x): bit for bit, with an inf and a NaN
    among values of every scale, one to several 64-column chunks and rows."""
    ptx = KERNELS[name].for_arch(arch).ptx()
    for i, shape in enumerate(((1, 64), (3, 256), (5, 512))):
        out = check_kernel(name, ptx, seed=i, shape=shape)
        assert out.ok, (shape, out.detail)


@pytest.mark.parametrize("order,nt", [(o, nt) for o in ("sub16", "rot16") for nt in (1, 2, 4, 8)] + [("sub16", "16h")])
def test_prep_sub16_records_are_bit_exact_to_the_numpy_model(nt, order):
    """prep_sub16_t{1,2,4,8} (the Q6_K / Q8_0 few-token GEMVs' activation: prep_q4k_t*'s record in the codecs'
    16-element sub-block order), prep_sub16_t16h (their 9-16-token builds': the hi parts alone, one column a token)
    and prep_rot16_t* (TQ4_1S's: the same of the rotated x, scaled from the unrotated super-block's max): bit for
    bit against q4k_mma_records(·, order=...), with a zero, a tiny, a huge and a quiet block and an inf, and with
    fewer tokens than the build holds."""
    name = f"prep_{order}_t{nt}"
    nt = int(str(nt).rstrip("h"))
    ptx = KERNELS[name].for_arch("sm_89").ptx()
    for shape in ((nt, 768), (max(1, nt - 1), 256)):
        out = check_kernel(name, ptx, seed=2, shape=shape)
        assert out.ok, (shape, out.detail)


@pytest.mark.parametrize("fmt", ["q4k", "q6k"])
@pytest.mark.parametrize("nt", [1, 2, 4, 8])
def test_prep_int8_records_are_bit_exact_to_the_numpy_model(nt, fmt):
    """prep_q4k_i8_t{1,2,4,8} (the int8 few-token GEMVs' activation: three int8 digit planes of x·2^s·2^7, the exact
    record's min pairs and factors) and prep_q6k_i8_t* (the same planes, then each sub-block's digit sums): the
    planes byte for byte, the rest bit for bit, against q4k_i8_records / q6k_i8_records — a zero, a tiny, a huge and
    a quiet block, a block past 2^115 (its min pairs / sums +inf: digits cannot hold it) and an inf, fewer tokens
    than the build holds."""
    name = f"prep_{fmt}_i8_t{nt}"
    ptx = KERNELS[name].for_arch("sm_89").ptx()
    for shape in ((nt, 768), (max(1, nt - 1), 256)):
        out = check_kernel(name, ptx, seed=2, shape=shape)
        assert out.ok, (shape, out.detail)


_X16_PREPS = ([pytest.param(p, 1, "sm_90a") for p in ("q4k", "sub16", "q4k_i8", "q6k_i8")] +
              [pytest.param(p, nt, a, marks=pytest.mark.slow) for p in ("q4k", "sub16", "q4k_i8", "q6k_i8")
               for nt, a in ((2, "sm_89"), (4, "sm_120a"), (8, "sm_90a"))] +
              [pytest.param("q4k_hi", 16, "sm_90a"), pytest.param("q4k_hi", 32, "sm_89", marks=pytest.mark.slow),
               pytest.param("sub16_hi", 16, "sm_120a")])


@pytest.mark.parametrize("prep,nt,arch", _X16_PREPS)
def test_prep_records_from_fp16_x_are_the_fp32_builds_bits(prep, nt, arch):
    """prep_<...>_x16 (the few-token records read from fp16 x, each value widened as it is loaded: no convert_f32
    launch before them; the hi-only ones of 16 and 32 tokens too): bit for bit the records of the same values in fp32
    — zeros, fp16 subnormals, infs where fp16 overflows, fewer tokens than the build holds."""
    name = f"prep_{prep}_t{nt}_x16"
    if prep.endswith("_hi"):  # the hi-only ones (9-16 tokens, the skinny GEMMs' groups of 32)
        name = f"prep_{prep[:-3]}_t{nt}h_x16"
    ptx = KERNELS[name].for_arch(arch).ptx()
    assert "ld.global.nc.b16" in ptx and "ld.global.nc.f32" not in ptx
    for shape in ((nt, 768), (max(1, nt - 1), 256)):
        out = check_kernel(name, ptx, seed=3, shape=shape)
        assert out.ok, (shape, out.detail)


@pytest.mark.parametrize("fmt,arch", [("q4_k", "sm_90a"), ("q5_k", "sm_89"), ("q6_k", "sm_90a"), ("q8_0", "sm_120a")])
def test_one_token_codec_gemv_on_fp16_x(fmt, arch):
    """gemv_<fmt>_f32_t1_x16 (the one-token codec GEMV of small weights on fp16 x, each value widened as it is
    loaded: no convert_f32 launch before it): within 1e-5 of float64 on the fp16 values, a partial last CTA and (Q8_0)
    a partial last step included."""
    name = f"gemv_{fmt}_f32_t1_x16"
    ptx = KERNELS[name].for_arch(arch).ptx()
    assert "b16" in ptx and "ld.global.nc.v4.f32" not in ptx
    for seed in (3, 4):
        out = check_kernel(name, ptx, seed=seed)
        assert out.ok, out.detail


_I8 = ([pytest.param(f, 1, "sm_90a") for f in ("q4_K", "q5_K", "q6_K", "q8_0")] +
       [pytest.param(f, nt, a, marks=pytest.mark.slow) for f in ("q4_K", "q5_K", "q6_K", "q8_0") for nt, a in
        ((2, "sm_90a"), (4, "sm_90a"), (8, "sm_90a"), (1, "sm_89"), (2, "sm_120a"))])


@pytest.mark.parametrize("fmt,nt,arch", _I8)
def test_int8_few_token_gemv(fmt, nt, arch):
    """gemv_q4_k_i8_t* / gemv_q5_k_i8_t* / gemv_q6_k_i8_t* / gemv_q8_0_i8_t* (the weights as the A of u8 x s8 MMAs —
    Q8_0's int8 quants of s8 x s8 ones as they lie —, the activation's digit planes as B, the scales on the integer
    sums — Q8_0's fp16 block scales in fp32 a block —; Q6_K's −32 as an MMA of its scales on the sub-block digit sums,
    its 210-byte steps at both 2-byte phases): random raw blocks of every bit pattern, several super-blocks, 1-3 K splits, a
    random kparts and CTA width, 1 to nt tokens, within 1e-5 of float64 (outputs NaN-poisoned first); an inf or a
    NaN in the last token's x gives non-finite outputs exactly where the reference has them, and so does a value
    past 2^115 (which the digits cannot hold: the fp16 builds give inf there too) while the other tokens stay
    finite; the one-launch build (1-4 tokens) writes its prep's records bit for bit."""
    name = f"gemv_{fmt.lower()}_i8_t{nt}"
    ptx = _few_token_cases(name, arch, nt, _Q6_FEW_CASES if fmt == "q6_K" else None)
    out = check_kernel(name, ptx, seed=4, shape=(40, 512), ntok=nt, splits=1, poison_x=(nt - 1, 77, 1e35))
    got = np.asarray(out.got)
    assert not np.isfinite(got[nt - 1]).any() and np.isfinite(got[:nt - 1]).all()
    if nt <= 4:
        fused = f"{name}_fused"
        out = check_kernel(fused, KERNELS[fused].for_arch(arch).ptx(), seed=9, shape=(72, 1536), ntok=nt, splits=2)
        assert out.ok, out.detail


# (format, tokens, arch): the one-token builds in the default tier, the others (and sm_89's lowering) slow
_CODEC_FEW = ([pytest.param(f, 1, "sm_90a") for f in ("q6_K", "q8_0", "tq4_1s")] +
              [pytest.param(f, nt, a, marks=pytest.mark.slow) for f in ("q6_K", "q8_0", "tq4_1s") for nt, a in
               ((2, "sm_90a"), (4, "sm_90a"), (8, "sm_90a"), (1, "sm_89"), (4, "sm_120a"))])


@pytest.mark.parametrize("fmt,nt,arch", _CODEC_FEW)
def test_mma_block_codec_few_token_gemv(fmt, nt, arch):
    """gemv_q6_k_mma_t* / gemv_q8_0_mma_t* (gemv_t1's builds on the codec's mma_block: one MMA per 16-element
    sub-block — Q8_0's two of a block chained —, the scale in fp32 after it, on prep_sub16_t*'s records) and
    gemv_tq4_1s_mma_t* (the codebook's hi and lo parts as the MMA's two row halves, from a pair table in shared
    memory filled by the first 4 warps, on prep_rot16_t*'s records): random raw blocks of every bit pattern; Q6_K's 210-byte steps copied from the 16 bytes below them (rows of 420, 840, 1260
    and 1680 bytes: every 4-byte phase of a row's start, both 2-byte phases of its steps); 1-3 K splits, a random
    kparts and CTA width, 1 to nt tokens; within 1e-5 of the float64 reference (outputs NaN-poisoned first), and
    an inf or a NaN in x gives non-finite outputs exactly where the reference has them."""
    name = f"gemv_{fmt.lower()}_mma_t{nt}"
    _few_token_cases(name, arch, nt, _Q6_FEW_CASES)
    if nt <= 4 and fmt != "tq4_1s":  # the one-launch build (none for TQ4_1S): its CTAs write prep_sub16's records
        # bit for bit, then the same GEMV
        fused = f"{name}_fused"
        out = check_kernel(fused, KERNELS[fused].for_arch(arch).ptx(), seed=9, shape=(72, 1536), ntok=nt, splits=2)
        assert out.ok, out.detail


@pytest.mark.parametrize("fmt,arch", [("q6_K", "sm_90a"), ("q8_0", "sm_90a"),
                                      pytest.param("q6_K", "sm_89", marks=pytest.mark.slow),
                                      pytest.param("q6_K", "sm_120a", marks=pytest.mark.slow)])
def test_mma_block_codec_sixteen_token_gemv(fmt, arch):
    """gemv_q6_k_mma_t16h / gemv_q8_0_mma_t16h (9-16 tokens on fp16 activations, as gemv_q4_k_mma_t16h: token n's hi
    part alone in B column n, on prep_sub16_t16h's records; the codec's one MMA per 16-element sub-block, its scale
    in fp32): random raw blocks, Q6_K's steps at both 2-byte phases, 1-3 K splits, 15 and 16 tokens; within 1e-3 of
    the float64 reference (the fp16-activation bar; outputs NaN-poisoned first), an inf or a NaN in the last token's x
    non-finite exactly where the reference is."""
    _few_token_cases(f"gemv_{fmt.lower()}_mma_t16h", arch, 16, _Q6_FEW_CASES)


@pytest.mark.parametrize("fmt,nt,arch", [("q5_K", 1, "sm_90a"), ("q6_K", 1, "sm_90a"),
                                         pytest.param("q5_K", 8, "sm_89", marks=pytest.mark.slow),
                                         pytest.param("q6_K", 8, "sm_120a", marks=pytest.mark.slow),
                                         pytest.param("q6_K", 4, "sm_90a", marks=pytest.mark.slow)])
def test_int8_lane_gemv_of_q5_k_and_q6_k(fmt, nt, arch):
    """gemv_q5_k_fast_t* / gemv_q6_k_fast_t* (mode="fast": the codec's GgmlLane on Q8_1 activations, dp4a): full
    steps of 32 units and a tail (36 / 40 units a row), rows past the last CTA's, 1-3 K splits, 1 to nt tokens;
    Q6_K's rows of 5 and 2 even numbers of 210-byte blocks (both 2-byte phases of a block, the last block's d read
    from inside it). Within 1e-5 of the float64 product with the Q8_1-rounded activations (outputs NaN-poisoned)."""
    name = f"gemv_{fmt.lower()}_fast_t{nt}"
    ptx = KERNELS[name].for_arch(arch).ptx()
    k = 2304 if fmt == "q5_K" else 2560
    for i, kw in enumerate((dict(shape=(37, k), splits=2), dict(shape=(9, 1024), splits=3),
                            dict(shape=(70, 512), splits=1))):
        out = check_kernel(name, ptx, seed=11 + i, ntok=max(1, nt - i), **kw)
        assert out.ok, (kw, out.detail)


@pytest.mark.slow
@pytest.mark.parametrize("c,arch", [(32, "sm_90a"), (32, "sm_89"), (16, "sm_90a")])
def test_register_a_skinny_gemm(c, arch):
    """mmq_q4_k_rega_n32 / _n16 (token groups of 32 / 16 over gridDim.z, the records' ring shared by the CTA's
    warps, one CTA barrier per step): one and two token groups (the second partial), 1-3 K-splits, M not a multiple
    of the CTA's 128 rows, within 1e-3 of the float64 reference (outputs NaN-poisoned first); an inf or a NaN in
    the last token's x gives non-finite outputs exactly where the reference has them. sm_89: 2 stages, 1 CTA per
    SM; n16: 2 stages, 3 CTAs per SM."""
    name = f"mmq_q4_k_rega_n{c}"
    ptx = KERNELS[name].for_arch(arch).ptx()
    for i, (n, shape, splits) in enumerate(((5, (140, 1280), 2), (c, (70, 512), 1), (c + 13, (300, 768), 3),
                                            (2 * c, (129, 256), 1))):
        out = check_kernel(name, ptx, seed=20 + i, ntok=n, shape=shape, splits=splits)
        assert out.ok, (n, shape, splits, out.detail)
    for bad in (np.inf, np.nan):
        out = check_kernel(name, ptx, seed=4, shape=(40, 512), ntok=c + 5, splits=2, poison_x=(c + 4, 77, bad))
        assert out.ok, (bad, out.detail)


def test_q4_k_few_token_gemv_sums_a_row_tiles_k_parts_in_the_cta():
    """gemv_q4_k_mma_t1's kparts (the warps of a row tile, each a contiguous part of its K range, summed in the CTA
    in warp order): every kparts from 1 to the CTA's warps, CTAs of 8 and of 4 warps (the launch's choice), with and
    without grid K splits, more parts than super-blocks (empty parts), M not a multiple of the tile — within 1e-5
    of float64, counters back at zero."""
    k = KERNELS["gemv_q4_k_mma_t1"].for_arch("sm_90a")
    assert "k_parts" in k.meta and k.meta["warps"] == 8 and k.meta["block_warps"] == [4, 8]
    for i, (kp, nw, shape, splits) in enumerate(((1, 8, (40, 768), 1), (2, 8, (70, 2304), 2), (4, 4, (33, 1024), 1),
                                                 (8, 8, (21, 1280), 2), (8, 8, (9, 512), 1), (1, 4, (70, 512), 2),
                                                 (2, 4, (150, 1024), 1))):
        out = check_kernel("gemv_q4_k_mma_t1", k.ptx(), seed=40 + i, shape=shape, splits=splits, ntok=1, kparts=kp,
                           warps=nw)
        assert out.ok, (kp, nw, shape, splits, out.detail)


@pytest.mark.parametrize("name, attr, nt", [("gemv_q4_k_mma_t1", "T1_HOLD", 1), ("gemv_q5_k_mma_t1", "T1_HOLD", 1),
                                            ("gemv_q4_k_i8_t2", "T1_HOLD", 2), ("gemv_q5_k_i8_t2", "T1_HOLD", 2),
                                            ("gemv_q4_k_mma_t1_fused", "FUSED_HOLD", 1)])
def test_q4_k_one_token_gemv_holds_its_last_ring_stage_until_the_wait(monkeypatch, name, attr, nt):
    """gemv_t1.T1_HOLD (shipped {1: 1, 2: 1}; FUSED_HOLD, the fused build's, empty until its GPU tests run with it):
    the 1- and 2-token GEMVs copy the weights of all but their last ring stage before griddepcontrol.wait, the last
    stage's with the records after it — the same y bit for bit as with every stage before the wait, with kparts and
    grid K splits. Two-token builds of 2 stages (T1_HOLD_MIN_STAGES: Q6_K's, Q8_0's) copy every stage before it."""
    from ptxgen import codecs
    from ptxgen.kernels import gemv_t1

    heads = []
    for hold in (0, 1):  # a 2-stage two-token build: the same copies before the wait held or not
        monkeypatch.setattr(gemv_t1, "T1_HOLD", {1: 1, 2: hold})
        two = KERNELS["gemv_q6_k_i8_t2"].for_arch("sm_90a")
        assert two.meta["stages"] < gemv_t1.T1_HOLD_MIN_STAGES[2]
        heads.append(two.ptx().split("griddepcontrol.wait")[0].count("cp.async"))
    assert heads[0] == heads[1] > 0
    S = KERNELS[name].for_arch("sm_90a").meta["stages"]
    outs = []
    for hold in (0, 1):
        monkeypatch.setattr(gemv_t1, attr, {nt: hold})
        ptx = KERNELS[name].for_arch("sm_90a").ptx()
        head = ptx.split("griddepcontrol.wait")[0]
        block = codecs.get(KERNELS[name].for_arch("sm_90a").meta["fmt"]).BLOCK_BYTES  # a super-block's bytes
        per_step = -(-16 * (block // 16) // 32)  # copy instructions a step: 16 rows' 16-byte chunks, 32 an instruction
        assert head.count("cp.async.cg.shared.global") == per_step * (S - hold) and "cp.async.ca" not in head
        got = []
        for i, (kp, shape, splits) in enumerate(((2, (70, 2304), 2), (8, (40, 1536), 1))):
            out = check_kernel(name, ptx, seed=80 + i, shape=shape, splits=splits, ntok=nt, kparts=kp, warps=8)
            assert out.ok, (hold, kp, out.detail)
            got.append(np.asarray(out.got).view(np.uint32))
        outs.append(got)
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("gemv,prep", [("gemv_q4_k_mma_t1", "prep_q4k_t1"), ("gemv_q8_0_mma_t2", "prep_sub16_t2")])
def test_few_token_builds_hand_the_records_over_by_a_count(monkeypatch, gemv, prep):
    """gemv_t1.T1_FLAG (a probe's build, never shipped): the prep adds 1 per CTA to a zero-kept word once its
    records are stored (red.release after a CTA barrier) — the harness checks the count equals its CTAs —, and
    triggers its dependents only after its own wait; the GEMV, without griddepcontrol.wait, spins until k/256 x
    tokens of them (acquire), then its last CTA past the wait zeroes both words; the same bits as the shipped
    build, both words back at zero."""
    from ptxgen.kernels import gemv_t1

    shipped = check_kernel(gemv, KERNELS[gemv].for_arch("sm_90a").ptx(), seed=5, shape=(72, 1536), splits=2)
    monkeypatch.setattr(gemv_t1, "T1_FLAG", True)
    k = KERNELS[gemv].for_arch("sm_90a")
    assert "ready_flag" in k.meta and "griddepcontrol.wait" not in k.ptx()
    flagged = check_kernel(gemv, k.ptx(), seed=5, shape=(72, 1536), splits=2)
    assert shipped.ok and flagged.ok, (shipped.detail, flagged.detail)
    assert np.array_equal(shipped.got.view(np.uint64), flagged.got.view(np.uint64))
    p = KERNELS[prep].for_arch("sm_90a")
    # the word is every op's: the prep lets the GEMV behind it launch (and spin) only once the op before completed
    assert "ready_flag" in p.meta and p.ptx().index("griddepcontrol.wait") < p.ptx().index("launch_dependents")
    assert "ready_flag" not in KERNELS[prep].for_arch("sm_89").meta  # no PDL there: the GEMV's wait is its launch
    for shape in ((1, 768), (int(prep[-1]), 1536)):
        out = check_kernel(prep, p.ptx(), seed=2, shape=shape)
        assert out.ok, (shape, out.detail)


@pytest.mark.parametrize("name", ["gemv_q4_k_mma_t1", "gemv_q8_0_mma_t1"])
def test_one_token_gemv_trace_build_records_every_cta(monkeypatch, name):
    """gemv_t1.TRACE (bench/probe_decode_trace.py's diagnostic build, never shipped): lane 0 of each CTA's first
    warp overwrites its tile's first 9 y words with (SM, entry, prologue done, first step landed, K loop done,
    stores done, its first record's 3 padding words), read back by the probe's own parser — one record a CTA whose
    tile has 9 rows in y, its times in that order, nothing out of bounds; the shipped build has no trace. The
    K-quants' step and the mma_block codecs' (_CodecStep) alike."""
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "bench"))
    from probe_decode_trace import op_records
    from ptxgen.kernels import gemv_t1

    assert "globaltimer" not in KERNELS[name].for_arch("sm_90a").ptx()
    monkeypatch.setattr(gemv_t1, "TRACE", True)
    ptx = KERNELS[name].for_arch("sm_90a").ptx()
    for m, ctas in ((64, 4), (72, 4)):  # 16 rows a CTA (8 warps, kparts 8); a last tile of < 9 rows writes none
        out = check_kernel(name, ptx, seed=7, shape=(m, 2048), splits=1, ntok=1, kparts=8, warps=8)
        assert "out-of-bounds" not in out.detail, out.detail
        rec = op_records(np.asarray(out.got, np.float64).astype(np.float32).ravel().view(np.uint32))
        assert len(rec) == ctas
        assert (np.diff(rec[:, 1:6], axis=1) >= 0).all() and (rec[:, 5] > rec[:, 1]).all()
        assert not rec[:, 6:].any()  # the harness's records: zero padding (no prep trace)


@pytest.mark.parametrize("name", ["prep_q4k_t1", "prep_sub16_t1"])
def test_prep_trace_build_stamps_the_record_padding(monkeypatch, name):
    """gemv.PREP_TRACE (never shipped): prep_q4k_t1 (and prep_sub16_t1) writes (entry, wait released, stores
    issued) of each CTA into its super-block's record padding, in that order, and every other record byte as the
    shipped build."""
    from ptxgen.kernels import gemv

    outs = []
    for trace in (False, True):
        monkeypatch.setattr(gemv, "PREP_TRACE", trace)
        ptx = KERNELS[name].for_arch("sm_90a").ptx()
        assert ("globaltimer" in ptx) == trace
        out = check_kernel(name, ptx, seed=3)
        assert out.ok or trace, out.detail
        outs.append(np.asarray(out.got, np.uint8).reshape(-1, 1072))
    np.testing.assert_array_equal(outs[0][:, :1060], outs[1][:, :1060])
    assert not outs[0][:, 1060:].any()
    stamps = outs[1][:, 1060:].copy().view(np.uint32)
    assert (stamps > 0).all() and (np.diff(stamps.astype(np.int64), axis=1) >= 0).all()


@pytest.mark.parametrize("name", ["gemv_q6_k_mma_tma", "gemv_q8_0_mma"])
def test_codec_tensor_core_gemv_sums_a_row_tiles_k_parts_in_the_cta(name):
    """The codecs' tensor-core GEMV with kparts 1-4 (interleaved K steps per part, summed in the CTA), with and
    without grid K splits, more parts than steps: within 1e-5 of float64, counters back at zero."""
    k = KERNELS[name].for_arch("sm_90a")
    assert "k_parts" in k.meta
    for i, (kp, shape, splits) in enumerate(((1, (40, 2048), 2), (2, (24, 4096), 2), (4, (33, 2048), 1),
                                             (4, (16, 2048 * 3), 3))):
        out = check_kernel(name, k.ptx(), seed=60 + i, shape=shape, splits=splits, kparts=kp)
        assert out.ok, (kp, shape, splits, out.detail)


@pytest.mark.parametrize("mutation", ["no_lo_column", "no_min_pairs", "no_factor"])
def test_q4_k_one_token_gemv_mutations_fail(monkeypatch, mutation):
    """The one-token GEMV's harness is not blind: records without the lo halves (x in fp16 only), without the
    min pairs (the dmin·Σ m·Σx term) or with the factor 2^-s read as 1 must fail the 1e-5 bar."""
    from ptxgen.emu import harness

    real = harness.T4.q4k_mma_records

    def mutated(a, nt, hi_only=False, order="q4k"):
        rec = real(a, nt, hi_only, order).reshape(-1, harness.T4.q4k_record_bytes(1)).copy()
        if mutation == "no_lo_column":  # bytes 128·i + 64 .. 128·i + 127: lanes 4-7 (column 1)
            rec[:, :1024].reshape(-1, 8, 2, 64)[:, :, 1] = 0
        elif mutation == "no_min_pairs":
            rec[:, 1024:1056] = 0
        else:
            rec[:, 1056:1060] = np.frombuffer(np.float32(1.0).tobytes(), np.uint8)
        return rec.reshape(-1)
    monkeypatch.setattr(harness.T4, "q4k_mma_records", mutated)
    ptx = KERNELS["gemv_q4_k_mma_t1"].for_arch("sm_90a").ptx()
    out = check_kernel("gemv_q4_k_mma_t1", ptx, seed=3, shape=(40, 1024), splits=1, ntok=1)
    assert not out.ok and "relative error" in out.detail, out.detail


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_90a", "sm_89"])
def test_q4_k_register_activation_gemv(arch):
    """gemv_q4_k_xr (T = 1, x held in registers, nibbles → 2 + q/8 by prmt): K with idle lanes (20 and 36 units of
    64 weights) and a full warp (32 units), rows per CTA from 1 to more than the block has threads, the last CTA
    partial, activations of every scale; within 1e-5 of the float64 reference; an inf or a NaN in x gives
    non-finite outputs exactly where the reference has them."""
    ptx = KERNELS["gemv_q4_k_xr"].for_arch(arch).ptx()
    for i, (shape, rpc) in enumerate((((45, 1280), 4), ((37, 2304), 1), ((70, 2048), 33), ((9, 256), 64), ((130, 512), 7))):
        out = check_kernel("gemv_q4_k_xr", ptx, seed=10 + i, shape=shape, rows_per_cta=rpc)
        assert out.ok, (shape, rpc, out.detail)
    for bad in (np.inf, np.nan):
        out = check_kernel("gemv_q4_k_xr", ptx, seed=4, shape=(20, 768), rows_per_cta=6, poison_x=(77, bad))
        assert out.ok, (bad, out.detail)


def test_q4_k_register_activation_gemv_catches_a_wrong_min_term():
    """The harness is not blind to the min term: without the − dmin·m·Σx part the check fails."""
    ptx = KERNELS["gemv_q4_k_xr"].for_arch("sm_90a").ptx()
    bad = re.sub(r"neg\.f32", "mov.f32", ptx)  # the min term's sign flips: − dmin·m·X becomes + dmin·m·X
    assert bad != ptx
    assert not check_kernel("gemv_q4_k_xr", bad, seed=2, shape=(20, 512), rows_per_cta=5).ok


@pytest.mark.parametrize("mutation", ["no_lo_product", "no_min_term"])
def test_q4_k_tensor_core_gemv_mutations_fail(monkeypatch, mutation):
    """Dropping the activation's lo half (fp16 x only, ~2^-11) or the min-term fragments (the dmin·Σ m·Σx term)
    must fail the 1e-5 bar."""
    from ptxgen.arch import get_arch
    from ptxgen.emu import harness
    from ptxgen.kernels import gemv

    if mutation == "no_lo_product":  # the tiles' lo halves (slots 4-7 of each lane's 8) zero: x in fp16 only
        real = harness.T4.to_mma_tiles

        def hi_only(a, group=1):
            tiles, factors = real(a, group)
            tiles.view(np.float16).reshape(-1, 8)[:, 4:] = 0
            return tiles, factors
        monkeypatch.setattr(harness.T4, "to_mma_tiles", hi_only)
    else:  # the min-term fragments read as zeros: a kernel that ignored them would pass
        monkeypatch.setattr(harness.T4, "mma_min_fragments", lambda a: np.zeros(a.shape[1], np.uint8))
    ptx = gemv.build_q4k_mma_gemv(get_arch("sm_90a")).ptx()
    out = check_kernel("gemv_q4_k_mma", ptx, seed=3, shape=(40, 1024), ntok=4, splits=1)
    assert not out.ok and "relative error" in out.detail, out.detail


@pytest.mark.parametrize("kernel,value,splits", [("mmq_q4_k_f16_n32", 1e6, 1), ("mmq_q4_k_f16_n128", -7e4, 1),
                                                 ("mmq_q4_k_f16_n64", np.nan, 2), ("mmq_q4_k_f16_n32", np.inf, 3),
                                                 ("mmq_q4_k_f16_n128", 6e4, 2)])
@pytest.mark.parametrize("arch", ["sm_89", "sm_120a"])
@pytest.mark.slow
def test_fp16_mmq_flags_activations_that_are_not_finite_in_fp16(kernel, value, splits, arch):
    """The fp16 mma.sync MMQ watches its results, not each converted activation: one x value past fp16's range
    (or inf/NaN) makes the item's sums non-finite and raises the flag (mul_mat then recomputes exactly), also
    when it falls into one K-split of several; 6e4 fits fp16: no flag, the result within the bar."""
    ptx = KERNELS[kernel].for_arch(arch).ptx()
    out = check_kernel(kernel, ptx, seed=6, shape=(131, 40, 768), splits=splits, poison_x=(7, 300, value))
    assert out.ok, out.detail
    assert ("flagged" in out.detail) == (abs(value) > 65504 or not np.isfinite(value)), out.detail


@pytest.mark.parametrize("fmt", ["q6_k", "q8_0"])
@pytest.mark.parametrize("ntok,shape,splits,tma", [(1, (136, 512), 1, False), (8, (72, 1536), 3, False),
                                                   (13, (40, 1024), 2, False), (1, (72, 2048), 2, True),
                                                   (5, (40, 4096), 3, True)])
def test_codec_tensor_core_gemv(fmt, ntok, shape, splits, tma):
    """gemv_<fmt>_mma (the codec's integer weights x fp16 hi/lo activation on mma.sync, kernels/gemv_mma_codec.py)
    on random blocks: within 1e-5 of the float64 reference, at 1, 8 and 13 tokens (the two-group build
    gemv_<fmt>_mma_n16), 1-3 K splits (Q6_K's steps at both 2-byte phases: K/256 even, odd steps at phase 2);
    the TMA build (gemv_<fmt>_mma_tma: rows a multiple of 16 bytes, K / 256 a multiple of 8 for Q6_K) with M
    not a multiple of its 64 rows (the box's rows past M zero-filled) and Q6_K's steps at 16-byte phases 0-14."""
    name = f"gemv_{fmt}_mma" + ("_n16" if ntok > 8 else "") + ("_tma" if tma else "")
    ptx = KERNELS[name].for_arch("sm_90a").ptx()
    out = check_kernel(name, ptx, seed=3, shape=shape, ntok=ntok, splits=splits)
    assert out.ok, out.detail


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["q6_k", "q8_0"])
def test_codec_tensor_core_gemv_shapes_and_non_finite(fmt):
    """gemv_<fmt>_mma with M not a multiple of the CTA's 64 rows (and below 16), T = 2-5, 1-2 K splits; an inf or a
    NaN in x gives non-finite outputs exactly where the reference has them."""
    ptx = KERNELS[f"gemv_{fmt}_mma"].for_arch("sm_90a").ptx()
    for n, kw in ((2, dict(shape=(40, 1024), splits=2)), (3, dict(shape=(8, 1024), splits=1)),
                  (5, dict(shape=(200, 2048), splits=2))):
        out = check_kernel(f"gemv_{fmt}_mma", ptx, seed=3, ntok=n, **kw)
        assert out.ok, (n, kw, out.detail)
    for bad in (np.inf, np.nan):
        out = check_kernel(f"gemv_{fmt}_mma", ptx, seed=4, shape=(40, 512), ntok=3, splits=1, poison_x=(1, 77, bad))
        assert out.ok, (bad, out.detail)


@pytest.mark.parametrize("arch", ["sm_89", "sm_90a", "sm_120a"])
@pytest.mark.parametrize("mode", range(8))
def test_rotate_f16_is_rotate_then_convert_in_one_launch(arch, mode):
    """rotate_tq4_1s_f16 (mul_mat's TQ4_1S prefill: in place of convert_f32, rotate_tq4_1s and convert_f16(_perm)):
    for every mode (fp16 or fp32 x; the fp16 copy in x's or the register-A K order, or none) the fp32 output is
    rotate_tq4_1s's bits, the fp16 copy convert_f16's / convert_f16_perm's, and the flag rises exactly where a
    rotated value leaves fp16 (a block whose rotation is 7e4 at one place, from an x that fits fp16) or a rotated
    block is too small for it (a token scaled by 1e-6; a token of zeros beside it raises nothing)."""
    ptx = KERNELS["rotate_tq4_1s_f16"].for_arch(arch).ptx()
    for overflow, tiny in ((False, False), (True, False), (False, True)):
        out = check_kernel("rotate_tq4_1s_f16", ptx, seed=mode, mode=mode, overflow=overflow, tiny=tiny,
                           shape=(5, 256))
        assert out.ok, (overflow, tiny, out)
        assert ("flag 1" in out.detail) == (overflow or tiny) or mode & 4, out.detail


@pytest.mark.parametrize("permuted", [False, True])
def test_convert_f16_flags_a_token_too_small_for_fp16(permuted):
    """The flag behind the fp16 GEMMs rises for a token whose row lies under fp16's precision (kernels/convert_f16.py
    too_small: a group of 8 under 2^-11, not all zero), so the fixup recomputes it exactly — and not for rows of
    zeros, of O(1) values, or of values small yet past 2^-11."""
    import numpy as np

    from ptxgen.emu.harness import fp16_flag

    name = "convert_f16_perm" if permuted else "convert_f16"
    ptx = KERNELS[name].for_arch("sm_90a").ptx()
    rng = np.random.default_rng(7)
    base = rng.standard_normal((4, 256)).astype(np.float32)
    base[1] = 0
    base[2] = np.sign(base[2]) * (2.0 ** -10 + np.abs(base[2]) * 1e-3)  # small, yet every value past 2^-11
    for scale, flagged in ((None, False), (1e-6, True), (2.0 ** -13, True), (1e-30, True)):
        x = base.copy()
        if scale is not None:
            x[3] *= np.float32(scale)
        out = check_kernel(name, ptx, x=x)
        assert out.ok, out.detail
        assert fp16_flag(x, 8) == flagged, scale


@pytest.mark.parametrize("name,splits", [("mmq_q6_k_f16_n32", 1), ("mmq_q8_0_f16_n64", 2), ("mmq_q5_k_f16_n32", 2),
                                         ("mmq_q4_k_f16_n64", 1)])
def test_the_fp16_mma_sync_gemm_on_fp16_x_gives_the_converting_builds_bits(name, splits):
    """mul_mat hands an fp16 x to the fp16 mma.sync GEMM's _x16 build at every size (ops._x16_shipped), and an fp32
    x to the build converting x inside below mmq_x16_min_work: on the same fp16 values (the harness draws the same
    x; the converting build rounds it, the _x16 build is handed its fp16) both give the same bits, split or not."""
    import numpy as np

    ptx_a, ptx_b = (KERNELS[n].for_arch("sm_89").ptx() for n in (name, name + "_x16"))
    a = check_kernel(name, ptx_a, seed=3, shape=(200, 40, 512), splits=splits)
    b = check_kernel(name + "_x16", ptx_b, seed=3, shape=(200, 40, 512), splits=splits)
    assert a.ok and b.ok, (a.detail, b.detail)
    np.testing.assert_array_equal(np.asarray(a.got, np.float32).view(np.uint32),
                                  np.asarray(b.got, np.float32).view(np.uint32))


@pytest.mark.parametrize("shape,splits", [((1100, 640), 1), ((40, 128), 1), ((1, 128), 2), ((790, 256), 2),
                                          ((70, 384), 7)] + [  # (a build not shipped: its largest cases slow)
    pytest.param(*c, marks=pytest.mark.slow) for c in (((1100, 640), 3), ((1600, 1152), 5))])
def test_product_table_gemv_over_chunks_runs_and_splits(shape, splits):
    """gemv_tq4_1s_xt_t1 (x's products by qs byte from a table the CTA builds per 256 columns) within 1e-5 of
    float64 (~1e-7 in fact) on random weights and x: K runs of whole and partial chunks (640 = 20 blocks: 8, 8, 4),
    splits of uneven runs (a split of no whole chunk, of 1-2 blocks), M past a CTA's 768 rows and not a multiple of
    a warp's 48 (TMA zero-fills the rows past M), M = 1, more ring steps than stages and fewer; NaN-poisoned y, the
    split-K counters left zero (the harness checks both)."""
    ptx = KERNELS["gemv_tq4_1s_xt_t1"].for_arch("sm_90a").ptx()
    out = check_kernel("gemv_tq4_1s_xt_t1", ptx, seed=sum(shape) + splits, shape=shape, splits=splits)
    assert out.ok, out.detail


def test_product_table_gemv_fails_with_one_wrong_codebook_value(monkeypatch):
    """The emulator check of gemv_tq4_1s_xt_t1 can fail: the table built from a codebook with one value off by 1e-3
    misses the 1e-5 bar."""
    from ptxgen.formats import tq4_1s as T4

    book = T4.CODEBOOK.copy()
    book[5] += np.float32(1e-3)
    monkeypatch.setattr(T4, "CODEBOOK", book)
    ptx = KERNELS["gemv_tq4_1s_xt_t1"].for_arch("sm_90a").ptx()
    monkeypatch.undo()
    assert not check_kernel("gemv_tq4_1s_xt_t1", ptx, seed=2, shape=(300, 512)).ok


@pytest.mark.parametrize("kernel", ["mmq_q4_k_wgmma_ra_n32_moe", "mmq_q5_k_wgmma_ra_n64_moe"])
def test_grouped_rega_min_term_mma_of_m_lo(monkeypatch, kernel):
    """mmq.RA_MIN_LO_MMA: the grouped register-A Q4_K / Q5_K builds decode two instructions a weight pair
    (codecs.q4_k.dequant_pair2) and add each block's −m_lo·Σx as one more k16 MMA on moe_gather_sums' Σx tile: the
    harness gathers the sums as the gather writes them (meta min_lo_sums) and y stays within the fp16 GEMMs' bar of
    float64 — closer to it than the shipped decode's (one rounding a weight fewer; without the MMA the pairs alone
    read ~5e-4 here against the shipped ~3.5e-4)."""
    from ptxgen.kernels import mmq

    err = {}
    for on in (False, True):
        monkeypatch.setattr(mmq, "RA_MIN_LO_MMA", on)
        k = KERNELS[kernel].for_arch("sm_90a")
        ptx = k.ptx()
        assert ("min_lo_sums" in k.manifest(ptx)["meta"]) == on
        assert ("tmap_s" in ptx) == on
        out = check_kernel(kernel, ptx, seed=6)
        assert out.ok, (on, out.detail)
        got, want = np.asarray(out.got, np.float64), np.asarray(out.want, np.float64)
        live = np.isfinite(want)
        err[on] = np.abs(got[live] - want[live]).max() / np.abs(want[live]).max()
    assert err[True] < err[False], err
