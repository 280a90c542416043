"""dequantize_q4_k_frags: Q4_K rows → the register-A wgmma MMQ's fp16 A fragments (the prepared GEMM's input).
dequantize_q4_k itself is the generic kernels/dequantize.py over the Q4_K codec."""
from __future__ import annotations

from ..codecs import q4_k as Q4K
from ..codecs.q4_k import dequant_word as dequant_q4_k_word
from ..ir import Imm, Mem
from . import KernelDef
from .frags import FRAG_THREADS  # one thread per consumer thread of the register-A wgmma MMQ


def build_frags(arch):
    """dequantize_q4_k_frags: Q4_K rows → fp16 wgmma A fragments in the register-A MMQ's K order
    (ptxgen.layouts.q4k_rega_fragments), for the prepared build mmq_q4_k_wgmma_pre_*, which then loads each
    (M-tile, K-step) block by TMA instead of dequantizing in its K loop. CTA (s, tm) writes block (tm, s);
    thread ct does what consumer thread ct of the register-A build does per step — rows 16·(ct / 32) + g and + 8,
    qs bytes 8t..8t+7 of the step's 32 (low nibbles: sub-block 2c, high: 2c + 1) — but in float32 exactly as
    ggml's dequantize_row_q4_K, rounded once to fp16 (the weights equal `dequantize_q4_k`'s bit for bit, only
    placed in fragment order). Rows past M are written as zeros."""
    from ..builder import KernelBuilder
    from ..dsl import ApplyScaleMin, UnpackNibbles
    from ..layouts import RA_FRAG_BYTES
    from .frags import place, store, thread

    b = KernelBuilder("dequantize_q4_k_frags", arch, build_frags.__doc__.splitlines()[0], block=(FRAG_THREADS, 1, 1))
    w_p, y_p = b.param("w", "u64", "ptr:in"), b.param("frags", "u64", "ptr:out")
    m_p, k_p = b.param("M", "u32", "scalar"), b.param("K", "u32", "scalar")
    b.meta.update(grid="(K / 64, ceil(M / 128))", layout="ptxgen.layouts.q4k_rega_fragments",
                  block_bytes=RA_FRAG_BYTES)
    b.pdl_trigger()  # the GEMM after it may launch now (its producer waits before the first TMA)
    W, Y, M, K, ct, s, tm, t, row0 = thread(b, w_p, y_p, m_p, k_p)
    row_bytes = b.op("mul.lo.u32", b.op("div.u32", K, Imm(Q4K.BLOCK_K, "u32")), Imm(Q4K.BLOCK_BYTES, "u32"))
    c = b.op("and.b32", s, Imm(3, "b32"))  # the step's 64 columns within its super-block
    sb_off = b.op("mul.lo.u32", b.op("shr.u32", s, Imm(2, "u32")), Imm(Q4K.BLOCK_BYTES, "u32"))
    sub_lo = b.op("shl.b32", c, Imm(1, "u32"))
    qs_off = b.op("add.u32", b.op("shl.b32", c, Imm(5, "u32")), b.op("shl.b32", t, Imm(3, "u32")))
    last = b.op("sub.u32", M, Imm(1, "u32"))
    frag = {}  # (rr, n) → f16x2 number n of row row0 + 8·rr (as in the register-A consumer's frag)
    for rr in range(2):
        row = b.op("add.u32", row0, Imm(8 * rr, "u32"))
        valid = b.op("setp.lt.u32", row, M)
        block = b.op("add.u64", b.op("mul.wide.u32", b.op("min.u32", row, last), row_bytes),
                     b.op("cvt.u64.u32", sb_off))
        block = b.op("add.u64", W, block)
        qw = b.regs("b32", 2)
        b.emit("ld.global.nc.v2.u32", b.vec(qw), Mem(b.op("add.u64", block, b.op("cvt.u64.u32", qs_off)), Q4K.HEADER_BYTES))
        env = {"block": block, "sub_lo": sub_lo, "sub_hi": b.op("add.u32", sub_lo, Imm(1, "u32")), "qword": qw[0]}
        dequant_q4_k_word().lower(b, env)  # bytes 0-3 of the 8: w_lo (columns 8t + 0..3), w_hi (32 + 8t + 0..3)
        env["qword2"] = qw[1]
        UnpackNibbles("qword2", ("q_lo2", "q_hi2")).lower(b, env)
        ApplyScaleMin("q_lo2", "d_lo", "min_lo", "w_lo2").lower(b, env)
        ApplyScaleMin("q_hi2", "d_hi", "min_hi", "w_hi2").lower(b, env)
        place(b, frag, rr, env["w_lo"] + env["w_lo2"], env["w_hi"] + env["w_hi2"], valid)
    store(b, frag, tm, K, s, ct, Y)
    b.emit("ret")
    return b.finish()


KERNEL_FRAGS = KernelDef("dequantize_q4_k_frags", "Q4_K → fp16 wgmma A fragments of the register-A MMQ (its K "
                         "order), bit-exact to ggml's float32 dequant rounded to fp16", build_frags, archs=("sm_90a",))
