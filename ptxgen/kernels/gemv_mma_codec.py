"""The codecs' tensor-core decode GEMV (`gemv_<fmt>_mma`, T ≤ 8, exact): Q4_K's gemv_q4_k_mma schedule with the
weights decoded by the codec (`mma_block`), for block formats whose weight is a scale times an integer q, the
scale constant over 16 weights, with no min term (Q6_K: d·sc per 16; Q8_0: d per 32).

Why: the fp32 codec GEMV (kernels/gemv_codec.py) spends ~8 SASS instructions per weight (Q6_K at T = 1: 25 µs on
4096x14336, twice its read floor; T = 8 3.5x T = 1) — an FFMA per weight and token after the decode. Here the
weights stay integers on the tensor cores: A = q − 32 as fp16 (exact), B = the activation split into fp16 hi + lo
with one power of two per (token, super-block) (prep_mma_f16's tiles, as for Q4_K), one m16n8k16 MMA per
sub-block and B part summing Σ q·x over the sub-block's 16 weights (exact products, fp32 accumulation); then in
fp32 per sub-block S += sc·C and per super-block y += 2^-s·d·S. Every token of the 8 costs the same MMA, so T = 8
costs about what T = 1 does.

A warp owns 16 rows and walks K 256 weights per step; a step's rows come from the step's 16-byte aligned start (a
Q6_K block is only 2-byte aligned, Q8_0's 8 blocks of 34 bytes are 272: aligned) into MMA_SLOT_BYTES slots (rows
g = 0..7 in distinct banks): in the TMA build (rows a multiple of 16 bytes) as one 2D box of 16 rows x the slot,
issued by lane 0; in the bulk build as one bulk copy (cp.async.bulk) of MMA_BOX_BYTES per row, lane r < 16 copying
row r's, the last one ending exactly at the buffer's end where M rows are a multiple of 16 bytes (mul_mat asks
that). Lane (g, t) decodes rows g and g + 8: elements 4t .. 4t + 3 of each 16-element sub-block (the B
tiles' K order), reading 4-byte words. A row a multiple of 4 bytes (mul_mat asks that too) puts every row's step
at the same 2-byte phase, so the step body is emitted once per phase (Q6_K: even and odd steps) and each word
takes one load or, at a 2-byte offset, two and a prmt, known when the PTX is written. The next step's B tiles
are prefetched into L1 at each step's start. K is split as the few-token GEMVs' (gemv_t1): over the `kparts` warps
of a row tile, summed in the CTA, then over gridDim.y with the last-warp fixup, as the other GEMVs.

H200 (decode loop, 24 distinct 4096x14336 weights, graph-replayed): the bulk build 29-31 µs at every T from 1 to 8
(bench_op_q6k_mma_on.log; the fp32 GEMV: 25.5 / 33.4 / 51.1 / 89.5 at T = 1 / 2 / 4 / 8), the TMA build 27.1 / 27.4
/ 28.7 / 32.3 (bench_op_loop_tma_2026-12-02.log), 2.5x the PDL read floor (10.7): issue ~49% busy with 12 warps an
SM, no single stall above 2.2% of the samples (latency-bound). mul_mat runs it at T = 2-8, and at T = 1 for large M
(codec_mma_t1_min_rows: Q6_K's output layer 128256x4096 166.8 µs against the fp32 GEMV's 201.1).
"""
from __future__ import annotations

from .. import codecs
from ..builder import KernelBuilder
from ..formats import tq4_1s as T4
from ..ir import Imm, Mem, mma_sync
from ..specs import GemvKernel
from . import KernelDef
from .gemv import (_fill_ring, _fragment_epilogue, _mma_gemv_frame, _next_step, _sum_k_parts, _tile_pointer,
                   _tile_rows, _tma_step, _wait_step, _warp_rings, _warp_rows)

