"""mul_mat_fixup_q4_k: after a prefill GEMM on fp16 (or Q8_1) activations, recompute exactly the tokens whose
activations left that format — decided on the device, so `mul_mat` never reads the overflow flag on the host.

The GEMMs' activation conversion (convert_f16{,_perm}, the converting and Q8_1 builds) raises `flag` when a value
becomes ±inf / NaN in fp16 (|x| ≥ 65520, or a non-finite input) or a Q8_1 scale overflows. This kernel runs behind
every such GEMM: it reads `flag` and, when it is clear (the usual case), every CTA returns at once. When it is set,
CTA c takes tokens c, c + gridDim.x, ...: its threads test the token's fp32 row the same way (any value whose fp16
rounding has an all-ones exponent, or a row whose largest magnitude is under convert_f16.TINY_ROW and not zero: too
small for fp16's precision, which the conversions flag too), and for a token that fails they recompute its whole
output row in fp32 from the weights' bytes (the codec's dequant_lane: ggml's float32 dequant, fp32 sums, the exact
GEMV's accuracy), overwriting the GEMM's; one build per codec with a prefill GEMM (mul_mat_fixup_<fmt>). The last
CTA to finish (an arrival count in `done`) clears `flag` and `done` for the next op of the stream. A non-finite input
gives non-finite outputs in that token's row, as the float64 reference does.
"""
from __future__ import annotations

import numpy as np

from .. import codecs
from ..builder import KernelBuilder
from ..dsl import warp_sum
from ..ir import Imm, Mem
from . import KernelDef
from ..specs import CodecKernel
from .convert_f16 import F16_OVER_F32_BITS, TINY_ROW

THREADS = 256
WARPS = THREADS // 32
# behind the prefill GEMMs of each (Q4_K: its MMQs; the others: the prepared, register-A or mma.sync GEMMs; TQ4_1S's
# x is the rotated activation)
FORMATS = tuple(dict.fromkeys(f for r in ("mmq", "mmq_pre", "mmq_ra", "mmq_f16") for f in codecs.with_route(r)))


def name(fmt: str) -> str:
    return CodecKernel("fixup", fmt).name


