"""Prefill GEMM ("MMQ") on the mma.sync path: y = x @ W.T, W in Q4_K (GGUF bytes; the other codecs: see F16_CODECS),
x fp32 (T × K), y fp32.

fp16 path, one description for sm_89 and sm_120a (on an H200 the sm_89 PTX is compiled for sm_90):
- block tile BM=128 weight rows × BN tokens × BK=64 (one pair of Q4_K sub-blocks: 32 bytes of qs per row
  plus the super-block's 16-byte header); 8 warps as 2 (M) × 4 (N), warp tile 64 × BN/4;
- raw weight bytes go global → shared with cp.async.cg (16 B) into a 3-stage ring (commit/wait groups), so
  the copy of step s+2 overlaps the dequant of s+1 and the MMA of s; on sm_120a thread 0 brings them by TMA
  (three boxes of 16 bytes x 128 rows per step, one per 16-byte column) into an mbarrier ring of the Pipeline's stages, and
  the _x16 builds' fp16 activations by TMA too, 128B-swizzled (the B ldmatrix addresses swizzled to match);
- each step, threads dequantize the landed raw tile to fp16 in shared memory: nibbles become fp16 by
  `prmt` + `lop3` with the 0x6400 exponent (1024 + q), then q·sc by one exact fma.f16x2 and w = (q·sc)·d −
  dmin·m in two more (dmin·m formed in fp32, as ggml does, split into fp16 hi + lo: `codecs/q4_k.py` f16_words);
- activations are loaded fp32 one step ahead into registers and converted to fp16 into shared memory
  (fused: no separate conversion pass over DRAM); an activation that overflows fp16 makes its item's sums
  non-finite, which raises a flag (checked once per item on the accumulators), and `mul_mat` then recomputes
  exactly (fp32) instead of returning a wrong answer; the _x16 builds read fp16 x (convert_f16 first) and
  copy it with cp.async straight into the B buffers, one step ahead (faster for large products: runtime.ops);
- fragments come from `ldmatrix.x4` over rows padded to 144 B (8 row addresses hit 8 distinct 16-byte
  bank groups), `mma.sync.m16n8k16.f32.f16.f16.f32` accumulates in fp32;
- grid: x = token tiles (fastest, so CTAs that share a weight tile run together and reuse it from L2),
  y = weight-row tiles. Partial tiles are clamped (TMA: zero-filled) on load and masked on store. No atomics: deterministic.
"""
from __future__ import annotations

import re

from functools import partial
from typing import Callable, NamedTuple

from ..arch import get_arch
from ..builder import KernelBuilder
from ..dsl import Epilogue, Mma, Pipeline, Schedule, Tile
from .. import codecs, layouts
from ..codecs import _common
from ..ir import Imm, Mem, Reg, Sym, TensorRef, ldmatrix, mma_sync
from ..ir import wgmma as ir_wgmma
from ..specs import ROW_GROUP, ROW_GROUP_FORMATS, MmqSpec
from ..targets import lowering_for
from . import KernelDef, smem_share
from .convert_f16 import conversion_flag, too_small
from .gemv import TMA_CTA, TMA_STEP, _wait_step

# the raw ring (cp.async / TMA copies of a codec's raw rows, decoded from shared memory): the codec that declares
# RAW_RING (Q4_K) gives its geometry; the GEMMs' K step is one pair of its sub-blocks
RAW_CODEC = next(c for c in codecs.CODECS.values() if getattr(c, "RAW_RING", False))
BM, BK, STAGES = 128, RAW_CODEC.STEP_K, 3
MMQ_RASTER = True  # the mma.sync MMQs' item raster (_claim_item; False: the order before it, for A/B probes)
RASTER_BYTES = 24 << 20  # fp32 activations per band of token tiles
RAW_ROW = RAW_CODEC.STEP_ROW_BYTES  # bytes per row per stage: 16 header + 32 qs
PAD_ROW = 144  # bytes per row of the fp16 tiles: 64 halves + 16 bytes of padding
TOKEN_TILES = (32, 64, 128)
GROUPED_TOKEN_TILES = (32, 64)  # the MoE GEMM's pairs per tile (an expert at T = 512, top-8 of 128: ~32 pairs)
GROUPED_FORMATS = ("q4_K", "q5_K", "q6_K", "q8_0", "tq4_1s")  # Q4_K by its raw ring; the others by their codec's run8
F16_CODECS = codecs.with_route("mmq_f16")  # the dense fp16 mma.sync GEMM's other codecs (sm_89, sm_120a): A by run8
GROUPED_WGMMA_TOKEN_TILES = (32, 64, 128)  # the register-A wgmma MoE GEMM (sm_90a, Q4_K): an expert's pairs per tile
# ... and Q4_K's tiles between them: an expert's ~32 or ~64 pairs (bench_moe's T = 512) in one tile with less MMA and
# B traffic than the next tile up (the grouped GEMM's cost is per item: the tile's weights decoded once), at 2 CTAs
# an SM (n96: half-block stages). n48 ships (rule moe_wgmma_tile_pairs: 24-35 pairs an expert, 3-5% faster than n64
# there, probe_n48_*_3e5a4f9.log); n96 measured slower than n64 (bench/NOTES.md, 2026-12-04) and is not shipped.
GROUPED_WGMMA_Q4K_TILES = (48, 96)
# ... and with a 256-row M tile (MmqSpec.bm: four consumer warpgroups, one CTA an SM), so that an SM takes in each
# activation tile once per 256 weight rows, not per 128: halving those bytes (mmq.GROUPED_SKELETON "halfb") took
# 128 x top-8 T = 512 from 81 to 64 graph µs. n48's ships in place of n48 (rule moe_wgmma_tile_pairs "n48_m256":
# 3-5 µs faster at T = 256-512); an n64 one lost (32 x top-4 T = 512 67.8 -> 78.1, not profiled; it spilled at the
# consumers' 104 registers: bench/NOTES.md, 2026-12-04, night). n64 and n80 are trial builds again (not shipped) at
# WIDE_CONSUMER_REGS, no spill, for 32 x top-4 T = 512 (64 pairs an expert: n64 decodes about half the experts
# twice); an n96 one spills at 112 and is not built.
GROUPED_WIDE_TILES = (48, 64, 80)
F16_CTAS_PER_SM = {32: 3, 64: 2, 128: 1}  # the fp16 mma.sync MMQ's register budget (.minnctapersm) per token tile
F16_FOUR_OP_TILES = {(32, True)}  # (BN, x16) of fp16 mma.sync builds that keep four-instruction dequant pairs: the
# three-instruction form's extra scale register spilled n32_x16 at its 3-CTA budget (sm_89, 2026-12-01)
TAIL_SPLIT_NOTE = ("items: the first `whole` tiles over all of K, then the other tiles split into `splits` K ranges of "
                   "steps_per_split K-steps (z-major: every tile's split 0 first); a split writes its partial in "
                   "fragment order to part (splits x (tiles - whole) x 128·BN fp32) unless it is the last to count "
                   "in at the tile's counter (arrivals in the low 16 bits, published partials in the high 16); the "
                   "last waits for the others' partials and sums them in z order around its own, kept in "
                   "registers, and stores y (deterministic); no reduction launch. With spread = 1 (at most 4 "
                   "splits, every split item holding a CTA at once: runtime.ops.mmq_spread_fixup) each split stores "
                   "the rows the others own, waits for all, sums its own rows (m16 row i % splits == z) in z order "
                   "and stores those (the same bits)")
SPLIT_K_NOTE = ("split z takes K-steps [z·steps_per_split, ...) and writes its partial tile to part + z·t·m; the CTA "
                "that arrives last at the tile's counter sums the partials in z order into y (deterministic) and "
                "resets the counter: no reduction launch")
Q8_STAGES = 6  # prefetch distance 4 steps: the small-T GEMM is latency-bound with fewer
Q8_TOKEN_TILES = (16, 32, 64)  # n128 needs > 255 registers (spills); the fp16 path serves large T
Q8_WARPS = {16: (8, 1), 32: (4, 2), 64: (2, 4)}  # BN -> (warps along M, warps along N): warp tiles 16x16, 32x16, 64x16
# launch bounds: registers for 3 / 2 / 1 CTAs of 256 threads (the fused n16 would spill at 3, the fused n32 at 2)
Q8_CTAS_PER_SM = {(16, False): 3, (16, True): 2, (32, False): 2, (32, True): 1, (64, False): 1, (64, True): 1}
ACT_ROW = 80  # bytes per token row of the int8 activation tile: 64 + 16 padding (8 rows hit 8 bank groups)


