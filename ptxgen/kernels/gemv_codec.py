"""gemv_<fmt>_f32_t<nt>: the exact decode GEMV of any weight codec with a `dequant_lane` (ptxgen/codecs), y = x @ W.T
for up to nt tokens with fp32 x as given (no activation prep: one launch per call).

A warp owns one row: per step it takes 256 of the row's weights (one super-block, or 8 Q8_0 blocks), each lane 8
of them decoded by the codec in float32 exactly as ggml's dequantize_row_<fmt> (the same code as dequantize_<fmt>),
multiplies them by the matching x values (16- or 8-byte loads, L1/L2 hits after the first warp) with one FFMA per
weight and token, and the warp sums its lanes at the end (shfl butterfly). The result is the fp32 product of ggml's
fp32 weights with x (relative error ~1e-6 against the float64 reference). The generic baseline that makes every
codec's format run; the formats with hand-tuned GEMVs (Q4_K, TQ4_1S) keep theirs.
"""
from __future__ import annotations

from .. import codecs
from ..builder import KernelBuilder
from ..dsl import warp_sum
from ..ir import Imm, Mem
from . import KernelDef

WARPS = 8
TOKENS = (1, 2, 4, 8)
FORMATS = codecs.with_route("codec_gemv")
_LOAD = {2: "ld.global.nc.v2.f32", 4: "ld.global.nc.v4.f32"}


def dot_runs(b, runs, deltas, base, acc, pred=None) -> None:
    """acc += the codec's fp32 weights (`runs`, at element `deltas` from `base`, an fp32 row of x) times x, one FFMA
    each in order; x by 16-byte loads (8-byte for runs of 2), zero where `pred` is false."""
    for run, delta in zip(runs, deltas):
        for c0 in range(0, len(run), 4):
            n = min(4, len(run) - c0)
            xs = [b.op("mov.f32", Imm(0.0, "f32")) for _ in range(n)]
            b.emit(_LOAD[n], b.vec(xs), Mem(base, 4 * (delta + c0)), pred=pred)
            for wv, xv in zip(run[c0:c0 + n], xs):
                b.emit("fma.rn.f32", acc, wv, xv, acc)


def name(fmt: str, nt: int) -> str:
    return f"gemv_{fmt.lower()}_f32_t{nt}"


def build(arch, fmt: str, nt: int):
    codec = codecs.get(fmt)
    b = KernelBuilder(name(fmt, nt), arch, f"{fmt} GEMV (exact, fp32 x), up to {nt} token(s), one row per warp, "
                      "weights decoded by the codec as ggml's", block=(32 * WARPS, 1, 1))
    w_p, x_p, y_p = b.param("w", "u64", "ptr:in"), b.param("x", "u64", "ptr:in"), b.param("y", "u64", "ptr:out")
    m_p, k_p, n_p = b.param("m", "u32"), b.param("k", "u32"), b.param("ntok", "u32")
    b.directives += [f".maxntid {32 * WARPS}, 1, 1"]
    b.meta.update(tokens=nt, rows_per_cta=WARPS, warps=WARPS, grid="ceil(m / rows_per_cta)", fmt=fmt, mode="exact",
                  activation="fp32 x (T, K), 16-byte aligned rows", k_multiple=codec.BLOCK_K,
                  layout="gguf rows")
    b.pdl_head()  # one kernel per call: it waits for whatever wrote x before it reads anything
    W, X, Y = b.ptr(w_p), b.ptr(x_p), b.ptr(y_p)
    M, K, ntok = b.ld_param(m_p, "u32"), b.ld_param(k_p, "u32"), b.ld_param(n_p, "u32")
    tid = b.special("tid.x")
    lane = b.op("and.b32", tid, Imm(31, "b32"))
    row = b.op("mad.lo.u32", b.special("ctaid.x"), Imm(WARPS, "u32"), b.op("shr.u32", tid, Imm(5, "u32")))
    done = b.label("done")
    b.bra(done, pred=b.op("setp.ge.u32", row, M))  # a warp past M: nothing to do (warp-uniform)
    nblk = b.op("div.u32", K, Imm(codec.BLOCK_K, "u32"))
    rowp = b.op("mad.wide.u32", row, b.op("mul.lo.u32", nblk, Imm(codec.BLOCK_BYTES, "u32")), W)
    ngroups = b.op("div.u32", b.op("add.u32", nblk, Imm(codec.GROUP_BLOCKS - 1, "u32")), Imm(codec.GROUP_BLOCKS, "u32"))
    live = [b.op("setp.gt.u32", ntok, Imm(t, "u32")) if t else None for t in range(nt)]  # token 0 always exists
    xrow = [b.op("mad.wide.u32", K, Imm(4 * t, "u32"), X) for t in range(nt)]
    acc = [b.op("mov.f32", Imm(0.0, "f32")) for _ in range(nt)]
    g = b.op("mov.u32", Imm(0, "u32"))
    loop = b.label("step")
    b.place(loop)
    runs, offsets, valid = codec.dequant_lane(b, rowp, g, lane, nblk, f32=True)
    first, deltas = offsets()
    for t in range(nt):
        pred = valid if live[t] is None else live[t] if valid is None else b.op("and.pred", valid, live[t])
        dot_runs(b, runs, deltas, b.op("mad.wide.u32", first, Imm(4, "u32"), xrow[t]), acc[t], pred)
    b.emit("add.u32", g, g, Imm(1, "u32"))
    b.bra(loop, pred=b.op("setp.lt.u32", g, ngroups))
    lead = b.op("setp.eq.u32", lane, Imm(0, "u32"))
    for t in range(nt):
        s = warp_sum(b, acc[t])
        ok = lead if live[t] is None else b.op("and.pred", lead, live[t])
        b.emit("st.global.f32", Mem(b.op("mad.wide.u32", b.op("mad.lo.u32", M, Imm(t, "u32"), row), Imm(4, "u32"), Y)),
               s, pred=ok)
    b.place(done)
    b.emit("ret")
    return b.finish()


KERNELS = [KernelDef(name(f, nt), f"{f.upper()} decode GEMV, exact (fp32 x), up to {nt} token(s), weights by the codec",
                     lambda arch, f=f, nt=nt: build(arch, f, nt)) for f in FORMATS for nt in TOKENS]
