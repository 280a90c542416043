"""gemv_<fmt>_f32_t<nt>: the exact decode GEMV of any weight codec with a `dequant_lane` (ptxgen/codecs), y = x @ W.T
for up to nt tokens with fp32 x as given (no activation prep: one launch per call).

A warp owns ROWS rows (TUNED / SHAPE per format and nt): per step it takes 256 of each row's weights (one super-block, or 8 Q8_0 blocks),
each lane 8 of them decoded by the codec in float32 exactly as ggml's dequantize_row_<fmt> (the same code as
dequantize_<fmt>), multiplies them by the matching x values (16- or 8-byte loads, L1/L2 hits after the first warp;
one load serves the warp's ROWS rows) with one FFMA per weight and token, and the warp sums its lanes at the end
(shfl butterfly). A step decodes UNROLL consecutive groups of each row before it multiplies (the loads of
ROWS × UNROLL groups in flight per warp: a decode GEMV waits on memory, not on arithmetic); a group past the row's
end is the row's last group again with its products skipped. Every accumulator adds its products in K order, so
the result does not depend on ROWS or UNROLL: the fp32 product of ggml's fp32 weights with x (relative error ~1e-6
against the float64 reference). The one-token builds' kparts (a launch parameter: a row's K range over kparts warps,
their sums added in part order) changes only the order of those sums (~3e-7). The generic baseline that makes every
codec's format run; the formats with
hand-tuned GEMVs (Q4_K, TQ4_1S) keep theirs.

A codec with `dequant_lane_wide` (Q4_K, Q5_K, Q6_K) gives each lane 16 weights of a block, so one header load and
one scale decode serve twice the weights: the K-quants' as ggml's fp32 weights (Q5_K at T = 1: 8.2 SASS
instructions a weight in the main loop since the pair scale decode, FFMA weights and PRMT values of 2026-12-03, 11
before, the 8-weight lanes 22; `ptxgen check --loops`), Q6_K's as factored runs
(q − 32 as f32 by a PRMT and an FADD, d·sc per run of 4: the warp sums q·x and scales once, no min term to cancel;
8.8 where they took 14). Timed against the 8-weight lanes on the H200 (bench/NOTES.md, 2026-12-01, night). Q8_0's
8-weight lanes give one factored run too (q exact, d once: no FMUL a weight; q8_0.F32_I2F of the 8 values on the
I2F pipe, the rest by PRMT + FADD).
"""
from __future__ import annotations

from .. import codecs
from ..builder import KernelBuilder
from ..dsl import warp_sum
from ..ir import Imm, Mem
from . import KernelDef
from ..specs import CodecKernel

WARPS = 8
TOKENS = (1, 2, 4, 8, 16)  # 16: Q5_K's 9-16-token calls; Q6_K's and Q8_0's not shipped (ptxgen.kernels.NOT_SHIPPED)
SHAPE = {1: (2, 2), 2: (2, 2), 4: (2, 2), 8: (4, 2), 16: (2, 2)}  # tokens: (rows per warp, groups per step), 8-weight lanes
# (rows per warp, groups decoded per step, wide lanes) per format and token build, where measured: the fastest of the
# variants timed on the H200 (4096x14336, back to back over 24 weights from HBM; bench/NOTES.md, 2026-12-01, night;
# bench/results/probe_gemv_codec_shapes_852097d.log). A wide group is WIDE_BLOCKS blocks. Q4_K (its codec GEMV runs
# the MoE decode) takes Q5_K's: the same lane code less the fifth bit. The rest: SHAPE with 8-weight lanes.
TUNED = {"q5_K": {1: (2, 2, True), 2: (2, 2, True), 4: (4, 2, True), 8: (4, 1, True), 16: (4, 1, True)},
         "q6_K": {1: (1, 2, True), 2: (1, 2, True), 4: (1, 2, True), 8: (2, 4, False)}}  # T = 16: 2:2 narrow spills