def build(arch, fmt: str = "q4_K"):
    """The fixup behind a prefill GEMM on `fmt` weights: the rows recomputed from the codec's fp32 decode (its
    dequant_lane, as the codec GEMV)."""
    doc = __doc__.splitlines()[0].replace("q4_k", fmt.lower())
    b = KernelBuilder(name(fmt), arch, doc, block=(THREADS, 1, 1))
    f_p, d_p = b.param("flag", "u64", "ptr:scratch"), b.param("done", "u64", "ptr:scratch")
    w_p, x_p, y_p = b.param("w", "u64", "ptr:in"), b.param("x", "u64", "ptr:in"), b.param("y", "u64", "ptr:out")
    m_p, k_p, t_p = b.param("M", "u32"), b.param("K", "u32"), b.param("T", "u32")
    b.meta.update(grid="min(T, fixup_ctas_per_sm x SMs) CTAs (ptxgen/tuning): CTA c recomputes tokens c, c + gridDim.x, "
                  "... when flag is set",
                  warps=WARPS, pdl=arch.has("griddepcontrol"))
    b.pdl_trigger()  # the op's last kernel: the next op's first may start now
    if arch.has("griddepcontrol"):  # launched with PDL behind the GEMM: wait for it (and its flag) to complete
        b.emit("griddepcontrol.wait")
    F, D = b.ptr(f_p), b.ptr(d_p)
    out = b.label("out")
    flag = b.op("ld.global.u32", Mem(F))
    b.bra(out, pred=b.op("setp.eq.u32", flag, Imm(0, "u32")))  # the usual case: nothing to fix

    any_sym = b.shared_buffer("any_bad", 12, align=4)  # token t + 1 written by a thread that found t out of range,
    # at 4: ... one that found a value of t at or past TINY_ROW, at 8: ... one that found a value of t not zero
    W, X, Y = b.ptr(w_p), b.ptr(x_p), b.ptr(y_p)
    M, K, T = b.ld_param(m_p, "u32"), b.ld_param(k_p, "u32"), b.ld_param(t_p, "u32")
    tid, cta, ncta = b.special("tid.x"), b.special("ctaid.x"), b.special("nctaid.x")
    lane, warp = b.op("and.b32", tid, Imm(31, "b32")), b.op("shr.u32", tid, Imm(5, "u32"))
    k4 = b.op("shr.u32", K, Imm(2, "u32"))
    nsb, row_bytes, step = _codec_rows(b, codecs.get(fmt), K, lane)

    anyp = b.op("mov.u32", any_sym)
    first = b.op("setp.eq.u32", tid, Imm(0, "u32"))
    for at in (0, 4, 8):
        b.emit("st.shared.u32", Mem(anyp, at), Imm(0, "u32"), pred=first)
    b.emit("bar.sync", Imm(0, "u32"))
    t = b.reg("u32")
    b.emit("mov.u32", t, cta)
    tok_loop, tok_next, tok_done = b.label("token"), b.label("token_next"), b.label("tokens_done")
    b.place(tok_loop)
    b.bra(tok_done, pred=b.op("setp.ge.u32", t, T))
    xrow = b.op("mad.wide.u32", b.op("mul.lo.u32", t, K), Imm(4, "u32"), X)
    # 1. does this token leave fp16, or is its row too small for it (convert_f16.TINY_ROW)? each thread reads every
    # 256th group of 4 values and keeps the largest magnitude it saw (as bits: the order of non-negative floats, a
    # NaN's above inf's), then tests it as convert_f16.conversion_flag does
    mx = b.op("mov.u32", Imm(0, "u32"))
    j = b.reg("u32")
    b.emit("mov.u32", j, tid)
    scan, scan_done = b.label("scan"), b.label("scan_done")
    b.place(scan)
    b.bra(scan_done, pred=b.op("setp.ge.u32", j, k4), uniform=False)
    v = b.regs("f32", 4)
    b.emit("ld.global.nc.v4.f32", b.vec(v), Mem(b.op("mad.wide.u32", j, Imm(16, "u32"), xrow)))
    for vv in v:
        b.emit("max.u32", mx, mx, b.op("and.b32", vv, Imm(0x7FFFFFFF, "b32"), type="u32"))
    b.emit("add.u32", j, j, Imm(THREADS, "u32"))
    b.bra(scan, uniform=False)
    b.place(scan_done)
    t1 = b.op("add.u32", t, Imm(1, "u32"))  # never a value an earlier token of this CTA left there
    b.emit("st.shared.u32", Mem(anyp), t1, pred=b.op("setp.hs.u32", mx, Imm(F16_OVER_F32_BITS, "u32")))
    tiny_bits = int(np.float32(TINY_ROW).view(np.uint32))
    b.emit("st.shared.u32", Mem(anyp, 4), t1, pred=b.op("setp.ge.u32", mx, Imm(tiny_bits, "u32")))
    b.emit("st.shared.u32", Mem(anyp, 8), t1, pred=b.op("setp.ne.u32", mx, Imm(0, "u32")))
    b.emit("bar.sync", Imm(0, "u32"))
    small = b.op("and.pred", b.op("setp.ne.u32", b.op("ld.shared.u32", Mem(anyp, 4)), t1),
                 b.op("setp.eq.u32", b.op("ld.shared.u32", Mem(anyp, 8)), t1))  # 0 < the row's max < TINY_ROW
    any_bad = b.op("or.pred", b.op("setp.eq.u32", b.op("ld.shared.u32", Mem(anyp)), t1), small)
    b.bra(tok_next, pred=any_bad, neg=True)

    # 2. recompute y[t, :] in fp32: warp w takes rows w, w + 8, ...; lane L one qs word per super-block
    ytok = b.op("mad.wide.u32", b.op("mul.lo.u32", t, M), Imm(4, "u32"), Y)
    row = b.reg("u32")
    b.emit("mov.u32", row, warp)
    row_loop, row_done = b.label("row"), b.label("rows_done")
    b.place(row_loop)
    b.bra(row_done, pred=b.op("setp.ge.u32", row, M))
    wrow = b.op("mad.wide.u32", row, row_bytes, W)
    acc = b.reg("f32")
    b.emit("mov.f32", acc, Imm(0.0, "f32"))
    sb = b.reg("u32")
    b.emit("mov.u32", sb, Imm(0, "u32"))
    sb_loop, sb_done = b.label("superblock"), b.label("superblocks_done")
    b.place(sb_loop)
    b.bra(sb_done, pred=b.op("setp.ge.u32", sb, nsb))
    step(wrow, sb, xrow, acc)
    b.emit("add.u32", sb, sb, Imm(1, "u32"))
    b.bra(sb_loop)
    b.place(sb_done)
    warp_sum(b, acc, inplace=True)
    b.emit("st.global.f32", Mem(b.op("mad.wide.u32", row, Imm(4, "u32"), ytok)), acc,
           pred=b.op("setp.eq.u32", lane, Imm(0, "u32")))
    b.emit("add.u32", row, row, Imm(WARPS, "u32"))
    b.bra(row_loop)
    b.place(row_done)

    b.place(tok_next)
    b.emit("bar.sync", Imm(0, "u32"))  # every thread has read any_bad before the next token writes it
    b.emit("add.u32", t, t, ncta)
    b.bra(tok_loop)
    b.place(tok_done)

    # 3. the last CTA out clears the flag and the arrival count (every CTA read the flag before it arrives)
    last = b.label("last")
    b.bra(out, pred=b.op("setp.ne.u32", tid, Imm(0, "u32")), uniform=False)
    b.emit("membar.gl")
    arrived = b.op("atom.global.add.u32", Mem(D), Imm(1, "u32"))
    b.bra(out, pred=b.op("setp.ne.u32", arrived, b.op("sub.u32", ncta, Imm(1, "u32"))), uniform=False)
    b.place(last)
    b.emit("st.global.u32", Mem(F), Imm(0, "u32"))
    b.emit("st.global.u32", Mem(D), Imm(0, "u32"))
    b.place(out)
    b.emit("ret")
    return b.finish()


