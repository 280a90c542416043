"""dequantize_<fmt>_frags: any codec's rows → the register-A wgmma MMQ's fp16 A fragments (layouts.q4k_rega_fragments,
in its K order), the input of the prepared GEMM (mmq_q4_k_wgmma_pre_*: it reads only these fp16 fragments, whatever
the format was). Thread ct writes what consumer thread ct of the register-A GEMM decodes a step — rows 16·(ct / 32) + g and + 8 of
the (M-tile, K-step) block, columns 8t .. 8t + 7 and 32 + 8t .. + 7 of the step — from the codec's `run8` (float32
exactly as ggml, rounded once to fp16)."""
from __future__ import annotations

from .. import codecs
from ..codecs import _common
from ..builder import KernelBuilder
from ..ir import Imm, Mem
from ..layouts import RA_FRAG_BYTES
from . import KernelDef
from ..specs import CodecKernel

FRAG_THREADS = 256
# the codecs whose prefill takes the prepared GEMM: route "mmq_pre", and Q4_K's "mmq" (its wgmma_pre path past
# mmq_pre_min_tokens). TQ4_1S: its rotated-domain weights, for a rotated activation.
FORMATS = tuple(dict.fromkeys(codecs.with_route("mmq") + codecs.with_route("mmq_pre")))
PAIRS = ((0, 2), (1, 3), (4, 6), (5, 7))  # f16x2 number n % 4 of a thread's 8 columns (layouts.q4k_rega_k_order)


def name(fmt: str) -> str:
    return CodecKernel("frags", fmt).name


def build(arch, fmt: str):
    codec = codecs.get(fmt)
    b = KernelBuilder(name(fmt), arch, f"{fmt} → fp16 wgmma A fragments of the register-A MMQ (its K order)",
                      block=(FRAG_THREADS, 1, 1))
    w_p, y_p = b.param("w", "u64", "ptr:in"), b.param("frags", "u64", "ptr:out")
    m_p, k_p = b.param("M", "u32", "scalar"), b.param("K", "u32", "scalar")
    b.meta.update(grid="(K / 64, ceil(M / 128))", layout="ptxgen.layouts.q4k_rega_fragments", block_bytes=RA_FRAG_BYTES,
                  fmt=fmt)
    b.pdl_head()  # the op's first kernel: it waits for whatever came before; the GEMM behind it may launch now
    W, Y, M, K, ct, s, tm, t, row0 = thread(b, w_p, y_p, m_p, k_p)
    row_bytes = _common.row_bytes(b, codec, K)
    k_low = b.op("mad.lo.u32", s, Imm(64, "u32"), b.op("shl.b32", t, Imm(3, "u32")))
    k_high = b.op("add.u32", k_low, Imm(32, "u32"))
    last = b.op("sub.u32", M, Imm(1, "u32"))
    frag = {}  # (rr, n) → f16x2 number n of row row0 + 8·rr
    for rr in range(2):
        row = b.op("add.u32", row0, Imm(8 * rr, "u32"))
        valid = b.op("setp.lt.u32", row, M)
        rowp = b.op("mad.wide.u32", b.op("min.u32", row, last), row_bytes, W)
        pair = getattr(codec, "run8_pair", None)  # both runs from one decode where the codec has it (Q4_K)
        low, high = pair(b, rowp, k_low) if pair else (codec.run8(b, rowp, k_low), codec.run8(b, rowp, k_high))
        place(b, frag, rr, low, high, valid)
    store(b, frag, tm, K, s, ct, Y)
    b.emit("ret")
    return b.finish()


def thread(b, w_p, y_p, m_p, k_p):
    """A fragment writer's parameters and thread: (W, Y, M, K, ct, K-step s, M-tile tm, t, row0): thread ct is lane
    (g, t) of consumer warp ct / 32 of the register-A GEMM, rows row0 = 128·tm + 16·(ct / 32) + g and + 8."""
    W, Y = b.ptr(w_p), b.ptr(y_p)
    M, K = b.ld_param(m_p, "u32"), b.ld_param(k_p, "u32")
    ct = b.special("tid.x")
    s, tm = b.special("ctaid.x"), b.special("ctaid.y")
    lane = b.op("and.b32", ct, Imm(31, "b32"))
    g, t = b.op("shr.u32", lane, Imm(2, "u32")), b.op("and.b32", lane, Imm(3, "b32"))
    row0 = b.op("add.u32", b.op("shl.b32", tm, Imm(7, "u32")),
                b.op("mad.lo.u32", b.op("shr.u32", ct, Imm(5, "u32")), Imm(16, "u32"), g))
    return W, Y, M, K, ct, s, tm, t, row0


def place(b, frag, rr, low, high, valid) -> None:
    """frag[rr, n]: f16x2 number n of row row0 + 8·rr from its columns 8t .. (`low`) and 32 + 8t .. (`high`), fp32,
    in the register-A K order (PAIRS); zero for a row past M."""
    for n in range(8):
        src = low if n < 4 else high
        e0, e1 = PAIRS[n % 4]
        h = b.op("cvt.rn.f16x2.f32", src[e1], src[e0], type="b32")
        frag[rr, n] = b.op("selp.b32", h, Imm(0, "b32"), valid)


def store(b, frag, tm, K, s, ct, Y) -> None:
    """Thread ct's 16 bytes of each k16 slice of block (M-tile tm, K-step s) (layouts.q4k_rega_fragments)."""
    blk = b.op("mad.lo.u32", tm, b.op("shr.u32", K, Imm(6, "u32")), s)
    out = b.op("add.u64", b.op("mad.wide.u32", blk, Imm(RA_FRAG_BYTES, "u32"), Y),
               b.op("cvt.u64.u32", b.op("shl.b32", ct, Imm(4, "u32"))))
    for kk in range(4):
        regs = [frag[0, 2 * kk], frag[1, 2 * kk], frag[0, 2 * kk + 1], frag[1, 2 * kk + 1]]
        b.emit("st.global.v4.b32", Mem(out, kk * FRAG_THREADS * 16), b.vec(regs))


KERNELS = [KernelDef(name(f), f"{f.upper()} → fp16 wgmma A fragments of the register-A MMQ (its K order), bit-exact "
                     "to ggml's float32 dequant rounded to fp16", lambda arch, f=f: build(arch, f), archs=("sm_90a",))
           for f in FORMATS]
