"""quantize_q8_1: fp32 activations → Q8_1 blocks (36 B: d, s = Σx, 32 × int8), one warp per block.

What it computes is `ptxgen.formats.quantize("q8_1", x)` (s_mode "sum_x") bit for bit: amax and Σx by a
shfl.bfly butterfly (offsets 16, 8, 4, 2, 1), q = cvt.rni(x · 127/amax), d = fp16(amax/127), s = fp16(Σx).
A NaN anywhere in a block makes amax NaN (max.NaN), its q all 0 and d, s NaN.
"""
from __future__ import annotations

from ..dsl import elementwise_head, warp_per_item
from ..ir import Imm, Mem
from . import KernelDef
from ..specs import ActKernel

WARPS = 8


def q8_1_math(b, v, with_amax: bool = False):
    """One Q8_1 block held one value per lane → (q as s32, d and s as f16): amax and Σx by butterfly,
    q = cvt.rni(x · 127/amax), d = fp16(amax/127), s = fp16(Σx). Shared with the GEMV's activation prep."""
    a = b.op("abs.f32", v)
    s = v
    for off in (16, 8, 4, 2, 1):
        oa = b.op("shfl.sync.bfly.b32", a, Imm(off, "u32"), Imm(31, "u32"), Imm(0xFFFFFFFF, "b32"), type="f32")
        a = b.op("max.NaN.f32", a, oa)
        os_ = b.op("shfl.sync.bfly.b32", s, Imm(off, "u32"), Imm(31, "u32"), Imm(0xFFFFFFFF, "b32"), type="f32")
        s = b.op("add.rn.f32", s, os_)
    pos = b.op("setp.gt.f32", a, Imm(0.0, "f32"))
    inv = b.op("selp.f32", b.op("div.rn.f32", Imm(127.0, "f32"), a), Imm(0.0, "f32"), pos)
    q = b.op("cvt.rni.s32.f32", b.op("mul.rn.f32", v, inv))
    d = b.op("div.rn.f32", a, Imm(127.0, "f32"))
    out = q, b.op("cvt.rn.f16.f32", d), b.op("cvt.rn.f16.f32", s)
    return (*out, a) if with_amax else out


def build(arch):
    b, x, y, nblocks = elementwise_head(ActKernel("quantize_q8_1").name, arch, __doc__.splitlines()[0], "x", "y",
                                        "nblocks", WARPS, "blocks_per_cta")
    tid = b.special("tid.x")
    lane = b.op("and.b32", tid, Imm(31, "b32"))
    warp = b.op("shr.u32", tid, Imm(5, "u32"))
    cta = b.special("ctaid.x")
    blk = b.op("mad.lo.u32", cta, Imm(WARPS, "u32"), warp)
    done = b.label("done")
    b.bra(done, pred=b.op("setp.ge.u32", blk, nblocks))

    elem = b.op("mad.lo.u32", blk, Imm(32, "u32"), lane)
    v = b.op("ld.global.nc.f32", Mem(b.op("mad.wide.u32", elem, Imm(4, "u32"), x)))
    q, dh, sh = q8_1_math(b, v)
    yb = b.op("mad.wide.u32", blk, Imm(36, "u32"), y)
    qaddr = b.op("add.s64", yb, b.op("cvt.u64.u32", lane))
    b.emit("st.global.u8", Mem(qaddr, 4), q)
    lead = b.op("setp.eq.u32", lane, Imm(0, "u32"))
    ds = b.reg("b32")
    b.emit("mov.b32", ds, b.vec([dh, sh]))
    b.emit("st.global.u32", Mem(yb), ds, pred=lead)
    b.place(done)
    b.emit("ret")
    return b.finish()


KERNEL = KernelDef(ActKernel("quantize_q8_1").name, "fp32 → Q8_1 blocks (s = Σx), one warp per 32 values", build)


def build_mmq(arch):
    """quantize_q8_1_mmq: fp32 → the Q8_1 MMQ's activation layout, one warp per 32 values (the same q and d
    as quantize_q8_1): int8 q at y[32·i + lane] (a token's K values contiguous, so the GEMM copies 16-byte
    chunks), then after all nblocks·32 bytes one float2 per block: (d, d·Σq) — Σq over the int8 values,
    the min term's exact integer sum. flag[0] = 1 if a finite block's d overflows fp16 (amax > 65504·127)."""
    b, x, y, nblocks = elementwise_head(ActKernel("quantize_q8_1", mmq=True).name, arch,
                                        build_mmq.__doc__.splitlines()[0], "x", "y", "nblocks", WARPS, "blocks_per_cta")
    flag = b.ptr(b.param("flag", "u64", "ptr:out"))
    b.meta.update(layout="int8 q (nblocks x 32 B), then float2 (d, d·Σq) per block")
    lane, blk, done = warp_per_item(b, nblocks, WARPS)
    elem = b.op("mad.lo.u32", blk, Imm(32, "u32"), lane)
    v = b.op("ld.global.nc.f32", Mem(b.op("mad.wide.u32", elem, Imm(4, "u32"), x)))
    q, dh, _, amax = q8_1_math(b, v, with_amax=True)
    sq = q
    for off in (16, 8, 4, 2, 1):
        sq = b.op("add.s32", sq, b.op("shfl.sync.bfly.b32", sq, Imm(off, "u32"), Imm(31, "u32"),
                                      Imm(0xFFFFFFFF, "b32"), type="s32"))
    b.emit("st.global.u8", Mem(b.op("add.s64", y, b.op("cvt.u64.u32", elem))), q)
    d = b.op("cvt.f32.f16", dh)
    # a finite amax whose d overflowed (NaN and inf in x keep their meaning: they propagate)
    big = b.op("and.pred", b.op("setp.eq.f32", d, Imm(float("inf"), "f32")),
               b.op("setp.lt.f32", amax, Imm(float("inf"), "f32")))
    b.emit("st.global.u32", Mem(flag), Imm(1, "u32"), pred=big)
    scales = b.op("add.s64", y, b.op("mul.wide.u32", nblocks, Imm(32, "u32")))
    lead = b.op("setp.eq.u32", lane, Imm(0, "u32"))
    b.emit("st.global.v2.f32", Mem(b.op("mad.wide.u32", blk, Imm(8, "u32"), scales)),
           b.vec([d, b.op("mul.rn.f32", d, b.op("cvt.rn.f32.s32", sq))]), pred=lead)
    b.place(done)
    b.emit("ret")
    return b.finish()


KERNEL_MMQ = KernelDef(ActKernel("quantize_q8_1", mmq=True).name, "fp32 → Q8_1 in the int8 MMQ's layout (int8 rows, "
                       "then (d, d·Σq))", build_mmq)