TUNED["q4_K"] = TUNED["q5_K"]
# ... and the MoE pair GEMVs' own (gemv_<fmt>_f32_id at T = 1): a warp's two rows are one expert's 8 blocks at K =
# 2048, so all 4 wide groups of a row in one step, every load of the warp in flight at once. H200 graph µs, 128 x
# top-8 768x2048 / 32 x top-4 1792x2048, (2, 2) -> (2, 4): Q4_K 5.7 -> 5.3 / 7.2 -> 6.9, Q5_K 6.5 -> 6.3 / 8.4 -> 8.0,
# same bits (probe_id_unroll_ffe0ba7.log; (1, 4) lost: 6.8 / 8.3)
TUNED_PAIR = {"q4_K": {1: (2, 4, True)}, "q5_K": {1: (2, 4, True)}}
AHEAD = 2  # steps: each step asks L2 for the row bytes this many steps ahead (prefetch.global.L2, 32 B a lane)
# ... but not the MoE pair GEMVs (gemv_<fmt>_f32_id): a warp's rows there are one expert's few blocks (K = 2048: 8),
# so the prefetches are extra requests ahead of loads about to be made anyway. H200 graph µs at T = 1, AHEAD 2 -> 0,
# 128 x top-8 768x2048 / 32 x top-4 1792x2048: Q4_K 6.3 -> 5.7-5.9 / 7.6-7.7 -> 7.3, Q5_K 7.0 -> 6.5 / 8.5 -> 8.5,
# Q6_K 6.7 / 7.4 unchanged, Q8_0 6.8 -> 6.6 / 8.2 -> 7.8; same bits (probe_id_ahead_*_068ae8a.log; AHEAD 1: 7.3 /
# 5.9; 4 rows or 1 group a step lost)
AHEAD_PAIR = 0
# K parts inside the CTA: the one-token builds (gemv_<fmt>_f32_t1(_x16), the small ops' route) take a `kparts`
# launch parameter (a power of two ≤ WARPS): the CTA's warps as WARPS / kparts row groups, each walked by kparts warps
# over contiguous ranges of its groups, their sums added through shared memory in part order after the warp
# reduction (deterministic; kparts 1 skips the barrier). For the small one-token ops, whose warps otherwise walk a
# whole row in dependent steps (Q4_K 1024x4096: 64 CTAs, 4 steps a warp): ops.codec_gemv_k_parts picks kparts by
# the CTAs it makes (RULES.codec_gemv_t1_max_ctas). H100 graph µs over 64 weights, kparts 1 / 2 / 4 (a probe's
# compile-time builds; bench/results/h100_kp_*_d5e50e1.log): Q4_K 1024x4096 4.7 / 4.2 / 3.3, 512x3584 4.5 / 3.1 /
# 2.6; Q6_K 1024x4096 3.7 / 3.6 / 4.1, 512x3584 3.5 / 2.7 / 2.5, 2048x4096 5.1 / 5.9 / 7.0; Q8_0 with the parameter
# 1024x4096 5.5 -> 3.9 (h100_kpr_*_0cb19e9.log)
RUNTIME_KPARTS_TOKENS = 1  # the builds of this many tokens (and not the MoE GEMVs) take the kparts parameter
# resident CTAs an SM asked of ptxas, by kernel name (none: ptxas's choice). Without launch bounds nvJitLink gives
# the MoE GEMVs gemv_q5_k_f32_id 134 registers (1 CTA of 8 warps an SM) and gemv_q6_k_f32_id / gemv_q8_0_f32_id
# enough for 2-3; they fit 80 / 64 registers without spills. Timed on the H200 (graph µs, T = 1, 128 x top-8 768x2048
# / 32 x top-4 1792x2048; bench/NOTES.md 2026-12-03): Q5_K 10.5 / 13.3 -> 8.2 / 10.0, Q6_K 7.7 / 8.9 -> 6.9 / 7.6,
# Q8_0 7.3 / 9.0 -> 7.2 / 8.8. Not here: the dense gemv_q6_k_f32_t1 at 4 (22.3 -> 23.9 on 4096x14336) or 2 (22.3).
# gemv_q4_k_f32_id, with the pair scale decode, FFMA weights and PRMT values (2026-12-03), takes 141 registers
# unbounded (1 CTA an SM): at 2 it ran those shapes in 7.0 / 8.2 µs, at 3 (80 registers) 6.4 / 7.7.
RESIDENCY: dict[str, int] = {"gemv_q4_k_f32_id": 3, "gemv_q5_k_f32_id": 3, "gemv_q6_k_f32_id": 4,
                             "gemv_q8_0_f32_id": 4}
# the steps whose groups all lie inside the row run without the per-lane block predicates (and the zero fills of
# their predicated loads), the rest after them as before: the same products in the same order; builds of up to
# PEEL_MAX_TOKENS tokens (the 16-token builds hold twice the accumulators: Q8_0's spills with the loop peeled)
PEEL = True
PEEL_MAX_TOKENS = 8
FORMATS = codecs.with_route("codec_gemv")
_LOAD = {2: "ld.global.nc.v2.f32", 4: "ld.global.nc.v4.f32"}


def dot_runs(b, runs, deltas, base, accs, pred=None, fma_pred=None, xb: int = 4) -> None:
    """accs[r] += the codec's fp32 weights of row r (`runs[r]`, at element `deltas` from `base`, an fp32 row of x)
    times x, one FFMA each in order; x by 16-byte loads (8-byte for runs of 2), zero where `pred` is false; the
    FFMAs only where `fma_pred` is (None: always). A factored run — a wide codec's (values, scale) or (values,
    scale, −min) — sums values·x (and x, once for all rows) first, then adds scale·Σvx (and −min·Σx) where `pred`
    holds. `xb` 2: x is fp16 (8-byte loads of 4 values, each widened exactly; zeros where `pred` is false)."""
    for i, delta in enumerate(deltas):
        factored = isinstance(runs[0][i], tuple)
        width = len(runs[0][i][0] if factored else runs[0][i])
        part = [b.op("mov.f32", Imm(0.0, "f32")) for _ in accs] if factored else accs
        xsum = b.op("mov.f32", Imm(0.0, "f32")) if factored and len(runs[0][i]) == 3 else None
        for c0 in range(0, width, 4):
            n = min(4, width - c0)
            if xb == 2:
                hs = [b.op("mov.b16", Imm(0, "b16")) for _ in range(n)]
                b.emit(f"ld.global.nc.v{n}.b16", b.vec(hs), Mem(base, 2 * (delta + c0)), pred=pred)
                xs = [b.op("cvt.f32.f16", h) for h in hs]
            else:
                xs = [b.op("mov.f32", Imm(0.0, "f32")) for _ in range(n)]
                b.emit(_LOAD[n], b.vec(xs), Mem(base, 4 * (delta + c0)), pred=pred)
            for row_runs, acc in zip(runs, part):
                vals = row_runs[i][0] if factored else row_runs[i]
                for wv, xv in zip(vals[c0:c0 + n], xs):
                    b.emit("fma.rn.f32", acc, wv, xv, acc, pred=fma_pred)
            if xsum is not None:
                for xv in xs:
                    b.emit("add.rn.f32", xsum, xsum, xv)
        if factored:
            for row_runs, p, acc in zip(runs, part, accs):
                b.emit("fma.rn.f32", acc, row_runs[i][1], p, acc, pred=pred)
                if xsum is not None:
                    b.emit("fma.rn.f32", acc, row_runs[i][2], xsum, acc, pred=pred)


def name(fmt: str, nt: int) -> str:
    return CodecKernel("gemv", fmt, nt).name


def name_id(fmt: str, x16: bool = False) -> str:
    return CodecKernel("gemv_id", fmt, x16=x16).name


def name_idg(fmt: str, x16: bool = False) -> str:
    return CodecKernel("gemv_idg", fmt, x16=x16).name


def _both(b, p, q):
    return q if p is None else p if q is None else b.op("and.pred", p, q)