def spec_tile(spec: MmqSpec) -> Tile:
    """The block tile of an MMQ spec (BM x BN x BK, warps and warp tiles by lowering)."""
    if spec.mma == "wgmma":  # 8 consumer warps = 2 warpgroups of 64 rows; a warp owns 16 rows x BN
        return Tile(BM, spec.bn, BK, warps=8, warp_m=16, warp_n=spec.bn)
    if spec.act == "q8_1":
        wm, wn = Q8_WARPS[spec.bn]
        return Tile(BM, spec.bn, BK, warps=8, warp_m=BM // wm, warp_n=spec.bn // wn)
    return Tile(BM, spec.bn, BK, warps=8, warp_m=64, warp_n=spec.bn // 4)


def describe(arch, spec: MmqSpec):
    """The one MMQ description both lowerings build from: block tile, pipeline, tensor-core op, schedule
    and epilogue, each validated against the target (a wgmma request on sm_120a is an ArchError here)."""
    tile = spec_tile(spec)
    tile.check_format("q4_K")
    low = lowering_for(arch)
    # fp16 mma.sync: a 3-stage ring by the target's copy (cp.async on sm_89; on sm_120a TMA + mbarrier,
    # _tma_pipeline); Q8_1: 6-stage cp.async on both targets (its MMA reads the raw ring itself, in the rows cp.async
    # writes); wgmma: 4-stage TMA
    if spec.mma == "wgmma":
        pipe = Pipeline(WG_STAGES, copy="tma")
    elif spec.act == "q8_1":
        pipe = Pipeline(Q8_STAGES, copy="cp.async")
    else:
        pipe = Pipeline(STAGES)
    pipe = Pipeline(pipe.stages, low.pick_copy(pipe))
    mma = Mma("s8" if spec.act == "q8_1" else "f16", spec.mma)
    low.pick_mma(mma, tile)
    rg = {"row_group": spec.row_group, "row_span": spec.bm // spec.row_group} if spec.row_group > 1 else {}
    return tile, pipe, mma, Schedule("persistent"), Epilogue("f32", transposed=True, **rg)


class _F16Tile(NamedTuple):
    """The fp16 mma.sync MMQ's token tile and shared-memory sizes (bytes)."""
    BN: int
    x16: bool  # x arrives in fp16 (convert_f16 first): half the bytes per step, no conversion
    raw_bytes: int  # one raw ring stage: BM rows of RAW_ROW
    a_bytes: int  # the fp16 A tile (BM rows of PAD_ROW)
    b_bytes: int  # the fp16 B tile (BN token rows of b_row bytes)
    pair: int  # one fp16 (A, B) buffer; there are two: step s is multiplied from buffer s % 2
    b_row: int = PAD_ROW  # bytes per token row of B: 128 where TMA writes it (x16 on sm_120a), 128B-swizzled


def _f16_tile(spec: MmqSpec, tma: bool = False) -> _F16Tile:
    """The _F16Tile of an fp16 mma.sync spec (`tma`: its sm_120a lowering)."""
    b_row = 128 if tma and not spec.fused else PAD_ROW
    a_bytes, b_bytes = BM * PAD_ROW, spec.bn * b_row
    return _F16Tile(spec.bn, not spec.fused, BM * RAW_ROW, a_bytes, b_bytes, a_bytes + b_bytes, b_row)


def build(arch, spec: MmqSpec):
    """The MMQ of `spec` for `arch` (wgmma: build_wgmma; Q8_1 activations: build_q8); here the fp16 mma.sync
    lowering: a persistent loop over work items (_claim_whole_or_split), each one tile's K range through the raw
    ring (cp.async on sm_89: _f32_pipeline / _x16_pipeline; TMA + mbarrier on sm_120a: _tma_pipeline) and the
    double-buffered fp16 tiles, then the split-K fixups and the epilogue. Another codec (F16_CODECS): no raw ring,
    its A tile decoded by _codec_dequant from global memory, the cp.async pipelines on both targets."""
    arch = get_arch(arch)
    if spec.mma == "wgmma":
        return build_wgmma(arch, spec)
    if spec.act == "q8_1":
        if not getattr(codecs.get(spec.fmt), "Q8_MMQ", False):
            have = [f for f, c in codecs.CODECS.items() if getattr(c, "Q8_MMQ", False)]
            raise ValueError(f"{spec.name}: the int8 x Q8_1 GEMM decodes {', '.join(have)} only")
        return build_q8(arch, spec)
    if spec.grouped:
        from .mmq_moe import build_grouped

        return build_grouped(arch, spec)
    codec = codecs.get(spec.fmt)  # a codec without the raw ring (RAW_RING: Q4_K): its A tile by _codec_dequant
    codec = None if getattr(codec, "RAW_RING", False) else codec
    if codec is not None and spec.fmt not in F16_CODECS:
        raise ValueError(f"{spec.name}: the fp16 mma.sync GEMM decodes Q4_K's raw ring or a codec with run8 "
                         f"({', '.join(F16_CODECS)}); not {spec.fmt}")
    tile, pipe, mma, sched, epilogue = describe(arch, spec)
    if codec is not None:  # no raw ring to fill (the weights are read where they are decoded): cp.async's
        pipe = Pipeline(STAGES, "cp.async")  # pipelines, with empty commit groups, on every target
    tma = pipe.copy == "tma"
    ft = _f16_tile(spec, tma)
    if codec is not None:  # no raw ring: the fp16 buffers alone (n32 46 KB: two CTAs an SM where an SM has 100 KB)
        ft = ft._replace(raw_bytes=0)
    BN, x16 = ft.BN, ft.x16
    pipe.check_smem(arch, ft.raw_bytes)
    ring = (f"{pipe.stages}-stage {'TMA + mbarrier' if tma else 'cp.async'}" if codec is None
            else "weights decoded from global memory by the codec's run8")
    b = KernelBuilder(spec.name, arch, f"{'Q4_K' if codec is None else spec.fmt} x {'fp16' if x16 else 'fp32'} GEMM, "
                      f"fp16 mma.sync, tile {BM}x{BN}x{BK}, {ring}", block=(256, 1, 1))
    w_p, x_p, y_p = _f16_operands(b, tma, x16)
    f_p = b.param("flag", "u64", "ptr:out")
    m_p, k_p, t_p, s_p, c_p, tn_p, sp_p, pt_p, ct_p = _mmq_params(b)
    wh_p = b.param("whole", "u32")
    fx_p = b.param("spread", "u32")  # 1: every split of a tile sums its share (_spread_sums_fixup), 0: the last all
    smem, work = _f16_smem_and_meta(b, ft, pipe, sched)
    if codec is not None:  # a run8 decode holds more registers than Q4_K's (as the grouped build: mmq_moe)
        b.directives = [d for d in b.directives if not d.startswith(".minnctapersm")] + [
            f".minnctapersm {min(2, F16_CTAS_PER_SM[BN])}"]
        b.meta.update(fmt=spec.fmt, raw_layout="none: each thread decodes its 32 weights of a step from global "
                                               "memory (the codec's run8 / run32)")

    if tma:  # the tensor maps' generic addresses (x: a pointer where it is fp32)
        W, X = _tmap(b, w_p), _tmap(b, x_p) if x16 else b.ptr(x_p)
    else:
        W, X = b.ptr(w_p), b.ptr(x_p)
    Y0, F, Q = b.ptr(y_p), b.ptr(f_p), b.ptr(c_p)
    P, C = b.ptr(pt_p), b.ptr(ct_p)
    M, K, T, per, tiles_n, splits = _ld_sizes(b, m_p, k_p, t_p, s_p, tn_p, sp_p)
    whole = b.ld_param(wh_p, "u32")
    spread = b.op("setp.ne.u32", b.ld_param(fx_p, "u32"), Imm(0, "u32"))
    tid = b.special("tid.x")
    lane = b.op("and.b32", tid, Imm(31, "b32"))
    warp = b.op("shr.u32", tid, Imm(5, "u32"))
    bad = b.reg("b32")  # some item's (partial) result was not finite (an activation overflowed fp16, or x had
    # inf/NaN), or a unit of x was too small for fp16 (_f16_activations' tiny)
    b.emit("mov.b32", bad, Imm(0, "b32"))
    tiles_m = _tiles_m(b, M)
    slot = b.op("mov.u32", work)
    leader = b.op("setp.eq.u32", tid, Imm(0, "u32"))
    ring = _f16_tma_ring(b, pipe.stages, x16, leader) if tma else None

    next_item, finish, split, zsplit, ti, ntail, n0, m0, s_begin, nsteps = _claim_whole_or_split(
        b, Q, slot, leader, whole, b.op("mul.lo.u32", tiles_m, tiles_n), splits, per, tiles_n, BN, K)
    base = _aligned(b, smem, 1024) if ft.b_row == 128 else b.op("mov.u32", smem)  # swizzled B: 1024-byte aligned
    raw0 = base
    a16 = b.op("add.u32", base, Imm(pipe.stages * ft.raw_bytes, "u32"))
    b16 = b.op("add.u32", a16, Imm(ft.a_bytes, "u32"))
    if tma:
        tlast = b.op("sub.u32", T, Imm(1, "u32"))
        ops = _f16_tma_ops(b, ft, ring, leader, W, X, m0, n0, nsteps, raw0, b16)
    elif codec is not None:
        row_bytes = _common.row_bytes(b, codec, K)
        mlast, tlast = b.op("sub.u32", M, Imm(1, "u32")), b.op("sub.u32", T, Imm(1, "u32"))

        def issue(step, stage=None):  # nothing to copy ahead: an empty group keeps the pipeline's wait_group counts
            b.emit("cp.async.commit_group")
    else:
        raw = codecs.get(spec.fmt)  # the raw ring's codec (RAW_RING)
        row_bytes = raw.row_bytes(b, K)
        mlast, tlast = b.op("sub.u32", M, Imm(1, "u32")), b.op("sub.u32", T, Imm(1, "u32"))
        # --- cp.async producer: 128 rows × 3 chunks of 16 B per step; thread i copies chunks i, i+256
        copies = raw.raw_copies(b, tid, m0, mlast, row_bytes, W, BM, 256)

        def issue(step, stage=None):
            _issue_raw(b, copies, step, nsteps, raw0, STAGES, sdst=stage)

    if tma and x16:  # the activations by TMA as well (_f16_tma_ops)
        load_x = copy_x = store_x = None
    else:
        load_x, copy_x, store_x = _f16_activations(b, ft, tid, n0, tlast, K, X, s_begin, b16, tiny=bad)
    stage_of, dequant = (_f16_dequant(b, codecs.get(spec.fmt), ft, tid, raw0, a16, columns=tma) if codec is None else
                         _codec_dequant(b, codec, tid, m0, mlast, row_bytes, W, a16))
    wm, wn, acc, mma_step = _f16_mma(b, arch, ft, warp, lane, a16, b16)

    # --- the pipeline. Raw bytes: 3-stage ring. fp16 tiles: double-buffered, so the MMA of step s (buffer
    # (s - s0) % 2) and the dequant + activation conversion of step s+1 (the other buffer) sit in one basic
    # block: the tensor cores and the integer/fp16 pipes work at the same time, one barrier per step. The raw
    # stage's address walks the ring (no remainder by 3 per step) and the activation pointers walk K: under
    # register pressure ptxas recomputed such addresses every step (420 → 334 SASS per step at n128).
    def boff_of(stp):
        return b.op("mul.lo.u32", b.op("and.b32", b.op("sub.u32", stp, s_begin), Imm(1, "b32")),
                    Imm(ft.pair, "u32"))

    if tma:
        _tma_pipeline(b, ops, load_x, store_x, dequant, mma_step, boff_of, s_begin, nsteps, ft.pair)
    elif x16:
        _x16_pipeline(b, issue, copy_x, dequant, mma_step, boff_of, stage_of, s_begin, nsteps, ft.pair)
    else:
        _f32_pipeline(b, issue, load_x, store_x, dequant, mma_step, boff_of, stage_of, s_begin, nsteps, ft.pair,
                      raw0, ft.raw_bytes)
    _watch_finite(b, [r for row in acc for frag in row for r in frag], bad)
    frags = [frag for row in acc for frag in row]
    spread_item = b.op("and.pred", split, spread)
    owned = _spread_rows(b, spread_item, zsplit, splits, len(acc))
    _spread_sums_fixup(b, acc, owned, spread_item, tid, leader, zsplit, ti, ntail, splits, P, C, 128 * BN)
    _last_sums_fixup(b, frags, tid, leader, slot, b.op("and.pred", split, b.op("not.pred", spread)), zsplit, ti,
                     ntail, splits, P, C, next_item, 128 * BN, base)

    # --- epilogue: D fragment (row g (+8), cols 2·tig, +1) → y[n][m], masked (and to this CTA's rows of a split)
    b.comment("epilogue: y[t][m] = acc, masked to t < T, m < M")
    epilogue.lower_mma_sync(b, acc, lane, m0, wm, 64, n0, wn, BN // 4, M, T, Y0, rows=owned)
    if tma:  # the split sum's prefix (generic stores) may lie where the next item's TMA writes: ordered first
        b.emit("fence.proxy.async.shared::cta")
    return _next_item_or_exit(b, next_item, finish, Q, leader, F, lambda: b.op("setp.ne.u32", bad, Imm(0, "u32")))


def _f16_operands(b, tma, x16):
    """The fp16 MMQ's first parameters: the weights (sm_120a: tmap_w, u8 [M][row bytes], box 16 x 128, no swizzle),
    the activations (x16 on sm_120a: tmap_x, f16 [T][K], box 64 x BN, 128B swizzle) and y."""
    if tma:
        w_p = b.param("tmap_w", "b8", "tensormap", array=128, align=64)
        x_p = b.param("tmap_x", "b8", "tensormap", array=128, align=64) if x16 else b.param("x", "u64", "ptr:in")
    else:
        w_p, x_p = b.param("w", "u64", "ptr:in"), b.param("x", "u64", "ptr:in")
    return w_p, x_p, b.param("y", "u64", "ptr:out")


def _tmap(b, param):
    """A tensor-map parameter's generic address (the TMA operand)."""
    return b.op("cvta.param.u64", b.op("mov.b64", param))


def _aligned(b, sym, align):
    """The shared address of `sym` rounded up to `align` bytes (the caller reserved `align` more)."""
    return b.op("and.b32", b.op("add.u32", b.op("mov.u32", sym), Imm(align - 1, "u32")),
                Imm(~(align - 1) & 0xFFFFFFFF, "b32"))


def _f16_smem_and_meta(b, ft: _F16Tile, pipe, sched, ring: bool = True):
    """The fp16 mma.sync MMQ's dynamic shared memory (the raw ring's stages — none without `ring`: a grouped codec
    build, which decodes from global memory and has no split tail —, then two fp16 (A, B) buffers; + 1024 where TMA
    writes B swizzled: aligned up at run time), launch bounds and metadata, and the work-item slot. Returns
    (dynamic shared memory, work-item slot)."""
    BN, x16 = ft.BN, ft.x16
    ring_and_buffers = (pipe.stages * ft.raw_bytes if ring else 0) + 2 * ft.pair
    smem = b.dynamic_shared(ring_and_buffers + (1024 if ft.b_row == 128 else 0))
    assert not ring or 4 * BM * BN <= ring_and_buffers, "the split tail's prefix sum (fp32 tile) lives in the ring + buffers"
    # CTAs per SM as shared memory allows on the H200 (ptxas keeps the registers to it: n64 took 138 without)
    b.directives += [".maxntid 256, 1, 1", f".minnctapersm {F16_CTAS_PER_SM[BN]}"]
    b.meta.update(bm=BM, bn=BN, bk=BK, stages=pipe.stages, warps=8, copy=pipe.copy, mma="mma.sync m16n8k16 f16",
                  schedule=sched.kind, dynamic_smem=b.dynamic_smem,
                  grid="persistent: min(items, resident CTAs per SM (occupancy calculator) · SMs) CTAs",
                  work_queue="item = atom.add(queue[0], 1) → (m tile, split z, token tile n) with n fastest, "
                             "so consecutive items reuse one weight tile from L2; the last CTA to finish "
                             "resets the queue (no host round trip)",
                  split_k=TAIL_SPLIT_NOTE, tail_split=True,
                  x_layout="fp16 (convert_f16 first)" if x16 else "fp32, converted to fp16 in the load pipeline")
    if pipe.copy == "tma":
        b.meta.update(tensormaps="tmap_w: u8, dims (row bytes, M), box (16, 128), no swizzle" + (
            f"; tmap_x: f16, dims (K, T), box (64, {BN}), 128B swizzle" if x16 else ""),
            raw_layout="a stage holds the 128 rows' header, qs bytes 0-15 and qs bytes 16-31 of the step as three "
                       "columns of 16 bytes per row (one TMA box each)")
    return smem, b.shared_buffer("work_item", 16, align=16)


def _f16_activations(b, ft: _F16Tile, tid, n0, tlast, K, X, s_begin, b16, row_of=None, tiny=None):
    """The fp16 MMQ's activation units and their source pointers at the item's first K-step. Returns (load_x(): the
    next step's fp32 x into registers, copy_x(boff): x16, the next step's fp16 x by cp.async into B buffer boff,
    store_x(boff): the registers converted to fp16 into B buffer boff). `row_of`: as _x_units' (fp32 x only).
    `tiny` (a b32 register): store_x ORs 1 into it where a unit's 4 values are too small for fp16 (convert_f16's
    too_small; an overflow shows in the accumulators instead: _watch_finite)."""
    # BN × 64 fp32 per step = BN·16 float4, (BN·16)/256 per thread, prefetched in registers
    # (x16: BN × 64 fp16 = BN·8 units of 8 halves, copied by cp.async, no registers)
    x16 = ft.x16
    nvec = ft.BN * (8 if x16 else 16) // 256
    xregs = [] if x16 else [[b.reg("f32") for _ in range(4)] for _ in range(nvec)]
    if x16:
        xaddr_tok = _x16_units(b, tid, n0, tlast, K, X, nvec)
        # unit v's destination: token tid/8 + 32v, halves 8·(tid % 8): one base, v·32 rows as an immediate
        x_dst = b.op("add.u32", b.op("mad.lo.u32", b.op("shr.u32", tid, Imm(3, "u32")), Imm(PAD_ROW, "u32"), b16),
                     b.op("shl.b32", b.op("and.b32", tid, Imm(7, "b32")), Imm(4, "u32")))
    else:
        xaddr_tok = _x_units(b, tid, n0, tlast, K, X, nvec, lambda tok, k4: (), row_of)
        # unit v's fp16 destination: token tid/16 + 16v, columns 4·(tid % 16): one base, v·16 rows as an immediate
        x_dst = b.op("add.u32", b.op("mad.lo.u32", b.op("shr.u32", tid, Imm(4, "u32")), Imm(PAD_ROW, "u32"), b16),
                     b.op("shl.b32", b.op("and.b32", tid, Imm(15, "b32")), Imm(3, "u32")))
    xstep = 128 if x16 else 256  # bytes of a token's row per K-step

    # the units' source pointers walk the K range xstep bytes per load (loop-carried: kept, not recomputed)
    xptr = [b.op("add.s64", u[0], b.op("cvt.u64.u32", b.op("shl.b32", s_begin, Imm(xstep.bit_length() - 1, "u32"))))
            for u in xaddr_tok]

    def load_x():  # the next step's activations
        for ptr, regs in zip(xptr, xregs):
            b.emit("ld.global.nc.v4.f32", b.vec(regs), Mem(ptr))
            b.emit("add.s64", ptr, ptr, Imm(xstep, "s64"))

    def copy_x(boff):  # x16: the next step's fp16 activations by cp.async into B buffer boff, one commit group
        dst = b.op("add.u32", x_dst, boff)
        for v, ptr in enumerate(xptr):
            b.emit("cp.async.cg.shared.global", Mem(dst, v * 32 * PAD_ROW), Mem(ptr), Imm(16, "u32"))
            b.emit("add.s64", ptr, ptr, Imm(xstep, "s64"))
        b.emit("cp.async.commit_group")

    def store_x(boff):
        dst = b.op("add.u32", x_dst, boff)
        for v in range(nvec):
            lo = b.op("cvt.rn.f16x2.f32", xregs[v][1], xregs[v][0], type="b32")
            hi = b.op("cvt.rn.f16x2.f32", xregs[v][3], xregs[v][2], type="b32")
            b.emit("st.shared.v2.b32", Mem(dst, v * 16 * PAD_ROW), b.vec([lo, hi]))
            if tiny is not None:
                b.emit("or.b32", tiny, tiny, b.op("selp.b32", Imm(1, "b32"), Imm(0, "b32"),
                                                  too_small(b, xregs[v])))
    return load_x, copy_x, store_x


def _f16_dequant(b, raw, ft: _F16Tile, tid, raw0, a16, columns=False):
    """The fp16 MMQ's dequant lanes (`raw`: the raw ring's codec, its f16_words): thread → (row = tid/2, half = tid%2), 32 weights of sub-block 2c + half, from a
    raw stage in rows of RAW_ROW bytes (cp.async) or in `columns` of RAW_PART (TMA: _tma_raw_tile). Returns
    (stage_of(step): the raw ring stage's address (cp.async), dequant(step, boff, stage): the raw tile at `stage` to
    fp16 into A buffer boff)."""
    drow = b.op("shr.u32", tid, Imm(1, "u32"))
    dh = b.op("and.b32", tid, Imm(1, "b32"))
    a_dst = b.op("add.u32", b.op("mad.lo.u32", drow, Imm(PAD_ROW, "u32"), a16), b.op("shl.b32", dh, Imm(6, "u32")))
    # high nibbles come out as 16q: fold the 1/16 into d·sc (exact: a power of two)
    dscale = b.op("selp.f32", Imm(1.0 / 16, "f32"), Imm(1.0, "f32"), b.op("setp.ne.u32", dh, Imm(0, "u32")))
    magic = b.op("mov.b32", Imm(0x64006400, "b32"))  # two fp16 1024.0: (q | 0x6400) − 1024 = q exactly
    nibmask = b.op("selp.b32", Imm(0x00F000F0, "b32"), Imm(0x000F000F, "b32"), b.op("setp.ne.u32", dh, Imm(0, "u32")))

    def stage_of(step):  # the raw ring stage of a K-step: its shared address
        return b.op("mad.lo.u32", b.op("rem.u32", step, Imm(STAGES, "u32")), Imm(ft.raw_bytes, "u32"), raw0)

    def dequant(step, boff, stage):  # boff: the fp16 buffer's offset, stage: the raw stage's address
        src = b.op("mad.lo.u32", drow, Imm(16 if columns else RAW_ROW, "u32"), stage)
        part = RAW_PART if columns else 16  # header, qs bytes 0-15, qs bytes 16-31 of the row
        hdr = b.regs("b32", 4)
        b.emit("ld.shared.v4.b32", b.vec(hdr), Mem(src))
        qs = b.regs("b32", 8)
        b.emit("ld.shared.v4.b32", b.vec(qs[0:4]), Mem(src, part))
        b.emit("ld.shared.v4.b32", b.vec(qs[4:8]), Mem(src, 2 * part))
        sub = b.op("add.u32", b.op("shl.b32", b.op("and.b32", step, Imm(3, "b32")), Imm(1, "u32")), dh)
        out = raw.f16_words(b, hdr, qs, sub, dscale, nibmask, magic,
                            three=(ft.BN, ft.x16) not in F16_FOUR_OP_TILES)
        dst = b.op("add.u32", a_dst, boff)
        for i in range(4):
            b.emit("st.shared.v4.b32", Mem(dst, 16 * i), b.vec(out[4 * i:4 * i + 4]))
    return stage_of, dequant


def _codec_dequant(b, codec, tid, m0, mlast, row_bytes, W, a16):
    """The fp16 A tile from any codec's run8 (float32 exactly as ggml, then rounded once to fp16, as the prepared
    fragments): thread (row tid / 2, half tid % 2) decodes weights 64·step + 32·half .. + 31 of its row (rows past
    M read row M - 1; the epilogue drops them) straight from global memory into its 64 bytes of the A row, the
    fp16 MMQ's layout (PAD_ROW bytes a row, K in order). Returns (stage_of, dequant) as mmq._f16_dequant's."""
    drow, dh = b.op("shr.u32", tid, Imm(1, "u32")), b.op("and.b32", tid, Imm(1, "b32"))
    rowp = b.op("mad.wide.u32", b.op("min.u32", b.op("add.u32", m0, drow), mlast), row_bytes, W)
    a_dst = b.op("add.u32", b.op("mad.lo.u32", drow, Imm(PAD_ROW, "u32"), a16), b.op("shl.b32", dh, Imm(6, "u32")))

    def stage_of(step):  # no raw ring
        return b.op("mov.u32", Imm(0, "u32"))

    def dequant(step, boff, stage):
        k0 = b.op("add.u32", b.op("shl.b32", step, Imm(6, "u32")), b.op("shl.b32", dh, Imm(5, "u32")))
        if hasattr(codec, "run32"):  # one sub-block's header decoded once (Q5_K, Q6_K)
            vals = codec.run32(b, rowp, k0)
        else:
            vals = [v for r in range(4) for v in codec.run8(b, rowp, b.op("add.u32", k0, Imm(8 * r, "u32")))]
        words = [b.op("cvt.rn.f16x2.f32", vals[2 * j + 1], vals[2 * j], type="b32") for j in range(16)]
        dst = b.op("add.u32", a_dst, boff)
        for i in range(4):
            b.emit("st.shared.v4.b32", Mem(dst, 16 * i), b.vec(words[4 * i:4 * i + 4]))
    return stage_of, dequant


def _f16_mma(b, arch, ft: _F16Tile, warp, lane, a16, b16):
    """The fp16 MMQ's MMA lanes: warp (wm, wn) = (warp / 4, warp % 4), 4 m16 tiles x BN/32 n8 tiles, the
    accumulators zeroed. Returns (wm, wn, acc, mma_step(boff): one K-step from fp16 buffer boff)."""
    BN = ft.BN
    wm = b.op("shr.u32", warp, Imm(2, "u32"))
    wn = b.op("and.b32", warp, Imm(3, "b32"))
    NT = BN // 32
    acc = [[[b.reg("f32") for _ in range(4)] for _ in range(NT)] for _ in range(4)]
    _zero_acc(b, acc)
    q = b.op("shr.u32", lane, Imm(3, "u32"))
    l8 = b.op("and.b32", lane, Imm(7, "b32"))
    # A: matrix q of x4 → rows +8·(q%2), k +8·(q/2); B: n +8·(q/2), k +8·(q%2)
    a_row = b.op("add.u32", b.op("mad.lo.u32", wm, Imm(64, "u32"), l8),
                 b.op("shl.b32", b.op("and.b32", q, Imm(1, "b32")), Imm(3, "u32")))
    a_lane = b.op("add.u32", b.op("mad.lo.u32", a_row, Imm(PAD_ROW, "u32"), a16),
                  b.op("shl.b32", b.op("shr.u32", q, Imm(1, "u32")), Imm(4, "u32")))
    if NT >= 2:
        b_row = b.op("add.u32", b.op("mad.lo.u32", wn, Imm(BN // 4, "u32"), l8),
                     b.op("shl.b32", b.op("shr.u32", q, Imm(1, "u32")), Imm(3, "u32")))
    else:
        b_row = b.op("mad.lo.u32", wn, Imm(BN // 4, "u32"), l8)
    swz = ft.b_row == 128
    if swz:  # TMA's 128B swizzle: 16-byte chunk c of token row r at r·128 + ((c ^ r % 8) << 4). A lane's rows are
        # l8 mod 8, so its chunk for kk = 0 is (q % 2) ^ l8 and for kk its address XOR 32·kk (rows, buffers and the
        # base 1024-byte aligned: the XOR touches address bits 5-6 only, no carries)
        b_lane = b.op("add.u32", b.op("mad.lo.u32", b_row, Imm(128, "u32"), b16),
                      b.op("shl.b32", b.op("xor.b32", b.op("and.b32", q, Imm(1, "b32")), l8), Imm(4, "u32")))
    else:
        b_lane = b.op("add.u32", b.op("mad.lo.u32", b_row, Imm(PAD_ROW, "u32"), b16),
                      b.op("shl.b32", b.op("and.b32", q, Imm(1, "b32")), Imm(4, "u32")))

    def mma_step(boff):
        a_l, b_l = b.op("add.u32", a_lane, boff), b.op("add.u32", b_lane, boff)
        for kk in range(BK // 16):
            # B's k16 slice kk: 32 bytes on in a padded row; in a swizzled one the lane's address XOR 32·kk
            b_k, b_off = (b.op("xor.b32", b_l, Imm(32 * kk, "b32")) if kk else b_l, 0) if swz else (b_l, kk * 32)
            afr = []
            for i in range(4):
                regs = b.regs("b32", 4)
                b.emit(ldmatrix(arch, 4, b.vec(regs), Mem(a_l, i * 16 * PAD_ROW + kk * 32)))
                afr.append(regs)
            bfr = []
            for j in range(0, NT, 2):
                if NT >= 2:
                    regs = b.regs("b32", 4)
                    b.emit(ldmatrix(arch, 4, b.vec(regs), Mem(b_k, j * 8 * ft.b_row + b_off)))
                    bfr += [regs[0:2], regs[2:4]]
                else:
                    regs = b.regs("b32", 2)
                    b.emit(ldmatrix(arch, 2, b.vec(regs), Mem(b_k, b_off)))
                    bfr.append(regs)
            for i in range(4):
                for j in range(NT):
                    v = b.vec(acc[i][j])
                    b.emit(mma_sync(arch, "m16n8k16", "f16", v, b.vec(afr[i]), b.vec(bfr[j]), v))
    return wm, wn, acc, mma_step


def _f32_pipeline(b, issue, load_x, store_x, dequant, mma_step, boff_of, stage_of, s_begin, nsteps, pair, raw0,
                  raw_bytes):
    """The fp32-x MMQ's K loop: raw tiles three steps ahead in the cp.async ring, the raw stage's address walking
    the ring (loop-carried); the activations of step s+2 loaded into registers while step s multiplies and step
    s+1 is dequantized and converted into the other fp16 buffer."""
    b.comment("prologue: raw steps s0, s0+1 in flight; step s0 dequantized into buffer 0")
    s_last = b.op("sub.u32", nsteps, Imm(1, "u32"))
    issue(s_begin)
    issue(b.op("add.u32", s_begin, Imm(1, "u32")))
    load_x()  # step s0
    b.emit("cp.async.wait_group", Imm(1, "u32"))
    b.emit("bar.sync", Imm(0, "u32"))
    rcur = stage_of(s_begin)  # raw stage of step s (loop-carried)
    dequant(s_begin, b.op("mov.u32", Imm(0, "u32")), rcur)
    store_x(b.op("mov.u32", Imm(0, "u32")))
    issue(b.op("add.u32", s_begin, Imm(2, "u32")))
    step = b.op("mov.u32", s_begin)
    tail = b.label("last_step")
    b.bra(tail, pred=b.op("setp.ge.u32", step, s_last))
    load_x()  # step s0 + 1
    b.emit("cp.async.wait_group", Imm(1, "u32"))
    b.emit("bar.sync", Imm(0, "u32"))
    ring_end = b.op("add.u32", raw0, Imm(STAGES * raw_bytes, "u32"))
    top = b.label("kstep")
    b.place(top)
    nxt = b.op("add.u32", step, Imm(1, "u32"))
    cur_off = boff_of(step)
    nxt_off = b.op("sub.u32", Imm(pair, "u32"), cur_off)
    rnext = b.op("add.u32", rcur, Imm(raw_bytes, "u32"))  # stage (s+1) % 3
    b.emit("sub.u32", rnext, rnext, b.op("selp.u32", Imm(STAGES * raw_bytes, "u32"), Imm(0, "u32"),
                                          b.op("setp.ge.u32", rnext, ring_end)))
    mma_step(cur_off)  # step s from one buffer ...
    dequant(nxt, nxt_off, rnext)  # ... while step s+1 is dequantized into the other
    store_x(nxt_off)
    issue(b.op("add.u32", step, Imm(3, "u32")), rcur)  # raw stage (s+3) % 3 = s % 3: dequantized last iteration
    more = b.op("setp.lt.u32", b.op("add.u32", step, Imm(2, "u32")), nsteps)
    skip = b.label("no_prefetch")
    b.bra(skip, pred=more, neg=True)
    load_x()  # step s + 2
    b.place(skip)
    b.emit("cp.async.wait_group", Imm(1, "u32"))  # raw s+2 landed (s+3 may be in flight)
    b.emit("bar.sync", Imm(0, "u32"))  # the other buffer complete; everyone done reading this one
    b.emit("mov.u32", step, nxt)
    b.emit("mov.u32", rcur, rnext)
    _loop_back_then_last_step(b, top, tail, step, s_last, lambda: mma_step(boff_of(step)))


def _watch_finite(b, values, bad):
    """The fp16 MMQ's overflow watch, once per item instead of per converted activation: bad |= 1 unless the sum
    of this thread's accumulators is finite. An activation that overflowed fp16 (inf), or an inf/NaN in x,
    makes every product with it inf or NaN, which no sum of finite values undoes; a finite result that
    overflows fp32 in the sum raises it too (harmless: the caller recomputes exactly). One add per accumulator
    per item, instead of 2 instructions per 2 converted values per step (32 per step per thread at n128)."""
    part = list(values[:4])
    for i, v in enumerate(values[4:]):  # 4 chains: short dependences
        part[i % 4] = b.op("add.f32", part[i % 4], v)
    tot = b.op("add.f32", b.op("add.f32", part[0], part[1]), b.op("add.f32", part[2], part[3]))
    fin = b.op("setp.lt.f32", b.op("abs.f32", tot), Imm(float("inf"), "f32"))  # NaN compares false
    b.emit("or.b32", bad, bad, b.op("selp.b32", Imm(0, "b32"), Imm(1, "b32"), fin))



# --- the pieces both mma.sync MMQs (fp16 and Q8_1) share: the persistent work queue, the K range of a split,
# the raw Q4_K ring (cp.async of header + qs per 64-K step) and the queue reset at exit

def _mmq_params(b):
    """The MMQ parameters after the operands, shared by every lowering: m, k, t; K-steps per split (split-K
    for grids too small for the GPU); the work queue (2 x u32: next item, finished CTAs; zero between launches);
    token tiles and splits; the split-K partials (splits x T x M) and tile counters (u32 each, zero, left zero)."""
    return (b.param("m", "u32"), b.param("k", "u32"), b.param("t", "u32"), b.param("steps_per_split", "u32"),
            b.param("queue", "u64", "ptr:scratch"), b.param("tiles_n", "u32"), b.param("splits", "u32"),
            b.param("part", "u64", "ptr:scratch"), b.param("counters", "u64", "ptr:scratch"))


def _ld_sizes(b, m_p, k_p, t_p, s_p, tn_p, sp_p):
    """Every lowering's size parameters (_mmq_params) loaded: (M, K, T, K-steps per split, token tiles, splits)."""
    M, K, T = b.ld_param(m_p, "u32"), b.ld_param(k_p, "u32"), b.ld_param(t_p, "u32")
    per = b.ld_param(s_p, "u32")
    tiles_n, splits = b.ld_param(tn_p, "u32"), b.ld_param(sp_p, "u32")
    return M, K, T, per, tiles_n, splits


def _tiles_m(b, M, bm=BM):
    """ceil(M / bm): the weight-row tiles."""
    return b.op("shr.u32", b.op("add.u32", M, Imm(bm - 1, "u32")), Imm(bm.bit_length() - 1, "u32"))


def _zero_acc(b, acc):
    """mov 0 into every accumulator of an mma.sync MMQ's [m16 tile][n8 tile][4] fragments."""
    for row in acc:
        for frag in row:
            for r in frag:
                b.emit("mov.f32", r, Imm(0.0, "f32"))


def _next_item_or_exit(b, next_item, finish, Q, leader, F, flag=None):
    """Both mma.sync MMQs' end of an item: back to claim the next; past the queue's end reset it (_queue_exit), set
    the flag where `flag()` (a predicate formed there) holds, return. Returns the finished kernel."""
    b.bra(next_item)
    b.place(finish)
    _queue_exit(b, Q, leader)
    if flag is not None:
        b.emit("st.global.u32", Mem(F), Imm(1, "u32"), pred=flag())
    b.emit("ret")
    return b.finish()


def _x_units(b, tid, n0, tlast, K, X, nvec, per_unit, row_of=None):
    """The fp32 activation loads of both mma.sync MMQs: unit u = tid + 256v covers 4 values of token u/16
    (clamped to T - 1), columns 4·(u % 16) .. +3 of the 64-K step; returns the units' source addresses (step 0)
    and `per_unit(tok, k4)` of each (the caller's destinations). `row_of(token)`: x's row of a token where it is
    not the token itself (the grouped MoE GEMM gathers its pairs' rows)."""
    out = []
    for v in range(nvec):
        u = b.op("add.u32", tid, Imm(256 * v, "u32"))
        tok = b.op("shr.u32", u, Imm(4, "u32"))
        k4 = b.op("and.b32", u, Imm(15, "b32"))
        gtok = b.op("min.u32", b.op("add.u32", n0, tok), tlast)
        rowp = b.op("mad.wide.u32", b.op("mul.lo.u32", row_of(gtok) if row_of else gtok, K), Imm(4, "u32"), X)
        src = b.op("add.s64", rowp, b.op("cvt.u64.u32", b.op("shl.b32", k4, Imm(4, "u32"))))
        out.append((src, *per_unit(tok, k4)))
    return out


def _x16_pipeline(b, issue, copy_x, dequant, mma_step, boff_of, stage_of, s_begin, nsteps, pair):
    """The x16 MMQ's K loop: raw tiles three steps ahead in the cp.async ring as in the fp32 build; the fp16
    activations of step s+1 go by cp.async straight into B buffer (s+1) % 2 at the top of iteration s (free:
    every warp passed the barrier after the MMA that read it), as their own commit group before the raw copy,
    so one wait_group 1 at the end of the iteration covers both (the raw copy of s+3 may stay in flight)."""
    b.comment("prologue (x16): raw s0, s0+1 and x s0 in flight; step s0 dequantized into buffer 0")
    s_last = b.op("sub.u32", nsteps, Imm(1, "u32"))
    issue(s_begin)
    issue(b.op("add.u32", s_begin, Imm(1, "u32")))
    copy_x(b.op("mov.u32", Imm(0, "u32")))
    b.emit("cp.async.wait_group", Imm(0, "u32"))
    b.emit("bar.sync", Imm(0, "u32"))
    dequant(s_begin, b.op("mov.u32", Imm(0, "u32")), stage_of(s_begin))
    issue(b.op("add.u32", s_begin, Imm(2, "u32")))
    step = b.op("mov.u32", s_begin)
    tail = b.label("last_step")
    b.bra(tail, pred=b.op("setp.ge.u32", step, s_last))
    b.emit("bar.sync", Imm(0, "u32"))  # buffer 0 complete before any warp multiplies it
    top = b.label("kstep")
    b.place(top)
    nxt = b.op("add.u32", step, Imm(1, "u32"))
    cur_off = boff_of(step)
    nxt_off = b.op("sub.u32", Imm(pair, "u32"), cur_off)
    copy_x(nxt_off)  # x of step s+1
    mma_step(cur_off)
    dequant(nxt, nxt_off, stage_of(nxt))
    issue(b.op("add.u32", step, Imm(3, "u32")))
    b.emit("cp.async.wait_group", Imm(1, "u32"))  # x s+1 and raw s+2 landed (raw s+3 may be in flight)
    b.emit("bar.sync", Imm(0, "u32"))
    b.emit("mov.u32", step, nxt)
    _loop_back_then_last_step(b, top, tail, step, s_last, lambda: mma_step(boff_of(step)))


def _loop_back_then_last_step(b, top, tail, step, s_last, last_mma, drain=True):
    """The mma.sync fp16 K loops' end: back to `top` while steps remain, then (also straight from a one-step
    prologue) a barrier, the last step's MMA and (`drain`: cp.async) the drain of every copy group."""
    b.bra(top, pred=b.op("setp.lt.u32", step, s_last))
    b.place(tail)
    b.emit("bar.sync", Imm(0, "u32"))
    last_mma()  # the last step
    if drain:
        b.emit("cp.async.wait_group", Imm(0, "u32"))




class _F16Tma(NamedTuple):
    """The sm_120a fp16 MMQ's TMA ring for one item: S raw stages, thread 0's copies and everyone's waits."""
    S: int
    stage: Callable  # stage(i): the ring stage of the item's i-th raw tile (the prologue's)
    issue: Callable  # issue(step, stage): thread 0 TMAs K-step `step`'s raw tile (if step < nsteps) into `stage`
    take: Callable  # take(): wait for the next raw tile in ring order; returns (its stage, the stage's address)
    copy_x: Callable | None  # copy_x(boff, step): x16, thread 0 TMAs step's activation tile into B buffer boff
    wait_x: Callable | None  # wait_x(): x16, wait for that activation tile


def _f16_tma_ring(b, S, x16, leader):
    """sm_120a: the S raw stages' mbarriers (x16: and the activation tile's), initialised by thread 0 and fenced for
    the async proxy (the first claim's barrier publishes them to the CTA), and the counters that run across items:
    the ring position of the next raw tile to wait for and the activation barrier's parity. Returns (S, barriers,
    position, parity)."""
    nbars = S + int(x16)
    bars = b.op("mov.u32", b.shared_buffer("bars", 8 * nbars, align=8))
    for i in range(nbars):
        b.emit("mbarrier.init.shared::cta.b64", Mem(bars, 8 * i), Imm(1, "u32"), pred=leader)
    b.emit("fence.proxy.async.shared::cta")
    return S, bars, b.op("mov.u32", Imm(0, "u32")), b.op("mov.u32", Imm(0, "u32")) if x16 else None


def _f16_tma_ops(b, ft: _F16Tile, ring, leader, tw, tx, m0, n0, nsteps, raw0, b16) -> _F16Tma:
    """The sm_120a fp16 MMQ's copies and waits for an item: raw tiles by `_tma_raw_tile` into the ring (one mbarrier
    per stage, phase (position / S) % 2), x16's activation tiles (BN tokens from n0 x 64 columns, zero-filled past
    T, 128B-swizzled) into the B buffers, one at a time on the activation barrier."""
    S, bars, count, xph = ring

    def stage(i):
        return b.op("rem.u32", b.op("add.u32", count, Imm(i, "u32")) if i else count, Imm(S, "u32"))

    # thread 0 alone branches to its copies: predicated, every warp would run ptxas's elect loop around each TMA
    def issue(step, st):
        skip = b.label("no_raw_tma")
        b.bra(skip, pred=b.op("and.pred", leader, b.op("setp.lt.u32", step, nsteps)), neg=True, uniform=False)
        fb = b.op("mad.lo.u32", st, Imm(8, "u32"), bars)
        b.emit("mbarrier.arrive.expect_tx.shared::cta.b64", b.reg("b64"), Mem(fb), Imm(ft.raw_bytes, "u32"))
        _tma_raw_tile(b, tw, step, m0, st, ft.raw_bytes, raw0, fb, op=TMA_CTA)
        b.place(skip)

    def take():
        st = _wait_step(b, bars, count, S)
        b.emit("add.u32", count, count, Imm(1, "u32"))
        return st, b.op("mad.lo.u32", st, Imm(ft.raw_bytes, "u32"), raw0)

    if not ft.x16:
        return _F16Tma(S, stage, issue, take, None, None)
    xbar = b.op("add.u32", bars, Imm(8 * S, "u32"))

    def copy_x(boff, step):
        skip = b.label("no_x_tma")
        b.bra(skip, pred=leader, neg=True, uniform=False)
        b.emit("mbarrier.arrive.expect_tx.shared::cta.b64", b.reg("b64"), Mem(xbar), Imm(ft.b_bytes, "u32"))
        b.emit(TMA_CTA, Mem(b.op("add.u32", b16, boff)), TensorRef(tx, (b.op("shl.b32", step, Imm(6, "u32")), n0)),
               Mem(xbar))
        b.place(skip)

    def wait_x():
        _wait(b, xbar, xph)
        b.emit("xor.b32", xph, xph, Imm(1, "b32"))
    return _F16Tma(S, stage, issue, take, copy_x, wait_x)


def _tma_pipeline(b, ops: _F16Tma, load_x, store_x, dequant, mma_step, boff_of, s_begin, nsteps, pair):
    """sm_120a's K loop (fp32 x, or x16 where load_x is None): the item's first S raw tiles by TMA at once (between
    items every stage is free), x16's activations of s0 into buffer 0; then per step s, thread 0 TMAs raw s+S into
    the stage of s (dequantized before the last barrier) and x16's activations of s+1 into the other buffer
    (multiplied from before that barrier), everyone multiplies s, waits for raw s+1 and dequantizes it (fp32 x:
    converts s+1's registers and loads s+2's; x16: waits for s+1's activations), one barrier."""
    x16, S = load_x is None, ops.S
    b.comment(f"prologue (TMA): raw s0 .. s0+{S - 1} in flight; step s0 dequantized into buffer 0")
    s_last = b.op("sub.u32", nsteps, Imm(1, "u32"))
    for i in range(S):
        ops.issue(b.op("add.u32", s_begin, Imm(i, "u32")), ops.stage(i))
    zero = b.op("mov.u32", Imm(0, "u32"))
    if x16:
        ops.copy_x(zero, s_begin)
    else:
        load_x()  # step s0
    st, raw = ops.take()
    dequant(s_begin, zero, raw)
    if x16:
        ops.wait_x()
    else:
        store_x(zero)
    step, scur = b.op("mov.u32", s_begin), b.op("mov.u32", st)  # step s and its raw stage (loop-carried)
    tail = b.label("last_step")
    b.bra(tail, pred=b.op("setp.ge.u32", step, s_last))
    if not x16:
        load_x()  # step s0 + 1
    b.emit("bar.sync", Imm(0, "u32"))
    top = b.label("kstep")
    b.place(top)
    nxt = b.op("add.u32", step, Imm(1, "u32"))
    cur_off = boff_of(step)
    nxt_off = b.op("sub.u32", Imm(pair, "u32"), cur_off)
    ops.issue(b.op("add.u32", step, Imm(S, "u32")), scur)
    if x16:
        ops.copy_x(nxt_off, nxt)
    mma_step(cur_off)  # step s from one buffer ...
    st, raw = ops.take()
    dequant(nxt, nxt_off, raw)  # ... while step s+1 is dequantized into the other
    if x16:
        ops.wait_x()
    else:
        store_x(nxt_off)
        skip = b.label("no_prefetch")
        b.bra(skip, pred=b.op("setp.lt.u32", b.op("add.u32", step, Imm(2, "u32")), nsteps), neg=True)
        load_x()  # step s + 2
        b.place(skip)
    b.emit("bar.sync", Imm(0, "u32"))  # the other buffer complete; this one and raw s+1's stage (refilled next) read
    b.emit("mov.u32", step, nxt)
    b.emit("mov.u32", scur, st)
    _loop_back_then_last_step(b, top, tail, step, s_last, lambda: mma_step(boff_of(step)), drain=False)


def _x16_units(b, tid, n0, tlast, K, X, nvec):
    """The fp16 activation loads of the x16 MMQ: unit u = tid + 256v covers 8 halves of token u/8, columns
    8·(u % 8) .. +7 of the 64-K step; returns the units' source addresses (step 0). Rows past T read token
    (n0 + u/8) mod T (a real row; the epilogue masks them): clamped to T - 1 they all hit one line, which
    cp.async.cg (no L1) sent to L2 once per row — a partial token tile cost up to 1.8x (4096² x 160 tokens:
    90 µs against 46.5); zero-filling them instead (a cp.async source size per unit) took n128 from 194 to
    232 registers and cost 5-15% everywhere (bench/results/probe_mma_sync_x16_tail_session16.log)."""
    out = []
    for v in range(nvec):
        u = b.op("add.u32", tid, Imm(256 * v, "u32"))
        tok = b.op("add.u32", n0, b.op("shr.u32", u, Imm(3, "u32")))
        gtok = b.op("rem.u32", tok, b.op("add.u32", tlast, Imm(1, "u32")))
        rowp = b.op("mad.wide.u32", b.op("mul.lo.u32", gtok, K), Imm(2, "u32"), X)
        out.append((b.op("add.s64", rowp, b.op("cvt.u64.u32", b.op("shl.b32", b.op("and.b32", u, Imm(7, "b32")),
                                                                     Imm(4, "u32")))),))
    return out


def _load_x(b, step, units, xregs):
    """One step's fp32 activations (64 floats = 256 bytes per token) into registers, a step ahead."""
    kb = b.op("cvt.u64.u32", b.op("shl.b32", step, Imm(8, "u32")))
    for unit, regs in zip(units, xregs):
        b.emit("ld.global.nc.v4.f32", b.vec(regs), Mem(b.op("add.s64", unit[0], kb)))


def _claim(b, Q, slot, leader, items):
    """Head of the persistent loop: thread 0 claims an item from the atomic queue and shares it through
    shared memory; past the end, branch to `finish`. Returns (next_item, finish, item)."""
    b.comment("persistent CTA: claim work items from the atomic queue until it runs dry")
    next_item, finish = b.label("next_item"), b.label("queue_empty")
    b.place(next_item)
    got = b.reg("u32")
    b.emit("atom.global.add.u32", got, Mem(Q), Imm(1, "u32"), pred=leader)
    b.emit("st.shared.u32", Mem(slot), got, pred=leader)
    b.emit("bar.sync", Imm(0, "u32"))  # the item for everyone; and the previous item's buffers are free
    item = b.op("ld.shared.u32", Mem(slot))
    b.emit("bar.sync", Imm(0, "u32"))  # everyone has read the slot before the leader writes it again
    b.bra(finish, pred=b.op("setp.ge.u32", item, items))
    return next_item, finish, item


def _raster(b, item, items, tiles_n, BN, K=None):
    """(token tile, rest) of `item` among `items` = tiles_n x rest-count. With K (the raster): items walk bands
    of gt token tiles (gt·BN·K fp32 activations ≈ RASTER_BYTES), every rest (M tile, split) of a band before the
    next band, the token tile fastest inside a band — so a band's activations stay in L2 while the weights pass,
    instead of all of x being re-read for every few M tiles; x of at most two bands is one band (the order
    without the raster)."""
    if K is None:
        return b.op("rem.u32", item, tiles_n), b.op("div.u32", item, tiles_n)
    gt = b.op("max.u32", b.op("div.u32", b.op("mov.u32", Imm(RASTER_BYTES // (4 * BN), "u32")), K), Imm(1, "u32"))
    gt = b.op("selp.b32", tiles_n, gt, b.op("setp.le.u32", tiles_n, b.op("shl.b32", gt, Imm(1, "u32"))), type="b32")
    per_band = b.op("mul.lo.u32", gt, b.op("div.u32", items, tiles_n))  # gt · (M tiles · splits)
    band = b.op("div.u32", item, per_band)
    r_ = b.op("sub.u32", item, b.op("mul.lo.u32", band, per_band))
    first = b.op("mul.lo.u32", band, gt)
    width = b.op("min.u32", gt, b.op("sub.u32", tiles_n, first))
    return b.op("add.u32", first, b.op("rem.u32", r_, width)), b.op("div.u32", r_, width)


def _claim_item(b, Q, slot, leader, items, tiles_n, splits, T, M, BN, Y0, K=None):
    """_claim, then the item → (token tile, split z, M tile) with the token tile fastest (`_raster` with K).
    Returns (next_item, finish, z, Y, n0, m0)."""
    next_item, finish, item = _claim(b, Q, slot, leader, items)
    tn, rest = _raster(b, item, items, tiles_n, BN, K)
    zsplit = b.op("rem.u32", rest, splits)
    tm = b.op("div.u32", rest, splits)
    # partials of split z go to y + z·t·m (z = 0 writes y itself)
    Y = b.op("mad.wide.u32", b.op("mul.lo.u32", b.op("mul.lo.u32", zsplit, T), M), Imm(4, "u32"), Y0)
    n0 = b.op("mul.lo.u32", tn, Imm(BN, "u32"))
    m0 = b.op("mul.lo.u32", tm, Imm(BM, "u32"))
    return next_item, finish, zsplit, Y, n0, m0


def _claim_whole_or_split(b, Q, slot, leader, whole, tiles, splits, per, tiles_n, BN, K):
    """The fp16 mma.sync MMQ's items: the first `whole` tiles (in `_raster` order) over all of K, then the other
    r = tiles - whole tiles split into `splits` K ranges of `per` steps, z-major (every tile's split 0, then
    split 1, ...: the last, shortest splits are claimed last). Returns (next_item, finish, split?, z, tail index,
    r, n0, m0, first K-step, end K-step)."""
    r = b.op("sub.u32", tiles, whole)
    next_item, finish, item = _claim(b, Q, slot, leader, b.op("mad.lo.u32", r, splits, whole))
    split = b.op("setp.ge.u32", item, whole)
    j = b.op("sub.u32", item, whole)
    rr = b.op("max.u32", r, Imm(1, "u32"))
    z = b.op("selp.b32", b.op("div.u32", j, rr), Imm(0, "b32"), split, type="b32")
    ti = b.op("sub.u32", j, b.op("mul.lo.u32", z, rr))  # the tail index (split items)
    tile = b.op("selp.b32", b.op("add.u32", whole, ti), item, split, type="b32")
    tn, tm = _raster(b, tile, tiles, tiles_n, BN, K if MMQ_RASTER else None)
    steps = b.op("shr.u32", K, Imm(6, "u32"))
    s_begin = b.op("mul.lo.u32", z, per)
    nsteps = b.op("selp.b32", b.op("min.u32", b.op("add.u32", s_begin, per), steps), steps, split, type="b32")
    return (next_item, finish, split, z, ti, r, b.op("mul.lo.u32", tn, Imm(BN, "u32")),
            b.op("mul.lo.u32", tm, Imm(BM, "u32")), s_begin, nsteps)


SPREAD_MAX_SPLITS = 4  # the spread fixup's loads are unrolled over this many partials


def _spread_rows(b, spread_item, z, splits, n):
    """Per m16 row i of a warp's fragments: whether this CTA sums and stores it — every row, except on a split
    item under the spread fixup, where split z owns the rows i with i % splits == z."""
    out = []
    for i in range(n):
        mine = b.op("setp.eq.u32", b.op("rem.u32", b.op("mov.u32", Imm(i, "u32")), splits), z)
        out.append(b.op("or.pred", mine, b.op("not.pred", spread_item)))
    return out


def _spread_sums_fixup(b, acc, owned, spread_item, tid, leader, z, ti, r, splits, P, C, tile_floats):
    """Split-K of a split item, the sum spread over the tile's CTAs (at most SPREAD_MAX_SPLITS of them, and all
    resident together: the caller's rule): split z stores its partial of the rows it does not own (`owned`, i %
    splits == z) in fragment order (as _last_sums_fixup), fences, counts in (the counter's low 16 bits), waits
    until every split of the tile has, then loads the others' partials of its own rows in one batch and sums
    them in z order, (((p0 + p1) + p2) + p3 with its own p_z from registers: the bits of _last_sums_fixup),
    for the caller's epilogue to store only those rows. One L2 round trip of 1/splits of the tile per CTA
    instead of the last CTA's splits - 1 round trips of the whole tile. Counting out (high 16 bits) after
    everyone passed the wait, the last CTA out resets the counter."""
    b.comment("split-K (spread): store the rows others own, wait for every split, sum the own rows in z order")
    done = b.label("spread_done")
    b.bra(done, pred=spread_item, neg=True)
    NT = len(acc[0])
    fbytes = 16 * 256
    tile_bytes = 4 * tile_floats
    thr = b.op("add.s64", P, b.op("cvt.u64.u32", b.op("shl.b32", tid, Imm(4, "u32"))))
    own = b.op("mad.wide.u32", b.op("mad.lo.u32", z, r, ti), Imm(tile_bytes, "u32"), thr)
    for i, row in enumerate(acc):
        for j, frag in enumerate(row):
            b.emit("st.global.cg.v4.f32", Mem(own, (i * NT + j) * fbytes), b.vec(frag), pred=owned[i], neg=True)
    b.emit("bar.sync", Imm(0, "u32"))  # the CTA's partial stores, then the leader's release (cumulative over them)
    cnt = b.op("mad.wide.u32", ti, Imm(4, "u32"), C)
    b.emit("red.release.gpu.global.add.u32", Mem(cnt), Imm(1, "u32"), pred=leader)
    wait = b.label("spread_wait")
    b.place(wait)  # every split of the tile has counted in (its partial stored); each thread acquires it itself
    seen = b.reg("u32")
    b.emit("ld.acquire.gpu.global.u32", seen, Mem(cnt))
    b.bra(wait, pred=b.op("setp.ne.u32", b.op("and.b32", seen, Imm(0xFFFF, "b32")), splits), uniform=False)
    b.emit("bar.sync", Imm(0, "u32"))  # every thread of this CTA is past the wait before it counts out
    out = b.reg("u32")
    b.emit("atom.global.add.u32", out, Mem(cnt), Imm(0x10000, "u32"), pred=leader)
    last_out = b.op("and.pred", leader, b.op("setp.eq.u32", b.op("shr.u32", out, Imm(16, "u32")),
                                             b.op("sub.u32", splits, Imm(1, "u32"))))
    b.emit("st.global.u32", Mem(cnt), Imm(0, "u32"), pred=last_out)
    planes = []  # (partial p's address for this thread, load it?) — p != z and p < splits
    for p in range(SPREAD_MAX_SPLITS):
        at = b.op("mad.wide.u32", b.op("mad.lo.u32", b.op("mov.u32", Imm(p, "u32")), r, ti), Imm(tile_bytes, "u32"), thr)
        go = b.op("and.pred", b.op("setp.lt.u32", b.op("mov.u32", Imm(p, "u32")), splits),
                  b.op("setp.ne.u32", z, Imm(p, "u32")))
        planes.append((at, go, b.op("setp.lt.u32", b.op("mov.u32", Imm(p, "u32")), splits)))
    for i, row in enumerate(acc):
        skip = b.label(f"spread_row{i}")
        b.bra(skip, pred=owned[i], neg=True)
        # v[p]: partial p of this row (own p_z: a copy of the registers), loaded in one batch
        v = [[[b.op("mov.f32", e) for e in frag] for frag in row] for _ in planes]
        for (at, go, _), vp in zip(planes, v):
            for j, regs in enumerate(vp):
                b.emit("ld.global.cg.v4.f32", b.vec(regs), Mem(at, (i * NT + j) * fbytes), pred=go)
        for j, frag in enumerate(row):
            for e in range(4):
                b.emit("mov.f32", frag[e], v[0][j][e])
                for p in range(1, len(planes)):
                    b.emit("add.rn.f32", frag[e], frag[e], v[p][j][e], pred=planes[p][2])
        b.place(skip)
    b.place(done)


def _last_sums_fixup(b, frags, tid, leader, slot, split, z, ti, r, splits, P, C, skip, tile_floats, scratch):
    """Split-K of a split item; the CTA that counts in last at the tile's counter sums the partials in z order
    (((p0 + p1) + p2) + ..., the same bits whichever CTA is last) with its own partial kept in registers. A CTA
    counts in first (the counter's low 16 bits count arrivals); all but the last then store their accumulator
    fragments in fragment order (thread tid's fragment f at float 4·(f·threads + tid), partial z of tail tile ti),
    fence, publish (+1 in the high 16 bits) and branch to `skip`. The last waits until the others have published
    (they are running already: the wait is bounded), loads partials 0 .. z-1 into a prefix sum in `scratch`
    (shared memory: its own thread's slots, no barrier), adds its own fragments to it (a + b = b + a) and adds
    partials z+1 ... Then it resets the counter and falls through to the caller's epilogue, which stores y.
    Against storing first and summing all: its own partial is neither stored nor read back, and the others'
    stores overlap its arrival."""
    b.comment("split-K: count in first; the others store and publish, the last sums in z order around its own")
    whole_item = b.label("whole_item")
    b.bra(whole_item, pred=split, neg=True)
    fbytes = 16 * 256  # one fragment of every thread
    thr = b.op("add.s64", P, b.op("cvt.u64.u32", b.op("shl.b32", tid, Imm(4, "u32"))))
    cnt, old = _arrive(b, ti, C, leader, slot, (Imm(0, "u32"),), lambda old: b.op("mov.u32", old))
    nm1 = b.op("sub.u32", splits, Imm(1, "u32"))
    last = b.label("split_last")
    b.bra(last, pred=b.op("setp.eq.u32", b.op("and.b32", old, Imm(0xFFFF, "b32")), nm1))
    own = b.op("mad.wide.u32", b.op("mad.lo.u32", z, r, ti), Imm(4 * tile_floats, "u32"), thr)
    for f, frag in enumerate(frags):
        b.emit("st.global.cg.v4.f32", Mem(own, f * fbytes), b.vec(frag))
    b.emit("bar.sync", Imm(0, "u32"))  # the CTA's partial stores, then the leader's release (cumulative over them)
    b.emit("red.release.gpu.global.add.u32", Mem(cnt), Imm(0x10000, "u32"), pred=leader)
    b.bra(skip)
    b.place(last)
    wait = b.label("split_wait")
    b.place(wait)  # every other split has published: the high half of the count is splits - 1
    seen = b.reg("u32")
    b.emit("ld.acquire.gpu.global.u32", seen, Mem(cnt))  # each thread acquires the others' partials itself
    b.bra(wait, pred=b.op("setp.ne.u32", b.op("shr.u32", seen, Imm(16, "u32")), nm1), uniform=False)
    plane = b.op("mul.wide.u32", r, Imm(4 * tile_floats, "u32"))  # partial j + 1 of a tile is this far on
    pz = b.op("mad.wide.u32", ti, Imm(4 * tile_floats, "u32"), thr)  # partial 0 of the tile, this thread's part
    mine = b.op("add.u32", scratch, b.op("shl.b32", tid, Imm(4, "u32")))  # this thread's prefix slots

    def load_plane():
        vs = [b.regs("f32", 4) for _ in frags]
        for f, v in enumerate(vs):
            b.emit("ld.global.cg.v4.f32", b.vec(v), Mem(pz, f * fbytes))
        return vs

    prefix_done = b.label("prefix_done")
    b.bra(prefix_done, pred=b.op("setp.eq.u32", z, Imm(0, "u32")))
    for f, v in enumerate(load_plane()):  # prefix = p0
        b.emit("st.shared.v4.f32", Mem(mine, f * fbytes), b.vec(v))
    j = b.op("mov.u32", Imm(1, "u32"))
    pl, pfold = b.label("prefix_sum"), b.label("prefix_fold")
    b.place(pl)
    b.bra(pfold, pred=b.op("setp.ge.u32", j, z))
    b.emit("add.s64", pz, pz, plane)
    for f, v in enumerate(load_plane()):  # prefix += p_j, j < z
        s = b.regs("f32", 4)
        b.emit("ld.shared.v4.f32", b.vec(s), Mem(mine, f * fbytes))
        for e in range(4):
            b.emit("add.rn.f32", s[e], s[e], v[e])
        b.emit("st.shared.v4.f32", Mem(mine, f * fbytes), b.vec(s))
    b.emit("add.u32", j, j, Imm(1, "u32"))
    b.bra(pl)
    b.place(pfold)
    for f, frag in enumerate(frags):  # own = prefix + own
        s = b.regs("f32", 4)
        b.emit("ld.shared.v4.f32", b.vec(s), Mem(mine, f * fbytes))
        for e in range(4):
            b.emit("add.rn.f32", frag[e], s[e], frag[e])
    b.emit("add.s64", pz, pz, plane)
    b.place(prefix_done)  # pz: partial z (not read)
    j = b.op("add.u32", z, Imm(1, "u32"))
    sl, sdone = b.label("suffix_sum"), b.label("suffix_done")
    b.place(sl)
    b.bra(sdone, pred=b.op("setp.ge.u32", j, splits))
    b.emit("add.s64", pz, pz, plane)
    for frag, v in zip(frags, load_plane()):  # own += p_j, j > z
        for e in range(4):
            b.emit("add.rn.f32", frag[e], frag[e], v[e])
    b.emit("add.u32", j, j, Imm(1, "u32"))
    b.bra(sl)
    b.place(sdone)
    b.emit("bar.sync", Imm(0, "u32"))  # every thread is past its poll before the reset (a warp still polling
    # could read the 0 and spin forever; a review's find, 2026-12-05)
    b.emit("st.global.u32", Mem(cnt), Imm(0, "u32"), pred=leader)
    b.place(whole_item)


def _k_range(b, codec, K, M, T, zsplit, per):
    """Row stride of W (the codec's rows) in bytes, split z's K-steps [s_begin, nsteps), and M - 1, T - 1 (load
    clamps)."""
    row_bytes = codec.row_bytes(b, K)
    s_begin = b.op("mul.lo.u32", zsplit, per)
    nsteps = b.op("min.u32", b.op("add.u32", s_begin, per), b.op("shr.u32", K, Imm(6, "u32")))  # this split's end
    mlast, tlast = b.op("sub.u32", M, Imm(1, "u32")), b.op("sub.u32", T, Imm(1, "u32"))
    return row_bytes, s_begin, nsteps, mlast, tlast


def _issue_raw(b, copies, step, nsteps, raw0, stages, stage_bytes=BM * RAW_ROW, extra=None, sdst=None):
    """cp.async the raw tile of K-step `step` into stage step % stages (nothing past the end), then commit;
    `copies`: the thread's, the raw ring codec's raw_copies; `extra(step, stage address, live)` adds copies of the
    same group (the Q8_1 MMQ's activations); `sdst`: that stage's address where the caller has it."""
    live = b.op("setp.lt.u32", step, nsteps)
    offset = RAW_CODEC.raw_offsets(b, step)
    if sdst is None:
        sdst = b.op("mad.lo.u32", b.op("rem.u32", step, Imm(stages, "u32")), Imm(stage_bytes, "u32"), raw0)
    for ok, column, src_row, dst_off in copies:
        src = b.op("add.s64", src_row, b.op("cvt.u64.u32", offset(column)))
        go = b.op("and.pred", ok, live)
        b.emit("cp.async.cg.shared.global", Mem(b.op("add.u32", sdst, dst_off)), Mem(src), Imm(16, "u32"), pred=go)
    if extra is not None:
        extra(step, sdst, live)
    b.emit("cp.async.commit_group")


def _splitk_fixup(b, tid, leader, slot, split_k, splits, C, P, Y0, m0, n0, tiles_n, M, T, BN, barrier=None):
    """Split-K without a reduction launch: after storing its partial tile, a CTA counts itself in at the
    tile's counter; the last of the `splits` CTAs sums the partials in z order (deterministic: the same
    order whichever CTA is last) into y and resets the counter to zero for the next launch. `tid` runs over
    the 256 threads that stored the tile, `barrier` the bar.sync operands that join them (default: id 0)."""
    barrier = barrier or (Imm(0, "u32"),)
    b.comment("split-K fixup: the last CTA of a tile sums the partials in z order into y")
    done = b.label("fixup_done")
    b.bra(done, pred=split_k, neg=True)
    b.emit("bar.sync", *barrier)  # the CTA's partial stores before the leader's count (_count_in: acq_rel)
    tile = b.op("mad.lo.u32", b.op("shr.u32", m0, Imm(7, "u32")), tiles_n, b.op("div.u32", n0, Imm(BN, "u32")))
    cnt = _count_in(b, tile, C, leader, slot, splits, barrier, done)
    row = b.op("and.b32", tid, Imm(127, "b32"))
    mm = b.op("add.u32", m0, row)
    plane = b.op("mul.wide.u32", b.op("mul.lo.u32", T, M), Imm(4, "u32"))
    # thread -> row tid % 128, tokens tid / 128 + 2i: coalesced along m. Passes of up to 16 tokens; in a pass
    # z is the outer loop, so the pass's loads of one split are in flight together, and each sum runs in z order
    per_pass = min(BN, 16) // 2
    nb = b.op("add.u32", n0, b.op("shr.u32", tid, Imm(7, "u32")))
    n_end = b.op("add.u32", n0, Imm(BN, "u32"))
    pl = b.label("fix_pass")
    b.place(pl)
    oks, idxs, tots = [], [], []
    for i in range(per_pass):
        nn = b.op("add.u32", nb, Imm(2 * i, "u32"))
        oks.append(b.op("and.pred", b.op("setp.lt.u32", mm, M), b.op("setp.lt.u32", nn, T)))
        idxs.append(b.op("mad.lo.u32", nn, M, mm))
        tots.append(b.op("mov.f32", Imm(0.0, "f32")))
    pz = b.op("mad.wide.u32", idxs[0], Imm(4, "u32"), P)  # token i of the pass is at pz + 8·i·M bytes
    z = b.op("mov.u32", Imm(0, "u32"))
    zl = b.label("z")
    b.place(zl)
    for i in range(per_pass):
        pv = b.op("mov.f32", Imm(0.0, "f32"))
        b.emit("ld.global.cg.f32", pv, Mem(b.op("mad.wide.u32", M, Imm(8 * i, "u32"), pz)), pred=oks[i])
        b.emit("add.rn.f32", tots[i], tots[i], pv)  # z = 0 first: 0 + p0 = p0
    b.emit("add.s64", pz, pz, plane)
    b.emit("add.u32", z, z, Imm(1, "u32"))
    b.bra(zl, pred=b.op("setp.lt.u32", z, splits))
    for i in range(per_pass):
        b.emit("st.global.f32", Mem(b.op("mad.wide.u32", idxs[i], Imm(4, "u32"), Y0)), tots[i], pred=oks[i])
    b.emit("add.u32", nb, nb, Imm(2 * per_pass, "u32"))
    b.bra(pl, pred=b.op("setp.lt.u32", nb, n_end))
    b.emit("st.global.u32", Mem(cnt), Imm(0, "u32"), pred=leader)
    b.place(done)


def _arrive(b, tile, C, leader, slot, barrier, decide, order=""):
    """The leader counts the CTA in at the tile's counter (atom.add 1) and shares the old count through `slot`;
    every thread applies `decide` to it before the slot is free again. Returns (counter address, decision).
    `order` "acq_rel": the count releases the CTA's stores before the caller's barrier (cumulative over every
    thread's) and acquires the other CTAs' — the barriers after it carry the acquire to every thread."""
    cnt = b.op("mad.wide.u32", tile, Imm(4, "u32"), C)
    old = b.reg("u32")
    b.emit(f"atom{'.acq_rel.gpu' if order else ''}.global.add.u32", old, Mem(cnt), Imm(1, "u32"), pred=leader)
    b.emit("st.shared.u32", Mem(slot, 4), old, pred=leader)
    b.emit("bar.sync", *barrier)
    decision = decide(b.op("ld.shared.u32", Mem(slot, 4)))
    b.emit("bar.sync", *barrier)  # everyone has read the slot before it is written again
    return cnt, decision


def _count_in(b, tile, C, leader, slot, splits, barrier, done):
    """Split-K arrival, after the CTA's partial stores and a barrier: the leader counts the CTA in at the tile's
    counter (acq_rel: a release of the CTA's stores, an acquire of the other splits') and shares the old count
    through `slot`; every CTA but the tile's last branches to `done`. The last reads the others' partials behind
    _arrive's barriers (no fence per thread: membar.gl is a fence.sc, MEMBAR.SC + ERRBAR in every warp). Returns
    the counter's address."""
    cnt, last = _arrive(b, tile, C, leader, slot, barrier,
                        lambda old: b.op("setp.eq.u32", old, b.op("sub.u32", splits, Imm(1, "u32"))), order="acq_rel")
    b.bra(done, pred=last, neg=True)
    return cnt


def _queue_exit(b, Q, leader):
    """The last CTA out resets the queue (item counter, finished CTAs) for the next launch."""
    done_before = b.reg("u32")
    b.emit("atom.global.add.u32", done_before, Mem(Q, 4), Imm(1, "u32"), pred=leader)
    last = b.op("and.pred", leader, b.op("setp.eq.u32", done_before,
                                         b.op("sub.u32", b.special("nctaid.x"), Imm(1, "u32"))))
    b.emit("st.global.v2.u32", Mem(Q), b.vec([b.op("mov.u32", Imm(0, "u32")), b.op("mov.u32", Imm(0, "u32"))]), pred=last)


# ---------------------------------------------------------------------------------------------------
# Q8_1 activations: int8 mma.sync m16n8k32 (u8 weights x s8 activations), as llama.cpp's MMQ does

class _Q8Tile(NamedTuple):
    """The Q8_1 MMQ's token tile, warp tiling and shared-memory sizes (bytes). Fused: a ring stage is the raw tile;
    a buffer holds (int8 tile, weight scales [sub][row], x scales [sub][token]). _pre: a stage is (raw tile, int8
    tile, x scales [token][sub]); a buffer holds the weight scales only."""
    BN: int
    S: int  # ring stages
    fused: bool
    WM: int  # warps along M
    WN: int  # warps along N
    MT: int  # m16 tiles per warp
    NT: int  # n8 tiles per warp
    raw_bytes: int  # the raw Q4_K tile
    act_bytes: int  # the int8 activation tile
    stab_bytes: int  # the weight-scale table
    stage_bytes: int  # one ring stage
    buf: int  # one of the two buffers
    stab_off: int  # the weight-scale table inside a buffer


def _q8_tile(spec: MmqSpec) -> _Q8Tile:
    """The _Q8Tile of a Q8_1 spec."""
    codec = codecs.get(spec.fmt)
    BN, fused = spec.bn, spec.fused
    WM, WN = Q8_WARPS[BN]
    raw_bytes = BM * RAW_ROW
    act_bytes, stab_bytes = BN * ACT_ROW, codec.Q8Decoder.SUBS * BM * codec.Q8_SCALE_BYTES
    stage_bytes = raw_bytes if fused else raw_bytes + act_bytes + BN * 16
    buf = act_bytes + stab_bytes + 2 * BN * 8 if fused else stab_bytes
    return _Q8Tile(BN, Q8_STAGES, fused, WM, WN, BM // WM // 16, BN // WN // 8, raw_bytes, act_bytes, stab_bytes,
                   stage_bytes, buf, act_bytes if fused else 0)


def build_q8(arch, spec: "MmqSpec"):
    """y = x @ W.T with x quantized to Q8_1 (per 32 values: d = amax/127 as fp16, q = rni(x·127/amax)).

    Per 64-K step the raw Q4_K tile (a cp.async ring of Q8_STAGES) is the A operand itself: `ldmatrix.x4` over
    the 32 qs bytes of 16 rows gives the fragments of both sub-blocks at once (low nibbles: sub-block 2c,
    `& 0x0F`; high: 2c+1, `& 0xF0`, i.e. 16·q with the 1/16 folded into its d·sc), no dequant pass. Per sub-block
    one m16n8k32 gives the exact integer dot Σ q_w·q_x, and the fp32 accumulator takes d·sc·d_x·Σ q_w·q_x −
    dmin·m·d_x·Σ q_x (4 instructions per accumulator). (d·sc, −dmin·m) per (row, sub-block) are decoded once per
    step into a double-buffered shared table, a step ahead of the MMA (one barrier per step). The Q4_K side of all
    this is the codec's (codecs/q4_k.py q8_lane_offset, Q8Decoder, Q8Scales); here the tiles, ring and K loop.

    Activations, two variants: fused (`mmq_q4_k_q8_n*`): fp32 x loaded a step ahead into registers and
    quantized on the way into a double-buffered int8 tile (amax and Σq over 8 lanes by shfl, exactly
    `quantize_q8_1`'s arithmetic; every weight-row tile re-quantizes its tokens). `_pre`: `quantize_q8_1_mmq`
    wrote int8 rows and (d, d·Σq) once; they travel with the weights in the cp.async ring (16-byte chunks).
    NaN in x gives a NaN d_x, so NaN reaches that token's outputs."""
    codec = codecs.get(spec.fmt)
    tile, pipe, mma, sched, epilogue = describe(arch, spec)
    qt = _q8_tile(spec)
    BN, S, fused = qt.BN, qt.S, qt.fused
    pipe = Pipeline(S, copy=pipe.copy)
    pipe.check_smem(arch, qt.stage_bytes + 2 * qt.buf // S)
    how = "fp32 quantized in the load pipeline" if fused else "quantize_q8_1_mmq's int8 rows, in the ring"
    b = KernelBuilder(spec.name, arch, f"Q4_K x Q8_1 GEMM, int8 mma.sync m16n8k32, tile {BM}x{BN}x{BK}, "
                      f"{S}-stage cp.async, activations: {how}", block=(256, 1, 1))
    w_p, x_p, y_p = b.param("w", "u64", "ptr:in"), b.param("x", "u64", "ptr:in"), b.param("y", "u64", "ptr:out")
    f_p = b.param("flag", "u64", "ptr:out")  # fused: set to 1 if a block's d = amax/127 overflows fp16
    m_p, k_p, t_p, s_p, c_p, tn_p, sp_p, pt_p, ct_p = _mmq_params(b)
    smem, work = _q8_smem_and_meta(b, qt, pipe, sched)

    W, X, Y0, Q, F = b.ptr(w_p), b.ptr(x_p), b.ptr(y_p), b.ptr(c_p), b.ptr(f_p)
    M, K, T, per, tiles_n, splits = _ld_sizes(b, m_p, k_p, t_p, s_p, tn_p, sp_p)
    tid = b.special("tid.x")
    ovf = b.op("setp.ne.u32", tid, tid) if fused else None  # false
    lane = b.op("and.b32", tid, Imm(31, "b32"))
    warp = b.op("shr.u32", tid, Imm(5, "u32"))
    tiles_m = _tiles_m(b, M)
    items = b.op("mul.lo.u32", b.op("mul.lo.u32", tiles_m, splits), tiles_n)
    slot = b.op("mov.u32", work)
    leader = b.op("setp.eq.u32", tid, Imm(0, "u32"))
    P, C = b.ptr(pt_p), b.ptr(ct_p)
    split_k = b.op("setp.gt.u32", splits, Imm(1, "u32"))
    next_item, finish, zsplit, Yz, n0, m0 = _claim_item(b, Q, slot, leader, items, tiles_n, splits, T, M, BN, P,
                                                        K if MMQ_RASTER else None)
    Y = b.op("selp.b64", Yz, Y0, split_k)  # one split: straight into y
    raw0 = b.op("mov.u32", smem)
    buf0 = b.op("add.u32", raw0, Imm(S * qt.stage_bytes, "u32"))
    row_bytes, s_begin, nsteps, mlast, tlast = _k_range(b, codec, K, M, T, zsplit, per)
    copies = codec.raw_copies(b, tid, m0, mlast, row_bytes, W, BM, 256)

    def boff_of(stp):
        return b.op("mad.lo.u32", b.op("and.b32", stp, Imm(1, "b32")), Imm(qt.buf, "u32"), buf0)

    def raw_of(stp):
        return b.op("mad.lo.u32", b.op("rem.u32", stp, Imm(S, "u32")), Imm(qt.stage_bytes, "u32"), raw0)

    kblocks = b.op("shr.u32", K, Imm(5, "u32"))
    copy_act = None if fused else _q8_act_copies(b, qt, tid, n0, tlast, K, T, X, kblocks)

    def issue(step):
        _issue_raw(b, copies, step, nsteps, raw0, S, qt.stage_bytes, copy_act)

    load_x, store_x = _q8_quantize_x(b, qt, tid, lane, n0, tlast, K, X, ovf)
    prep = _q8_scales(b, codec, qt, tid, raw_of, boff_of, store_x)
    wm, wn, acc, mma_step = _q8_mma(b, codec, arch, qt, warp, lane, raw_of, boff_of)
    _q8_pipeline(b, qt, acc, issue, load_x, prep, mma_step, s_begin, nsteps)

    b.comment("epilogue: y[t][m] = acc, masked to t < T, m < M")
    epilogue.lower_mma_sync(b, acc, lane, m0, wm, 16 * qt.MT, n0, wn, 8 * qt.NT, M, T, Y)
    _splitk_fixup(b, tid, leader, slot, split_k, splits, C, P, Y0, m0, n0, tiles_n, M, T, BN)
    return _next_item_or_exit(b, next_item, finish, Q, leader, F, (lambda: ovf) if fused else None)


def _q8_smem_and_meta(b, qt: _Q8Tile, pipe, sched):
    """The Q8_1 MMQ's dynamic shared memory (S ring stages, then two buffers), metadata, work-item slot and launch
    bounds. Returns (dynamic shared memory, work-item slot)."""
    BN, S, fused = qt.BN, qt.S, qt.fused
    smem = b.dynamic_shared(S * qt.stage_bytes + 2 * qt.buf)
    b.meta.update(bm=BM, bn=BN, bk=BK, stages=S, warps=8, copy=pipe.copy, mma="mma.sync m16n8k32 u8 x s8",
                  schedule=sched.kind, dynamic_smem=b.dynamic_smem, activations="q8_1" + ("" if fused else " (pre)"),
                  x_layout="fp32 (T, K)" if fused else "quantize_q8_1_mmq: int8 (T, K), then float2 (T, K/32)",
                  ctas_per_sm=Q8_CTAS_PER_SM[BN, fused], warp_tile=f"{16 * qt.MT}x{8 * qt.NT}",
                  grid="persistent: min(items, resident CTAs per SM · SMs) CTAs", work_queue="as mmq_q4_k_f16_n*",
                  split_k=SPLIT_K_NOTE)
    work = b.shared_buffer("work_item", 16, align=16)
    # n16 fits 80 registers (3 CTAs per SM), n32 128 (2); n64 would spill at 128 and runs one CTA per SM
    b.directives += [".maxntid 256, 1, 1", f".minnctapersm {Q8_CTAS_PER_SM[BN, fused]}"]
    return smem, work


def _q8_act_copies(b, qt: _Q8Tile, tid, n0, tlast, K, T, X, kblocks):
    """The _pre Q8_1 MMQ's activation copies: per step and token 4 chunks of 16 int8 + 1 chunk (d, d·Σq) x 2
    blocks; chunk c = tid + 256r. Returns copy_act(step, stage address, live), _issue_raw's `extra`: the step's
    chunks by cp.async into the ring stage after the raw tile."""
    BN, act_bytes = qt.BN, qt.act_bytes
    xs_base = b.op("mad.wide.u32", T, K, X)  # the float2 scales follow the T·K int8 values
    act_copies = []
    for r in range(-(-BN * 5 // 256)):
        c = b.op("add.u32", tid, Imm(256 * r, "u32"))
        ok = b.op("setp.lt.u32", c, Imm(BN * 5, "u32"))
        tok = b.op("div.u32", c, Imm(5, "u32"))
        part = b.op("rem.u32", c, Imm(5, "u32"))
        gtok = b.op("min.u32", b.op("add.u32", n0, tok), tlast)
        is_q = b.op("setp.lt.u32", part, Imm(4, "u32"))
        q_src = b.op("add.s64", b.op("mad.wide.u32", gtok, K, X),
                     b.op("cvt.u64.u32", b.op("shl.b32", part, Imm(4, "u32"))))
        s_src = b.op("mad.wide.u32", gtok, b.op("shl.b32", kblocks, Imm(3, "u32")), xs_base)
        dst = b.op("selp.b32", b.op("mad.lo.u32", tok, Imm(ACT_ROW, "u32"), b.op("shl.b32", part, Imm(4, "u32"))),
                   b.op("mad.lo.u32", tok, Imm(16, "u32"), Imm(act_bytes, "u32")), is_q)
        act_copies.append((ok, is_q, q_src, s_src, b.op("add.u32", dst, Imm(qt.raw_bytes, "u32"))))

    def copy_act(step, sdst, live):
        qk = b.op("cvt.u64.u32", b.op("shl.b32", step, Imm(6, "u32")))  # 64 int8 per step
        sk = b.op("cvt.u64.u32", b.op("shl.b32", step, Imm(4, "u32")))  # 2 float2 per step
        for ok, is_q, q_src, s_src, dst in act_copies:
            src = b.op("selp.b64", b.op("add.s64", q_src, qk), b.op("add.s64", s_src, sk), is_q)
            b.emit("cp.async.cg.shared.global", Mem(b.op("add.u32", sdst, dst)), Mem(src), Imm(16, "u32"),
                   pred=b.op("and.pred", ok, live))
    return copy_act


def _q8_quantize_x(b, qt: _Q8Tile, tid, lane, n0, tlast, K, X, ovf):
    """The fused Q8_1 MMQ's activations (none for _pre, whose load_x emits only its step offset): unit u = tid +
    256v covers 4 values: token u/16, 32-block (u%16)/8 of the step, word u%8; the 8 lanes of a block are an
    aligned group of a warp (amax and Σq by shfl.bfly 4, 2, 1). Returns (load_x(step): fp32 x into registers,
    store_x(boff): quantized into the int8 tile and x-scale table of buffer boff, overflow into `ovf`)."""
    BN, fused, act_bytes, stab_bytes = qt.BN, qt.fused, qt.act_bytes, qt.stab_bytes
    nvec = BN * 16 // 256 if fused else 0
    # the int8 tile's word, and the x-scale table entry [sub-block k4/8][token] (written by the group's first lane)
    units = _x_units(b, tid, n0, tlast, K, X, nvec, lambda tok, k4: (
        b.op("mad.lo.u32", tok, Imm(ACT_ROW, "u32"), b.op("shl.b32", k4, Imm(2, "u32"))),
        b.op("shl.b32", b.op("mad.lo.u32", b.op("shr.u32", k4, Imm(3, "u32")), Imm(BN, "u32"), tok), Imm(3, "u32"))))
    first = b.op("setp.eq.u32", b.op("and.b32", lane, Imm(7, "b32")), Imm(0, "u32")) if fused else None
    xregs = [b.regs("f32", 4) for _ in range(nvec)]

    def load_x(step):
        _load_x(b, step, units, xregs)

    def bfly(v, off, t):
        return b.op("shfl.sync.bfly.b32", v, Imm(off, "u32"), Imm(31, "u32"), Imm(0xFFFFFFFF, "b32"), type=t)

    def store_x(boff):
        for v in range(nvec):  # quantize_q8_1's arithmetic: amax (NaN-propagating), q = rni(x · 127/amax)
            xs = xregs[v]
            a = b.op("max.NaN.f32", b.op("max.NaN.f32", b.op("abs.f32", xs[0]), b.op("abs.f32", xs[1])),
                     b.op("max.NaN.f32", b.op("abs.f32", xs[2]), b.op("abs.f32", xs[3])))
            for off in (4, 2, 1):
                a = b.op("max.NaN.f32", a, bfly(a, off, "f32"))
            inv = b.op("selp.f32", b.op("div.rn.f32", Imm(127.0, "f32"), a), Imm(0.0, "f32"),
                       b.op("setp.gt.f32", a, Imm(0.0, "f32")))
            q = [b.op("cvt.rni.s32.f32", b.op("mul.rn.f32", xv, inv)) for xv in xs]
            d16 = b.op("cvt.rn.f16.f32", b.op("div.rn.f32", a, Imm(127.0, "f32")))
            d = b.op("cvt.f32.f16", d16)
            # a finite amax whose d overflows fp16 (|x| > 65504·127): Q8_1 cannot hold it; flag it
            big = b.op("and.pred", b.op("setp.eq.f32", d, Imm(float("inf"), "f32")),
                       b.op("setp.lt.f32", a, Imm(float("inf"), "f32")))
            b.emit("or.pred", ovf, ovf, big)
            word = b.op("prmt.b32", b.op("prmt.b32", q[0], q[1], Imm(0x0040, "b32")),
                        b.op("prmt.b32", q[2], q[3], Imm(0x0040, "b32")), Imm(0x5410, "b32"))
            sq = b.op("add.s32", b.op("add.s32", q[0], q[1]), b.op("add.s32", q[2], q[3]))
            for off in (4, 2, 1):
                sq = b.op("add.s32", sq, bfly(sq, off, "s32"))
            b.emit("st.shared.b32", Mem(b.op("add.u32", units[v][1], boff)), word)
            tab = b.op("add.u32", b.op("add.u32", units[v][2], boff), Imm(act_bytes + stab_bytes, "u32"))
            dsq = b.op("mul.rn.f32", d, b.op("cvt.rn.f32.s32", sq))
            b.emit("st.shared.v2.f32", Mem(tab), b.vec([d, dsq]), pred=first)
    return load_x, store_x


def _q8_scales(b, codec, qt: _Q8Tile, tid, raw_of, boff_of, store_x):
    """The Q8_1 MMQ's weight scales: thread -> (row tid/2, sub-block 2c + tid%2), decoded by the codec's Q8Scales into
    the table [sub][row] of (d·sc, −dmin·m). Returns prep(step): the step's scale table (and, fused, its quantized
    activations) into buffer step % 2."""
    assert codec.Q8Decoder.SUBS == 2 and codec.Q8_SCALE_BYTES == 8  # the thread map and the table's shifts
    srow = b.op("shr.u32", tid, Imm(1, "u32"))
    sh = b.op("and.b32", tid, Imm(1, "b32"))
    scales = codec.Q8Scales(b, srow, sh)
    s_dst = b.op("add.u32", b.op("shl.b32", b.op("mad.lo.u32", sh, Imm(BM, "u32"), srow), Imm(3, "u32")),
                 Imm(qt.stab_off, "u32"))

    def decode_scales(step, boff):
        dsc, ndm = scales.values(step, raw_of)
        b.emit("st.shared.v2.f32", Mem(b.op("add.u32", s_dst, boff)), b.vec([dsc, ndm]))

    def prep(step):
        boff = boff_of(step)
        decode_scales(step, boff)
        if qt.fused:
            store_x(boff)
    return prep


def _q8_mma(b, codec, arch, qt: _Q8Tile, warp, lane, raw_of, boff_of):
    """The Q8_1 MMQ's MMA lanes: warp (wm, wn) = (warp / WN, warp % WN), warp tile 16·MT x 8·NT. Returns (wm, wn,
    acc, mma_step(step): the step's m16n8k32 integer dots scaled into the fp32 accumulators)."""
    BN, fused, MT, NT, WN = qt.BN, qt.fused, qt.MT, qt.NT, qt.WN
    raw_bytes, act_bytes, stab_bytes, stab_off = qt.raw_bytes, qt.act_bytes, qt.stab_bytes, qt.stab_off
    wm = b.op("div.u32", warp, Imm(WN, "u32"))
    wn = b.op("rem.u32", warp, Imm(WN, "u32"))
    q = b.op("shr.u32", lane, Imm(3, "u32"))
    l8 = b.op("and.b32", lane, Imm(7, "b32"))
    g = b.op("shr.u32", lane, Imm(2, "u32"))
    tig = b.op("and.b32", lane, Imm(3, "b32"))
    # A (the raw ring's qs, codec.q8_lane_offset): matrix q of x4 -> rows +8·(q%2), k +16·(q/2)
    a_row = b.op("add.u32", b.op("mad.lo.u32", wm, Imm(16 * MT, "u32"), l8),
                 b.op("shl.b32", b.op("and.b32", q, Imm(1, "b32")), Imm(3, "u32")))
    a_lane = codec.q8_lane_offset(b, a_row, q)
    # B (int8 tile): matrix q -> tokens +8·(q/2) (x4: two n8 tiles), bytes +16·(q%2)
    b_tok = b.op("mad.lo.u32", wn, Imm(8 * NT, "u32"), l8)
    if NT >= 2:
        b_tok = b.op("add.u32", b_tok, b.op("shl.b32", b.op("shr.u32", q, Imm(1, "u32")), Imm(3, "u32")))
    b_lane = b.op("mad.lo.u32", b_tok, Imm(ACT_ROW, "u32"),
                  b.op("shl.b32", b.op("and.b32", q, Imm(1, "b32")), Imm(4, "u32")))
    # this thread's accumulator rows (wm·64 + 16i + g + 8hi) in the weight-scale table; its tokens 2·tig (+1)
    st_lane = b.op("add.u32", b.op("shl.b32", b.op("mad.lo.u32", wm, Imm(16 * MT, "u32"), g), Imm(3, "u32")),
                   Imm(stab_off, "u32"))
    x_tok = b.op("mad.lo.u32", wn, Imm(8 * NT, "u32"), b.op("shl.b32", tig, Imm(1, "u32")))
    acc = [[[b.reg("f32") for _ in range(4)] for _ in range(NT)] for _ in range(MT)]
    zero = [b.op("mov.b32", Imm(0, "b32")) for _ in range(4)]
    dec = codec.Q8Decoder(b)

    def x_scales(atp, h, j):
        """(d_x, d_x·Σq) of tokens 2·tig and 2·tig + 1 of n8 tile j, sub-block h: [d0, s0, d1, s1]."""
        regs = b.regs("f32", 4)
        if fused:  # table [sub][token] in the buffer: one 16-byte load
            b.emit("ld.shared.v4.f32", b.vec(regs), Mem(atp, act_bytes + stab_bytes + 8 * (h * BN + 8 * j)))
        else:  # [token][sub] in the ring stage
            for e in range(2):
                b.emit("ld.shared.v2.f32", b.vec(regs[2 * e:2 * e + 2]), Mem(atp, 16 * (8 * j + e) + 8 * h))
        return regs

    def mma_step(step):
        stage = raw_of(step)
        rawp = b.op("add.u32", stage, a_lane)
        boff = boff_of(step)
        araw = []
        for i in range(MT):
            regs = b.regs("b32", 4)
            b.emit(ldmatrix(arch, 4, b.vec(regs), Mem(rawp, i * codec.Q8_TILE_BYTES)))
            araw.append(regs)
        if fused:
            bl = b.op("add.u32", b_lane, boff)
            atp = b.op("add.u32", b.op("shl.b32", x_tok, Imm(3, "u32")), boff)
        else:
            bl = b.op("add.u32", b_lane, b.op("add.u32", stage, Imm(raw_bytes, "u32")))
            atp = b.op("add.u32", b.op("shl.b32", x_tok, Imm(4, "u32")),
                       b.op("add.u32", stage, Imm(raw_bytes + act_bytes, "u32")))
        stp = b.op("add.u32", st_lane, boff)
        for h in range(dec.SUBS):
            bfr = []
            for j in range(0, NT, 2):
                if NT >= 2:
                    regs = b.regs("b32", 4)
                    b.emit(ldmatrix(arch, 4, b.vec(regs), Mem(bl, j * 8 * ACT_ROW + 32 * h)))
                    bfr += [regs[0:2], regs[2:4]]
                else:
                    regs = b.regs("b32", 2)
                    b.emit(ldmatrix(arch, 2, b.vec(regs), Mem(bl, 32 * h)))
                    bfr.append(regs)
            xs = [x_scales(atp, h, j) for j in range(NT)]
            for i in range(MT):  # one m16 tile at a time: its A fragment and its rows' scales
                afr = dec.fragment(araw[i], h)
                ws = [b.regs("f32", 2) for _ in range(2)]  # [hi] -> (d·sc, −dmin·m) of rows g, g + 8
                for hi in range(2):
                    b.emit("ld.shared.v2.f32", b.vec(ws[hi]), Mem(stp, codec.Q8_SCALE_BYTES * (h * BM + 16 * i + 8 * hi)))
                for j in range(NT):
                    isum = b.regs("s32", 4)
                    b.emit(mma_sync(arch, "m16n8k32", "u8", b.vec(isum), b.vec(afr), b.vec(bfr[j]), b.vec(zero),
                                    b_type="s8"))
                    for e in range(4):
                        dec.accumulate(acc[i][j][e], ws[e // 2], xs[j][2 * (e % 2):2 * (e % 2) + 2], isum[e])
    return wm, wn, acc, mma_step


def _q8_pipeline(b, qt: _Q8Tile, acc, issue, load_x, prep, mma_step, s_begin, nsteps):
    """The Q8_1 MMQ's K loop: the MMA of step s reads ring stage s % S, the prep of s+1 reads (s+1) % S, s+2 ..
    s+S-1 are in flight; the prepared buffers are double-buffered. Zeroes the accumulators first."""
    S, fused = qt.S, qt.fused
    _zero_acc(b, acc)
    b.comment(f"prologue: steps s0 .. s0+{S - 2} in flight; step s0 prepared into buffer s0 % 2")
    s_last = b.op("sub.u32", nsteps, Imm(1, "u32"))
    for i in range(S - 1):
        issue(b.op("add.u32", s_begin, Imm(i, "u32")) if i else s_begin)
    load_x(s_begin)
    b.emit("cp.async.wait_group", Imm(S - 2, "u32"))
    b.emit("bar.sync", Imm(0, "u32"))
    prep(s_begin)
    step = b.op("mov.u32", s_begin)
    if fused:
        skip1 = b.label("single_step")
        b.bra(skip1, pred=b.op("setp.ge.u32", step, s_last))
        load_x(b.op("add.u32", s_begin, Imm(1, "u32")))
        b.place(skip1)
    b.emit("cp.async.wait_group", Imm(S - 3, "u32"))
    b.emit("bar.sync", Imm(0, "u32"))
    top, done = b.label("kstep"), b.label("ksteps_done")
    b.bra(done, pred=b.op("setp.ge.u32", step, s_last))
    b.place(top)
    issue(b.op("add.u32", step, Imm(S - 1, "u32")))  # into the stage of s-1: its MMA is done
    mma_step(step)
    nxt = b.op("add.u32", step, Imm(1, "u32"))
    prep(nxt)
    if fused:
        more = b.op("setp.lt.u32", b.op("add.u32", step, Imm(2, "u32")), nsteps)
        skip = b.label("no_prefetch")
        b.bra(skip, pred=more, neg=True)
        load_x(b.op("add.u32", step, Imm(2, "u32")))
        b.place(skip)
    b.emit("cp.async.wait_group", Imm(S - 3, "u32"))  # step s+2 landed (s+3 .. s+S-1 may be in flight)
    b.emit("bar.sync", Imm(0, "u32"))  # buffer (s+1) % 2 complete; everyone done with stage s and buffer s % 2
    b.emit("mov.u32", step, nxt)
    b.bra(top, pred=b.op("setp.lt.u32", step, s_last))
    b.place(done)
    mma_step(step)  # the last step
    b.emit("cp.async.wait_group", Imm(0, "u32"))


# ---------------------------------------------------------------------------------------------------
# sm_90a lowering of the same description: TMA + mbarrier ring, warp-specialized producer, wgmma

WG_STAGES = 4
RA_FRAG_BYTES = layouts.RA_FRAG_BYTES  # the prepared builds: one (M-tile, K-step) block of A fragments
RAW_PART = BM * 16  # one 16-byte column of the 128-row raw tile (header, qs bytes 0-15, qs bytes 16-31)
A_TILE = 64 * 128  # one consumer's dequantized 64 x 64 fp16 tile: 128-byte rows, 128B swizzle
PRODUCER_REGS, CONSUMER_REGS = 40, 232  # setmaxnreg: 128 x 40 + 256 x 232 = 64512 <= 65536
CONSUMER_WARPS = 8  # two consumer warpgroups: a cluster peer's ring stages are released once per consumer warp
# the grouped n32 / n64 builds, two CTAs an SM (16 consumer warps hide the decode's latency): launched at 80
# registers, 128 x 24 + 256 x 104 = 29696 <= 384 x 80 (n64's 32 accumulators fit 104 without spills; n128's do not)
PAIRED_REGS = (80, 24, 104)
WIDE_CONSUMER_REGS = 112  # the 256-row grouped builds past n48 (n64 spilled in its K loop at 104): the most the pool
# of 640 threads launched at 96 gives (128 x 24 + 512 x 112 = 60416 <= 61440; 120 hung: _check_reg_pool)
PAIRED_MAX_BN = 96  # (the n80-n96 tiles: GROUPED_WGMMA_Q4K_TILES, their stages half a block: HALF_BLOCK_MIN_BN)
GROUPED_TRACE = False  # a diagnostic build (bench/probe_moe_trace.py), never shipped: each item's consumer thread 0
# writes (%ctaid.x, %smid, %globaltimer_lo as the item reached the consumers, ... after its K loop) as 4 u32 words
# at y + 16·item instead of the item's y rows
HALF_BLOCK_MIN_BN = 80  # the paired grouped builds from this token tile: a stage holds 2 K-steps (half a block), so
# that two CTAs' stages and A slots fit an SM (n96: 2 x 24 KB of stages + 2 x 20 KB A slots a CTA)


def _wg_regs(spec: MmqSpec) -> tuple[int, int, int]:
    """(CTAs an SM, producer registers, consumer registers) of a wgmma build: one CTA with setmaxnreg's 40 / 232,
    or (the grouped builds up to PAIRED_MAX_BN) two with PAIRED_REGS, or (a 256-row M tile: 640 threads launched at
    96) one with PAIRED_REGS' 24 / 104 (past n48: WIDE_CONSUMER_REGS). _check_reg_pool checks each split."""
    if spec.bm > BM:  # four consumer warpgroups: one CTA an SM, each consumer at the paired builds' 104 (wider
        # token tiles at WIDE_CONSUMER_REGS)
        return 1, PAIRED_REGS[1], PAIRED_REGS[2] if spec.bn <= 48 else WIDE_CONSUMER_REGS
    if spec.grouped and spec.bn <= PAIRED_MAX_BN:
        return 2, PAIRED_REGS[1], PAIRED_REGS[2]
    return 1, PRODUCER_REGS, CONSUMER_REGS


def _check_reg_pool(spec: MmqSpec) -> None:
    """setmaxnreg moves registers inside the CTA's pool, which the launch fixes at the entry allocation (the launch
    bounds' cap: 64 K registers over the CTAs an SM and their threads, in units of 8): a consumer's
    setmaxnreg.inc that the pool cannot serve spins forever. The 256-row builds' first 120-register consumers hung
    so on an H100 (2026-12-06): 128 x 24 + 512 x 120 = 64512 > 640 x 96 = 61440."""
    ctas, producer, consumer = _wg_regs(spec)
    threads = _wg_threads(spec)
    entry = min(255, 65536 // (threads * ctas) // 8 * 8)
    need = 128 * producer + (threads - 128) * consumer
    if not (24 <= producer <= entry <= consumer <= 256 and producer % 8 == 0 and consumer % 8 == 0):
        raise ValueError(f"{spec.name}: setmaxnreg counts must be multiples of 8 in [24, 256], the producer's .dec "
                         f"at most and the consumers' .inc at least the entry's {entry} (producer {producer}, "
                         f"consumers {consumer})")
    if need > threads * entry:
        raise ValueError(f"{spec.name}: setmaxnreg asks {need} registers of a CTA launched with {threads} x {entry} = "
                         f"{threads * entry} (producer {producer}, consumers {consumer})")


def _wg_threads(spec: MmqSpec) -> int:
    """The wgmma build's threads: the producer warpgroup and a consumer warpgroup per 64 rows of the M tile."""
    return 128 * (1 + spec.bm // 64)


# The dense register-A n64 builds of Q6_K and Q8_0 keep more weight bytes in flight: 8 stages (not 4), and Q6_K 4 A
# slots (not 2). ncu at T = 16 (4096x14336): a quarter of the consumers' stall samples waited on full stages, DRAM
# 23-37% busy. H200, eager µs T = 16 / 64: Q6_K 39.4 / 41.2 -> 37.2 / 39.3, Q8_0 35.3 / 37.3 -> 33.8 / 34.3; the
# same deepening lost on Q5_K n64 (41.7 -> 43.4), the n256 builds (T = 512 +1-4%) and the grouped MoE builds
# (+5-13%, but at one CTA an SM: see RA_DEEP_GROUPED) (bench/NOTES.md, 2026-12-02).
RA_DEEP_FORMATS = ("q6_K", "q8_0")
RA_DEEP_MAX_BN = 64
RA_DEEP_GROUPED = False  # (the grouped builds measured with 1 CTA an SM then: _deep_ring now keeps their 2)
# ... the grouped integer-weight build (n16: 2.5 KB stages with its Σx tile) does take the deep ring at 2 CTAs an SM:
# 8 stages, 4 A slots. H200 graph µs, MoE 128 x top-8 768x2048 T = 32 / 128 57.2 / 67.7 -> 54.5 / 64.8, 32 x top-4
# T = 32 45.1 -> 44.2; 12 stages lost 1-1.5 of that; the fp16-weight grouped builds lost 1-6
# (probe_deep_ring_59b6360.log). With the static A-slot steps of _iw_steps: 57.3 / 67.6 / 45.0 -> 53.2 / 63.4 / 43.1
# (probe_iw_static_deep_59b6360.log).
IW_DEEP = True
# The grouped block-stage builds load a stage's activation tiles as one TMA, a 3-D box of the stage's 64-column
# chunks (tensor map: column in the chunk, pair, chunk; meta x_box_chunks), not one a K-step, and the integer-weight
# build its Σx hi and lo tiles as one (s_box_chunks). Same bits; H200 graph µs, per step -> one a stage
# (probe_b3d_9c0e620.log), MoE Q4_K 128 x top-8 768x2048 T = 32 / 128 / 256 / 512 / 1024 44.7 / 53.4 / 74.3 / 77.3
# / 124.9 -> 43.5 / 52.8 / 72.9 / 77.1 / 123.4; 32 x top-4 1792x2048 37.9 / 44.5 / 50.7 / 69.0 / 123.1 -> 36.9 /
# 44.3 / 50.5 / 67.0 / 123.0. (Boxes of 8 or 16 pairs up to the expert's last place instead — fewer bytes, more
# TMAs — lost 1-20 µs: probe_b_rows_9c0e620.log.)
GROUPED_B_3D = True
TMA_3D = TMA_STEP.replace(".2d.", ".3d.")


def _b3d() -> bool:
    return GROUPED_B_3D and not GROUPED_SKELETON  # (the skeleton diagnostics drop a stage's tiles one by one)


GROUPED_SKELETON = ""  # a diagnostic build (bench/probe_build_ab.py --variant), never shipped, wrong y: the grouped
# fp16-weight builds' K loop without parts of its work, to time what each part costs — "nodecode" (A = 1.0 halves,
# the A slots still waited for and given back), "skeleton" (neither decode nor MMAs), and with "noa" / "nob" in the
# name no weights' / activations' TMA either (their barriers expect no bytes); "halfb": a block stage's first half of
# B tiles only (the rest of the stage stale). bench/NOTES.md 2026-12-04, evening, and 2026-12-04, night.
# ... and a ring stage holds a block's 4 B tiles and its Σx tile: one full wait and one release a block, not a step
# (_block_stage_tma; 6 stages, 3 A slots at n16). Same bits; H200 graph µs, step / block stages, MoE 128 x top-8
# 768x2048 T = 32 / 64 / 128 53.5 / 61.2 / 62.9 -> 44.4 / 53.1 / 54.9, 32 x top-4 1792x2048 T = 32 / 64 43.0 / 44.3
# -> 38.1 / 39.1 (probe_iw_block_stages_9d3955d.log; 4 A slots and 3 stages: the same). Always: _iw_steps has no
# step-stage form.
# The grouped fp16-weight nibble builds (Q4_K, Q5_K n32 / n64) take block stages too (_ra_block_loop; n64: 2 stages
# at 2 CTAs an SM). Same bits; H200 graph µs, step / block stages (probe_ra_block_stages_2e8da66.log): 128 x top-8
# Q4_K T = 512 98.8 -> 93.8, Q5_K T = 64 / 256 / 512 104.0 / 104.1 / 121.5 -> 84.3 / 89.6 / 115.0; 32 x top-4 Q4_K
# T = 256 / 512 61.2 / 89.7 -> 58.5 / 84.8, Q5_K T = 64 / 256 / 512 67.4 / 74.5 / 108.9 -> 66.3 / 69.6 / 99.8.
RA_BLOCK_STAGES = True
# The grouped register-A Q4_K / Q5_K builds on block stages may decode two instructions a weight pair
# (codecs.q4_k.dequant_pair2: q·sc'·d − m_hi, one rounding) and add the sub-blocks' −m_lo·Σx as one more k16 MMA a
# block into the same accumulators (A = RegA.min_fragments' lo, B = the block's Σx tile from moe_gather_sums, as
# the integer-weight build's): 542 -> 494 SASS a block at n48_m256, the GEMM closer to float64 than dequant_pair3
# (bench/model_decode_roundings.py; bench/results/study_min_term_mma_2026-12-07.md). H100 µs eager / graph, off / on
# (probe_build_ab, h100_minlo_*_63b1174.log): 128 x top-8 T = 512 82.0 / 80.2 -> 81.1 / 79.7, 32 x top-4 T = 512
# 64.6 / 62.5 -> 63.8 / 62.2 (T = 128 takes the integer-weight build: unchanged).
RA_MIN_LO_MMA = True
MIN_LO_NOTE = ("A = q·sc'·d − m_hi in one rounding (dequant_pair2); each block's −m_lo·Σx as one more k16 MMA into "
               "the same accumulators: A = [lo | 0] of the lane's sub-blocks (RegA.min_fragments), B = the block's Σx "
               "tile [hi | lo] (moe_gather_sums)")


def min_lo_sums(spec: MmqSpec) -> bool:
    """Whether the build takes the activation's sub-block sums for its −m_lo MMA (RA_MIN_LO_MMA): the grouped
    register-A nibble builds with block boxes and whole-block stages."""
    return bool(RA_MIN_LO_MMA and spec.grouped and spec.a_regs and not spec.int_weights and not spec.prepared
                and spec.fmt in NIBBLE_PARTS and _block_box(spec) and RA_BLOCK_STAGES and spec.bn <= PAIRED_MAX_BN
                and (spec.bn < HALF_BLOCK_MIN_BN or spec.bm != BM))


RA_MAX_STAGES = 8
RA_MAX_A_SLOTS = 4
STATIC_SMEM_MARGIN = 512  # the builds' static shared memory (barriers, item slots: ~100-260 bytes)


def _deep_ring(arch, spec: MmqSpec, stage_bytes: int, a_slot_bytes: int, slots: int, other: int = 0) -> tuple[int, int]:
    """(A slots, stages) filling the CTA's share of shared memory (an SM holds the opt-in limit + 1 KB, each CTA 1 KB
    of it besides its own, as kernels._resident counts) beside `other` bytes (a converting build's staging buffers):
    A slots first (up to RA_MAX_A_SLOTS), then stages (up to RA_MAX_STAGES), never fewer than RA_A_SLOTS /
    WG_STAGES."""
    ctas = _wg_regs(spec)[0]
    share = smem_share(arch, ctas)
    budget = min(arch.max_smem_per_block, share) - 1024 - STATIC_SMEM_MARGIN - other  # (1024: the base aligned up)
    if slots:
        slots = max(slots, min(RA_MAX_A_SLOTS, (budget - WG_STAGES * stage_bytes) // a_slot_bytes))
    stages = max(WG_STAGES, min(RA_MAX_STAGES, (budget - slots * a_slot_bytes) // stage_bytes))
    return slots, stages


def _wait(b, bar, parity):
    """Spin on mbarrier.try_wait.parity until the phase with `parity` has completed."""
    top = b.label("wait")
    b.place(top)
    done = b.reg("pred")
    b.emit("mbarrier.try_wait.parity.shared::cta.b64", done, Mem(bar), parity)
    b.bra(top, pred=done, neg=True, uniform=False)  # each thread observes the phase on its own


def _desc(b, addr):
    """wgmma shared-memory descriptor of a K-major, 128B-swizzled tile at `addr` (1024-byte aligned):
    start address >> 4, leading byte offset 16 (unused by a swizzled K-major operand), stride byte offset
    1024 (eight 128-byte rows), swizzle mode 1 (128B) in bits 62-63 (ptxgen.layouts.wgmma_descriptor)."""
    base = layouts.wgmma_descriptor(0, 16, 1024, "128B")
    a = b.op("cvt.u64.u32", b.op("shr.u32", addr, Imm(4, "u32")))
    return b.op("or.b64", a, Imm(base, "b64"))


def _desc_steps(b, addr, n):
    """`_desc` of the tile at `addr` and of its n − 1 next 32-byte K slices (+2 each in the start address field),
    formed from 32-bit halves: the high word is a constant and the low word's address field does not carry (a
    shared address >> 4 < 2^14), so no 64-bit adds (ptxas had turned each into IADD3 + IMAD.X + moves)."""
    base = layouts.wgmma_descriptor(0, 16, 1024, "128B")
    lo = b.op("or.b32", b.op("shr.u32", addr, Imm(4, "u32")), Imm(base & 0xFFFFFFFF, "b32"))
    hi = b.op("mov.b32", Imm(base >> 32, "b32"))
    return [b.op("mov.b64", b.vec([lo if kk == 0 else b.op("add.u32", lo, Imm(2 * kk, "u32")), hi]), type="b64")
            for kk in range(n)]


ROW_GROUP_NOTE = ("row groups (Q6_K where K is not a multiple of 2048, its rows not 16-byte multiples): the weights "
                  "as M / G rows of G weight rows each (G · row bytes, a multiple of 16); a tile's box is G boxes of "
                  "128 / G group rows, box r holding weight rows m0 + r, m0 + r + G, .. at tile rows r·128 / G .., each "
                  "from (r·row bytes + the block's start) rounded down to 16, so consumer warp r reads its rows at "
                  "phase (r·row bytes) & 15 past the block's own; y row of tile row s: m0 + (s % (128 / G))·G + "
                  "s / (128 / G). M a multiple of G")
CX_STEPS = 4  # K-steps (64 columns each) per x_ready chunk of the converting build: one flag check per 4 steps
CX_ROWS = 8  # token rows per conversion unit (one warp's): 8 x 256 fp32 = 8 KB
CX_BUFS = 2  # a converter warp's cp.async staging buffers: the next unit's copies fly while this one converts
CX_THROTTLE = True  # groups past the second wait for the queue to reach the group before (spreads the traffic)
CX_NOTE = ("warps 1-3 of the producer warpgroup convert fp32 x to fp16 (round to nearest even) into x16 in "
           "layouts.q4k_rega_k_order, as convert_f16_perm does, in units of {rows} token rows x {cols} columns: "
           "converter warp w (3 per CTA) takes units w, w + 3·CTAs, ... in the order the GEMM's rounds need them: "
           "items run m-tile fastest, so one round of CTAs works on G = ceil(CTAs / M-tiles) token tiles; units go "
           "group of G tiles by group, within a group chunk kc ({steps} K-steps) by chunk, then tile, then 8-row "
           "group. A unit's fp32 rows "
           "come by cp.async into the warp's staging buffer while the previous unit converts (registers hold no "
           "data in flight: the producer warpgroup has 40 each); after a unit fence.proxy.async.global, "
           "bar.warp.sync and one red.release.gpu on x_ready[kc·tiles_n + tn]. The TMA thread waits (ld.acquire) "
           "until x_ready counts every 8-row group of the tile before its first x load of each chunk (and of each "
           "item); the last CTA out zeroes x_ready. An fp16 inf/NaN sets flag, as convert_f16 does. No conversion "
           "launch: it runs under the GEMM")


def _cx_row_bytes(steps: int) -> int:
    """A converter's staged fp32 row of `steps` 64-column K-steps, padded 32 bytes: rows 4h..4h+3 start 8 banks
    apart. Three converter warps stage CX_BUFS units of CX_ROWS such rows each."""
    return 64 * steps * 4 + 32


def _convert_x(b, tid, K, T, tiles_n, tiles_m, splits, Q, BN, X, X16, XR, F, stage, steps=CX_STEPS,
               natural: bool = False):
    """The converting build's warps 1-3 (CX_NOTE): fp32 x (T x K) → fp16 x16 in each 64-column chunk's
    layouts.q4k_rega_k_order (output group q of 8 values, one 16-byte store, holds inputs base(q) + the 8 offsets
    convert_f16_perm uses). A unit's 8 rows x 256·steps bytes arrive by 4·steps cp.async per lane into staging
    buffer i % 2 of the warp (at shared address `stage`) while unit i - 1 converts from the other; lane (r4, q) =
    (lane / 8, lane % 8) converts group q of rows r4 and 4 + r4 from shared memory. Rows past T copy row T - 1 and
    store nothing. K is a multiple of 256 (Q4_K), so a unit never passes K. `steps`: K-steps per unit and x_ready chunk
    (CX_STEPS, or 2 in the prepared build, whose 4-stage ring leaves room for half the staging buffers). `natural`
    (_natural_k's builds): x16 in x's own K order, group q holding columns 8q..8q + 7."""
    b.emit("griddepcontrol.wait")  # x may come from the kernel before this one (programmatic dependent launch)
    lane = b.op("and.b32", tid, Imm(31, "b32"))
    wl = b.op("sub.u32", b.op("shr.u32", tid, Imm(5, "u32")), Imm(1, "u32"))  # converter warp 0..2 of the CTA
    w = b.op("mad.lo.u32", b.special("ctaid.x"), Imm(3, "u32"), wl)
    nconv = b.op("mul.lo.u32", b.special("nctaid.x"), Imm(3, "u32"))
    r4 = b.op("shr.u32", lane, Imm(3, "u32"))
    q = b.op("and.b32", lane, Imm(7, "b32"))
    order = list(range(64)) if natural else list(layouts.q4k_rega_k_order())
    offs = [int(o - order[0]) for o in order[:8]]
    assert all([int(o - order[8 * j]) for o in order[8 * j:8 * j + 8]] == offs for j in range(8))
    if natural:  # base(q) = 8q
        base = b.op("shl.b32", q, Imm(3, "u32"))
    else:
        assert [int(order[8 * j]) for j in range(8)] == [(j & 1) + 4 * (j >> 1 & 1) + 32 * (j >> 2) for j in range(8)]
        base = b.op("add.u32", b.op("and.b32", q, Imm(1, "b32")),  # base(q) = (q & 1) + 4·(q >> 1 & 1) + 32·(q >> 2)
                    b.op("add.u32", b.op("shl.b32", b.op("and.b32", q, Imm(2, "b32")), Imm(1, "u32")),
                         b.op("shl.b32", b.op("shr.u32", q, Imm(2, "u32")), Imm(5, "u32"))))
    rg_n = BN // CX_ROWS
    assert steps in (2, 4) and CX_ROWS == 8 and CX_BUFS == 2
    row_bytes = _cx_row_bytes(steps)
    unit_bytes = CX_ROWS * row_bytes
    ksteps = b.op("shr.u32", K, Imm(6, "u32"))
    kchunks = b.op("shr.u32", b.op("add.u32", ksteps, Imm(steps - 1, "u32")), Imm(steps.bit_length() - 1, "u32"))
    # G = the token tiles one round of CTAs works on (items m fastest): ceil(CTAs / M-tiles), at most all of them
    G = b.op("min.u32", tiles_n, b.op("div.u32", b.op("add.u32", b.special("nctaid.x"),
                                                      b.op("sub.u32", tiles_m, Imm(1, "u32"))), tiles_m))
    groups = b.op("div.u32", b.op("add.u32", tiles_n, b.op("sub.u32", G, Imm(1, "u32"))), G)
    units = b.op("mul.lo.u32", b.op("mul.lo.u32", b.op("mul.lo.u32", groups, G), kchunks), Imm(rg_n, "u32"))
    tlast = b.op("sub.u32", T, Imm(1, "u32"))
    bad = b.op("mov.u32", Imm(0, "u32"))
    mine = b.op("mad.lo.u32", wl, Imm(CX_BUFS * unit_bytes, "u32"), stage)
    cur = b.op("mov.u32", mine)  # staging buffer of the unit being converted; the other takes the next one's copies
    nxt_buf = b.op("add.u32", mine, Imm(unit_bytes, "u32"))
    copy_off = b.op("shl.b32", lane, Imm(4, "u32"))  # lane l copies 16-byte chunks l (and 32 + l at 4 steps) of a row

    def coords(u):
        """(row0, col0, the x_ready counter's index) of unit u (u < units): u = ((g·kchunks + kc)·G + tn % G)·rg_n
        + rg, tn = g·G + tn % G — group by group of G token tiles, chunk kc of the group's tiles before kc + 1. A
        unit of a tile past the last (the last group may be short) has row0 ≥ T: skipped like rows past T."""
        rest = b.op("shr.u32", u, Imm(rg_n.bit_length() - 1, "u32"))
        tl = b.op("rem.u32", rest, G)
        rest = b.op("div.u32", rest, G)
        kc = b.op("rem.u32", rest, kchunks)
        grp = b.op("div.u32", rest, kchunks)
        tn = b.op("mad.lo.u32", grp, G, tl)
        row0 = b.op("mad.lo.u32", tn, Imm(BN, "u32"), b.op("shl.b32", b.op("and.b32", u, Imm(rg_n - 1, "b32")),
                                                              Imm(CX_ROWS.bit_length() - 1, "u32")))
        col0 = b.op("shl.b32", kc, Imm(6 + steps.bit_length() - 1, "u32"))
        return row0, col0, b.op("mad.lo.u32", kc, tiles_n, tn), grp

    def issue(u, buf):
        """cp.async of unit u's rows into `buf` (none past the last unit or T), then one commit group either way."""
        skip = b.label("cx_no_copy")
        b.bra(skip, pred=b.op("setp.ge.u32", u, units))
        row0, col0, _, _ = coords(u)
        b.bra(skip, pred=b.op("setp.ge.u32", row0, T))
        for r in range(CX_ROWS):
            row = b.op("min.u32", b.op("add.u32", row0, Imm(r, "u32")), tlast)
            src = b.op("mad.wide.u32", b.op("add.u32", b.op("mad.lo.u32", row, K, col0),
                                            b.op("shl.b32", lane, Imm(2, "u32"))), Imm(4, "u32"), X)
            dst = b.op("add.u32", buf, copy_off)
            for j in range(steps // 2):
                b.emit("cp.async.cg.shared.global", Mem(dst, r * row_bytes + 512 * j), Mem(src, 512 * j),
                       Imm(16, "u32"))
        b.place(skip)
        b.emit("cp.async.commit_group")

    u = b.op("mov.u32", w)
    issue(u, cur)
    top, nxt, done = b.label("cx_unit"), b.label("cx_next"), b.label("cx_done")
    b.place(top)
    b.bra(done, pred=b.op("setp.ge.u32", u, units))
    b.emit("bar.warp.sync", Imm(0xFFFFFFFF, "b32"))  # every lane is done reading nxt_buf (its unit converted)
    un = b.op("add.u32", u, nconv)
    issue(un, nxt_buf)
    b.emit("cp.async.wait_group", Imm(1, "u32"))  # this lane's copies of unit u have landed
    b.emit("bar.warp.sync", Imm(0xFFFFFFFF, "b32"))  # ... and every other lane's
    row0, col0, ix, grp = coords(u)
    b.bra(nxt, pred=b.op("setp.ge.u32", row0, T))  # a group past T: nothing to convert, not counted
    if CX_THROTTLE:
        _cx_throttle(b, Q, grp, G, splits, tiles_m)
    for half in range(CX_ROWS // 4):
        row = b.op("add.u32", row0, b.op("add.u32", r4, Imm(4 * half, "u32")))
        row_ok = b.op("setp.le.u32", row, tlast)
        lds = b.op("add.u32", b.op("mad.lo.u32", b.op("add.u32", r4, Imm(4 * half, "u32")), Imm(row_bytes, "u32"), cur),
                   b.op("shl.b32", base, Imm(2, "u32")))
        dst = b.op("mad.wide.u32", b.op("add.u32", b.op("mul.lo.u32", row, K),
                                        b.op("mad.lo.u32", q, Imm(8, "u32"), col0)), Imm(2, "u32"), X16)
        for e in range(steps):  # the unit row's 64-column segments
            v = b.regs("f32", 8)
            for i, off in enumerate(offs):
                b.emit("ld.shared.f32", v[i], Mem(lds, 4 * (64 * e + off)))
            h = [b.op("cvt.rn.f16x2.f32", v[2 * j + 1], v[2 * j], type="b32") for j in range(4)]
            b.emit("st.global.v4.b32", Mem(dst, 2 * 64 * e), b.vec(h), pred=row_ok)
            over = conversion_flag(b, v)  # not finite in fp16, or a token too small for it (convert_f16.TINY_ROW)
            b.emit("or.b32", bad, bad, b.op("selp.b32", Imm(1, "b32"), Imm(0, "b32"), b.op("and.pred", over, row_ok)))
    b.emit("fence.proxy.async.global")  # these generic stores, before another CTA's TMA reads them
    b.emit("bar.warp.sync", Imm(0xFFFFFFFF, "b32"))
    b.emit("red.release.gpu.global.add.u32", Mem(b.op("mad.wide.u32", ix, Imm(4, "u32"), XR)), Imm(1, "u32"),
           pred=b.op("setp.eq.u32", lane, Imm(0, "u32")))
    b.place(nxt)
    b.emit("mov.u32", u, un)
    t_ = b.op("mov.u32", cur)
    b.emit("mov.u32", cur, nxt_buf)
    b.emit("mov.u32", nxt_buf, t_)
    b.bra(top)
    b.place(done)
    b.emit("cp.async.wait_group", Imm(0, "u32"))
    b.emit("st.global.u32", Mem(F), Imm(1, "u32"), pred=b.op("setp.ne.u32", bad, Imm(0, "u32")))


def _cx_throttle(b, Q, grp, G, splits, tiles_m):
    """A converter warp's wait before a unit of token-tile group `grp`: group g ≥ 2 once the queue reaches group
    g - 1's first item (one round ahead of its use), nanosleeping between polls."""
    go = b.label("cx_go")
    b.bra(go, pred=b.op("setp.lt.u32", grp, Imm(2, "u32")))
    thr = b.op("mul.lo.u32", b.op("mul.lo.u32", b.op("sub.u32", grp, Imm(1, "u32")), G),
               b.op("mul.lo.u32", splits, tiles_m))
    spin = b.label("cx_throttle")
    b.place(spin)
    early = b.op("setp.lt.u32", b.op("ld.relaxed.gpu.global.u32", Mem(Q)), thr)
    b.emit("nanosleep.u32", Imm(256, "u32"), pred=early)
    b.bra(spin, pred=early)
    b.place(go)

class _WgRing(NamedTuple):
    """The wgmma MMQ's shared memory at run time (its base aligned up to 1024 bytes): S ring stages of a B tile
    (bst + stage·b_bytes) and of raw A columns or prepared fragments (raw0 + stage·raw_bytes), the consumers' A
    tiles at a_base, the mbarriers at bar0 (full[S], empty[S], item_full[2], item_empty[2]), the item slots at
    slot0. The barrier methods emit the address of one barrier."""
    b: KernelBuilder
    S: int
    b_bytes: int
    raw_bytes: int
    stage_bytes: int
    bst: Reg
    a_base: Reg
    raw0: Reg
    bar0: Reg
    slot0: Reg
    a_slots: int = 0  # a codec whose box serves RA_BOX_STEPS K-steps (Q6_K): its boxes in a ring of their own
    a_slot_bytes: int = 0  # ... of a_slots slots at raw0 (the stages hold B alone),
    a_count: Reg | None = None  # ... and the boxes issued (producer) / released (consumers) so far,
    a_mask: int = 0  # ... a box serving K-steps s with the same s & ~a_mask (_box_step_mask: both roles read it here)
    sums0: Reg | None = None  # IntA (int_weights): S slots of a block's Σx tile (s_bytes each), filled with the
    s_bytes: int = 0  # ... stage of the block's last K-step
    bs: int = 1  # K-steps a ring stage holds (IntA's block stages: 4, one full / empty barrier a block)
    consumers: int = 256  # consumer threads (each arrives on empty, item_empty and a_empty): 2 per row of the M tile

    def sums(self, st):
        """Ring stage st's Σx slot (IntA)."""
        return self.b.op("mad.lo.u32", st, Imm(self.s_bytes, "u32"), self.sums0)

    def a_slot(self, sl):
        """A slot sl's address."""
        return self.b.op("mad.lo.u32", sl, Imm(self.a_slot_bytes, "u32"), self.raw0)

    def a_full(self, sl):
        """A slot sl's box has landed (after item_empty: bars 2S + 4 ..)."""
        return self.b.op("mad.lo.u32", sl, Imm(8, "u32"), self.b.op("add.u32", self.bar0, Imm(16 * self.S + 32, "u32")))

    def a_empty(self, sl):
        """A slot sl is read by every consumer thread."""
        return self.b.op("mad.lo.u32", sl, Imm(8, "u32"),
                         self.b.op("add.u32", self.bar0, Imm(16 * self.S + 32 + 8 * self.a_slots, "u32")))

    def full(self, st):
        """Ring stage st's TMA bytes have landed."""
        return self.b.op("mad.lo.u32", st, Imm(8, "u32"), self.bar0)

    def empty(self, st):
        """Ring stage st is released by every consumer (of every CTA of the cluster)."""
        return self.b.op("mad.lo.u32", st, Imm(8, "u32"), self.b.op("add.u32", self.bar0, Imm(8 * self.S, "u32")))

    def item_full(self, sl):
        """Item slot sl holds the producer's next item."""
        return self.b.op("mad.lo.u32", sl, Imm(8, "u32"), self.b.op("add.u32", self.bar0, Imm(16 * self.S, "u32")))

    def item_empty(self, sl):
        """Every consumer thread has read item slot sl."""
        return self.b.op("mad.lo.u32", sl, Imm(8, "u32"),
                         self.b.op("add.u32", self.bar0, Imm(16 * self.S + 16, "u32")))


class _WgWork(NamedTuple):
    """The wgmma MMQ's problem and work items, loaded once for both roles: y, the queue, the split-K partials and
    counters, the sizes, the item count and K-steps, and the cluster rank (rank and peer_ranks: clusters only)."""
    Y0: Reg
    Q: Reg
    P: Reg
    C: Reg
    M: Reg
    K: Reg
    T: Reg
    per: Reg
    tiles_n: Reg
    splits: Reg
    tiles_m: Reg
    items: Reg
    ksteps: Reg
    rank: Reg | None
    peer_ranks: list
    groups: "_WgGroups | None" = None
    stream: bool = False  # stream-K (MmqSpec.stream): per = L, the K-steps a CTA takes; items unbounded


class _WgGroups(NamedTuple):
    """The grouped (MoE) build's grouping, moe_group's output: order (pair at each place), offsets (an expert's
    first place) and the work list (entry count, then expert | token tile << TILE_SHIFT)."""
    ORD: Reg
    OFF: Reg
    WRK: Reg


class _WgItem(NamedTuple):
    """One decoded work item: M tile, split, token tile, its K-steps [s_begin, s_end) and first row and token; the
    grouped build's also its weights' first row in tmap_w (expert·M + m0) and the expert's last place."""
    tm: Reg
    z: Reg
    tn: Reg
    s_begin: Reg
    s_end: Reg
    m0: Reg
    n0: Reg
    w_row: Reg | None = None
    tlast: Reg | None = None
    tile: Reg | None = None  # stream-K: the tile (M tile · token tiles + token tile), its pieces (K ranges of
    pieces: Reg | None = None  # different CTAs: split-K where > 1), whether the segment exists, and the partial
    valid: Reg | None = None  # plane of piece z of the tile (a register in, a register out)
    plane: object = None


def build_wgmma(arch, spec: "MmqSpec"):
    """The sm_90a lowering: a persistent, warp-specialized CTA of three warpgroups. Warpgroup 0 (_wgmma_producer)
    claims work items and TMAs each K-step's raw weight columns (or prepared A fragments) and activation tile into
    a WG_STAGES mbarrier ring; warpgroups 1 and 2 (_wgmma_consumer) dequantize 64 rows each, into swizzled A tiles
    or straight into wgmma's A registers, issue wgmma and run the epilogue (split-K included)."""
    tile, pipe, mma, sched, epilogue = describe(arch, spec)
    BN = spec.bn
    PRE = spec.prepared
    if spec.bm != BM and not (spec.bm == 2 * BM and spec.grouped and spec.a_regs and not spec.int_weights
                              and spec.fmt == "q4_K" and spec.bn <= PAIRED_MAX_BN):
        raise ValueError(f"{spec.name}: a {spec.bm}-row M tile is the grouped register-A Q4_K builds' (up to n"
                         f"{PAIRED_MAX_BN})")
    if spec.row_group > 1 and (spec.row_group != ROW_GROUP or spec.fmt not in ROW_GROUP_FORMATS or not spec.a_regs
                               or PRE or spec.int_weights or spec.convert or spec.stream or spec.cluster > 1
                               or spec.bm != BM or _ra_box_bytes(spec) > 256):
        raise ValueError(f"{spec.name}: row groups (ROW_GROUP_NOTE) are built for the register-A GEMMs of "
                         f"{', '.join(ROW_GROUP_FORMATS)} in groups of {ROW_GROUP}, on their byte boxes, without a "
                         f"converting, stream-K, cluster-multicast or prepared schedule")
    if PRE and (spec.cluster > 1 or spec.grouped or spec.stream or spec.csplit):
        raise ValueError(f"{spec.name}: the prepared builds are dense, one CTA per cluster")
    if spec.stream and (not spec.a_regs or spec.grouped or spec.convert or spec.cluster > 1 or spec.int_weights):
        raise ValueError(f"{spec.name}: stream-K is the dense register-A build's on x converted first, one CTA a "
                         "cluster")
    if spec.csplit and (not spec.a_regs or spec.grouped or spec.convert or spec.prepared or spec.stream
                        or spec.cluster > 1 or spec.int_weights or spec.bm != BM):
        raise ValueError(f"{spec.name}: cluster split-K is the dense register-A build's on fp16 x, {BM}-row tiles")
    b_bytes = BN * 128  # BN tokens x 64 fp16, 128B-swizzled by TMA
    if not getattr(codecs.get(spec.fmt), "WGMMA_ALL", False) and (not spec.a_regs or PRE or spec.cluster > 1
                               or (spec.convert and spec.fmt not in WGMMA_CX_CODECS)):
        every = [f for f, c in codecs.CODECS.items() if getattr(c, "WGMMA_ALL", False)]
        raise ValueError(f"{spec.name}: {spec.fmt} has the plain and grouped register-A wgmma builds only (and the "
                         f"converting one for {', '.join(WGMMA_CX_CODECS)}); every wgmma lowering: {', '.join(every)}")
    # per stage: the step's A fragments, or the codec's raw bytes of the step (_wg_weights); a codec whose box serves
    # several K-steps (RA_BOX_STEPS: Q6_K) keeps its boxes in RA_A_SLOTS slots of their own, the stages B alone
    SA = RA_A_SLOTS if _block_box(spec) else 0
    IW = spec.int_weights
    ML = min_lo_sums(spec)  # RA_MIN_LO_MMA: the block's Σx tile for the −m_lo MMA, as IntA's
    s_bytes = BN * 32 if IW or ML else 0  # the Σx tile a stage: BN rows x (8 hi + 8 lo) halves
    a_slot_bytes = _wg_weights(spec).raw_bytes if SA else 0
    raw_bytes = RA_FRAG_BYTES if PRE else 0 if SA else _wg_weights(spec).raw_bytes
    BSTEPS = 4 if IW or (spec.grouped and SA and spec.fmt in NIBBLE_PARTS and RA_BLOCK_STAGES
                                               and spec.bn <= PAIRED_MAX_BN
                   ) else 1  # K-steps a stage: block stages (the grouped nibble builds': items are whole blocks)
    if BSTEPS == 4 and not IW and spec.bn >= HALF_BLOCK_MIN_BN and spec.bm == BM:  # (one 256-row CTA: whole blocks)
        BSTEPS = 2
    stage_bytes = BSTEPS * b_bytes + raw_bytes
    XS = PREPARED_CX_STEPS if PRE else CX_STEPS  # K-steps per conversion unit (4 x 48 KB of ring + 2-step units fit)
    cx_bytes = 3 * CX_BUFS * CX_ROWS * _cx_row_bytes(XS) if spec.convert else 0  # the converters' staging buffers
    fixed = SA * a_slot_bytes + cx_bytes  # what shares shared memory with the stages
    if WG_STAGES * stage_bytes + fixed + 1024 > arch.max_smem_per_block and spec.fmt in RA_CODECS + WGMMA_CX_CODECS:
        pipe = Pipeline((arch.max_smem_per_block - 1024 - fixed) // stage_bytes, copy=pipe.copy)  # fewer stages
    elif (IW and IW_DEEP) or (spec.fmt in RA_DEEP_FORMATS and spec.bn <= RA_DEEP_MAX_BN and spec.a_regs and not (
            PRE or spec.cluster > 1 or (spec.grouped and not RA_DEEP_GROUPED))):
        SA, S_deep = _deep_ring(arch, spec, stage_bytes + s_bytes, a_slot_bytes, SA, cx_bytes)
        fixed = SA * a_slot_bytes + cx_bytes
        pipe = Pipeline(S_deep, copy=pipe.copy)
    elif BSTEPS > 1:  # block stages: as many as the CTA's share holds (n64 at 2 CTAs an SM: 2), at most WG_STAGES
        budget = min(arch.max_smem_per_block, smem_share(arch, _wg_regs(spec)[0])) - 1024 - STATIC_SMEM_MARGIN
        pipe = Pipeline(max(2, min(WG_STAGES, (budget - fixed) // stage_bytes)), copy=pipe.copy)
    pipe.check_smem(arch, stage_bytes + -(-fixed // pipe.stages))  # (what sits beside them spread over the stages)
    S = pipe.stages
    if spec.csplit and S * BSTEPS * b_bytes < BM * BN * 4:
        raise ValueError(f"{spec.name}: the B stages ({S} x {b_bytes} bytes) must hold the fp32 partial tile")
    b = KernelBuilder(spec.name, arch, f"{spec.fmt[0].upper() + spec.fmt[1:]} x fp16 GEMM, wgmma m64n{BN}k16"
                      f"{' (A from registers)' if spec.a_regs else ''}, tile {spec.bm}x{BN}x{BK}, {S}-stage TMA ring, "
                      "warp-specialized, persistent", block=(_wg_threads(spec), 1, 1))
    tw_p = b.param("tmap_w", "b8", "tensormap", array=128, align=64)  # u8 [M][row bytes], box 16 x 128
    tx_p = b.param("tmap_x", "b8", "tensormap", array=128, align=64)  # f16 [T][K], box 64 x BN, 128B swizzle
    if IW and not (spec.grouped and spec.a_regs and spec.fmt == "q4_K" and _block_box(spec)):
        raise ValueError(f"{spec.name}: integer weights are the grouped register-A Q4_K build's (with block boxes)")
    ts_p = b.param("tmap_s", "b8", "tensormap", array=128, align=64) if IW or ML else None  # f16 Σx [pairs][K/16]
    y_p = b.param("y", "u64", "ptr:out")
    G = spec.grouped
    if G:  # mul_mat_id: the sizes, moe_group's grouping and the queue (no split-K: no partials or counters)
        if not spec.a_regs or spec.convert or spec.prepared or spec.cluster > 1:
            raise ValueError(f"{spec.name}: the grouped wgmma build is register-A, x gathered before it")
        m_p, k_p = b.param("m", "u32"), b.param("k", "u32")
        grp_p = [b.param(n, "u64", "ptr:scratch") for n in ("order", "offsets", "work")]
        c_p = b.param("queue", "u64", "ptr:scratch")
    else:
        m_p, k_p, t_p, s_p, c_p, tn_p, sp_p, pt_p, ct_p = _mmq_params(b)
    ra, CX = spec.a_regs, spec.convert
    cx_p = None
    if CX:  # fp32 x in; the fp16 copy tmap_x describes is written inside the launch (see _convert_x)
        if not (ra or PRE) or spec.cluster > 1:
            raise ValueError(f"{spec.name}: the converting build is register-A or prepared, one CTA per cluster")
        cx_p = (b.param("x", "u64", "ptr:in"), b.param("x16", "u64", "ptr:out"),
                b.param("x_ready", "u64", "ptr:scratch"), b.param("flag", "u64", "ptr:out"))
    a_bytes = 0 if ra or PRE else 2 * 2 * A_TILE  # the dequantized A tiles (none when A lives in registers or
    # comes by TMA into the stage: F16A_NOTE)
    smem = b.dynamic_shared(S * stage_bytes + SA * a_slot_bytes + a_bytes + cx_bytes + S * s_bytes + 1024)  # + 1024:
    # the base aligned up
    # full[S], empty[S], item_full[2], item_empty[2] (, a_full[SA], a_empty[SA])
    bars = b.shared_buffer("bars", 8 * (2 * S + 4 + 2 * SA), align=8)
    slots = b.shared_buffer("item_slots", 8, align=8)
    fix_slot = b.shared_buffer("fixup_slot", 8, align=8)  # the split-K fixup's counter broadcast (bytes 4..7)
    _wgmma_meta(b, arch, spec, sched, S, XS)
    if IW or ML:
        b.meta.update(activations=b.meta["activations"].replace(
            "by moe_gather", "by moe_gather_sums (with each row's sub-block sums Σx)"),
            tensormaps=b.meta["tensormaps"] + f"; tmap_s: f16, dims (K / 16, pairs) over the Σx rows, box (8, {BN}), "
            "no swizzle")
        if IW:
            b.meta.update(int_weights=IW_NOTE)
        else:
            b.meta.update(min_lo_sums=MIN_LO_NOTE)

    CL = spec.cluster
    Y0, Q = b.ptr(y_p), b.ptr(c_p)
    if G:
        _grouped_l2_prefetch(b, spec, tw_p, m_p, k_p)
        w = _grouped_work(b, Y0, Q, m_p, k_p, grp_p, spec.bm)
    else:
        P, C = b.ptr(pt_p), b.ptr(ct_p)
        M, K, T, per, tiles_n, splits = _ld_sizes(b, m_p, k_p, t_p, s_p, tn_p, sp_p)
    tid = b.special("tid.x")
    if not G:
        tiles_m = _tiles_m(b, M)
        groups_m = tiles_m if CL == 1 else b.op("div.u32", b.op("add.u32", tiles_m, Imm(CL - 1, "u32")),
                                                Imm(CL, "u32"))
        items = b.op("mul.lo.u32", b.op("mul.lo.u32", groups_m, splits), tiles_n)
        if spec.csplit:  # an item is a tile: its splits are the cluster's CTAs (rank = z)
            items = b.op("mul.lo.u32", groups_m, tiles_n)
        if spec.stream:  # (the producer hands on an item past every chunk's segments as 0xFFFFFFFF)
            items = b.op("mov.u32", Imm(0xFFFFFFFF, "u32"))
        ksteps = b.op("shr.u32", K, Imm(6, "u32"))
        rank = b.special("cluster_ctarank") if _static_clusters(spec) else None
        # a ring stage is released in every CTA of the cluster: the peers' producers multicast into this one's too
        peer_ranks = [b.op("xor.b32", rank, Imm(1, "b32"))] if CL == 2 else []
        w = _WgWork(Y0, Q, P, C, M, K, T, per, tiles_n, splits, tiles_m, items, ksteps, rank, peer_ranks,
                    stream=spec.stream)
    base = b.op("and.b32", b.op("add.u32", b.op("mov.u32", smem), Imm(1023, "u32")), Imm(~1023 & 0xFFFFFFFF, "b32"))
    bst = base  # B stages: S x b_bytes, each 1024-aligned
    a_base = b.op("add.u32", base, Imm(S * BSTEPS * b_bytes, "u32"))  # A: [consumer][buffer] x A_TILE
    raw0 = b.op("add.u32", a_base, Imm(a_bytes, "u32"))  # raw: S x 3 x RAW_PART
    lay = _WgRing(b, S, b_bytes, raw_bytes, stage_bytes, bst, a_base, raw0, b.op("mov.u32", bars),
                  b.op("mov.u32", slots), SA, a_slot_bytes, b.op("mov.u32", Imm(0, "u32")) if SA else None,
                  _box_step_mask(spec) if SA else 0,
                  b.op("add.u32", raw0, Imm(S * raw_bytes + SA * a_slot_bytes, "u32")) if IW or ML else None, s_bytes,
                  BSTEPS, 2 * spec.bm)
    if G and BSTEPS > 1 and _b3d():  # (_block_stage_tma: a stage's B tiles, and Σx tiles, as one 3-D box each)
        assert stage_bytes == BSTEPS * b_bytes, (stage_bytes, b_bytes)
        b.meta.update(x_box_chunks=BSTEPS, tensormaps=b.meta["tensormaps"].replace(
            f"tmap_x: f16, dims (K, pairs) over the gathered x16, box (64, {BN}), 128B swizzle",
            f"tmap_x: f16, dims (64, pairs, K / 64) over the gathered x16 (its 64-column chunks), box (64, {BN}, "
            f"{BSTEPS}), 128B swizzle").replace(
            f"tmap_s: f16, dims (K / 16, pairs) over the Σx rows, box (8, {BN}), no swizzle",
            f"tmap_s: f16, dims (8, pairs, K / 128) over the Σx rows, box (8, {BN}, 2), no swizzle"))
        if IW or ML:
            b.meta.update(s_box_chunks=2)
    if SA:
        b.meta.update(a_ring=f"{SA} slots of {a_slot_bytes} bytes after the B stages: block j's box (one TMA), "
                             f"read by its K-steps 4j .. 4j + 3 (the item's first and last may be mid-block)")

    leader = _wgmma_init_barriers(b, CL, lay, tid)
    CS = spec.csplit
    cl_exit = b.label("cluster_exit") if _static_clusters(spec) else None  # everyone meets here before leaving (peers
    # use our smem); the cluster split's consumers meet the producers there twice: partials stored, partials read
    consumer = b.label("consumer")
    b.bra(consumer, pred=b.op("setp.ge.u32", tid, Imm(128, "u32")))
    _wgmma_producer(b, spec, lay, w, tid, leader, tw_p, tx_p, cx_p, XS, cl_exit, ts_p)
    b.place(consumer)
    _wgmma_consumer(b, arch, spec, lay, w, tid, epilogue, fix_slot)
    if _static_clusters(spec):
        b.place(cl_exit)  # reached on diverged paths (the producer's thread 0 comes later than its warp): not .aligned
        for _ in range(2 if CS else 1):  # (CS: the consumers' two phases, _csplit_reduce)
            b.emit("barrier.cluster.arrive.release")
            b.emit("barrier.cluster.wait.acquire")
    b.emit("ret")
    return b.finish()


def _static_clusters(spec: MmqSpec) -> bool:
    """Whether the build's CTAs run in thread-block clusters that walk a static item schedule (no queue) and meet
    before leaving: the multicast builds (cluster > 1) and the cluster split-K builds (csplit)."""
    return spec.cluster > 1 or spec.csplit


def _wgmma_meta(b, arch, spec: MmqSpec, sched, S, XS):
    """The wgmma MMQ's launch bounds and metadata (the cluster, converting and prepared variants' on top); checks
    the cluster size."""
    BN, ra, CX, PRE = spec.bn, spec.a_regs, spec.convert, spec.prepared
    # launch bounds (384 threads, 1 CTA an SM, 2 for _wg_regs' paired builds) cap registers at entry, which
    # setmaxnreg needs to take effect
    ctas = _wg_regs(spec)[0]
    _check_reg_pool(spec)
    b.directives += [f".maxntid {_wg_threads(spec)}, 1, 1", f".minnctapersm {ctas}"]
    b.meta.update(bm=spec.bm, bn=BN, bk=BK, stages=S, warps=_wg_threads(spec) // 32,
                  copy="tma (cp.async.bulk.tensor.2d)",
                  mma=(f"wgmma m64n{BN}k16 f16 (A from registers, B from 128B-swizzled shared memory)" if ra else
                       f"wgmma m64n{BN}k16 f16 (A and B from 128B-swizzled shared memory)"), schedule=sched.kind,
                  dynamic_smem=b.dynamic_smem, pdl=True,
                  activations=("fp16 in the K order of layouts.q4k_rega_k_order, by convert_f16_perm before the GEMM"
                               if ra else "fp16, converted by convert_f16 before the GEMM"),
                  roles="warpgroup 0: producer (thread 0 claims work items and issues TMA); warpgroups 1, 2: " +
                        ("dequantize 64 rows each into wgmma's A registers and issue wgmma" if ra else
                         "dequantize 64 rows each into swizzled fp16 tiles and issue wgmma"),
                  grid="persistent: min(items, resident CTAs per SM (occupancy calculator) x SMs) CTAs",
                  ctas_per_sm=2 if BN <= 32 else 1,  # n32: 72 registers and 74 KB, so two CTAs fit an SM
                  work_queue="item = atom.add(queue[0], 1) -> (m tile, split z, token tile n), n fastest; the "
                             "producer hands items to the consumers through a 2-slot mbarrier ring; the last "
                             "CTA to finish resets the queue",
                  split_k="split z takes K-steps [z·steps_per_split, ...); each CTA stores its partial tile in "
                          "fragment order (part: splits x tiles x 128·BN floats) and counts in at the tile's counter; "
                          "the last sums the partials in z order into y and resets the counter (the 256 consumer "
                          "threads, named barrier 3); with two splits the second to count in stores nothing: it waits "
                          "for the first's ready bit (counter + 4) and adds that partial into its accumulators. No "
                          "reduction launch, counters required",
                  tensormaps="tmap_w: u8, dims (row bytes, M), box (16, 128), no swizzle; tmap_x: f16, dims "
                             f"(K, T), box (64, {BN}), 128B swizzle")

    if ra or PRE:
        b.meta["x_order"] = "natural" if _natural_k(spec) else "rega"
        if _natural_k(spec):
            b.meta["activations"] = ("fp16 in its natural K order: the caller's fp16 x by tensor map, or an fp32 x "
                                     "by convert_f16, before the GEMM")
    if spec.stream:
        b.meta.update(stream=STREAM_NOTE, grid="ceil(U / L) CTAs, U = tiles x K/64, L = steps_per_split (at most the "
                      "resident CTAs)", work_queue="static (stream-K): the queue counts CTAs out only; splits unused")
    if spec.csplit:
        arch.require("clusters", f"{spec.name} (thread-block clusters)")
        b.meta.update(cluster_split=CSPLIT_NOTE, grid="tiles x splits CTAs in clusters of splits (2, 4 or 8; dividing "
                      f"{spec.bn // 8} fragments), one tile a cluster: at most the resident clusters",
                      work_queue="static (cluster split-K): cluster c takes tile c; the queue and counters unused")
    CL = spec.cluster
    if CL not in (1, 2):
        raise ValueError(f"{spec.name}: clusters of 1 or 2 CTAs, not {CL}")
    if CL > 1:
        arch.require("clusters", f"{spec.name} (thread-block clusters)")
        b.meta.update(cluster=(CL, 1, 1),
                      tensormaps=b.meta["tensormaps"].replace(f"box (64, {BN})", f"box (64, {BN // CL})"),
                      work_queue=f"static: cluster c takes items c, c + clusters, ... (no atomic queue; the queue "
                                 f"parameter is unused); an item is {CL} M-tiles (rank r: m tile {CL}·i + r) x a split "
                                 "x a token tile, n fastest",
                      multicast=f"each rank loads 1/{CL} of the step's activation tile and multicasts it to the "
                                f"cluster; a ring stage is free once the consumers of all {CL} CTAs released it "
                                f"(empty barriers count 256 local arrivals, one per consumer thread, and "
                                f"{CONSUMER_WARPS} per peer, one per consumer warp of each peer)")
    if CX:
        b.meta.update(activations=("fp32, converted to fp16 in its natural K order inside the launch" if _natural_k(spec)
                                   else "fp32, converted to fp16 in the K order of layouts.q4k_rega_k_order inside "
                                        "the launch"),
                      convert=CX_NOTE.format(bn=BN, rows=CX_ROWS, steps=XS, cols=64 * XS), pdl=False,
                      convert_steps=XS, convert_rows=CX_ROWS,
                      work_queue=b.meta["work_queue"].replace("(m tile, split z, token tile n), n fastest",
                                                              "(token tile n, split z, m tile), m fastest"),
                      roles=b.meta["roles"].replace("warpgroup 0: producer (thread 0 claims work items and issues TMA)",
                                                    "warpgroup 0: producer (thread 0 claims work items and issues TMA; "
                                                    "warps 1-3 convert x)"))
    if PRE and not ra:
        b.meta.update(prepared=F16A_NOTE, f16a=True, stages=S, pdl=True,
                      roles=b.meta["roles"].replace("dequantize 64 rows each into swizzled fp16 tiles and issue wgmma",
                                                    "issue wgmma on 64 rows each of the TMA-loaded fp16 A tile"),
                      tensormaps=b.meta["tensormaps"].replace(
                          "tmap_w: u8, dims (row bytes, M), box (16, 128), no swizzle",
                          "tmap_w: f16, dims (K, M) over dequantize_<fmt>'s fp16 rows, box (64, 128), 128B swizzle"))
    elif PRE:
        b.meta.update(prepared=PREPARED_NOTE, stages=S, pdl=True,
                      mma=f"wgmma m64n{BN}k16 f16 (A from registers, loaded from the prepared fragments; B from "
                          "128B-swizzled shared memory)",
                      roles=b.meta["roles"].replace("dequantize 64 rows each into wgmma's A registers",
                                                    "load 64 rows each of prepared A fragments into registers"),
                      tensormaps=b.meta["tensormaps"].replace(
                          "tmap_w: u8, dims (row bytes, M), box (16, 128), no swizzle",
                          "tmap_w: u8, dims (256, ceil(M / 128)·(K / 64)·64) over dequantize_q4_k_frags' output, box "
                          "(256, 64), no swizzle"))
    w_map = "tmap_w: u8, dims (row bytes, M), box (16, 128), no swizzle"  # Q4_K's 16-byte columns
    codec = codecs.get(spec.fmt)
    every = getattr(codec, "WGMMA_ALL", False)
    if hasattr(codec, "RA_MAP_NOTE"):  # another nibble codec's columns (Q5_K)
        w_map = w_map.replace("box (16, 128)", f"box (16, 128): {codec.RA_MAP_NOTE}")
        b.meta.update(fmt=spec.fmt, tma_box=(16, BM))
    elif not every:
        c = _ra_codec(spec)
        wide = _ra_box_bytes(spec) > 256  # (a box dimension is at most 256 elements: such a box counts u32 words)
        unit, es = ("u32", 4) if wide else ("u8", 1)
        note = getattr(c, "RA_BLOCK_BOX_NOTE", c.RA_BOX_NOTE) if _block_box(spec) else c.RA_BOX_NOTE
        G = spec.row_group
        w_map = (f"tmap_w: {unit}, dims (row {'words' if wide else 'bytes'}, M), box ({_ra_box_bytes(spec) // es}, "
                 f"128), no swizzle ({note})") if G == 1 else (
            f"tmap_w: {unit}, dims ({G} rows' bytes, M / {G}), box ({_ra_box_bytes(spec) // es}, {BM // G}), no "
            f"swizzle ({note}; {ROW_GROUP_NOTE})")
        b.meta.update(fmt=spec.fmt, tma_box=(_ra_box_bytes(spec) // es, BM // G), **({"tma_dtype": "u32"} if wide else {}),
                      **({"row_group": G} if G > 1 else {}),
                      roles=b.meta["roles"].replace("dequantize 64 rows each", f"decode 64 rows each ({spec.fmt})"))
    if spec.fmt in NIBBLE_PARTS and _block_box(spec):  # one box of a block's rows (_tma_block_row)
        pitch = codec.ROW_BOX_PITCH
        pad = pitch - codec.BLOCK_BYTES
        w_map = (f"tmap_w: u8, dims (row bytes, M), box ({pitch}, {spec.bm}), no swizzle (a block's rows"
                 + (f" and the next block's first {pad} bytes)" if pad else ")"))
        b.meta.update(fmt=spec.fmt, tma_box=(pitch, spec.bm))
        if every and not spec.grouped:
            b.meta.update(tensormaps=b.meta["tensormaps"].replace(
                "tmap_w: u8, dims (row bytes, M), box (16, 128), no swizzle", w_map))
    if not every and not spec.grouped:
        b.meta.update(tensormaps=f"{w_map}; tmap_x: f16, dims (K, T), box (64, {BN}), 128B swizzle")
    if spec.grouped:
        b.meta.update(schedule="grouped", split_k="none", fmt=spec.fmt, ctas_per_sm=ctas, tail_split=False,
                      activations="fp16 in grouped order (row n = the pair at place n of moe_group's order) and the "
                                  "K order of layouts.q4k_rega_k_order, by moe_gather before the GEMM",
                      work_queue="item = atom.add(queue[0], 1) -> (M tile, work-list entry), the M tile fastest: "
                                 "an entry's token tile is read by its M tiles back to back; the last CTA to finish "
                                 "resets the queue",
                      grouping="moe_gather first: order, offsets, work (its meta); the epilogue stores tile column n "
                               "to y's row order[n], masked to the expert's places and m < M",
                      tensormaps=re.sub(r"dims \((row (?:bytes|words)|\d+ rows' bytes), M( / \d+)?\)",
                                        r"dims (\1, E·M\2) over all experts (an item's rows start at expert·M + m0)",
                                        w_map) +
                      f"; tmap_x: f16, dims (K, pairs) over the gathered x16, box (64, {BN}), 128B swizzle")
    if spec.grouped:  # the two-CTA builds' consumers fit their 104 registers only where setmaxnreg is honoured
        b.meta.update(compile="whole-program")
    if ra and BN > RA_RELOCATABLE_MAX_BN:  # 128 accumulators + 2 A register sets: only with setmaxnreg's 232
        b.meta.update(compile="whole-program")  # registers (nvJitLink's relocatable ptxas ignores it: spills)


def _wgmma_decode(b, spec: MmqSpec, w: _WgWork, item) -> _WgItem:
    """Work item → (M tile, split z, token tile) with the token tile fastest (the converting build: the M tile
    fastest), its K range and first row and token; the grouped build's: _grouped_item."""
    CL = spec.cluster
    if w.groups is not None:
        return _grouped_item(b, spec, w, item)
    if w.stream:
        return _stream_item(b, spec, w, item)
    if spec.convert:  # m fastest: a round of CTAs needs few token tiles of x, which the converters do first (CX_NOTE)
        tm = b.op("rem.u32", item, w.tiles_m)
        rest = b.op("div.u32", item, w.tiles_m)
        z = b.op("rem.u32", rest, w.splits)
        tn = b.op("div.u32", rest, w.splits)
    elif spec.csplit:  # the cluster's tile; its split is the CTA's rank
        tn = b.op("rem.u32", item, w.tiles_n)
        tm = b.op("div.u32", item, w.tiles_n)
        z = w.rank
    else:
        tn = b.op("rem.u32", item, w.tiles_n)
        rest = b.op("div.u32", item, w.tiles_n)
        z = b.op("rem.u32", rest, w.splits)
        tm = b.op("div.u32", rest, w.splits)
    if CL > 1:  # this CTA's M-tile of the cluster's group (past M for an odd last group: zero-filled, masked)
        tm = b.op("mad.lo.u32", tm, Imm(CL, "u32"), w.rank)
    s_begin = b.op("mul.lo.u32", z, w.per)
    s_end = b.op("min.u32", b.op("add.u32", s_begin, w.per), w.ksteps)
    m0 = b.op("mul.lo.u32", tm, Imm(BM, "u32"))
    n0 = b.op("mul.lo.u32", tn, Imm(spec.bn, "u32"))
    return _WgItem(tm, z, tn, s_begin, s_end, m0, n0)


STREAM_NOTE = ("stream-K: the tiles' K ranges laid end to end (tile = M tile · token tiles + token tile, K-steps "
               "0 .. K/64 − 1 each: U units) are cut into chunks of L = steps_per_split K-steps; CTA c takes chunk c "
               "([c·L, min((c + 1)·L, U)), grid ceil(U / L)) as its segments in order, one a tile it touches (item "
               "j·gridDim.x + c: segment j; no queue), so every CTA has the same work up to one K-step. A tile cut "
               "by a chunk boundary is split-K over the chunks that touch it, piece z from chunk first + z (first = "
               "tile·K/64 / L): each piece stores its partial in plane 2·c + (its segment > 0 in its chunk) "
               "(part: 2·grid x 128·BN floats) and the last to count in sums them in z order, as the split builds")


def _stream_item(b, spec: MmqSpec, w: _WgWork, item) -> _WgItem:
    """A stream-K item (STREAM_NOTE) → segment j = item / gridDim.x of chunk c = item % gridDim.x: its tile, K-steps,
    piece z and the tile's pieces, whether it exists (the chunk reaches that tile), and the plane of a piece."""
    G = b.special("nctaid.x")
    c, j = b.op("rem.u32", item, G), b.op("div.u32", item, G)
    L, ks = w.per, w.ksteps
    units = b.op("mul.lo.u32", b.op("mul.lo.u32", w.tiles_m, w.tiles_n), ks)
    u0 = b.op("mul.lo.u32", c, L)
    u1 = b.op("min.u32", b.op("add.u32", u0, L), units)
    tile = b.op("add.u32", b.op("div.u32", u0, ks), j)
    tb = b.op("mul.lo.u32", tile, ks)  # the tile's first unit
    valid = b.op("setp.lt.u32", tb, u1)
    s_begin = b.op("sub.u32", b.op("max.u32", u0, tb), tb)
    s_end = b.op("sub.u32", b.op("min.u32", u1, b.op("add.u32", tb, ks)), tb)
    first = b.op("div.u32", tb, L)
    last = b.op("div.u32", b.op("sub.u32", b.op("add.u32", tb, ks), Imm(1, "u32")), L)
    tn, tm = b.op("rem.u32", tile, w.tiles_n), b.op("div.u32", tile, w.tiles_n)

    def plane(z):  # piece z: chunk first + z, its segment tile − (its first tile) > 0 → the second plane
        cz = b.op("add.u32", first, z)
        later = b.op("setp.gt.u32", tile, b.op("div.u32", b.op("mul.lo.u32", cz, L), ks))
        return b.op("add.u32", b.op("shl.b32", cz, Imm(1, "u32")), b.op("selp.u32", Imm(1, "u32"), Imm(0, "u32"), later))

    return _WgItem(tm, b.op("sub.u32", c, first), tn, s_begin, s_end, b.op("mul.lo.u32", tm, Imm(BM, "u32")),
                   b.op("mul.lo.u32", tn, Imm(spec.bn, "u32")), tile=tile,
                   pieces=b.op("add.u32", b.op("sub.u32", last, first), Imm(1, "u32")), valid=valid, plane=plane)


def _grouped_work(b, Y0, Q, m_p, k_p, grp_p, bm=BM) -> _WgWork:
    """The grouped build's _WgWork: M, K, moe_group's grouping and items = M tiles x work-list entries (read from
    work[0], which moe_group wrote before this launch in stream order). No splits, no partials."""
    M, K = b.ld_param(m_p, "u32"), b.ld_param(k_p, "u32")
    ORD, OFF, WRK = (b.ptr(p) for p in grp_p)
    # launched early behind moe_gather (PDL), which writes the grouping and x: every thread waits for it
    # before reading the grouping (the producer's wait before its first TMA is then already satisfied)
    b.emit("griddepcontrol.wait")
    L = b.op("ld.global.u32", Mem(WRK))
    tiles_m = _tiles_m(b, M, bm)
    groups = _WgGroups(ORD, OFF, WRK)
    return _WgWork(Y0, Q, None, None, M, K, None, None, None, None, tiles_m, b.op("mul.lo.u32", tiles_m, L),
                   b.op("shr.u32", K, Imm(6, "u32")), None, [], groups)


# The grouped nibble builds' L2 prefetch while moe_gather runs (their CTAs wait for it, HBM idle): a CTA's likely first
# item's first GROUPED_L2_PREFETCH_BLOCKS 256-column blocks (0: none), ~10 MB over the GPU's 264 CTAs (n16). H200,
# graph µs, none / 2 blocks (probe_grouped_l2_prefetch_blocks*_16b204c.log): Q4_K 128 x top-8 T = 16 / 32 / 64 / 128
# 36.6 / 43.6-43.8 / 50.7 / 52.9 -> 36.0 / 42.2-43.3 / 50.1 / 51.8, 512 75.9 -> 75.6; 32 x top-4 T = 16 / 32 / 64 /
# 128 31.7 / 36.7-37.3 / 37.4 / 44.4 -> 30.5 / 35.9-36.7 / 36.8 / 44.0. One whole item a CTA (K = 2048: 8 blocks,
# ~43 MB at n16) lost 0.7-4 µs, two 9-34, four 80-240 (more than the window streams: evicted or fetched twice;
# probe_grouped_l2_prefetch_16b204c.log); two items of 1-2 blocks up to 8. In bench_moe's loop (one weight) the
# gain is within its noise: T = 32 43.1 graph µs before and after (bench_moe_q4k_l2_prefetch.log).
GROUPED_L2_PREFETCH_BLOCKS = 2


def _grouped_l2_prefetch(b, spec: MmqSpec, tw_p, m_p, k_p):
    """Before griddepcontrol.wait (moe_gather still running): threads 0 .. min(K / 256, GROUPED_L2_PREFETCH_BLOCKS) - 1
    (in warp 0) prefetch into L2 (cp.async.bulk.prefetch.tensor, the weight map's box) one block each of item ctaid
    as if every expert held one work entry: expert ctaid / M-tiles, M tile ctaid % M-tiles. A guess twice over
    (items go to CTAs in queue order, not by ctaid; an expert without pairs, or with several token tiles, shifts the
    list); a wrong one costs bandwidth in a window where HBM is idle. The nibble codecs' block-box builds (their box
    is a block's rows)."""
    nbl = GROUPED_L2_PREFETCH_BLOCKS
    if not nbl or spec.fmt not in NIBBLE_PARTS or not _block_box(spec):
        return
    assert nbl <= 32, nbl
    codec = codecs.get(spec.fmt)
    lane = b.special("tid.x")
    M, K = b.ld_param(m_p, "u32"), b.ld_param(k_p, "u32")
    skip = b.label("l2_prefetch_done")
    nb = b.op("min.u32", b.op("shr.u32", K, Imm(8, "u32")), Imm(nbl, "u32"))  # (K: whole 256-column blocks)
    b.bra(skip, pred=b.op("setp.ge.u32", lane, nb), uniform=False)
    tw = b.op("cvta.param.u64", b.op("mov.b64", tw_p))
    tiles_m = _tiles_m(b, M, spec.bm)
    cta = b.special("ctaid.x")
    row = b.op("mad.lo.u32", b.op("div.u32", cta, tiles_m), M,
               b.op("mul.lo.u32", b.op("rem.u32", cta, tiles_m), Imm(spec.bm, "u32")))
    b.emit("cp.async.bulk.prefetch.tensor.2d.L2.global.tile",
           TensorRef(tw, (b.op("mul.lo.u32", lane, Imm(codec.BLOCK_BYTES, "u32")), row)))
    b.place(skip)
    b.meta.update(l2_prefetch=f"before the grouping (griddepcontrol.wait): the first {nbl} blocks of item ctaid's "
                              "weights into L2, a guess (expert ctaid / M-tiles, one work entry an expert)")


def _grouped_item(b, spec: MmqSpec, w: _WgWork, item) -> _WgItem:
    """A grouped work item → (M tile, entry) with the M tile fastest: an entry's token tile is read by its M tiles
    back to back (from L2 after the first), and an expert's next token tile (the next entry) reads each weight tile
    tiles_m items after the last one did. (Entry fastest spread an entry's M tiles a work list apart, where at
    T ≥ 768 the token tiles had left L2: H200 graph µs, entry / M fastest, 128 x top-8 768x2048 T = 512 / 1024 /
    2048 81.8 / 80.8, 136.9 / 123.9, 247.7 / 223.2; 32 x top-4 1792x2048 69.8 / 68.9, 121.6 / 122.3, 217.6 / 207.8;
    the integer-weight build's T ≤ 256 within ±0.6 (probe_mfast_*_92ad9dd.log).) Expert e = entry & 0xFFFF, token tile
    entry >> TILE_SHIFT; its places offsets[e] + tile·BN .. (the gathered x16's rows), the expert's last place
    offsets[e + 1] − 1, all of K, the weights from row e·M + m0 of tmap_w (E·M rows)."""
    from .moe_group import TILE_SHIFT

    g = w.groups
    tm, li = b.op("rem.u32", item, w.tiles_m), b.op("div.u32", item, w.tiles_m)
    entry = b.op("ld.global.u32", Mem(b.op("mad.wide.u32", li, Imm(4, "u32"), g.WRK), 4))
    e = b.op("and.b32", entry, Imm((1 << TILE_SHIFT) - 1, "b32"))
    offp = b.op("mad.wide.u32", e, Imm(4, "u32"), g.OFF)
    n0 = b.op("mad.lo.u32", b.op("shr.u32", entry, Imm(TILE_SHIFT, "u32")), Imm(spec.bn, "u32"),
              b.op("ld.global.u32", Mem(offp)))
    tlast = b.op("sub.u32", b.op("ld.global.u32", Mem(offp, 4)), Imm(1, "u32"))
    m0 = b.op("mul.lo.u32", tm, Imm(spec.bm, "u32"))
    zero = b.op("mov.u32", Imm(0, "u32"))
    return _WgItem(tm, zero, li, zero, w.ksteps, m0, n0, b.op("mad.lo.u32", e, w.M, m0), tlast)


def _wgmma_init_barriers(b, CL, lay: _WgRing, tid):
    """Thread 0 initialises the ring's and the item ring's mbarriers; everyone (every CTA of the cluster) waits
    for that. Returns the predicate tid == 0."""
    S, bar0 = lay.S, lay.bar0
    b.comment("thread 0 initialises the barriers; everyone waits for that, then the roles split")
    leader = b.op("setp.eq.u32", tid, Imm(0, "u32"))
    for i in range(S):
        b.emit("mbarrier.init.shared::cta.b64", Mem(bar0, 8 * i), Imm(1, "u32"), pred=leader)
        b.emit("mbarrier.init.shared::cta.b64", Mem(bar0, 8 * (S + i)),
               Imm(lay.consumers + CONSUMER_WARPS * (CL - 1), "u32"), pred=leader)
    for i in range(2):
        b.emit("mbarrier.init.shared::cta.b64", Mem(bar0, 8 * (2 * S + i)), Imm(1, "u32"), pred=leader)
        b.emit("mbarrier.init.shared::cta.b64", Mem(bar0, 8 * (2 * S + 2 + i)), Imm(lay.consumers, "u32"),
               pred=leader)
    for i in range(lay.a_slots):  # a_full (the producer's expect_tx), a_empty (every consumer thread)
        b.emit("mbarrier.init.shared::cta.b64", Mem(bar0, 8 * (2 * S + 4 + i)), Imm(1, "u32"), pred=leader)
        b.emit("mbarrier.init.shared::cta.b64", Mem(bar0, 8 * (2 * S + 4 + lay.a_slots + i)),
               Imm(lay.consumers, "u32"), pred=leader)
    b.emit("fence.proxy.async.shared::cta")
    if CL > 1:  # the peers' barriers are initialised before anyone multicasts into them or arrives on them
        b.emit("fence.mbarrier_init.release.cluster")
        b.emit("barrier.cluster.arrive.release.aligned")
        b.emit("barrier.cluster.wait.acquire.aligned")
    else:
        b.emit("bar.sync", Imm(0, "u32"))
    return leader


def _wgmma_producer(b, spec: MmqSpec, lay: _WgRing, w: _WgWork, tid, leader, tw_p, tx_p, cx_p, XS, cl_exit,
                    ts_p=None):
    """Warpgroup 0, its registers handed to the consumers: in the converting build warps 1-3 convert x
    (_convert_x); thread 0 claims items (the atomic queue, or statically per cluster), hands each to the consumers
    through the 2-slot item ring and TMAs its K-steps into the stage ring (_wgmma_tma_step); the last CTA out
    resets the queue (_wgmma_queue_reset)."""
    BN, CL, CX, S = spec.bn, spec.cluster, spec.convert, lay.S
    b.comment("producer: claim an item, hand it over, then TMA its K-steps into the ring")
    pdone = b.label("producer_exit")
    b.emit("setmaxnreg.dec.sync.aligned.u32", Imm(_wg_regs(spec)[1], "u32"))  # registers go to the consumers
    XR = None
    if CX:  # warps 1-3 convert x; their code comes first, so the emulator's lowest-pc rule runs it before the
        # producer's spin on x_ready (on the GPU they are separate warps anyway)
        X, X16, XR = (b.ptr(p) for p in cx_p[:3])
        producer = b.label("producer")
        b.bra(producer, pred=b.op("setp.lt.u32", tid, Imm(32, "u32")))
        _convert_x(b, tid, w.K, w.T, w.tiles_n, w.tiles_m, w.splits, w.Q, BN, X, X16, XR, b.ptr(cx_p[3]),
                   b.op("add.u32", lay.raw0, Imm(S * lay.raw_bytes + lay.a_slots * lay.a_slot_bytes, "u32")),
                   steps=XS, natural=_natural_k(spec))  # the staging buffers: after the raw stages and the A slots
        b.emit("ret")
        b.place(producer)
    b.bra(pdone, pred=leader, neg=True, uniform=False)
    mask = None
    if _static_clusters(spec):
        cid, ncl = b.special("clusterid.x"), b.special("nclusterid.x")
    if CL > 1:
        mask = b.reg("b16")
        b.emit("mov.b16", mask, Imm((1 << CL) - 1, "b16"))
    tw = b.op("cvta.param.u64", b.op("mov.b64", tw_p))
    tx = b.op("cvta.param.u64", b.op("mov.b64", tx_p))
    ts = b.op("cvta.param.u64", b.op("mov.b64", ts_p)) if ts_p is not None else None
    # launched early behind convert_f16 (programmatic dependent launch): the set-up above overlapped its tail; the
    # activation it writes is read only by this thread's TMA, so the wait goes here
    b.emit("griddepcontrol.wait")
    g = b.op("mov.u32", Imm(0, "u32"))  # K-steps issued so far (ring position)
    j = b.op("mov.u32", Imm(0, "u32"))  # items claimed so far
    p_item, p_end = b.label("p_item"), b.label("p_queue_empty")
    b.place(p_item)
    sl = b.op("and.b32", j, Imm(1, "b32"))
    ph = b.op("and.b32", b.op("shr.u32", j, Imm(1, "u32")), Imm(1, "b32"))
    _wait(b, lay.item_empty(sl), b.op("xor.b32", ph, Imm(1, "b32")))
    item = b.reg("u32")
    it = None
    if _static_clusters(spec):  # static: the CTAs of a cluster walk the same items
        b.emit("mad.lo.u32", item, j, ncl, cid)
        if spec.csplit:  # one tile a cluster (its partial stays in shared memory until the end): the grid has one
            # cluster a tile; a second item would be a launch with fewer, so none is taken
            b.emit("selp.b32", item, item, w.items, b.op("setp.eq.u32", j, Imm(0, "u32")))
    elif w.stream:  # static: segment j of chunk ctaid, or past its chunk's last (0xFFFFFFFF, ≥ items)
        cand = b.op("mad.lo.u32", j, b.special("nctaid.x"), b.special("ctaid.x"))
        it = _wgmma_decode(b, spec, w, cand)
        b.emit("selp.b32", item, cand, Imm(0xFFFFFFFF, "b32"), it.valid)
    else:
        b.emit("atom.global.add.u32", item, Mem(w.Q), Imm(1, "u32"))
    b.emit("st.shared.u32", Mem(b.op("mad.lo.u32", sl, Imm(4, "u32"), lay.slot0)), item)
    st64 = b.reg("b64")
    b.emit("mbarrier.arrive.shared::cta.b64", st64, Mem(lay.item_full(sl)))
    b.emit("add.u32", j, j, Imm(1, "u32"))
    b.bra(p_end, pred=b.op("setp.ge.u32", item, w.items))
    it = it or _wgmma_decode(b, spec, w, item)
    s = b.op("mov.u32", it.s_begin)
    need = None
    if CX:  # x_ready[kc][tn] counts the converted 8-row groups of chunk kc of token tile tn
        need = b.op("shr.u32", b.op("add.u32", b.op("min.u32", b.op("sub.u32", w.T, it.n0), Imm(BN, "u32")),
                                    Imm(CX_ROWS - 1, "u32")), Imm(CX_ROWS.bit_length() - 1, "u32"))
    p_step = b.label("p_step")
    b.place(p_step)
    _wgmma_tma_step(b, spec, lay, w, it, g, s, need, tw, tx, mask, XR, XS, ts)
    b.emit("add.u32", g, g, Imm(1, "u32"))
    b.emit("add.u32", s, s, Imm(1, "u32"))
    b.bra(p_step, pred=b.op("setp.lt.u32", s, it.s_end))
    b.bra(p_item)
    b.place(p_end)
    if not _static_clusters(spec):  # the last CTA out resets the queue for the next launch (every CTA has claimed
        _wgmma_queue_reset(b, spec, w, XR, XS)  # its last item by now)
    b.place(pdone)
    if _static_clusters(spec):
        b.bra(cl_exit)
    else:
        b.emit("ret")


def _wgmma_tma_step(b, spec: MmqSpec, lay: _WgRing, w: _WgWork, it: _WgItem, g, s, need, tw, tx, mask, XR, XS,
                    ts=None):
    """The producer's K-step s (ring position g): wait until the stage is free, expect its bytes, TMA the A part
    (the prepared fragments' block, or the raw tile's header and qs columns) and, once the converters have
    written that chunk of x (the converting build), the activation tile (a cluster rank: its share, multicast)."""
    BN, CL, CX, PRE, S = spec.bn, spec.cluster, spec.convert, spec.prepared, lay.S
    if lay.a_slots:
        _block_box_tma(b, spec, lay, it, s, tw, w.K)
    if lay.bs > 1:
        _block_stage_tma(b, spec, lay, it, g, s, tx, ts)
        return
    stage = b.op("rem.u32", g, Imm(S, "u32"))
    sph = b.op("and.b32", b.op("div.u32", g, Imm(S, "u32")), Imm(1, "b32"))
    _wait(b, lay.empty(stage), b.op("xor.b32", sph, Imm(1, "b32")))
    fb = lay.full(stage)
    last = None
    if ts is not None:  # IntA: the block's last step brings its Σx tile too (expected before the arrival)
        last = b.op("setp.eq.u32", b.op("and.b32", s, Imm(3, "b32")), Imm(3, "u32"))
        b.emit("mbarrier.expect_tx.shared::cta.b64", Mem(fb), Imm(lay.s_bytes, "u32"), pred=last)
    b.emit("mbarrier.arrive.expect_tx.shared::cta.b64", b.reg("b64"), Mem(fb), Imm(lay.stage_bytes, "u32"))
    tma = TMA_STEP
    if ts is not None:  # Σx hi (columns 16j .. +7) and lo (16j + 8 ..) of block j = s >> 2: BN x 16 bytes each
        sdst = lay.sums(stage)
        col = b.op("shl.b32", b.op("shr.u32", s, Imm(2, "u32")), Imm(4, "u32"))
        for h in range(2):
            b.emit(tma, Mem(b.op("add.u32", sdst, Imm(h * spec.bn * 16, "u32"))),
                   TensorRef(ts, (b.op("add.u32", col, Imm(8 * h, "u32")), it.n0)), Mem(fb), pred=last)
    if PRE and not spec.a_regs:  # F16A_NOTE: the M tile's 128 rows of K-step s, fp16, 128B-swizzled (16 KB)
        rdst = b.op("mad.lo.u32", stage, Imm(lay.raw_bytes, "u32"), lay.raw0)
        b.emit(tma, Mem(rdst), TensorRef(tw, (b.op("shl.b32", s, Imm(6, "u32")), it.m0)), Mem(fb))
    elif PRE:  # block (tm, s) of the prepared fragments: 64 rows of 256 bytes
        frow = b.op("shl.b32", b.op("mad.lo.u32", it.tm, w.ksteps, s), Imm(6, "u32"))
        rdst = b.op("mad.lo.u32", stage, Imm(lay.raw_bytes, "u32"), lay.raw0)
        b.emit(tma, Mem(rdst), TensorRef(tw, (b.op("mov.u32", Imm(0, "u32")), frow)), Mem(fb))
    elif not lay.a_slots:  # (else the block's box went to its A slot)
        _wg_weights(spec).tma(b, tw, s, it.m0 if it.w_row is None else it.w_row, stage, lay.raw_bytes, lay.raw0, fb,
                              **({"k": w.K} if spec.row_group > 1 else {}))
    xk = b.op("shl.b32", s, Imm(6, "u32"))
    if CX:  # the step's x chunk converted? (checked at the item's first step and at each chunk's first)
        ready = b.label("x_ready")
        first = b.op("or.pred", b.op("setp.eq.u32", s, it.s_begin),
                     b.op("setp.eq.u32", b.op("and.b32", s, Imm(XS - 1, "b32")), Imm(0, "u32")))
        b.bra(ready, pred=first, neg=True)
        kc = b.op("shr.u32", s, Imm(XS.bit_length() - 1, "u32"))
        fl = b.op("mad.wide.u32", b.op("mad.lo.u32", kc, w.tiles_n, it.tn), Imm(4, "u32"), XR)
        spin = b.label("x_spin")
        b.place(spin)
        b.bra(spin, pred=b.op("setp.lt.u32", b.op("ld.acquire.gpu.global.u32", Mem(fl)), need), uniform=False)
        b.emit("fence.proxy.async.global")  # the converters' generic stores, then this TMA (async proxy) read
        b.place(ready)
    if CL > 1:  # this rank's 1/CL of the activation rows, into the same offsets of every CTA of the cluster
        part_rows = BN // CL
        bdst = b.op("mad.lo.u32", w.rank, Imm(part_rows * 128, "u32"),
                    b.op("mad.lo.u32", stage, Imm(lay.b_bytes, "u32"), lay.bst))
        b.emit(tma + ".multicast::cluster", Mem(bdst),
               TensorRef(tx, (xk, b.op("mad.lo.u32", w.rank, Imm(part_rows, "u32"), it.n0))), Mem(fb), mask)
    else:
        b.emit(tma, Mem(b.op("mad.lo.u32", stage, Imm(lay.b_bytes, "u32"), lay.bst)), TensorRef(tx, (xk, it.n0)),
               Mem(fb))


def _block_stage_tma(b, spec: MmqSpec, lay: _WgRing, it: _WgItem, g, s, tx, ts):
    """Block stages (lay.bs = 4 K-steps a stage, or 2: half a block; items whole blocks): at a stage's first step
    wait until it is free, expect its bs B tiles (IntA: and its Σx tile, hi and lo, BN x 16 bytes each) and load
    them as one 3-D box (GROUPED_B_3D; IntA's Σx tiles as another), or (the skeleton diagnostics) each step's B tile
    into the stage's tile g % bs."""
    S, BN, bs = lay.S, spec.bn, lay.bs
    blk = b.op("shr.u32", g, Imm(bs.bit_length() - 1, "u32"))
    stage = b.op("rem.u32", blk, Imm(S, "u32"))
    fb = lay.full(stage)
    issued = b.label("stage_expected")
    b.bra(issued, pred=b.op("setp.ne.u32", b.op("and.b32", s, Imm(bs - 1, "b32")), Imm(0, "u32")))
    _wait(b, lay.empty(stage), b.op("xor.b32", b.op("and.b32", b.op("div.u32", blk, Imm(S, "u32")), Imm(1, "b32")),
                                    Imm(1, "b32")))
    b.emit("mbarrier.arrive.expect_tx.shared::cta.b64", b.reg("b64"), Mem(fb),
           Imm((0 if "nob" in GROUPED_SKELETON else lay.stage_bytes // 2 if "halfb" in GROUPED_SKELETON
                else lay.stage_bytes) + lay.s_bytes, "u32"))
    b3d = _b3d()
    if ts is not None and b3d:  # IntA: block j = s >> 2's Σx hi and lo tiles (8-column chunks 2j, 2j + 1), one box
        b.emit(TMA_3D, Mem(lay.sums(stage)), TensorRef(ts, (b.op("mov.u32", Imm(0, "u32")), it.n0,
                                                             b.op("shr.u32", s, Imm(1, "u32")))), Mem(fb))
    elif ts is not None:  # ... as two boxes: Σx columns 16j .. and 16j + 8 ..
        col = b.op("shl.b32", b.op("shr.u32", s, Imm(2, "u32")), Imm(4, "u32"))
        for h in range(2):
            b.emit(TMA_STEP, Mem(b.op("add.u32", lay.sums(stage), Imm(h * BN * 16, "u32"))),
                   TensorRef(ts, (b.op("add.u32", col, Imm(8 * h, "u32")), it.n0)), Mem(fb))
    if b3d:  # the stage's bs B tiles as one box: 64-column chunks s .. s + bs - 1, BN rows from n0
        b.emit(TMA_3D, Mem(b.op("mad.lo.u32", stage, Imm(bs * lay.b_bytes, "u32"), lay.bst)),
               TensorRef(tx, (b.op("mov.u32", Imm(0, "u32")), it.n0, s)), Mem(fb))
    b.place(issued)
    if b3d:
        return
    tile = b.op("mad.lo.u32", stage, Imm(bs, "u32"), b.op("and.b32", g, Imm(bs - 1, "b32")))
    if "nob" not in GROUPED_SKELETON:
        half = b.label("halfb_skip") if "halfb" in GROUPED_SKELETON else None  # (the stage's first bs / 2 tiles)
        if half:
            b.bra(half, pred=b.op("setp.ge.u32", b.op("and.b32", g, Imm(bs - 1, "b32")), Imm(bs // 2, "u32")))
        b.emit(TMA_STEP, Mem(b.op("mad.lo.u32", tile, Imm(lay.b_bytes, "u32"), lay.bst)),
               TensorRef(tx, (b.op("shl.b32", s, Imm(6, "u32")), it.n0)), Mem(fb))
        if half:
            b.place(half)


def _tma_block_row(b, tw, s, m0, slot, slot_bytes, raw0, fb, fmt):
    """The nibble codecs' block box: K-step s's block (s >> 2) as one TMA box of 128 rows x ROW_BOX_PITCH bytes (the
    block's, Q4_K's then the next block's first 16: zero-filled past the row end) into A slot `slot`, completing on
    mbarrier fb. One box a block, not 16-byte columns a step: each 16-byte row of a column box is a request of its
    own to L2, which held the register-A MoE GEMM at 77% of L2 throughput at T = 32 (bench/NOTES.md, 2026-12-03)."""
    x0 = b.op("mul.lo.u32", b.op("shr.u32", s, Imm(2, "u32")), Imm(codecs.get(fmt).BLOCK_BYTES, "u32"))
    rdst = b.op("mad.lo.u32", slot, Imm(slot_bytes, "u32"), raw0)
    b.emit(TMA_STEP, Mem(rdst), TensorRef(tw, (x0, m0)), Mem(fb))


def _block_box_tma(b, spec: MmqSpec, lay: _WgRing, it: _WgItem, s, tw, K=None):
    """The producer's box of block s >> 2 into A slot a_count % a_slots, at the item's first step and every block's
    first: wait until the consumers released the slot, expect its bytes, one TMA of the block's box."""
    skip = b.label("a_box_issued")
    first = b.op("or.pred", b.op("setp.eq.u32", s, it.s_begin),
                 b.op("setp.eq.u32", b.op("and.b32", s, Imm(lay.a_mask, "b32")), Imm(0, "u32")))
    b.bra(skip, pred=first, neg=True)
    sl = b.op("rem.u32", lay.a_count, Imm(lay.a_slots, "u32"))
    ph = b.op("and.b32", b.op("div.u32", lay.a_count, Imm(lay.a_slots, "u32")), Imm(1, "b32"))
    _wait(b, lay.a_empty(sl), b.op("xor.b32", ph, Imm(1, "b32")))
    fb = lay.a_full(sl)
    noa = "noa" in GROUPED_SKELETON
    b.emit("mbarrier.arrive.expect_tx.shared::cta.b64", b.reg("b64"), Mem(fb), Imm(0 if noa else lay.a_slot_bytes, "u32"))
    block0 = b.op("and.b32", s, Imm(~lay.a_mask & 0xFFFFFFFF, "b32"))
    if not noa:
        _wg_weights(spec).tma(b, tw, block0, it.m0 if it.w_row is None else it.w_row, sl, lay.a_slot_bytes, lay.raw0,
                              fb, **({"k": K} if spec.row_group > 1 else {}))
    b.emit("add.u32", lay.a_count, lay.a_count, Imm(1, "u32"))
    b.place(skip)


def _tma_raw_tile(b, tw, s, m0, stage, stage_bytes, raw0, fb, pred=None, op=TMA_STEP, fmt="q4_K"):
    """TMA (`op`; tmap_w: box 16 x 128, zero-filled past M) of K-step s's raw Q4_K tile of rows m0 .. m0+127 into
    ring stage `stage` (at raw0 + stage·stage_bytes) as three 16-byte columns of RAW_PART bytes — the super-block's
    header, qs bytes 32c .. 32c+15 and 32c+16 .. 32c+31 of sub-block pair c = s % 4 — completing on mbarrier fb.
    Q5_K (NIBBLE_PARTS 5): the header, its 32 qh bytes (every step's fifth bits) as two columns, then the qs."""
    codec = codecs.get(fmt)
    x0 = b.op("mul.lo.u32", b.op("shr.u32", s, Imm(2, "u32")), Imm(codec.BLOCK_BYTES, "u32"))  # super-block offset
    q0 = b.op("mad.lo.u32", b.op("and.b32", s, Imm(3, "b32")), Imm(32, "u32"),
              b.op("add.u32", x0, Imm(getattr(codec, "QS_OFFSET", codec.HEADER_BYTES), "u32")))
    rdst = b.op("mad.lo.u32", stage, Imm(stage_bytes, "u32"), raw0)
    qh = ([b.op("add.u32", x0, Imm(codec.QH_OFFSET + 16 * i, "u32")) for i in range(2)] if hasattr(codec, "QH_OFFSET")
          else [])
    for part, xs in enumerate((x0, *qh, q0, b.op("add.u32", q0, Imm(16, "u32")))):
        b.emit(op, Mem(b.op("add.u32", rdst, Imm(part * RAW_PART, "u32"))), TensorRef(tw, (xs, m0)), Mem(fb), pred=pred)


def _wgmma_queue_reset(b, spec: MmqSpec, w: _WgWork, XR, XS):
    """The producer's exit (one CTA per cluster): the last CTA out resets the queue and, in the converting build,
    the x_ready counters for the next launch."""
    CX = spec.convert
    done_before = b.reg("u32")
    b.emit("atom.acq_rel.gpu.global.add.u32" if CX else "atom.global.add.u32", done_before, Mem(w.Q, 4),
           Imm(1, "u32"))
    last = b.op("setp.eq.u32", done_before, b.op("sub.u32", b.special("nctaid.x"), Imm(1, "u32")))
    zero = b.op("mov.u32", Imm(0, "u32"))
    b.emit("st.global.v2.u32", Mem(w.Q), b.vec([zero, zero]), pred=last)
    if CX:  # every x_ready counter reached its count (some producer waited for each): zero them for the next
        nflags = b.op("mul.lo.u32", w.tiles_n, b.op("shr.u32", b.op("add.u32", w.ksteps, Imm(XS - 1, "u32")),
                                                    Imm(XS.bit_length() - 1, "u32")))
        i = b.op("mov.u32", Imm(0, "u32"))
        zl, zd = b.label("x_ready_reset"), b.label("x_ready_reset_done")
        b.bra(zd, pred=last, neg=True)
        b.place(zl)
        b.emit("st.global.u32", Mem(b.op("mad.wide.u32", i, Imm(4, "u32"), XR)), zero)
        b.emit("add.u32", i, i, Imm(1, "u32"))
        b.bra(zl, pred=b.op("setp.lt.u32", i, nflags))
        b.place(zd)


class _SmemA(NamedTuple):
    """A consumer thread's share of the shared-memory-A build's dequant: row lt/2 of its warpgroup's 64, half lt%2
    (32 weights, 4 16-byte chunks), and where they go in the 128B-swizzled A tile."""
    named: Reg  # named barrier 1 or 2: one warpgroup
    dh: Reg  # the half
    raw_row: Reg  # the row in the raw ring (stage 0)
    a_mine: Reg  # this warpgroup's two A buffers
    row_off: Reg  # the row in an A buffer
    hx: Reg  # (4·half) ^ (row % 8): the swizzled chunk of chunk 0
    dscale: Reg
    magic: Reg
    nibmask: Reg


def _smem_a_lanes(b, wg, lt, lay: _WgRing) -> _SmemA:
    """A consumer thread's _SmemA, emitted in every wgmma build (the register-A K loops take only its `magic`)."""
    named = b.op("add.u32", wg, Imm(1, "u32"))  # named barrier 1 or 2: one warpgroup
    # dequant: thread -> (row r = lt/2 of this warpgroup's 64, half h = lt%2): 32 weights, 4 16-byte chunks
    r = b.op("shr.u32", lt, Imm(1, "u32"))
    dh = b.op("and.b32", lt, Imm(1, "b32"))
    raw_row = b.op("mad.lo.u32", b.op("mad.lo.u32", wg, Imm(64, "u32"), r), Imm(16, "u32"), lay.raw0)
    a_mine = b.op("mad.lo.u32", wg, Imm(2 * A_TILE, "u32"), lay.a_base)
    rx = b.op("and.b32", r, Imm(7, "b32"))
    # swizzled byte offset of chunk 4h+i of row r: r*128 + ((4h+i) ^ (r%8))*16 = row_off + ((hx ^ i) << 4)
    row_off = b.op("shl.b32", r, Imm(7, "u32"))
    hx = b.op("xor.b32", b.op("shl.b32", dh, Imm(2, "u32")), rx)
    dscale = b.op("selp.f32", Imm(1.0 / 16, "f32"), Imm(1.0, "f32"), b.op("setp.ne.u32", dh, Imm(0, "u32")))
    magic = b.op("mov.b32", Imm(0x64006400, "b32"))
    nibmask = b.op("selp.b32", Imm(0x00F000F0, "b32"), Imm(0x000F000F, "b32"), b.op("setp.ne.u32", dh, Imm(0, "u32")))
    return _SmemA(named, dh, raw_row, a_mine, row_off, hx, dscale, magic, nibmask)


def _wgmma_consumer(b, arch, spec: MmqSpec, lay: _WgRing, w: _WgWork, tid, epilogue, fix_slot):
    """Warpgroups 1 and 2, with the producer's registers: take each item from the item ring, run its K loop into
    BN/2 fp32 accumulators per thread (A in registers: _rega_steps / _prepared_steps; else _smem_a_steps) and
    store the tile through _wgmma_epilogue (split-K included)."""
    BN, CL, ra, S = spec.bn, spec.cluster, spec.a_regs, lay.S
    b.emit("setmaxnreg.inc.sync.aligned.u32", Imm(_wg_regs(spec)[2], "u32"))
    ct = b.op("sub.u32", tid, Imm(128, "u32"))
    wg = b.op("shr.u32", ct, Imm(7, "u32"))
    lt = b.op("and.b32", ct, Imm(127, "b32"))
    lane = b.op("and.b32", ct, Imm(31, "b32"))
    cw = b.op("shr.u32", ct, Imm(5, "u32"))  # consumer warp 0..7: rows 16*cw .. +15 of the tile
    # (peer rank, this thread signals for its warp): lane 0 of each consumer warp releases stages on the peers
    peers = [(r, b.op("setp.eq.u32", lane, Imm(0, "u32"))) for r in w.peer_ranks]
    sa = _smem_a_lanes(b, wg, lt, lay)
    acc = [b.reg("f32") for _ in range(BN // 2)]
    gc = b.op("mov.u32", Imm(0, "u32"))
    jc = b.op("mov.u32", Imm(0, "u32"))
    cs_have = cs_item = None
    if spec.csplit:  # whether this CTA holds a split of a tile (its item), for _csplit_reduce
        cs_have, cs_item = b.reg("pred"), b.reg("u32")
        b.emit("setp.ne.u32", cs_have, jc, jc)
    c_item, c_end = b.label("c_item"), b.label("c_queue_empty")
    b.place(c_item)
    sl = b.op("and.b32", jc, Imm(1, "b32"))
    ph = b.op("and.b32", b.op("shr.u32", jc, Imm(1, "u32")), Imm(1, "b32"))
    _wait(b, lay.item_full(sl), ph)
    item = b.op("ld.shared.u32", Mem(b.op("mad.lo.u32", sl, Imm(4, "u32"), lay.slot0)))
    b.emit("mbarrier.arrive.shared::cta.b64", b.reg("b64"), Mem(lay.item_empty(sl)))
    b.emit("add.u32", jc, jc, Imm(1, "u32"))
    b.bra(c_end, pred=b.op("setp.ge.u32", item, w.items))
    it = _wgmma_decode(b, spec, w, item)
    t0 = b.special("globaltimer_lo") if w.groups is not None and GROUPED_TRACE else None
    split_k = None if w.groups is not None or w.stream else b.op("setp.gt.u32", w.splits, Imm(1, "u32"))
    out, ym = acc, None
    if spec.int_weights:  # y (fp32 sums of the blocks scaled by d) and the min term's MMA accumulator ym apart from
        # the block accumulator: ptxas serializes every wgmma where other instructions write an accumulator
        out, ym = ([b.reg("f32") for _ in range(BN // 2)] for _ in range(2))
    for a in out + (ym or []):
        b.emit("mov.f32", a, Imm(0.0, "f32"))
    s = b.op("mov.u32", it.s_begin)
    if spec.int_weights:
        _iw_steps(b, codecs.get(spec.fmt), arch, BN, lay, acc, out, ym, s, it.s_begin, it.s_end, gc, cw, lane, sa.magic,
                  peers)
        for v, m in zip(out, ym):
            b.emit("add.rn.f32", v, v, m)
    elif ra:
        steps = _prepared_steps if spec.prepared else _wg_weights(spec).steps
        steps(b, arch, BN, S, acc, s, it.s_begin, it.s_end, gc, lay.full, lay.empty, lay.raw0, lay.raw_bytes, lay.bst,
              lay.b_bytes, ct, cw, lane, sa.magic, peers, **({"lay": lay} if lay.a_slots else {}),
              **({"k": w.K} if spec.row_group > 1 else {}))
    elif spec.prepared:
        _f16a_steps(b, arch, BN, lay, wg, acc, s, it, gc, peers)
    else:
        _smem_a_steps(b, arch, BN, lay, sa, acc, s, it, gc, peers)
    b.comment("epilogue: the m64nNk16 accumulator is m16n8 fragments per warp: y[t][m] = acc, masked")
    if CL > 1:  # an odd last group's second M-tile lies past M: it only took part in the multicast ring
        b.bra(c_item, pred=b.op("setp.ge.u32", it.tm, w.tiles_m))
    if t0 is not None:  # the trace build: the item's record, not its y rows
        rec = b.op("mad.wide.u32", item, Imm(16, "u32"), w.Y0)
        b.emit("st.global.v4.u32", Mem(rec), b.vec([b.special("ctaid.x"), b.special("smid"), t0,
                                                    b.special("globaltimer_lo")]),
               pred=b.op("setp.eq.u32", ct, Imm(0, "u32")))
        b.bra(c_item)
        b.place(c_end)
        return
    if w.groups is not None:  # mul_mat_id: tile column n → y's row order[n] (the pair), masked to the expert's
        from .mmq_moe import scatter_rows

        it = _wgmma_decode(b, spec, w, item)  # decoded again (L1 hits): its rows and places stay out of the K loop's
        # registers (the block-box builds' slot bookkeeping spilled two of them at the paired builds' 104)

        epilogue.lower_mma_sync(b, [[out[4 * q:4 * q + 4] for q in range(BN // 8)]], lane, it.m0, cw, 16, it.n0,
                                b.op("mov.u32", Imm(0, "u32")), BN, w.M, b.op("add.u32", it.tlast, Imm(1, "u32")),
                                w.Y0, col_row=scatter_rows(b, w.groups.ORD, it.tlast))
        b.bra(c_item)
        b.place(c_end)
        return
    if spec.csplit:  # the partial into this CTA's B stages; summed by the cluster after the loop (_csplit_reduce)
        b.emit("bar.sync", Imm(3, "u32"), Imm(256, "u32"))  # both consumer warpgroups' last wgmmas have read the
        # stages (each waited for its own only): found by a review, shown by the warpgroup-serial emulator
        for q in range(BN // 8):
            b.emit("st.shared.v4.f32", Mem(b.op("mad.lo.u32", ct, Imm(16, "u32"), lay.bst), q * 4096),
                   b.vec(acc[4 * q:4 * q + 4]))
        b.emit("setp.eq.u32", cs_have, jc, jc)
        b.emit("mov.u32", cs_item, item)
        b.bra(c_item)
        b.place(c_end)
        _csplit_reduce(b, spec, lay, w, ct, lane, cw, epilogue, cs_have, cs_item)
        return
    if w.stream:  # decoded again (integer work after the K loop): the pieces and planes stay out of its registers
        it = _wgmma_decode(b, spec, w, item)  # (Q5_K's n256 spilled 8 bytes with them live)
        split_k = b.op("setp.gt.u32", it.pieces, Imm(1, "u32"))
    _wgmma_epilogue(b, epilogue, acc, BN, ct, lane, cw, it.m0, it.n0, b.op("mad.lo.u32", it.tm, w.tiles_n, it.tn),
                    b.op("mul.lo.u32", w.tiles_m, w.tiles_n), it.z, it.pieces if w.stream else w.splits, split_k,
                    b.op("mov.u32", fix_slot), w.C, w.P, w.Y0, w.M, w.T, pair_chunk=PAIR_CHUNK.get((ra, BN), 0),
                    plane=it.plane)
    b.bra(c_item)
    b.place(c_end)


CSPLIT_NOTE = ("cluster split-K: a tile's K splits are the CTAs of one thread-block cluster (launch attribute: cluster "
               "dims (splits, 1, 1), grid tiles x splits; cluster c takes tile c, rank z its K-steps [z·per, (z+1)·per)). "
               "Each stores its fp32 partial into its own B stages in fragment order (q·4096 + 16·thread), the cluster "
               "meets (barrier.cluster: release / acquire), rank z sums fragments [z·c, (z+1)·c), c = ceil(nq / "
               "splits), of every rank's partial through distributed shared memory in rank order (ld.shared::cluster) and writes "
               "them to y; a second meeting keeps every CTA's shared memory alive until its peers have read it. No "
               "partials in global memory, no counters, no last-CTA fixup; the sums run in z order from split 0, as "
               "the split builds' fixup does (the same bits but for the sign of an exact zero sum)")
CSPLIT_CHUNK = 8  # fragments of a rank's share loaded together (8 x 16 bytes in flight a thread and rank)


def _csplit_reduce(b, spec: MmqSpec, lay: _WgRing, w: _WgWork, ct, lane, cw, epilogue, have, item):
    """The cluster split's end (CSPLIT_NOTE), in every consumer thread: meet the cluster once the partials are
    stored, sum this rank's share of the tile's fragments over the ranks in z order and write y, meet again."""
    BN = spec.bn
    nq = BN // 8
    b.comment("cluster split-K: partials stored; rank z sums its share of every rank's partial in z order")
    b.emit("barrier.cluster.arrive.release")
    b.emit("barrier.cluster.wait.acquire")
    done = b.label("cs_done")
    b.bra(done, pred=have, neg=True)
    it = _wgmma_decode(b, spec, w, item)
    ranks = b.special("cluster_nctarank")  # (the launch's cluster: the splits)
    share = b.op("div.u32", b.op("add.u32", ranks, Imm(nq - 1, "u32")), ranks)  # fragments a rank sums, ceil
    q0 = b.op("mul.lo.u32", it.z, share)
    q_end = b.op("min.u32", b.op("add.u32", q0, share), Imm(nq, "u32"))
    mine = b.op("mad.lo.u32", ct, Imm(16, "u32"), lay.bst)
    zero = b.op("mov.u32", Imm(0, "u32"))
    chunk = b.label("cs_chunk")
    b.place(chunk)
    oks = [b.op("setp.lt.u32", b.op("add.u32", q0, Imm(f, "u32")), q_end) for f in range(CSPLIT_CHUNK)]
    at = b.op("mad.lo.u32", q0, Imm(4096, "u32"), mine)  # fragment q0's offset in every rank's B stages
    tots = [b.regs("f32", 4) for _ in range(CSPLIT_CHUNK)]
    for t4 in tots:
        for t_ in t4:
            b.emit("mov.f32", t_, Imm(0.0, "f32"))
    r = b.op("mov.u32", Imm(0, "u32"))
    rank_loop = b.label("cs_rank")
    b.place(rank_loop)
    peer = b.op("mapa.shared::cluster.u32", at, r)
    first = b.op("setp.eq.u32", r, Imm(0, "u32"))
    for f in range(CSPLIT_CHUNK):
        v = b.regs("f32", 4)
        b.emit("ld.shared::cluster.v4.f32", b.vec(v), Mem(peer, f * 4096), pred=oks[f])
        for e in range(4):  # split 0's values, then + each next split's (z order)
            sm = b.reg("f32")
            b.emit("add.rn.f32", sm, tots[f][e], v[e], pred=oks[f])
            b.emit("selp.f32", tots[f][e], v[e], sm, first, pred=oks[f])
    b.emit("add.u32", r, r, Imm(1, "u32"))
    b.bra(rank_loop, pred=b.op("setp.lt.u32", r, ranks))
    for f in range(CSPLIT_CHUNK):
        skip = b.label("cs_skip")
        b.bra(skip, pred=oks[f], neg=True)
        n0 = b.op("add.u32", it.n0, b.op("shl.b32", b.op("add.u32", q0, Imm(f, "u32")), Imm(3, "u32")))
        epilogue.lower_mma_sync(b, [[tots[f]]], lane, it.m0, cw, 16, n0, zero, 8, w.M, w.T, w.Y0)
        b.place(skip)
    b.emit("add.u32", q0, q0, Imm(CSPLIT_CHUNK, "u32"))
    b.bra(chunk, pred=b.op("setp.lt.u32", q0, q_end))
    b.place(done)
    b.emit("barrier.cluster.arrive.release")  # every rank has read this CTA's partial before it leaves
    b.emit("barrier.cluster.wait.acquire")
    b.emit("ret")


def _ss_steps(b, arch, BN, lay: _WgRing, acc, s, it: _WgItem, gc, peers, operands):
    """The K loop of the builds whose wgmmas take both operands from shared memory (_smem_a_steps, _f16a_steps): per
    step wait for the stage, `operands(stage)` — what the build does before its wgmmas, giving the (A, B) descriptor
    pairs of the step's BK / 16 slices (an iterator: a generator emits its descriptor arithmetic between the
    wgmmas) —, the wgmmas, the step's release; the ring's drain after the last."""
    S = lay.S
    c_step = b.label("c_step")
    b.place(c_step)
    stage = b.op("rem.u32", gc, Imm(S, "u32"))
    sph = b.op("and.b32", b.op("div.u32", gc, Imm(S, "u32")), Imm(1, "b32"))
    _wait(b, lay.full(stage), sph)
    pairs = operands(stage)
    b.emit("wgmma.fence.sync.aligned")
    for dak, dbk in pairs:
        b.emit(ir_wgmma(arch, BN, "f16", b.vec(acc), dak, dbk))
    _wgmma_step_done(b, S, gc, s, it.s_begin, lay.empty, peers)
    b.bra(c_step, pred=b.op("setp.lt.u32", s, it.s_end))
    _wgmma_drain(b, S, gc, lay.empty, peers)


def _smem_a_steps(b, arch, BN, lay: _WgRing, sa: _SmemA, acc, s, it: _WgItem, gc, peers):
    """The shared-memory-A consumer's K loop (mmq_q4_k_wgmma_n*): per step each thread dequantizes its 32 weights
    into the warpgroup's swizzled A buffer gc % 2, fences them for the async proxy, and the warpgroup issues the
    step's wgmmas on that A tile and the stage's B tile (_ss_steps)."""
    def operands(stage):
        # dequantize this warpgroup's 64 rows into A buffer gc % 2 (wgmma of step gc - 2 read it; done)
        src = b.op("mad.lo.u32", stage, Imm(lay.raw_bytes, "u32"), sa.raw_row)
        hdr = b.regs("b32", 4)
        b.emit("ld.shared.v4.b32", b.vec(hdr), Mem(src))
        qs = b.regs("b32", 8)
        b.emit("ld.shared.v4.b32", b.vec(qs[0:4]), Mem(src, RAW_PART))
        b.emit("ld.shared.v4.b32", b.vec(qs[4:8]), Mem(src, 2 * RAW_PART))
        sub = b.op("add.u32", b.op("shl.b32", b.op("and.b32", s, Imm(3, "b32")), Imm(1, "u32")), sa.dh)
        out = RAW_CODEC.f16_words(b, hdr, qs, sub, sa.dscale, sa.nibmask, sa.magic)  # the raw ring's decode
        abuf = b.op("mad.lo.u32", b.op("and.b32", gc, Imm(1, "b32")), Imm(A_TILE, "u32"), sa.a_mine)
        arow = b.op("add.u32", abuf, sa.row_off)
        for i in range(4):
            c = sa.hx if i == 0 else b.op("xor.b32", sa.hx, Imm(i, "b32"))
            dst = b.op("add.u32", arow, b.op("shl.b32", c, Imm(4, "u32")))
            b.emit("st.shared.v4.b32", Mem(dst), b.vec(out[4 * i:4 * i + 4]))
        b.emit("fence.proxy.async.shared::cta")  # generic-proxy stores -> visible to wgmma (async proxy)
        b.emit("bar.sync", sa.named, Imm(128, "u32"))
        da = _desc(b, abuf)
        db = _desc(b, b.op("mad.lo.u32", stage, Imm(lay.b_bytes, "u32"), lay.bst))

        def pairs():  # +32 bytes along K inside the 128-byte swizzled rows = +2 in the descriptor, between the wgmmas
            for kk in range(BK // 16):
                yield ((da, db) if kk == 0 else
                       (b.op("add.s64", da, Imm(2 * kk, "s64")), b.op("add.s64", db, Imm(2 * kk, "s64"))))
        return pairs()

    _ss_steps(b, arch, BN, lay, acc, s, it, gc, peers, operands)


def _f16a_steps(b, arch, BN, lay: _WgRing, wg, acc, s, it: _WgItem, gc, peers):
    """The f16a build's K loop (F16A_NOTE): per step the warpgroup issues its wgmmas on its 64 rows of the stage's
    TMA-written fp16 A tile and the stage's B tile — no dequant, no A stores, nothing but the ring's waits
    (_ss_steps)."""
    mine = b.op("shl.b32", wg, Imm(13, "u32"))  # this warpgroup's rows 64·wg ..: 64 x 128 bytes further

    def operands(stage):  # +32 bytes along K inside the 128-byte swizzled rows a slice
        return list(zip(
            _desc_steps(b, b.op("add.u32", b.op("mad.lo.u32", stage, Imm(lay.raw_bytes, "u32"), lay.raw0), mine),
                        BK // 16),
            _desc_steps(b, b.op("mad.lo.u32", stage, Imm(lay.b_bytes, "u32"), lay.bst), BK // 16)))

    _ss_steps(b, arch, BN, lay, acc, s, it, gc, peers, operands)


def _wgmma_two_splits(b, epilogue, frags, ct, lane, cw, m0, n0, tile, tiles, z, slot, C, P, Y0, M, T, leader, barrier,
                      done, chunk, plane=None):
    """Split-K with two splits (the T=512 shapes of M=4096): the first CTA of the tile to count in stores its
    partial (fragment order, as below), fences and raises the counter's ready bit (4); the second (count 1 or 5)
    neither stores nor re-reads its own: it waits for the ready bit, adds the other partial into its
    accumulators `chunk` fragments at a time and writes y. Deterministic: one addition per value, and
    a + b == b + a exactly. No deadlock: the first CTA waits for nothing once it has counted in."""
    nq = len(frags)
    cnt, second = _arrive(b, tile, C, leader, slot, barrier,
                          lambda old: b.op("setp.eq.u32", b.op("and.b32", old, Imm(3, "b32")), Imm(1, "u32")))
    def partial(split):  # this thread's first fragment of `split`'s partial tile (plane z·tiles + tile, or `plane`'s)
        at = plane(split) if plane is not None else b.op("mad.lo.u32", split, tiles, tile)
        return b.op("mad.wide.u32", b.op("mad.lo.u32", at, Imm(nq * 256, "u32"), ct), Imm(16, "u32"), P)

    mine = partial(z)
    reduce = b.label("pair_reduce")
    b.bra(reduce, pred=second)
    for q, f in enumerate(frags):
        b.emit("st.global.v4.f32", Mem(mine, q * 4096), b.vec(f))
    b.emit("bar.sync", *barrier)  # the CTA's partial stores, then the leader's release (cumulative over them)
    b.emit("red.release.gpu.global.add.u32", Mem(cnt), Imm(4, "u32"), pred=leader)
    b.bra(done)
    b.place(reduce)
    spin = b.label("pair_wait")  # every thread acquires the ready bit itself (no divergent warp before a barrier)
    b.place(spin)
    b.bra(spin, pred=b.op("setp.eq.u32", b.op("and.b32", b.op("ld.acquire.gpu.global.u32", Mem(cnt)), Imm(4, "b32")),
                          Imm(0, "u32")))
    other = partial(b.op("xor.b32", z, Imm(1, "b32")))  # z is 0 or 1
    for c0 in range(0, nq, chunk):
        loaded = []
        for q in range(c0, min(nq, c0 + chunk)):
            v = b.regs("f32", 4)
            b.emit("ld.global.cg.v4.f32", b.vec(v), Mem(other, q * 4096))
            loaded.append((q, v))
        for q, v in loaded:
            for e in range(4):
                b.emit("add.rn.f32", frags[q][e], frags[q][e], v[e])
    epilogue.lower_mma_sync(b, [frags], lane, m0, cw, 16, n0, b.op("mov.u32", Imm(0, "u32")), 8 * nq, M, T, Y0)
    b.emit("bar.sync", *barrier)  # every thread has seen the ready bit before the reset
    b.emit("st.global.u32", Mem(cnt), Imm(0, "u32"), pred=leader)  # both counted in, ready seen: reset
    b.bra(done)


def _wgmma_epilogue(b, epilogue, acc, BN, ct, lane, cw, m0, n0, tile, tiles, z, splits, split_k, slot, C, P, Y0, M, T,
                    pair_chunk=0, plane=None):
    """The wgmma MMQs' epilogue. One split: the accumulators straight into y. Split-K: every CTA stores its partial
    tile in fragment order (part + ((z·tiles + tile)·BN/8 + q)·4096 + 16·ct: one 16-byte store per m16n8 fragment
    q, coalesced) and counts itself in at the tile's counter; the last CTA of the tile sums the partials in z order
    and writes y. The sum's order is fixed, so the result does not depend on which CTA comes last; no reduction
    launch, the partials are read once, by one CTA, 64 values per thread and split at a time. (Its own partial
    comes back from L2 too: adding it from the accumulators keeps them live beside the sums, and the n256 builds
    spill at 168 registers.) With two splits and `pair_chunk` > 0 `_wgmma_two_splits` runs instead: one addition
    per value needs no z order, so the second CTA adds the first's partial straight into its accumulators.
    `plane` (stream-K): piece z's partial plane (a register → a register) in place of z·tiles + tile."""
    frags = [acc[4 * q:4 * q + 4] for q in range(BN // 8)]
    zero = b.op("mov.u32", Imm(0, "u32"))
    direct, done = b.label("epi_direct"), b.label("epi_done")
    b.bra(direct, pred=split_k, neg=True)
    barrier = (Imm(3, "u32"), Imm(256, "u32"))  # the 256 consumer threads
    leader = b.op("setp.eq.u32", ct, Imm(0, "u32"))
    nq = BN // 8
    if pair_chunk:
        general = b.label("epi_splits")
        b.bra(general, pred=b.op("setp.eq.u32", splits, Imm(2, "u32")), neg=True)
        _wgmma_two_splits(b, epilogue, frags, ct, lane, cw, m0, n0, tile, tiles, z, slot, C, P, Y0, M, T, leader,
                          barrier, done, pair_chunk, plane)
        b.place(general)
    def at_plane(pl):  # this thread's first fragment of the partial in plane pl
        return b.op("mad.wide.u32", b.op("mad.lo.u32", pl, Imm(nq * 256, "u32"), ct), Imm(16, "u32"), P)

    mine = at_plane(plane(z) if plane is not None else b.op("mad.lo.u32", z, tiles, tile))
    for q, f in enumerate(frags):
        b.emit("st.global.v4.f32", Mem(mine, q * 4096), b.vec(f))
    b.emit("bar.sync", *barrier)  # the CTA's partial stores before the leader's count (_count_in: acq_rel)
    cnt = _count_in(b, tile, C, leader, slot, splits, barrier, done)
    stride = b.op("mul.wide.u32", tiles, Imm(nq * 4096, "u32"))  # bytes from split z to z + 1
    first = at_plane(tile)  # split 0
    CHUNK = 16  # fragments summed together: 16 16-byte loads in flight per thread and split
    for c0 in range(0, nq, CHUNK):
        chunk = frags[c0:c0 + CHUNK]
        tots = [[b.op("mov.f32", Imm(0.0, "f32")) for _ in range(4)] for _ in chunk]
        pz = b.op("add.u64", first, Imm(c0 * 4096, "u64"))
        zz = b.op("mov.u32", Imm(0, "u32"))
        zl = b.label("fix_z")
        b.place(zl)
        if plane is not None:  # stream-K: piece zz's plane
            b.emit("add.u64", pz, at_plane(plane(zz)), Imm(c0 * 4096, "u64"))
        loaded = []
        for i in range(len(chunk)):
            v = b.regs("f32", 4)
            b.emit("ld.global.cg.v4.f32", b.vec(v), Mem(pz, i * 4096))
            loaded.append(v)
        for i, v in enumerate(loaded):
            for e in range(4):
                b.emit("add.rn.f32", tots[i][e], tots[i][e], v[e])  # z = 0 first: 0 + p0 = p0
        if plane is None:
            b.emit("add.s64", pz, pz, stride)
        b.emit("add.u32", zz, zz, Imm(1, "u32"))
        b.bra(zl, pred=b.op("setp.lt.u32", zz, splits))
        epilogue.lower_mma_sync(b, [tots], lane, m0, cw, 16, b.op("add.u32", n0, Imm(8 * c0, "u32")), zero,
                                8 * len(chunk), M, T, Y0)
    b.emit("st.global.u32", Mem(cnt), Imm(0, "u32"), pred=leader)  # every split has counted in: reset for the next
    b.bra(done)
    b.place(direct)
    epilogue.lower_mma_sync(b, [frags], lane, m0, cw, 16, n0, zero, BN, M, T, Y0)
    b.place(done)


def _wgmma_step_done(b, S, gc, s, s_begin, empty, peers=()):
    """After a consumer step's wgmmas: commit them, wait until the previous step's group retired and release its
    ring stage (not on the item's first step), advance the ring position gc and the K-step s."""
    b.emit("wgmma.commit_group.sync.aligned")
    b.emit("wgmma.wait_group.sync.aligned", Imm(1, "u32"))  # step gc - 1 is done: release its stage
    not_first = b.op("setp.gt.u32", s, s_begin)
    prev = b.op("rem.u32", b.op("add.u32", gc, Imm(S - 1, "u32")), Imm(S, "u32"))
    _release(b, empty, prev, peers, not_first)
    b.emit("add.u32", gc, gc, Imm(1, "u32"))
    b.emit("add.u32", s, s, Imm(1, "u32"))


def _release(b, empty, stage, peers=(), pred=None):
    """A consumer thread frees ring stage `stage`: an arrival on its CTA's empty barrier; in a cluster also one
    arrival per warp (`peers`: (rank, the warp's signalling lane) each; bar.warp.sync first, so the warp's reads of
    the stage come before it) on the same barrier of each peer, whose producer multicasts into this CTA too. The
    remote arrival keeps the default .release.cta semantics, as CUTLASS's cluster pipelines do: a
    .release.cluster one compiles to a fence per arrival (ERRBAR + MEMBAR.GPU), which held the first cluster build
    at 30-50% slower than no cluster on the H200 (ncu: 29% of stall samples on those fences)."""
    state = b.reg("b64")
    addr = empty(stage)
    b.emit("mbarrier.arrive.shared::cta.b64", state, Mem(addr), pred=pred)
    if peers:
        b.emit("bar.warp.sync", Imm(0xFFFFFFFF, "b32"))
    for peer, signal in peers:
        remote = b.op("mapa.shared::cluster.u32", addr, peer)
        go = signal if pred is None else b.op("and.pred", signal, pred)
        b.emit("mbarrier.arrive.shared::cluster.b64", Sym("_"), Mem(remote), pred=go)


def _wgmma_drain(b, S, gc, empty, peers=()):
    """After an item's last step: wait for all its wgmmas, release the last ring stage."""
    b.emit("wgmma.wait_group.sync.aligned", Imm(0, "u32"))
    prev = b.op("rem.u32", b.op("add.u32", gc, Imm(S - 1, "u32")), Imm(S, "u32"))
    _release(b, empty, prev, peers)


def _rega_steps(b, arch, BN, S, acc, s, s_begin, s_end, gc, full, empty, raw0, raw_bytes, bst, b_bytes, ct, cw,
                lane, magic, peers=(), qh=False, lay=None, block_scales=True, row_box=None, codec=RAW_CODEC,
                natural=False, min_lo=False):
    """The register-A consumer's K loop of the nibble codecs (mmq_q4_k_wgmma_ra_*, mmq_q5_k_wgmma_ra_*): lane (g, t)
    of consumer warp cw decodes rows 16·cw + g and + 8 of the stage's raw 16-byte columns (RAW_PART bytes each)
    straight into wgmma's A fragments by the codec's RegA (codecs/q4_k.py; `qh`: Q5_K's fifth bits), in the K order
    of layouts.q4k_rega_k_order (the activation comes in that order from convert_f16_perm). No A tile, no
    fence.proxy.async, no named barrier: each warp's A is its own. A registers must outlive their wgmma
    (wait_group 1 retires the step before), so the loop is unrolled twice: two register sets. (Measured and not
    kept, 2026-12-01: the scales decoded once per stage by the producer warpgroup's idle warps into a shared table,
    bench/NOTES.md.) `lay` (NIBBLE_BLOCK_BOX's builds: their A slots): the block's rows, `row_box` = (pitch, qs
    offset, qh offset), in an A slot for its 4 steps; pair c's qs bytes 32c further in. `natural` (_natural_k): x in
    its own K order instead (RegA's natural loads). `min_lo` (min_lo_sums: block stages of 4 steps): the pairs
    decoded without −m_lo (dequant_pair2), and after each block's last step one more k16 MMA into acc: A = [lo | 0]
    of RegA.min_fragments (from the header, before the slot goes back), B = the stage's Σx tile [hi | lo], the
    −m_lo·Σhi the pairs left out (m_lo·Σlo is under 2^-22 of the term)."""
    dec = codec.RegA(b, lane, cw, s, RAW_PART, qh, s_begin, block_scales, row_box, natural=natural, min_lo=min_lo)
    if lay is not None and lay.bs > 1:  # block stages: the block's A slot taken at its step 0, given after step 3
        slot, mins = [], []
        assert not min_lo or lay.bs == 4, lay.bs  # (the Σx slot is a block's)

        def block_fragments(stage, st):
            if st == 0:
                sl = _block_slot(b, lay)
                _block_slot_wait(b, lay, sl)
                slot[:] = [sl, lay.a_slot(sl)]
            if GROUPED_SKELETON:  # (diagnostic: no decode, A = 1.0 halves)
                frags = [[b.op("mov.b32", Imm(0x3C003C00, "b32")) for _ in range(4)] for _ in range(BK // 16)]
            else:
                frags = dec.fragments(b, slot[1], magic, b.op("mov.u32", Imm(32 * st, "u32")), step=st)
            if st == 3:
                if min_lo:
                    mins[:] = dec.min_fragments(b, slot[1], magic)[0][1]  # [lo₀, lo₁, 0, 0]
                _block_slot_give(b, lay, slot[0])
            return frags

        def block_min_term(stage, st):  # after the block's last step's MMAs, in their commit group
            if min_lo and st == 3:
                b.emit(ir_wgmma(arch, BN, "f16", b.vec(acc), b.vec(mins), _sums_desc(b, lay, stage, BN)))
        _ra_block_loop(b, arch, BN, lay, acc, s, s_begin, s_end, gc, peers, block_fragments, block_min_term)
        return

    def fragments(stage):
        if lay is not None:
            sl = _a_slot_take(b, lay, s, s_begin)
            frags = dec.fragments(b, lay.a_slot(sl), magic, b.op("shl.b32", b.op("and.b32", s, Imm(lay.a_mask, "b32")),
                                                                   Imm(5, "u32")))
            _a_slot_give(b, lay, s, s_end, sl)
            return frags
        return dec.fragments(b, b.op("mad.lo.u32", stage, Imm(raw_bytes, "u32"), raw0), magic)
    _ra_k_loop(b, arch, BN, S, acc, s, s_begin, s_end, gc, full, empty, bst, b_bytes, peers, fragments)


IW_NOTE = ("A = q·sc' exact in fp16 (one fma a weight pair); a super-block's MMAs into a block accumulator, y += "
           "d·acc in fp32 after its last step; the min term as two k16 MMAs into y: A = [−dmin·m hi | hi] and [lo | 0] "
           "of the lane's sub-blocks, B = the block's Σx tile [hi | lo] (_iw_steps)")
GROUPED_IW_TOKEN_TILES = (16,)  # the integer-weight grouped build: y, the min term's and the block's accumulators
# and two A sets fit the paired builds' 104 registers at n16 (n32 spilled 96 bytes)
RA_CODECS = ("q8_0", "q6_K", "tq4_1s")  # codecs with their own register-A decode (ra_box_column, ra_fragments, RA_BOX_BYTES,
# RA_BOX_NOTE; RA_BOX_STEPS where one box serves several K-steps, with ra_step_offset, and RA_BLOCK_BOX_BYTES /
# RA_BLOCK_BOX_NOTE / RA_BLOCK_BOX_MAX_BN where that box differs from a step's)
RA_A_SLOTS = 2  # block boxes in flight for such a codec (2 x 30 KB (Q6_K) / 34 KB (Q8_0) beside the B stages)


# Q4_K / Q5_K (NIBBLE_PARTS) with a block's rows loaded by one TMA box into an A slot for its 4 K-steps instead of 3 /
# 5 16-byte column boxes a step (_tma_block_row), by format, for the schedules named. H200, graph µs, column boxes
# -> block box (bench/NOTES.md, 2026-12-03): MoE 128 x top-8 T = 32 / 128 / 512 Q4_K 67.6 / 80.1 / 101.9 -> 62.5 /
# 77.7 / 99.0, Q5_K 104.9 / 114.0 / 133.0 -> 93.5 / 106.5 / 123.0; 32 x top-4 Q4_K within 0.6 at T = 32-128, 81.0
# -> 78.9 at 512, Q5_K 72.8 / 74.5 / 116.8 -> 66.7 / 67.6 / 92.1; dense 4096x14336 Q5_K T = 64 / 512 40.3 / 114.1
# -> 38.2 / 112.4, but Q4_K 34.8 / 105.1 -> 35.2 / 108.2 (its n256 build spills the A slots' bookkeeping).
# The schedules are the codecs' BLOCK_BOX, the box's row pitch their ROW_BOX_PITCH; a dict here for the tests to patch.
NIBBLE_BLOCK_BOX = {f: c.BLOCK_BOX for f, c in codecs.CODECS.items() if hasattr(c, "BLOCK_BOX")}


# The register-A builds whose A fragments take x in its natural K order (codecs.q4_k.RegA natural): the dense ones
# of these formats (the converting builds' converters write that order too), not the prepared or grouped builds
# (dequantize_<fmt>_frags and moe_gather keep layouts.q4k_rega_k_order).
# mul_mat then hands them an fp16 x as it is (a tensor map over the caller's x: no permute_f16 launch), an fp32 one
# through convert_f16. The price: four 2-byte shared loads and two prmt a row and K-step where the permuted order
# takes one 8-byte load (bench/NOTES.md, 2026-12-05 night: permute_f16 costs 1.6-7.4 µs an op at T = 512).
RA_NATURAL_FORMATS: tuple = ("q4_K", "q5_K", "q6_K", "q8_0")


def _natural_k(spec: MmqSpec) -> bool:
    """Whether the build reads x in its natural K order: a register-A decode of RA_NATURAL_FORMATS, or the f16a
    builds (A as fp16 rows)."""
    return (spec.a_regs and spec.fmt in RA_NATURAL_FORMATS and not spec.grouped and not spec.prepared
            and not spec.int_weights) or (spec.prepared and not spec.a_regs)


def _block_box(spec: MmqSpec) -> bool:
    """Whether the build keeps a codec's boxes in A slots of their own (one box a block, RA_BOX_STEPS K-steps; the
    nibble codecs where NIBBLE_BLOCK_BOX says)."""
    if not spec.a_regs or spec.prepared or spec.convert or spec.cluster > 1:
        return False
    if spec.fmt in NIBBLE_PARTS:
        return ("grouped" if spec.grouped else "dense") in NIBBLE_BLOCK_BOX.get(spec.fmt, ())
    c = codecs.get(spec.fmt)
    return (spec.fmt in RA_CODECS and getattr(c, "RA_BOX_STEPS", 1) > 1
            and spec.bn <= getattr(c, "RA_BLOCK_BOX_MAX_BN", 256))


def _box_step_mask(spec: MmqSpec) -> int:
    """K-steps a block box serves, less one (the nibble codecs: a block's 4 sub-block pairs)."""
    return getattr(codecs.get(spec.fmt), "RA_BOX_STEPS", 4) - 1
GROUPED_WGMMA_FORMATS = ("q4_K", "q5_K", "q8_0", "q6_K", "tq4_1s")  # the register-A MoE GEMMs mul_mat_id dispatches
# _rega_steps' codecs: 16-byte columns a step (header, [qh lo, qh hi,] qs lo, hi), the codecs' NIBBLE_COLUMNS
NIBBLE_PARTS = {f: c.NIBBLE_COLUMNS for f, c in codecs.CODECS.items() if hasattr(c, "NIBBLE_COLUMNS")}
RA_CODEC_TOKEN_TILES = (64, 128, 256)


class _WgWeights(NamedTuple):
    """How a codec's weights reach a wgmma build's K loop: the raw bytes of one ring stage, the producer's TMA of a
    K-step (tma(b, tw, s, row, stage, raw_bytes, raw0, fb)) and the register-A consumer's K loop (_rega_steps'
    signature)."""
    raw_bytes: int
    tma: Callable
    steps: Callable


def _wg_weights(spec: MmqSpec) -> _WgWeights:
    """Q4_K's 16-byte raw columns and nibble decode (Q5_K: with its qh columns and fifth bits: NIBBLE_PARTS), or a
    codec's own box of whole blocks and ra_fragments (RA_CODECS)."""
    if spec.fmt in NIBBLE_PARTS:
        qh = hasattr(codecs.get(spec.fmt), "QH_OFFSET")  # a nibble codec with qh columns (Q5_K)
        if _block_box(spec):  # the block's rows: one box of ROW_BOX_PITCH bytes x 128 rows
            box = _row_box(spec.fmt)
            return _WgWeights(spec.bm * box[0], partial(_tma_block_row, fmt=spec.fmt),
                              partial(_rega_steps, qh=qh, block_scales=_block_scales_fit(spec, qh), row_box=box,
                                      codec=codecs.get(spec.fmt), natural=_natural_k(spec),
                                      min_lo=min_lo_sums(spec)))
        return _WgWeights(NIBBLE_PARTS[spec.fmt] * RAW_PART, partial(_tma_raw_tile, fmt=spec.fmt),
                          partial(_rega_steps, qh=qh, block_scales=_block_scales_fit(spec, qh),
                                  codec=codecs.get(spec.fmt), natural=_natural_k(spec)))
    codec = _ra_codec(spec)

    pitch = _ra_box_bytes(spec)
    G = spec.row_group

    def tma(b, tw, s, row, stage, raw_bytes, raw0, fb, k=None):  # one box of the step's (or the block's) whole blocks
        rdst = b.op("mad.lo.u32", stage, Imm(raw_bytes, "u32"), raw0)
        if G > 1:  # ROW_GROUP_NOTE: row r of each group by its own box, into tile rows r·span ..
            rb = _row_bytes(b, codec, k)
            grow = b.op("shr.u32", row, Imm(G.bit_length() - 1, "u32"))
            for r in range(G):
                off = None if r == 0 else b.op("mul.lo.u32", rb, Imm(r, "u32"))
                b.emit(TMA_STEP, Mem(rdst, r * (BM // G) * pitch), TensorRef(tw, (codec.ra_box_column(b, s, off), grow)),
                       Mem(fb))
            return
        col = codec.ra_box_column(b, s)
        if pitch > 256:  # a u32 map (the box's 256-element limit): the column in words
            col = b.op("shr.u32", col, Imm(2, "u32"))
        b.emit(TMA_STEP, Mem(rdst), TensorRef(tw, (col, row)), Mem(fb))
    return _WgWeights(BM * pitch, tma, partial(_codec_rega_steps, codec, pitch=pitch, natural=_natural_k(spec),
                                               row_group=G))


def _row_bytes(b, codec, K):
    """A codec's bytes a row of K weights (a register): K / its block's weights x its block's bytes."""
    from ptxgen import formats

    f = formats.get(codec.FMT)
    return b.op("mul.lo.u32", b.op("shr.u32", K, Imm(f.block_size.bit_length() - 1, "u32")), Imm(f.block_bytes, "u32"))


def _ra_box_bytes(spec: MmqSpec) -> int:
    """A register-A codec's box width (and its rows' pitch in shared memory): a K-step's, or with block boxes
    (_block_box) a block's where the codec has one of its own (RA_BLOCK_BOX_BYTES: Q8_0's 272)."""
    codec = _ra_codec(spec)
    return getattr(codec, "RA_BLOCK_BOX_BYTES", codec.RA_BOX_BYTES) if _block_box(spec) else codec.RA_BOX_BYTES


def _row_box(fmt: str) -> tuple:
    """A nibble codec's block-box geometry for RegA: (row pitch, qs offset, qh offset) in bytes."""
    c = codecs.get(fmt)
    return c.ROW_BOX_PITCH, getattr(c, "QS_OFFSET", c.HEADER_BYTES), getattr(c, "QH_OFFSET", 0)


def _block_scales_fit(spec: MmqSpec, qh: bool) -> bool:
    """Whether the lane's 8 block-scale registers (codecs.q4_k.RA_BLOCK_SCALES) fit beside the build's own: not in
    Q5_K's paired builds (80 registers a thread with its qh words) nor n192 (168 under the relocatable compile,
    RA_RELOCATABLE_MAX_BN); both spilled."""
    return not ((qh and _wg_regs(spec)[0] == 2) or 128 < spec.bn <= RA_RELOCATABLE_MAX_BN)


def _ra_codec(spec: MmqSpec):
    """The codec module whose register-A decode a non-Q4_K wgmma build runs."""
    if spec.fmt not in RA_CODECS:
        raise ValueError(f"{spec.name}: no register-A decode for {spec.fmt} (have: q4_K, {', '.join(RA_CODECS)})")
    return codecs.get(spec.fmt)


# a diagnostic build (bench/probe_build_ab.py --variant), never shipped, wrong y: a codec's register-A K loop
# (_codec_rega_steps: Q8_0's, Q6_K's, TQ4_1S's dense and grouped builds) with A = 1.0 halves instead of the decode,
# the ring and A slots still waited for and given back — what the decode costs in the loop
# (study_q8_0_t4096_2026-12-06.md)
RA_NODECODE = False


def _codec_rega_steps(codec, b, arch, BN, S, acc, s, s_begin, s_end, gc, full, empty, raw0, raw_bytes, bst, b_bytes,
                      ct, cw, lane, magic, peers=(), lay=None, *, pitch: int, natural: bool = False, row_group: int = 1,
                      k=None):
    """Another codec's register-A K loop (mmq_<fmt>_wgmma_ra_*; _rega_steps' signature, magic unused): lane (g, t) of
    consumer warp cw decodes rows 16·cw + g and + 8 of the stage's box by the codec's ra_fragments, in the K order
    of layouts.q4k_rega_k_order, into _ra_k_loop. With `lay` (a codec whose box holds a block: RA_BOX_STEPS): the
    box is in A slot a_count % a_slots — waited for at the item's first step and every block's first, step s reading
    it codec.ra_step_offset bytes in, released after the item's last step and every block's last."""
    g = b.op("shr.u32", lane, Imm(2, "u32"))
    t = b.op("and.b32", lane, Imm(3, "b32"))
    row0 = b.op("mad.lo.u32", cw, Imm(16, "u32"), g)
    row_offs = [b.op("mul.lo.u32", b.op("add.u32", row0, Imm(8 * rr, "u32")), Imm(pitch, "u32"))
                for rr in range(2)]
    nat = {"natural": True} if natural else {}  # (TQ4_1S's ra_fragments has no natural form)
    if row_group > 1:  # ROW_GROUP_NOTE: warp cw's 16 rows are row r = cw of their groups, starting (r·row bytes) & 15
        assert BM // row_group == 16, "a warp's rows must be one row of the groups"
        nat["phase"] = b.op("and.b32", b.op("mul.lo.u32", cw, _row_bytes(b, codec, k)), Imm(15, "b32"))

    def fragments(stage):
        if RA_NODECODE:  # (diagnostic: A = 1.0 halves)
            if lay is not None:
                _a_slot_give(b, lay, s, s_end, _a_slot_take(b, lay, s, s_begin))
            return [[b.op("mov.b32", Imm(0x3C003C00, "b32")) for _ in range(4)] for _ in range(4)]
        if lay is None:
            return codec.ra_fragments(b, b.op("mad.lo.u32", stage, Imm(raw_bytes, "u32"), raw0), row_offs, s, t,
                                      **nat)
        sl = _a_slot_take(b, lay, s, s_begin)
        off = codec.ra_step_offset(b, s)
        frags = codec.ra_fragments(b, b.op("add.u32", lay.a_slot(sl), off), row_offs, s, t, **nat)
        _a_slot_give(b, lay, s, s_end, sl)
        return frags
    _ra_k_loop(b, arch, BN, S, acc, s, s_begin, s_end, gc, full, empty, bst, b_bytes, peers, fragments)


def _iw_steps(b, codec, arch, BN, lay: _WgRing, acc, y, ym, s, s_begin, s_end, gc, cw, lane, magic, peers):
    """IntA, the integer-weight K loop of the grouped Q4_K build (mmq_q4_k_wgmma_iw_*): a super-block (4 K-steps,
    static in the loop body; items start at block 0, K a multiple of 256) at a time. A = q·sc' exact in fp16 (one
    fma a weight pair: codecs.q4_k.RegA integer), the block's 16 k16 MMAs into `acc` (the first with scale-d 0);
    after its last: wait_group 0, y += d·acc in fp32 (d of rows g, g + 8), then two k16 MMAs into y for the min
    term — A = [−dmin·m hi | hi] and [lo | 0] of sub-blocks 2t, 2t + 1 (RegA.min_fragments, from the header still
    in the A slot), B = the block's Σx tile [hi of sub-blocks 0-7 | lo] (moe_gather_sums; the stage's
    Σx slot, no swizzle: LBO BN·16, SBO 128) — committed as their own group: the next step's wait_group 1 retires
    them before their stage is released. Its stages are block stages (lay.bs = 4): a stage holds the block's
    4 B tiles and its Σx: waited for at its step 0, released at the next block's step 0 (or the item's end)."""
    dec = codec.RegA(b, lane, cw, s, RAW_PART, False, s_begin, True, _row_box(codec.FMT), integer=True)
    top = b.label("iw_block")
    b.place(top)
    sl = _block_slot(b, lay)
    slot = lay.a_slot(sl)
    stage = None
    assert lay.bs == 4  # (its Σx slot is a block's)
    for st in range(4):
        if st == 0:
            stage = _block_stage_wait(b, lay, gc)
            _block_slot_wait(b, lay, sl)
        a = dec.fragments(b, slot, magic, b.op("mov.u32", Imm(32 * st, "u32")))
        if st == 3:  # (from the header, before the slot goes back)
            mins, d = dec.min_fragments(b, slot, magic)
            _block_slot_give(b, lay, sl)
        dbs = _block_descs(b, lay, stage, st)
        b.emit("wgmma.fence.sync.aligned")
        for kk in range(BK // 16):
            b.emit(ir_wgmma(arch, BN, "f16", b.vec(acc), b.vec(a[kk]), dbs[kk], scale_d=0 if st == kk == 0 else 1))
        if st < 3:  # the previous block's stage goes back at step 0 (its min MMAs retired)
            _block_step_done(b, lay, stage, st, gc, s, s_begin, peers)
            continue
        b.emit("wgmma.commit_group.sync.aligned")
        b.emit("wgmma.wait_group.sync.aligned", Imm(0, "u32"))  # the block's MMAs (and the last min MMAs) done
        for i, v in enumerate(acc):  # fragment i: row g (i % 4 < 2) or g + 8
            b.emit("fma.rn.f32", y[i], v, d[(i % 4) // 2], y[i])
        desc = _sums_desc(b, lay, stage, BN)
        b.emit("wgmma.fence.sync.aligned")
        for m in mins:
            b.emit(ir_wgmma(arch, BN, "f16", b.vec(ym), b.vec(m), desc))
        b.emit("wgmma.commit_group.sync.aligned")
        b.emit("add.u32", gc, gc, Imm(1, "u32"))
        b.emit("add.u32", s, s, Imm(1, "u32"))
    b.bra(top, pred=b.op("setp.lt.u32", s, s_end))
    _block_drain(b, lay, gc, peers)


def _sums_desc(b, lay: _WgRing, stage, BN):
    """The wgmma B descriptor of the stage's Σx tile [hi of sub-blocks 0-7 | lo], BN rows (no swizzle: LBO BN·16,
    SBO 128): the min-term MMAs' B (_iw_steps, and _rega_steps' −m_lo)."""
    base = layouts.wgmma_descriptor(0, BN * 16, 128, "none")
    lo = b.op("or.b32", b.op("shr.u32", lay.sums(stage), Imm(4, "u32")), Imm(base & 0xFFFFFFFF, "b32"))
    return b.op("mov.b64", b.vec([lo, b.op("mov.b32", Imm(base >> 32, "b32"))]), type="b64")


# The block-stage protocol (lay.bs = 4, or 2: half a block; the grouped builds, whose items are whole blocks) both
# K loops share.
def _block_stage_wait(b, lay: _WgRing, gc):
    """At a stage's first step (st % bs == 0): its stage ((gc / bs) % S), waited for until full. Returns it."""
    blk = b.op("shr.u32", gc, Imm(lay.bs.bit_length() - 1, "u32"))
    stage = b.op("rem.u32", blk, Imm(lay.S, "u32"))
    _wait(b, lay.full(stage), b.op("and.b32", b.op("div.u32", blk, Imm(lay.S, "u32")), Imm(1, "b32")))
    return stage


def _block_descs(b, lay: _WgRing, stage, st):
    """Step st's B tile of the stage: its k16 slices' descriptors."""
    tile = b.op("add.u32", b.op("shl.b32", stage, Imm(lay.bs.bit_length() - 1, "u32")), Imm(st % lay.bs, "u32"))
    return _desc_steps(b, b.op("mad.lo.u32", tile, Imm(lay.b_bytes, "u32"), lay.bst), BK // 16)


def _block_step_done(b, lay: _WgRing, stage, st, gc, s, s_begin, peers):
    """After step st's wgmmas: commit, retire the step before; at a stage's first step the previous stage goes back
    (not at the item's first); advance gc and s."""
    b.emit("wgmma.commit_group.sync.aligned")
    b.emit("wgmma.wait_group.sync.aligned", Imm(1, "u32"))
    if st % lay.bs == 0:
        S = lay.S
        _release(b, lay.empty, b.op("rem.u32", b.op("add.u32", stage, Imm(S - 1, "u32")), Imm(S, "u32")), peers,
                 b.op("setp.gt.u32", s, s_begin))
    b.emit("add.u32", gc, gc, Imm(1, "u32"))
    b.emit("add.u32", s, s, Imm(1, "u32"))


def _block_drain(b, lay: _WgRing, gc, peers):
    """After an item's last block: its wgmmas done, its stage back."""
    b.emit("wgmma.wait_group.sync.aligned", Imm(0, "u32"))
    S = lay.S
    last = b.op("rem.u32", b.op("add.u32", b.op("shr.u32", gc, Imm(lay.bs.bit_length() - 1, "u32")), Imm(S - 1, "u32")),
                Imm(S, "u32"))
    _release(b, lay.empty, last, peers)


def _block_slot(b, lay: _WgRing):
    """The block's A slot: a_count % a_slots."""
    return b.op("rem.u32", lay.a_count, Imm(lay.a_slots, "u32"))


def _block_slot_wait(b, lay: _WgRing, sl):
    """At the block's step 0: until its box has landed in A slot sl."""
    _wait(b, lay.a_full(sl), b.op("and.b32", b.op("div.u32", lay.a_count, Imm(lay.a_slots, "u32")), Imm(1, "b32")))


def _block_slot_give(b, lay: _WgRing, sl):
    """After the block's last reads of A slot sl (this thread's): the slot goes back."""
    b.emit("mbarrier.arrive.shared::cta.b64", b.reg("b64"), Mem(lay.a_empty(sl)))
    b.emit("add.u32", lay.a_count, lay.a_count, Imm(1, "u32"))


def _a_slot_take(b, lay: _WgRing, s, s_begin):
    """A consumer's A slot for K-step s (slot a_count % a_slots), waited for at the item's first step and at every
    block's first (s & a_mask == 0). Returns the slot index."""
    mask = lay.a_mask
    sl = b.op("rem.u32", lay.a_count, Imm(lay.a_slots, "u32"))
    waited = b.label("a_box_ready")
    first = b.op("or.pred", b.op("setp.eq.u32", s, s_begin),
                 b.op("setp.eq.u32", b.op("and.b32", s, Imm(mask, "b32")), Imm(0, "u32")))
    b.bra(waited, pred=first, neg=True)
    _wait(b, lay.a_full(sl), b.op("and.b32", b.op("div.u32", lay.a_count, Imm(lay.a_slots, "u32")), Imm(1, "b32")))
    b.place(waited)
    return sl


def _a_slot_give(b, lay: _WgRing, s, s_end, sl):
    """After K-step s's reads of A slot sl: released at the item's last step and every block's last."""
    mask = lay.a_mask
    done = b.label("a_box_kept")
    last = b.op("or.pred", b.op("setp.eq.u32", b.op("add.u32", s, Imm(1, "u32")), s_end),
                b.op("setp.eq.u32", b.op("and.b32", s, Imm(mask, "b32")), Imm(mask, "u32")))
    b.bra(done, pred=last, neg=True)
    b.emit("mbarrier.arrive.shared::cta.b64", b.reg("b64"), Mem(lay.a_empty(sl)))  # after this thread's reads
    b.emit("add.u32", lay.a_count, lay.a_count, Imm(1, "u32"))
    b.place(done)


def _ra_k_loop(b, arch, BN, S, acc, s, s_begin, s_end, gc, full, empty, bst, b_bytes, peers, fragments):
    """The register-A K loop both A sources share: unrolled twice (two A register sets by step parity; wait_group
    1 retires the step before), each step waits for its ring stage, takes `fragments(stage)` (the 4 k16 slices' A
    registers) and issues the step's wgmmas on the stage's B tile."""
    c_step, c_done = b.label("c_step"), b.label("c_steps_done")
    b.place(c_step)
    for half in range(RA_UNROLL):
        stage = b.op("rem.u32", gc, Imm(S, "u32"))
        sph = b.op("and.b32", b.op("div.u32", gc, Imm(S, "u32")), Imm(1, "b32"))
        _wait(b, full(stage), sph)
        a = fragments(stage)
        dbs = _desc_steps(b, b.op("mad.lo.u32", stage, Imm(b_bytes, "u32"), bst), BK // 16)
        b.emit("wgmma.fence.sync.aligned")
        for kk in range(BK // 16):
            b.emit(ir_wgmma(arch, BN, "f16", b.vec(acc), b.vec(a[kk]), dbs[kk]))
        _wgmma_step_done(b, S, gc, s, s_begin, empty, peers)
        more = b.op("setp.lt.u32", s, s_end)
        if half < RA_UNROLL - 1:
            b.bra(c_done, pred=more, neg=True)
        else:
            b.bra(c_step, pred=more)
    b.place(c_done)
    _wgmma_drain(b, S, gc, empty, peers)


def _ra_block_loop(b, arch, BN, lay: _WgRing, acc, s, s_begin, s_end, gc, peers, fragments, after=None):
    """_ra_k_loop over block stages (lay.bs = 4; items whole blocks): a block's 4 steps are the loop body, its
    stage waited for at step 0 and the previous block's released there (once wait_group 1 retired that block's last
    step), `fragments(stage, st)` each step's A registers, the last block's stage released after the item.
    `after(stage, st)`: more MMAs of the step, after its own, in its commit group."""
    top = b.label("c_block")
    b.place(top)
    stage = None
    for st in range(4):
        if st % lay.bs == 0:
            stage = _block_stage_wait(b, lay, gc)
        a = fragments(stage, st)
        dbs = _block_descs(b, lay, stage, st)
        b.emit("wgmma.fence.sync.aligned")
        for kk in range(BK // 16 if not GROUPED_SKELETON.startswith("skeleton") else 0):
            b.emit(ir_wgmma(arch, BN, "f16", b.vec(acc), b.vec(a[kk]), dbs[kk]))
        if after is not None:
            after(stage, st)
        _block_step_done(b, lay, stage, st, gc, s, s_begin, peers)
    b.bra(top, pred=b.op("setp.lt.u32", s, s_end))
    _block_drain(b, lay, gc, peers)


def _prepared_steps(b, arch, BN, S, acc, s, s_begin, s_end, gc, full, empty, raw0, raw_bytes, bst, b_bytes, ct, cw,
                    lane, magic, peers=()):
    """The prepared build's K loop (mmq_q4_k_wgmma_pre_*; _rega_steps' signature, cw / lane / magic unused): the
    register-A loop with each step's A fragments loaded from the stage as dequantize_q4_k_frags wrote them
    (ptxgen.layouts.q4k_rega_fragments: slice kk, thread ct at 16·(256·kk + ct): 4 conflict-free 16-byte loads)."""
    mine = b.op("shl.b32", ct, Imm(4, "u32"))

    def fragments(stage):
        src = b.op("add.u32", b.op("mad.lo.u32", stage, Imm(raw_bytes, "u32"), raw0), mine)
        a = [b.regs("b32", 4) for _ in range(BK // 16)]
        for kk in range(BK // 16):
            b.emit("ld.shared.v4.b32", b.vec(a[kk]), Mem(src, kk * 256 * 16))
        return a
    _ra_k_loop(b, arch, BN, S, acc, s, s_begin, s_end, gc, full, empty, bst, b_bytes, peers, fragments)


PREPARED_CX_STEPS = 2  # the prepared converting build's conversion units: 2 K-steps, so 4 ring stages of 48 KB fit
# beside the staging buffers (3 stages with 4-step units measured 11-19% slower at T = 1024-4096, 2026-12-01)
PREPARED_NOTE = ("A is dequantized before the GEMM by dequantize_q4_k_frags (float32 as ggml, rounded once to fp16) "
                 "into the register-A fragments in K-step blocks (ptxgen.layouts.q4k_rega_fragments); each ring stage "
                 "takes one 16 KB block by TMA and every consumer thread loads its 16 registers with 4 16-byte loads: "
                 "the K loop holds no dequant, at the price of the extra pass (weights read once, ceil(M/128)·128·K·2 "
                 "bytes written and read back)")
F16A_NOTE = ("the weights are dequantized before the GEMM by dequantize_<fmt> (float32 as ggml, rounded once to fp16: "
             "the prepared fragments' values) into fp16 rows (M, K); each ring stage takes the M tile's 128 rows of "
             "its K-step by one 128B-swizzled TMA (16 KB) beside the activation tile, and each consumer warpgroup "
             "issues its wgmmas with both operands in shared memory (a plain fp16 GEMM, as cuBLAS's): no dequant, "
             "no A registers, at the price of the extra pass (weights read once, M·K·2 bytes written and read back)")
F16A_TOKEN_TILES = (256,)  # the f16a builds (not shipped until timed: bench/NOTES.md 2026-12-07)
PREPARED_TOKEN_TILES = (256,)  # the prepared builds (large T: the extra pass is amortised over many token tiles)


WGMMA_TOKEN_TILES = (32, 64, 128, 256)
# two K-splits: the second CTA adds the first's partial into its accumulators, this many fragments at a time
# (registers beside the live accumulators; 0: the general fixup). Keyed by (A from registers, token tile).
PAIR_CHUNK = {(True, 256): 16, (True, 192): 8, (True, 128): 8, (False, 256): 4, (False, 128): 8, (False, 64): 8,
              (False, 32): 8}
RA_UNROLL = 2  # register-A K loop copies: 2 register sets (1 would overwrite A under the previous step's wgmma)
# stream-K builds (STREAM_NOTE; not shipped until timed): the register-A GEMMs where the tiles fill the CTAs' rounds
# unevenly (14336x4096 at T = 512: 224 n256 tiles on 132 CTAs, 1.7 rounds)
STREAM_FORMATS = ("q4_K", "q5_K", "q6_K", "q8_0", "tq4_1s")
STREAM_TOKEN_TILES = (128, 256)
# cluster split-K builds (CSPLIT_NOTE): the split tiles of small-M prefill ops (1024x4096 at T = 512: 32 n128 tiles
# split 4 ways; 4096x4096: 64 n256 tiles split 2 ways), whose fixup tail (partials to L2, the last CTA's sums) ~4 µs
CSPLIT_FORMATS = ("q4_K", "q6_K")
CSPLIT_TOKEN_TILES = (64, 128, 256)
WGMMA_RA_TOKEN_TILES = (64, 128, 192, 256)  # the register-A build: A fragments (2 sets x 16) beside 64-128 accumulators
WGMMA_MC_TOKEN_TILES = (128, 256)  # register-A builds in clusters of 2 (correct on the H200; within 1% of the
# single-CTA build at T = 256-4096, so not dispatched: bench/NOTES.md, 2026-11-30)
WGMMA_CX_TOKEN_TILES = (64, 128, 256)  # register-A builds that convert x inside the launch (n64: from the rule
# mmq_cx_min_tokens down to 9 tokens it would save the convert_f16_perm launch of small calls; not yet timed)
WGMMA_CX_CODECS = ("q8_0", "q5_K")  # codecs with converting register-A builds too (their boxes a step, no A slots:
# Q6_K's block boxes and the staging buffers leave 3 stages, and its large T runs the prepared build)
RA_RELOCATABLE_MAX_BN = 192  # above, it fits only with setmaxnreg honoured: compiled whole-program (driver JIT)
# the dense register-A GEMM's other work schedules, as MmqSpec flags: (formats, token tiles, what the schedule does)
RA_SCHEDULES = {
    "stream": (STREAM_FORMATS, STREAM_TOKEN_TILES, "stream-K: every CTA the same K-steps of the tiles laid end to end, "
                                                   "a tile cut by a CTA's boundary split-K over them"),
    "csplit": (CSPLIT_FORMATS, CSPLIT_TOKEN_TILES, "cluster split-K: a tile's K splits are one cluster's CTAs, summed "
                                                   "through distributed shared memory")}


def kernel_defs() -> list[KernelDef]:
    return [KernelDef(MmqSpec(bn).name, f"Q4_K prefill GEMM, fp16 mma.sync, {BM}x{bn} tile",
                      lambda arch, s=MmqSpec(bn): build(arch, s), archs=("sm_89", "sm_120a"))
            for bn in TOKEN_TILES] + \
        [KernelDef(MmqSpec(bn, fused=False).name, f"Q4_K prefill GEMM, fp16 mma.sync on fp16 x (convert_f16 "
                   f"first), {BM}x{bn} tile", lambda arch, s=MmqSpec(bn, fused=False): build(arch, s),
                   archs=("sm_89", "sm_120a"))
         for bn in TOKEN_TILES] + \
        [KernelDef(MmqSpec(bn, fused=fu, fmt=f).name, f"{f} prefill GEMM, fp16 mma.sync on "
                   f"{'fp32 x converted in the load pipeline' if fu else 'fp16 x (convert_f16 first)'}, the weights "
                   f"decoded by the codec's run8 from global memory, {BM}x{bn} tile",
                   lambda arch, s=MmqSpec(bn, fused=fu, fmt=f): build(arch, s), archs=("sm_89", "sm_120a"))
         for f in F16_CODECS for bn in TOKEN_TILES for fu in (True, False)] + \
        [KernelDef(MmqSpec(bn, "wgmma").name, f"Q4_K prefill GEMM, wgmma + TMA, {BM}x{bn} tile",
                   lambda arch, s=MmqSpec(bn, "wgmma"): build(arch, s), archs=("sm_90a",))
         for bn in WGMMA_TOKEN_TILES] + \
        [KernelDef(MmqSpec(bn, "wgmma", a_regs=True).name,
                   f"Q4_K prefill GEMM, wgmma with A from registers + TMA, {BM}x{bn} tile", lambda arch, s=MmqSpec(bn, "wgmma", a_regs=True): build(arch, s), archs=("sm_90a",))
         for bn in WGMMA_RA_TOKEN_TILES] + \
        [KernelDef(MmqSpec(bn, "wgmma", a_regs=True, convert=True).name,
                   f"Q4_K prefill GEMM, wgmma with A from registers, fp32 x converted inside the launch (no "
                   f"convert_f16_perm), {BM}x{bn} tile", lambda arch, s=MmqSpec(bn, "wgmma", a_regs=True, convert=True):
                   build(arch, s), archs=("sm_90a",))
         for bn in WGMMA_CX_TOKEN_TILES] + \
        [KernelDef(MmqSpec(bn, "wgmma", a_regs=True, convert=cx, prepared=True).name,
                   f"Q4_K prefill GEMM on prepared fp16 A fragments (dequantize_q4_k_frags first), wgmma with A from "
                   f"registers{', fp32 x converted inside the launch' if cx else ''}, {BM}x{bn} tile",
                   lambda arch, s=MmqSpec(bn, "wgmma", a_regs=True, convert=cx, prepared=True): build(arch, s),
                   archs=("sm_90a",))
         for bn in PREPARED_TOKEN_TILES for cx in (False, True)] + \
        [KernelDef(MmqSpec(bn, "wgmma", convert=cx, prepared=True).name,
                   f"prefill GEMM on the weights dequantized to fp16 rows first (dequantize_<fmt>; F16A_NOTE), wgmma "
                   f"with A and B from shared memory by TMA{', fp32 x converted inside the launch' if cx else ''}, "
                   f"{BM}x{bn} tile", lambda arch, s=MmqSpec(bn, "wgmma", convert=cx, prepared=True): build(arch, s),
                   archs=("sm_90a",))
         for bn in F16A_TOKEN_TILES for cx in (False, True)] + \
        [KernelDef(MmqSpec(bn, "wgmma", a_regs=True, cluster=2).name,
                   f"Q4_K prefill GEMM, wgmma with A from registers, clusters of 2 CTAs multicasting the activation "
                   f"tile, {BM}x{bn} tile per CTA", lambda arch, s=MmqSpec(bn, "wgmma", a_regs=True, cluster=2): build(arch, s),
                   archs=("sm_90a",))
         for bn in WGMMA_MC_TOKEN_TILES] + \
        [KernelDef(MmqSpec(bn, act="q8_1", fused=f).name,
                   f"Q4_K prefill GEMM, int8 mma.sync x Q8_1 ({'fused quantization' if f else 'quantize_q8_1 first'}), "
                   f"{BM}x{bn} tile", lambda arch, s=MmqSpec(bn, act="q8_1", fused=f): build(arch, s),
                   archs=("sm_89", "sm_120a"))
         for bn in Q8_TOKEN_TILES for f in (True, False)] + \
        [KernelDef(MmqSpec(bn, grouped=True, fmt=f).name,
                   f"{f} MoE GEMM (mul_mat_id), fp16 mma.sync, {BM}x{bn} tiles of one expert's rows and token pairs "
                   f"(moe_group's work list)", lambda arch, s=MmqSpec(bn, grouped=True, fmt=f): build(arch, s),
                   archs=("sm_89", "sm_90a", "sm_120a"))
         for f in GROUPED_FORMATS for bn in GROUPED_TOKEN_TILES] + \
        [KernelDef(MmqSpec(bn, "wgmma", a_regs=True, grouped=True, fmt=f).name,
                   f"{f} MoE GEMM (mul_mat_id), wgmma with A from registers + TMA, {BM}x{bn} tiles of one expert's "
                   f"rows and token pairs (moe_gather's work list and gathered x)",
                   lambda arch, s=MmqSpec(bn, "wgmma", a_regs=True, grouped=True, fmt=f): build(arch, s),
                   archs=("sm_90a",))
         for f in GROUPED_WGMMA_FORMATS for bn in GROUPED_WGMMA_TOKEN_TILES] + \
        [KernelDef(MmqSpec(bn, "wgmma", a_regs=True, grouped=True).name,
                   f"Q4_K MoE GEMM (mul_mat_id), wgmma with A from registers + TMA, {BM}x{bn} tiles (between the "
                   f"formats' tiles: GROUPED_WGMMA_Q4K_TILES)", lambda arch, s=MmqSpec(bn, "wgmma", a_regs=True, grouped=True): build(arch, s),
                   archs=("sm_90a",))
         for bn in GROUPED_WGMMA_Q4K_TILES] + \
        [KernelDef(MmqSpec(bn, "wgmma", a_regs=True, grouped=True, bm=2 * BM).name,
                   f"Q4_K MoE GEMM (mul_mat_id), wgmma with A from registers + TMA, {2 * BM}x{bn} tiles: four consumer "
                   f"warpgroups share each activation tile (GROUPED_WIDE_TILES)",
                   lambda arch, s=MmqSpec(bn, "wgmma", a_regs=True, grouped=True, bm=2 * BM): build(arch, s),
                   archs=("sm_90a",))
         for bn in GROUPED_WIDE_TILES] + \
        [KernelDef(MmqSpec(bn, "wgmma", a_regs=True, grouped=True, int_weights=True).name,
                   f"Q4_K MoE GEMM (mul_mat_id), wgmma with A = q·sc' from registers (integer weights: d and the min "
                   f"term outside the K-step MMAs), {BM}x{bn} tiles (x and its sub-block sums gathered by "
                   f"moe_gather_sums)",
                   lambda arch, s=MmqSpec(bn, "wgmma", a_regs=True, grouped=True, int_weights=True): build(arch, s),
                   archs=("sm_90a",))
         for bn in GROUPED_IW_TOKEN_TILES] + \
        [KernelDef(MmqSpec(bn, "wgmma", a_regs=True, fmt=f).name,
                   f"{f} prefill GEMM, wgmma with A from registers decoded from the raw blocks (TMA), {BM}x{bn} tile",
                   lambda arch, s=MmqSpec(bn, "wgmma", a_regs=True, fmt=f): build(arch, s), archs=("sm_90a",))
         for f in RA_CODECS + ("q5_K",) for bn in RA_CODEC_TOKEN_TILES] + \
        [KernelDef(MmqSpec(bn, "wgmma", a_regs=True, convert=True, fmt=f).name,
                   f"{f} prefill GEMM, wgmma with A from registers decoded from the raw blocks (TMA), fp32 x "
                   f"converted inside the launch (no convert_f16_perm), {BM}x{bn} tile",
                   lambda arch, s=MmqSpec(bn, "wgmma", a_regs=True, convert=True, fmt=f): build(arch, s),
                   archs=("sm_90a",))
         for f in WGMMA_CX_CODECS for bn in WGMMA_CX_TOKEN_TILES] + \
        [KernelDef(MmqSpec(bn, "wgmma", a_regs=True, fmt=f, **{flag: True}).name,
                   f"{f} prefill GEMM as {MmqSpec(bn, 'wgmma', a_regs=True, fmt=f).name}, {what}",
                   lambda arch, s=MmqSpec(bn, "wgmma", a_regs=True, fmt=f, **{flag: True}): build(arch, s),
                   archs=("sm_90a",))
         for flag, (fmts, tiles, what) in RA_SCHEDULES.items() for f in fmts for bn in tiles] + \
        [KernelDef(MmqSpec(bn, "wgmma", a_regs=True, fmt=f, row_group=ROW_GROUP, csplit=cs).name,
                   f"{f} prefill GEMM as {MmqSpec(bn, 'wgmma', a_regs=True, fmt=f, csplit=cs).name} on rows that are "
                   f"not 16-byte multiples: {ROW_GROUP}-row groups (ROW_GROUP_NOTE)",
                   lambda arch, s=MmqSpec(bn, "wgmma", a_regs=True, fmt=f, row_group=ROW_GROUP, csplit=cs): build(arch, s),
                   archs=("sm_90a",))
         for f in ROW_GROUP_FORMATS for bn in RA_CODEC_TOKEN_TILES for cs in (False, True)] + \
        [KernelDef(MmqSpec(bn, "wgmma", a_regs=True, grouped=True, fmt=f, row_group=ROW_GROUP).name,
                   f"{f} MoE GEMM as {MmqSpec(bn, 'wgmma', a_regs=True, grouped=True, fmt=f).name} on rows that are "
                   f"not 16-byte multiples: {ROW_GROUP}-row groups (ROW_GROUP_NOTE)",
                   lambda arch, s=MmqSpec(bn, "wgmma", a_regs=True, grouped=True, fmt=f, row_group=ROW_GROUP): build(arch, s),
                   archs=("sm_90a",))
         for f in ROW_GROUP_FORMATS for bn in GROUPED_WGMMA_TOKEN_TILES]
