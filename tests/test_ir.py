"""L0: instructions and DSL objects validate themselves at construction with errors that name the fix."""
import pytest
from hypothesis import given, settings, strategies as st

from ptxgen import ir
from ptxgen.arch import ArchError, get_arch
from ptxgen.builder import KernelBuilder
from ptxgen.dsl import Mma, Pipeline, Schedule, SpecError, Tile
from ptxgen.emitter import render_instr
from ptxgen.ir import Imm, Instr, IRError, Mem, Reg, Vec
from ptxgen.layouts import prmt_selector
from ptxgen.targets import lowering_for

SM89, SM90A, SM120A = (get_arch(a) for a in ("sm_89", "sm_90a", "sm_120a"))


def regs(t, n, p="%r"):
    return Vec(tuple(Reg(f"{p}{i}", t) for i in range(n)))


def test_wgmma_on_sm120a_is_a_clear_error():
    with pytest.raises(ArchError, match=r"sm_120a does not have.*use mma.sync"):
        ir.wgmma(SM120A, 64, "f16", regs("f32", 32, "%f"), Reg("%rd0", "b64"), Reg("%rd1", "b64"))
    with pytest.raises(ArchError, match=r"sm_120a has no wgmma.*Mma\(instr='mma.sync'\)"):
        lowering_for("sm_120a").pick_mma(Mma("f16", "wgmma"))
    assert lowering_for("sm_120a").pick_mma(Mma("f16")) == "mma.sync"
    assert lowering_for("sm_90a").pick_mma(Mma("f16")) == "wgmma"
    i = ir.wgmma(SM90A, 64, "f16", regs("f32", 32, "%f"), Reg("%rd0", "b64"), Reg("%rd1", "b64"))
    assert render_instr(i).strip().startswith("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%f0,")


def test_mma_operand_checks():
    a, b2, c = regs("b32", 4), regs("b32", 2), regs("f32", 4, "%f")
    i = ir.mma_sync(SM89, "m16n8k16", "f16", c, a, b2, c)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in render_instr(i)
    with pytest.raises(IRError, match="B takes 2 registers, got 4"):
        ir.mma_sync(SM89, "m16n8k16", "f16", c, a, a, c)
    with pytest.raises(IRError, match="legal: m16n8k16 f16, m16n8k16 bf16, m16n8k16 s8, m16n8k16 u8, m16n8k32 s8"):
        ir.mma_sync(SM89, "m16n8k8", "f16", c, a, b2, c)
    s = regs("s32", 4, "%s")  # the 8-bit k16 form: 2 A registers, 1 B
    i = ir.mma_sync(SM89, "m16n8k16", "u8", s, regs("b32", 2), regs("b32", 1), s, b_type="s8")
    assert "mma.sync.aligned.m16n8k16.row.col.satfinite.s32.u8.s8.s32" in render_instr(i)
    with pytest.raises(IRError, match="A takes 2 registers, got 4"):
        ir.mma_sync(SM89, "m16n8k16", "s8", s, a, regs("b32", 1), s)
    with pytest.raises(IRError, match="N=12 is not legal"):
        ir.wgmma(SM90A, 12, "f16", regs("f32", 6, "%f"), Reg("%rd0", "b64"), Reg("%rd1", "b64"))


def test_register_widths_and_arity():
    with pytest.raises(IRError, match=r"operand %rd0 is .b64 .* works on .u32"):
        Instr("add.u32", (Reg("%r0", "u32"), Reg("%rd0", "b64"), Imm(1, "u32")))
    with pytest.raises(IRError, match="takes 3 operands, got 2"):
        Instr("add.u32", (Reg("%r0", "u32"), Reg("%r1", "u32")))
    with pytest.raises(IRError, match="unknown opcode"):
        Instr("frobnicate.u32", ())
    with pytest.raises(IRError, match="must be a .pred register"):
        Instr("add.u32", (Reg("%r0", "u32"), Reg("%r1", "u32"), Imm(1, "u32")), pred=Reg("%r2", "u32"))


def test_prmt_sign_bit_trap():
    r = Reg("%r0", "b32")
    with pytest.raises(IRError, match="sign-replicate"):
        Instr("prmt.b32", (r, r, r, Imm(0x3210 | 0x8000, "b32")))
    Instr("prmt.b32", (r, r, r, Imm(prmt_selector(0, 1, 2, 3), "b32")))