FORMATS = ("q6_K", "q8_0")  # codecs with mma_block (MMA_STEP_BYTES per 256 weights, MMA_BOX_BYTES, MMA_SLOT_BYTES)
NW = 4  # warps per CTA, 16 rows each
ROWS = 16
MAX_STAGES = 4  # ring stages a warp, at most (fewer where CTAS would not fit: Q8_0's 304-byte slots take 3)
SMEM_PER_SM = 227 * 1024
CTAS = 3  # resident CTAs per SM (~167 registers; 4 CTAs at 128 with one B set ahead measured 1-3 µs slower at T = 2-8)
GROUP_AHEAD = {1: (2, 4), 2: (1, 2)}  # token groups → (32-element blocks the B tiles load ahead, rotating register
# sets): the 16-token build holds two groups' sets in the registers of 3 CTAs an SM
STEP = 8  # 32-element blocks per step (one super-block)
BULK = "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"


def build(arch, fmt: str, NT: int = 1, tma: bool = False):
    """gemv_<fmt>_mma (NT = 1: up to 8 tokens) or gemv_<fmt>_mma_n16 (NT = 2: two groups of 8, each prepared by its
    own prep_mma_f16 into consecutive buffers — tiles 32·K bytes, factors K bytes a group — every A fragment
    feeding both groups' MMAs). `tma` (gemv_<fmt>_mma_tma): a step's 16 rows by one TMA box (MMA_SLOT_BYTES / 4
    u32 x 16 rows, its rows packed at the slots' pitch) issued by lane 0, for rows a multiple of 16 bytes (every
    row's step at the same 16-byte phase); the bulk build issues 16 copies a step, which ptxas serialises over
    the lanes (ELECT / R2UR / UBLKCP loop: ~16% of the stall samples at T = 1, ncu_q6k_mma_source_2026-12-02)."""
    codec = codecs.get(fmt)
    AHEAD, SETS = GROUP_AHEAD[NT]
    box, bbytes, SLOT = codec.MMA_BOX_BYTES, codec.MMA_STEP_BYTES, codec.MMA_SLOT_BYTES
    stage_bytes = ROWS * SLOT
    STAGES = min(MAX_STAGES, (SMEM_PER_SM // CTAS - 1024 - 128) // (NW * stage_bytes))
    name = GemvKernel("mma", fmt, 8 * NT, tma=tma).name
    b = KernelBuilder(name, arch, f"{fmt} GEMV (exact) for up to {8 * NT} tokens on mma.sync, the codec's integer "
                      f"weights x fp16 hi/lo activation, weights by {'TMA' if tma else 'bulk copies'}",
                      block=(32 * NW, 1, 1))
    w_p = b.param("tmap_w", "b8", "tensormap", array=128, align=64) if tma else b.param("w", "u64", "ptr:in")
    bt_p, f_p = b.param("tiles", "u64", "ptr:in"), b.param("factors", "u64", "ptr:in")
    y_p = b.param("y", "u64", "ptr:out")
    m_p, k_p, n_p = b.param("m", "u32"), b.param("k", "u32"), b.param("ntok", "u32")
    part_p, cnt_p = b.param("part", "u64", "ptr:scratch"), b.param("counters", "u64", "ptr:scratch")
    # kparts (the T ≤ 8 builds; the 16-token one, at 168 registers, would spill with it)
    kp_p = b.param("kparts", "u32") if NT == 1 else None
    ring_sym = _mma_gemv_frame(b, NW, CTAS, STAGES, stage_bytes, NT, ROWS, STEP, fmt,
                               activation="prep_mma_f16(x): tiles + factors (its min fragments unused)",
                               copy="tma" if tma else "bulk", box_bytes=SLOT if tma else box, stages=STAGES)
    if kp_p is not None:
        b.meta.update(k_parts="kparts: warps a row tile (a power of two dividing the warps)", grid="ceil(m / (rows_per_cta / kparts))")
    b.meta.update(dynamic_smem=b.dynamic_smem, pdl=True,
                  weights="row_bytes a multiple of 16 (the tensor map's row stride)" if tma else
                  f"row_bytes a multiple of 4, m·row_bytes of 16 (the last {box}-byte copy ends at the buffer's end)")
    if tma:
        b.meta.update(tensormaps=f"tmap_w: u32, dims (row_bytes/4, m), box ({SLOT // 4}, {ROWS}), no swizzle",
                      tma_box=(SLOT // 4, ROWS))
    Y, BT, F = b.ptr(y_p), b.ptr(bt_p), b.ptr(f_p)
    M, K, ntok = b.ld_param(m_p, "u32"), b.ld_param(k_p, "u32"), b.ld_param(n_p, "u32")
    if kp_p is not None:
        KP = b.ld_param(kp_p, "u32")
        tid, lane, warp, gwarp, row0, kpart = _tile_rows(b, NW, ROWS, KP)
    else:
        tid, lane, warp, gwarp, row0 = _warp_rows(b, NW, ROWS)
    g = b.op("shr.u32", lane, Imm(2, "u32"))
    t = b.op("and.b32", lane, Imm(3, "b32"))
    leader = b.op("setp.eq.u32", lane, Imm(0, "u32"))
    ring, bars, _ = _warp_rings(b, ring_sym, warp, leader, NW, STAGES, stage_bytes)
    b.emit("fence.proxy.async.shared::cta")
    b.emit("bar.sync", Imm(0, "u32"))

    nblk = b.op("shr.u32", K, Imm(5, "u32"))  # 32-element blocks (the B tiles' and factors' unit)
    row_bytes = b.op("mul.lo.u32", b.op("shr.u32", K, Imm(8, "u32")), Imm(bbytes, "u32"))
    mlast = b.op("sub.u32", M, Imm(1, "u32"))

    def row_start(r):  # byte offset of row r's first block (rows past M: row M − 1's, never stored)
        return b.op("mul.lo.u32", b.op("min.u32", b.op("add.u32", row0, r), mlast), row_bytes)

    if tma:  # lane 0: the 16 rows' step by one box from column ((jb / 8)·step bytes) & ~15 (rows past M: zeros)
        tw = b.op("cvta.param.u64", b.op("mov.b64", w_p))

        def issue(jb, stage):
            _tma_step(b, tw, leader, nblk, bars, ring, stage_bytes, row0, jb, stage, col=lambda jb: b.op(
                "shl.b32", b.op("shr.u32", b.op("mul.lo.u32", b.op("shr.u32", jb, Imm(3, "u32")), Imm(bbytes, "u32")),
                                Imm(4, "u32")), Imm(2, "u32")))
    else:
        # the copy: lane r < 16 copies row r's block of the step from its 16-byte aligned start (a bulk copy)
        W = b.ptr(w_p)
        copier = b.op("setp.lt.u32", lane, Imm(ROWS, "u32"))
        my_row = row_start(lane)
        my_slot = b.op("mul.lo.u32", lane, Imm(SLOT, "u32"))

        def issue(jb, stage):
            live = b.op("setp.lt.u32", jb, nblk)
            if isinstance(stage, int):
                bar = b.op("add.u32", bars, Imm(8 * stage, "u32"))
                dst = b.op("add.u32", ring, Imm(stage * stage_bytes, "u32"))
            else:
                bar = b.op("mad.lo.u32", stage, Imm(8, "u32"), bars)
                dst = b.op("mad.lo.u32", stage, Imm(stage_bytes, "u32"), ring)
            b.emit("mbarrier.arrive.expect_tx.shared::cta.b64", b.reg("b64"), Mem(bar), Imm(ROWS * box, "u32"),
                   pred=b.op("and.pred", leader, live))
            b.emit("bar.warp.sync", Imm(0xFFFFFFFF, "b32"))  # the expected bytes before any copy completes
            col = b.op("and.b32", b.op("mad.lo.u32", b.op("shr.u32", jb, Imm(3, "u32")), Imm(bbytes, "u32"), my_row),
                       Imm(~15 & 0xFFFFFFFF, "b32"))
            b.emit(BULK, Mem(b.op("add.u32", dst, my_slot)), Mem(b.op("add.s64", W, b.op("cvt.u64.u32", col))),
                   Imm(box, "u32"), Mem(bar), pred=b.op("and.pred", copier, live))

    acc = b.regs("f32", 4 * NT)  # group nt: (row g, token 8nt + 2t), (g, .. + 1), (g + 8, .. 2t), (g + 8, .. + 1)
    for r_ in acc:
        b.emit("mov.f32", r_, Imm(0.0, "f32"))
    # the warp's steps: those of split kz·KP + kpart of nsplit·KP (interleaved, as the grid's splits)
    kz, nsplit = b.special("ctaid.y"), b.special("nctaid.y")
    if kp_p is not None:
        stride = b.op("mul.lo.u32", b.op("mul.lo.u32", nsplit, KP), Imm(STEP, "u32"))
        jb, count = _fill_ring(b, arch, issue, b.op("mad.lo.u32", kz, KP, kpart), stride, STEP, STAGES, True)
    else:
        stride = b.op("mul.lo.u32", nsplit, Imm(STEP, "u32"))
        jb, count = _fill_ring(b, arch, issue, kz, stride, STEP, STAGES, True)

    # the lane's rows (g, g + 8): their first block's byte offset and slot; the B tiles' and factors' pointers
    rows = [row_start(b.op("add.u32", g, Imm(8 * rr, "u32"))) for rr in range(2)]
    slots = [b.op("mul.lo.u32", b.op("add.u32", g, Imm(8 * rr, "u32")), Imm(SLOT, "u32")) for rr in range(2)]
    lane16 = b.op("mul.wide.u32", lane, Imm(16, "u32"))
    p_b, s_b = _tile_pointer(b, jb, stride, BT, lane16, g, ntok if NT == 1 else None)
    g_b = b.op("mul.wide.u32", K, Imm(32, "u32"))  # a token group's tiles (K/16 x 512 bytes) ...
    g_f = b.op("cvt.u64.u32", K)  # ... and factors (K bytes)
    # the next step's B tiles into L1 at each step's start (lane l: line l >> 4 (+ 2) of tile l & 15, the lines of
    # tokens 2·line, 2·line + 1, where a token is live): the loads AHEAD blocks ahead then hit L1
    pf_lines = [b.op("add.u32", b.op("shr.u32", lane, Imm(4, "u32")), Imm(2 * i, "u32")) for i in range(2)]
    pf_live = [b.op("setp.lt.u32", b.op("add.u32", b.op("shl.b32", ln, Imm(1, "u32")), Imm(8 * nt, "u32")), ntok)
               for nt in range(NT) for ln in pf_lines]
    p_pf = b.op("add.s64", b.op("mad.wide.u32", jb, Imm(2 * T4.MMA_TILE, "u32"), BT),
                b.op("cvt.u64.u32", b.op("mad.lo.u32", b.op("and.b32", lane, Imm(15, "b32")), Imm(T4.MMA_TILE, "u32"),
                                         b.op("shl.b32", pf_lines[0], Imm(7, "u32")))))
    s_pf = b.op("mul.wide.u32", stride, Imm(2 * T4.MMA_TILE, "u32"))
    p_f = b.op("add.s64", b.op("mad.wide.u32", jb, Imm(32, "u32"), F), b.op("mul.wide.u32", t, Imm(8, "u32")))
    s_f = b.op("mul.wide.u32", stride, Imm(32, "u32"))
    czero = [b.op("mov.f32", Imm(0.0, "f32")) for _ in range(4)]
    consts = codec.mma_constants(b)
    sets = [[b.regs("b32", 8) for _ in range(NT)] for _ in range(SETS)]

    def load_b(pb, bl, dst, pred=None):  # block bl's B tiles (hi, lo of both halves) of every group into set dst
        for nt in range(NT):
            if nt:
                pb = b.op("add.s64", pb, g_b)
            for h in range(2):
                b.emit("ld.global.nc.v4.u32", b.vec(sets[dst][nt][4 * h:4 * h + 4]),
                       Mem(pb, (2 * bl + h) * T4.MMA_TILE), pred=pred)

    loop, done = b.label("step"), b.label("steps_done")
    b.bra(done, pred=b.op("setp.ge.u32", jb, nblk))
    for bl in range(AHEAD):
        load_b(p_b, bl, bl)
    b.place(loop)
    fac = []  # this step's 2^-s of tokens 8nt + 2t, + 1
    for nt in range(NT):
        fac.append(b.regs("f32", 2))
        b.emit("ld.global.nc.v2.f32", b.vec(fac[nt]), Mem(b.op("add.s64", p_f, g_f) if nt else p_f))
    stage = _wait_step(b, bars, count, STAGES)
    sbase = b.op("mad.lo.u32", stage, Imm(stage_bytes, "u32"), ring)
    jbytes = b.op("mul.lo.u32", b.op("shr.u32", jb, Imm(3, "u32")), Imm(bbytes, "u32"))
    bases = []  # row rr's step bytes start at an offset o of its slot (o % 4 the same for every row: row_bytes % 4
    # == 0); words are read from the 4-byte aligned o & ~3
    for rr in range(2):
        o = b.op("and.b32", b.op("add.u32", rows[rr], jbytes), Imm(15, "b32"))
        bases.append(b.op("add.u32", b.op("add.u32", sbase, slots[rr]), b.op("and.b32", o, Imm(12, "b32"))))
    lane4 = b.op("shl.b32", t, Imm(2, "u32"))
    lbases = [b.op("add.u32", base, lane4) for base in bases]

    nxt_b = b.op("add.s64", p_b, s_b)
    more = b.op("setp.lt.u32", b.op("add.u32", jb, stride), nblk)
    b.emit("add.s64", p_pf, p_pf, s_pf)
    for nt in range(NT):
        pf = b.op("add.s64", p_pf, g_b) if nt else p_pf
        for i in range(2):
            b.emit("prefetch.global.L1", Mem(pf, 256 * i), pred=b.op("and.pred", more, pf_live[2 * nt + i]))
    # the step's phase o % 4 (0 or 2, the same for every row) decides which words take one load and which two and
    # a prmt: one body per phase the codec's steps can have
    phases = (0,) if bbytes % 4 == 0 else (0, 2)
    other, joined = b.label("step_phase2"), b.label("step_joined")
    if len(phases) == 2:
        b.bra(other, pred=b.op("setp.ne.u32", b.op("and.b32", jbytes, Imm(2, "b32")), Imm(0, "u32")))
    for ph in phases:
        if ph:
            b.place(other)
        _step_body(b, arch, codec, consts, bases, lbases, t, ph, sets, load_b, p_b, nxt_b, more, czero, acc, fac,
                   AHEAD, SETS)
        if ph == 0 and len(phases) == 2:
            b.bra(joined)
    b.place(joined)
    _next_step(b, issue, stride, STAGES, jb, stage, count, ((p_b, s_b), (p_f, s_f)), loop, nblk)
    b.place(done)
    if kp_p is not None:
        _sum_k_parts(b, acc, ring, STAGES * stage_bytes, lane, kpart, KP)
    _fragment_epilogue(b, acc, g, t, gwarp, row0, M, ntok, Y, part_p, cnt_p, 1)
    return b.finish()


def phase_readers(b, base, lbase, ph):
    """(word, half): the readers an mma_block takes for a row whose step starts at phase `ph` (0 or 2: o % 4) past
    the 4-byte aligned `base` in shared memory (`lbase` = base + 4t): word(off, lane=False) the step's 4 bytes at
    `off` (+ 4t with lane) — one load, or at phase 2 two and a prmt —, half(off) its 2 bytes at `off`."""
    def word(off, lane=False):
        at, src = ph + off, lbase if lane else base
        lo = b.reg("b32")
        b.emit("ld.shared.u32", lo, Mem(src, at & ~3))
        if at % 4 == 0:
            return lo
        hi = b.reg("b32")
        b.emit("ld.shared.u32", hi, Mem(src, (at & ~3) + 4))
        return b.op("prmt.b32", lo, hi, Imm(0x5432, "b32"))

    def half(off):
        v = b.reg("b16")
        b.emit("ld.shared.b16", v, Mem(base, ph + off))
        return v
    return word, half


def _step_body(b, arch, codec, consts, bases, lbases, t, ph, sets, load_b, p_b, nxt_b, more, czero, acc, fac,
               AHEAD, SETS):
    """A step's decode, MMAs and sums into acc, its rows' bytes at phase `ph` (o % 4) of their aligned bases."""
    rowdec = [codec.mma_block(b, *phase_readers(b, bases[rr], lbases[rr], ph), t, consts) for rr in range(2)]
    NT = len(fac)
    S = [b.op("mov.f32", Imm(0.0, "f32")) for _ in range(4 * NT)]
    a_frag = {}
    for bl in range(STEP):  # 32-element block bl: register set bl % SETS, loaded AHEAD blocks earlier
        if bl + AHEAD < STEP:
            load_b(p_b, bl + AHEAD, (bl + AHEAD) % SETS)
        else:
            load_b(nxt_b, bl + AHEAD - STEP, (bl + AHEAD) % SETS, more)
        for h in range(2):
            s = 2 * bl + h  # the 16-element sub-block: its A from both rows, its two MMAs (B hi, lo)
            for rr in range(2):
                a_frag.update({(rr, bp): v for bp, v in enumerate(rowdec[rr].fragment(s))})
            A = [a_frag[0, 0], a_frag[1, 0], a_frag[0, 1], a_frag[1, 1]]  # (g, 2t..), (g + 8, ..), (g, 2t + 8..), ..
            for nt in range(NT):
                c = b.regs("f32", 4)
                breg = sets[bl % SETS][nt]
                b.emit(mma_sync(arch, "m16n8k16", "f16", b.vec(c), b.vec(A), b.vec(breg[4 * h:4 * h + 2]),
                                b.vec(czero)))
                b.emit(mma_sync(arch, "m16n8k16", "f16", b.vec(c), b.vec(A), b.vec(breg[4 * h + 2:4 * h + 4]),
                                b.vec(c)))
                for i in range(4):
                    b.emit("fma.rn.f32", S[4 * nt + i], rowdec[i // 2].scale(s), c[i], S[4 * nt + i])
    for i in range(4 * NT):  # y += 2^-s·d·S
        b.emit("fma.rn.f32", acc[i], b.op("mul.rn.f32", rowdec[(i % 4) // 2].d, S[i]), fac[i // 4][i % 2], acc[i])


def kernel_defs() -> list[KernelDef]:
    return [KernelDef(GemvKernel("mma", f, 8 * nt, tma=tma).name, f"{f} decode GEMV, T <= {8 * nt}, exact, mma.sync on "
                      f"the codec's integer weights x hi/lo activation (prep_mma_f16 per 8 tokens), weights by "
                      f"{'TMA (rows a multiple of 16 bytes)' if tma else 'bulk copies'}",
                      lambda arch, f=f, nt=nt, tma=tma: build(arch, f, nt, tma), archs=("sm_90a",))
            for f in FORMATS for nt, tma in ((1, False), (2, False), (1, True))]
