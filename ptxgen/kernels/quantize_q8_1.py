"""quantize_q8_1: fp32 activations → Q8_1 blocks (36 B: d, s = Σx, 32 × int8), one warp per block.

What it computes is `ptxgen.formats.quantize("q8_1", x)` (s_mode "sum_x") bit for bit: amax and Σx by a
shfl.bfly butterfly (offsets 16, 8, 4, 2, 1), q = cvt.rni(x · 127/amax), d = fp16(amax/127), s = fp16(Σx).
A NaN anywhere in a block makes amax NaN (max.NaN), its q all 0 and d, s NaN.
"""
from __future__ import annotations

from ..dsl import elementwise_head
from ..ir import Imm, Mem
from . import KernelDef

WARPS = 8


def q8_1_math(b, v):
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
    return q, b.op("cvt.rn.f16.f32", d), b.op("cvt.rn.f16.f32", s)


def build(arch):
    b, x, y, nblocks = elementwise_head("quantize_q8_1", arch, __doc__.splitlines()[0], "x", "y", "nblocks", WARPS,
                                        "blocks_per_cta")
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


KERNEL = KernelDef("quantize_q8_1", "fp32 → Q8_1 blocks (s = Σx), one warp per 32 values", build)