def test_arch_gated_copies():
    with pytest.raises(ArchError, match="cp_async_bulk_tensor"):
        KernelBuilder("k", SM89).emit("cp.async.bulk.tensor.2d.shared::cluster.global", Reg("%r0", "u32"))
    with pytest.raises(ArchError, match="cp_async_bulk_tensor"):  # the plain bulk forms are TMA's too (sm_90+)
        KernelBuilder("k", SM89).emit("cp.async.bulk.prefetch.L2.global", Mem(Reg("%rd0", "u64")), Reg("%r0", "u32"))
    with pytest.raises(ArchError, match=r"Pipeline\(copy='tma'\).*cp.async"):
        lowering_for("sm_89").pick_copy(Pipeline(3, "tma"))
    assert lowering_for("sm_89").pick_copy(Pipeline(3)) == "cp.async"
    assert lowering_for("sm_90a").pick_copy(Pipeline(3)) == "tma"
    with pytest.raises(IRError, match="copies 4, 8 or 16 bytes"):
        ir.cp_async(SM89, Mem(Reg("%r0", "u32")), Mem(Reg("%rd0", "u64")), 32)


def test_tile_pipeline_schedule_validation():
    t = Tile(128, 128, 32, warps=8, warp_m=64, warp_n=32)
    assert t.threads == 256
    with pytest.raises(SpecError, match="needs 4 warps, not 8"):
        Tile(128, 128, 32, warps=8, warp_m=64, warp_n=64)
    with pytest.raises(SpecError, match="splits a q4_K scale group of 32 weights"):
        Tile(128, 128, 16, warps=8, warp_m=64, warp_n=32).check_format("q4_K")
    with pytest.raises(SpecError, match="exceeds sm_89's 101376 B"):
        Pipeline(4).check_smem(SM89, 32 * 1024)
    with pytest.raises(SpecError, match="whole warpgroups|multiple of 4"):
        Mma("f16").resolve(SM90A, Tile(64, 32, 32, warps=2, warp_m=32, warp_n=32))
    with pytest.raises(SpecError, match="'grid' or 'persistent'"):
        Schedule("stream-k")


def test_shared_memory_budget():
    b = KernelBuilder("k", SM89)
    with pytest.raises(IRError, match="exceeds sm_89's"):
        b.shared_buffer("big", 200 * 1024)


def test_register_budget_is_checked_at_construction():
    big = Tile(128, 256, 32, warps=4, warp_m=64, warp_n=128)
    with pytest.raises(SpecError, match=r"needs 256 accumulator registers per thread; sm_89 allows 255"):
        Mma("f16").resolve(SM89, big)
    Mma("f16").resolve(SM89, Tile(128, 128, 32, warps=8, warp_m=64, warp_n=32))


def test_dequant_conversion_ops_compile_everywhere_and_compute_right_in_the_emulator():
    """ConvertHalf / ConvertBF16 / PackS8 in a tiny kernel: nvJitLink on every arch, values in the emulator."""
    import numpy as np

    from ptxgen.dsl import ConvertBF16, ConvertHalf, DequantSequence, Epilogue, PackS8
    from ptxgen.emu import Memory, run_kernel
    from ptxgen.runtime.compiler import compile_ptx

    def build(arch):
        b = KernelBuilder("conv_probe", arch, "conversion probe", block=(32, 1, 1))
        out_p = b.param("out", "u64", "ptr:out")
        out = b.ptr(out_p)
        tid = b.special("tid.x")
        ints = [b.op("add.u32", tid, Imm(i, "u32")) for i in range(4)]
        flts = [b.op("cvt.rn.f32.u32", v) for v in ints]
        env = {"i": ints, "f": flts}
        DequantSequence("probe", (ConvertHalf("f", "h"), ConvertBF16("f", "bf"), PackS8("i", "s8", offset=8))).lower(b, env)
        words = env["h"] + env["bf"] + env["s8"]
        base = b.op("mad.wide.u32", tid, Imm(4 * len(words), "u32"), out)
        for i, w in enumerate(words):
            b.emit("st.global.b32", Mem(base, 4 * i), w)
        return b.finish()

    for a in ("sm_89", "sm_90a", "sm_120a"):
        compile_ptx(build(get_arch(a)).ptx(), a, name="conv_probe")
    mem = Memory()
    o = mem.alloc(32 * 5 * 4)
    run_kernel(build(SM89).ptx(), (1,), (32,), (o,), mem)
    got = mem.view(o, np.uint32, (32, 5))
    t = np.arange(32)[:, None] + np.arange(4)[None, :]
    h = t.astype(np.float16).view(np.uint16).astype(np.uint32)
    np.testing.assert_array_equal(got[:, 0], h[:, 0] | (h[:, 1] << 16))
    bf = (t.astype(np.float32).view(np.uint32) >> 16)  # small integers are exact in bf16
    np.testing.assert_array_equal(got[:, 3], bf[:, 2] | (bf[:, 3] << 16))
    s8 = (t - 8).astype(np.int8).view(np.uint8).astype(np.uint32)
    np.testing.assert_array_equal(got[:, 4], s8[:, 0] | s8[:, 1] << 8 | s8[:, 2] << 16 | s8[:, 3] << 24)
    with pytest.raises(SpecError, match="only f32 is lowered"):
        Epilogue("f16")