def prefetch_rows(b, rowp, row_end, byte0, span: int, lane) -> None:
    """Each row's bytes [byte0, byte0 + span) (its next steps) asked of L2: lane L takes the 32 bytes at 32·L, rows
    one after another (ceil(span / 32) lanes each, one instruction per 32 lanes); nothing past the row's end.
    Fire and forget: no register waits for it, so the loads a step makes later find their bytes in L2 (a decode
    GEMV's loads come in dependent steps; this keeps more of the row's bytes in flight from HBM)."""
    per = -(-span // 32)
    lane32 = b.op("add.u32", byte0, b.op("shl.b32", lane, Imm(5, "u32")))  # byte0 + 32·L
    for i in range(-(-len(rowp) * per // 32)):
        for r, (p, end) in enumerate(zip(rowp, row_end)):
            lo, hi = max(r * per - 32 * i, 0), min((r + 1) * per - 32 * i, 32)  # this instruction's lanes for row r
            if lo >= hi:
                continue
            at = b.op("add.s64", p, b.op("cvt.u64.u32", b.op("add.s32", lane32, Imm(32 * (32 * i - r * per), "s32"),
                                                              type="u32")))  # garbage below lo: not issued
            ok = b.op("and.pred", b.op("setp.lt.u64", at, end), b.op("and.pred", b.op(
                "setp.ge.u32", lane, Imm(lo, "u32")), b.op("setp.lt.u32", lane, Imm(hi, "u32"))))
            b.emit("prefetch.global.L2", Mem(at), pred=ok)


def _route_to_expert(b, W, X, Y, M, K, xb: int = 4):
    """The MoE build's pair p = ctaid.y (token p / slots, slot p % slots): W moved to expert ids[p]'s matrix (expert
    0's where the id is out of range, so every load stays inside w), X to its activation row (the token's, or the
    pair's with x_per_slot; `xb` bytes a value), Y to output row p. Returns (W, X, Y, the predicate "ids[p] is out of
    range")."""
    e_p, eb_p, ids_p = b.param("experts", "u32"), b.param("expert_bytes", "u64"), b.param("ids", "u64", "ptr:in")
    s_p, xs_p = b.param("slots", "u32"), b.param("x_per_slot", "u32")
    pair = b.special("ctaid.y")
    e = b.op("ld.global.nc.u32", Mem(b.op("mad.wide.u32", pair, Imm(4, "u32"), b.ptr(ids_p))))  # int32 ids as u32
    bad = b.op("setp.ge.u32", e, b.ld_param(e_p, "u32"))  # negative ids are past any E as u32
    e = b.op("selp.b32", Imm(0, "b32"), e, bad)
    W = b.op("mad.lo.u64", b.op("cvt.u64.u32", e), b.ld_param(eb_p, "u64"), W)
    tok = b.op("div.u32", pair, b.ld_param(s_p, "u32"))
    xr = b.op("selp.b32", pair, tok, b.op("setp.ne.u32", b.ld_param(xs_p, "u32"), Imm(0, "u32")))
    X = b.op("mad.wide.u32", b.op("mul.lo.u32", xr, K), Imm(xb, "u32"), X)
    Y = b.op("mad.wide.u32", b.op("mul.lo.u32", pair, M), Imm(4, "u32"), Y)
    return W, X, Y, bad


GATED_EXPERT_CTAS = 4  # grid.y of the gated grouped GEMV (mul_mat_id's exact recompute behind the grouped GEMM);
# 0 plans no gated GEMV: a probe's diagnostic of what the gate costs (study_moe_levers L1's ceiling), never shipped
GROUPED_SHAPE = (2, 2)  # the grouped MoE GEMV's (rows per warp, groups per step): SHAPE[8]'s 4 rows spill there
WINDOW_CHUNKS = 4  # the grouped MoE GEMV scans the ids in windows of 32·WARPS·WINDOW_CHUNKS pairs
WINDOW = 32 * WARPS * WINDOW_CHUNKS


def _window_scan(b, e, E, ntok, ids, win0, lane, wid, list_at, counts_at):
    """The grouped MoE build's scan of one window of the ids, by the whole CTA: the pairs in [win0, win0 + WINDOW)
    (below `ntok`) routed to expert e — expert 0's CTAs also take those whose id is out of range, flagged by bit 31
    — written in pair order to the shared list at `list_at`. Warp w scans pairs win0 + 128·w .. + 127 (a shuffle
    prefix sum ranks its matches), the warps' counts meet in shared memory (`counts_at`), then each match is
    stored at its warp's offset plus its rank. Ends with bar.sync (the list complete). Returns the window's count."""
    first_e = b.op("setp.eq.u32", e, Imm(0, "u32"))
    base = b.op("mov.u32", Imm(0, "u32"))
    found = []
    for c in range(WINDOW_CHUNKS):
        idx = b.op("add.u32", b.op("add.u32", win0, b.op("mad.lo.u32", wid, Imm(32 * WINDOW_CHUNKS, "u32"),
                                                          Imm(32 * c, "u32"))), lane)
        here = b.op("setp.lt.u32", idx, ntok)
        v = b.op("mov.u32", Imm(0xFFFFFFFF, "u32"))
        b.emit("ld.global.nc.u32", v, Mem(b.op("mad.wide.u32", idx, Imm(4, "u32"), ids)), pred=here)
        stray = b.op("and.pred", b.op("and.pred", first_e, here), b.op("setp.ge.u32", v, E))  # out of range → e = 0
        match = b.op("or.pred", b.op("setp.eq.u32", v, e), stray)
        flag = b.op("selp.b32", Imm(1, "b32"), Imm(0, "b32"), match)
        sc = flag
        for off in (1, 2, 4, 8, 16):  # inclusive prefix sum of the flags over the warp
            o = b.op("shfl.sync.up.b32", sc, Imm(off, "u32"), Imm(0, "u32"), Imm(0xFFFFFFFF, "b32"), type="u32")
            sc = b.op("add.u32", sc, b.op("selp.b32", o, Imm(0, "b32"), b.op("setp.ge.u32", lane, Imm(off, "u32"))))
        rank = b.op("sub.u32", b.op("add.u32", base, sc), flag)
        tagged = b.op("or.b32", idx, b.op("selp.b32", Imm(0x80000000, "b32"), Imm(0, "b32"), stray))
        found.append((match, rank, tagged))
        base = b.op("add.u32", base, b.op("shfl.sync.idx.b32", sc, Imm(31, "u32"), Imm(31, "u32"),
                                          Imm(0xFFFFFFFF, "b32"), type="u32"))
    b.emit("st.shared.u32", Mem(b.op("mad.lo.u32", wid, Imm(4, "u32"), counts_at)), base,
           pred=b.op("setp.eq.u32", lane, Imm(0, "u32")))
    b.emit("bar.sync", Imm(0, "u32"))
    offset, total = b.op("mov.u32", Imm(0, "u32")), b.op("mov.u32", Imm(0, "u32"))
    for w in range(WARPS):  # this warp's offset: the counts of the warps before it; the window's total
        cw = b.op("ld.shared.u32", Mem(counts_at, 4 * w))
        b.emit("add.u32", offset, offset, cw, pred=b.op("setp.gt.u32", wid, Imm(w, "u32")))
        b.emit("add.u32", total, total, cw)
    for match, rank, tagged in found:
        b.emit("st.shared.u32", Mem(b.op("mad.lo.u32", b.op("add.u32", offset, rank), Imm(4, "u32"), list_at)),
               tagged, pred=match)
    b.emit("bar.sync", Imm(0, "u32"))
    return total


def _pass_pairs(b, mine, q, total, nt, M, K, X, slots_n, per_slot, xb: int = 4):
    """One pass of the grouped MoE build over up to `nt` of the window's matched pairs (the CTA's shared list at
    `mine`), from match q: per pair its live predicate, activation row address (`xb` bytes a value), output row
    index and out-of-range flag."""
    cnt = b.op("min.u32", b.op("sub.u32", total, q), Imm(nt, "u32"))
    live, xrow, yidx, bad = [], [], [], []
    for t in range(nt):
        lv = b.op("setp.gt.u32", cnt, Imm(t, "u32"))
        v = b.op("mov.u32", Imm(0, "u32"))
        b.emit("ld.shared.u32", v, Mem(b.op("mad.lo.u32", b.op("add.u32", q, Imm(t, "u32")), Imm(4, "u32"), mine)),
               pred=lv)
        p = b.op("and.b32", v, Imm(0x7FFFFFFF, "b32"))
        xr = b.op("selp.b32", p, b.op("div.u32", p, slots_n), per_slot)
        live.append(lv if t else None)  # the pass runs only with a first pair
        xrow.append(b.op("mad.wide.u32", b.op("mul.lo.u32", xr, K), Imm(xb, "u32"), X))
        yidx.append(p)
        bad.append(b.op("setp.ne.u32", b.op("and.b32", v, Imm(0x80000000, "b32")), Imm(0, "u32")))
    return live, xrow, yidx, bad


def tuned_shape(fmt: str, nt: int, moe: str | None = None) -> tuple[int, int, bool]:
    """(rows per warp, groups per step, wide lanes) of a build: TUNED_PAIR / TUNED where measured, else SHAPE (GROUPED_SHAPE for
    the grouped MoE GEMV) with the codec's wide lanes where it has them, as many bytes per step in half the groups."""
    codec = codecs.get(fmt)
    has_wide = hasattr(codec, "dequant_lane_wide")
    if moe == "pair" and nt in TUNED_PAIR.get(fmt, {}):
        rows, unroll, wide = TUNED_PAIR[fmt][nt]
        return rows, unroll, wide and has_wide
    if moe != "grouped" and nt in TUNED.get(fmt, {}):
        rows, unroll, wide = TUNED[fmt][nt]
        return rows, unroll, wide and has_wide
    rows, unroll = GROUPED_SHAPE if moe == "grouped" else SHAPE[nt]
    return (rows, max(1, unroll // codec.WIDE_BLOCKS), True) if has_wide else (rows, unroll, False)


def build(arch, fmt: str, nt: int, shape: tuple | None = None, ahead: int | None = None, moe: str | None = None,
          wide: bool | None = None, x16: bool = False):
    """`shape` (rows per warp, groups per step) and `ahead` (steps; 0: no prefetch) instead of the tuned ones (tuned_shape)
    and AHEAD, for an A/B built in-process (the shipped values' timings: bench/NOTES.md, 2026-12-01, evening and
    night; bench/probe_build_ab.py varies TUNED / SHAPE / AHEAD instead). `moe`: mul_mat_id's decode GEMVs — "pair":
    gemv_<fmt>_f32_id, one token per (token, slot) pair, grid.y the pairs; "grouped": gemv_<fmt>_f32_idg, grid.y the
    experts, each CTA's warps take the pairs routed to their expert nt at a time, so an expert's weights are read once
    per nt of its pairs. An out-of-range expert id writes NaN over its pair's row (expert 0's weights are read in its
    place). `wide` (default: the tuned choice) takes the codec's dequant_lane_wide: 16 weights a lane, its blocks per
    step WIDE_BLOCKS (fewer instructions per weight: the scales and addresses of a lane serve twice the weights).
    `x16`: x is fp16, each value widened exactly as it is loaded — gemv_<fmt>_f32_t<nt>_x16 (and the MoE GEMVs'
    gemv_<fmt>_f32_id(g)_x16), the bits of the fp32 build on the same values, without convert_f32's launch ahead of
    it."""
    codec = codecs.get(fmt)
    rows, unroll, tuned_wide = tuned_shape(fmt, nt, moe)
    wide = tuned_wide if wide is None else wide
    if shape:
        rows, unroll = shape
    ahead = (AHEAD_PAIR if moe == "pair" else AHEAD) if ahead is None else ahead
    lanes = codec.dequant_lane_wide if wide else codec.dequant_lane
    group_blocks = codec.WIDE_BLOCKS if wide else codec.GROUP_BLOCKS
    group_bytes = group_blocks * codec.BLOCK_BYTES
    what = {None: f"{fmt} GEMV (exact, fp32 x), up to {nt} token(s)",
            "pair": f"{fmt} MoE GEMV (exact, fp32 x), one token per (token, slot) pair against its expert",
            "grouped": f"{fmt} MoE GEMV (exact, fp32 x), per expert its pairs {nt} at a time"}[moe]
    kname = {None: CodecKernel("gemv", fmt, nt, x16=x16).name, "pair": name_id(fmt, x16),
             "grouped": name_idg(fmt, x16)}[moe]
    if x16:
        what = what.replace("fp32 x", "fp16 x")
    b = KernelBuilder(kname, arch, f"{what}, {rows} row(s) per warp, "
                      f"{unroll} group(s) per step, weights decoded by the codec as ggml's", block=(32 * WARPS, 1, 1))
    w_p, x_p, y_p = b.param("w", "u64", "ptr:in"), b.param("x", "u64", "ptr:in"), b.param("y", "u64", "ptr:out")
    m_p, k_p, n_p = b.param("m", "u32"), b.param("k", "u32"), b.param("ntok", "u32")
    b.directives += [f".maxntid {32 * WARPS}, 1, 1"]
    kp_launch = moe is None and nt == RUNTIME_KPARTS_TOKENS  # the build takes the kparts launch parameter
    kp_p = b.param("kparts", "u32") if kp_launch else None
    ctas = RESIDENCY.get(kname)
    if ctas:  # launch bounds: the registers ptxas may take so that `ctas` CTAs fit an SM
        b.directives.append(f".minnctapersm {ctas}")
        b.meta.update(ctas_per_sm=ctas)
    b.meta.update(tokens=nt, rows_per_cta=WARPS * rows, warps=WARPS, rows_per_warp=rows, unroll=unroll,
                  ahead=ahead, group_k=group_blocks * codec.BLOCK_K,
                  grid="ceil(m / rows_per_cta)", fmt=fmt, mode="exact",
                  activation=f"{'fp16' if x16 else 'fp32'} x (T, K), 16-byte aligned rows", k_multiple=codec.BLOCK_K,
                  layout="gguf rows")
    if moe:
        b.meta.update(grid=f"(ceil(m / rows_per_cta), {'pairs' if moe == 'pair' else 'experts'})",
                      activation=f"{'fp16' if x16 else 'fp32'} x (T, K) or (T, slots, K), 16-byte aligned rows; ids "
                                 "(T, slots) int32",
                      experts="w holds `experts` matrices of m rows, expert_bytes apart")
    if moe == "grouped":
        b.meta.update(window=WINDOW, ntok="the number of (token, slot) pairs")
    # one kernel per call: it waits for whatever wrote x before it reads anything; the GEMV (and the pair MoE one)
    # let the next op launch once their K loop is done (at the head, Q8_0 at T = 1 ran 29 → 42 µs behind PDL)
    b.pdl_head(trigger=moe == "grouped")
    W, X, Y = b.ptr(w_p), b.ptr(x_p), b.ptr(y_p)
    M, K, ntok = b.ld_param(m_p, "u32"), b.ld_param(k_p, "u32"), b.ld_param(n_p, "u32")
    if x16:
        b.meta["x16"] = True
    xb = 2 if x16 else 4
    if moe == "grouped":
        return _grouped(b, codec, lanes, (W, X, Y, M, K, ntok), rows, unroll, ahead, group_blocks, group_bytes, nt,
                        xb)
    bad = None
    if moe == "pair":
        W, X, Y, bad = _route_to_expert(b, W, X, Y, M, K, xb)
    tid = b.special("tid.x")
    lane = b.op("and.b32", tid, Imm(31, "b32"))
    done = b.label("done")
    if not kp_launch:
        row0 = b.op("mul.lo.u32", b.op("mad.lo.u32", b.special("ctaid.x"), Imm(WARPS, "u32"),
                                       b.op("shr.u32", tid, Imm(5, "u32"))), Imm(rows, "u32"))
        b.bra(done, pred=b.op("setp.ge.u32", row0, M))  # a warp past M: nothing to do (warp-uniform)
    else:  # warp w: row group w / kparts of the CTA's, part w % kparts; past M it still meets the CTA barrier
        b.meta.update(kparts_param=True, grid="ceil(m * kparts / rows_per_cta)",  # (rows_per_cta: at kparts 1)
                      kparts="warps a row: 1, 2, 4 or 8 (ops.codec_gemv_k_parts)")
        kparts = b.ld_param(kp_p, "u32")
        wid = b.op("shr.u32", tid, Imm(5, "u32"))
        grp = b.op("div.u32", wid, kparts)
        part = b.op("sub.u32", wid, b.op("mul.lo.u32", grp, kparts))
        row0 = b.op("mul.lo.u32", b.op("mad.lo.u32", b.special("ctaid.x"), b.op("div.u32", Imm(WARPS, "u32"), kparts),
                                       grp), Imm(rows, "u32"))
        summed = b.label("k_parts_sum")
    nblk = b.op("div.u32", K, Imm(codec.BLOCK_K, "u32"))
    stride = b.op("mul.lo.u32", nblk, Imm(codec.BLOCK_BYTES, "u32"))
    last_row = b.op("sub.u32", M, Imm(1, "u32"))
    row = [row0] + [b.op("add.u32", row0, Imm(r, "u32")) for r in range(1, rows)]
    rowp = [b.op("mad.wide.u32", row[0], stride, W)] + [  # a row past M reads row M - 1 and stores nothing
        b.op("mad.wide.u32", b.op("min.u32", row[r], last_row), stride, W) for r in range(1, rows)]
    ngroups = b.op("div.u32", b.op("add.u32", nblk, Imm(group_blocks - 1, "u32")), Imm(group_blocks, "u32"))
    last_group = b.op("sub.u32", ngroups, Imm(1, "u32"))
    live = [b.op("setp.gt.u32", ntok, Imm(t, "u32")) if t else None for t in range(nt)]  # token 0 always exists
    xrow = [b.op("mad.wide.u32", K, Imm(xb * t, "u32"), X) for t in range(nt)]
    yidx, bads = [Imm(t, "u32") for t in range(nt)], [bad] * nt
    acc = [[b.op("mov.f32", Imm(0.0, "f32")) for _ in range(rows)] for _ in range(nt)]
    row_end = [b.op("add.s64", p, b.op("cvt.u64.u32", stride)) for p in rowp]
    span = None
    if kp_launch:  # this part's groups [g0, g1): ceil(ngroups / kparts) each, the last parts' possibly fewer or none
        per = b.op("div.u32", b.op("add.u32", ngroups, b.op("sub.u32", kparts, Imm(1, "u32"))), kparts)
        g0 = b.op("mul.lo.u32", part, per)
        g1 = b.op("min.u32", b.op("add.u32", g0, per), ngroups)
        b.bra(summed, pred=b.op("or.pred", b.op("setp.ge.u32", row0, M), b.op("setp.ge.u32", g0, g1)))
        span = (g0, g1)
    _k_loop(b, lanes, rowp, row_end, xrow, live, acc, lane, nblk, ngroups, last_group, unroll, ahead, group_bytes,
            group_blocks, xb, span)
    if kp_launch:
        b.place(summed)
    b.pdl_trigger()
    lead = b.op("setp.eq.u32", lane, Imm(0, "u32"))
    if kp_launch:
        _sum_parts(b, acc, kparts, part, grp, lead)
        lead = b.op("and.pred", lead, b.op("setp.eq.u32", part, Imm(0, "u32")))
    _store_rows(b, acc, lambda r: (b.op("and.pred", lead, b.op("setp.lt.u32", row[r], M)) if r or kp_launch else lead),
                row, M, Y, yidx, bads, live)
    b.place(done)
    b.emit("ret")
    return b.finish()


def _sum_parts(b, acc, kparts, part, grp, lead) -> None:
    """K parts (the kparts parameter): each warp's sums over the warp, written by its lane 0 to the CTA's shared
    memory, then every lane of a row group's part 0 replaces its acc with the parts' sums added in part order (so
    _store_rows' warp sum of them — 31 lanes of zeros and lane 0's total — is that total). kparts 1: nothing (no
    barrier; _store_rows sums the warp's own)."""
    nt, rows = len(acc), len(acc[0])
    per_warp = 4 * nt * rows
    alone = b.label("k_parts_alone")
    b.bra(alone, pred=b.op("setp.eq.u32", kparts, Imm(1, "u32")))  # (uniform: a launch parameter)
    buf = b.op("mov.u32", b.shared_buffer("k_parts", per_warp * WARPS), type="u32")
    first = b.op("mad.lo.u32", b.op("mul.lo.u32", grp, kparts), Imm(per_warp, "u32"), buf)
    mine = b.op("mad.lo.u32", part, Imm(per_warp, "u32"), first)
    for t in range(nt):
        for r in range(rows):
            b.emit("st.shared.f32", Mem(mine, 4 * (t * rows + r)), warp_sum(b, acc[t][r]), pred=lead)
    b.emit("bar.sync", Imm(0, "u32"))
    more = {q: b.op("setp.gt.u32", kparts, Imm(q, "u32")) for q in range(1, WARPS)}  # part q exists
    for t in range(nt):
        for r in range(rows):
            s = b.op("ld.shared.f32", Mem(first, 4 * (t * rows + r)))
            for q in range(1, WARPS):
                v = b.reg("f32")
                b.emit("ld.shared.f32", v, Mem(first, per_warp * q + 4 * (t * rows + r)), pred=more[q])
                b.emit("add.rn.f32", s, s, v, pred=more[q])
            b.emit("selp.f32", acc[t][r], s, Imm(0.0, "f32"), lead)
    b.place(alone)


def _store_rows(b, acc, stored, row, M, Y, yidx, bads, live) -> None:
    """Each row's sums over the warp, stored by lane 0 at y[yidx[t], row] where `stored(r)` (made as row r's turn
    comes) and the token's `live` hold; NaN where `bads[t]` (an out-of-range expert id)."""
    for r in range(len(row)):
        ok = stored(r)
        for t in range(len(yidx)):
            s = warp_sum(b, acc[t][r])
            if bads[t] is not None:  # an out-of-range expert id: NaN over the pair's row
                s = b.op("selp.f32", Imm(float("nan"), "f32"), s, bads[t])
            b.emit("st.global.f32", Mem(b.op("mad.wide.u32", b.op("mad.lo.u32", M, yidx[t], row[r]), Imm(4, "u32"),
                                              Y)), s, pred=_both(b, ok, live[t]))


def _grouped(b, codec, lanes, args, rows, unroll, ahead, group_blocks, group_bytes, nt, xb: int = 4):
    """gemv_<fmt>_f32_idg's body: grid.y the experts; the CTA scans the ids a window at a time (_window_scan) for
    the pairs routed to its expert e and runs the nt-token GEMV over them nt at a time (expert e's weights, read
    once per nt of its pairs in the window). Every warp takes part in the scans (CTA barriers): a warp past M reads
    row M - 1 and stores nothing."""
    W, X, Y, M, K, ntok = args
    e_p, eb_p, ids_p = b.param("experts", "u32"), b.param("expert_bytes", "u64"), b.param("ids", "u64", "ptr:in")
    s_p, xs_p = b.param("slots", "u32"), b.param("x_per_slot", "u32")
    gate = b.ld_param(b.param("gate", "u64"), "u64")  # 0, or a u32 the kernel must find non-zero to run at all:
    # mul_mat_id's exact recompute behind the grouped GEMM, which raises it (the workspace's zero-kept flag) when an
    # activation overflowed fp16; then the last CTA out (an arrival count in `done`) lowers it and `done` again
    done_p = b.param("done", "u64")
    gated, open_ = b.label("gated"), b.reg("pred")
    b.emit("setp.ne.u64", open_, gate, Imm(0, "u64"))
    b.bra(gated, pred=b.op("not.pred", open_))
    b.emit("ret", pred=b.op("setp.eq.u32", b.op("ld.global.u32", Mem(b.op("cvta.to.global.u64", gate))), Imm(0, "u32")))
    b.place(gated)
    list_at = b.op("mov.u32", b.shared_buffer("pairs", 4 * WINDOW), type="u32")
    counts_at = b.op("mov.u32", b.shared_buffer("counts", 4 * WARPS), type="u32")
    tid = b.special("tid.x")
    lane, wid = b.op("and.b32", tid, Imm(31, "b32")), b.op("shr.u32", tid, Imm(5, "u32"))
    E, ids, EB = b.ld_param(e_p, "u32"), b.ptr(ids_p), b.ld_param(eb_p, "u64")
    slots_n = b.ld_param(s_p, "u32")
    per_slot = b.op("setp.ne.u32", b.ld_param(xs_p, "u32"), Imm(0, "u32"))
    row0 = b.op("mul.lo.u32", b.op("mad.lo.u32", b.special("ctaid.x"), Imm(WARPS, "u32"), wid), Imm(rows, "u32"))
    nblk = b.op("div.u32", K, Imm(codec.BLOCK_K, "u32"))
    stride = b.op("mul.lo.u32", nblk, Imm(codec.BLOCK_BYTES, "u32"))
    last_row = b.op("sub.u32", M, Imm(1, "u32"))
    row = [row0] + [b.op("add.u32", row0, Imm(r, "u32")) for r in range(1, rows)]
    ngroups = b.op("div.u32", b.op("add.u32", nblk, Imm(group_blocks - 1, "u32")), Imm(group_blocks, "u32"))
    last_group = b.op("sub.u32", ngroups, Imm(1, "u32"))
    lead = b.op("setp.eq.u32", lane, Imm(0, "u32"))
    stored = [b.op("and.pred", lead, b.op("setp.lt.u32", r_, M)) for r_ in row]
    window, next_window, done = b.label("window"), b.label("next_window"), b.label("done")
    # experts ctaid.y, + nctaid.y, ... below E: one each where grid.y = E (mul_mat_id's GEMV route); the gated
    # recompute launches grid.y = min(E, GATED_EXPERT_CTAS), so a closed gate sends few CTAs home
    e = b.op("mov.u32", b.special("ctaid.y"))
    expert = b.label("expert")
    b.place(expert)
    b.bra(done, pred=b.op("setp.ge.u32", e, E))
    W_e = b.op("mad.lo.u64", b.op("cvt.u64.u32", e), EB, W)
    rowp = [b.op("mad.wide.u32", b.op("min.u32", r_, last_row), stride, W_e) for r_ in row]
    row_end = [b.op("add.s64", p, b.op("cvt.u64.u32", stride)) for p in rowp]
    win0 = b.op("mov.u32", Imm(0, "u32"))
    b.place(window)
    total = _window_scan(b, e, E, ntok, ids, win0, lane, wid, list_at, counts_at)
    b.bra(next_window, pred=b.op("setp.eq.u32", total, Imm(0, "u32")))  # none of this window's pairs is e's
    q = b.op("mov.u32", Imm(0, "u32"))
    next_pass = b.label("pass")
    b.place(next_pass)
    live, xrow, yidx, bads = _pass_pairs(b, list_at, q, total, nt, M, K, X, slots_n, per_slot, xb)
    acc = [[b.op("mov.f32", Imm(0.0, "f32")) for _ in range(rows)] for _ in range(nt)]
    _k_loop(b, lanes, rowp, row_end, xrow, live, acc, lane, nblk, ngroups, last_group, unroll, ahead, group_bytes,
            group_blocks, xb)
    _store_rows(b, acc, lambda r: stored[r], row, M, Y, yidx, bads, live)
    b.emit("add.u32", q, q, Imm(nt, "u32"))
    b.bra(next_pass, pred=b.op("setp.lt.u32", q, total))
    b.place(next_window)
    b.emit("bar.sync", Imm(0, "u32"))  # every warp is done with the list before the next scan writes it
    b.emit("add.u32", win0, win0, Imm(WINDOW, "u32"))
    b.bra(window, pred=b.op("setp.lt.u32", win0, ntok))
    b.emit("add.u32", e, e, b.special("nctaid.y"))
    b.bra(expert)
    b.place(done)
    _lower_gate(b, open_, gate, b.ld_param(done_p, "u64"), tid)
    b.emit("ret")
    return b.finish()


def _lower_gate(b, gated, gate, done, tid) -> None:
    """The gated launch's last CTA out lowers the gate and zeroes the arrival count `done` (every CTA read the gate
    before its thread 0 arrives, behind the barrier), so the next op of the stream finds both zero."""
    out = b.label("gate_kept")
    b.bra(out, pred=b.op("not.pred", gated))
    b.emit("bar.sync", Imm(0, "u32"))
    b.bra(out, pred=b.op("setp.ne.u32", tid, Imm(0, "u32")), uniform=False)
    b.emit("membar.gl")
    D = b.op("cvta.to.global.u64", done)
    ctas = b.op("mul.lo.u32", b.special("nctaid.x"), b.special("nctaid.y"))
    arrived = b.op("atom.global.add.u32", Mem(D), Imm(1, "u32"))
    b.bra(out, pred=b.op("setp.ne.u32", arrived, b.op("sub.u32", ctas, Imm(1, "u32"))), uniform=False)
    b.emit("st.global.u32", Mem(b.op("cvta.to.global.u64", gate)), Imm(0, "u32"))
    b.emit("st.global.u32", Mem(D), Imm(0, "u32"))
    b.place(out)


def _k_loop(b, lanes, rowp, row_end, xrow, live, acc, lane, nblk, ngroups, last_group, unroll, ahead, group_bytes,
            group_blocks, xb: int = 4, span=None):
    """The GEMV's walk along K: per step `unroll` groups of each row decoded by the codec's `lanes`, then times x
    (one FFMA per weight and token, in K order), the rows' bytes asked of L2 `ahead` steps before. `span`: (g0, g1),
    the groups of a K part (kparts; g0 < g1), else all of them."""
    rows, nt = len(rowp), len(xrow)
    if span is None:
        g = b.op("mov.u32", Imm(0, "u32"))
    else:  # the part's groups stand in for the row's: its end bounds the steps, its last group the clamped loads
        g, ngroups = b.op("mov.u32", span[0]), span[1]
        last_group = b.op("sub.u32", ngroups, Imm(1, "u32"))
    if ahead:  # the first steps' bytes, then each step the bytes `ahead` steps further
        byte0 = b.op("mov.u32", Imm(0, "u32")) if span is None else b.op("mul.lo.u32", g, Imm(group_bytes, "u32"))
        prefetch_rows(b, rowp, row_end, byte0, ahead * unroll * group_bytes, lane)

    def step(whole: bool):  # one step of `unroll` groups; whole: every group inside the row (no predicates)
        if ahead:
            prefetch_rows(b, rowp, row_end, b.op("mul.lo.u32", b.op("add.u32", g, Imm(ahead * unroll, "u32")),
                                                 Imm(group_bytes, "u32")), unroll * group_bytes, lane)
        slots = []  # per group of the step: (its runs per row, offsets, the codec's valid, the group's own predicate)
        for u in range(unroll):
            gu, in_row = g, None
            if u:
                gu = b.op("add.u32", g, Imm(u, "u32"))
                if not whole:
                    in_row = b.op("setp.lt.u32", gu, ngroups)
                    gu = b.op("min.u32", gu, last_group)
            decoded = [lanes(b, rowp[r], gu, lane, None if whole else nblk, f32=True) for r in range(rows)]
            slots.append(([runs for runs, _, _ in decoded], decoded[0][1], decoded[0][2], in_row))
        for runs, offsets, valid, in_row in slots:
            first, deltas = offsets()
            for t in range(nt):
                pred = _both(b, valid, live[t])
                dot_runs(b, runs, deltas, b.op("mad.wide.u32", first, Imm(xb, "u32"), xrow[t]), acc[t],
                         _both(b, pred, in_row), in_row, xb)
        b.emit("add.u32", g, g, Imm(unroll, "u32"))

    if not (PEEL and nt <= PEEL_MAX_TOKENS):
        loop = b.label("step")
        b.place(loop)
        step(False)
        b.bra(loop, pred=b.op("setp.lt.u32", g, ngroups))
        return
    # whole steps while their groups lie inside the row (g + unroll ≤ nblk / group_blocks), then the rest as above
    whole = b.op("div.u32", nblk, Imm(group_blocks, "u32"))
    if span is not None:  # ... and inside the part
        whole = b.op("min.u32", whole, ngroups)
    main, tail, end = b.label("step_whole"), b.label("step_tail"), b.label("steps_done")
    b.bra(tail, pred=b.op("setp.gt.u32", b.op("add.u32", g, Imm(unroll, "u32")), whole))
    b.place(main)
    step(True)
    b.bra(main, pred=b.op("setp.le.u32", b.op("add.u32", g, Imm(unroll, "u32")), whole))
    b.place(tail)
    b.bra(end, pred=b.op("setp.ge.u32", g, ngroups))
    rest = b.label("step")
    b.place(rest)
    step(False)
    b.bra(rest, pred=b.op("setp.lt.u32", g, ngroups))
    b.place(end)


KERNELS = [KernelDef(name(f, nt), f"{f.upper()} decode GEMV, exact (fp32 x), up to {nt} token(s), weights by the codec",
                     lambda arch, f=f, nt=nt: build(arch, f, nt)) for f in FORMATS for nt in TOKENS]
# one-token calls on small weights (the route small_gemv, RULES.codec_gemv_t1_max_weights): a format whose decode
# otherwise needs an activation prep and a grid dependency (Q4_K's few-token builds) runs its codec GEMV there
KERNELS += [KernelDef(name(f, 1), f"{f.upper()} decode GEMV, exact (fp32 x), one token, weights by the codec (small "
                      "weights: one launch, no activation prep)", lambda arch, f=f: build(arch, f, 1))
            for f in codecs.with_route("small_gemv") if f not in FORMATS]
# the builds on fp16 x (a torch model's activations: no convert_f32 launch ahead of them), where the format's
# activation is x itself (not TQ4_1S's rotated x)
X16_FORMATS = tuple(f for f in FORMATS + tuple(g for g in codecs.with_route("small_gemv") if g not in FORMATS)
                    if not hasattr(codecs.get(f), "ROTATION"))
KERNELS += [KernelDef(CodecKernel("gemv", f, nt, x16=True).name, f"{name(f, nt)} on fp16 x (each value widened as "
                      "it is loaded)", lambda arch, f=f, nt=nt: build(arch, f, nt, x16=True))
            for f in X16_FORMATS for nt in (TOKENS if f in FORMATS else (1,))]
MOE_FORMATS = codecs.moe()  # (TQ4_1S's lanes give the rotated domain's W: mul_mat_id rotates x first)
KERNELS += [KernelDef(name_id(f), f"{f.upper()} MoE decode GEMV (mul_mat_id), exact, one (token, slot) pair per "
                      "grid row, weights by the codec", lambda arch, f=f: build(arch, f, 1, moe="pair"))
            for f in MOE_FORMATS]
KERNELS += [KernelDef(name_idg(f), f"{f.upper()} MoE decode GEMV (mul_mat_id), exact, per expert its pairs 8 at a "
                      "time (each expert's weights read once per 8 of its pairs)",
                      lambda arch, f=f: build(arch, f, 8, moe="grouped")) for f in MOE_FORMATS]
# their twins on fp16 x (mul_mat_id on a torch model's fp16 activations: no convert_f32 launch; TQ4_1S's read its
# rotation's fp32 output and have none)
KERNELS += [KernelDef(name_id(f, True), f"{name_id(f)} on fp16 x (each value widened as it is loaded)",
                      lambda arch, f=f: build(arch, f, 1, moe="pair", x16=True))
            for f in MOE_FORMATS if not hasattr(codecs.get(f), "ROTATION")]
KERNELS += [KernelDef(name_idg(f, True), f"{name_idg(f)} on fp16 x (each value widened as it is loaded)",
                      lambda arch, f=f: build(arch, f, 8, moe="grouped", x16=True))
            for f in MOE_FORMATS if not hasattr(codecs.get(f), "ROTATION")]
