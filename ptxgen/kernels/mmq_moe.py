"""mmq_<fmt>_f16_n<BN>_moe: mul_mat_id's grouped GEMM — the fp16 mma.sync MMQ (kernels/mmq.py) with the grouped
schedule: y[p] = x[row(p)] @ W[e(p)].T for every (token, slot) pair p, the pairs of one expert multiplied together.

moe_group runs first and leaves, on the device, the pairs grouped by expert (`order`, `offsets`) and a work list of
(expert, token tile) entries. Persistent CTAs claim items (M tile, entry) from the atomic queue, the entry fastest
(an expert's token tiles follow each other, so its weight tile is read from L2 after the first). An item is the
dense kernel's item with three changes: the weights start at expert e's matrix (w + e·expert_bytes); the token rows
are the expert's pairs offsets[e] + tile·BN .. (clamped to its last), each gathered by `order` (x row p, or p /
slots where the slots share x); the epilogue stores row n of the tile to y's row order[n] (masked past the
expert's pairs and M). The K loop — raw Q4_K rows by cp.async, dequant and fp32 → fp16 conversion into double
buffers, mma.sync — is the dense one, unchanged; for Q5_K, Q6_K and Q8_0 (blocks not 16-byte aligned for
cp.async) each thread decodes its 32 weights of a step with the codec's run32 / run8 straight from global memory
(_codec_dequant) into the same A tile. No split-K: the work list has an item per expert and token
tile, enough to fill the GPU from a few hundred pairs. A non-finite product (an activation past fp16's range)
sets `flag`, as the dense kernel does."""
from __future__ import annotations

from .. import codecs
from ..codecs import _common
from ..arch import get_arch
from ..builder import KernelBuilder
from ..dsl import Pipeline
from ..ir import Imm, Mem
from ..specs import MmqSpec
from .mmq import (BM, F16_CTAS_PER_SM, STAGES, _claim, _codec_dequant, _f16_activations, _f16_dequant, _f16_mma,
                  _f16_smem_and_meta, _f16_tile, _f32_pipeline, _issue_raw, _next_item_or_exit, _tiles_m, _watch_finite,
                  describe)
from .moe_group import TILE_SHIFT