def test_wgmma_mmq_on_sm120a_is_a_clear_error():
    from ptxgen.kernels.mmq import MmqSpec, build  # (MmqSpec lives in ptxgen.specs)

    with pytest.raises(ArchError, match="sm_120a has no wgmma"):
        build("sm_120a", MmqSpec(128, "wgmma"))
    k = build("sm_90a", MmqSpec(64, "wgmma"))  # the same description lowers on Hopper
    assert k.meta["mma"].startswith("wgmma m64n64k16")


DIVISORS = (1, 2, 3, 4, 5, 6, 7, 9, 10, 64, 192, 641, 1000003, 0x7FFFFFFF, 0x80000001, 0xFFFFFFFF)


def _division_probe(arch):
    """Each thread: a u32 from `inp`, then div and rem by every DIVISORS constant (the builder lowers them
    to shifts / multiply-highs), the in-place form (d == a) included."""
    b = KernelBuilder("div_probe", arch, "division by constants", block=(32, 1, 1))
    out = b.ptr(b.param("out", "u64", "ptr:out"))
    inp = b.ptr(b.param("inp", "u64", "ptr:in"))
    tid = b.special("tid.x")
    a = b.op("ld.global.u32", Mem(b.op("mad.wide.u32", tid, Imm(4, "u32"), inp)))
    base = b.op("mad.wide.u32", tid, Imm(8 * len(DIVISORS), "u32"), out)
    for i, c in enumerate(DIVISORS):
        q = b.op("div.u32", a, Imm(c, "u32"))
        r = b.op("mov.u32", a)
        b.emit("rem.u32", r, r, Imm(c, "u32"))
        b.emit("st.global.v2.u32", Mem(base, 8 * i), Vec((q, r)))
    return b.finish()


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), min_size=32, max_size=32))
def test_division_by_constants_is_exact_for_every_u32(values):
    """div.u32 / rem.u32 by an immediate are emitted without a division (ptxas 13.0 compiles those as a general
    division even for 4), and give floor(a / c) and a mod c for any u32, edge values included."""
    import numpy as np

    from ptxgen.emu import Memory, run_kernel

    edges = [0, 1, 2**32 - 1, 2**32 - 2, 2**31, 2**31 - 1, 191, 192, 193, 0xFFFFFFFF // 7 * 7, 0x7FFFFFFF]
    a = np.array(edges + values[len(edges):], np.uint32)
    k = _division_probe(SM89)
    text = k.ptx()
    assert "div." not in text and "rem." not in text
    mem = Memory()
    o, x = mem.alloc(32 * 8 * len(DIVISORS)), mem.alloc(a)
    run_kernel(text, (1,), (32,), (o, x), mem)
    got = mem.view(o, np.uint32, (32, len(DIVISORS), 2)).astype(np.int64)
    c = np.array(DIVISORS, np.int64)
    np.testing.assert_array_equal(got[:, :, 0], a.astype(np.int64)[:, None] // c)
    np.testing.assert_array_equal(got[:, :, 1], a.astype(np.int64)[:, None] % c)


def test_division_probe_compiles_everywhere():
    from ptxgen.runtime.compiler import compile_ptx

    for arch in ("sm_89", "sm_90a", "sm_120a"):
        compile_ptx(_division_probe(get_arch(arch)).ptx(), arch, name="div_probe")


def _q4k_pair3_probe(arch):
    """Each thread: a Q4_K super-block header (4 words) and a sub-block index from `inp`; for every nibble value q
    (low nibbles: h = 0x6400 | q, high: 0x6400 | 16q with sc' = sc/16; the upper half of h carries 15 − q) the
    intermediate q·sc' = fma(h, sc', −1024·sc') and the weight pair of q4k.dequant_pair3."""
    from ptxgen.codecs import q4_k as q4k

    b = KernelBuilder("pair3_probe", arch, "Q4_K three-op dequant probe", block=(32, 1, 1))
    out = b.ptr(b.param("out", "u64", "ptr:out"))
    inp = b.ptr(b.param("inp", "u64", "ptr:in"))
    tid = b.special("tid.x")
    src = b.op("mad.wide.u32", tid, Imm(20, "u32"), inp)
    hdr = [b.op("ld.global.u32", Mem(src, 4 * i)) for i in range(4)]
    sub = b.op("ld.global.u32", Mem(src, 16))
    base = b.op("mad.wide.u32", tid, Imm(16 * 2 * 2 * 4, "u32"), out)
    neg1024 = b.op("mov.b32", Imm(q4k.NEG_1024_F16X2, "b32"))
    for high in (0, 1):
        sc, m_hi, m_lo, d = q4k.scale_ints(b, hdr, sub, b.op("mov.f32", Imm(1 / 16 if high else 1.0, "f32")))
        c = b.op("mul.rn.f16x2", sc, neg1024, type="b32")
        for q in range(16):
            lo, hi = (q, 15 - q) if not high else (16 * q, 16 * (15 - q))
            h = b.op("mov.b32", Imm((0x6400 | lo) | (0x6400 | hi) << 16, "b32"))
            qs = b.op("fma.rn.f16x2", h, sc, c, type="b32")
            w = q4k.dequant_pair3(b, h, (sc, c, d, m_hi, m_lo))
            b.emit("st.global.v2.b32", Mem(base, 8 * (16 * high + q)), Vec((qs, w)))
    return b.finish()


def test_q4k_three_op_dequant_forms_q_sc_exactly_and_rounds_as_documented():
    """q4k.dequant_pair3 (every fp16 MMQ's dequant): q·sc' by one fma is exact for every
    nibble, scale and half (low nibbles as q with sc' = sc, high ones as 16q with sc/16); the weight is then
    fp16(fp16(q·sc·d − m_hi) − m_lo) with m = fp32(dmin·m) split into fp16 hi + lo, bit for bit, on random
    headers of every sub-block; and the probe compiles for every target."""
    import numpy as np

    from ptxgen.emu import Memory, run_kernel
    from ptxgen.formats import ggml
    from ptxgen.runtime.compiler import compile_ptx

    rng = np.random.default_rng(7)
    hdr = rng.integers(0, 256, (32, 16), dtype=np.uint8)
    hdr[:, 0:4] = np.frombuffer(rng.uniform(1e-4, 0.05, (32, 2)).astype(np.float16).tobytes(), np.uint8).reshape(32, 4)
    sub = np.arange(32, dtype=np.uint32) % 8
    inp = np.concatenate([hdr.view(np.uint32), sub[:, None]], axis=1).astype(np.uint32)
    mem = Memory()
    o, x = mem.alloc(32 * 16 * 2 * 2 * 4), mem.alloc(inp)
    run_kernel(_q4k_pair3_probe(SM89).ptx(), (1,), (32,), (o, x), mem)
    got = mem.view(o, np.uint32, (32, 2, 16, 2))
    halves = np.stack([got & 0xFFFF, got >> 16], axis=-1).astype(np.uint16).view(np.float16).astype(np.float64)
    d = hdr[:, 0:2].copy().view(np.float16)[:, 0].astype(np.float64)
    dmin = hdr[:, 2:4].copy().view(np.float16)[:, 0].astype(np.float32)
    sc, m = ggml.unpack_scale_min_k4(hdr[:, 4:16])
    sc, m = sc[np.arange(32), sub].astype(np.float64), m[np.arange(32), sub].astype(np.float32)
    m1 = -(dmin * m).astype(np.float64)
    m_hi = m1.astype(np.float16).astype(np.float64)
    m_lo = (m1 - m_hi).astype(np.float16).astype(np.float64)
    for half, qv in ((0, np.arange(16)), (1, 15 - np.arange(16))):
        qs = qv[None, :] * sc[:, None]  # (32, 16): the same for low (q, sc) and high (16q, sc/16) nibbles
        t = (qs * d[:, None] + m_hi[:, None]).astype(np.float16).astype(np.float64)
        w = (t + m_lo[:, None]).astype(np.float16).astype(np.float64)
        for high in (0, 1):
            np.testing.assert_array_equal(halves[:, high, :, 0, half], qs)
            np.testing.assert_array_equal(halves[:, high, :, 1, half], w)
    for a in ("sm_89", "sm_90a", "sm_120a"):
        compile_ptx(_q4k_pair3_probe(get_arch(a)).ptx(), a, name="pair3_probe")
