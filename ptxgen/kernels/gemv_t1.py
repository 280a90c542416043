"""The few-token Q4_K tensor-core kernels on mma.sync, streaming raw super-blocks through a cp.async ring and
decoding A = q·sc in registers: gemv_q4_k_mma_t{1,2,4,8} (exact decode GEMVs), gemv_q4_k_mma_t16h (9-16
tokens, fp16 activations) and mmq_q4_k_rega_n32 (the skinny GEMM for token groups of 32, records shared by a
CTA's warps). The same builds run Q5_K (its codec's RegDecoder) and, exact up to 8 tokens and on fp16 activations
to 16, the codecs whose weights are a scale times an integer with no min (Q6_K, Q8_0: their mma_block, one MMA per
16-element sub-block and its scale in fp32 after it, _CodecStep, on prep_sub16_t*'s records), and TQ4_1S (not
shipped: slower than its lane GEMVs on an H100, rule codec_few_max_tokens; its codebook's fp16 hi and lo parts as
the two row halves of one MMA, looked up in a pair table in shared memory, on prep_rot16_t*'s records of the rotated
x; 438 SASS a warp-step of 16 rows x 256 weights at T = 1, Q4_K's 293).
The int8 builds gemv_<fmt>_i8_t* take the weights as the A of integer MMAs on digit planes of x: Q4_K's and Q5_K's
(_I8Step, a codec's I8A) u8 x s8 on prep_q4k_i8_t*'s (213 SASS a step at T = 1 for Q4_K), Q6_K's (_I8Q6Step) and
Q8_0's (_I8Q8Step: its quants as they lie, s8 x s8) on prep_q6k_i8_t*'s; shipped up to 2 / 4 / 8 / 8 tokens
(rule few_i8_max_tokens).

`gemv_q4_k_mma` does eight tokens' work at any T ≤ 8: at T = 1 it spends 409 SASS per warp-step of 16 rows x 256
weights (two MMAs per A fragment for the hi and lo activation tiles, every lane decoding all 8 sub-blocks'
scales of its two rows, B tiles in register sets). These builds are for few tokens:

- B column 2n holds token n's fp16 hi part, column 2n + 1 its lo part (x·2^s = hi + lo, one 2^s per super-block
  and token, `prep_q4k_t{nt}`), so one MMA per A fragment gives both for up to 4 tokens (8: two n8 tiles), and
  lane (g, t) holds token t's sums in C's columns 2t, 2t + 1. Columns past 2·nt are whatever the other lanes load
  (they read the first lanes' records again): no column mixes into another, and those outputs are never used.
  The hi-only records (t16h, n32) hold one column per token: fp16 activations, the min term from the same
  rounded values (relative error ~2e-4).
- Lane (g, t) owns qs chunk t of rows g and g + 8 (32 bytes each: sub-block 2t in the low nibbles, 2t + 1 in
  the high), so it decodes 2 scales per row per step, not 8. A = q·sc exactly in fp16: (w & 0x000F000F) |
  0x64006400 is (1024 + q) for bytes 0 and 2, the 0x00F000F0 mask gives 1024 + 16q, w >> 8 bytes 1 and 3, then
  one fma.f16x2 h·mult − 1024·mult (mult = sc or sc/16): 9 instructions per 8 weights.
- The mins take one MMA per step: A = (m_2t, m_2t+1) of rows g, g + 8, B = the scaled block sums (hi / lo,
  times 2^-6) of the record. Per step and row: y += 2^-s·(d·C − 64·dmin·MS) in fp32.
- Weights and activation records come through a per-warp ring in shared memory (cp.async, S stages of 16 rows x
  144 bytes + the record, 1072 / 2128 / 4240 bytes): bytes in flight without registers held, no barrier but the
  warp's own. A copy instruction takes 32 consecutive 16-byte chunks of the step's rows (~3.5 rows' 144
  contiguous bytes); warps on the same K part read the same records (.ca). K is split twice: the `kparts` warps of
  a row tile take contiguous parts of its run and sum them through shared memory at the end (no grid split where
  the row tiles x kparts fit one round: 4096x14336 runs 256 CTAs of 8 warps on one tile each), then over gridDim.y
  in contiguous runs with the last-warp fixup of the other GEMVs (deterministic both).

Measured on the H200 (bench/NOTES.md, 2026-11-30): the ring alone (no arithmetic) takes 17 µs of the 20 µs op on
4096x14336 — the copies bound it, not the 293 SASS per step; 16 rows x 32 bytes per copy instruction was 5 µs
slower, TMA boxes (36 words x 16 rows, as gemv_q4_k_mma) 3 µs slower, and reading the records from lanes 0-7
only, 3 stages at 5 CTAs or 2 at 6 within ±3%. The 2- and 4-token builds cost what the 1-token one does (19.5-20.4 µs
at T = 2-4 on 4096x14336, vs 22.9-23.3 for gemv_q4_k_mma), except on 18944x3584 at T = 3-4 (25 µs, equal).
"""
from __future__ import annotations

from ..arch import TARGETS, get_arch
from ..builder import KernelBuilder
from ..formats import tq4_1s as T4
from ..ir import Imm, Mem, Sym, ldmatrix, mma_sync
from ..specs import GemvKernel
from . import KernelDef, smem_fit
from .gemv import (_prep_record_stores, _scaled_item, _store_or_split, _sum_k_parts, _tile_rows, _warp_rows,
                   build_prep_mma)
from .gemv_mma_codec import phase_readers

T1_MAX_SPLITS = 32
# a diagnostic build (bench/probe_decode_trace.py), never shipped: without grid K splits, lane 0 of a CTA's first warp
# overwrites y[row0 .. row0 + 8] (its tile's first rows, after its own stores; tiles of ≥ 9 rows in y) with (%smid,
# %globaltimer_lo at entry, after the prologue (griddepcontrol.wait, the copies after it, the fused builds' records),
# when its first step's copies had landed, after its own K loop, after the stores (the K parts' sum before them)),
# then the 3 words of its first record's padding (gemv.PREP_TRACE's prep stamps, else zeros)
TRACE = False

# ring stages whose weights a token build leaves until after griddepcontrol.wait (with their records; the others are
# copied before it, while the prep kernel waits for the op before). Weights in flight when the wait ends delay the
# prep kernel: the previous GEMV's last end to this one's release took 4.8 µs with all 4 stages in flight, 3.0 with
# 2 (bench/probe_decode_trace.py). H200 graph µs over 24 weights, stages held 0 / 1 / 2 / 3: Q4_K 4096x14336 14.7 /
# 14.0 / 13.9 / 14.9, 14336x4096 13.2 / 12.5 / 13.7 / 14.8; held 0 / 1: Q5_K 15.7 / 15.2, 16.5 / 15.5; same bits
# (bench/NOTES.md, 2026-12-04, night). The TMA-ring GEMVs behind their preps (Q8_0's, TQ4_1S's) did not gain.
# The "big" plans only (sm_90a: measured there; sm_120a's 3-stage plan untimed). Two tokens, held 0 / 1 on an H100,
# graph µs (bench/results/h100_hold8_*_7d7a685.log; same bits): Q4_K 4096x14336 15.0 / 14.3, 14336x4096 15.0 / 14.6;
# Q5_K 17.5 / 17.2, 17.8 / 17.3 (their int8 t2 builds, 3 stages); 4 and 8 tokens mixed within ±0.9 µs (Q5_K T = 4
# 14336x4096 19.0 / 19.9): not held. The 2-stage two-token builds (Q6_K's and Q8_0's, Q5_K's fp16 one), where one
# stage is half the ring, are untimed with it and keep none (T1_HOLD_MIN_STAGES).
T1_HOLD = {1: 1, 2: 1}
T1_HOLD_MIN_STAGES = {2: 3}  # tokens -> the fewest ring stages a build holds T1_HOLD's stages in (absent: any)
# ... and the fused builds' (the eager calls' one-launch builds). Forced into the graph loop, the t1 fused build held
# 0 -> 1 ran 15.6 -> 14.5 µs (probe_decode_trace_fused_hold_0ed53fd.log); not shipped until its GPU tests run with it
FUSED_HOLD: dict[int, int] = {}
# the exact token builds without griddepcontrol.wait (a probe's build, not shipped): their prep (build_prep_mma's
# `ready`) counts its CTAs done in a zero-kept word (the `ready` parameter, last), and the GEMV's warp 0 spins until
# all have (acquire), so the records are read once they are stored rather than after the prep grid's completion
# reaches the GEMV (the second grid dependency of the chain between two ops; bench/NOTES.md, 2026-12-04). The prep
# counts, and lets this GEMV launch, only after its own griddepcontrol.wait: the op before has completed — and its
# GEMV zeroed the word, which every op shares — before this GEMV spins on it (a review found the race of the first
# version, whose prep triggered at its head: this GEMV resident early, passing on the op before's count)
T1_FLAG = False

# (ring stages, resident CTAs per SM, m16 tiles per warp, warps per CTA) by build and the SM's shared memory ("big":
# sm_90a's 227 KB per CTA; "small": sm_89 / sm_120a, 99 KB per CTA, ~100 KB per SM); a stage is 16 rows per tile x
# 144 bytes + one record. The warps of a CTA split into row tiles of `kparts` warps each (the launch's parameter, a
# power of two dividing the warps: a CTA of 6 takes 1 or 2): a tile's warps take contiguous parts of its K range and sum them in the CTA (ops.
# few_k_parts picks kparts so that the grid fits one round without grid K splits where it can: their tail — the
# partials' stores, a fence, the counter, the last warp's reloads — cost 1-2 µs an op; bench/NOTES.md, 2026-12-03)
T1_PLAN = {"big": {"t1": (4, 2, 1, 8), "t2": (3, 2, 1, 8), "t4": (2, 2, 1, 8), "t8": (2, 2, 1, 4), "t16h": (3, 1, 2, 4)},
           "small": {"t1": (3, 2, 1, 4), "t2": (2, 2, 1, 4), "t4": (2, 1, 1, 4), "t8": (2, 1, 1, 4),
                     "t16h": (2, 1, 1, 4)}}


# K-steps (super-blocks) per split at least, where measured to matter: the "small" t16h build (2 stages, 2 CTAs per
# SM on the H200) lost to its own fill and fixup at 4 steps per split — 4096² at T=16: 2 splits of 8 steps 14.2 µs,
# 4 of 4 15.0; 4096x14336 (56 steps) 4 splits 26.6 vs 2 27.9 (bench/results/probe_t16h_splits_session16.log); the
# "big" build (3 stages, PDL) is fastest at 4 steps per split there (13.9 vs 16.2)
T1_MIN_SPLIT_STEPS = {("small", "t16h"): 8}


def _suffix(nt: int, hi_only: bool) -> str:
    return f"t{nt}h" if hi_only else f"t{nt}"


# a format's own plans where its CTAs carry more than the rings (TQ4_1S: a 32 or 64 KB codebook table each): one CTA
# an SM with more warps rather than two with a table each (the defaults would leave t4 / t8 at 8 / 4 warps an SM), 2
# stages where the wide table then fits beside them (t1, t2, t4 on sm_90a; 3 with the narrow one); not timed yet
# (bench/NOTES.md, 2026-12-05, from 86f548c)
T1_PLAN_FMT = {"tq4_1s": {"big": {"t1": (2, 1, 1, 16), "t2": (2, 1, 1, 16), "t4": (2, 1, 1, 8), "t8": (2, 1, 1, 8)},
                          "small": {"t1": (2, 1, 1, 8), "t2": (2, 1, 1, 4), "t4": (2, 1, 1, 4)}}}
# ... and the codecs' 16-token hi-only builds on sm_90a, at one CTA an SM (shared memory): Q6_K at 8 warps of one
# tile, Q8_0 at 6 of two, against the shared plan's 4 of two. H100 graph µs over 24 weights at T = 16, 4 / 6 / 8
# warps (bench/results/h100_t16plan_*_d5e50e1.log; same bits): Q6_K 4096x14336 33.1 / 31.7 / 33.2, 14336x4096
# 32.9 / 33.3 / 26.0; Q8_0 4096x14336 35.1 / 34.5 / 35.1, 14336x4096 28.2 / 28.0 / 28.7
T1_PLAN_FMT["q6_K"] = {"big": {"t16h": (3, 1, 1, 8)}}
T1_PLAN_FMT["q8_0"] = {"big": {"t16h": (3, 1, 2, 6)}}


def _ring_plan(arch, nt: int, hi_only: bool = False, fmt: str = "q4_K") -> tuple[int, int, int, int]:
    """(stages, resident CTAs per SM, m16 tiles per warp, warps) of the build on `arch` (T1_PLAN, or the format's
    T1_PLAN_FMT)."""
    size, sfx = _plan_size(arch), _suffix(nt, hi_only)
    return T1_PLAN_FMT.get(fmt, {}).get(size, {}).get(sfx) or T1_PLAN[size][sfx]


def _fit(arch, S: int, ctas: int, stage_bytes: int, least: int = 2, extra: int = 0) -> tuple[int, int]:
    """(stages, CTAs an SM) of a plan made for Q4_K's 144-byte rows, for a format whose stages are larger (Q5_K's
    176): fewer stages (down to `least`) until `ctas` CTAs of S·stage_bytes + 128 bytes (+ `extra`: a codec's table)
    fit an SM (the opt-in limit + 1 KB, each CTA 1 KB besides its own, as kernels._resident counts), else fewer
    CTAs — so the launch bounds' .minnctapersm says what the SM holds. Q4_K's plans fit as they are."""
    def fits(s_, c_):
        return smem_fit(arch, s_ * stage_bytes + 128 + extra) >= c_
    while S > least and not fits(S, ctas):
        S -= 1
    while ctas > 1 and not fits(S, ctas):
        ctas -= 1
    return S, ctas


def _plan_size(arch) -> str:
    return "big" if arch.max_smem_per_block >= 200 * 1024 else "small"


def _warp_row_base(b, row0, M, nsb, block):
    """(a row's bytes, M - 1, the warp's first row): a warp wholly past M starts at row M - 1, and every row past M
    reads row M - 1 (_row_rel), so the copies stay inside the weights."""
    row_bytes = b.op("mul.lo.u32", nsb, Imm(block, "u32"))
    mlast = b.op("sub.u32", M, Imm(1, "u32"))
    return row_bytes, mlast, b.op("min.u32", row0, mlast)


def _warp_delta(b, rbase, row_bytes):
    """The warp's first row's start past the 16-byte boundary below it (a block not a multiple of 16 bytes)."""
    return b.op("and.b32", b.op("mul.lo.u32", rbase, row_bytes), Imm(15, "b32"))


def _row_rel(b, row0, row, mlast, rbase):
    """Row `row` of the warp (clamped to M - 1), counted from the warp's first row."""
    return b.op("sub.u32", b.op("min.u32", b.op("add.u32", row0, row), mlast), rbase)