def build_grouped(arch, spec: MmqSpec):
    arch = get_arch(arch)
    _, _, _, sched, epilogue = describe(arch, MmqSpec(spec.bn))  # the dense spec's checks; cp.async everywhere
    pipe = Pipeline(STAGES, "cp.async")
    ft = _f16_tile(MmqSpec(spec.bn))
    BN = ft.BN
    pipe.check_smem(arch, ft.raw_bytes)
    codec = codecs.get(spec.fmt)
    raw = getattr(codec, "RAW_RING", False)  # Q4_K: its raw ring (cp.async) and dequant; the others: their codec's
    # run8, direct loads
    b = KernelBuilder(spec.name, arch, f"{spec.fmt} MoE GEMM (mul_mat_id), fp32 x gathered by pair, fp16 mma.sync, "
                      f"tile {BM}x{BN}, {'a 3-stage cp.async raw ring' if raw else 'weights decoded from global memory'}"
                      f", items from moe_group's work list", block=(256, 1, 1))
    w_p, x_p, y_p = b.param("w", "u64", "ptr:in"), b.param("x", "u64", "ptr:in"), b.param("y", "u64", "ptr:out")
    f_p = b.param("flag", "u64", "ptr:out")
    m_p, k_p, sl_p, ps_p = b.param("m", "u32"), b.param("k", "u32"), b.param("slots", "u32"), b.param("per_slot", "u32")
    eb_p = b.param("expert_bytes", "u64")
    ord_p, off_p = b.param("order", "u64", "ptr:scratch"), b.param("offsets", "u64", "ptr:scratch")
    wrk_p, q_p = b.param("work", "u64", "ptr:scratch"), b.param("queue", "u64", "ptr:scratch")
    smem, work = _f16_smem_and_meta(b, ft, pipe, sched, ring=raw)
    if not raw:  # a run8 decode holds more registers than Q4_K's: 80 (3 CTAs an SM at n32) spilled Q5_K and Q6_K
        b.directives = [d for d in b.directives if not d.startswith(".minnctapersm")] + [
            f".minnctapersm {min(2, F16_CTAS_PER_SM[BN])}"]
    b.meta.update(schedule="grouped", split_k="none", tail_split=False, fmt=spec.fmt,
                  work_queue="item = atom.add(queue[0], 1) → (M tile, entry) with the entry fastest: an expert's "
                             "token tiles follow each other; the last CTA to finish resets the queue",
                  activation="fp32 x (T, K) or (T, slots, K), gathered by pair; y (T, slots, M)",
                  grouping="moe_group first: order, offsets, work (its meta)")

    W0, X, Y0, F, Q = (b.ptr(p) for p in (w_p, x_p, y_p, f_p, q_p))
    ORD, OFF, WRK = (b.ptr(p) for p in (ord_p, off_p, wrk_p))
    M, K, SL = (b.ld_param(p, "u32") for p in (m_p, k_p, sl_p))
    shared_x = b.op("setp.eq.u32", b.ld_param(ps_p, "u32"), Imm(0, "u32"))
    EB = b.ld_param(eb_p, "u64")
    tid = b.special("tid.x")
    lane = b.op("and.b32", tid, Imm(31, "b32"))
    warp = b.op("shr.u32", tid, Imm(5, "u32"))
    bad = b.op("mov.b32", Imm(0, "b32"))
    tiles_m = _tiles_m(b, M)
    L = b.op("ld.global.u32", Mem(WRK))  # moe_group's entries (written before this launch, in stream order)
    L1 = b.op("max.u32", L, Imm(1, "u32"))
    slot = b.op("mov.u32", work)
    leader = b.op("setp.eq.u32", tid, Imm(0, "u32"))

    next_item, finish, item = _claim(b, Q, slot, leader, b.op("mul.lo.u32", tiles_m, L))
    mt, li = b.op("div.u32", item, L1), b.op("rem.u32", item, L1)
    entry = b.op("ld.global.u32", Mem(b.op("mad.wide.u32", li, Imm(4, "u32"), WRK), 4))
    e = b.op("and.b32", entry, Imm((1 << TILE_SHIFT) - 1, "b32"))
    offp = b.op("mad.wide.u32", e, Imm(4, "u32"), OFF)
    n0 = b.op("mad.lo.u32", b.op("shr.u32", entry, Imm(TILE_SHIFT, "u32")), Imm(BN, "u32"),
              b.op("ld.global.u32", Mem(offp)))
    tlast = b.op("sub.u32", b.op("ld.global.u32", Mem(offp, 4)), Imm(1, "u32"))  # the expert's last pair in order
    m0 = b.op("mul.lo.u32", mt, Imm(BM, "u32"))
    W = b.op("add.s64", W0, b.op("mul.lo.u64", b.op("cvt.u64.u32", e), EB))
    row_bytes = _common.row_bytes(b, codec, K)
    mlast = b.op("sub.u32", M, Imm(1, "u32"))
    s_begin, nsteps = b.op("mov.u32", Imm(0, "u32")), b.op("shr.u32", K, Imm(6, "u32"))
    if raw:
        copies = codec.raw_copies(b, tid, m0, mlast, row_bytes, W, BM, 256)

    def issue(step, stage=None):
        if raw:
            _issue_raw(b, copies, step, nsteps, raw0, STAGES, sdst=stage)
        else:  # nothing to copy ahead: an empty group keeps the pipeline's wait_group counts
            b.emit("cp.async.commit_group")

    def row_of(n):  # x's row of place n in the grouped order: its pair p, or p / slots where the slots share x
        pair = _pair(b, ORD, n)
        return b.op("selp.b32", b.op("div.u32", pair, SL), pair, shared_x, type="b32")

    raw0 = b.op("mov.u32", smem)
    a16 = b.op("add.u32", raw0, Imm(STAGES * ft.raw_bytes, "u32")) if raw else raw0  # the codecs: no raw ring
    b16 = b.op("add.u32", a16, Imm(ft.a_bytes, "u32"))
    load_x, _, store_x = _f16_activations(b, ft, tid, n0, tlast, K, X, s_begin, b16, row_of=row_of, tiny=bad)
    stage_of, dequant = _f16_dequant(b, codec, ft, tid, raw0, a16) if raw else _codec_dequant(b, codec, tid, m0,
                                                                                            mlast, row_bytes, W, a16)
    wm, wn, acc, mma_step = _f16_mma(b, arch, ft, warp, lane, a16, b16)

    def boff_of(stp):
        return b.op("mul.lo.u32", b.op("and.b32", b.op("sub.u32", stp, s_begin), Imm(1, "b32")), Imm(ft.pair, "u32"))

    _f32_pipeline(b, issue, load_x, store_x, dequant, mma_step, boff_of, stage_of, s_begin, nsteps, ft.pair, raw0,
                  ft.raw_bytes)
    _watch_finite(b, [r for row in acc for frag in row for r in frag], bad)
    b.comment("epilogue: tile column n → y's row order[n] (the pair), masked to the expert's pairs and m < M")
    epilogue.lower_mma_sync(b, acc, lane, m0, wm, 64, n0, wn, BN // 4, M, b.op("add.u32", tlast, Imm(1, "u32")), Y0,
                            col_row=scatter_rows(b, ORD, tlast))
    return _next_item_or_exit(b, next_item, finish, Q, leader, F, lambda: b.op("setp.ne.u32", bad, Imm(0, "u32")))


def _pair(b, ORD, n):
    """order[n]: the pair at place n of the grouped order."""
    return b.op("ld.global.u32", Mem(b.op("mad.wide.u32", n, Imm(4, "u32"), ORD)))


def scatter_rows(b, ORD, tlast):
    """The grouped epilogue's column → y row map (Epilogue.lower_mma_sync's col_row): place n of the expert's token
    tile is pair order[min(n, tlast)] (columns past the expert's last pair are masked by N = tlast + 1)."""
    return lambda n: _pair(b, ORD, b.op("min.u32", n, tlast))