def _codec_rows(b, codec, K, lane):
    """Any codec's row walk: 256 weights per step through its dequant_lane (float32 as ggml), as the codec GEMV."""
    nblk = b.op("div.u32", K, Imm(codec.BLOCK_K, "u32"))
    row_bytes = b.op("mul.lo.u32", nblk, Imm(codec.BLOCK_BYTES, "u32"))
    steps = b.op("div.u32", b.op("add.u32", nblk, Imm(codec.GROUP_BLOCKS - 1, "u32")), Imm(codec.GROUP_BLOCKS, "u32"))

    from .gemv_codec import dot_runs

    def step(wrow, g, xrow, acc):
        runs, offsets, valid = codec.dequant_lane(b, wrow, g, lane, nblk, f32=True)
        first, deltas = offsets()
        dot_runs(b, [runs], deltas, b.op("mad.wide.u32", first, Imm(4, "u32"), xrow), [acc], valid)
    return steps, row_bytes, step


# every target where an fp16 GEMM of the codec runs: Q4_K's MMQs and the mma.sync GEMMs of the codecs with route
# mmq_f16 (kernels/mmq.py F16_CODECS) on sm_89, sm_90a and sm_120a; the register-A / prepared wgmma ones on sm_90a
KERNELS = [KernelDef(name(f), f"after a prefill GEMM on {f.upper()} weights: recompute in fp32 the tokens whose "
                     f"activations left {'fp16 / Q8_1' if getattr(codecs.get(f), 'Q8_MMQ', False) else 'fp16'} (flag "
                     "read on the device; returns at once when clear)",
                     lambda arch, f=f: build(arch, f),
                     archs=(("sm_89", "sm_90a", "sm_120a") if f in codecs.with_route("mmq_f16") + codecs.with_route("mmq")
                            else ("sm_90a",)))
           for f in FORMATS]