def _ring_copies(b, *, R, lane, row0, M, nsb, W, rec, xi, nthr, rb, rec_at, cache, block, w_off=None, box=None,
                 slot=None):
    """The cp.async copy plan of the few-token rings: a warp's R rows of one super-block as chunks c = lane + 32u =
    9·row + column (16 bytes each, so one instruction copies ~3.5 rows' contiguous 144 bytes: measured 17% faster
    than 16 rows x 32 bytes; rows past M copy row M - 1, never stored) to w_off + 144·row + 16·column of a stage,
    and one record (rb bytes at rec + rb·step) as chunks xi + nthr·u to rec_at of the stage (`cache`: .ca or .cg).
    Returns (issue(jb, st, live, what): step jb into the stage at st, if `live` (the caller commits), w_off). w_off
    and rec may be callables, emitted where they are first needed (the order the measured builds were emitted in).
    `block`: a step's bytes a row (Q4_K's 144 = 9 columns, Q5_K's 176 = 11, Q8_0's 272 = 17). Where it is not a
    multiple of 16 (Q6_K's 210, 2-byte aligned) each row's step is copied as `box` bytes (a multiple of 16) from its
    16-byte aligned start, and lands at (_row_phase) 0-14 bytes into its slot; `slot`: a row's bytes in the stage
    (≥ box, default box)."""
    box = box or block
    slot = slot or box
    aligned = block % 16 == 0
    assert box % 16 == 0 and slot >= box and (aligned or box >= block + 14)
    cols = box // 16
    w_chunks = cols * R
    row_bytes, mlast, rbase = _warp_row_base(b, row0, M, nsb, block)
    w_warp = b.op("mad.wide.u32", rbase, row_bytes, W)  # (the offsets below stay 32-bit)
    delta = None
    if not aligned:  # from the 16-byte boundary at or below the warp's first row (W is 16-byte aligned)
        delta = _warp_delta(b, rbase, row_bytes)
        w_warp = b.op("sub.s64", w_warp, b.op("cvt.u64.u32", delta))
    w_off = w_off() if callable(w_off) else w_off
    wcopy = []
    for u in range(-(-w_chunks // 32)):
        c = b.op("add.u32", lane, Imm(32 * u, "u32"))
        row = b.op("div.u32", c, Imm(cols, "u32"))
        col16 = b.op("shl.b32", b.op("rem.u32", c, Imm(cols, "u32")), Imm(4, "u32"))
        rel = _row_rel(b, row0, row, mlast, rbase)
        src = b.op("mad.lo.u32", rel, row_bytes, col16 if aligned else delta)  # unaligned: the row's start
        dst = col16 if w_off is None else b.op("add.u32", w_off, col16)
        wcopy.append((src, b.op("mad.lo.u32", row, Imm(slot, "u32"), dst), col16))
    x_src0 = b.op("mad.wide.u32", xi, Imm(16, "u32"), rec() if callable(rec) else rec)
    x_dst0 = b.op("mad.lo.u32", xi, Imm(16, "u32"), Imm(rec_at, "u32"))
    w_tail = b.op("setp.lt.u32", lane, Imm(w_chunks % 32, "u32")) if w_chunks % 32 else None
    x_chunks = rb // 16
    x_tail = b.op("setp.lt.u32", xi, Imm(x_chunks % nthr, "u32"))

    def issue(jb, st, live, what=("w", "x")):
        if "w" in what:
            off = b.op("mul.lo.u32", jb, Imm(block, "u32"))
            for u, (src, dst, col16) in enumerate(wcopy):
                go = live if 32 * (u + 1) <= w_chunks else b.op("and.pred", live, w_tail)
                to = Mem(b.op("add.u32", st, dst))
                at = (b.op("add.u32", src, off) if aligned else  # the step's 16-byte aligned start + the column
                      b.op("add.u32", b.op("and.b32", b.op("add.u32", src, off), Imm(~15 & 0xFFFFFFFF, "b32")), col16))
                b.emit("cp.async.cg.shared.global", to, Mem(b.op("add.s64", w_warp, b.op("cvt.u64.u32", at))),
                       Imm(16, "u32"), pred=go)
        if "x" in what:
            src = b.op("mad.wide.u32", jb, Imm(rb, "u32"), x_src0)
            dst = b.op("add.u32", st, x_dst0)
            for u in range(-(-x_chunks // nthr)):
                go = live if nthr * (u + 1) <= x_chunks else b.op("and.pred", live, x_tail)
                b.emit(f"cp.async.{cache}.shared.global", Mem(dst, 16 * nthr * u), Mem(src, 16 * nthr * u),
                       Imm(16, "u32"), pred=go)
    return issue, w_off


def _row_geometry(codec) -> tuple[int, int, int]:
    """(a step's bytes a row (256 weights), the bytes copied a row, a row's bytes in a stage) of a codec on the
    few-token builds: a K-quant's super-block, or an mma_block codec's MMA_STEP_BYTES (Q6_K's 210, copied as 224
    from 16 bytes below its start); the slot as _slot."""
    block = codec.BLOCK_BYTES if hasattr(codec, "RegDecoder") else codec.MMA_STEP_BYTES
    box = block if block % 16 == 0 else codec.MMA_BOX_BYTES
    return block, box, _slot(box)


def _built_for(fmt: str, nt: int, hi_only: bool = False) -> tuple[str, ...]:
    """The targets whose plan for `fmt`'s nt-token build fits a CTA's shared memory at its fewest (2) stages (Q8_0's
    8-token build does not fit sm_89's / sm_120a's 99 KB)."""
    from .. import codecs

    slot = _row_geometry(codecs.get(fmt))[2]
    out = []
    for a in TARGETS:
        arch = get_arch(a)
        _, _, mt, nw = _ring_plan(arch, nt, hi_only, fmt=fmt)
        table = codecs.get(fmt).few_table(False)[1] if hasattr(codecs.get(fmt), "few_table") else 0  # (the narrow)
        if 2 * nw * (16 * mt * slot + T4.q4k_record_bytes(nt, hi_only)) + 128 + table <= arch.max_smem_per_block:
            out.append(a)
    return tuple(out)


def _slot(box: int) -> int:
    """A row's bytes in a ring stage: `box` rounded up to an odd number of 16-byte chunks, so that rows g = 0..7 of
    an m16 tile start 4·odd banks apart and the 32 lanes (g, t) reading word t of their rows hit 32 banks (Q4_K's
    144, Q5_K's 176 and Q8_0's 272 as they are; Q6_K's 224-byte box in 240)."""
    c = -(-box // 16)
    return 16 * (c + 1 - c % 2)


def _codec_table(b, codec, tid, lane, dyn=None):
    """A codec's table in shared memory (TQ4_1S's codebook: codec.few_table), filled by the first 4 warps (the
    fewest a launch runs) — emitted in the prologue before griddepcontrol.wait (its data is the module's own), so
    the fill overlaps the kernel before; _CodecStep's CTA barrier publishes it. The wide table at the dynamic
    memory's start (`dyn`: the build left room for it), else static. Returns mma_block's constants."""
    tbl = b.op("mov.u32", dyn if dyn is not None else b.shared_buffer("mma_table", codec.few_table(False)[1], align=16))
    return codec.mma_constants(b, (tbl, tid, lane, 128, dyn is not None))


def _phased_rows(b, g, MT, slot, row0, M, nsb, block):
    """(slots, starts) of the few-token steps' rows 16·mt + g + 8·rr: each row's slot in a stage and, for a step not
    a multiple of 16 bytes (Q6_K's 210), its first step's offset from the warp's aligned base, as _ring_copies
    copies it (None otherwise)."""
    rows = [[b.op("add.u32", g, Imm(16 * mt + 8 * rr, "u32")) for rr in range(2)] for mt in range(MT)]
    slots = [[b.op("mul.lo.u32", r, Imm(slot, "u32")) for r in rs] for rs in rows]
    if block % 16 == 0:
        return slots, None
    row_bytes, mlast, rbase = _warp_row_base(b, row0, M, nsb, block)
    delta = _warp_delta(b, rbase, row_bytes)
    return slots, [[b.op("mad.lo.u32", _row_rel(b, row0, r, mlast, rbase), row_bytes, delta) for r in rs]
                   for rs in rows]


def _phased_body(b, st, jb, block, slots, starts, emit, tag):
    """A step's body over its rows' 4-byte aligned bases in the stage at st: emit(bases, 0), or where the steps land
    at a 2-byte phase that alternates by step (the same for every row: row_bytes a multiple of 4) both bodies behind
    a branch on it (labels `tag`_phase2, `tag`_joined)."""
    if starts is None:
        emit([[b.op("add.u32", st, sl) for sl in ss] for ss in slots], 0)
        return
    jbytes = b.op("mul.lo.u32", jb, Imm(block, "u32"))
    offs = [[b.op("and.b32", b.op("add.u32", r, jbytes), Imm(15, "b32")) for r in rs] for rs in starts]
    bases = [[b.op("add.u32", b.op("add.u32", st, sl), b.op("and.b32", o, Imm(12, "b32"))) for sl, o in zip(ss, os_)]
             for ss, os_ in zip(slots, offs)]
    other, joined = b.label(f"{tag}_phase2"), b.label(f"{tag}_joined")
    b.bra(other, pred=b.op("setp.ne.u32", b.op("and.b32", offs[0][0], Imm(2, "b32")), Imm(0, "u32")))
    emit(bases, 0)
    b.bra(joined)
    b.place(other)
    emit(bases, 2)
    b.place(joined)


class _I8Step:
    """A step of the int8 few-token Q4_K GEMVs (gemv_q4_k_i8_t{nt}, on prep_q4k_i8_t{nt}'s records: x·2^s·2^7 as three
    signed base-256 digit planes, B column 3n + p). Per m16 tile and 64-weight group q of the super-block: one
    ldmatrix.x4 of rows g, g + 8's 32 qs bytes (A of m16n8k32 with k = the byte), A_lo = a & 0x0F0F0F0F (sub-block
    2q: q) and A_hi = a & 0xF0F0F0F0 (sub-block 2q + 1: 16q); per n8 tile of planes one 16-byte load of both
    sub-blocks' B and two u8 x s8 MMAs from zero (exact: |D| ≤ 32·240·128), then the integer sums take the 6-bit
    scales, S_lo += sc_2q·D_lo and S_hi += sc_2q+1·D_hi (mad.lo.s32; |16·S_lo + S_hi| < 2^29). Per step and column:
    P += float(16·S_lo + S_hi)·d·2^-s (column 3n + p of token n; fp32), and the min term as gemv_q4_k_mma_t{nt}'s
    (one f16 MMA of the mins on the record's min pairs): Mn += −64·dmin·MS·2^-s. After the K loop (combine): token
    n's y = Σ_p 2^(8p − 11)·P(3n + p) + Mn, the planes gathered through the warp's ring. 4 LOPs and 8 IMADs an MMA of
    512 weights where the fp16 build spends 18 decode instructions a 256."""

    def __init__(self, b, arch, codec, MT, nt, g, t, lane, W_BYTES, SLOT):
        self.b, self.arch, self.MT, self.nt, self.t, self.W, self.SLOT = b, arch, MT, nt, t, W_BYTES, SLOT
        self.C = T4.I8_PLANES * nt
        self.NTP = -(-self.C // 8)  # n8 tiles of digit planes
        self.NTM = max(1, 2 * nt // 8)  # n8 tiles of min pairs (the exact record's hi, lo columns)
        self.moff, self.foff, _ = T4.q4k_i8_record_layout(nt)
        self.izero = [b.op("mov.b32", Imm(0, "b32")) for _ in range(4)]
        self.czero = [b.op("mov.f32", Imm(0.0, "f32")) for _ in range(4)]
        self.zero = self.izero[0]
        self.magic = b.op("mov.b32", Imm(0x64006400, "b32"))
        self.t_hi = b.op("setp.ge.u32", t, Imm(2, "u32"))
        tb = b.op("shl.b32", b.op("and.b32", t, Imm(1, "b32")), Imm(1, "u32"))
        self.msel = b.op("mad.lo.u32", tb, Imm(0x101, "u32"), Imm(0x5150, "u32"))  # (m_2t, 0x64, m_2t+1, 0x64)
        self.hdr = b.op("mul.lo.u32", g, Imm(SLOT, "u32"))  # row g's header in a stage
        # ldmatrix: lane l gives row (l % 8) + 8·((l / 8) % 2) of the tile, bytes 16·(l / 16) of the group
        lrow = b.op("add.u32", b.op("and.b32", lane, Imm(7, "b32")), b.op("and.b32", lane, Imm(8, "b32")))
        lm = b.op("mad.lo.u32", lrow, Imm(SLOT, "u32"), b.op("add.u32", b.op("and.b32", lane, Imm(16, "b32")),
                                                             Imm(codec.I8A.QS, "u32")))
        self.dec = codec.I8A(b, arch, lm)  # the codec's A operands (q4_k.I8A; q5_k.I8A with the fifth bits)
        # B: lane (g, t) of tile n reads column min(8n + g, C − 1) (columns past C: any, never used)
        self.boff = [b.op("mad.lo.u32", b.op("min.u32", b.op("add.u32", g, Imm(8 * n, "u32")), Imm(self.C - 1, "u32")),
                          Imm(64, "u32"), b.op("mad.lo.u32", t, Imm(16, "u32"), Imm(W_BYTES, "u32")))
                     for n in range(self.NTP)]
        # the factor of column 8n + 2t + e: token (8n + 2t + e) / 3 (clamped), and its plane's 2^(8p − 7) (Q4_K's
        # sums carry 16 more: 2^(8p − 11))
        self._plane_factors(t, W_BYTES + self.foff, 127 - T4.I8_SHIFT - (4 if self.dec.HI16 else 0))
        col_lane = b.op("and.b32", lane, Imm(min(32, 8 * nt) - 1, "b32"))  # the min pairs' lane slot, as the fp16 build
        self.lane_min = b.op("mad.lo.u32", col_lane, Imm(4, "u32"), Imm(W_BYTES + self.moff, "u32"))
        self.lane_fac = b.op("mad.lo.u32", b.op("and.b32", t, Imm(min(nt, 4) - 1, "b32")), Imm(4, "u32"),
                             Imm(W_BYTES + self.foff, "u32"))
        # P[mt][rr][n][e]: the planes' fp32 sums; M[mt][rr][n]: the min term of token 4n + t
        self.P = [[[[b.op("mov.f32", Imm(0.0, "f32")) for _ in range(2)] for _ in range(self.NTP)] for _ in range(2)]
                  for _ in range(MT)]
        self.M = [[[b.op("mov.f32", Imm(0.0, "f32")) for _ in range(self.NTM)] for _ in range(2)] for _ in range(MT)]

    def _plane_factors(self, t, fac_at, e0):
        """foffs[n][e]: where the factor 2^-s of lane column 8n + 2t + e's token (column / 3, clamped) lies in a
        stage (its factors at fac_at); pscale[n][e]: its plane p's scale 2^(e0 − 127 + 8p) as float bits."""
        b = self.b
        self.foffs, self.pscale = [], []
        for n in range(self.NTP):
            fo, ps = [], []
            for e in range(2):
                c = b.op("mad.lo.u32", t, Imm(2, "u32"), Imm(8 * n + e, "u32"))
                tok = b.op("min.u32", b.op("div.u32", c, Imm(3, "u32")), Imm(self.nt - 1, "u32"))
                fo.append(b.op("mad.lo.u32", tok, Imm(4, "u32"), Imm(fac_at, "u32")))
                pl = b.op("rem.u32", c, Imm(3, "u32"))  # as float bits: (e0 + 8p) << 23
                ps.append(b.op("shl.b32", b.op("mad.lo.u32", pl, Imm(8, "u32"), Imm(e0, "u32")), Imm(23, "u32")))
            self.foffs.append(fo)
            self.pscale.append(ps)

    def _header(self, st, ro):
        """Row ro of the stage: d, −64·dmin, the 8 scales as two words of bytes, the min MMA's A pair."""
        from ..codecs.q4_k import mins_0_3, mins_4_7, scales_0_3, scales_4_7
        b = self.b
        hw = b.regs("b32", 4)
        b.emit("ld.shared.v4.u32", b.vec(hw), Mem(b.op("add.u32", st, self.hdr), self.SLOT * ro))
        dlo, dhi = b.reg("b16"), b.reg("b16")
        b.emit("mov.b32", b.vec([dlo, dhi]), hw[0])
        s0, s1, s2 = hw[1:]
        m = b.op("selp.b32", mins_4_7(b, s1, s2), mins_0_3(b, s1), self.t_hi)
        return dict(d=b.op("cvt.f32.f16", dlo), nd64=b.op("mul.rn.f32", b.op("cvt.f32.f16", dhi), Imm(-64.0, "f32")),
                    sc=(scales_0_3(b, s0), scales_4_7(b, s0, s2)),
                    ma=b.op("sub.rn.f16x2", b.op("prmt.b32", m, self.magic, self.msel), self.magic, type="b32"))

    def body(self, st):
        b, arch = self.b, self.arch
        facs = [[b.op("ld.shared.f32", Mem(b.op("add.u32", st, fo))) for fo in fos] for fos in self.foffs]
        for mt in range(self.MT):
            hds = [self._header(st, 16 * mt + 8 * rr) for rr in range(2)]
            sl = [[None] * 4 for _ in range(self.NTP)]  # the step's integer sums (low, high sub-blocks) per tile
            sh = [[None] * 4 for _ in range(self.NTP)]
            ctx = self.dec.tile(st, 16 * mt * self.SLOT)
            for q in range(4):
                a = b.regs("b32", 4)
                b.emit(ldmatrix(arch, 4, b.vec(a), Mem(b.op("add.u32", st, self.dec.lm), 16 * mt * self.SLOT + 32 * q)))
                alo, ahi = self.dec.group(a, q, ctx)
                # sub-blocks 2q, 2q + 1 of rows g, g + 8: scale bytes (2q) % 4, (2q + 1) % 4 of word q / 2
                scs = [[b.op("prmt.b32", hds[rr]["sc"][q // 2], self.zero, Imm(0x4440 + (2 * q + h) % 4, "b32"))
                        for h in range(2)] for rr in range(2)]
                for n in range(self.NTP):
                    xb = b.regs("b32", 4)
                    b.emit("ld.shared.v4.u32", b.vec(xb), Mem(b.op("add.u32", st, self.boff[n]), 64 * self.C * q))
                    for h, (av, acc) in enumerate(((alo, sl[n]), (ahi, sh[n]))):
                        dv = b.regs("b32", 4)
                        b.emit(mma_sync(arch, "m16n8k32", "u8", b.vec(dv), b.vec(av), b.vec(xb[2 * h:2 * h + 2]),
                                        b.vec(self.izero), b_type="s8"))
                        for i in range(4):  # D: (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1)
                            sc = scs[i // 2][h]
                            acc[i] = (b.op("mul.lo.s32", dv[i], sc, type="s32") if acc[i] is None else
                                      b.op("mad.lo.s32", dv[i], sc, acc[i], type="s32"))
            for n in range(self.NTP):
                for i in range(4):
                    rr, e = divmod(i, 2)
                    tot = (b.op("mad.lo.s32", sl[n][i], Imm(16, "s32"), sh[n][i], type="s32") if self.dec.HI16 else
                           b.op("add.s32", sl[n][i], sh[n][i], type="s32"))
                    f = b.op("cvt.rn.f32.s32", tot)
                    pe = self.P[mt][rr][n][e]
                    b.emit("fma.rn.f32", pe, f, b.op("mul.rn.f32", hds[rr]["d"], facs[n][e]), pe)
            for n in range(self.NTM):
                mw = [b.op("ld.shared.b32", Mem(b.op("add.u32", st, self.lane_min), 128 * n)), self.zero]
                ms = b.regs("f32", 4)
                b.emit(mma_sync(arch, "m16n8k16", "f16", b.vec(ms), b.vec([hds[0]["ma"], hds[1]["ma"], self.zero,
                                                                         self.zero]),
                                b.vec(mw), b.vec(self.czero)))
                fm = b.op("ld.shared.f32", Mem(b.op("add.u32", st, self.lane_fac), 16 * n))
                for rr in range(2):
                    mn = self.M[mt][rr][n]
                    v = b.op("mul.rn.f32", hds[rr]["nd64"], b.op("add.rn.f32", ms[2 * rr], ms[2 * rr + 1]))
                    b.emit("fma.rn.f32", mn, v, fm, mn)

    def combine(self, ring, g, t):
        """After the K loop: acc[mt][rr][n][0] = y of row 16·mt + g + 8·rr, token 4n + t (the fp16 build's
        order): the planes' sums, scaled by 2^(8p − 11), through the warp's ring (row-major, 8·NTP columns)."""
        b = self.b
        b.emit("cp.async.wait_all")
        b.emit("bar.warp.sync", Imm(0xFFFFFFFF, "b32"))
        w = 8 * self.NTP
        for mt in range(self.MT):
            for rr in range(2):
                row = b.op("add.u32", g, Imm(16 * mt + 8 * rr, "u32"))
                at = b.op("mad.lo.u32", row, Imm(4 * w, "u32"), b.op("mad.lo.u32", t, Imm(8, "u32"), ring))
                for n in range(self.NTP):
                    for e in range(2):
                        b.emit("st.shared.f32", Mem(at, 32 * n + 4 * e),
                               b.op("mul.rn.f32", self.P[mt][rr][n][e], self.pscale[n][e]))
        b.emit("bar.warp.sync", Imm(0xFFFFFFFF, "b32"))
        acc = []
        for mt in range(self.MT):
            acc.append([])
            for rr in range(2):
                row = b.op("add.u32", g, Imm(16 * mt + 8 * rr, "u32"))
                acc[-1].append([])
                for n in range(self.NTM):
                    tok = b.op("min.u32", b.op("add.u32", t, Imm(4 * n, "u32")), Imm(self.nt - 1, "u32"))
                    at = b.op("mad.lo.u32", row, Imm(4 * w, "u32"), b.op("mad.lo.u32", tok, Imm(12, "u32"), ring))
                    v = self.M[mt][rr][n]
                    for p in range(T4.I8_PLANES):
                        v = b.op("add.rn.f32", v, b.op("ld.shared.f32", Mem(at, 4 * p)))
                    acc[-1][-1].append([v])
        b.emit("bar.warp.sync", Imm(0xFFFFFFFF, "b32"))  # (the ring's next use: the K parts' sums)
        return acc


class _I8Q6Step(_I8Step):
    """A step of the int8 few-token Q6_K GEMVs (gemv_q6_k_i8_t{nt}, on prep_q6k_i8_t{nt}'s records: q4k_i8_records'
    digit planes, then each column's 16 sub-block digit sums X as fp16, then the factors). Per m16 tile and
    16-element sub-block s: A = the rows' u8 q (codec.I8Block: one bit select a register), one m16n8k16 u8 x s8 MMA a
    tile of planes (its B one register of the 16-byte load that holds four sub-blocks), S += sc_s·D (the int8 scale
    sign-extended by a prmt; |S| < 2^29). The −32 of q − 32 is one f16 MMA a step and tile: A = the rows' 16 scales
    as f16 (exact), B = X, F = Σ_s sc_s·X_s exact in fp32 (< 2^23); then P += (S − 32·F)·d·2^-s per column (fp32:
    non-finite where X marks a NaN or an out-of-range value). The step's rows sit at a 2-byte phase that alternates by
    step (210-byte blocks, as _CodecStep's): the body is emitted once per phase. combine: _I8Step's, no min term."""

    def __init__(self, b, arch, codec, MT, nt, g, t, W_BYTES, SLOT, row0, M, nsb, block):
        self.b, self.arch, self.codec, self.MT, self.nt, self.t, self.W, self.block = (b, arch, codec, MT, nt, t,
                                                                                        W_BYTES, block)
        self.C = T4.I8_PLANES * nt
        self.NTP = -(-self.C // 8)
        self.NTM = max(1, 2 * nt // 8)
        xoff, foff, _ = T4.q6k_i8_record_layout(nt)
        self.izero = [b.op("mov.b32", Imm(0, "b32")) for _ in range(4)]
        self.czero = [b.op("mov.f32", Imm(0.0, "f32")) for _ in range(4)]
        self.t4 = b.op("shl.b32", t, Imm(2, "u32"))
        self.t_hi = b.op("setp.ge.u32", t, Imm(2, "u32"))
        self.sel = b.op("mad.lo.u32", b.op("and.b32", t, Imm(1, "b32")), Imm(0x0202, "u32"), Imm(0x4140, "u32"))
        self.magic = b.op("mov.b32", Imm(0x64646464, "b32"))
        self.bias = b.op("mov.b32", Imm(0x64806480, "b32"))  # 1152 = 1024 + 128 in both halves
        self.sels = codec.I8Block.constants(b)
        cols = [b.op("min.u32", b.op("add.u32", g, Imm(8 * n, "u32")), Imm(self.C - 1, "u32")) for n in range(self.NTP)]
        # lane (g, t) of tile n: column min(8n + g, C − 1)'s planes (16 bytes at 16t: four sub-blocks) and sums
        self.boff = [b.op("mad.lo.u32", c, Imm(64, "u32"), b.op("add.u32", b.op("shl.b32", t, Imm(4, "u32")),
                                                                 Imm(W_BYTES, "u32"))) for c in cols]
        self.xoffs = [b.op("mad.lo.u32", c, Imm(32, "u32"), b.op("add.u32", self.t4, Imm(W_BYTES + xoff, "u32")))
                      for c in cols]
        self._plane_factors(t, W_BYTES + foff, 127 - T4.I8_SHIFT)  # (planes of plain q: 2^(8p − 7))
        self.P = [[[[b.op("mov.f32", Imm(0.0, "f32")) for _ in range(2)] for _ in range(self.NTP)] for _ in range(2)]
                  for _ in range(MT)]
        self.M = [[[self.czero[0]] * self.NTM for _ in range(2)] for _ in range(MT)]  # (no min term)
        self.slots, self.starts = _phased_rows(b, g, MT, SLOT, row0, M, nsb, block)

    def body(self, st, jb=None):
        _phased_body(self.b, st, jb, self.block, self.slots, self.starts,
                     lambda bases, ph: self._phase(st, bases, ph), "i8")

    def _blocks(self, bases, ph, consts):
        """The codec's I8Block of rows g, g + 8 of an m16 tile (their bases at 2-byte phase ph)."""
        from .gemv_mma_codec import phase_readers
        b = self.b
        return [self.codec.I8Block(b, *phase_readers(b, base, b.op("add.u32", base, self.t4), ph), self.t, consts)
                for base in bases]

    def _planes(self, st, q):
        """Per n8 tile of planes, the lane's B registers of sub-blocks 4q .. 4q + 3 (one 16-byte load)."""
        b, out = self.b, []
        for n in range(self.NTP):
            xb = b.regs("b32", 4)
            b.emit("ld.shared.v4.u32", b.vec(xb), Mem(b.op("add.u32", st, self.boff[n]), 64 * self.C * q))
            out.append(xb)
        return out

    def _phase(self, st, bases, ph):
        b, arch = self.b, self.arch
        facs = [[b.op("ld.shared.f32", Mem(b.op("add.u32", st, fo))) for fo in fos] for fos in self.foffs]
        for mt in range(self.MT):
            blks = self._blocks(bases[mt], ph, self.sels)
            S = [[None] * 4 for _ in range(self.NTP)]  # the step's integer sums (g, 2t), (g, 2t + 1), (g + 8, ..)
            for q in range(4):
                xbs = self._planes(st, q)
                for i in range(4):
                    s = 4 * q + i
                    A = [blks[0].a(s), blks[1].a(s)]
                    scs = [blk.scale(s) for blk in blks]
                    for n in range(self.NTP):
                        dv = b.regs("b32", 4)
                        b.emit(mma_sync(arch, "m16n8k16", "u8", b.vec(dv), b.vec(A), b.vec([xbs[n][i]]),
                                        b.vec(self.izero), b_type="s8"))
                        for e in range(4):
                            S[n][e] = (b.op("mul.lo.s32", dv[e], scs[e // 2], type="s32") if S[n][e] is None else
                                       b.op("mad.lo.s32", dv[e], scs[e // 2], S[n][e], type="s32"))
            pairs = [blk.scale_pairs(self.t_hi, self.sel, self.magic, self.bias) for blk in blks]
            af = [pairs[0][0], pairs[1][0], pairs[0][1], pairs[1][1]]  # (g, k 2t..), (g + 8, ..), (g, k 2t + 8..), ..
            for n in range(self.NTP):
                xw = [b.op("ld.shared.b32", Mem(b.op("add.u32", st, self.xoffs[n]), 16 * h)) for h in range(2)]
                F = b.regs("f32", 4)
                b.emit(mma_sync(arch, "m16n8k16", "f16", b.vec(F), b.vec(af), b.vec(xw), b.vec(self.czero)))
                for e in range(4):
                    rr, c = divmod(e, 2)
                    v = b.op("fma.rn.f32", F[e], Imm(-32.0, "f32"), b.op("cvt.rn.f32.s32", S[n][e]))
                    pe = self.P[mt][rr][n][c]
                    b.emit("fma.rn.f32", pe, v, b.op("mul.rn.f32", blks[rr].d, facs[n][c]), pe)


class _I8Q8Step(_I8Q6Step):
    """A step of the int8 few-token Q8_0 GEMVs (gemv_q8_0_i8_t{nt}, on prep_q6k_i8_t{nt}'s records: the digit planes
    in the natural K order; their sub-block sums unused). Per m16 tile and 32-element block j: A = the rows' int8
    quants as they lie (codec.I8Block: one word a half-block, no decode), two m16n8k16 s8 x s8 MMAs a tile of planes
    chained in s32 (exact: |D| ≤ 32·128·128), then S += float(D)·d_j per column (fp32; the block's fp16 scale);
    per step P += S·2^-s. The digits cannot carry an inf or a NaN of x: the records' sub-block sums X mark them, so
    per step and tile one f16 MMA of ones on X (F = Σ_s X_s per column) adds 0·F — nothing, or NaN for that token.
    combine: _I8Step's, no min term."""

    def __init__(self, *args):
        super().__init__(*args)
        self.ones = self.b.op("mov.b32", Imm(0x3C003C00, "b32"))  # (f16 1.0, 1.0: the non-finite check's A)

    def _phase(self, st, bases, ph):
        b, arch = self.b, self.arch
        facs = [[b.op("ld.shared.f32", Mem(b.op("add.u32", st, fo))) for fo in fos] for fos in self.foffs]
        for mt in range(self.MT):
            blks = self._blocks(bases[mt], ph, None)
            S = [[None] * 4 for _ in range(self.NTP)]  # the step's fp32 sums (g, 2t), (g, 2t + 1), (g + 8, ..)
            for q in range(4):  # blocks 2q, 2q + 1: sub-blocks 4q .. 4q + 3
                xbs = self._planes(st, q)
                for jj in range(2):
                    s0 = 4 * q + 2 * jj
                    ds = [blk.scale(s0) for blk in blks]
                    for n in range(self.NTP):
                        dv = self.izero
                        for h in range(2):
                            nv = b.regs("b32", 4)
                            A = [blks[0].a(s0 + h), blks[1].a(s0 + h)]  # rows g, g + 8: k 4t .. 4t + 3 of the half
                            b.emit(mma_sync(arch, "m16n8k16", "s8", b.vec(nv), b.vec(A), b.vec([xbs[n][2 * jj + h]]),
                                            b.vec(dv)))
                            dv = nv
                        for e in range(4):
                            f = b.op("cvt.rn.f32.s32", dv[e])
                            S[n][e] = (b.op("mul.rn.f32", f, ds[e // 2]) if S[n][e] is None else
                                       b.op("fma.rn.f32", f, ds[e // 2], S[n][e]))
            for n in range(self.NTP):
                xw = [b.op("ld.shared.b32", Mem(b.op("add.u32", st, self.xoffs[n]), 16 * h)) for h in range(2)]
                F = b.regs("f32", 4)
                b.emit(mma_sync(arch, "m16n8k16", "f16", b.vec(F), b.vec([self.ones] * 4), b.vec(xw),
                                b.vec(self.czero)))
                for e in range(4):
                    rr, c = divmod(e, 2)
                    pe = self.P[mt][rr][n][c]
                    v = b.op("fma.rn.f32", F[e], Imm(0.0, "f32"), S[n][e])  # (non-finite X: NaN)
                    b.emit("fma.rn.f32", pe, v, facs[n][c], pe)


class _CodecStep:
    """A step of the few-token GEMVs on a codec's mma_block (Q6_K, Q8_0: a scale times an integer, the scale
    constant over 16 weights, no min): per m16 tile and 16-element sub-block s, A = the integers of rows g, g + 8
    (fragment(s), exact in fp16) and one MMA per n8 tile of the record's (hi, lo) columns — chained over the
    sub-blocks that share a scale (the codec's MMA_SCALE_SUBBLOCKS: Q8_0's 2) — then S += sc·C in fp32; per step
    y += 2^-s·d·(S_hi + S_lo) (finish). A Q6_K step (210 bytes a row, copied from 16 bytes below its start:
    _ring_copies) lands 0-14 bytes into its row's slot, at a 2-byte phase that alternates by step and is the same
    for every row (row_bytes a multiple of 4): the body is emitted once per phase, each word one load or, at phase
    2, two and a prmt (as gemv_mma_codec's)."""

    def __init__(self, b, arch, codec, MT, NTL, g, t, row0, M, nsb, block, slot, tid=None, lane=None, consts=None):
        self.b, self.arch, self.codec, self.MT, self.NTL, self.block, self.t = b, arch, codec, MT, NTL, block, t
        if hasattr(codec, "few_table"):  # the table _codec_table filled (before the wait), published here
            assert consts is not None, codec
            self.consts = consts
            b.emit("bar.sync", Imm(0, "u32"))
        else:
            self.consts = codec.mma_constants(b)
        self.czero = [b.op("mov.f32", Imm(0.0, "f32")) for _ in range(4)]
        # the lane's offset of word(off, lane=True): 4t (its elements 4t .. 4t + 3 of a 16-byte run), or the codec's
        self.t4 = codec.mma_lane_offset(b, t) if hasattr(codec, "mma_lane_offset") else b.op("shl.b32", t, Imm(2, "u32"))
        self.share = getattr(codec, "MMA_SCALE_SUBBLOCKS", 1)
        self.parts = getattr(codec, "MMA_A_PARTS", 1)  # A parts a sub-block (TQ4_1S: fp16 hi and lo; _parts_step)
        self.slots, self.starts = _phased_rows(b, g, MT, slot, row0, M, nsb, block)
        self.S = [[b.regs("f32", 4) for _ in range(NTL)] for _ in range(MT)]  # the step's sums, C's order
        self.d = [[b.reg("f32") for _ in range(2)] for _ in range(MT)]  # rows g, g + 8: the step's d

    def body(self, st, jb, xrec, ncol):
        """The step in the stage at st (step jb of the row), its B pairs at xrec (the lane's record slot)."""
        _phased_body(self.b, st, jb, self.block, self.slots, self.starts,
                     lambda bases, ph: self._phase(bases, ph, xrec, ncol), "step")

    def _phase(self, bases, ph, xrec, ncol):
        b, codec = self.b, self.codec
        dec = [[codec.mma_block(b, *phase_readers(b, base, b.op("add.u32", base, self.t4), ph), self.t, self.consts)
                for base in bs] for bs in bases]
        for i in range(8):  # 32-element block i: its B pairs (sub-blocks 2i, 2i + 1) per n8 tile
            xbs = _b_tiles(b, xrec, 64 * ncol * i, self.NTL)
            for mt in range(self.MT):
                for s0 in range(2 * i, 2 * i + 2, self.share):
                    if self.parts > 1:
                        self._parts_step(dec[mt], s0, xbs, self.S[mt])
                        continue
                    cs = [b.regs("f32", 4) for _ in range(self.NTL)]
                    for s in range(s0, s0 + self.share):
                        fr = [dec[mt][rr].fragment(s) for rr in range(2)]
                        A = [fr[0][0], fr[1][0], fr[0][1], fr[1][1]]  # (g, k 2t..), (g + 8, ..), (g, k 2t + 8..), ..
                        for n in range(self.NTL):
                            b.emit(mma_sync(self.arch, "m16n8k16", "f16", b.vec(cs[n]), b.vec(A),
                                            b.vec(xbs[n][2 * (s % 2):2 * (s % 2) + 2]),
                                            b.vec(self.czero if s == s0 else cs[n])))
                    sc = [dec[mt][rr].scale(s0) for rr in range(2)]
                    for n in range(self.NTL):
                        for e, S in enumerate(self.S[mt][n]):  # (g, hi), (g, lo), (g + 8, hi), (g + 8, lo)
                            if s0 == 0:
                                b.emit("mul.rn.f32", S, sc[e // 2], cs[n][e])
                            else:
                                b.emit("fma.rn.f32", S, sc[e // 2], cs[n][e], S)
        for mt in range(self.MT):
            for rr in range(2):
                b.emit("mov.f32", self.d[mt][rr], dec[mt][rr].d)

    def _parts_step(self, dec, s, xbs, S):
        """Sub-block s of a codec whose A comes in two parts (MMA_A_PARTS: TQ4_1S's fp16 hi and lo of the codebook):
        one MMA per weight row group rr (rows g + 8·rr of the m16 tile) and n8 tile, its A the row's fragment(s) —
        part 0 as the MMA's rows g, part 1 as its rows g + 8, both weight row g + 8·rr (so each pair of A registers
        is one table lookup, no moves) —, then S[n][2rr + c] += sc·(C part 0 + C part 1) for B column c (x hi, lo)."""
        b = self.b
        for rr in range(2):
            A = dec[rr].fragment(s)
            sc = dec[rr].scale(s)
            for n in range(self.NTL):
                c = b.regs("f32", 4)  # (part 0, x hi), (part 0, x lo), (part 1, x hi), (part 1, x lo)
                b.emit(mma_sync(self.arch, "m16n8k16", "f16", b.vec(c), b.vec(A),
                                b.vec(xbs[n][2 * (s % 2):2 * (s % 2) + 2]), b.vec(self.czero)))
                for col in range(2):
                    v = b.op("add.rn.f32", c[col], c[2 + col])
                    if s == 0:
                        b.emit("mul.rn.f32", S[n][2 * rr + col], sc, v)
                    else:
                        b.emit("fma.rn.f32", S[n][2 * rr + col], sc, v, S[n][2 * rr + col])

    def finish(self, acc, facs, hi_only=False):
        """y += 2^-s·d·(S_hi + S_lo) per row and tile (acc[mt][rr][tile][0]; facs[tile][0]: the lane's token's 2^-s);
        hi_only (gemv_<fmt>_mma_t16h): C's columns 2t, 2t + 1 are two tokens, y += 2^-s·d·S for each
        (acc[mt][rr][tile][e], facs[tile][e])."""
        b = self.b
        for mt in range(self.MT):
            for rr in range(2):
                for n in range(self.NTL):
                    S = self.S[mt][n]
                    if hi_only:
                        for e in range(2):
                            v = b.op("mul.rn.f32", self.d[mt][rr], S[2 * rr + e])
                            b.emit("fma.rn.f32", acc[mt][rr][n][e], v, facs[n][e], acc[mt][rr][n][e])
                        continue
                    v = b.op("mul.rn.f32", self.d[mt][rr], b.op("add.rn.f32", S[2 * rr], S[2 * rr + 1]))
                    b.emit("fma.rn.f32", acc[mt][rr][n][0], v, facs[n][0], acc[mt][rr][n][0])


def _stage_base(b, ring, stage_bytes):
    """The address of ring stage `stage` (an int or a register)."""
    def at(stage):
        return (b.op("add.u32", ring, Imm(stage * stage_bytes, "u32")) if isinstance(stage, int) else
                b.op("mad.lo.u32", stage, Imm(stage_bytes, "u32"), ring))
    return at


def _split_range(b, nsb, kz, nsplit):
    """Split kz's super-blocks [jb, jend): contiguous runs of ceil(nsb / nsplit)."""
    per = b.op("div.u32", b.op("add.u32", nsb, b.op("sub.u32", nsplit, Imm(1, "u32"))), nsplit)
    jb = b.op("mul.lo.u32", kz, per)
    return jb, b.op("min.u32", b.op("add.u32", jb, per), nsb)


def _params(b, NW, ctas, fused: bool = False, kparts: bool = False):
    """The few-token kernels' parameters (w, records, y, m, k, ntok, part, counters[, x][, kparts]) and launch bounds
    (`fused`: the kernel writes the records itself from x, scratch rather than an input; `kparts`: the warps of a
    row tile, last)."""
    ps = (b.param("w", "u64", "ptr:in"), b.param("records", "u64", "ptr:scratch" if fused else "ptr:in"),
          b.param("y", "u64", "ptr:out"),
          b.param("m", "u32"), b.param("k", "u32"), b.param("ntok", "u32"))
    ps += (b.param("part", "u64", "ptr:scratch"), b.param("counters", "u64", "ptr:scratch"))
    if fused:
        ps += (b.param("x", "u64", "ptr:in"),)
    if kparts:
        ps += (b.param("kparts", "u32"),)
    b.directives += [f".maxntid {32 * NW}, 1, 1", f".minnctapersm {ctas}"]
    b.pdl_trigger()  # the op's last kernel: the next op's first may start (it waits for this one)
    return ps


def _entry(b, ps, NW, R, KP=None, nw=None):
    """The parameters loaded, the warp's rows (_warp_rows) and the lane's (g, t): (W, REC, Y, M, ntok, K / 256,
    (tid, lane, warp, gwarp, row0), g, t). KP (a register: the kparts parameter): KP consecutive warps share a row
    tile (_tile_rows: gwarp is the tile's index in the grid, and the rows end with the warp's K part); nw: the
    CTA's warps where the launch picks them (a register), else NW."""
    W, REC, Y = (b.ptr(p_) for p_ in ps[:3])
    M, K, ntok = (b.ld_param(p_, "u32") for p_ in ps[3:6])
    rows = _warp_rows(b, NW, R) if KP is None else _tile_rows(b, nw or NW, R, KP)  # (+ the warp's K part)
    g = b.op("shr.u32", rows[1], Imm(2, "u32"))
    t = b.op("and.b32", rows[1], Imm(3, "b32"))
    return W, REC, Y, M, ntok, b.op("shr.u32", K, Imm(8, "u32")), rows, g, t


def _b_tiles(b, xrec, off, ntl):
    """The lane's B registers of MMA pair i (record bytes at `off`): one 16-byte load per n8 tile, 512 bytes apart
    (both nibbles' k-pairs)."""
    xbs = []
    for n in range(ntl):
        xb = b.regs("b32", 4)
        b.emit("ld.shared.v4.u32", b.vec(xb), Mem(xrec, off + 512 * n))
        xbs.append(xb)
    return xbs


def _prologue(b, issue, stage_base, jb, jend, n, pdl, records=None, hold=0, wait=None, early=None):
    """The first n steps into stages 0 .. n - 1: the weights of the first n - hold, then `early()` where given (work
    that reads nothing another kernel writes: a codec's table), then (after the prep kernel: griddepcontrol.wait
    where `pdl`, or `wait()` where given; then `records()` where given, the records built in the kernel) the other
    weights and every step's records; one cp.async group per step."""
    firsts = []
    pre = max(0, n - hold)
    for s_ in range(n):
        js = b.op("add.u32", jb, Imm(s_, "u32"))
        firsts.append((js, stage_base(s_), b.op("setp.lt.u32", js, jend)))
        if s_ < pre:
            issue(*firsts[-1], what=("w",))
    if early is not None:
        early()
    if wait is not None:
        wait()
    elif pdl:
        b.emit("griddepcontrol.wait")
    if records is not None:
        records()
    for s_, first in enumerate(firsts):
        issue(*first, what=("x",) if s_ < pre else ("w", "x"))
        b.emit("cp.async.commit_group")


def _build_records(b, *, X, REC, CNT, ntok, K, nt, hi_only, NW, tid, lane, warp, nw=None, order="q4k",
                   x16: bool = False):
    """The fused builds' activation prep: the CTAs that start first (by a ticket, so they are running: no
    co-residency needed, any grid size) write the records prep_q4k_t{nt} would (the same code, bit for bit),
    one (token, 32-block) item per warp at a time; then every CTA waits until all of them have. Three u32 after
    the split-K counters (at counters + 16·gridDim.x: tickets, producers done, CTAs past the wait), each back to
    zero when the kernel ends: the last ticket resets the tickets, the last CTA past the wait the other two. nw
    (a register): the CTA's warps where the launch picks them (NW, the most, places the sync words); `order`: the
    records' K order (prep_sub16_t{nt}'s for "sub16"); `x16`: x is fp16, each value widened as it is loaded (the
    records of its fp32 widening, bit for bit)."""
    G = b.op("mul.lo.u32", b.special("nctaid.x"), b.special("nctaid.y"))
    nb = b.op("shr.u32", K, Imm(5, "u32"))
    items = b.op("mul.lo.u32", nb, Imm(nt, "u32"))
    assert NW & (NW - 1) == 0
    if nw is None:
        P = b.op("min.u32", G, b.op("shr.u32", b.op("add.u32", items, Imm(NW - 1, "u32")), Imm(NW.bit_length() - 1, "u32")))
    else:
        P = b.op("min.u32", G, b.op("div.u32", b.op("add.u32", items, b.op("sub.u32", nw, Imm(1, "u32"))), nw))
    sync = b.op("mad.wide.u32", b.special("nctaid.x"), Imm(4 * NW, "u32"), CNT)
    t0 = b.op("setp.eq.u32", tid, Imm(0, "u32"))
    tsym = b.shared_buffer("ticket", 4, align=4)
    b.comment("a ticket per CTA: the first P to arrive build the records")
    tk = b.op("mov.u32", Imm(0, "u32"))
    b.emit("atom.global.add.u32", tk, Mem(sync), Imm(1, "u32"), pred=t0)
    last = b.op("and.pred", t0, b.op("setp.eq.u32", tk, b.op("sub.u32", G, Imm(1, "u32"))))
    b.emit("st.global.u32", Mem(sync), Imm(0, "u32"), pred=last)  # every ticket is taken: back to zero
    b.emit("st.shared.u32", Mem(tsym), tk, pred=t0)
    b.emit("bar.sync", Imm(0, "u32"))
    b.emit("ld.shared.u32", tk, Mem(tsym))
    wait = b.label("records_wait")
    b.bra(wait, pred=b.op("setp.ge.u32", tk, P))
    item = b.op("mad.lo.u32", tk, Imm(NW, "u32") if nw is None else nw, warp)
    stride = b.op("mul.lo.u32", P, Imm(NW, "u32") if nw is None else nw)
    loop, built = b.label("record_item"), b.label("records_built")
    b.place(loop)
    b.bra(built, pred=b.op("setp.ge.u32", item, items))
    tok, j = b.op("div.u32", item, nb), b.op("rem.u32", item, nb)
    hi, lo, fbits, xs, lead = _scaled_item(b, X, ntok, nb, tok, j, lane, False, x16=x16)
    _prep_record_stores(b, REC, nt, hi_only, tok, j, lane, lead, hi, lo, fbits, xs, order=order)
    b.emit("add.u32", item, item, stride)
    b.bra(loop)
    b.place(built)
    b.emit("bar.sync", Imm(0, "u32"))  # the CTA's record stores, then thread 0's release (cumulative over them)
    b.emit("red.release.gpu.global.add.u32", Mem(sync, 4), Imm(1, "u32"), pred=t0)
    b.place(wait)
    b.comment("warp 0 waits until the P producers are done (every lane loads the same word: the loop stays "
              "converged), then thread 0 counts the CTA past the wait; the last CTA past it zeroes both counts")
    _await_count(b, sync, 4, 8, P, G, t0, warp)


def _await_count(b, at, o_count, o_past, P, G, t0, warp):
    """Warp 0 spins until the u32 at `at` + o_count reaches P (ld.acquire.gpu; every lane loads the same word, so
    the loop stays converged), then thread 0 (t0) counts the CTA past at `at` + o_past and the last of the G CTAs
    zeroes both words; then a CTA barrier."""
    past = b.label("records_ready")
    b.bra(past, pred=b.op("setp.ne.u32", warp, Imm(0, "u32")))
    spin = b.label("records_spin")
    b.place(spin)
    ready = b.op("setp.ge.u32", b.op("ld.acquire.gpu.global.u32", Mem(at, o_count)), P)
    b.emit("nanosleep.u32", Imm(64, "u32"), pred=ready, neg=True)
    b.bra(spin, pred=ready, neg=True, uniform=False)
    old = b.op("mov.u32", Imm(0, "u32"))
    b.emit("atom.global.add.u32", old, Mem(at, o_past), Imm(1, "u32"), pred=t0)
    gone = b.op("and.pred", t0, b.op("setp.eq.u32", old, b.op("sub.u32", G, Imm(1, "u32"))))
    for o_ in (o_count, o_past):
        b.emit("st.global.u32", Mem(at, o_), Imm(0, "u32"), pred=gone)
    b.place(past)
    b.emit("bar.sync", Imm(0, "u32"))


def build(arch, nt: int = 1, hi_only: bool = False, fused: bool = False, fmt: str = "q4_K", i8: bool = False,
          x16: bool = False):
    """gemv_q4_k_mma_t{nt}: up to nt tokens (1, 2, 4 or 8); token n's hi and lo in B columns 2n and 2n + 1. With
    hi_only (gemv_q4_k_mma_t16h, nt = 16): token n's fp16 hi part alone in column n. fused
    (gemv_q4_k_mma_t{nt}_fused): one launch per op — the kernel takes x and builds the records itself
    (_build_records) between its first weight copies and its first record copies. `fmt`: a K-quant whose codec has
    a RegDecoder (Q4_K, Q5_K: the same header, scales and min term; Q5_K's fifth bits from its qh bytes) —
    gemv_<fmt>_mma_t*, on the same records — or (exact) a codec with an mma_block (Q6_K, Q8_0: a scale
    times an integer, the scale constant over 16 weights, no min): _codec_step's MMA per 16-element sub-block on
    prep_sub16_t{nt}'s records (the same bytes in the codecs' K order). i8 (gemv_q4_k_i8_t{nt}, Q4_K, exact): the
    weights' nibbles as the A of u8 x s8 MMAs on prep_q4k_i8_t{nt}'s digit planes (_I8Step). x16 (fused builds'
    _x16 twins): x is fp16, widened as the records are built — one launch for a torch model's fp16 activations."""
    from .. import codecs

    assert not x16 or fused
    codec = codecs.get(fmt)
    kq = hasattr(codec, "RegDecoder")  # a K-quant's register decode, else the codec's mma_block (_CodecStep)
    # (hi_only on a codec's mma_block: Q6_K's, Q8_0's; TQ4_1S's two-part A takes the (hi, lo) columns)
    assert kq or (hasattr(codec, "mma_block") and not (hi_only and getattr(codec, "MMA_A_PARTS", 1) > 1)), fmt
    assert not i8 or ((hasattr(codec, "I8A") or hasattr(codec, "I8Block")) and not hi_only), (fmt, hi_only)
    i8q6 = i8 and hasattr(codec, "I8Block")  # Q6_K's int8 step (_I8Q6Step) on its own records (Q8_0's on them too)
    BLOCK, BOX, SLOT = _row_geometry(codec)
    sfx = _suffix(nt, hi_only)
    what = f"the {nt}-token tensor-core {fmt} GEMV"
    arch.require("mma_sync_f16", what, "use gemv_q4_k_t1 / gemv_q4_k_mma")
    arch.require("cp_async", what, "use gemv_q4_k_t1 / gemv_q4_k_mma")
    S, ctas, MT, NW = _ring_plan(arch, nt, hi_only, fmt)
    R = 16 * MT  # rows per warp
    W_BYTES = R * SLOT  # a step's weights (the record follows)
    ncol = T4.q4k_record_columns(nt, hi_only)
    NTL = max(1, ncol // 8)  # n8 tiles of B
    moff, foff, rb = (T4.q6k_i8_record_layout(nt) if i8q6 else T4.q4k_i8_record_layout(nt) if i8 else
                      T4.q4k_record_layout(nt, hi_only))
    stage_bytes = W_BYTES + rb
    dyn_table = 0  # a codec's table in the dynamic shared memory, before the rings: TQ4_1S's wide one where it fits
    if hasattr(codec, "few_table"):
        wide = codec.few_table(True)[1]
        if codec.MMA_TABLE_WIDE and smem_fit(arch, S * NW * stage_bytes + 128 + wide) >= ctas:  # at the plan's
            # stages and CTAs (never fewer for it: the narrow table then)
            S, ctas = _fit(arch, S, ctas, NW * stage_bytes, extra=wide)
            dyn_table = wide
        else:
            S, ctas = _fit(arch, S, ctas, NW * stage_bytes, extra=codec.few_table(False)[1])
    else:
        S, ctas = _fit(arch, S, ctas, NW * stage_bytes)
    b = KernelBuilder(GemvKernel("few", fmt, nt, hi_only=hi_only, fused=fused, i8=i8, x16=x16).name, arch,
                      f"{fmt} GEMV (exact) for up to {nt} tokens on u8 x s8 mma.sync: the nibbles as A, the activation "
                      "as three int8 digit planes, the scales on the integer sums; weights and records by cp.async"
                      if i8 else
                      f"{fmt} GEMV ({'fp16 activations' if hi_only else 'exact'}) for "
                      f"up to {nt} tokens on mma.sync: B = {'one hi column' if hi_only else '(hi, lo) columns'} per "
                      "token, " + ("a lane owns one qs chunk of two rows per m16 tile" if kq else
                                   "one MMA per 16-element sub-block, its scale in fp32 after it") +
                      ", weights and activation records by cp.async", block=(32 * NW, 1, 1))
    if x16:
        b.meta["x16"] = True  # x is fp16 (the fused build's twin)
    ps = _params(b, NW, ctas, fused, kparts=True)
    pdl = arch.has("griddepcontrol")
    flag = T1_FLAG and pdl and not fused and not hi_only and not i8  # (no int8 prep counts its records)
    ready_p = b.param("ready", "u64", "ptr:scratch") if flag else None
    t_entry = b.special("globaltimer_lo") if TRACE else None
    part_p, cnt_p = ps[6:8]
    x_p = ps[8] if fused else None
    ring_sym = b.dynamic_shared(NW * S * stage_bytes + 128 + dyn_table)
    b.meta.update(split_k="gridDim.y splits K into contiguous runs of super-blocks; part: splits x ntok x m fp32, "
                          "counters: one u32 per warp (zero, left zero)", ctas_per_sm=ctas, tokens=nt, token_groups=1,
                  rows_per_cta=R * NW, rows_per_warp=R, warps=NW,
                  grid="ceil(m / (rows_per_cta / kparts))", k_parts="kparts: warps a row tile (a power of two dividing the warps)",
                  k_parts_rule="few_max_k_parts", fmt=fmt,
                  mode="fp16" if hi_only else "exact", hi_only=hi_only, lane_cols=8, max_splits=T1_MAX_SPLITS,
                  min_split_steps=T1_MIN_SPLIT_STEPS.get((_plan_size(arch), sfx), 1),
                  layout="q4k_mma_records",
                  activation=f"{GemvKernel('prep_few', fmt, nt, hi_only=hi_only, i8=i8).name}(x): one {rb}-byte "
                             "record per super-block",
                  copy="cp.async", stages=S, dynamic_smem=b.dynamic_smem, pdl=pdl)
    if flag:
        b.meta.update(ready_flag="ready (last): 2 zero-kept u32 — the prep's CTAs done (this kernel waits for "
                                  "k/256 x tokens of them instead of griddepcontrol.wait), the CTAs past the wait")
    if not kq:
        b.meta.update(record_order=getattr(codec, "FEW_RECORD_ORDER", "sub16"), weights="row_bytes a multiple of 16" if BLOCK % 16 == 0 else
                      f"row_bytes a multiple of 4, m·row_bytes of 16 (a step's {BOX}-byte copy from 16 bytes below "
                      "its start reads no byte past the buffer)")
    if i8:
        b.meta.update(record_order="i8q6" if i8q6 else "i8")
    if NW > 4:
        b.meta.update(block_warps=[4, NW], ring_bytes_per_warp=S * stage_bytes)
        if dyn_table:  # the dynamic shared memory a launch of nw warps asks: nw rings + this (the table, alignment)
            b.meta.update(smem_besides_rings=128 + dyn_table)
    if fused:
        b.meta.update(activation=f"x ({'fp16' if x16 else 'fp32'}), the records built in the kernel into `records` (scratch, "
                                 f"{rb} bytes per super-block)",
                      fused_prep="the first CTAs to start write the records, every CTA waits for them; counters: "
                                 "the split-K ones, then 3 u32 (zero, left zero)",
                      pdl=False)
        if pdl:
            b.meta["pdl_head"] = "weights"  # before griddepcontrol.wait it only copies weights
    KP = b.ld_param(ps[-1], "u32")
    # the launch may run fewer warps a CTA than NW (meta block_warps), with the rings' shared memory to match
    nwr = b.op("shr.u32", b.special("ntid.x"), Imm(5, "u32")) if NW > 4 else None
    W, REC, Y, M, ntok, nsb, (tid, lane, warp, gwarp, row0, kpart), g, t = _entry(b, ps, NW, R, KP, nwr)
    kz, nsplit = b.special("ctaid.y"), b.special("nctaid.y")
    base = b.op("and.b32", b.op("add.u32", b.op("mov.u32", ring_sym), Imm(127 + dyn_table, "u32")),
                Imm(~127 & 0xFFFFFFFF, "b32"))
    ring = b.op("mad.lo.u32", warp, Imm(S * stage_bytes, "u32"), base)
    cols = BOX // 16
    b.comment(f"copy plan: weight chunk c = lane + 32u = {cols}·row + column (u = 0..{-(-cols * R // 32) - 1}), 16 bytes "
              f"each (an instruction copies ~{int(320 / cols) / 10} rows' contiguous {BOX} bytes: measured 17% faster than "
              "16 rows x 32 bytes), rows past M copy row M - 1 (never stored); record chunks lane + 32u, the last u "
              "partial where the record is not a multiple of 512 bytes")
    # the records .ca: the warps on the same K part read the same ones
    issue, _ = _ring_copies(b, R=R, lane=lane, row0=row0, M=M, nsb=nsb, W=W, rec=REC, xi=lane, nthr=32, rb=rb,
                            rec_at=W_BYTES, cache="ca", block=BLOCK, box=BOX, slot=SLOT)
    stage_base = _stage_base(b, ring, stage_bytes)
    b.comment("split kz: super-blocks [kz·per, min((kz + 1)·per, nsb)), per = ceil(nsb / nsplit). Prologue: the "
              "first S steps' weights, then (after the prep, griddepcontrol) their records")
    # grid split kz, the warp's part p of its tile: run kz·KP + p of nsplit·KP
    jb, jend = _split_range(b, nsb, b.op("mad.lo.u32", kz, KP, kpart), b.op("mul.lo.u32", nsplit, KP))
    def build_records():  # (the fused builds) the records, between the first weight copies and the first record ones
        _build_records(b, X=b.ptr(x_p), REC=REC, CNT=b.ptr(cnt_p), ntok=ntok, K=b.op("shl.b32", nsb, Imm(8, "u32")),
                       nt=nt, hi_only=hi_only, NW=NW, tid=tid, lane=lane, warp=warp, nw=nwr,
                       order="i8q6" if i8q6 else "i8" if i8 else "q4k" if kq else "sub16", x16=x16)
    records = build_records if fused else None

    def ready_wait():  # (T1_FLAG) the prep's k/256 x nt CTAs counted done (one a super-block and token)
        _await_count(b, b.ptr(ready_p), 0, 4, b.op("mul.lo.u32", nsb, Imm(nt, "u32")),
                     b.op("mul.lo.u32", b.special("nctaid.x"), b.special("nctaid.y")),
                     b.op("setp.eq.u32", tid, Imm(0, "u32")), warp)
    table = {}

    def fill_table():  # (a codec's table: filled before the wait)
        table["consts"] = _codec_table(b, codec, tid, lane, ring_sym if dyn_table else None)
    early = fill_table if not kq and hasattr(codec, "few_table") else None
    _prologue(b, issue, stage_base, jb, jend, S, pdl, records,
              hold=0 if not pdl or hi_only or _plan_size(arch) != "big" or S < T1_HOLD_MIN_STAGES.get(nt, 0) else
              (FUSED_HOLD if fused else T1_HOLD).get(nt, 0), wait=ready_wait if flag else None, early=early)
    t_wait = b.special("globaltimer_lo") if TRACE else None
    t_first = b.op("mov.u32", t_wait) if TRACE else None
    t_prep = [b.op("mov.u32", Imm(0, "u32")) for _ in range(3 if TRACE else 0)]
    count = b.op("mov.u32", Imm(0, "u32"))

    if i8q6:  # (Q8_0's: a fp16 scale a block, _I8Q8Step)
        istep = (_I8Q8Step if getattr(codec.I8Block, "PER_BLOCK_SCALE", False) else _I8Q6Step)(
            b, arch, codec, MT, nt, g, t, W_BYTES, SLOT, row0, M, nsb, BLOCK)
    elif i8:
        istep = _I8Step(b, arch, codec, MT, nt, g, t, lane, W_BYTES, SLOT)
    elif kq:
        dec = codec.RegDecoder(b, g, t)
        zero, czero = dec.zero, dec.czero
    else:
        cstep = _CodecStep(b, arch, codec, MT, NTL, g, t, row0, M, nsb, BLOCK, SLOT, tid, lane, table.get("consts"))
    # B column 8·tile + lane / 4 comes from lane (column·4 + t)'s record slot; with fewer than 8 columns, lanes past
    # them re-read the first ones (their columns of C are never used)
    col_lane = b.op("and.b32", lane, Imm(min(32, 4 * ncol) - 1, "b32"))
    lane_rec = b.op("mad.lo.u32", col_lane, Imm(16, "u32"), Imm(W_BYTES, "u32"))
    mslot = 8 if hi_only else 4  # a lane's min pair: hi (and lo, hi_only) halves
    lane_min = b.op("mad.lo.u32", col_lane, Imm(mslot, "u32"), Imm(W_BYTES + moff, "u32")) if kq else None
    if hi_only:  # lane (g, t), tile n: tokens 8n + 2t, 8n + 2t + 1 (columns 2t, 2t + 1)
        lane_fac = b.op("mad.lo.u32", t, Imm(8, "u32"), Imm(W_BYTES + foff, "u32"))
    else:  # tile n: token 4n + t (columns 2t hi, 2t + 1 lo); fewer than 4 tokens: t % nt
        lane_fac = b.op("mad.lo.u32", b.op("and.b32", t, Imm(min(nt, 4) - 1, "b32")), Imm(4, "u32"),
                        Imm(W_BYTES + foff, "u32"))
    cols_per_lane = 2 if hi_only else 1
    # acc[mt][rr][tile][e]: row 16·mt + g + 8·rr, the lane's token e of the tile
    acc = [[[[b.op("mov.f32", Imm(0.0, "f32")) for _ in range(cols_per_lane)] for _ in range(NTL)]
            for _ in range(2)] for _ in range(MT)]

    header, dequant = (dec.header, dec.dequant) if kq and not i8 else (None, None)

    loop, done = b.label("step"), b.label("steps_done")
    b.bra(done, pred=b.op("setp.ge.u32", jb, jend))
    b.place(loop)
    b.emit("cp.async.wait_group", Imm(S - 1, "u32"))  # this lane's copies of the oldest step, then every lane's
    b.emit("bar.warp.sync", Imm(0xFFFFFFFF, "b32"))
    st = stage_base(b.op("rem.u32", count, Imm(S, "u32")))
    if TRACE:  # (predicated movs into registers set before the loop: b.special makes a new one)
        step0 = b.op("setp.eq.u32", count, Imm(0, "u32"))
        b.emit("mov.u32", t_first, Sym("%globaltimer_lo"), pred=step0)
        for i_, r_ in enumerate(t_prep):  # the first record's padding: gemv.PREP_TRACE's stamps (else zeros)
            b.emit("ld.shared.b32", r_, Mem(st, W_BYTES + foff + 4 * nt + 4 * i_), pred=step0)
    if i8:
        istep.body(st, jb) if i8q6 else istep.body(st)
    elif kq:
        hds = [[header(st, 16 * mt + 8 * rr) for rr in range(2)] for mt in range(MT)]
        qs = [[dec.row_words(st, BLOCK * (16 * mt + 8 * rr)) for rr in range(2)] for mt in range(MT)]
        xrec = b.op("add.u32", st, lane_rec)
        # chains[mt][tile][nib]: the low-nibble and the high-nibble MMAs
        chains = [[[b.regs("f32", 4) for _ in range(2)] for _ in range(NTL)] for _ in range(MT)]
        for i in range(8):
            xbs = _b_tiles(b, xrec, 64 * ncol * i, NTL)
            for mt in range(MT):
                a = [dequant(qs[mt][rr][i], hds[mt][rr]) for rr in range(2)]
                for c, nib in enumerate(("lo", "hi")):
                    A = [a[0][nib, 0], a[1][nib, 0], a[0][nib, 1], a[1][nib, 1]]  # (g, k 2t..), (g+8, ..), (g, k 2t+8..), (g+8, ..)
                    for n in range(NTL):
                        ch = chains[mt][n][c]
                        b.emit(mma_sync(arch, "m16n8k16", "f16", b.vec(ch), b.vec(A), b.vec(xbs[n][2 * c:2 * c + 2]),
                                        b.vec(czero if i == 0 else ch)))
        mws = []  # the min MMA's B registers per tile: (hi pair, 0) or, hi_only, (hi pair, lo pair) at k, k + 8
        for n in range(NTL):
            if hi_only:
                mw = b.regs("b32", 2)
                b.emit("ld.shared.v2.b32", b.vec(mw), Mem(b.op("add.u32", st, lane_min), 32 * mslot * n))
            else:
                mw = [b.op("ld.shared.b32", Mem(b.op("add.u32", st, lane_min), 32 * mslot * n)), zero]
            mws.append(mw)
    else:
        cstep.body(st, jb, b.op("add.u32", st, lane_rec), ncol)
    facs = []  # facs[tile][e]: the lane's tokens' 2^-s
    for n in range(0 if i8 else NTL):
        fa = b.op("add.u32", st, lane_fac)
        if hi_only:
            f2 = b.regs("f32", 2)
            b.emit("ld.shared.v2.f32", b.vec(f2), Mem(fa, 32 * n))
            facs.append(f2)
        else:
            facs.append([b.op("ld.shared.f32", Mem(fa, 16 * n))])
    if kq and not i8:
        ms = [[b.regs("f32", 4) for _ in range(NTL)] for _ in range(MT)]
        for mt in range(MT):
            for n in range(NTL):
                ma = [hds[mt][0]["ma"], hds[mt][1]["ma"]]  # hi_only: the mins again at k + 8 for the lo pairs
                b.emit(mma_sync(arch, "m16n8k16", "f16", b.vec(ms[mt][n]), b.vec(ma + (ma if hi_only else [zero, zero])),
                                b.vec(mws[n]), b.vec(czero)))
    b.emit("bar.warp.sync", Imm(0xFFFFFFFF, "b32"))  # every lane has read the stage: refill it
    nxt = b.op("add.u32", jb, Imm(S, "u32"))
    issue(nxt, st, b.op("setp.lt.u32", nxt, jend))
    b.emit("cp.async.commit_group")
    if i8:
        pass  # (the step's sums are in istep; combined after the loop)
    elif not kq:
        cstep.finish(acc, facs, hi_only)
    else:
        for mt in range(MT):  # y += 2^-s·(d·C − 64·dmin·MS) for row 16·mt + g + 8·rr
            for rr in range(2):
                hd = hds[mt][rr]
                for n in range(NTL):
                    lo_c, hi_c, mm = chains[mt][n][0], chains[mt][n][1], ms[mt][n]
                    if hi_only:  # columns 2t, 2t + 1: two tokens
                        for e in range(2):
                            cs = b.op("add.rn.f32", lo_c[2 * rr + e], hi_c[2 * rr + e])
                            v = b.op("fma.rn.f32", hd["d"], cs, b.op("mul.rn.f32", hd["nd64"], mm[2 * rr + e]))
                            b.emit("fma.rn.f32", acc[mt][rr][n][e], v, facs[n][e], acc[mt][rr][n][e])
                    else:  # columns 2t (hi), 2t + 1 (lo) of one token
                        cs = b.op("add.rn.f32", b.op("add.rn.f32", lo_c[2 * rr], hi_c[2 * rr]),
                                  b.op("add.rn.f32", lo_c[2 * rr + 1], hi_c[2 * rr + 1]))
                        mins = b.op("add.rn.f32", mm[2 * rr], mm[2 * rr + 1])
                        v = b.op("fma.rn.f32", hd["d"], cs, b.op("mul.rn.f32", hd["nd64"], mins))
                        b.emit("fma.rn.f32", acc[mt][rr][n][0], v, facs[n][0], acc[mt][rr][n][0])
    b.emit("add.u32", count, count, Imm(1, "u32"))
    b.emit("add.u32", jb, jb, Imm(1, "u32"))
    b.bra(loop, pred=b.op("setp.lt.u32", jb, jend))
    b.place(done)
    t_loop = b.special("globaltimer_lo") if TRACE else None
    if i8:
        acc = istep.combine(ring, g, t)
    _sum_k_parts(b, [v for a_mt in acc for a_rr in a_mt for a_n in a_rr for v in a_n], ring, S * stage_bytes, lane,
                 kpart, KP)
    items = []  # lane (g, t): its tokens of rows 16·mt + g + 8·rr
    for mt in range(MT):
        for rr in range(2):
            row = b.op("add.u32", row0, b.op("add.u32", g, Imm(16 * mt + 8 * rr, "u32")))
            rok = b.op("setp.lt.u32", row, M)
            for n in range(NTL):
                for e in range(cols_per_lane):
                    tok = (b.op("mad.lo.u32", t, Imm(2, "u32"), Imm(8 * n + e, "u32")) if hi_only else
                           b.op("add.u32", t, Imm(4 * n, "u32")) if n else t)
                    ok = b.op("and.pred", rok, b.op("setp.lt.u32", tok, ntok))
                    items.append((ok, b.op("mad.lo.u32", tok, M, row), acc[mt][rr][n][e]))

    def trace():  # (TRACE) lane 0's record, after its stores
        b.emit("bar.warp.sync", Imm(0xFFFFFFFF, "b32"))
        first = b.op("and.pred", b.op("setp.eq.u32", tid, Imm(0, "u32")),
                     b.op("setp.le.u32", b.op("add.u32", row0, Imm(9, "u32")), M))  # a tile of ≥ 9 rows in y
        rec = b.regs("b32", 8)
        for r_, v in zip(rec, (b.special("smid"), t_entry, t_wait, t_first, t_loop, b.special("globaltimer_lo"),
                               *t_prep[:2])):
            b.emit("mov.b32", r_, v)
        at = b.op("mad.wide.u32", row0, Imm(4, "u32"), Y)
        b.emit("st.global.v4.b32", Mem(at), b.vec(rec[:4]), pred=first)
        b.emit("st.global.v4.b32", Mem(at, 16), b.vec(rec[4:]), pred=first)
        b.emit("st.global.b32", Mem(at, 32), t_prep[2], pred=first)
    _store_or_split(b, items, lane, gwarp, kz, nsplit, M, ntok, Y, part_p, cnt_p,
                    after_store=trace if TRACE else None)
    return b.finish()


# mmq_q4_k_rega_n{C}: (ring stages, resident CTAs per SM, m16 tiles per warp, warps) by the SM's shared memory and
# C; a stage is every warp's 16·MT rows x 144 bytes + one C-token record (17536 / 8768 bytes). n16 (sm_90a only):
# 2 stages x 3 CTAs measured best on 18944x3584 at T = 9-16 (28.2-28.7 µs vs 33.2-33.4 at 3 x 2), where it runs
# (ops.skinny16_ok); slowest of the plans on 4096² (bench/results/probe_skinny16_session18.log)
SKINNY_PLAN = {("big", 32): (3, 2, 2, 4), ("small", 32): (2, 1, 2, 4), ("big", 16): (2, 3, 2, 4),
               # the exact shared-record builds (SHARED_NOTE): a stage is 8 warps' 16 rows + one (hi, lo) record
               ("big", "t8s"): (4, 2, 1, 8), ("small", "t8s"): (3, 1, 1, 8),
               ("big", "t4s"): (4, 2, 1, 8), ("small", "t4s"): (3, 1, 1, 8)}
SHARED_NOTE = ("the exact few-token GEMV with its records shared by the CTA's warps (build_skinny's ring: the row "
               "tiles of a CTA on the same K-steps, one CTA barrier a step): at 8 tokens a record is 8480 bytes a "
               "step against a warp's 2304 of weights, copied once a CTA instead of once a warp. Not timed yet")
SKINNY_UNROLL = 2  # MMA pairs per iteration of the step's inner loop


def build_skinny(arch, C: int = T4.Q4K_SKINNY_COLUMNS, plan: tuple | None = None, fmt: str = "q4_K", exact: int = 0):
    """mmq_q4_k_rega_n{C} (C = 32, or 16 for up to 16 tokens; `plan` as SKINNY_PLAN's, by default the SM's shared
    memory's and C's): the few-token GEMV's decode for more tokens — a CTA's warps share one ring of records (C
    tokens' fp16 hi parts per super-block, prep_q4k_t{C}h per token group), so a record is copied once per CTA
    and not once per warp; one CTA barrier per step (cp.async groups, S stages, the stage consumed last step
    refilled after the barrier). Token groups of C over gridDim.z, split-K over gridDim.y with the GEMVs'
    deterministic last-warp fixup (counters per group and warp).

    exact = nt (gemv_<fmt>_mma_t{nt}s, nt = 4 or 8; SHARED_NOTE): the exact few-token GEMV on prep_q4k_t{nt}'s
    (hi, lo) records — the per-warp build's math (gemv_t1.build) with the records shared by the CTA's warps: one
    token group, the row tiles of a CTA on the same K range, split-K over gridDim.y."""
    COLS = 2 * exact if exact else C  # B columns of a record
    NTL = max(1, COLS // 8)
    what = "the register-A mma.sync skinny GEMM"
    arch.require("mma_sync_f16", what, "use mmq_q4_k_f16_n*")
    arch.require("cp_async", what, "use mmq_q4_k_f16_n*")
    from .. import codecs

    codec = codecs.get(fmt)
    kq = hasattr(codec, "RegDecoder")  # a K-quant's register decode; else (exact only) the codec's mma_block
    assert kq or exact, fmt
    BLOCK, BOX, SLOT = _row_geometry(codec) if not kq else (codec.BLOCK_BYTES,) * 3
    S, ctas, MT, NW = plan or SKINNY_PLAN[("big" if arch.max_smem_per_block >= 200 * 1024 else "small",
                                           f"t{exact}s" if exact else C)]
    R = 16 * MT
    W_BYTES = R * SLOT
    moff, foff, rb = T4.q4k_record_layout(exact, False) if exact else T4.q4k_record_layout(C, True)
    rec_at = NW * W_BYTES  # the record's offset in a stage
    stage_bytes = rec_at + rb
    table = codec.few_table(False)[1] if hasattr(codec, "few_table") else 0  # (TQ4_1S: the narrow, static table)
    S, ctas = _fit(arch, S, ctas, stage_bytes, extra=table)
    b = KernelBuilder(GemvKernel("few", fmt, exact, shared=True).name if exact else GemvKernel("skinny", fmt, C).name,
                      arch, (f"{fmt} GEMV (exact) for up to {exact} tokens on mma.sync: (hi, lo) B columns per token, "
                             "activation records shared by the CTA's warps" if exact else
                             f"{fmt} skinny GEMM on mma.sync: token groups of {C} (fp16 activation records shared by "
                             "the CTA's warps)") + (", A = q·sc decoded in registers from the raw super-blocks" if kq
                                                    else ", one MMA per 16-element sub-block, its scale in fp32 after it")
                      + ", weights and records by cp.async", block=(32 * NW, 1, 1))
    ps = _params(b, NW, ctas)
    part_p, cnt_p = ps[6:]
    ring_sym = b.dynamic_shared(S * stage_bytes + 128)
    pdl = arch.has("griddepcontrol")
    b.meta.update(split_k="gridDim.y splits K into contiguous runs of super-blocks; part: splits x ntok x m fp32, "
                          "counters: one u32 per token group and warp (zero, left zero)",
                  ctas_per_sm=ctas, tokens=C, token_groups="gridDim.z", rows_per_cta=R * NW, rows_per_warp=R,
                  warps=NW, grid="(ceil(m / rows_per_cta), splits, ceil(ntok / tokens))", fmt=fmt, mode="fp16",
                  hi_only=True, lane_cols=8, max_splits=T1_MAX_SPLITS, layout="q4k_mma_records",
                  activation=f"{GemvKernel('prep_few', 'q4_K', C, hi_only=True).name} per group of {C} tokens: one "
                             f"{rb}-byte record per super-block, the "
                             "groups back to back", copy="cp.async", stages=S, dynamic_smem=b.dynamic_smem, pdl=pdl)
    if exact:
        b.meta.update(tokens=exact, token_groups=1, mode="exact", hi_only=False, shared_records=SHARED_NOTE,
                      grid="(ceil(m / rows_per_cta), splits, 1)",
                      activation=f"{GemvKernel('prep_few', fmt, exact).name}(x): one {rb}-byte record per "
                                 "super-block")
        if not kq:
            b.meta.update(record_order=getattr(codec, "FEW_RECORD_ORDER", "sub16"))
    W, REC, Y, M, ntok, nsb, (tid, lane, warp, gwarp, row0), g, t = _entry(b, ps, NW, R)
    kz, nsplit, gz = b.special("ctaid.y"), b.special("nctaid.y"), b.special("ctaid.z")
    ring = b.op("and.b32", b.op("add.u32", b.op("mov.u32", ring_sym), Imm(127, "u32")), Imm(~127 & 0xFFFFFFFF, "b32"))
    b.comment(f"copy plan: each warp its rows' weight chunks c = lane + 32u = {BOX // 16}·row + column (as the "
              "few-token GEMV), the CTA's threads the group's record, chunk tid + 32·warps·u")
    # wst: this warp's weights in a stage; the group's records (both emitted inside _ring_copies)
    issue, wst = _ring_copies(b, R=R, lane=lane, row0=row0, M=M, nsb=nsb, W=W, xi=tid, nthr=32 * NW, rb=rb,
                              rec=lambda: b.op("mad.wide.u32", b.op("mul.lo.u32", gz, nsb), Imm(rb, "u32"), REC),
                              rec_at=rec_at, cache="cg", w_off=lambda: b.op("mul.lo.u32", warp, Imm(W_BYTES, "u32")),
                              block=BLOCK, box=BOX, slot=SLOT)
    stage_base = _stage_base(b, ring, stage_bytes)
    b.comment("split kz: super-blocks [kz·per, min((kz + 1)·per, nsb)). Prologue: steps 0 .. S - 2 (weights, then "
              "after the prep, griddepcontrol, their records); step s + S - 1 is issued at step s after the barrier "
              "into the stage step s - 1 used")
    jb, jend = _split_range(b, nsb, kz, nsplit)
    table = {}

    def early():  # (a codec's table: filled before the wait)
        table["consts"] = _codec_table(b, codec, tid, lane)
    _prologue(b, issue, stage_base, jb, jend, S - 1, pdl, early=early if hasattr(codec, "few_table") else None)
    count = b.op("mov.u32", Imm(0, "u32"))
    if not kq:
        return _skinny_codec_tail(b, arch, codec, exact, MT, NTL, NW, S, R, COLS, rec_at, foff, W_BYTES, stage_bytes,
                                  BLOCK, SLOT, issue, stage_base, jb, jend, count, tid, lane, warp, gwarp, row0, g, t,
                                  M, ntok, nsb, Y, kz, nsplit, part_p, cnt_p, table.get("consts"))
    dec = codec.RegDecoder(b, g, t)
    czero = dec.czero
    lane_b = b.op("mad.lo.u32", lane, Imm(16, "u32"), Imm(rec_at, "u32"))  # B pairs: column 8·tile + g, k-pair t
    if exact:  # the min pair's half (hi: column 2n, lo: 2n + 1) at 4·(4c + t); token 4·tile + t's factor
        assert 4 * COLS >= 32, exact  # (every lane's column exists: 4 tokens or more)
        lane_min = b.op("mad.lo.u32", lane, Imm(4, "u32"), Imm(rec_at + moff, "u32"))
        lane_fac = b.op("mad.lo.u32", b.op("and.b32", t, Imm(min(exact, 4) - 1, "b32")), Imm(4, "u32"),
                        Imm(rec_at + foff, "u32"))
    else:
        lane_min = b.op("mad.lo.u32", lane, Imm(8, "u32"), Imm(rec_at + moff, "u32"))
        lane_fac = b.op("mad.lo.u32", t, Imm(8, "u32"), Imm(rec_at + foff, "u32"))  # tokens 8·tile + 2t, + 1
    # acc[mt][rr][tile][e]: row 16·mt + g + 8·rr of the warp, token 8·tile + 2t + e of the group (exact: token
    # 4·tile + t, e = 0)
    acc = [[[[b.op("mov.f32", Imm(0.0, "f32")) for _ in range(1 if exact else 2)] for _ in range(NTL)]
            for _ in range(2)] for _ in range(MT)]
    loop, done, st = _shared_ring_step(b, S, issue, stage_base, jb, jend, count)
    stw = b.op("add.u32", st, wst)
    hds = [[dec.header(stw, 16 * mt + 8 * rr) for rr in range(2)] for mt in range(MT)]
    # the 8 MMA pairs i as a loop (unrolled by SKINNY_UNROLL): unrolled whole, ptxas hoisted every pair's B loads and
    # ran out of registers
    chains = [[b.regs("f32", 4) for _ in range(NTL)] for _ in range(MT)]  # both nibbles' MMAs in one chain
    for ch in (c_ for row_ in chains for c_ in row_):
        for r_ in ch:
            b.emit("mov.f32", r_, Imm(0.0, "f32"))
    xrec = b.op("add.u32", st, lane_b)
    qsp = b.op("add.u32", stw, dec.lane_qs)  # word i of the lane's qs chunk at + 4i
    iend = b.op("add.u32", qsp, Imm(32, "u32"))
    pairs = b.label("pairs")
    b.place(pairs)
    for u in range(SKINNY_UNROLL):
        xbs = _b_tiles(b, xrec, 64 * COLS * u, NTL)
        for mt in range(MT):
            a = [dec.dequant(dec.word_at(qsp, BLOCK * (16 * mt + 8 * rr) + 4 * u), hds[mt][rr]) for rr in range(2)]
            for c, nib in enumerate(("lo", "hi")):
                A = [a[0][nib, 0], a[1][nib, 0], a[0][nib, 1], a[1][nib, 1]]
                for n in range(NTL):
                    ch = chains[mt][n]
                    b.emit(mma_sync(arch, "m16n8k16", "f16", b.vec(ch), b.vec(A), b.vec(xbs[n][2 * c:2 * c + 2]),
                                    b.vec(ch)))
    b.emit("add.u32", xrec, xrec, Imm(64 * COLS * SKINNY_UNROLL, "u32"))
    b.emit("add.u32", qsp, qsp, Imm(4 * SKINNY_UNROLL, "u32"))
    b.bra(pairs, pred=b.op("setp.lt.u32", qsp, iend))
    for n in range(NTL):
        if exact:  # as gemv_t1.build: the min MMA on (hi or lo half, 0), y += 2^-s·(d·(C hi + C lo) − 64·dmin·MS)
            mw = [b.op("ld.shared.b32", Mem(b.op("add.u32", st, lane_min), 128 * n)), dec.zero]
            fac = b.op("ld.shared.f32", Mem(b.op("add.u32", st, lane_fac), 16 * n))
            for mt in range(MT):
                ma = [hds[mt][0]["ma"], hds[mt][1]["ma"]]
                ms = b.regs("f32", 4)
                b.emit(mma_sync(arch, "m16n8k16", "f16", b.vec(ms), b.vec(ma + [dec.zero, dec.zero]), b.vec(mw),
                                b.vec(czero)))
                for rr in range(2):
                    hd, ch = hds[mt][rr], chains[mt][n]
                    cs = b.op("add.rn.f32", ch[2 * rr], ch[2 * rr + 1])
                    v = b.op("fma.rn.f32", hd["d"], cs,
                             b.op("mul.rn.f32", hd["nd64"], b.op("add.rn.f32", ms[2 * rr], ms[2 * rr + 1])))
                    b.emit("fma.rn.f32", acc[mt][rr][n][0], v, fac, acc[mt][rr][n][0])
            continue
        mw, fac = b.regs("b32", 2), b.regs("f32", 2)
        b.emit("ld.shared.v2.b32", b.vec(mw), Mem(b.op("add.u32", st, lane_min), 256 * n))
        b.emit("ld.shared.v2.f32", b.vec(fac), Mem(b.op("add.u32", st, lane_fac), 32 * n))
        for mt in range(MT):  # y += 2^-s·(d·C − 64·dmin·MS): the mins' hi pairs at k, lo pairs at k + 8
            ma = [hds[mt][0]["ma"], hds[mt][1]["ma"]]
            ms = b.regs("f32", 4)
            b.emit(mma_sync(arch, "m16n8k16", "f16", b.vec(ms), b.vec(ma + ma), b.vec(mw), b.vec(czero)))
            for rr in range(2):
                hd = hds[mt][rr]
                for e in range(2):
                    v = b.op("fma.rn.f32", hd["d"], chains[mt][n][2 * rr + e], b.op("mul.rn.f32", hd["nd64"], ms[2 * rr + e]))
                    b.emit("fma.rn.f32", acc[mt][rr][n][e], v, fac[e], acc[mt][rr][n][e])
    b.emit("add.u32", count, count, Imm(1, "u32"))
    b.emit("add.u32", jb, jb, Imm(1, "u32"))
    b.bra(loop, pred=b.op("setp.lt.u32", jb, jend))
    b.place(done)
    tok0 = t if exact else b.op("mad.lo.u32", gz, Imm(C, "u32"), b.op("shl.b32", t, Imm(1, "u32")))  # token 2t
    items = []
    for mt in range(MT):
        for rr in range(2):
            row = b.op("add.u32", row0, b.op("add.u32", g, Imm(16 * mt + 8 * rr, "u32")))
            rok = b.op("setp.lt.u32", row, M)
            for n in range(NTL):
                for e in range(1 if exact else 2):
                    tok = b.op("add.u32", tok0, Imm(4 * n if exact else 8 * n + e, "u32"))
                    ok = b.op("and.pred", rok, b.op("setp.lt.u32", tok, ntok))
                    items.append((ok, b.op("mad.lo.u32", tok, M, row), acc[mt][rr][n][e]))
    gcnt = b.op("mad.lo.u32", b.op("mul.lo.u32", gz, b.special("nctaid.x")), Imm(NW, "u32"), gwarp)  # group's counters
    _store_or_split(b, items, lane, gcnt, kz, nsplit, M, ntok, Y, part_p, cnt_p, lean=True)
    return b.finish()

def _shared_ring_step(b, S, issue, stage_base, jb, jend, count):
    """The head of a step on a ring a CTA's warps share (build_skinny): past the run to `done`; this thread's copies
    of step jb, the CTA barrier (everyone's; every warp done with the stage of step jb - 1), step jb + S - 1 issued
    into that stage. Returns (the loop's label, done, the step's stage)."""
    loop, done = b.label("step"), b.label("steps_done")
    b.bra(done, pred=b.op("setp.ge.u32", jb, jend))
    b.place(loop)
    b.emit("cp.async.wait_group", Imm(S - 2, "u32"))  # this thread's copies of step jb
    b.emit("bar.sync", Imm(0, "u32"))  # everyone's; and every warp is done with the stage of step jb - 1
    nxt = b.op("add.u32", jb, Imm(S - 1, "u32"))
    issue(nxt, stage_base(b.op("rem.u32", b.op("add.u32", count, Imm(S - 1, "u32")), Imm(S, "u32"))),
          b.op("setp.lt.u32", nxt, jend))
    b.emit("cp.async.commit_group")
    return loop, done, stage_base(b.op("rem.u32", count, Imm(S, "u32")))


def _skinny_codec_tail(b, arch, codec, nt, MT, NTL, NW, S, R, COLS, rec_at, foff, W_BYTES, stage_bytes, BLOCK, SLOT,
                       issue, stage_base, jb, jend, count, tid, lane, warp, gwarp, row0, g, t, M, ntok, nsb, Y, kz, nsplit,
                       part_p, cnt_p, consts=None):
    """build_skinny(exact=nt)'s K loop and stores for a codec with an mma_block (Q6_K, Q8_0, TQ4_1S): each warp's
    rows through _CodecStep (its stage rows at warp·W_BYTES, the CTA's record after them), as gemv_t1.build's."""
    cstep = _CodecStep(b, arch, codec, MT, NTL, g, t, row0, M, nsb, BLOCK, SLOT, tid, lane, consts)
    col_lane = b.op("and.b32", lane, Imm(min(32, 4 * COLS) - 1, "b32"))
    lane_rec = b.op("mad.lo.u32", col_lane, Imm(16, "u32"), Imm(rec_at, "u32"))
    lane_fac = b.op("mad.lo.u32", b.op("and.b32", t, Imm(min(nt, 4) - 1, "b32")), Imm(4, "u32"), Imm(rec_at + foff, "u32"))
    acc = [[[[b.op("mov.f32", Imm(0.0, "f32"))] for _ in range(NTL)] for _ in range(2)] for _ in range(MT)]
    wst = b.op("mul.lo.u32", warp, Imm(W_BYTES, "u32"))
    loop, done, st = _shared_ring_step(b, S, issue, stage_base, jb, jend, count)
    cstep.body(b.op("add.u32", st, wst), jb, b.op("add.u32", st, lane_rec), COLS)
    facs = [[b.op("ld.shared.f32", Mem(b.op("add.u32", st, lane_fac), 16 * n))] for n in range(NTL)]
    cstep.finish(acc, facs)
    b.emit("add.u32", count, count, Imm(1, "u32"))
    b.emit("add.u32", jb, jb, Imm(1, "u32"))
    b.bra(loop, pred=b.op("setp.lt.u32", jb, jend))
    b.place(done)
    items = []  # lane (g, t): token t + 4·tile of rows 16·mt + g + 8·rr
    for mt in range(MT):
        for rr in range(2):
            row = b.op("add.u32", row0, b.op("add.u32", g, Imm(16 * mt + 8 * rr, "u32")))
            rok = b.op("setp.lt.u32", row, M)
            for n in range(NTL):
                tok = b.op("add.u32", t, Imm(4 * n, "u32"))
                items.append((b.op("and.pred", rok, b.op("setp.lt.u32", tok, ntok)), b.op("mad.lo.u32", tok, M, row),
                              acc[mt][rr][n][0]))
    _store_or_split(b, items, lane, gwarp, kz, nsplit, M, ntok, Y, part_p, cnt_p, lean=True)
    return b.finish()


_BUILDS = [(nt, False) for nt in T4.Q4K_RECORD_TOKENS] + [(T4.Q4K_HI_TOKENS, True)]
KERNELS = [KernelDef(GemvKernel("few", "q4_K", nt, hi_only=h).name,
                     f"q4_K GEMV, T ≤ {nt}, {'fp16 activations' if h else 'exact'}, mma.sync with "
                     f"{'one hi column' if h else '(hi, lo) B columns'} per token, weights and activation records "
                     f"through a per-warp cp.async ring (activation from "
                     f"{GemvKernel('prep_few', 'q4_K', nt, hi_only=h).name})",
                     lambda arch, nt=nt, h=h: build(arch, nt, h)) for nt, h in _BUILDS]
FEW_FORMATS = ("q5_K",)  # other K-quants on the same builds (their codec's RegDecoder; Q4_K's records and prep)
KERNELS += [KernelDef(GemvKernel("few", f, nt, hi_only=h).name,
                      f"{f} GEMV, T ≤ {nt}, {'fp16 activations' if h else 'exact'}, as "
                      f"{GemvKernel('few', 'q4_K', nt, hi_only=h).name} with the codec's register decode (the fifth "
                      f"bits from qh), on {GemvKernel('prep_few', 'q4_K', nt, hi_only=h).name}'s records",
                      lambda arch, nt=nt, h=h, f=f: build(arch, nt, h, fmt=f)) for f in FEW_FORMATS for nt, h in _BUILDS]
CODEC_FORMATS = ("q6_K", "q8_0")  # codecs with an mma_block on the exact builds (_CodecStep; prep_sub16_t* records)
# TQ4_1S on the same builds: its mma_block takes A in two parts (hi, lo) from a pair table in shared memory, on the
# records of the rotated activation (prep_rot16_t*); no one-launch build (its records would need the rotation)
ROT_FORMATS = ("tq4_1s",)


def _codec_doc(f: str, nt: int) -> str:
    weights = ("codebook in fp16 hi and lo parts, the two row halves of one MMA per 16-element half (a pair table "
               "in shared memory)" if f in ROT_FORMATS else "integer weights: one MMA per 16-element sub-block")
    return (f"{f} GEMV, T ≤ {nt}, exact, as {GemvKernel('few', 'q4_K', nt).name} with the codec's {weights}, its "
            f"scale in fp32 after it, on {GemvKernel('prep_few', f, nt).name}'s records")


KERNELS += [KernelDef(GemvKernel("few", f, nt).name, _codec_doc(f, nt), lambda arch, nt=nt, f=f: build(arch, nt, fmt=f),
                      archs=_built_for(f, nt)) for f in CODEC_FORMATS + ROT_FORMATS for nt in T4.Q4K_RECORD_TOKENS]
# ... and for 9-16 tokens on fp16 activations (one hi column a token, prep_sub16_t16h), as Q4_K's / Q5_K's t16h
KERNELS += [KernelDef(GemvKernel("few", f, T4.Q4K_HI_TOKENS, hi_only=True).name,
                      f"{f} GEMV, T ≤ {T4.Q4K_HI_TOKENS}, fp16 activations, as "
                      f"{GemvKernel('few', 'q4_K', T4.Q4K_HI_TOKENS, hi_only=True).name} with the codec's integer weights "
                      f"(one MMA per 16-element sub-block, its scale in fp32 after it), on "
                      f"{GemvKernel('prep_few', f, T4.Q4K_HI_TOKENS, hi_only=True).name}'s records",
                      lambda arch, f=f: build(arch, T4.Q4K_HI_TOKENS, True, fmt=f),
                      archs=_built_for(f, T4.Q4K_HI_TOKENS, True)) for f in CODEC_FORMATS]
FUSED_TOKENS = (1, 2, 4)  # the decode builds dispatched for 1-4 tokens, each also in one launch
KERNELS += [KernelDef(GemvKernel("few", f, nt, fused=True).name,
                      f"{f} GEMV, T ≤ {nt}, exact, as {GemvKernel('few', f, nt).name} in one launch: "
                      "the kernel's first CTAs build the activation records from x, every CTA waits for them",
                      lambda arch, nt=nt, f=f: build(arch, nt, False, fused=True, fmt=f),
                      archs=_built_for(f, nt) if f in CODEC_FORMATS else TARGETS)
            for f in ("q4_K",) + FEW_FORMATS + CODEC_FORMATS for nt in FUSED_TOKENS]
PREPS = [KernelDef(GemvKernel("prep_few", "q4_K", nt, hi_only=h).name, f"activation of up to {nt} tokens: scaled fp16 "
                   f"{'hi' if h else 'hi/lo'} records and min pairs ({GemvKernel('few', 'q4_K', nt, hi_only=h).name})",
                   lambda arch, nt=nt, h=h: build_prep_mma(arch, rotate=False, records=nt, hi_only=h,
                                                           ready=T1_FLAG and not h))
         for nt, h in _BUILDS]
PREPS += [KernelDef(GemvKernel("prep_few", CODEC_FORMATS[0], nt).name, f"activation of up to {nt} tokens: scaled fp16 "
                    f"hi/lo records in the codecs' 16-element sub-block order ({', '.join(GemvKernel('few', f, nt).name for f in CODEC_FORMATS)})",
                    lambda arch, nt=nt: build_prep_mma(arch, rotate=False, records=nt, order="sub16", ready=T1_FLAG))
          for nt in T4.Q4K_RECORD_TOKENS]
PREPS.append(KernelDef(GemvKernel("prep_few", CODEC_FORMATS[0], T4.Q4K_HI_TOKENS, hi_only=True).name,
                       f"activation of up to {T4.Q4K_HI_TOKENS} tokens: scaled fp16 hi records in the codecs' 16-element "
                       "sub-block order (" + ", ".join(GemvKernel("few", f, T4.Q4K_HI_TOKENS, hi_only=True).name
                                                       for f in CODEC_FORMATS) + ")",
                       lambda arch: build_prep_mma(arch, rotate=False, records=T4.Q4K_HI_TOKENS, hi_only=True,
                                                   order="sub16")))
PREPS += [KernelDef(GemvKernel("prep_few", "tq4_1s", nt).name, f"activation of up to {nt} tokens: forward RHT, scaled "
                    f"fp16 hi/lo records in the codecs' 16-element sub-block order ({GemvKernel('few', 'tq4_1s', nt).name})",
                    lambda arch, nt=nt: build_prep_mma(arch, rotate=True, records=nt, order="rot16", ready=T1_FLAG))
          for nt in T4.Q4K_RECORD_TOKENS]
# the int8 builds (_I8Step): Q4_K's nibbles on the activation's digit planes, 4 + 8 integer instructions an MMA of 512
# weights where the fp16 build decodes 256 in 18 (shipped per format up to rule few_i8_max_tokens' tokens)
I8_FORMATS = ("q4_K", "q5_K", "q6_K", "q8_0")  # the codecs with int8 A operands (their I8A, Q6_K's and Q8_0's I8Block)
_I8_A = {"q4_K": "the 4-bit weights as A (ldmatrix and masks a 64-weight group)",
         "q5_K": "the 5-bit weights as A (ldmatrix and masks a 64-weight group)",
         "q6_K": "the 6-bit weights as A (a bit select a 16-element sub-block), the −32 as one MMA of the scales on "
                 "the sub-block digit sums a step",
         "q8_0": "the int8 quants as A as they lie (s8 x s8), each block's fp16 scale in fp32 after its two MMAs"}
KERNELS += [KernelDef(GemvKernel("few", f, nt, i8=True).name,
                      f"{f} GEMV, T ≤ {nt}, exact, integer mma.sync: {_I8_A[f]}, x as three int8 digit planes, the "
                      "scales on the integer sums, through a per-warp cp.async ring (activation from "
                      f"{GemvKernel('prep_few', f, nt, i8=True).name})",
                      lambda arch, nt=nt, f=f: build(arch, nt, i8=True, fmt=f)) for f in I8_FORMATS
            for nt in T4.Q4K_RECORD_TOKENS]
KERNELS += [KernelDef(GemvKernel("few", f, nt, fused=True, i8=True).name,
                      f"{f} GEMV, T ≤ {nt}, exact, as {GemvKernel('few', f, nt, i8=True).name} in one launch: "
                      "the kernel's first CTAs build the digit-plane records from x, every CTA waits for them",
                      lambda arch, nt=nt, f=f: build(arch, nt, fused=True, i8=True, fmt=f)) for f in I8_FORMATS
            for nt in FUSED_TOKENS]
# every one-launch build's twin on fp16 x (an eager call on a torch model's fp16 activations: one launch, no
# convert_f32 before it; the records of the fp32 widening, bit for bit)
_X16_DOC = " on fp16 x (each value widened as the records are built: no convert_f32 launch before it)"
KERNELS += [KernelDef(GemvKernel("few", f, nt, fused=True, x16=True).name, GemvKernel("few", f, nt, fused=True).name
                      + _X16_DOC, lambda arch, nt=nt, f=f: build(arch, nt, False, fused=True, fmt=f, x16=True),
                      archs=_built_for(f, nt) if f in CODEC_FORMATS else TARGETS)
            for f in ("q4_K",) + FEW_FORMATS + CODEC_FORMATS for nt in FUSED_TOKENS]
KERNELS += [KernelDef(GemvKernel("few", f, nt, fused=True, i8=True, x16=True).name,
                      GemvKernel("few", f, nt, fused=True, i8=True).name + _X16_DOC,
                      lambda arch, nt=nt, f=f: build(arch, nt, fused=True, i8=True, fmt=f, x16=True))
            for f in I8_FORMATS for nt in FUSED_TOKENS]
PREPS += [KernelDef(GemvKernel("prep_few", "q4_K", nt, i8=True).name, f"activation of up to {nt} tokens: int8 digit "
                    f"planes of x·2^s, fp16 min pairs ({GemvKernel('few', 'q4_K', nt, i8=True).name})",
                    lambda arch, nt=nt: build_prep_mma(arch, rotate=False, records=nt, order="i8"))
          for nt in T4.Q4K_RECORD_TOKENS]
PREPS += [KernelDef(GemvKernel("prep_few", "q6_K", nt, i8=True).name, f"activation of up to {nt} tokens: int8 digit "
                    f"planes of x·2^s, fp16 sub-block digit sums ({GemvKernel('few', 'q6_K', nt, i8=True).name}, "
                    f"{GemvKernel('few', 'q8_0', nt, i8=True).name})",
                    lambda arch, nt=nt: build_prep_mma(arch, rotate=False, records=nt, order="i8q6"))
          for nt in T4.Q4K_RECORD_TOKENS]
# the same preps on fp16 x (a torch model's activations), widened as loaded: the records of x.astype(float32) bit for
# bit, with no convert_f32 launch (and grid dependency) ahead of them — the graph-replayed decode's preps
X16_PREPS = [(fmt, nt, i8) for fmt, i8 in (("q4_K", False), (CODEC_FORMATS[0], False), ("q4_K", True), ("q6_K", True))
             for nt in T4.Q4K_RECORD_TOKENS]
PREPS += [KernelDef(GemvKernel("prep_few", fmt, nt, i8=i8, x16=True).name,
                    f"{GemvKernel('prep_few', fmt, nt, i8=i8).name} on fp16 x (each value widened as it is loaded)",
                    lambda arch, nt=nt, fmt=fmt, i8=i8: build_prep_mma(
                        arch, rotate=False, records=nt, x16=True,
                        order=("i8q6" if fmt == "q6_K" else "i8") if i8 else "q4k" if fmt == "q4_K" else "sub16"))
          for fmt, nt, i8 in X16_PREPS]
_C, _HI = T4.Q4K_SKINNY_COLUMNS, T4.Q4K_HI_TOKENS
_SKINNY, _SKINNY_HI = GemvKernel("skinny", "q4_K", _C).name, GemvKernel("skinny", "q4_K", _HI).name
_PREP_C, _PREP_HI = (GemvKernel("prep_few", "q4_K", c, hi_only=True).name for c in (_C, _HI))
KERNELS.append(KernelDef(_SKINNY_HI, f"q4_K skinny GEMM as {_SKINNY} for up to {_HI} tokens ({_PREP_HI} records "
                         "shared by the CTA's warps)", lambda arch: build_skinny(arch, _HI), archs=("sm_90a",)))
SHARED_FORMATS = ("q4_K",) + FEW_FORMATS + CODEC_FORMATS + ROT_FORMATS  # the builds with shared records (t4s, t8s)
KERNELS += [KernelDef(GemvKernel("few", f, nt, shared=True).name, f"{f} GEMV, T ≤ {nt}, exact, as "
                      f"{GemvKernel('few', f, nt).name} with the activation records shared by the CTA's warps (one ring "
                      f"a CTA, its row tiles on the same K-steps), on {GemvKernel('prep_few', f, nt).name}'s records",
                      lambda arch, nt=nt, f=f: build_skinny(arch, fmt=f, exact=nt)) for f in SHARED_FORMATS
            for nt in (4, 8)]
KERNELS.append(KernelDef(_SKINNY, f"q4_K skinny GEMM on mma.sync for token groups of {_C}: A decoded "
                         "in registers from the raw super-blocks, fp16 activation records shared by the CTA's warps "
                         f"({_PREP_C}), cp.async ring, one CTA barrier per step", build_skinny))
KERNELS += [KernelDef(GemvKernel("skinny", f, _C).name, f"{f} skinny GEMM as {_SKINNY}, with the codec's register "
                      "decode", lambda arch, f=f: build_skinny(arch, fmt=f)) for f in FEW_FORMATS]
PREPS.append(KernelDef(_PREP_C, f"activation of a group of up to {_C} tokens: scaled fp16 hi records and "
                       f"min pairs ({_SKINNY})",
                       lambda arch: build_prep_mma(arch, rotate=False, records=_C, hi_only=True)))
# ... and the hi-only preps (9-32 tokens: the t16h GEMV, the skinny GEMMs) on fp16 x likewise
PREPS += [KernelDef(GemvKernel("prep_few", "q4_K", c, hi_only=True, x16=True).name,
                    f"{GemvKernel('prep_few', 'q4_K', c, hi_only=True).name} on fp16 x (each value widened as it is "
                    "loaded)", lambda arch, c=c: build_prep_mma(arch, rotate=False, records=c, hi_only=True, x16=True))
          for c in (_HI, _C)]
PREPS.append(KernelDef(GemvKernel("prep_few", CODEC_FORMATS[0], _HI, hi_only=True, x16=True).name,
                       f"{GemvKernel('prep_few', CODEC_FORMATS[0], _HI, hi_only=True).name} on fp16 x (each value "
                       "widened as it is loaded)",
                       lambda arch: build_prep_mma(arch, rotate=False, records=_HI, hi_only=True, order="sub16",
                                                   x16=True)))
