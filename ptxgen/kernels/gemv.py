"""Decode GEMV ("MMVQ"): y[t, r] = Σ_k W[r, k]·a[t, k] for T ≤ 8 tokens, weights in their GGUF byte layout.

Two schedules, both deterministic (fixed summation order everywhere):

Lane-per-block (`build_lanes`, `build_lanes_ggml`; TQ4_1S exact and fast, Q8_0, Q4_K fast, Q4_K exact T ≤ 2):
- one warp owns 1-2 rows; lane l owns unit jb + l of them (a 32-weight block, or a Q4_K sub-block pair) and
  loads it whole from one address; the next step's weight loads are in flight while this one computes;
- the activation is prepared once per call by a `prep_*` kernel (RHT and/or Q8_1, or plain fp32) into a lane
  layout (ptxgen.formats.tq4_1s.to_lanes_*) where the 32 lanes' 16-byte loads are contiguous;
- warps never meet: lanes reduce by shfl; rows that alone cannot fill the GPU split K over gridDim.y, and the last
  warp of a row group to arrive sums the splits in z order; on sm_90+ the GEMV launches behind its prep
  (programmatic dependent launch) and waits (`griddepcontrol.wait`) just before its first activation read.

8-weight units (`build`; TQ4_1S with the rotation fused into the prologue, Q4_K exact at T = 4, 8):
- a CTA of 8 warps owns R consecutive rows; warp w walks the row's 256-column chunks w, w+8, ...; lane l owns
  one unit of 8 weights per chunk and keeps that unit's activations for all T tokens in registers;
- weight values come from a 16-entry float32 table in shared memory addressed by a single `prmt` that drops a
  nibble·4 into the low byte of the table's (256-aligned) address: 16 distinct words, so lanes never conflict
  on banks and never serialise as a constant-memory lookup with divergent indices would;
- the 8 warps' partials meet in shared memory and are summed in warp order.
Fused rotation: x in registers, butterfly stages 1, 2, 4 inside a lane's 8 values, stages 8 and 16 by
shfl.xor with lanes 1 and 2 away, bit-identical to the separate kernel.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Callable, NamedTuple

import numpy as np

from ..arch import Arch
from ..builder import KernelBuilder
from .. import codecs
from ..dsl import warp_per_item, warp_sum
from ..formats import tq4_1s as T4
from ..ir import Imm, Mem, Reg, TensorRef, mma_sync
from ..specs import ActKernel, GemvKernel
from . import KernelDef
from .convert_f16 import overflowed

WARPS = 8
# a diagnostic build (bench/probe_decode_trace.py), never shipped: prep_q4k_t1's CTAs write (%globaltimer_lo at
# entry, after griddepcontrol.wait, after their first warp's stores) into their super-block's record padding (which
# warp 1 zeroes otherwise; no GEMV reads it) — gemv_t1.TRACE's GEMV reports super-block 0's beside its own
PREP_TRACE = False
CHUNK = 256  # columns per warp step: 32 lanes × 8 weights
TOKENS = (1, 2, 4, 8)
ROWS = {1: 8, 2: 8, 4: 8, 8: 4}  # rows per CTA by T: R·T accumulators + 8·T activations per lane


@dataclass(frozen=True)
class GemvSpec:
    fmt: str  # "tq4_1s" or "q4_K"
    tokens: int
    rows: int
    fused_rotation: bool = False
    mode: str = "exact"  # TQ4_1S only: "fast" = int8 codebook × Q8_1 activation with dp4a

    @property
    def name(self) -> str:
        return GemvKernel("gemv", self.fmt, self.tokens, fast=self.mode == "fast", fused=self.fused_rotation).name


def build(arch, spec: GemvSpec):
    """The 8-weight-unit GEMV (gemv_q4_k_t4 / _t8, gemv_tq4_1s_t{1,2,4}_fused): lane L of a warp's 256-column step
    decodes 8 weights of each of the CTA's R rows through a 16-entry value table in shared memory; where the unit
    lies, how it loads, which element is which nibble and its scales (and min term) are the codec's UnitLane."""

    lane_cls = codecs.get(spec.fmt).UnitLane
    Tn, R = spec.tokens, spec.rows
    doc = (f"{spec.fmt} GEMV, {Tn} token(s), {R} rows per CTA"
           + (", activation rotated in the prologue" if spec.fused_rotation else ""))
    b = KernelBuilder(spec.name, arch, doc, block=(32 * WARPS, 1, 1))
    w_p = b.param("w", "u64", "ptr:in")
    a_p = b.param("a", "u64", "ptr:in")
    y_p = b.param("y", "u64", "ptr:out")
    m_p = b.param("m", "u32")
    k_p = b.param("k", "u32")
    n_p = b.param("ntok", "u32")
    if spec.mode != "exact":
        raise ValueError("the 8-weight-unit GEMV is exact (fp32); the fast GEMVs are build_lanes'")
    b.meta.update(tokens=Tn, rows_per_cta=R, warps=WARPS, chunk=CHUNK, fmt=spec.fmt, mode=spec.mode,
                  fused_rotation=spec.fused_rotation, grid="ceil(m / rows_per_cta)",
                  activation="fp32")
    lut_sym = b.shared_buffer("lut", 256, align=256)
    red_sym = b.shared_buffer("red", 4 * WARPS * R * Tn, align=16)
    table = b.const_table("lut_init", np.asarray(lane_cls.LUT, np.float32).tobytes())
    b.pdl_trigger()  # the op's last kernel: the next op's first may start (it waits for this one)

    W, A, Y = b.ptr(w_p), b.ptr(a_p), b.ptr(y_p)
    M, K, ntok = b.ld_param(m_p, "u32"), b.ld_param(k_p, "u32"), b.ld_param(n_p, "u32")
    tid = b.special("tid.x")
    lane = b.op("and.b32", tid, Imm(31, "b32"))
    warp = b.op("shr.u32", tid, Imm(5, "u32"))
    row0 = b.op("mul.lo.u32", b.special("ctaid.x"), Imm(R, "u32"))

    # the value table: threads 0..15 copy it into shared memory
    b.comment("16-entry float32 value table in shared memory (codebook, or 0..15 for 4-bit ints)")
    small = b.op("setp.lt.u32", tid, Imm(16, "u32"))
    tab = b.op("mov.u64", table)
    tv = b.reg("f32")
    b.emit("ld.global.nc.f32", tv, Mem(b.op("mad.wide.u32", tid, Imm(4, "u32"), tab)), pred=small)
    lut = b.op("mov.u32", lut_sym)
    b.emit("st.shared.f32", Mem(b.op("mad.lo.u32", tid, Imm(4, "u32"), lut)), tv, pred=small)
    b.emit("bar.sync", Imm(0, "u32"))

    # per-row byte strides and clamped row pointers (rows past M compute on row M-1 and are not stored)
    row_bytes = lane_cls.row_bytes(b, K)
    last = b.op("sub.u32", M, Imm(1, "u32"))
    rowptr = []
    for r in range(R):
        rr = b.op("min.u32", b.op("add.u32", row0, Imm(r, "u32")), last)
        rowptr.append(b.op("mad.wide.u32", rr, row_bytes, W))
    # activation row pointers, clamped to the last real token
    tlast = b.op("sub.u32", ntok, Imm(1, "u32"))
    k4 = b.op("shl.b32", K, Imm(2, "u32"))  # activation row bytes (fp32)
    actptr = [b.op("mad.wide.u32", b.op("min.u32", Imm(t, "u32"), tlast, type="u32"), k4, A) for t in range(Tn)]

    acc = [[b.reg("f32") for _ in range(Tn)] for _ in range(R)]
    for row in acc:
        for r in row:
            b.emit("mov.f32", r, Imm(0.0, "f32"))

    lane_dec = lane_cls(b, lane, K)  # the lane's unit inside a 256-column chunk
    col_in_chunk, nunits = lane_dec.col_in_chunk, lane_dec.nunits

    nchunks = b.op("shr.u32", b.op("add.u32", K, Imm(CHUNK - 1, "u32")), Imm(8, "u32"))
    prefetch_act = Tn <= 2  # activations double-buffered too where registers allow

    def alloc_state():
        """The registers one chunk's loads land in (two sets: the loop is a ping-pong)."""
        w = [lane_cls.regs(b) for _ in range(R)]
        act = [new_act() for _ in range(Tn)] if prefetch_act else None
        return {"c": b.reg("u32"), "live": b.reg("pred"), "w": w, "act": act}

    def new_act():
        """One token's unit activation: 8 floats."""
        return [b.reg("f32") for _ in range(8)]

    def load_acts(st, act):
        """This lane's unit activations for all tokens (two 16-byte loads each; Q4_K: p..p+3, 32+p..p+3)."""
        col = b.op("mad.lo.u32", st["c"], Imm(CHUNK, "u32"), col_in_chunk)
        second = lane_cls.ACT_SECOND
        for t in range(Tn):
            base = b.op("mad.wide.u32", col, Imm(4, "u32"), actptr[t])
            for e in range(8):
                b.emit("mov.f32", act[t][e], Imm(0.0, "f32"))
            b.emit("ld.global.nc.v4.f32", b.vec(act[t][0:4]), Mem(base), pred=st["live"])
            b.emit("ld.global.nc.v4.f32", b.vec(act[t][4:8]), Mem(base, second), pred=st["live"])

    def issue(st, c_src):
        """Every load of chunk c_src into the state's registers: weights of all R rows, then activations."""
        b.emit("mov.u32", st["c"], c_src)
        # is this lane's unit inside the row? (K need not be a multiple of 256 for TQ4_1S)
        b.emit("setp.lt.u32", st["live"], b.op("mad.lo.u32", st["c"], Imm(32, "u32"), lane), nunits)
        for r in range(R):
            lane_dec.load(b, st["c"], rowptr[r], st["w"][r], st["live"])
        if prefetch_act:
            load_acts(st, st["act"])

    def compute(st):
        act = st["act"]
        if act is None:
            act = [new_act() for _ in range(Tn)]
            load_acts(st, act)
        act = [list(row) for row in act]
        if spec.fused_rotation:
            _rotate_unit_in_registers(b, act, lane_dec.word, lane, None)  # a rotated codec's UnitLane has `word`
        if lane_cls.MIN_TERM:  # Σa per half for the min term, once per chunk
            asum = [[None, None] for _ in range(Tn)]
            for t in range(Tn):
                for h in range(2):
                    s_ = b.op("add.rn.f32", act[t][4 * h], act[t][4 * h + 1])
                    s_ = b.op("add.rn.f32", s_, act[t][4 * h + 2])
                    asum[t][h] = b.op("add.rn.f32", s_, act[t][4 * h + 3])
        for r in range(R):
            qw, extra = st["w"][r]
            b.comment(f"row {r}")
            # nibble·4 in every byte: elements 0,2,4,6 (low nibbles) and 1,3,5,7 (high nibbles)
            lo4 = b.op("and.b32", b.op("shl.b32", qw, Imm(2, "u32")), Imm(0x3C3C3C3C, "b32"))
            hi4 = b.op("and.b32", b.op("shr.u32", qw, Imm(2, "u32")), Imm(0x3C3C3C3C, "b32"))
            vals = []
            for e in range(8):  # the codec's element e: a byte's low or high nibble
                nib, byte = lane_cls.element(e)
                addr = b.op("prmt.b32", lo4 if nib == "lo" else hi4, lut, Imm(0x7650 | byte, "b32"))
                vals.append(b.op("ld.shared.f32", Mem(addr)))
            groups = lane_dec.groups(b, (qw, extra))
            for gi, (elems, scale, minimum) in enumerate(groups):
                for t in range(Tn):
                    part = None
                    for e in elems:
                        part = b.op("mul.rn.f32", vals[e], act[t][e]) if part is None else \
                            b.op("fma.rn.f32", vals[e], act[t][e], part)
                    b.emit("fma.rn.f32", acc[r][t], scale, part, acc[r][t])
                    if minimum is not None:
                        b.emit("fma.rn.f32", acc[r][t], b.op("neg.f32", minimum), asum[t][gi], acc[r][t])

    # software pipeline as a ping-pong between two register sets: the loads of chunk c+8 are in flight
    # while chunk c is decoded; chunks past the end load nothing (no lane is live there)
    b.comment("software-pipelined chunk loop: the next chunk's loads overlap this chunk's decode")
    A, B = alloc_state(), alloc_state()
    done = b.label("chunks_done")
    b.bra(done, pred=b.op("setp.ge.u32", warp, nchunks))
    issue(A, warp)
    top = b.label("chunk")
    b.place(top)
    issue(B, b.op("add.u32", A["c"], Imm(WARPS, "u32")))
    compute(A)
    b.bra(done, pred=b.op("setp.ge.u32", B["c"], nchunks))
    issue(A, b.op("add.u32", B["c"], Imm(WARPS, "u32")))
    compute(B)
    b.bra(done, pred=b.op("setp.ge.u32", A["c"], nchunks))
    b.bra(top)
    b.place(done)

    _reduce_and_store(b, acc, R, Tn, lane, warp, tid, red_sym, row0, M, ntok, Y)
    b.emit("ret")
    return b.finish()


def _reduce_and_store(b, acc, R, Tn, lane, warp, tid, red_sym, row0, M, ntok, Y):
    """The 8-weight-unit GEMV's end: each (row, token) sum over the lanes (xor tree), then over the WARPS warps in
    order through shared memory (deterministic), stored by thread r·Tn + t where row and token exist."""
    b.comment("reduce: 32 lanes by shfl.bfly, then the 8 warps in order")
    red = b.op("mov.u32", red_sym)
    lead = b.op("setp.eq.u32", lane, Imm(0, "u32"))
    for r in range(R):
        for t in range(Tn):
            v = warp_sum(b, acc[r][t])
            slot = b.op("mad.lo.u32", warp, Imm(4 * R * Tn, "u32"), red)
            b.emit("st.shared.f32", Mem(slot, 4 * (r * Tn + t)), v, pred=lead)
    b.emit("bar.sync", Imm(0, "u32"))
    fin = b.label("finish")
    b.bra(fin, pred=b.op("setp.ge.u32", tid, Imm(R * Tn, "u32")), uniform=False)
    s = b.op("ld.shared.f32", Mem(b.op("mad.lo.u32", tid, Imm(4, "u32"), red)))
    for wi in range(1, WARPS):
        s = b.op("add.rn.f32", s, b.op("ld.shared.f32", Mem(b.op("mad.lo.u32", tid, Imm(4, "u32"), red), 4 * R * Tn * wi)))
    r_of = b.op("div.u32", tid, Imm(Tn, "u32"))
    t_of = b.op("rem.u32", tid, Imm(Tn, "u32"))
    row = b.op("add.u32", row0, r_of)
    ok = b.op("setp.lt.u32", row, M)
    ok2 = b.op("setp.lt.u32", t_of, ntok)
    both = b.op("and.pred", ok, ok2)
    yoff = b.op("mad.lo.u32", t_of, M, row)
    b.emit("st.global.f32", Mem(b.op("mad.wide.u32", yoff, Imm(4, "u32"), Y)), s, pred=both)
    b.place(fin)


LANE_WARPS = 4  # TQ4_1S kernels: 4 independent warps per CTA
LANE_MIN_CTAS = {1: 8, 2: 7, 4: 4, 8: 2}  # resident CTAs per SM asked of ptxas (64, 72, 128, 255 registers; T=8 needs ~240 without spills)
LANE_ROWS = {1: 2, 2: 2, 4: 2, 8: 2}  # rows per warp by T (2 rows: the ping-pong loads fit 64 registers)
LANE_ROWS_FAST = {1: 2, 2: 2, 4: 2, 8: 1}
GGML_MIN_CTAS = {1: 8, 2: 5, 4: 3, 8: 2}  # Q8_0 / Q4_K lane GEMVs: 64, 102, 170, 255 registers without spills
# the formats with an int8 x Q8_1 lane GEMV (build_lanes_ggml: their codec's GgmlLane), mode="fast"'s decode
FAST_LANE_FORMATS = ("q4_K", "q5_K", "q6_K", "q8_0")
# (kernel, arch) → resident CTAs where one nvJitLink release needs more registers than another: the H200 image's
# nvJitLink spills gemv_q4_k_t2 for sm_120a at 96 registers (13.5.37 does not); 4 CTAs leave it 128
MIN_CTAS_OVERRIDE = {(GemvKernel("gemv", "q4_K", 2).name, "sm_120a"): 4}


_HEAD = ("W", "A", "Y", "M", "K", "ntok", "lane", "gwarp", "row0", "part_p", "cnt_p")
# the TMA-fed builds: sm_90a and sm_120a (its ptxas (CUDA 13.0) gives any kernel that issues cp.async.bulk.tensor an
# 8-byte stack frame, a one-line TMA kernel included: not the tensor-map parameter's doing; checked there by nvJitLink,
# SASS and the emulator only — no sm_120 GPU has measured them)
TMA_ARCHS = ("sm_90a", "sm_120a")


def _lane_head(name, arch, doc, Tn, R, min_ctas, **meta):
    """The shared head of the lane-per-block GEMVs: ABI (w, a, y, m, k, ntok, part, counters), launch bounds,
    meta, and the warp's rows: warp gwarp = ctaid·4 + warp owns rows gwarp·R .. gwarp·R + R − 1."""
    b = KernelBuilder(name, arch, doc, block=(32 * LANE_WARPS, 1, 1))
    w_p, a_p, y_p = b.param("w", "u64", "ptr:in"), b.param("a", "u64", "ptr:in"), b.param("y", "u64", "ptr:out")
    m_p, k_p, n_p = b.param("m", "u32"), b.param("k", "u32"), b.param("ntok", "u32")
    part_p, cnt_p = b.param("part", "u64", "ptr:scratch"), b.param("counters", "u64", "ptr:scratch")
    b.directives += [f".maxntid {32 * LANE_WARPS}, 1, 1", f".minnctapersm {min_ctas}"]
    b.pdl_trigger()  # the op's last kernel: the next op's first may start (it waits for this one)
    b.meta.update(split_k="gridDim.y splits the K steps (a step: 32 lanes x lane_cols columns); part: splits x ntok "
                          "x m fp32, counters: one u32 per warp (zero, left zero)", ctas_per_sm=min_ctas, tokens=Tn, rows_per_cta=R * LANE_WARPS,
                  rows_per_warp=R, warps=LANE_WARPS, grid="ceil(m / rows_per_cta)", layout="lanes",
                  pdl=arch.has("griddepcontrol"), **meta)
    h = {"part_p": part_p, "cnt_p": cnt_p}
    h["W"], h["A"], h["Y"] = b.ptr(w_p), b.ptr(a_p), b.ptr(y_p)
    h["M"], h["K"], h["ntok"] = b.ld_param(m_p, "u32"), b.ld_param(k_p, "u32"), b.ld_param(n_p, "u32")
    h["tid"] = tid = b.special("tid.x")
    h["lane"] = b.op("and.b32", tid, Imm(31, "b32"))
    h["gwarp"] = b.op("mad.lo.u32", b.special("ctaid.x"), Imm(LANE_WARPS, "u32"), b.op("shr.u32", tid, Imm(5, "u32")))
    h["row0"] = b.op("mul.lo.u32", h["gwarp"], Imm(R, "u32"))
    return b, h


def _lane_pointers(b, h, R, Tn, nblk, row_bytes, gsize, with_lane16=False):
    """Row pointers of the warp's R rows (rows past M read row M − 1 and are not stored) and activation
    pointers of the T tokens in the lane layout (groups of 32 blocks, `gsize` bytes each; tokens past ntok
    read the last one); with_lane16: also this lane's byte offset in a group row (16·lane)."""
    last = b.op("sub.u32", h["M"], Imm(1, "u32"))
    rowptr = [b.op("mad.wide.u32", b.op("min.u32", b.op("add.u32", h["row0"], Imm(r, "u32")), last), row_bytes, h["W"])
              for r in range(R)]
    tlast = b.op("sub.u32", h["ntok"], Imm(1, "u32"))
    a_row = b.op("mul.lo.u32", b.op("shr.u32", b.op("add.u32", nblk, Imm(31, "u32")), Imm(5, "u32")), Imm(gsize, "u32"))
    lane16 = b.op("mul.wide.u32", h["lane"], Imm(16, "u32")) if with_lane16 else None
    actptr = [b.op("mad.wide.u32", b.op("min.u32", Imm(t, "u32"), tlast, type="u32"), a_row, h["A"]) for t in range(Tn)]
    return rowptr, actptr, lane16


def _pair_fma(b, part, val, e, acts):
    """Element e's codebook value `val` times each token's activation, into that token's even or odd partial chain
    part[t][e % 2] (two chains: the FFMA chain waits on the lookups)."""
    for t, a_ in enumerate(acts):
        p_ = part[t][e % 2]
        part[t][e % 2] = b.op("mul.rn.f32", val, a_) if p_ is None else b.op("fma.rn.f32", val, a_, p_)


def _close_half(b, part, acc, scales, h):
    """End of a 16-element half block: acc[r][t] += d_h(row r) · (even + odd chain)."""
    for r, row in enumerate(acc):
        for t, a_ in enumerate(row):
            both = b.op("add.rn.f32", part[r][t][0], part[r][t][1])
            b.emit("fma.rn.f32", a_, scales[r][h], both, a_)


def build_lanes(arch, spec: GemvSpec):
    """TQ4_1S GEMV, one warp per R rows and one 32-weight block per lane per step.

    A lane loads a whole block of each row (the scale word and 4 qs words: five 4-byte loads at immediate
    offsets from one address), so loads and address arithmetic are per 32 weights, not per 8; the next
    step's weight loads are in flight while this step computes (ping-pong registers). The activation
    comes from `prep_tq4_1s` (fp32) or `prep_tq4_1s_q8` (Q8_1) in the lane layout, where the 32 lanes'
    16-byte loads are contiguous (in the plain layout a lane's block is 128 bytes from its neighbour's and
    each load touches 32 cache lines: measured 1.5-2x slower at T=1, 10x at T=8). Warps never meet: the 32
    lanes' sums are reduced by shfl and the lane that owns (row, token) stores it. Deterministic.
    Exact mode: nibble·4 → `prmt` into the low byte of a 256-aligned 16-entry fp32 table's address → LDS,
    FFMA per weight and token; fast mode: int8 codebook by prmt from registers, dp4a with the Q8_1 block. The
    block's loads, scales and codebook lookups are the codec's (codecs/tq4_1s.py); this keeps the schedule."""
    if spec.fused_rotation:
        raise ValueError("the lane-per-block GEMV reads the prepared activation; fused rotation is build()'s")
    Tn = spec.tokens
    R = spec.rows
    fast = spec.mode == "fast"
    tq = codecs.get(spec.fmt)  # the codec's block loads, scales and codebook (TQ4_1S's)
    doc = f"{spec.fmt} GEMV{' (fast: int8 codebook x Q8_1, dp4a)' if fast else ''}, {Tn} token(s), {R} rows per warp"
    # occupancy was the limit (ncu: 80 registers → 6 CTAs/SM, 0.8 eligible warps per scheduler): ask ptxas
    # for as many resident CTAs as each T fits without spilling
    b, h = _lane_head(spec.name, arch, doc, Tn, R, LANE_MIN_CTAS[Tn], fmt=spec.fmt, mode=spec.mode, lane_cols=32,
                      fused_rotation=False,
                      activation=f"{GemvKernel('prep_lanes', 'tq4_1s', fast=fast).name}(x) (lane layout)")
    W, A, Y, M, K, ntok, lane, gwarp, row0, part_p, cnt_p = (h[k] for k in _HEAD)
    tid = h["tid"]

    if fast:
        s8 = tq.FastCodebook(b)
    else:
        lut_sym = b.shared_buffer("lut", tq.LUT_BYTES, align=tq.LUT_BYTES)
        b.comment("16-entry float32 codebook in shared memory (256-aligned: prmt writes nibble*4 into the low byte)")
        lut = tq.lut_fill(b, tid, lut_sym)
        b.emit("bar.sync", Imm(0, "u32"))

    nblk = b.op("shr.u32", K, Imm(5, "u32"))
    row_bytes = tq.blocks_bytes(b, nblk)
    gsize = T4.LANE_GROUP_Q8 if fast else T4.LANE_GROUP_F32
    rowptr, actptr, lane16 = _lane_pointers(b, h, R, Tn, nblk, row_bytes, gsize, with_lane16=True)
    acc = [[b.reg("f32") for _ in range(Tn)] for _ in range(R)]
    for row in acc:
        for r_ in row:
            b.emit("mov.f32", r_, Imm(0.0, "f32"))

    def alloc_state():
        return {"blk": b.reg("u32"), "live": b.reg("pred"), "w": [tq.block_regs(b) for _ in range(R)],
                "tail": False}

    def issue(st, jb, pred=None, tail=False):
        """Weight loads of block jb + lane for every row. Full steps load unpredicated (or under the
        warp-uniform `pred`); the tail step predicates each lane and zeroes what it does not load (scale 0,
        activations 0: a lane past the row's end adds exact zeros)."""
        st["tail"] = tail
        b.emit("add.u32", st["blk"], jb, lane)
        if tail:
            b.emit("setp.lt.u32", st["live"], st["blk"], nblk)
        off = tq.blocks_bytes(b, st["blk"])
        for r in range(R):
            p = b.op("add.s64", rowptr[r], b.op("cvt.u64.u32", off))
            tq.load_block(b, st["w"][r], p, pred=st["live"] if tail else pred, zero=tail)

    def act_base(st, t):
        """This lane's 16-byte column of token t's group jb/32 in the lane layout."""
        g = b.op("mul.wide.u32", b.op("shr.u32", st["blk"], Imm(5, "u32")), Imm(gsize, "u32"))
        return b.op("add.s64", b.op("add.s64", actptr[t], g), lane16)

    def act_load(st, base, offset, regs):
        if st["tail"]:
            for r_ in regs:
                b.emit(f"mov.{'b32' if fast else 'f32'}", r_, Imm(0, "b32") if fast else Imm(0.0, "f32"))
        b.emit(f"ld.global.nc.v4.{'u32' if fast else 'f32'}", b.vec(regs), Mem(base, offset),
               pred=st["live"] if st["tail"] else None)
        return regs

    def compute(st):
        scales = [tq.block_scales(b, st["w"][r]) for r in range(R)]
        bases = [act_base(st, t) for t in range(Tn)]
        if fast:
            da = []
            for t in range(Tn):  # the 32 blocks' d follow the 1024 bytes of qs words: byte 1024 + 4·lane
                dv = b.reg("f32")
                if st["tail"]:
                    b.emit("mov.f32", dv, Imm(0.0, "f32"))
                dp = b.op("sub.s64", bases[t], b.op("mul.wide.u32", lane, Imm(12, "u32")))
                b.emit("ld.global.nc.f32", dv, Mem(dp, 1024), pred=st["live"] if st["tail"] else None)
                da.append(dv)
            for h in range(2):  # qs words 4h..4h+3 of the activation block: the weights' words 2h, 2h+1
                acts = [act_load(st, bases[t], 512 * h, b.regs("b32", 4)) for t in range(Tn)]
                for r in range(R):
                    isum = [None] * Tn
                    for i in range(2):
                        w8 = s8.values(tq.qs_word(st["w"][r], 2 * h + i))
                        for t in range(Tn):
                            qa, qb = acts[t][2 * i], acts[t][2 * i + 1]
                            s_ = b.op("dp4a.s32.s32", w8[0], qa, isum[t] if isum[t] is not None else Imm(0, "s32"), type="s32")
                            isum[t] = b.op("dp4a.s32.s32", w8[1], qb, s_, type="s32")
                    for t in range(Tn):
                        b.emit("fma.rn.f32", acc[r][t], b.op("mul.rn.f32", scales[r][h], da[t]),
                               b.op("cvt.rn.f32.s32", isum[t]), acc[r][t])
            return
        for h in range(2):
            # two partial chains per (row, token): even and odd elements (the FFMA chain waits on LDS)
            part = [[[None, None] for _ in range(Tn)] for _ in range(R)]
            for i in range(2):
                wi = 2 * h + i  # elements 8·wi .. 8·wi+7: lane-layout rows 2·wi, 2·wi+1 (512 bytes apart)
                nib = [tq.lut_nibbles(b, tq.qs_word(st["w"][r], wi)) for r in range(R)]
                for q in range(2):  # 4 elements at a time: 4·T activation registers live, not 8·T
                    acts = [act_load(st, bases[t], 1024 * wi + 512 * q, [b.reg("f32") for _ in range(4)])
                            for t in range(Tn)]
                    for r in range(R):
                        lo4, hi4 = nib[r]
                        for e in range(4 * q, 4 * q + 4):  # element 8·wi + e
                            _pair_fma(b, part[r], tq.lut_value(b, lo4, hi4, lut, e), e,
                                      [acts[t][e - 4 * q] for t in range(Tn)])
            _close_half(b, part, acc, scales, h)

    S0, S1 = alloc_state(), alloc_state()
    _lane_steps(b, nblk, S0, S1, issue, compute)
    sums = {}
    for r in range(R):
        for t in range(Tn):
            sums[r, t] = acc[r][t] if not fast else b.op("mul.rn.f32", acc[r][t], Imm(float(T4.FAST_RESCALE), "f32"))
    _lane_epilogue(b, sums, lane, gwarp, row0, M, ntok, Y, part_p, cnt_p)
    return b.finish()


TMA_STEP = "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
# sm_120a's TMA: a .shared::cta destination (PTX ISA 8.6). With .shared::cluster (TMA_STEP) sm_120a's ptxas wraps
# every copy in a test of the address's CTA and a call into a slow path, with an 8-byte stack frame (the fp16 MMQ
# n32: 340 SASS per K-step against 248)
TMA_CTA = "cp.async.bulk.tensor.2d.shared::cta.global.tile.mbarrier::complete_tx::bytes"


def _warp_rows(b, NW, R):
    """(tid, lane, warp in the CTA, warp in the grid, its first row) of a kernel whose warps own R rows each."""
    tid = b.special("tid.x")
    lane = b.op("and.b32", tid, Imm(31, "b32"))
    warp = b.op("shr.u32", tid, Imm(5, "u32"))
    gwarp = b.op("mad.lo.u32", b.special("ctaid.x"), Imm(NW, "u32"), warp)
    return tid, lane, warp, gwarp, b.op("mul.lo.u32", gwarp, Imm(R, "u32"))


def _tile_rows(b, NW, R, KP):
    """_warp_rows for a CTA of row tiles of KP warps each (KP: a register, the launch's kparts, a power of two
    dividing NW; NW: the CTA's warps, an int or a register): (tid, lane, warp, the tile's index in the grid (its split-K
    counter), its first row, the warp's part of the tile's K range)."""
    tid = b.special("tid.x")
    lane = b.op("and.b32", tid, Imm(31, "b32"))
    warp = b.op("shr.u32", tid, Imm(5, "u32"))
    tiles = b.op("div.u32", Imm(NW, "u32") if isinstance(NW, int) else NW, KP)
    gtile = b.op("mad.lo.u32", b.special("ctaid.x"), tiles, b.op("div.u32", warp, KP))
    return tid, lane, warp, gtile, b.op("mul.lo.u32", gtile, Imm(R, "u32")), b.op("rem.u32", warp, KP)


def _sum_k_parts(b, vals, ring, ring_bytes, lane, kpart, KP):
    """The K parts of a row tile summed in the CTA (KP, a register, > 1; the same in every warp, so the barrier is
    the whole CTA's): warps of part p > 0 store their lane's `vals` at the start of their own ring (every copy
    landed; rings ring_bytes apart, a tile's warps consecutive), then after the CTA's barrier part 0 adds parts 1 ..
    KP - 1 in order (deterministic) and goes on; the others end."""
    skip = b.label("k_parts_summed")
    b.bra(skip, pred=b.op("setp.eq.u32", KP, Imm(1, "u32")), uniform=True)
    b.emit("cp.async.wait_all")
    slot = b.op("mad.lo.u32", lane, Imm(4 * len(vals), "u32"), ring)
    first = b.op("setp.eq.u32", kpart, Imm(0, "u32"))
    for i, v in enumerate(vals):
        b.emit("st.shared.f32", Mem(slot, 4 * i), v, pred=first, neg=True)
    b.emit("bar.sync", Imm(0, "u32"))
    b.emit("ret", pred=first, neg=True)
    p_ = b.op("mov.u32", Imm(1, "u32"))
    more = b.label("k_part")
    b.place(more)
    b.emit("add.u32", slot, slot, Imm(ring_bytes, "u32"))
    for i, v in enumerate(vals):
        b.emit("add.rn.f32", v, v, b.op("ld.shared.f32", Mem(slot, 4 * i)))
    b.emit("add.u32", p_, p_, Imm(1, "u32"))
    b.bra(more, pred=b.op("setp.lt.u32", p_, KP), uniform=True)
    b.place(skip)


def _warp_rings(b, ring_sym, warp, leader, NW, S, stage_bytes, skip=0):
    """This warp's ring of S stages in dynamic shared memory (aligned up to 128 bytes for TMA; the rings start
    `skip` bytes past that) and its S mbarriers, initialised by lane 0 (the caller's CTA barrier publishes
    them): (ring, bars, the aligned base: where the `skip` bytes start) addresses."""
    bars_sym = b.shared_buffer("bars", 8 * NW * S, align=8)
    aligned = b.op("and.b32", b.op("add.u32", b.op("mov.u32", ring_sym), Imm(127, "u32")),
                   Imm(~127 & 0xFFFFFFFF, "b32"))
    base = b.op("add.u32", aligned, Imm(skip, "u32")) if skip else aligned
    ring = b.op("mad.lo.u32", warp, Imm(S * stage_bytes, "u32"), base)
    bars = b.op("mad.lo.u32", warp, Imm(8 * S, "u32"), b.op("mov.u32", bars_sym))
    b.comment("the warp's stage barriers (lane 0)")
    for i in range(S):
        b.emit("mbarrier.init.shared::cta.b64", Mem(bars, 8 * i), Imm(1, "u32"), pred=leader)
    return ring, bars, aligned


def _tma_step(b, tw, leader, nblk, bars, ring, stage_bytes, row0, jb, stage, words_per_step=None, step_blocks=None,
              col=None):
    """Lane 0: one TMA box — the step starting at block jb of the warp's rows (if jb < nblk) — into ring
    stage `stage` (a register or an int), completing on that stage's mbarrier. The box's column (u32) is col(jb)
    (a register: TQ4_1S's codecs.tq4_1s.box_column, the codecs' GEMV) or (jb / step_blocks)·words_per_step (Q4_K: 8
    sub-blocks per 36-word super-block)."""
    go = b.op("and.pred", leader, b.op("setp.lt.u32", jb, nblk))
    if isinstance(stage, int):
        bar, dst = b.op("add.u32", bars, Imm(8 * stage, "u32")), b.op("add.u32", ring, Imm(stage * stage_bytes, "u32"))
    else:
        bar = b.op("mad.lo.u32", stage, Imm(8, "u32"), bars)
        dst = b.op("mad.lo.u32", stage, Imm(stage_bytes, "u32"), ring)
    b.emit("mbarrier.arrive.expect_tx.shared::cta.b64", b.reg("b64"), Mem(bar), Imm(stage_bytes, "u32"), pred=go)
    col = (col(jb) if col is not None else
           b.op("mul.lo.u32", b.op("div.u32", jb, Imm(step_blocks, "u32")), Imm(words_per_step, "u32")))
    b.emit(TMA_CTA if b.arch.name == "sm_120a" else TMA_STEP, Mem(dst), TensorRef(tw, (col, row0)), Mem(bar), pred=go)


def _fill_ring(b, arch, issue, kz, stride, STEP, S, pdl=True):
    """The tensor-core GEMVs' prologue: split kz's first step (block kz·STEP) and the S - 1 after it into the
    ring, then (`pdl`, where the target has it) wait for the activation prep. Returns (jb, the step counter)."""
    jb = b.op("mul.lo.u32", kz, Imm(STEP, "u32"))
    for s_ in range(S):
        issue(b.op("mad.lo.u32", stride, Imm(s_, "u32"), jb), s_)
    if pdl and arch.has("griddepcontrol"):
        b.emit("griddepcontrol.wait")
    return jb, b.op("mov.u32", Imm(0, "u32"))


def _wait_step(b, bars, count, S):
    """Spin until the stage of this warp's step number `count` (stage count % S, phase (count / S) & 1) has
    landed; returns the stage."""
    stage = b.op("rem.u32", count, Imm(S, "u32"))
    par = b.op("and.b32", b.op("div.u32", count, Imm(S, "u32")), Imm(1, "b32"))
    bar = b.op("mad.lo.u32", stage, Imm(8, "u32"), bars)
    top = b.label("stage_wait")
    b.place(top)
    ready = b.reg("pred")
    b.emit("mbarrier.try_wait.parity.shared::cta.b64", ready, Mem(bar), par)
    b.bra(top, pred=ready, neg=True, uniform=False)
    return stage


TMA_WARPS = 4
TMA_ROWS = {1: 4, 2: 4, 4: 4, 8: 2}  # rows per warp by T: one step's activations serve R rows (L1 wavefronts)
TMA_STAGES = 3  # per-warp ring of weight steps (each R x 640 B); 2 where shared memory is 100 KB per SM
TMA_MIN_CTAS = {1: 4, 2: 4, 4: 3, 8: 2}
# T ≤ 2 (the builds mul_mat runs): the pair table (`pairs` = (copies, warps, stages, CTAs per SM)) — one 64-bit
# lookup per qs byte, both of its weights' codebook values, from 256 bytes x `copies` x 8 bytes (32 copies: one per
# lane; 16: lanes l and l + 16 share one, a 64-bit access being served per half-warp), the byte dropped into the
# address by a prmt. H200, µs through mul_mat, T=1 on 18944x3584 / 3584x18944 / 4096x14336 / 14336x4096 / 3584² /
# 4608x3584 (bench/results/probe_tq4_pairs_session17.log): 16-entry table (4 warps, 3 stages, 4 CTAs) 24.9 / 25.8 /
# 22.1 / 21.2 / 11.9 / 12.3; (32, 8, 2, 2) 24.4 / 23.9 / 20.2 / 20.4 / 11.2 / 13.0; (16, 8, 3, 2) 25.3 / 25.2 / 21.3 /
# 22.6 / 11.7 / 14.1; (16, 4, 3, 3) 25.4 / 29.7 / 23.9 / 21.4 / 9.9 / 12.1; **(16, 4, 2, 4)** 23.7 / 24.2 / 20.4 / 19.6 /
# 11.3 / 11.4 (T=2: 30.9 / 28.7 / 23.5 / 24.5 / 12.4 / 12.7 vs 29.5 / 31.3 / 26.0 / 24.5 / 13.1 / 13.7). An LDS.64 is
# two L1 wavefronts (2026-11-29), so the lookups cost the same wavefronts per weight as before; the gain is issue:
# per 128 weights of a step 550 → 390 SASS (prmt + lea + LDS.64 per byte, an FFMA per weight)
TMA_PAIRS = {1: (16, 4, 2, 4), 2: (16, 4, 2, 4)}


class _TmaLanesShape(NamedTuple):
    """build_tma_lanes' shape: tokens, rows per warp, warps, ring stages, pair-table copies (None: the 16-entry
    table) and the table's bytes, bytes per ring stage, resident CTAs per SM."""
    Tn: int
    R: int
    NW: int
    S: int
    copies: int | None
    table_bytes: int
    stage_bytes: int
    min_ctas: int
    codec: object  # the weights' codec (TQ4_1S): its block loads, codebook tables, box columns
    fmt: str


@dataclass
class _TmaLanesLoop:
    """What build_tma_lanes' step loop works on: the shape, the ring, the tables, the per-lane registers."""
    b: KernelBuilder
    k: _TmaLanesShape
    lane: Reg
    issue: Callable  # issue(jb, stage): lane 0's TMA box of the step at block jb into a ring stage
    ring: Reg
    bars: Reg
    lut: Reg | None  # the 16-entry codebook (no pair table)
    ptab: Reg  # the aligned dynamic shared memory: the pair table (pairs)
    lanec: Reg | None  # the lane's part of a pair-table offset (pairs)
    nblk: Reg
    nfull: Reg  # blocks in full steps
    stride: Reg  # blocks between this split's steps
    jb: Reg  # the step's first block
    count: Reg  # steps consumed by this warp (ring position and phase)
    w: list  # R x 5 words: the lane's block of each row
    blk: Reg
    live: Reg
    actptr: list
    lane16: Reg
    acc: list  # R x Tn fp32 accumulators
    early: bool  # all of a step's activations in registers (32·T): loaded before the weights' wait
    bases: dict = field(default_factory=dict)  # token → the step's activation pointer (set by element 0's load)


def _tma_lanes_shape(arch, Tn, pairs, fmt):
    """build_tma_lanes' shape: from `pairs` (copies, warps, stages, CTAs per SM), else TMA_WARPS / TMA_STAGES /
    TMA_MIN_CTAS."""
    R, tq = TMA_ROWS[Tn], codecs.get(fmt)
    if pairs:
        copies, NW, S, min_ctas = pairs
        table_bytes = tq.pair_table_bytes(copies)
    else:
        copies, NW, min_ctas, table_bytes = None, TMA_WARPS, TMA_MIN_CTAS[Tn], 0
        S = TMA_STAGES if arch.max_smem_per_block >= 200 * 1024 else 2
    return _TmaLanesShape(Tn, R, NW, S, copies, table_bytes, R * tq.STEP_ROW_BYTES, min_ctas, tq, fmt)


def _tma_lanes_head(arch, k):
    """build_tma_lanes' ABI (tmap_w, a, y, m, k, ntok, part, counters), launch bounds, dynamic shared memory and
    meta, then the parameters' loads and the warp's rows: (b, the head dict as `_lane_head`'s, the tensor map
    parameter, the dynamic shared memory)."""
    Tn, R, NW, S, copies, table_bytes, stage_bytes, min_ctas, tq, fmt = k
    name = GemvKernel("gemv", fmt, Tn, tma=True).name
    box = tq.STEP_ROW_BYTES // 4  # u32 a row: one step's 32 blocks
    b = KernelBuilder(name, arch, f"{fmt} GEMV (exact), {Tn} token(s), {R} rows per warp, weights by TMA"
                      + (", codebook pairs by byte" if copies else ""), block=(32 * NW, 1, 1))
    tw_p = b.param("tmap_w", "b8", "tensormap", array=128, align=64)  # u32 [M][K·20/128], box 160 x R, no swizzle
    a_p, y_p = b.param("a", "u64", "ptr:in"), b.param("y", "u64", "ptr:out")
    m_p, k_p, n_p = b.param("m", "u32"), b.param("k", "u32"), b.param("ntok", "u32")
    part_p, cnt_p = b.param("part", "u64", "ptr:scratch"), b.param("counters", "u64", "ptr:scratch")
    b.directives += [f".maxntid {32 * NW}, 1, 1", f".minnctapersm {min_ctas}"]
    b.pdl_trigger()  # the op's last kernel: the next op's first may start (it waits for this one)
    # + 128: aligned up at run time (TMA destination); the pair table first, then the rings
    ring_sym = b.dynamic_shared(table_bytes + NW * S * stage_bytes + 128)
    b.meta.update(split_k="gridDim.y splits the K steps (a step: 32 lanes x 32 columns); part: splits x ntok x m "
                          "fp32, counters: one u32 per warp (zero, left zero)", ctas_per_sm=min_ctas,
                  tokens=Tn, rows_per_cta=R * NW, rows_per_warp=R, warps=NW, grid="ceil(m / rows_per_cta)",
                  layout="lanes", pdl=arch.has("griddepcontrol"), fmt=fmt, mode="exact", lane_cols=32,
                  fused_rotation=False, activation="prep_tq4_1s(x) (lane layout)", copy="tma",
                  tensormaps=f"tmap_w: u32, dims (k*{tq.BLOCK_BYTES}/128, m), box ({box}, {R}), no swizzle; needs "
                             "k % 128 == 0",
                  tma_box=(box, R),
                  stages=S, dynamic_smem=b.dynamic_smem)
    if copies:
        b.meta.update(lookup=f"one ld.shared.v2.f32 per qs byte: (C[lo nibble], C[hi nibble]) from a "
                             f"{table_bytes // 1024} KB table (256 bytes x {copies} copies, lane l reads copy "
                             f"l % {copies})")
    h = {"part_p": part_p, "cnt_p": cnt_p}
    A, Y = b.ptr(a_p), b.ptr(y_p)
    M, K, ntok = b.ld_param(m_p, "u32"), b.ld_param(k_p, "u32"), b.ld_param(n_p, "u32")
    tid, lane, warp, gwarp, row0 = _warp_rows(b, NW, R)
    h.update(M=M, lane=lane, gwarp=gwarp, row0=row0, ntok=ntok, A=A, W=None, Y=Y, K=K, tid=tid, warp=warp)
    return b, h, tw_p, ring_sym


def _tma_lanes_tables(b, k, h, ring_sym, leader):
    """The warp's ring and stage barriers, and the codebook: the pair table (every thread) or the 16-entry table
    (threads 0-15), behind one CTA barrier. Returns (ring, bars, lut, the pair table, the lane's pair offset)."""
    tid, lane = h["tid"], h["lane"]
    lut_sym = None if k.copies else b.shared_buffer("lut", k.codec.LUT_BYTES, align=k.codec.LUT_BYTES)
    ring, bars, ptab = _warp_rings(b, ring_sym, h["warp"], leader, k.NW, k.S, k.stage_bytes,
                                   skip=k.table_bytes)  # table at ptab
    lut = lanec = None
    if k.copies:
        lanec = k.codec.pair_lane_term(b, lane, k.copies)
        b.comment(f"the pair table ({k.table_bytes // 1024} KB, every thread); one CTA barrier for it and the stage "
                  "barriers")
        k.codec.fill_pair_table(b, ptab, tid, lane, k.copies, 32 * k.NW)
    else:
        lut = b.op("mov.u32", lut_sym)
        b.comment("the 16-entry codebook (threads 0-15); one CTA barrier for it and the stage barriers")
        k.codec.lut_fill(b, tid, lut)
    b.emit("fence.proxy.async.shared::cta")
    b.emit("bar.sync", Imm(0, "u32"))
    return ring, bars, lut, ptab, lanec


def _tma_lanes_prologue(arch, b, k, h, tw_p, leader, ring, bars, lut, ptab, lanec):
    """Activation pointers, zeroed accumulators, this split's first S steps into the ring (then, behind the
    prep, griddepcontrol.wait) and the step loop's registers."""
    Tn, R, S = k.Tn, k.R, k.S
    lane, row0 = h["lane"], h["row0"]
    nblk = b.op("shr.u32", h["K"], Imm(5, "u32"))
    row_bytes = k.codec.blocks_bytes(b, nblk)
    _, actptr, lane16 = _lane_pointers(b, {**h, "W": b.op("mov.u64", Imm(0, "u64"))}, 0, Tn, nblk, row_bytes,
                                       T4.LANE_GROUP_F32, with_lane16=True)
    tw = b.op("cvta.param.u64", b.op("mov.b64", tw_p))
    acc = [[b.reg("f32") for _ in range(Tn)] for _ in range(R)]
    for row in acc:
        for r_ in row:
            b.emit("mov.f32", r_, Imm(0.0, "f32"))

    kz, nsplit = b.special("ctaid.y"), b.special("nctaid.y")
    stride = b.op("shl.b32", nsplit, Imm(5, "u32"))
    nfull = b.op("and.b32", nblk, Imm(~31 & 0xFFFFFFFF, "b32"))
    issue = partial(_tma_step, b, tw, leader, nblk, bars, ring, k.stage_bytes, row0, col=partial(k.codec.box_column, b))

    jb = b.op("shl.b32", kz, Imm(5, "u32"))
    b.comment(f"fill the ring: this split's steps 0 .. {S - 1}")
    for s_ in range(S):
        issue(b.op("mad.lo.u32", stride, Imm(s_, "u32"), jb), s_)
    if arch.has("griddepcontrol"):  # launched early behind prep_tq4_1s: weights in flight, now wait for it
        b.emit("griddepcontrol.wait")
    g = b.op("mov.u32", Imm(0, "u32"))  # steps consumed by this warp (ring position and phase)
    w = [k.codec.block_regs(b) for _ in range(R)]
    blk, live = b.reg("u32"), b.reg("pred")
    return _TmaLanesLoop(b, k, lane, issue, ring, bars, lut, ptab, lanec, nblk, nfull, stride, jb, g, w, blk, live,
                         actptr, lane16, acc, early=Tn <= 2)


def _tma_lanes_take(s, tail):
    """Wait for step jb's stage, read this lane's block of each row, hand the stage back to TMA with step
    jb + S·stride."""
    b, k = s.b, s.k
    stage = _wait_step(b, s.bars, s.count, k.S)
    src = b.op("mad.lo.u32", s.lane, Imm(s.k.codec.BLOCK_BYTES, "u32"), b.op("mad.lo.u32", stage, Imm(k.stage_bytes, "u32"),
                                                                      s.ring))
    for r in range(k.R):
        s.k.codec.load_block(b, s.w[r], src, s.k.codec.STEP_ROW_BYTES * r, shared=True)
    if not tail:  # every lane has read its words before lane 0 lets TMA overwrite the stage
        b.emit("bar.warp.sync", Imm(0xFFFFFFFF, "b32"))
        s.issue(b.op("mad.lo.u32", s.stride, Imm(k.S, "u32"), s.jb), stage)
    b.emit("add.u32", s.count, s.count, Imm(1, "u32"))


def _tma_lanes_acts(s, tail, chunks=range(8)):
    """This lane's activation values of every token for step jb, elements 4c .. 4c+3 for c in `chunks`
    (lane-layout rows c, 512 bytes apart); zeros past the row's end."""
    b, Tn = s.b, s.k.Tn
    if chunks[0] == 0:
        b.emit("add.u32", s.blk, s.jb, s.lane)
        if tail:
            b.emit("setp.lt.u32", s.live, s.blk, s.nblk)
        g32 = b.op("mul.wide.u32", b.op("shr.u32", s.blk, Imm(5, "u32")), Imm(T4.LANE_GROUP_F32, "u32"))
        for t in range(Tn):
            s.bases[t] = b.op("add.s64", b.op("add.s64", s.actptr[t], g32), s.lane16)
    acts = {}
    for t in range(Tn):
        for c in chunks:
            regs = [b.reg("f32") for _ in range(4)]
            if tail:
                for r_ in regs:
                    b.emit("mov.f32", r_, Imm(0.0, "f32"))
            b.emit("ld.global.nc.v4.f32", b.vec(regs), Mem(s.bases[t], 512 * c), pred=s.live if tail else None)
            for e in range(4):
                acts[t, 4 * c + e] = regs[e]
    return acts


def _tma_lanes_compute(s, acts, tail):
    """One step's FFMAs: per half block, each row's codebook lookups times every token's activation into two
    chains, closed into acc by the half's scale (without `early`, the activations load 8·T at a time here)."""
    b, Tn, R, copies = s.b, s.k.Tn, s.k.R, s.k.copies
    w = s.w
    scales = [s.k.codec.block_scales(b, w[r]) for r in range(R)]
    for hh in range(2):
        part = [[[None, None] for _ in range(Tn)] for _ in range(R)]
        for i in range(2):
            wi = 2 * hh + i  # elements 8·wi .. 8·wi+7
            if not s.early:  # 8·T registers at a time
                acts = _tma_lanes_acts(s, tail, range(2 * wi, 2 * wi + 2))
            for r in range(R):
                qw = s.k.codec.qs_word(w[r], wi)
                if copies:  # byte j: elements 2j (low nibble) and 2j + 1, the same FMA order as below
                    for j in range(4):
                        vals = s.k.codec.pair_lookup(b, qw, j, s.lanec, copies, s.ptab)
                        for e in (2 * j, 2 * j + 1):
                            _pair_fma(b, part[r], vals[e % 2], e, [acts[t, 8 * wi + e] for t in range(Tn)])
                    continue
                lo4, hi4 = s.k.codec.lut_nibbles(b, qw)
                for e in range(8):  # element 8·wi + e
                    _pair_fma(b, part[r], s.k.codec.lut_value(b, lo4, hi4, s.lut, e), e,
                              [acts[t, 8 * wi + e] for t in range(Tn)])
        _close_half(b, part, s.acc, scales, hh)


def _tma_lanes_prefetch(s, regs, jn):
    """T = 1: step jn's 32 values into `regs`: plain loads for a full step, zeros and predicated loads for the
    tail step, nothing past the end (all warp-uniform branches)."""
    b, nblk = s.b, s.nblk
    full, part, fin = b.label("pf_full"), b.label("pf_part"), b.label("pf_done")
    b.bra(fin, pred=b.op("setp.ge.u32", jn, nblk))
    bn = b.op("add.u32", jn, s.lane)
    g32 = b.op("mul.wide.u32", b.op("shr.u32", bn, Imm(5, "u32")), Imm(T4.LANE_GROUP_F32, "u32"))
    base0 = b.op("add.s64", b.op("add.s64", s.actptr[0], g32), s.lane16)
    b.bra(part, pred=b.op("setp.gt.u32", b.op("add.u32", jn, Imm(32, "u32")), nblk))
    b.place(full)
    for c in range(8):
        b.emit("ld.global.nc.v4.f32", b.vec(regs[4 * c:4 * c + 4]), Mem(base0, 512 * c))
    b.bra(fin)
    b.place(part)
    ok = b.op("setp.lt.u32", bn, nblk)
    for c in range(8):
        for r_ in regs[4 * c:4 * c + 4]:
            b.emit("mov.f32", r_, Imm(0.0, "f32"))
        b.emit("ld.global.nc.v4.f32", b.vec(regs[4 * c:4 * c + 4]), Mem(base0, 512 * c), pred=ok)
    b.place(fin)


def _tma_lanes_steps_t1(s, loop, done):
    """T = 1's step loop: the next step's activations are loaded while this step computes (two register sets,
    the loop unrolled by two), so the L2 latency of the activation is off the critical path; then the tail."""
    b, jb, stride, nfull = s.b, s.jb, s.stride, s.nfull
    sets = [[b.reg("f32") for _ in range(32)] for _ in range(2)]

    def as_acts(regs):
        return {(0, e): regs[e] for e in range(32)}

    tails = [b.label("tail_a"), b.label("tail_b")]
    _tma_lanes_prefetch(s, sets[0], jb)
    b.bra(tails[0], pred=b.op("setp.ge.u32", jb, nfull))
    b.place(loop)
    for i in range(2):
        _tma_lanes_prefetch(s, sets[1 - i], b.op("add.u32", jb, stride))
        _tma_lanes_take(s, False)
        _tma_lanes_compute(s, as_acts(sets[i]), False)
        b.emit("add.u32", jb, jb, stride)
        if i == 0:
            b.bra(tails[1], pred=b.op("setp.ge.u32", jb, nfull))
    b.bra(loop, pred=b.op("setp.lt.u32", jb, nfull))
    for i in range(2):
        b.place(tails[i])
        b.comment("the tail step, if this split owns it: TMA zero-filled the weights past the row's end")
        b.bra(done, pred=b.op("setp.ge.u32", jb, s.nblk))
        _tma_lanes_take(s, True)
        _tma_lanes_compute(s, as_acts(sets[i]), True)
        if i == 0:
            b.bra(done)


def _tma_lanes_steps(s, loop, tail_l, done):
    """T ≥ 2's step loop: a step's first activations before its weights' wait (T = 2: all 32·T; else elements
    0-3, `_tma_lanes_compute` loading 8·T at a time); then the tail step."""
    b, jb, stride, nfull = s.b, s.jb, s.stride, s.nfull
    first = range(8) if s.early else range(1)
    b.bra(tail_l, pred=b.op("setp.ge.u32", jb, nfull))
    b.place(loop)
    acts = _tma_lanes_acts(s, False, first)
    _tma_lanes_take(s, False)
    _tma_lanes_compute(s, acts, False)
    b.emit("add.u32", jb, jb, stride)
    b.bra(loop, pred=b.op("setp.lt.u32", jb, nfull))
    b.place(tail_l)
    b.comment("the tail step (blocks not a multiple of 32), if this split owns it: TMA zero-filled past the row")
    b.bra(done, pred=b.op("setp.ge.u32", jb, s.nblk))
    acts = _tma_lanes_acts(s, True, first)
    _tma_lanes_take(s, True)
    _tma_lanes_compute(s, acts, True)


def build_tma_lanes(arch, Tn: int, pairs: tuple | None = None, fmt: str = "tq4_1s"):
    """Exact TQ4_1S GEMV with the weights brought in by TMA (sm_90a; K a multiple of 128).

    The lane-per-block schedule of `build_lanes` (lane l owns block jb + l of each of the warp's R rows), with
    each step's weights — R rows x 32 blocks, 640 contiguous bytes per row — copied into the warp's own
    3-stage shared-memory ring by one 2-D TMA box (u32 elements, 160 x R, zero-filled past the row's end and
    past M), completion on the stage's mbarrier; a lane reads its block back at stride 20 bytes (5 words,
    distinct banks). Why: the ld.global kernel is bound by L1 data wavefronts (ncu: L1/TEX 83%, DRAM 39%):
    besides the codebook lookups (one LDS wavefront per 32 weights, fixed), five 20-byte-strided loads per
    lane per row touch five lines each, and one step's activations serve only 2 rows (R = 4 here; 8 measured
    slower: 154 registers, 10 warps per SM). At T = 1 the next step's activations are loaded while this one
    computes; at T = 2 a step's are all issued before it waits for its weights. Lookups, FFMA order and the
    split-K store are those of `build_lanes` (the same fp32 operations per lane). `pairs` (TMA_PAIRS: the T ≤ 2
    builds): the codebook values come two at a time, one LDS.64 per qs byte from the pair table, in the same
    FFMA order (same bits); its (copies, warps, stages, CTAs per SM) replace TMA_WARPS / TMA_STAGES / TMA_MIN_CTAS."""
    arch.require("cp_async_bulk_tensor", "the TMA-fed TQ4_1S GEMV", "use gemv_tq4_1s_t* (ld.global)")
    k = _tma_lanes_shape(arch, Tn, pairs, fmt)
    b, h, tw_p, ring_sym = _tma_lanes_head(arch, k)
    leader = b.op("setp.eq.u32", h["lane"], Imm(0, "u32"))
    ring, bars, lut, ptab, lanec = _tma_lanes_tables(b, k, h, ring_sym, leader)
    s = _tma_lanes_prologue(arch, b, k, h, tw_p, leader, ring, bars, lut, ptab, lanec)
    loop, tail_l, done = b.label("step"), b.label("tail"), b.label("steps_done")
    if Tn == 1:
        _tma_lanes_steps_t1(s, loop, done)
    else:
        _tma_lanes_steps(s, loop, tail_l, done)
    b.place(done)
    sums = {(r, t): s.acc[r][t] for r in range(k.R) for t in range(Tn)}
    _lane_epilogue(b, sums, h["lane"], h["gwarp"], h["row0"], h["M"], h["ntok"], h["Y"], h["part_p"], h["cnt_p"])
    return b.finish()


MMA_WARPS = 4  # tensor-core TQ4_1S GEMV: 4 warps of 16·MMA_MTILES rows
MMA_STEP = 4  # blocks per TMA box (32 rows x 20 u32: an 80-byte smem row stride, conflict-free), a multiple of 4
# so that each box starts 16-byte aligned in the row (6-block boxes, 120 bytes apart, stopped the H200 with an
# illegal instruction; the emulator checks it). History (bench/NOTES.md, 2026-11-29): 16-block steps had 9 warps
# per SM and stalled on the B-tile loads (63 us at any T); 12-block steps in 2 stages were slower than 8 in 3
MMA_STAGES = 3
MMA_ROW_WORDS = 20  # ≥ 5·MMA_STEP, a multiple of 4 (16-byte TMA rows), 4 mod 8 words (rows g = 0..7 in distinct banks)
MMA_AHEAD = 2  # B tiles are loaded this many blocks ahead (one ahead left every other block's first MMA waiting
# on them: ncu showed those loads sharing a scoreboard with the next block's)
MMA_SETS = 4  # B-tile register sets (virtual; > MMA_AHEAD, dividing MMA_STEP so that every step uses the same)
MMA_MTILES = 2  # m16 tiles per warp: each B-tile load and its address work serve 32 rows (T=8 on the H200 vs one
# tile with 8-block steps: 40.2 / 43.1 / 39.5 us vs 41.9 / 44.0 / 43.5 on 18944x3584 / 3584x18944 / 14336x4096,
# 21.3 vs 18.8 on 3584x3584)
MMA_CTAS = 5  # resident CTAs per SM of the per-element-table build (96 registers; 5 x (30 KB rings + 2 KB table))
# both builds (MMA_PAIRS = (copies, warps, stages, CTAs per SM)): the A words of a qs byte's two elements, (hi, hi)
# and (lo, lo), in one LDS.64 from a 32 KB pair table (16 copies) instead of a 4-byte lookup per element and two prmt
# per byte. H200, µs through mul_mat at T=8 on 18944x3584 / 3584x18944 / 4096x14336 / 14336x4096 / 3584² /
# 4608x3584 (bench/results/probe_tq4_mma_pairs*_session17.log): per-element table 40.3 / 43.2 / 39.2 / 39.7 / 18.8 /
# 18.8; (16, 4, 2, 4) 36.4 / 39.9 / 32.0 / 31.7 / 17.3 / 17.7; **(16, 8, 2, 2)** 35.5-35.7 / 38.1-38.2 / 32.2-32.3 /
# 31.3-31.8 / 16.2-16.4 / 16.9-17.1. Two LDS.32 per byte from 32-copy hi and lo tables (no register moves between
# the LDS.64 pair and the hi and lo A quads: 699 → 509 SASS per step) measured no faster: not issue-bound
MMA_PAIRS = (16, 8, 2, 2)
# gemv_tq4_1s_mma_m16: one m16 tile per warp, 8-block steps (176-byte rows) — on the H200 faster than two tiles
# where the matrix is small (T=8: 18.8 / 18.9 vs 21.3 / 20.8 us on 3584x3584 / 4608x3584: more CTAs)
MMA_M16_STEP, MMA_M16_ROW_WORDS = 8, 44


def build_mma_gemv(arch, small: bool = False, pairs: tuple | None = MMA_PAIRS, fmt: str = "tq4_1s"):
    """Exact TQ4_1S GEMV for up to 8 tokens on tensor cores (mul_mat's exact TQ4_1S path for slices of 3-8
    tokens on sm_90, 5-8 on small matrices; bench/NOTES.md (2026-11-29 and 2026-11-30) has every version
    measured on the H200).

    Why: the FFMA lane kernels pay one FFMA per weight and token (T = 8: 3.1x the time of T = 1 on the H200;
    this kernel does 8 tokens' work at any T: 1.67x). Here a warp owns 16·MMA_MTILES rows; per m16 tile and half block (16 elements, one fp16 scale) it runs
    mma.sync m16n8k16 three times, A_hi·B_hi + A_hi·B_lo + A_lo·B_hi: A = the codebook values of the 16 x 16
    weights split into fp16 hi + lo (`pairs`, MMA_PAIRS: one conflict-free LDS.64 per qs byte of its two
    elements' (hi, hi) and (lo, lo) words; pairs=None: one lookup per element of a (hi, lo) word and two prmt per
    byte, MMA_WARPS / MMA_STAGES / MMA_CTAS), B = the 8 tokens' rotated activation, scaled per (token, block) by 2^s and split the same way
    by `prep_tq4_1s_mma` (ptxgen.formats.tq4_1s.to_mma_tiles); the dropped lo·lo term is ~2^-22 relative.
    Each C fragment is scaled by the row's d_h (FFMA) and, per block, by the token's 2^-s. The A fragments, the
    scales and their K order (matched by the tile layout) are the codec's (codecs/tq4_1s.py MmaGemvDecoder, the
    tables mma_table_fill). Weights come by TMA as in `build_tma_lanes` (box: 16 rows x MMA_ROW_WORDS u32 per
    m16 tile, MMA_STAGES stages); B tiles and factors load MMA_AHEAD blocks ahead. Lane
    (g, t) ends with rows g, g + 8 x tokens 2t, 2t + 1: no cross-lane reduction. Split-K over gridDim.y with
    the lane kernels' last-warp fixup."""
    arch.require("cp_async_bulk_tensor", "the tensor-core TQ4_1S GEMV", "use gemv_tq4_1s_t8")
    tq = codecs.get(fmt)  # the codec's box columns, codebook tables and A-fragment decoder (TQ4_1S's)
    NW, S, ctas, copies = MMA_WARPS, MMA_STAGES, MMA_CTAS, None  # copies None: the per-element table
    if pairs:
        copies, NW, S, ctas = pairs
    MT, STEP, ROW_WORDS = (1, MMA_M16_STEP, MMA_M16_ROW_WORDS) if small else (MMA_MTILES, MMA_STEP, MMA_ROW_WORDS)
    assert MT in (1, 2, 4)
    R = 16 * MT  # rows per warp
    row_stride = ROW_WORDS * 4
    stage_bytes = R * row_stride
    b = KernelBuilder(GemvKernel("mma", fmt, small=small).name, arch,
                      f"tq4_1s GEMV (exact) for up to 8 tokens on mma.sync, {R} rows per warp, weights by TMA",
                      block=(32 * NW, 1, 1))
    tw_p = b.param("tmap_w", "b8", "tensormap", array=128, align=64)
    bt_p, f_p, y_p = b.param("tiles", "u64", "ptr:in"), b.param("factors", "u64", "ptr:in"), b.param("y", "u64", "ptr:out")
    m_p, k_p, n_p = b.param("m", "u32"), b.param("k", "u32"), b.param("ntok", "u32")
    part_p, cnt_p = b.param("part", "u64", "ptr:scratch"), b.param("counters", "u64", "ptr:scratch")
    b.directives += [f".maxntid {32 * NW}, 1, 1", f".minnctapersm {ctas}"]
    b.pdl_trigger()  # the op's last kernel: the next op's first may start (it waits for this one)
    ring_sym = b.dynamic_shared(NW * S * stage_bytes + 128)
    b.meta.update(split_k=f"gridDim.y splits the K steps (a step: {STEP} blocks); part: splits x ntok x m fp32, counters: "
                          "one u32 per warp (zero, left zero)", ctas_per_sm=ctas, tokens=8, rows_per_cta=R * NW,
                  rows_per_warp=R, warps=NW, grid="ceil(m / rows_per_cta)", fmt=fmt, mode="exact",
                  lane_cols=STEP, max_splits=32, layout="mma", activation="prep_tq4_1s_mma(x): tiles + factors", copy="tma",
                  tensormaps=f"tmap_w: u32, dims (k*{tq.BLOCK_BYTES}/128, m), box ({ROW_WORDS}, {R}), no swizzle; "
                             "k % 128 == 0",
                  tma_box=(ROW_WORDS, R),
                  stages=S, dynamic_smem=b.dynamic_smem, pdl=arch.has("griddepcontrol"))
    BT, F, Y = b.ptr(bt_p), b.ptr(f_p), b.ptr(y_p)
    M, K, ntok = b.ld_param(m_p, "u32"), b.ld_param(k_p, "u32"), b.ld_param(n_p, "u32")
    tid = b.special("tid.x")
    lane = b.op("and.b32", tid, Imm(31, "b32"))
    warp = b.op("shr.u32", tid, Imm(5, "u32"))
    gwarp = b.op("mad.lo.u32", b.special("ctaid.x"), Imm(NW, "u32"), warp)
    row0 = b.op("shl.b32", gwarp, Imm(R.bit_length() - 1, "u32"))  # R = 16·MT, MT a power of two
    g = b.op("shr.u32", lane, Imm(2, "u32"))
    t = b.op("and.b32", lane, Imm(3, "b32"))
    leader = b.op("setp.eq.u32", lane, Imm(0, "u32"))

    table_sym = b.shared_buffer("codebook", tq.mma_table_bytes(copies), align=16)
    ring, bars, _ = _warp_rings(b, ring_sym, warp, leader, NW, S, stage_bytes)
    tbl = b.op("mov.u32", table_sym)
    lanec = tq.mma_table_fill(b, tbl, tid, lane, copies, 32 * NW)
    b.emit("fence.proxy.async.shared::cta")
    b.emit("bar.sync", Imm(0, "u32"))

    nblk = b.op("shr.u32", K, Imm(5, "u32"))
    tw = b.op("cvta.param.u64", b.op("mov.b64", tw_p))
    acc = b.regs("f32", 4 * MT)  # per m16 tile mt: (row 16mt + g, token 2t), (.., 2t + 1), (16mt + g + 8, 2t), (..)
    for r_ in acc:
        b.emit("mov.f32", r_, Imm(0.0, "f32"))
    kz, nsplit = b.special("ctaid.y"), b.special("nctaid.y")
    stride = b.op("mul.lo.u32", nsplit, Imm(STEP, "u32"))

    def issue(jb, stage):
        _tma_step(b, tw, leader, nblk, bars, ring, stage_bytes, row0, jb, stage, col=partial(tq.box_column, b))

    jb, gcount = _fill_ring(b, arch, issue, kz, stride, STEP, S)
    # per lane: the codec's decoder (its offsets in a stage), this lane's 16 bytes in a B tile and the factor pair
    # of tokens 2t, 2t + 1
    dec = tq.MmaGemvDecoder(b, g, t, lane, tbl, lanec, copies, row_stride)
    lane16 = b.op("mul.wide.u32", lane, Imm(16, "u32"))
    t8 = b.op("mul.wide.u32", t, Imm(8, "u32"))
    czero = [b.op("mov.f32", Imm(0.0, "f32")) for _ in range(4)]  # C of each half block's first MMA

    # B tiles and factors of one block, loaded a block ahead into one of two register sets (the first run
    # waited on these loads: long_scoreboard 5 per issue); the step's pointers, blocks at immediate offsets
    D = MMA_AHEAD
    assert STEP % MMA_SETS == 0 and MMA_SETS > D and ROW_WORDS >= tq.BLOCK_WORDS * STEP and ROW_WORDS % 8 == 4
    sets = [(b.regs("b32", 8), b.regs("f32", 2)) for _ in range(MMA_SETS)]
    p_b, s_b = _tile_pointer(b, jb, stride, BT, lane16, g, ntok)
    p_f = b.op("add.s64", b.op("mad.wide.u32", jb, Imm(32, "u32"), F), t8)
    s_f = b.op("mul.wide.u32", stride, Imm(32, "u32"))

    def load_b(pb, pf, bl, dst, pred=None):
        """Block bl after the pointers' block (if `pred`): its B tiles (hi0, hi1, lo0, lo1 of each half) and its
        token factors (2t, 2t + 1) into register set dst."""
        bregs, fregs = sets[dst]
        for h in range(2):
            b.emit("ld.global.nc.v4.u32", b.vec(bregs[4 * h:4 * h + 4]), Mem(pb, (2 * bl + h) * T4.MMA_TILE), pred=pred)
        b.emit("ld.global.nc.v2.f32", b.vec(fregs), Mem(pf, 32 * bl), pred=pred)

    def block(stage_base, bl, cur):
        """Block bl of the step (B tiles and factors in register set cur): 2 halves x 3 MMAs, row scales, token
        factors into acc."""
        sm = dec.block_base(stage_base, bl)
        ds = dec.row_scales(sm, MT)  # rows g + 8rr
        qbase = dec.qs_base(sm)
        bregs, (fa, fb) = sets[cur]
        blk = [None] * (4 * MT)
        for h in range(2):
            bh0, bh1, bl0, bl1 = bregs[4 * h:4 * h + 4]
            for mt in range(MT):
                ahi, alo = dec.fragments(qbase, h, mt)
                c = b.regs("f32", 4)
                b.emit(mma_sync(arch, "m16n8k16", "f16", b.vec(c), b.vec(ahi), b.vec([bh0, bh1]), b.vec(czero)))
                b.emit(mma_sync(arch, "m16n8k16", "f16", b.vec(c), b.vec(ahi), b.vec([bl0, bl1]), b.vec(c)))
                b.emit(mma_sync(arch, "m16n8k16", "f16", b.vec(c), b.vec(alo), b.vec([bh0, bh1]), b.vec(c)))
                for i in range(4):  # c0, c1: row 16mt + g; c2, c3: row 16mt + g + 8
                    d_, o = ds[2 * mt + i // 2][h], 4 * mt + i
                    blk[o] = b.op("mul.rn.f32", c[i], d_) if h == 0 else b.op("fma.rn.f32", c[i], d_, blk[o])
        for i in range(4 * MT):
            b.emit("fma.rn.f32", acc[i], blk[i], fa if i % 2 == 0 else fb, acc[i])

    loop, done = b.label("step"), b.label("steps_done")
    b.bra(done, pred=b.op("setp.ge.u32", jb, nblk))
    for bl in range(D):
        load_b(p_b, p_f, bl, bl, b.op("setp.lt.u32", b.op("add.u32", jb, Imm(bl, "u32")), nblk))
    b.place(loop)
    stage = _wait_step(b, bars, gcount, S)
    sbase = b.op("mad.lo.u32", stage, Imm(stage_bytes, "u32"), ring)
    nxt = None
    for bl in range(STEP):  # block bl uses set bl % MMA_SETS (STEP a multiple of it: the same sets every step)
        j = b.op("add.u32", jb, Imm(bl, "u32"))
        skip = b.label("past_end")
        b.bra(skip, pred=b.op("setp.ge.u32", j, nblk))  # the last step of a row may be short (uniform)
        if bl + D < STEP:
            load_b(p_b, p_f, bl + D, (bl + D) % MMA_SETS, b.op("setp.lt.u32", b.op("add.u32", j, Imm(D, "u32")), nblk))
        else:  # one of the next step's first blocks
            nxt = nxt or (b.op("add.s64", p_b, s_b), b.op("add.s64", p_f, s_f))
            nb = bl + D - STEP
            load_b(nxt[0], nxt[1], nb, (bl + D) % MMA_SETS,
                   b.op("setp.lt.u32", b.op("add.u32", b.op("add.u32", jb, stride), Imm(nb, "u32")), nblk))
        block(sbase, bl, bl % MMA_SETS)
        b.place(skip)
    _next_step(b, issue, stride, S, jb, stage, gcount, ((p_b, s_b), (p_f, s_f)), loop, nblk)
    b.place(done)
    _fragment_epilogue(b, acc, g, t, gwarp, row0, M, ntok, Y, part_p, cnt_p)
    return b.finish()


def _next_step(b, issue, stride, S, jb, stage, count, advances, loop, nblk):
    """The end of a tensor-core GEMV's step: every lane has read the stage (bar.warp.sync), so the copies may
    refill it with the step S ahead; the step counter, jb and the (pointer, stride) `advances` move on; back to
    `loop` while blocks remain."""
    b.emit("bar.warp.sync", Imm(0xFFFFFFFF, "b32"))  # every lane has read the stage: TMA may refill it
    issue(b.op("mad.lo.u32", stride, Imm(S, "u32"), jb), stage)
    b.emit("add.u32", count, count, Imm(1, "u32"))
    b.emit("add.u32", jb, jb, stride)
    for p_, s_ in advances:
        b.emit("add.s64", p_, p_, s_)
    b.bra(loop, pred=b.op("setp.lt.u32", jb, nblk))



def _tile_pointer(b, jb, stride, BT, lane16, g, ntok):
    """This lane's pointer into the B tiles at sub-block jb and its per-step advance. Lane (g, t) holds token g's
    elements only, and the prep writes zeros for tokens past T: a lane with g ≥ ntok keeps reading its zero slots
    of the first tiles (advance 0, L1-resident) instead of the whole activation's — at T = 1 the tiles' L2 → SM
    traffic drops 8x with the same loads, registers and sums (a predicated load would keep its old value live)."""
    p_live = b.op("add.s64", b.op("mad.wide.u32", jb, Imm(2 * T4.MMA_TILE, "u32"), BT), lane16)
    s_live = b.op("mul.wide.u32", stride, Imm(2 * T4.MMA_TILE, "u32"))
    if ntok is None:  # every lane live (the 16-token build runs 9-16 tokens: token group 0 is full)
        return p_live, s_live
    live = b.op("setp.lt.u32", g, ntok)
    return (b.op("selp.b64", p_live, b.op("add.s64", BT, lane16), live),
            b.op("selp.b64", s_live, b.op("mov.u64", Imm(0, "u64")), live))


Q4K_MMA_MTILES = 1  # Q4_K tensor-core GEMV: m16 tiles per warp (2: 228 registers, 2 CTAs per SM)
Q4K_MMA_STAGES = 3  # ring stages of one super-block (rows of the codec's MMA_ROW_BYTES)
# resident CTAs per SM and how many sub-blocks ahead the B tiles load (8-token build). v1 (per-sub-block fp32
# epilogue), H200, µs at T=8 (4096x14336 / 18944x3584 / 3584x3584): 4 CTAs (128 registers; ptxas sank half the
# loads to 20-110 SASS before their MMA) 27.7 / 35.4 / 14.3; 3 CTAs (168) 26.7 / 29.0 / 12.9; 3 CTAs one ahead
# 26.4 / 29.2 / 12.8. v2 (this): every load ≥ 120 SASS ahead at 4 CTAs; which residency wins depends on how many
# slots the grid fills, so mul_mat launches at 4 or 3 (more shared memory) per shape (ops._fullest_residency).
Q4K_MMA_CTAS = 4
Q4K_MMA_AHEAD = 2
Q4K_MMA_SETS = 4  # rotating B-tile register sets (≥ AHEAD + 2, dividing the 8 sub-blocks of a step)
Q4K_MMA_CTAS_N16 = 3  # the 16-token build: 168 registers


class _Q4kMmaShape(NamedTuple):
    """build_q4k_mma_gemv's shape: token groups of 8, weights by TMA (else cp.async), PDL, warps, ring stages, m16
    tiles and rows per warp, u32 per super-block row, sub-blocks per step, bytes per ring row and per stage."""
    NT: int
    tma: bool
    pdl: bool
    NW: int
    S: int
    MT: int
    R: int
    WORDS: int
    STEP: int
    row_stride: int
    stage_bytes: int
    codec: object  # the weights' codec (Q4_K): MMA_ROW_BYTES, mma_step_offset, mma_lane_offsets, MmaGemvDecoder


class _Q4kOperands(NamedTuple):
    """The Q4_K tensor-core GEMV's per-lane operands: the codec's decoder of the A fragments, the B-tile
    register sets and the tiles' / factors' / min fragments' pointers (advanced in place) and per-step strides."""
    czero: list  # C of each chain's first MMA
    dec: object  # the codec's MmaGemvDecoder: the lane's decode: stage offsets, fp16 constants, headers, A fragments
    D: int  # sub-blocks the B tiles load ahead
    NS: int  # rotating B-tile register sets
    sets: list  # [set][token group]: 8 b32
    p_b: Reg
    s_b: Reg
    p_f: Reg
    p_s: Reg
    s_f: Reg
    g_b: Reg | None  # NT > 1: one token group's tiles ...
    g_f: Reg | None  # ... and its factors or min fragments


@dataclass
class _Q4kMmaLoop:
    """What build_q4k_mma_gemv's K loop works on: the shape, the ring and its copies, the step registers (advanced
    in place), the accumulators, the lane's operands."""
    b: KernelBuilder
    arch: Arch
    k: _Q4kMmaShape
    issue: Callable  # issue(jb, stage): the step at sub-block jb into a ring stage
    ring: Reg
    bars: Reg | None  # TMA: the stages' mbarriers
    nblk: Reg
    stride: Reg
    jb: Reg
    count: Reg  # steps consumed by this warp (ring position and phase)
    acc: list  # index (nt·MT + mt)·4 + i
    ops: _Q4kOperands


def _q4k_mma_head(arch, NT, fmt):
    """build_q4k_mma_gemv's shape, ABI (tmap_w or w, tiles, factors, minfrag, y, m, k, ntok, part, counters), launch
    bounds, dynamic shared memory and meta, then the parameters' loads and the warp's rows: (b, shape, head dict,
    the weights' parameter, the dynamic shared memory)."""
    # the 8-token build on sm_90a: one TMA box per step (measured: 23.2 / 25.5 µs vs cp.async's 24.8 / 34.7 on
    # 4096x14336 / 18944x3584 at T=1). The 16-token build, and other targets: each lane cp.asyncs 16-byte chunks
    # (measured on the H200 at T=16: 18.9 / 34.8 / 34.0 µs vs TMA's 19.3 / 39.0 / 34.7 on 4096², 14336x4096,
    # 4096x14336); sm_89 has no TMA; sm_120a takes the TMA build (TMA_ARCHS)
    tma = arch.has_tma and NT == 1
    # programmatic dependent launch after the prep: the 8-token build measured 24.2 µs with it, 25.1 without
    # (14336x4096, T=8); the 16-token build 39.1 with, 34.8 without (T=16; 4096x4096 19.2 / 18.5, others within
    # 1%; bench/results/probe_pdl_session8.log): off there
    pdl = NT == 1 and arch.has("griddepcontrol")
    if not tma:
        arch.require("cp_async", "the tensor-core Q4_K GEMV", "use gemv_q4_k_t*")
    NW, S, MT = MMA_WARPS, Q4K_MMA_STAGES, Q4K_MMA_MTILES
    codec = codecs.get(fmt)
    R, WORDS, STEP = 16 * MT, codec.MMA_ROW_BYTES // 4, codec.MMA_STEP_SUBS  # rows a warp, u32 a row, sub-blocks a step
    row_stride = WORDS * 4
    stage_bytes = R * row_stride
    k = _Q4kMmaShape(NT, tma, pdl, NW, S, MT, R, WORDS, STEP, row_stride, stage_bytes, codec)
    name = GemvKernel("mma", fmt, 8 * NT).name
    b = KernelBuilder(name, arch, f"{fmt} GEMV (exact) for up to {8 * NT} tokens on mma.sync, weights by "
                      f"{'TMA' if tma else 'cp.async'}", block=(32 * NW, 1, 1))
    tw_p = b.param("tmap_w", "b8", "tensormap", array=128, align=64) if tma else b.param("w", "u64", "ptr:in")
    bt_p, f_p = b.param("tiles", "u64", "ptr:in"), b.param("factors", "u64", "ptr:in")
    s_p = b.param("minfrag", "u64", "ptr:in")
    y_p = b.param("y", "u64", "ptr:out")
    m_p, k_p, n_p = b.param("m", "u32"), b.param("k", "u32"), b.param("ntok", "u32")
    part_p, cnt_p = b.param("part", "u64", "ptr:scratch"), b.param("counters", "u64", "ptr:scratch")
    # the cp.async build (sm_89, sm_120a; not measured) at 3 CTAs: at 4, sm_120a's ptxas needs a stack frame
    ctas = (Q4K_MMA_CTAS if tma else 3) if NT == 1 else Q4K_MMA_CTAS_N16
    ring_sym = _mma_gemv_frame(b, NW, ctas, S, stage_bytes, NT, R, STEP, fmt,
                               activation="prep_mma_f16(x): tiles + factors + min fragments",
                               copy="tma" if tma else "cp.async")
    b.meta.update(stages=S, dynamic_smem=b.dynamic_smem, pdl=pdl)
    if tma:
        b.meta.update(tensormaps=f"tmap_w: u32, dims (k*{codec.BLOCK_BYTES}/1024, m), box ({WORDS}, {R}), no swizzle",
                      tma_box=(WORDS, R))
    h = {"part_p": part_p, "cnt_p": cnt_p}
    h["BT"], h["F"], h["SX"], h["Y"] = b.ptr(bt_p), b.ptr(f_p), b.ptr(s_p), b.ptr(y_p)
    h["M"], h["K"], h["ntok"] = b.ld_param(m_p, "u32"), b.ld_param(k_p, "u32"), b.ld_param(n_p, "u32")
    h["tid"], h["lane"], h["warp"], h["gwarp"], h["row0"] = _warp_rows(b, NW, R)
    return b, k, h, tw_p, ring_sym


def _mma_gemv_frame(b, NW, ctas, S, stage_bytes, NT, R, STEP, fmt, **meta):
    """A split-K tensor-core GEMV's frame (gemv_q4_k_mma, the codecs' gemv_<fmt>_mma): NW warps of R rows at `ctas`
    CTAs an SM, its PDL trigger first (the op's last kernel: the next op's first may start; it waits for this one),
    per-warp rings of S stages in dynamic shared memory, the meta the runtime plans its grid from (then `meta`).
    Returns the ring's symbol."""
    b.directives += [f".maxntid {32 * NW}, 1, 1", f".minnctapersm {ctas}"]
    b.pdl_trigger()
    ring_sym = b.dynamic_shared(NW * S * stage_bytes + 128)
    b.meta.update(split_k="gridDim.y splits the K steps (a step: one super-block); part: splits x ntok x m fp32, "
                          "counters: one u32 per warp (zero, left zero)", ctas_per_sm=ctas, tokens=8 * NT,
                  token_groups=NT, rows_per_cta=R * NW, rows_per_warp=R, warps=NW, grid="ceil(m / rows_per_cta)",
                  fmt=fmt, mode="exact", lane_cols=STEP, max_splits=32, layout="mma", **meta)
    return ring_sym


def _q4k_cp_async_issue(b, k, w_p, K, M, lane, row0, ring, nblk):
    """The cp.async build's issue(jb, stage): a step is R rows of 16-byte chunks (9: one super-block); lane l
    copies chunks l, l + 32, ... (rows past M: row M - 1's bytes, never stored), then commits one group per step
    (an empty one past the end). Emits the chunks' addresses; returns issue."""
    R, row_stride, stage_bytes = k.R, k.row_stride, k.stage_bytes
    C = row_stride // 16  # 16-byte chunks a row
    W = b.ptr(w_p)
    row_bytes = k.codec.row_bytes(b, K)
    mlast = b.op("sub.u32", M, Imm(1, "u32"))
    chunks = []
    for c0 in range(0, R * C, 32):
        c = b.op("add.u32", lane, Imm(c0, "u32"))
        row = b.op("div.u32", c, Imm(C, "u32"))
        col16 = b.op("shl.b32", b.op("rem.u32", c, Imm(C, "u32")), Imm(4, "u32"))
        grow = b.op("min.u32", b.op("add.u32", row0, row), mlast)
        src = b.op("add.s64", b.op("mad.wide.u32", grow, row_bytes, W), b.op("cvt.u64.u32", col16))
        dst = b.op("mad.lo.u32", row, Imm(row_stride, "u32"), col16)
        ok = b.op("setp.lt.u32", c, Imm(R * C, "u32")) if c0 + 32 > R * C else None
        chunks.append((ok, src, dst))

    def issue(jb, stage):
        live = b.op("setp.lt.u32", jb, nblk)
        soff = k.codec.mma_step_offset(b, jb)
        sdst = (b.op("add.u32", ring, Imm(stage * stage_bytes, "u32")) if isinstance(stage, int) else
                b.op("mad.lo.u32", stage, Imm(stage_bytes, "u32"), ring))
        for ok, src, dst in chunks:
            go = live if ok is None else b.op("and.pred", live, ok)
            b.emit("cp.async.cg.shared.global", Mem(b.op("add.u32", sdst, dst)), Mem(b.op("add.s64", src, soff)),
                   Imm(16, "u32"), pred=go)
        b.emit("cp.async.commit_group")

    return issue


def _q4k_mma_operands(b, k, jb, stride, lane, g, t, BT, F, SX, K, ntok):
    """The lane's decoder (stage offsets, the A fragments' fp16 constants), the B-tile register sets and the
    pointers of the tiles (from sub-block jb), factors and min fragments."""
    NT = k.NT
    assert k.row_stride == k.codec.MMA_ROW_BYTES
    offsets = k.codec.mma_lane_offsets(b, g, t)
    lane16 = b.op("mul.wide.u32", lane, Imm(16, "u32"))
    t8 = b.op("mul.wide.u32", t, Imm(8, "u32"))
    czero = [b.op("mov.f32", Imm(0.0, "f32")) for _ in range(4)]
    dec = k.codec.MmaGemvDecoder(b, t, offsets)

    # B tiles of one sub-block (hi and lo of its two halves), D sub-blocks ahead into NS rotating register sets;
    # the step's factors and min fragments at its start (needed at its end)
    D, NS = (Q4K_MMA_AHEAD if NT == 1 else 1), Q4K_MMA_SETS  # the 16-token build one ahead (as measured on the H200)
    assert NS >= D + 2 and k.STEP % NS == 0
    sets = [[b.regs("b32", 8) for _ in range(NT)] for _ in range(NS)]
    p_b, s_b = _tile_pointer(b, jb, stride, BT, lane16, g, ntok if NT == 1 else None)
    p_f = b.op("add.s64", b.op("mad.wide.u32", jb, Imm(32, "u32"), F), t8)  # factors: [block][8 tokens] fp32
    p_s = b.op("add.s64", b.op("mad.wide.u32", jb, Imm(32, "u32"), SX),  # min fragments: 256 bytes per super-block
               b.op("mul.wide.u32", lane, Imm(8, "u32")))
    s_f = b.op("mul.wide.u32", stride, Imm(32, "u32"))
    g_b = g_f = None
    if NT > 1:
        g_b = b.op("mul.wide.u32", K, Imm(32, "u32"))  # one token group's tiles (K/16 x 512 bytes) ...
        g_f = b.op("cvt.u64.u32", K)  # ... and its factors or min fragments (K bytes)
    return _Q4kOperands(czero, dec, D, NS, sets, p_b, s_b, p_f, p_s, s_f, g_b, g_f)


def _q4k_load_b(s, pb, bl, dst, pred=None):
    """Sub-block bl after pb's: every token group's B tiles (hi, lo of both halves) into register set dst."""
    b, o = s.b, s.ops
    for nt in range(s.k.NT):
        if nt:
            pb = b.op("add.s64", pb, o.g_b)
        for h in range(2):
            b.emit("ld.global.nc.v4.u32", b.vec(o.sets[dst][nt][4 * h:4 * h + 4]), Mem(pb, (2 * bl + h) * T4.MMA_TILE),
                   pred=pred)


def _q4k_chunk(s, stage_base, c, hds, cur, chains):
    """Chunk c (sub-blocks 2c, 2c + 1): per m16 tile, the codec's A fragments q·sc and 2 halves x (hi, lo) MMAs
    per sub-block into the step's chains."""
    b, k, o = s.b, s.k, s.ops
    czero = o.czero
    qb = o.dec.qs_base(stage_base)
    for mt in range(k.MT):
        a = o.dec.fragments(qb, c, mt, hds[2 * mt:2 * mt + 2])
        for sb in range(2):
            for nt in range(k.NT):
                bregs = o.sets[cur[sb]][nt]
                for h in range(2):
                    A = a[sb, h]
                    for hl, breg in enumerate((bregs[4 * h:4 * h + 2], bregs[4 * h + 2:4 * h + 4])):  # hi, lo
                        ch = chains[nt][mt][2 * h + hl]
                        first = c == 0 and sb == 0
                        b.emit(mma_sync(s.arch, "m16n8k16", "f16", b.vec(ch), b.vec(A), b.vec(breg),
                                        b.vec(czero if first else ch)))


def _q4k_step_sums(s, hds, fac, mfr, chains):
    """The step's fp32 work, per super-block: y += 2^-s·(d·C − 64·dmin·Σ_j m_j·S_j·2^-6) per output, C = the four
    chains' sum, the min term by one MMA (the codec's min_fragment and block_value)."""
    b, k, o = s.b, s.k, s.ops
    for nt in range(k.NT):
        for mt in range(k.MT):
            hd = hds[2 * mt:2 * mt + 2]
            ms = b.regs("f32", 4)
            ma = b.vec(o.dec.min_fragment(hd))
            b.emit(mma_sync(s.arch, "m16n8k16", "f16", b.vec(ms), ma, b.vec(mfr[nt]), b.vec(o.czero)))
            ch = chains[nt][mt]
            for i in range(4):  # c0, c1: row g (tokens 2t, 2t + 1); c2, c3: row g + 8
                cs = b.op("add.rn.f32", b.op("add.rn.f32", ch[0][i], ch[1][i]), b.op("add.rn.f32", ch[2][i], ch[3][i]))
                v = o.dec.block_value(hd[i // 2], cs, ms[i])
                o_ = (nt * k.MT + mt) * 4 + i
                b.emit("fma.rn.f32", s.acc[o_], v, fac[nt][i % 2], s.acc[o_])


def _q4k_mma_steps(s):
    """The K loop, one super-block a step: its factors and min fragments, the wait for its stage, the row headers,
    8 sub-blocks' MMAs (B tiles D sub-blocks ahead), the stage back to the copies, the step's fp32 sums; the
    loop's exit label last."""
    b, k, o = s.b, s.k, s.ops
    NT, S, STEP, D, NS = k.NT, k.S, k.STEP, o.D, o.NS
    jb, gcount, stride, nblk = s.jb, s.count, s.stride, s.nblk
    p_b, s_b, p_f, p_s, s_f = o.p_b, o.s_b, o.p_f, o.p_s, o.s_f
    chains = [[[b.regs("f32", 4) for _ in range(4)] for _ in range(k.MT)] for _ in range(NT)]
    loop, done = b.label("step"), b.label("steps_done")
    b.bra(done, pred=b.op("setp.ge.u32", jb, nblk))
    for bl in range(D):
        _q4k_load_b(s, p_b, bl, bl)
    b.place(loop)
    fac, mfr = [], []
    for nt in range(NT):  # this step's factors 2^-s (tokens 2t, 2t + 1) and min fragment (hi, lo)
        fr, mr = b.regs("f32", 2), b.regs("b32", 2)
        pf, ps = (p_f, p_s) if nt == 0 else (b.op("add.s64", p_f, o.g_f), b.op("add.s64", p_s, o.g_f))
        b.emit("ld.global.nc.v2.f32", b.vec(fr), Mem(pf))
        b.emit("ld.global.nc.v2.u32", b.vec(mr), Mem(ps))
        fac.append(fr)
        mfr.append(mr)
    if k.tma:
        stage = _wait_step(b, s.bars, gcount, S)
    else:  # the oldest of the S groups in flight is this step's; every lane's copies, then the warp's
        stage = b.op("rem.u32", gcount, Imm(S, "u32"))
        b.emit("cp.async.wait_group", Imm(S - 1, "u32"))
        b.emit("bar.warp.sync", Imm(0xFFFFFFFF, "b32"))
    sbase = b.op("mad.lo.u32", stage, Imm(k.stage_bytes, "u32"), s.ring)
    hds = o.dec.headers(sbase, k.MT)
    nxt_b = b.op("add.s64", p_b, s_b)
    more = b.op("setp.lt.u32", b.op("add.u32", jb, stride), nblk)
    for bl in range(STEP):  # sub-block bl: register set bl % NS; its loads were issued D sub-blocks earlier
        if bl + D < STEP:
            _q4k_load_b(s, p_b, bl + D, (bl + D) % NS)
        else:
            _q4k_load_b(s, nxt_b, bl + D - STEP, (bl + D) % NS, more)
        if bl % 2:
            _q4k_chunk(s, sbase, bl // 2, hds, ((bl - 1) % NS, bl % NS), chains)
    b.emit("bar.warp.sync", Imm(0xFFFFFFFF, "b32"))  # every lane has read the stage: TMA may refill it
    s.issue(b.op("mad.lo.u32", stride, Imm(S, "u32"), jb), stage)
    _q4k_step_sums(s, hds, fac, mfr, chains)
    b.emit("add.u32", gcount, gcount, Imm(1, "u32"))
    b.emit("add.u32", jb, jb, stride)
    for p_, s_ in ((p_b, s_b), (p_f, s_f), (p_s, s_f)):
        b.emit("add.s64", p_, p_, s_)
    b.bra(loop, pred=b.op("setp.lt.u32", jb, nblk))
    b.place(done)


def build_q4k_mma_gemv(arch, NT: int = 1, fmt: str = "q4_K"):
    """Q4_K GEMV for up to 8·NT tokens on tensor cores, fp32-exact (mul_mat on sm_90: slices of 2-8 tokens, single
    tokens from 2^25 weights; the 16-token build with PTXGEN_Q4K_MMA=1: 10-19% faster than the wgmma MMQ at T=16
    on the H200, not yet the default).

    Why: the exact Q4_K GEMVs do an FFMA per weight and token (T=1: 31% of HBM, T=8: 8%). Here the weights
    stay integers: A = q·sc_j as fp16, exact (≤ 945), decoded by the codec (q4_k.MmaGemvDecoder); B = the activation
    with one 2^s per (token, super-block), split into fp16 hi + lo by `prep_mma_f16`, so the MMAs sum
    Σ_j sc_j·Σ q·x over the whole super-block (four independent accumulator chains: halves x hi/lo). The mins
    take one more MMA per super-block: A = the row's m_j (exact fp16), B = the block sums S_j of the scaled
    activation (hi + lo, times 2^-6). Then per row r, token n: y += 2^-s·(d·C − 64·dmin·MS) in fp32 — the
    fp32 work is per super-block, not per sub-block. A warp owns 16·Q4K_MMA_MTILES rows and walks K one
    super-block (a TMA box of 36 u32 per row) at a time, its A fragments in the codec's K order, the B tiles'.
    Split-K over gridDim.y with the last-warp fixup, as the other GEMVs.

    NT = 2 (gemv_q4_k_mma_n16, 9-16 tokens: the small-T prefill llama.cpp serves with its MMQ): two groups of 8
    tokens, each prepared by its own prep_mma_f16 launch into consecutive buffers (tiles 32·K bytes, factors
    and min fragments K bytes per group); every A fragment feeds both groups' MMAs."""
    arch.require("mma_sync_f16", "the tensor-core Q4_K GEMV", "use gemv_q4_k_t*")
    b, k, h, w_p, ring_sym = _q4k_mma_head(arch, NT, fmt)
    lane, row0, M, K, ntok = h["lane"], h["row0"], h["M"], h["K"], h["ntok"]
    g = b.op("shr.u32", lane, Imm(2, "u32"))
    t = b.op("and.b32", lane, Imm(3, "b32"))
    leader = b.op("setp.eq.u32", lane, Imm(0, "u32"))
    bars = None
    if k.tma:
        ring, bars, _ = _warp_rings(b, ring_sym, h["warp"], leader, k.NW, k.S, k.stage_bytes)
        b.emit("fence.proxy.async.shared::cta")
        b.emit("bar.sync", Imm(0, "u32"))
    else:  # this warp's ring (16-byte aligned for cp.async)
        base = b.op("and.b32", b.op("add.u32", b.op("mov.u32", ring_sym), Imm(127, "u32")),
                    Imm(~127 & 0xFFFFFFFF, "b32"))
        ring = b.op("mad.lo.u32", h["warp"], Imm(k.S * k.stage_bytes, "u32"), base)

    nblk = b.op("shr.u32", K, Imm(5, "u32"))  # sub-blocks of 32
    tw = b.op("cvta.param.u64", b.op("mov.b64", w_p)) if k.tma else None
    acc = b.regs("f32", 4 * k.MT * NT)  # index (nt·MT + mt)·4 + i
    for r_ in acc:
        b.emit("mov.f32", r_, Imm(0.0, "f32"))
    kz, nsplit = b.special("ctaid.y"), b.special("nctaid.y")
    stride = b.op("mul.lo.u32", nsplit, Imm(k.STEP, "u32"))
    if k.tma:
        issue = partial(_tma_step, b, tw, leader, nblk, bars, ring, k.stage_bytes, row0, words_per_step=k.WORDS,
                        step_blocks=k.STEP)
    else:
        issue = _q4k_cp_async_issue(b, k, w_p, K, M, lane, row0, ring, nblk)
    jb, gcount = _fill_ring(b, arch, issue, kz, stride, k.STEP, k.S, k.pdl)
    ops = _q4k_mma_operands(b, k, jb, stride, lane, g, t, h["BT"], h["F"], h["SX"], K, ntok)
    _q4k_mma_steps(_Q4kMmaLoop(b, arch, k, issue, ring, bars, nblk, stride, jb, gcount, acc, ops))
    _fragment_epilogue(b, acc, g, t, h["gwarp"], row0, M, ntok, h["Y"], h["part_p"], h["cnt_p"], k.MT)
    return b.finish()


def _fragment_epilogue(b, acc, g, t, gwarp, row0, M, ntok, Y, part_p, cnt_p, mtiles=None):
    """Store m16n8 C fragments per lane — acc[4mt..4mt+3] = (row 16mt + g, token 2t), (.., 2t+1), (16mt + g + 8,
    2t), (.., 2t+1) — to y[token][row0 + row]; with split-K, the split's partial and the last-warp fixup of
    `_lane_epilogue`. With token groups (`mtiles` m16 tiles per group), acc[(nt·mtiles + mt)·4 + i] is token
    group nt's."""
    mtiles = mtiles or len(acc) // 4
    owner = []
    for i in range(len(acc)):  # acc[(nt·MT + mt)·4 + i]: rows 16mt + g (+8), tokens 8nt + 2t (+1)
        row = b.op("add.u32", row0, b.op("add.u32", g, Imm(8 * ((i % (4 * mtiles)) // 2), "u32")))
        tok = b.op("add.u32", b.op("shl.b32", t, Imm(1, "u32")), Imm(8 * (i // (4 * mtiles)) + i % 2, "u32"))
        ok = b.op("and.pred", b.op("setp.lt.u32", row, M), b.op("setp.lt.u32", tok, ntok))
        owner.append((ok, b.op("mad.lo.u32", tok, M, row)))
    kz, nsplit = b.special("ctaid.y"), b.special("nctaid.y")
    _store_or_split(b, [(ok, yoff, acc[i]) for i, (ok, yoff) in enumerate(owner)], b.op("mad.lo.u32", g, Imm(4, "u32"), t),
                    gwarp, kz, nsplit, M, ntok, Y, part_p, cnt_p)


def build_prep_mma(arch, rotate: bool = True, records: int = 0, hi_only: bool = False, order: str = "q4k",
                   ready: bool = False, x16: bool = False):
    """prep_tq4_1s_mma: x (T ≤ 8, K) fp32 → forward RHT, per (token, block) power-of-two scale, fp16 hi + lo, in
    the tensor-core GEMV's B-fragment tiles (ptxgen.formats.tq4_1s.to_mma_tiles, bit-exact) + the factors 2^-s.
    One warp per (token, block) for all 8 tokens: tokens past T write zeros.

    rotate=False (prep_mma_f16, for the Q4_K tensor-core GEMV): no RHT, one scale per super-block and token (the
    max over its 8 blocks: each lane reads its element of all 8; tiles and factors of
    to_mma_tiles(x, Q4K_GROUP)), and a third output, the min-term B fragments of each super-block
    (formats.tq4_1s.mma_min_fragments: the scaled block sums by a warp butterfly, times 2^-6, fp16 hi + lo).

    records=nt (prep_q4k_t{nt}, for gemv_q4_k_mma_t{nt}; rotate=False): up to nt tokens, the same values written
    as formats.tq4_1s.q4k_mma_records(x, nt) (one record per super-block: B pairs, min pairs, factors); with
    hi_only (prep_q4k_t16h, prep_q4k_t32h) the hi parts alone, one B column per token; order="sub16"
    (prep_sub16_t{nt}, the Q6_K / Q8_0 few-token GEMVs' records): the elements in the codecs' sub-block order;
    order="rot16" with rotate (prep_rot16_t{nt}, TQ4_1S's): those of the rotated x (the scale from the unrotated
    super-block, _scaled_item's sb_max).
    `ready` (records, where the target has griddepcontrol; gemv_t1.T1_FLAG's builds, not shipped): a last
    parameter, a zero-kept u32 each CTA adds 1 to (red.release, after a CTA barrier) once its records are stored;
    the GEMV behind waits for ceil(items / 8) of them instead of for this grid's completion. The word is every op's:
    such a prep triggers its dependents only after its own griddepcontrol.wait, so the GEMV behind it is not
    resident (spinning on the word) before the op before has completed — and its GEMV zeroed the word.
    `x16` (prep_<...>_x16): x is fp16, widened exactly as it is loaded — the output for x.astype(float32) bit for
    bit, without convert_f32's launch (and its grid dependency) ahead of the prep."""
    ready = ready and arch.has("griddepcontrol")
    assert (not records or rotate == (order == "rot16")) and (records or not hi_only)
    assert not x16 or not ready
    assert order in ("q4k", "sub16") or (records and not hi_only)
    assert order == "q4k" or records
    assert not hi_only or records in (T4.Q4K_HI_TOKENS, T4.Q4K_SKINNY_COLUMNS)  # (the record model's hi-only sizes)
    nt = records or T4.MMA_TOKENS
    ofmt = {"q4k": "q4_K", "sub16": "q6_K", "rot16": "tq4_1s", "i8": "q4_K", "i8q6": "q6_K"}[order]  # a format
    # whose GEMV reads them
    i8 = order in ("i8", "i8q6")
    name = (GemvKernel("prep_few", ofmt, records, hi_only=hi_only, i8=i8, x16=x16) if records else
            GemvKernel("prep_mma", "tq4_1s" if rotate else "q4_K", x16=x16)).name
    b = KernelBuilder(name, arch, ("TQ4_1S activation: forward RHT, scaled fp16 hi/lo mma.sync B tiles" if rotate
                                   and not records else
                                   f"activation of up to {records} tokens: scaled int8 digit-plane records and "
                                   f"fp16 {'sub-block digit sums' if order == 'i8q6' else 'min pairs'} "
                                   f"({GemvKernel('few', ofmt, records, i8=True).name})" if i8 else
                                   f"activation of up to {records} tokens{': forward RHT,' if rotate else ':'} scaled "
                                   f"fp16 {'hi' if hi_only else 'hi/lo'} "
                                   f"records{'' if order == 'q4k' else ' in 16-element sub-block order'} "
                                   f"({GemvKernel('few', ofmt, records, hi_only=hi_only).name})"
                                   if records else
                                   "activation: scaled fp16 hi/lo mma.sync B tiles and block sums (Q4_K tensor-core GEMV)"),
                      block=(32 * WARPS, 1, 1))
    x_p = b.param("x", "u64", "ptr:in")
    if records:
        bt_p = b.param("records", "u64", "ptr:out")
        b.meta.update(layout="q4k_mma_records", tokens=records, hi_only=hi_only)
        if order != "q4k":
            b.meta["record_order"] = order
    else:
        bt_p, f_p = b.param("tiles", "u64", "ptr:out"), b.param("factors", "u64", "ptr:out")
        s_p = None if rotate else b.param("minfrag", "u64", "ptr:out")
        b.meta.update(layout="to_mma_tiles")
    n_p, k_p = b.param("ntok", "u32"), b.param("k", "u32")
    ready_p = b.param("ready", "u64", "ptr:scratch") if ready else None
    if ready:
        b.meta.update(ready_flag="ready: a zero-kept u32, +1 a CTA once its records are stored (the GEMV resets it)")
    b.meta.update(warps=WARPS, blocks_per_cta=WARPS, grid=f"ceil({nt} * k / 32 / 8)")
    trace = PREP_TRACE and records == 1 and not hi_only
    t_entry = b.special("globaltimer_lo") if trace else None
    b.pdl_head(trigger=not ready)  # the GEMV that reads this may launch now and load its weights meanwhile ...
    if ready:  # ... or, counting, once the op before has completed (the word's count is this op's alone)
        b.pdl_trigger()
    trace = (t_entry, b.special("globaltimer_lo")) if trace else None
    x, BT = b.ptr(x_p), b.ptr(bt_p)
    ntok, K = b.ld_param(n_p, "u32"), b.ld_param(k_p, "u32")
    nb = b.op("shr.u32", K, Imm(5, "u32"))
    lane, item, done = warp_per_item(b, b.op("mul.lo.u32", nb, Imm(nt, "u32")), WARPS)
    tok = b.op("div.u32", item, nb)
    j = b.op("rem.u32", item, nb)
    hi, lo, fbits, xs, lead = _scaled_item(b, x, ntok, nb, tok, j, lane, rotate, sb_max=bool(records) or None,
                                           x16=x16)
    if records:
        _prep_record_stores(b, BT, records, hi_only, tok, j, lane, lead, hi, lo, fbits, xs, trace, order)
        b.place(done)
        if ready:  # the CTA's record stores, then thread 0's release (cumulative over them)
            b.emit("bar.sync", Imm(0, "u32"))
            b.emit("red.release.gpu.global.add.u32", Mem(b.ptr(ready_p)), Imm(1, "u32"),
                   pred=b.op("setp.eq.u32", b.special("tid.x"), Imm(0, "u32")))
        b.emit("ret")
        return b.finish()
    F = b.ptr(f_p)
    # element e = lane: half h = e / 16, t = (e % 16) / 4, slot e % 4 → tile 2j + h, lane 4·tok + t, byte 2·slot
    h = b.op("shr.u32", lane, Imm(4, "u32"))
    tt = b.op("and.b32", b.op("shr.u32", lane, Imm(2, "u32")), Imm(3, "b32"))
    off = b.op("mad.lo.u32", b.op("mad.lo.u32", j, Imm(2, "u32"), h), Imm(T4.MMA_TILE, "u32"),
               b.op("mad.lo.u32", b.op("mad.lo.u32", tok, Imm(4, "u32"), tt), Imm(16, "u32"),
                    b.op("shl.b32", b.op("and.b32", lane, Imm(3, "b32")), Imm(1, "u32"))))
    p = b.op("add.s64", BT, b.op("cvt.u64.u32", off))
    b.emit("st.global.b16", Mem(p), hi)
    b.emit("st.global.b16", Mem(p, 8), lo)
    slot = b.op("mad.lo.u32", j, Imm(8, "u32"), tok)
    b.emit("st.global.b32", Mem(b.op("mad.wide.u32", slot, Imm(4, "u32"), F)), fbits, pred=lead)
    if not rotate:  # Σ of the scaled block, butterfly order, x 2^-6 as fp16 hi + lo into the min-term fragment
        # of its super-block: byte 256·(j / 8) + 8·(4·tok + (j % 8) / 2) + 2·(j % 2), lo 4 bytes on
        shi, slo = _min_pair(b, xs)
        jj = b.op("and.b32", j, Imm(7, "b32"))
        foff = b.op("add.u32", b.op("shl.b32", b.op("shr.u32", j, Imm(3, "u32")), Imm(8, "u32")),
                    b.op("add.u32", b.op("shl.b32", b.op("mad.lo.u32", tok, Imm(4, "u32"), b.op("shr.u32", jj, Imm(1, "u32"))),
                                         Imm(3, "u32")),
                         b.op("shl.b32", b.op("and.b32", jj, Imm(1, "b32")), Imm(1, "u32"))))
        fp = b.op("add.s64", b.ptr(s_p), b.op("cvt.u64.u32", foff))
        b.emit("st.global.b16", Mem(fp), shi, pred=lead)
        b.emit("st.global.b16", Mem(fp, 4), slo, pred=lead)
    b.place(done)
    b.emit("ret")
    return b.finish()


def _scaled_item(b, x, ntok, nb, tok, j, lane, rotate: bool, sb_max: bool | None = None, x16: bool = False):
    """One warp's item of the mma preps: token `tok`'s 32-element block j, lane = element (zeros past ntok);
    rotate: the forward RHT first. The power-of-two scale 2^s puts the largest |value| in [2^14, 2^15) (s
    clamped to ±100) — `sb_max` (default: not rotate) the max over the block's super-block (this lane's unrotated
    element of each of its 8 blocks), rotated values then with formats.tq4_1s.ROT_HEADROOM bits more room (the
    records of order "rot16"); hi = fp16(x·2^s), lo = fp16(x·2^s − hi) (0 where hi is not finite). Returns (hi,
    lo, the factor 2^-s's bits, x·2^s, lane == 0). `x16`: x is fp16, each value widened exactly as it is loaded."""
    sb_max = not rotate if sb_max is None else sb_max
    ebytes = 2 if x16 else 4

    def widened(h):  # an fp16 value's bits → the f32 of the same value
        return b.op("cvt.f32.f16", h)
    live = b.op("setp.lt.u32", tok, ntok)
    v = b.reg("f32")
    b.emit("mov.f32", v, Imm(0.0, "f32"))
    skip = b.label("no_token")
    b.bra(skip, pred=live, neg=True)
    if rotate:
        _, rv = _rotate_lane_value(b, x, lane, b.op("mad.lo.u32", tok, nb, j), x16)
    else:
        off = b.op("mad.lo.u32", b.op("mad.lo.u32", tok, nb, j), Imm(32, "u32"), lane)
        at = Mem(b.op("mad.wide.u32", off, Imm(ebytes, "u32"), x))
        rv = widened(b.op("ld.global.nc.b16", at)) if x16 else b.op("ld.global.nc.f32", at)
    b.emit("mov.f32", v, rv)
    b.place(skip)
    # (rotated values scaled by the unrotated super-block's max: from its elements only)
    mbits = b.op("mov.b32", Imm(0, "b32")) if rotate and sb_max else b.op("and.b32", v, Imm(0x7FFFFFFF, "b32"), type="b32")
    if sb_max:  # the super-block's max: this lane's element of each of its 8 blocks (tokens past T: zeros)
        first = b.op("mad.lo.u32", b.op("mad.lo.u32", tok, nb, b.op("and.b32", j, Imm(~7 & 0xFFFFFFFF, "b32"))),
                     Imm(32, "u32"), lane)
        p0 = b.op("mad.wide.u32", first, Imm(ebytes, "u32"), x)
        for i in range(T4.Q4K_GROUP):
            o_ = b.reg("b32")
            b.emit("mov.b32", o_, Imm(0, "b32"))
            if x16:  # (zero bits widen to +0: the same as the fp32 build's zeros past T)
                h_ = b.reg("b16")
                b.emit("mov.b16", h_, Imm(0, "b16"))
                b.emit("ld.global.nc.b16", h_, Mem(p0, 32 * ebytes * i), pred=live)
                b.emit("mov.b32", o_, widened(h_))
            else:
                b.emit("ld.global.nc.b32", o_, Mem(p0, 32 * ebytes * i), pred=live)
            mbits = b.op("max.u32", mbits, b.op("and.b32", o_, Imm(0x7FFFFFFF, "b32")))
    for off in (16, 8, 4, 2, 1):  # |x| as integers: the same order as the floats (NaN above all)
        o = b.op("shfl.sync.bfly.b32", mbits, Imm(off, "u32"), Imm(31, "u32"), Imm(0xFFFFFFFF, "b32"), type="u32")
        mbits = b.op("max.u32", mbits, o)
    e = b.op("and.b32", b.op("shr.u32", mbits, Imm(23, "u32")), Imm(0xFF, "b32"))
    top = 141 - (T4.ROT_HEADROOM if rotate and sb_max else 0)
    sexp = b.op("max.s32", b.op("min.s32", b.op("sub.s32", Imm(top, "s32"), e, type="s32"), Imm(100, "s32")), Imm(-100, "s32"))
    scale = b.op("shl.b32", b.op("add.s32", sexp, Imm(127, "s32")), Imm(23, "u32"), type="b32")
    xs = b.op("mul.rn.f32", v, scale)
    hi = b.op("cvt.rn.f16.f32", xs, type="b16")
    back = b.op("cvt.f32.f16", hi)
    lo = b.op("cvt.rn.f16.f32", b.op("sub.rn.f32", xs, back), type="b16")
    fin = b.op("setp.ne.b16", b.op("and.b16", hi, Imm(0x7C00, "b16")), Imm(0x7C00, "b16"))  # hi finite
    lo = b.op("selp.b16", lo, Imm(0, "b16"), fin)
    fbits = b.op("shl.b32", b.op("sub.s32", Imm(127, "s32"), sexp, type="s32"), Imm(23, "u32"), type="b32")
    lead = b.op("setp.eq.u32", lane, Imm(0, "u32"))
    return hi, lo, fbits, xs, lead


def _min_pair(b, xs):
    """The block's scaled sum (warp butterfly) times 2^MIN_FRAG_SHIFT as fp16 (hi, lo); lo = 0 where hi is not
    finite."""
    tot = warp_sum(b, xs)
    sv = b.op("mul.rn.f32", tot, Imm(2.0 ** T4.MIN_FRAG_SHIFT, "f32"))
    shi = b.op("cvt.rn.f16.f32", sv, type="b16")
    slo = b.op("cvt.rn.f16.f32", b.op("sub.rn.f32", sv, b.op("cvt.f32.f16", shi)), type="b16")
    sfin = b.op("setp.ne.b16", b.op("and.b16", shi, Imm(0x7C00, "b16")), Imm(0x7C00, "b16"))
    return shi, b.op("selp.b16", slo, Imm(0, "b16"), sfin)


def _prep_record_stores(b, REC, nt, hi_only, tok, j, lane, lead, hi, lo, fbits, xs, trace=None, order="q4k"):
    """prep_q4k_t{nt}'s stores (formats.tq4_1s.q4k_mma_records; offsets q4k_record_layout), C =
    q4k_record_columns columns: token n, block j = 8·sb + 2t + nib, element e = lane = 4i + p → hi at byte
    record·sb + 64·C·i + 16·(4c + t) + 8·nib + 4·(p & 1) + 2·(p >> 1) with c = 2n (lo: c = 2n + 1, 64 bytes on)
    or, hi_only, c = n (order "sub16", prep_sub16_t{nt}: block j = 8·sb + i, e = 16h + 4t + q → record·sb +
    64·C·i + 16·(4c + t) + 8·h + 2·q); lane 0: the min pair halves at min + 4·(4c + t) + 2·nib (hi_only: the sum of the hi parts,
    min + 8·(4c + t) + 2·nib, lo 4 bytes on), block 0 of the super-block the factor at fac + 4·n; token 0's block
    1 the zeros after the factors."""
    ncol = T4.q4k_record_columns(nt, hi_only)
    moff, foff, rb = (T4.q4k_i8_record_layout(nt) if order == "i8" else T4.q6k_i8_record_layout(nt) if order == "i8q6"
                      else T4.q4k_record_layout(nt, hi_only))
    sb = b.op("shr.u32", j, Imm(3, "u32"))
    jj = b.op("and.b32", j, Imm(7, "b32"))  # 2t + nib
    rec = b.op("mad.wide.u32", sb, Imm(rb, "u32"), REC)
    p = b.op("and.b32", lane, Imm(3, "b32"))
    per_tok = 64 if hi_only else 128  # 16·4c for c = n or 2n
    if order in ("i8", "i8q6"):  # digit plane q of v = rni(x·2^s·2^I8_SHIFT) at 64·C·(jj / 2) + 64·(3·tok + q) + 16·t +
        # 8·(jj & 1) + 4·h + b
        v = b.op("cvt.rni.s32.f32", b.op("mul.rn.f32", xs, Imm(2.0 ** T4.I8_SHIFT, "f32")), type="s32")
        e_off = b.op("add.u32", b.op("shl.b32", b.op("and.b32", lane, Imm(0xC, "b32")), Imm(2, "u32")),  # 16·t
                     b.op("add.u32", b.op("shl.b32", b.op("shr.u32", lane, Imm(4, "u32")), Imm(2, "u32")), p))  # 4·h + b
        e_off = b.op("add.u32", e_off, b.op("shl.b32", b.op("and.b32", jj, Imm(1, "b32")), Imm(3, "u32")))  # 8·nib
        off = b.op("mad.lo.u32", b.op("shr.u32", jj, Imm(1, "u32")), Imm(64 * T4.I8_PLANES * nt, "u32"),
                   b.op("mad.lo.u32", tok, Imm(64 * T4.I8_PLANES, "u32"), e_off))
        pe = b.op("add.s64", rec, b.op("cvt.u64.u32", off))
        digits = []
        for q in range(T4.I8_PLANES):  # the byte v & 255, then v = (v + 128) >> 8
            b.emit("st.global.b8", Mem(pe, 64 * q), v)
            digits.append(v)
            if q + 1 < T4.I8_PLANES:
                v = b.op("shr.s32", b.op("add.s32", v, Imm(128, "s32"), type="s32"), Imm(8, "u32"), type="s32")
        # a value the digits cannot hold (|x·2^s| ≥ 2^15: s clamped at -100) counts as +inf in the block's sum, so
        # the token's outputs are non-finite (formats.tq4_1s.q4k_i8_records)
        big = b.op("setp.ge.f32", b.op("abs.f32", xs), Imm(2.0 ** (22 - T4.I8_SHIFT), "f32"))
        if order == "i8q6":
            _i8_sub_block_sums(b, rec, moff, nt, tok, jj, lane, digits, big, xs)
        xs = b.op("selp.f32", Imm(float("inf"), "f32"), xs, big)
    elif order == "q4k":
        e_off = b.op("add.u32", b.op("mul.lo.u32", b.op("shr.u32", lane, Imm(2, "u32")), Imm(64 * ncol, "u32")),  # 64·C·i
                     b.op("add.u32", b.op("shl.b32", b.op("and.b32", p, Imm(1, "b32")), Imm(2, "u32")),
                          b.op("shl.b32", b.op("shr.u32", p, Imm(1, "u32")), Imm(1, "u32"))))
        off = b.op("mad.lo.u32", tok, Imm(per_tok, "u32"), b.op("mad.lo.u32", jj, Imm(8, "u32"), e_off))  # + 16·t + 8·nib
    else:  # 64·C·i + 16·t + 8·h + 2·q, i = jj
        e_off = b.op("add.u32", b.op("shl.b32", b.op("and.b32", lane, Imm(0xC, "b32")), Imm(2, "u32")),  # 16·t
                     b.op("add.u32", b.op("shl.b32", b.op("shr.u32", lane, Imm(4, "u32")), Imm(3, "u32")),  # 8·h
                          b.op("shl.b32", p, Imm(1, "u32"))))
        off = b.op("mad.lo.u32", tok, Imm(per_tok, "u32"), b.op("mad.lo.u32", jj, Imm(64 * ncol, "u32"), e_off))
    if order not in ("i8", "i8q6"):
        pe = b.op("add.s64", rec, b.op("cvt.u64.u32", off))
        b.emit("st.global.b16", Mem(pe), hi)
    if order == "i8q6":  # (no min term: the sub-block sums above)
        pass
    elif hi_only:  # the min term from the same rounded values the main product sees
        shi, slo = _min_pair(b, b.op("cvt.f32.f16", hi))
        mo = b.op("add.u32", b.op("shl.b32", b.op("shr.u32", jj, Imm(1, "u32")), Imm(3, "u32")),
                  b.op("shl.b32", b.op("and.b32", jj, Imm(1, "b32")), Imm(1, "u32")))  # 8·t + 2·nib
        moff_ = b.op("mad.lo.u32", tok, Imm(32, "u32"), b.op("add.u32", mo, Imm(moff, "u32")))
        lo_at = 4
    else:
        if order != "i8":
            b.emit("st.global.b16", Mem(pe, 64), lo)
        shi, slo = _min_pair(b, xs)
        moff_ = b.op("mad.lo.u32", tok, Imm(32, "u32"), b.op("mad.lo.u32", jj, Imm(2, "u32"), Imm(moff, "u32")))
        lo_at = 16
    if order != "i8q6":
        pm = b.op("add.s64", rec, b.op("cvt.u64.u32", moff_))
        b.emit("st.global.b16", Mem(pm), shi, pred=lead)
        b.emit("st.global.b16", Mem(pm, lo_at), slo, pred=lead)
    first = b.op("and.pred", lead, b.op("setp.eq.u32", jj, Imm(0, "u32")))
    pf = b.op("add.s64", rec, b.op("cvt.u64.u32", b.op("mad.lo.u32", tok, Imm(4, "u32"), Imm(foff, "u32"))))
    b.emit("st.global.b32", Mem(pf), fbits, pred=first)
    pad = range(foff + 4 * nt, rb, 4)
    if trace is not None:  # (PREP_TRACE) the entry and wait stamps, then the stores' end, in the padding
        assert len(pad) >= 3
        for o, v in zip(pad, (*trace, b.special("globaltimer_lo"))):
            b.emit("st.global.b32", Mem(rec, o), v, pred=first)
    elif pad:
        zero = b.op("mov.b32", Imm(0, "b32"))
        tail = b.op("and.pred", b.op("and.pred", lead, b.op("setp.eq.u32", jj, Imm(1, "u32"))),
                    b.op("setp.eq.u32", tok, Imm(0, "u32")))
        for o in pad:
            b.emit("st.global.b32", Mem(rec, o), zero, pred=tail)


def _i8_sub_block_sums(b, rec, xoff, nt, tok, jj, lane, digits, big, xs):
    """prep_q6k_i8_t{nt}'s sub-block sums (formats.tq4_1s.q6k_i8_records): the digits of each 16-lane half of the
    warp's block jj (sub-block s = 2·jj + h) summed per plane by a butterfly — planes 0 and 1 biased by 128 in one
    word's halves, plane 2 biased in another's low half beside the counts of NaNs (bits 16-20) and of values the
    digits cannot hold (`big`, bits 21-25) —, as fp16 at xoff + 32·(3·tok + p) + 2·s from lanes 0 and 16: NaN where
    the half holds a NaN of x·2^s, else +inf where it holds a big one."""
    full = Imm(0xFFFFFFFF, "b32")
    sext = [b.op("bfe.s32", d, Imm(0, "u32"), Imm(8, "u32"), type="s32") for d in digits]  # (the byte each stored)
    pk = b.op("add.u32", b.op("add.u32", sext[0], Imm(128, "u32")),
              b.op("shl.b32", b.op("add.u32", sext[1], Imm(128, "u32")), Imm(16, "u32")))
    nan = b.op("setp.nan.f32", xs, xs)
    flags = b.op("add.u32", b.op("selp.u32", Imm(1 << 16, "u32"), Imm(0, "u32"), nan),
                 b.op("selp.u32", Imm(1 << 21, "u32"), Imm(0, "u32"), big))
    p2 = b.op("add.u32", b.op("add.u32", sext[2], Imm(128, "u32")), flags)
    for o in (8, 4, 2, 1):  # within each 16-lane half
        pk = b.op("add.u32", pk, b.op("shfl.sync.bfly.b32", pk, Imm(o, "u32"), Imm(31, "u32"), full, type="u32"))
        p2 = b.op("add.u32", p2, b.op("shfl.sync.bfly.b32", p2, Imm(o, "u32"), Imm(31, "u32"), full, type="u32"))
    bias = Imm(16 * 128, "s32")
    sums = [b.op("sub.s32", b.op("and.b32", pk, Imm(0xFFFF, "b32")), bias, type="s32"),
            b.op("sub.s32", b.op("shr.u32", pk, Imm(16, "u32")), bias, type="s32"),
            b.op("sub.s32", b.op("and.b32", p2, Imm(0xFFFF, "b32")), bias, type="s32")]
    any_nan = b.op("setp.ne.u32", b.op("and.b32", p2, Imm(31 << 16, "b32")), Imm(0, "u32"))
    any_big = b.op("setp.ne.u32", b.op("shr.u32", p2, Imm(21, "u32")), Imm(0, "u32"))
    half = b.op("shr.u32", lane, Imm(4, "u32"))
    lead16 = b.op("setp.eq.u32", b.op("and.b32", lane, Imm(15, "b32")), Imm(0, "u32"))
    at = b.op("mad.lo.u32", tok, Imm(32 * T4.I8_PLANES, "u32"),
              b.op("add.u32", b.op("shl.b32", b.op("mad.lo.u32", jj, Imm(2, "u32"), half), Imm(1, "u32")),
                   Imm(xoff, "u32")))
    px = b.op("add.s64", rec, b.op("cvt.u64.u32", at))
    for p_, sm in enumerate(sums):
        h = b.op("cvt.rn.f16.s32", sm, type="b16")
        h = b.op("selp.b16", Imm(T4.I8_SUM_INF, "b16"), h, any_big)
        h = b.op("selp.b16", Imm(T4.I8_SUM_NAN, "b16"), h, any_nan)
        b.emit("st.global.b16", Mem(px, 32 * p_), h, pred=lead16)


def build_lanes_ggml(arch, fmt: str, Tn: int, exact: bool = False):
    """Q8_0 and Q4_K decode GEMVs on the lane machinery, int8 × Q8_1 activations (`prep_q8_lanes`) with
    dp4a, as llama.cpp's MMVQ computes them (checked against gemm_q8_1_ref: exact integer dots, fp32 scales);
    `exact` (Q4_K): fp32 activations (`prep_f32_lanes`) and ggml's fp32 weights. What a lane owns, loads and
    computes is the codec's GgmlLane (codecs/q4_k.py, codecs/q8_0.py); the steps, split-K and the lanes'
    reduction are the lane GEMVs' (_lane_head, _lane_steps, _lane_epilogue)."""
    lane_cls = codecs.get(fmt).GgmlLane
    if exact and not lane_cls.EXACT:
        raise ValueError("the exact lane GEMV is Q4_K's (Q8_0 runs int8 x Q8_1)")
    R = lane_cls.ROWS
    name = GemvKernel("gemv", fmt, Tn, fast=not exact).name
    doc = f"{fmt} GEMV ({'fp32 activations' if exact else 'int8 x Q8_1, dp4a'}), {Tn} token(s), {R} rows per warp"
    min_ctas = MIN_CTAS_OVERRIDE.get((name, arch.name), getattr(lane_cls, "MIN_CTAS", GGML_MIN_CTAS)[Tn])
    b, h = _lane_head(name, arch, doc, Tn, R, min_ctas,
                      fmt=fmt, mode="exact" if exact else "fast",
                      activation=f"{GemvKernel('prep_lanes', fmt, fast=not exact).name}(x) (lane layout)",
                      k_multiple=lane_cls.K_MULTIPLE, lane_cols=lane_cls.LANE_COLS)
    W, A, Y, M, K, ntok, lane, gwarp, row0, part_p, cnt_p = (h[k] for k in _HEAD)
    nblk = b.op("shr.u32", K, Imm(5, "u32"))
    nunits, row_bytes = lane_cls.sizes(b, K, nblk)
    gsize = T4.LANE_GROUP_F32 if exact else T4.LANE_GROUP_Q8
    rowptr, actptr, _ = _lane_pointers(b, h, R, Tn, nblk, row_bytes, gsize)
    ones = b.op("mov.b32", Imm(0x01010101, "b32"))
    magic = b.op("mov.b32", Imm(0x4B000000, "b32"))  # exact: the float 2^23 + q from a byte q by prmt
    acc = [[b.reg("f32") for _ in range(Tn)] for _ in range(R)]
    for row in acc:
        for r_ in row:
            b.emit("mov.f32", r_, Imm(0.0, "f32"))
    lane_dec = lane_cls(b, lane)

    def alloc_state():
        return {"u": b.reg("u32"), "live": b.reg("pred"), "w": [b.regs("b32", lane_cls.WORDS) for _ in range(R)],
                "tail": False}

    def issue(st, jb, pred=None, tail=False):
        st["tail"] = tail
        b.emit("add.u32", st["u"], jb, lane)
        if tail:
            b.emit("setp.lt.u32", st["live"], st["u"], nunits)
        lp = st["live"] if tail else pred
        for r in range(R):
            regs = st["w"][r]
            if tail:
                for reg in regs:
                    b.emit("mov.b32", reg, Imm(0, "b32"))
            lane_dec.load(b, st["u"], rowptr[r], regs, lp)

    def compute(st):
        pred = st["live"] if st["tail"] else None
        if exact:
            return lane_dec.compute_exact(b, st["u"], st["w"], actptr, gsize, acc, magic, pred, st["tail"])
        acts = [lane_dec.act(b, st["u"], actptr[t], gsize, pred, st["tail"]) for t in range(Tn)]
        lane_dec.compute(b, st["u"], st["w"], acts, acc, ones)

    S0, S1 = alloc_state(), alloc_state()
    _lane_steps(b, nunits, S0, S1, issue, compute)
    _lane_epilogue(b, {(r, t): acc[r][t] for r in range(R) for t in range(Tn)}, lane, gwarp, row0, M, ntok, Y,
                   part_p, cnt_p)
    return b.finish()


def _lane_steps(b, nunits, S0, S1, issue, compute):
    """The step loop of the lane GEMVs: lane = unit jb + lane; full steps ping-pong (the next step's weight
    loads in flight while this one computes), then a predicated tail step; split-K over gridDim.y (split z
    takes steps z, z + splits, ..., the tail too when it is its turn)."""
    b.comment("full steps (every lane has a unit): ping-pong, the next step's weight loads in flight")
    nfull = b.op("and.b32", nunits, Imm(~31 & 0xFFFFFFFF, "b32"))
    kz, nsplit = b.special("ctaid.y"), b.special("nctaid.y")
    jb = b.op("shl.b32", kz, Imm(5, "u32"))
    stride = b.op("shl.b32", nsplit, Imm(5, "u32"))
    tail, done = b.label("tail"), b.label("units_done")
    pdl = b.arch.has("griddepcontrol")
    b.bra(tail, pred=b.op("setp.ge.u32", jb, nfull))
    issue(S0, jb)
    if pdl:  # launched early behind the activation prep: weights are in flight, now wait for the activation
        b.emit("griddepcontrol.wait")
    top = b.label("step")
    b.place(top)
    b.emit("add.u32", jb, jb, stride)
    more = b.op("setp.lt.u32", jb, nfull)
    issue(S1, jb, pred=more)
    compute(S0)
    b.bra(tail, pred=more, neg=True)
    b.emit("add.u32", jb, jb, stride)
    more = b.op("setp.lt.u32", jb, nfull)
    issue(S0, jb, pred=more)
    compute(S1)
    b.bra(top, pred=more)
    b.place(tail)
    if pdl:  # (a second wait after the first returns at once)
        b.emit("griddepcontrol.wait")
    b.comment("the tail step (units not a multiple of 32): lanes past the end add zeros")
    b.bra(done, pred=b.op("setp.ge.u32", jb, nunits))
    issue(S0, jb, tail=True)
    compute(S0)
    b.place(done)


def _lane_epilogue(b, sums, lane, gwarp, row0, M, ntok, Y, part_p, cnt_p):
    """Reduce each (row r, token t) over the 32 lanes (shfl.bfly) and store it from lane r·T + t; with
    split-K, store the split's partial and let the last warp of the row group sum the splits in z order."""
    b.comment("reduce the 32 lanes by shfl.bfly; lane r*T + t owns (row r, token t)")
    Tn = 1 + max(t for _, t in sums)
    red = {}
    for (r, t), v in sums.items():
        red[r, t] = warp_sum(b, v)
    sums = red
    kz, nsplit = b.special("ctaid.y"), b.special("nctaid.y")
    owner = {}
    for (r, t) in sums:
        row = b.op("add.u32", row0, Imm(r, "u32"))
        mine = b.op("setp.eq.u32", lane, Imm(r * Tn + t, "u32"))
        ok = b.op("and.pred", b.op("and.pred", mine, b.op("setp.lt.u32", row, M)),
                  b.op("setp.lt.u32", Imm(t, "u32"), ntok, type="pred"))
        owner[r, t] = (ok, b.op("mad.lo.u32", Imm(t, "u32"), M, row, type="u32"))
    _store_or_split(b, [(ok, yoff, sums[key]) for key, (ok, yoff) in owner.items()], lane, gwarp, kz, nsplit,
                    M, ntok, Y, part_p, cnt_p)


def _store_or_split(b, items, lane, gwarp, kz, nsplit, M, ntok, Y, part_p, cnt_p, lean=False, after_store=None):
    """items: (pred, y offset, value) this lane owns. One split: store them. Split-K: store this split's
    partials; the warp that arrives last at the row group's counter (index gwarp) sums the splits in z order
    (deterministic) into y and resets the counter. Ends the thread. lean: the sum one split at a time from one
    base pointer (for many items: fewer registers, more round trips). after_store: emitted after one split's
    stores (a trace build's record)."""
    split = b.label("split")
    b.bra(split, pred=b.op("setp.gt.u32", nsplit, Imm(1, "u32")))
    for ok, yoff, v in items:
        b.emit("st.global.f32", Mem(b.op("mad.wide.u32", yoff, Imm(4, "u32"), Y)), v, pred=ok)
    if after_store is not None:
        after_store()
    b.emit("ret")
    b.place(split)
    b.comment("split-K: store this split's partials; the warp that arrives last at the row group's counter sums "
              "the splits in z order (deterministic) and resets the counter")
    P, C = b.ptr(part_p), b.ptr(cnt_p)
    zoff = b.op("mul.lo.u32", b.op("mul.lo.u32", kz, ntok), M)
    plane = b.op("mul.lo.u32", ntok, M)
    for ok, yoff, v in items:
        b.emit("st.global.f32", Mem(b.op("mad.wide.u32", b.op("add.u32", zoff, yoff), Imm(4, "u32"), P)), v, pred=ok)
    # the warp's stores, a warp barrier (memory ordering among its lanes), then lane 0's acq_rel count: a release
    # cumulative over the lanes' stores and an acquire of the other splits' (no per-lane fence.sc: membar.gl is one)
    b.emit("bar.warp.sync", Imm(0xFFFFFFFF, "b32"))
    cnt = b.op("mad.wide.u32", gwarp, Imm(4, "u32"), C)
    lead = b.op("setp.eq.u32", lane, Imm(0, "u32"))
    old = b.reg("u32")
    b.emit("mov.u32", old, Imm(0, "u32"))
    b.emit("atom.acq_rel.gpu.global.add.u32", old, Mem(cnt), Imm(1, "u32"), pred=lead)
    old = b.op("shfl.sync.idx.b32", old, Imm(0, "u32"), Imm(31, "u32"), Imm(0xFFFFFFFF, "b32"), type="u32")
    fin = b.label("not_last")
    b.bra(fin, pred=b.op("setp.ne.u32", old, b.op("sub.u32", nsplit, Imm(1, "u32"))))
    b.emit("bar.warp.sync", Imm(0xFFFFFFFF, "b32"))  # every lane's loads after lane 0's acquire
    # the sum in z order, its loads 4 splits at a time (one L2 round trip per 4 splits, not one per split and
    # item: with 11 splits and 4 items that chain was ~44 round trips on the kernel's critical path)
    # (lean: one split at a time from one base pointer, the items' addresses recomputed per load — for 32 items,
    # 4 splits in flight and 32 64-bit pointers held ~190 registers)
    few = not lean
    U = 4 if few else 1
    step = b.op("mul.wide.u32", plane, Imm(4, "u32"))
    pz = [b.op("mad.wide.u32", yoff, Imm(4, "u32"), P) for _, yoff, _ in items] if few else None
    pbase = None if few else b.op("mov.u64", P)
    tots = []
    for i_, (ok, yoff, _) in enumerate(items):
        tot = b.reg("f32")
        b.emit("mov.f32", tot, Imm(0.0, "f32"))
        b.emit("ld.global.cg.f32", tot, Mem(pz[i_] if few else b.op("mad.wide.u32", yoff, Imm(4, "u32"), pbase)), pred=ok)
        tots.append(tot)
    z = b.op("mov.u32", Imm(1, "u32"))

    def more(n):
        """Load splits z .. z + n - 1 of every item, then add them in z order."""
        vals = []
        for u in range(n):
            row = []
            if not few:
                b.emit("add.s64", pbase, pbase, step)
            for i_, (ok, yoff, _) in enumerate(items):
                if few:
                    b.emit("add.s64", pz[i_], pz[i_], step)
                pv = b.reg("f32")
                b.emit("mov.f32", pv, Imm(0.0, "f32"))
                b.emit("ld.global.cg.f32", pv, Mem(pz[i_] if few else b.op("mad.wide.u32", yoff, Imm(4, "u32"), pbase)),
                       pred=ok)
                row.append(pv)
            vals.append(row)
        for row in vals:
            for tot, pv in zip(tots, row):
                b.emit("add.rn.f32", tot, tot, pv)
        b.emit("add.u32", z, z, Imm(n, "u32"))

    zl, zt, zd = b.label("z4"), b.label("z1"), b.label("z_done")
    b.place(zl)
    b.bra(zt, pred=b.op("setp.gt.u32", b.op("add.u32", z, Imm(U, "u32")), nsplit))
    more(U)
    b.bra(zl)
    b.place(zt)
    b.bra(zd, pred=b.op("setp.ge.u32", z, nsplit))
    more(1)
    b.bra(zt)
    b.place(zd)
    for (ok, yoff, _), tot in zip(items, tots):
        b.emit("st.global.f32", Mem(b.op("mad.wide.u32", yoff, Imm(4, "u32"), Y)), tot, pred=ok)
    b.emit("st.global.u32", Mem(cnt), Imm(0, "u32"), pred=lead)
    b.place(fin)
    b.emit("ret")


def _rotate_unit_in_registers(b, act, word, lane, live):
    """forward RHT of each token's 32-column block, spread over 4 lanes × 8 values, in the reference's
    float operations and order: sign, butterfly 1, 2, 4 (in registers), 8, 16 (shfl.xor 1, 2), scale."""
    b.comment("fused forward RHT: sign, butterfly 1,2,4 in registers, 8,16 across lanes, scale")
    # sign bits of the lane's 8 elements: bits 8·word .. 8·word+7 of the mask
    sbits = b.op("shr.u32", Imm(T4.SIGN_MASK, "u32"), b.op("shl.b32", word, Imm(3, "u32")), type="u32")
    for t in range(len(act)):
        v = act[t]
        for e in range(8):
            neg = b.op("shl.b32", b.op("and.b32", b.op("shr.u32", sbits, Imm(e, "u32")), Imm(1, "b32")), Imm(31, "u32"))
            b.emit("xor.b32", v[e], v[e], neg)
        for step in (1, 2, 4):
            for j in range(8):
                if j & step:
                    continue
                a_, c_ = v[j], v[j + step]
                s_ = b.op("add.rn.f32", a_, c_)
                d_ = b.op("sub.rn.f32", a_, c_)
                v[j], v[j + step] = s_, d_
        for h, lanebit in ((8, 1), (16, 2)):
            upper = b.op("setp.ne.u32", b.op("and.b32", word, Imm(lanebit, "b32")), Imm(0, "u32"))
            for e in range(8):
                o = b.op("shfl.sync.bfly.b32", v[e], Imm(lanebit, "u32"), Imm(31, "u32"), Imm(0xFFFFFFFF, "b32"), type="f32")
                plus = b.op("add.rn.f32", v[e], o)
                minus = b.op("sub.rn.f32", o, v[e])
                v[e] = b.op("selp.f32", minus, plus, upper)
        for e in range(8):
            v[e] = b.op("mul.rn.f32", v[e], Imm(float(T4.INV_SQRT32), "f32"))
        act[t] = v


def _rotate_lane_value(b, x, lane, blk, x16: bool = False):
    """Lane = element of block blk: load (`x16`: an fp16 x, widened exactly), forward RHT by shfl butterflies
    (bit-identical to rht_forward of the fp32 values)."""
    off = b.op("mad.lo.u32", blk, Imm(32, "u32"), lane)
    return off, _rotate_lane(b, _lane_value(b, x, off, x16), lane)


def _lane_value(b, x, off, x16: bool = False):
    """Element `off` of the activation x as fp32: an fp32 load, or (`x16`) an fp16 one widened exactly."""
    if x16:
        return b.op("cvt.f32.f16", b.op("ld.global.nc.b16", Mem(b.op("mad.wide.u32", off, Imm(2, "u32"), x))))
    return b.op("ld.global.nc.f32", Mem(b.op("mad.wide.u32", off, Imm(4, "u32"), x)))


def _rotate_lane(b, v, lane):
    """The forward RHT of a 32-element block held one element a lane (`v`, fp32): sign flips, five shfl butterflies,
    1/√32 (bit-identical to rht_forward)."""
    neg = b.op("shl.b32", b.op("and.b32", b.op("shr.u32", Imm(T4.SIGN_MASK, "u32"), lane, type="u32"), Imm(1, "b32")),
               Imm(31, "u32"))
    v = b.op("xor.b32", v, neg, type="f32")
    for h in (1, 2, 4, 8, 16):
        o = b.op("shfl.sync.bfly.b32", v, Imm(h, "u32"), Imm(31, "u32"), Imm(0xFFFFFFFF, "b32"), type="f32")
        upper = b.op("setp.ne.u32", b.op("and.b32", lane, Imm(h, "b32")), Imm(0, "u32"))
        v = b.op("selp.f32", b.op("sub.rn.f32", o, v), b.op("add.rn.f32", v, o), upper)
    return b.op("mul.rn.f32", v, Imm(float(T4.INV_SQRT32), "f32"))


def build_rotate(arch):
    """rotate_tq4_1s: the activation's forward RHT, one warp per 32-element block, lane = element."""
    b = KernelBuilder(ActKernel("rotate").name, arch, "forward RHT of fp32 activations per 32-element block (TQ4_1S)",
                      block=(32 * WARPS, 1, 1))
    x_p = b.param("x", "u64", "ptr:in")
    y_p = b.param("y", "u64", "ptr:out")
    n_p = b.param("nblocks", "u32")
    b.meta.update(warps=WARPS, blocks_per_cta=WARPS, grid="ceil(nblocks / 8)")
    x, y = b.ptr(x_p), b.ptr(y_p)
    n = b.ld_param(n_p, "u32")
    lane, blk, done = warp_per_item(b, n, WARPS)
    off, v = _rotate_lane_value(b, x, lane, blk)
    b.emit("st.global.f32", Mem(b.op("mad.wide.u32", off, Imm(4, "u32"), y)), v)
    b.place(done)
    b.emit("ret")
    return b.finish()


# rotate_tq4_1s_f16's `mode` bits
ROT_X16, ROT_REGA, ROT_NO_F16 = 1, 2, 4


def build_rotate_f16(arch):
    """rotate_tq4_1s_f16: the rotation ahead of TQ4_1S's fp16 GEMMs in one pass — x (fp32, or fp16 where mode has
    ROT_X16) rotated as rotate_tq4_1s does (the same fp32 bits, into y32: the fixup behind the GEMM reads them) and,
    unless ROT_NO_F16, rounded to fp16 into y16 as convert_f16 would write it (ROT_REGA: convert_f16_perm's register-A
    K order; K a multiple of 64), raising `flag` where a value leaves fp16 or a block is too small for it. One warp
    a 32-element block as rotate_tq4_1s; a lane pairs its value with its partner's (lane ^ 1 in x's order, lane ^ 2
    in the register-A order, where columns c and c + 2 are adjacent halves) by one shfl and half the lanes store a
    word. In place of convert_f32 → rotate_tq4_1s → convert_f16(_perm): one launch, x read once."""
    b = KernelBuilder(ActKernel("rotate", f16=True).name, arch,
                      "forward RHT of fp32 / fp16 activations (TQ4_1S) into fp32 and fp16 (x's or the register-A K "
                      "order), with an overflow flag", block=(32 * WARPS, 1, 1))
    x_p, y_p, h_p = b.param("x", "u64", "ptr:in"), b.param("y32", "u64", "ptr:out"), b.param("y16", "u64", "ptr:out")
    f_p, n_p, m_p = b.param("flag", "u64", "ptr:out"), b.param("nblocks", "u32"), b.param("mode", "u32")
    b.meta.update(warps=WARPS, blocks_per_cta=WARPS, grid="ceil(nblocks / 8)",
                  mode=f"bits: {ROT_X16} x is fp16, {ROT_REGA} y16 in the register-A K order, {ROT_NO_F16} no y16")
    b.pdl_head()  # the GEMM after it may launch now (it waits before its first TMA of x)
    x, y, Y16, F = b.ptr(x_p), b.ptr(y_p), b.ptr(h_p), b.ptr(f_p)
    n, mode = b.ld_param(n_p, "u32"), b.ld_param(m_p, "u32")
    lane, blk, done = warp_per_item(b, n, WARPS)
    off = b.op("mad.lo.u32", blk, Imm(32, "u32"), lane)
    half = b.op("setp.ne.u32", b.op("and.b32", mode, Imm(ROT_X16, "b32")), Imm(0, "u32"))
    v, h = b.reg("f32"), b.reg("b16")
    b.emit("ld.global.nc.f32", v, Mem(b.op("mad.wide.u32", off, Imm(4, "u32"), x)), pred=half, neg=True)
    b.emit("ld.global.nc.b16", h, Mem(b.op("mad.wide.u32", off, Imm(2, "u32"), x)), pred=half)
    b.emit("cvt.f32.f16", v, h, pred=half)
    v = _rotate_lane(b, v, lane)
    b.emit("st.global.f32", Mem(b.op("mad.wide.u32", off, Imm(4, "u32"), y)), v)
    b.bra(done, pred=b.op("setp.ne.u32", b.op("and.b32", mode, Imm(ROT_NO_F16, "b32")), Imm(0, "u32")))
    rega = b.op("setp.ne.u32", b.op("and.b32", mode, Imm(ROT_REGA, "b32")), Imm(0, "u32"))
    dist = b.op("selp.u32", Imm(2, "u32"), Imm(1, "u32"), rega)
    o = b.op("shfl.sync.bfly.b32", v, dist, Imm(31, "u32"), Imm(0xFFFFFFFF, "b32"), type="f32")
    word = b.op("cvt.rn.f16x2.f32", o, v, type="b32")  # (own, partner): the lower column's lane stores
    # where: x's order, the element's own halfword (its column is even); the register-A order, within the 64-column
    # chunk (block 2c + hh is its half hh), group q = (l & 1) + 2·(l >> 2 & 1) + 4·hh, word j = l >> 3: byte 16q + 4j
    # (layouts.q4k_rega_k_order: columns l and l + 2 of the half are that word's halves)
    q = b.op("add.u32", b.op("and.b32", lane, Imm(1, "b32")),
             b.op("add.u32", b.op("shr.u32", b.op("and.b32", lane, Imm(4, "b32")), Imm(1, "u32")),
                  b.op("shl.b32", b.op("and.b32", blk, Imm(1, "b32")), Imm(2, "u32"))))
    inchunk = b.op("mad.lo.u32", q, Imm(16, "u32"), b.op("shl.b32", b.op("shr.u32", lane, Imm(3, "u32")), Imm(2, "u32")))
    el = b.op("selp.u32", b.op("and.b32", off, Imm(~63 & 0xFFFFFFFF, "b32")), off, rega)  # the chunk's, or its own
    at = b.op("add.s64", b.op("mad.wide.u32", el, Imm(2, "u32"), Y16),
              b.op("cvt.u64.u32", b.op("selp.u32", inchunk, Imm(0, "u32"), rega)))
    stores = b.op("setp.eq.u32", b.op("and.b32", lane, dist), Imm(0, "u32"))
    b.emit("st.global.b32", Mem(at), word, pred=stores)
    # the block too small for fp16's precision (convert_f16.too_small over the warp's 32 values): bits 12-14 of each
    # lane's own half, and bit 0 where its value is not zero, OR-ed over the warp
    mine = b.op("or.b32", b.op("and.b32", word, Imm(0x7000, "b32")),
                b.op("selp.b32", Imm(1, "b32"), Imm(0, "b32"),
                     b.op("setp.ne.u32", b.op("and.b32", v, Imm(0x7FFFFFFF, "b32")), Imm(0, "u32"))))
    for d in (16, 8, 4, 2, 1):
        mine = b.op("or.b32", mine, b.op("shfl.sync.bfly.b32", mine, Imm(d, "u32"), Imm(31, "u32"),
                                         Imm(0xFFFFFFFF, "b32"), type="b32"))
    tiny = b.op("setp.eq.u32", b.op("and.b32", mine, Imm(0x7001, "b32")), Imm(1, "u32"))
    b.emit("st.global.u32", Mem(F), Imm(1, "u32"),
           pred=b.op("and.pred", stores, b.op("or.pred", overflowed(b, [word]), tiny)))
    b.place(done)
    b.emit("ret")
    return b.finish()


def build_prep(arch, fast: bool, rotate: bool = True, x16: bool = False):
    """prep_tq4_1s{_q8}: x (T, K) fp32 → forward_rht(x) in the GEMV's lane layout (ptxgen.formats.tq4_1s
    `to_lanes_f32`), or quantized to Q8_1 (the quantize_q8_1 kernel's math) in the quantized lane layout
    (`to_lanes_q8`): one pass over x, one launch, for the lane-per-block GEMVs. `x16` (the _x16 twins): x is fp16,
    each value widened exactly as it is loaded — the output of x.astype(float32), without a convert_f32 launch."""
    name = GemvKernel("prep_lanes", "tq4_1s" if rotate else "q4_K", fast=fast, x16=x16).name
    doc = ("TQ4_1S activation: forward RHT" + (" + Q8_1" if fast else "") if rotate else
           "activation: " + ("Q8_1" if fast else "fp32")) + " into the GEMV's lane layout"
    b = KernelBuilder(name, arch, doc, block=(32 * WARPS, 1, 1))
    x_p, y_p = b.param("x", "u64", "ptr:in"), b.param("y", "u64", "ptr:out")
    n_p, k_p = b.param("nblocks", "u32"), b.param("k", "u32")
    b.meta.update(warps=WARPS, blocks_per_cta=WARPS, grid="ceil(nblocks / 8)",
                  layout="to_lanes_q8(quantize_q8_1(.))" if fast else "to_lanes_f32")
    b.pdl_head()  # the GEMV that reads this may launch now and load its weights meanwhile
    x, y = b.ptr(x_p), b.ptr(y_p)
    n, K = b.ld_param(n_p, "u32"), b.ld_param(k_p, "u32")
    lane, blk, done = warp_per_item(b, n, WARPS)
    if rotate:
        _, v = _rotate_lane_value(b, x, lane, blk, x16)
    else:
        v = _lane_value(b, x, b.op("mad.lo.u32", blk, Imm(32, "u32"), lane), x16)
    nb = b.op("shr.u32", K, Imm(5, "u32"))
    groups = b.op("shr.u32", b.op("add.u32", nb, Imm(31, "u32")), Imm(5, "u32"))
    t = b.op("div.u32", blk, nb)
    bb = b.op("rem.u32", blk, nb)
    gsize = T4.LANE_GROUP_Q8 if fast else T4.LANE_GROUP_F32
    # byte offset of this block's group: (t·groups + bb/32)·gsize; the block is lane l = bb % 32 there
    gbase = b.op("mul.wide.u32", b.op("mad.lo.u32", t, groups, b.op("shr.u32", bb, Imm(5, "u32"))), Imm(gsize, "u32"))
    l = b.op("and.b32", bb, Imm(31, "b32"))
    e4 = b.op("shr.u32", lane, Imm(2, "u32"))  # element e = lane: e // 4, e % 4
    e_lo = b.op("and.b32", lane, Imm(3, "b32"))
    if not fast:  # element e at [(e // 4)·128 + l·4 + e % 4] floats
        idx = b.op("mad.lo.u32", e4, Imm(128, "u32"), b.op("mad.lo.u32", l, Imm(4, "u32"), e_lo))
        b.emit("st.global.f32", Mem(b.op("add.s64", b.op("add.s64", y, gbase), b.op("mul.wide.u32", idx, Imm(4, "u32")))), v)
    else:  # byte e % 4 of qs word w = e // 4, at word [(w // 4)·128 + l·4 + w % 4]; d as fp32 at byte 1024 + 4·l
        from .quantize_q8_1 import q8_1_math

        q, dh, _ = q8_1_math(b, v)
        w4 = b.op("shr.u32", e4, Imm(2, "u32"))
        wlo = b.op("and.b32", e4, Imm(3, "b32"))
        word = b.op("mad.lo.u32", w4, Imm(128, "u32"), b.op("mad.lo.u32", l, Imm(4, "u32"), wlo))
        boff = b.op("mad.lo.u32", word, Imm(4, "u32"), e_lo)
        base = b.op("add.s64", y, gbase)
        b.emit("st.global.u8", Mem(b.op("add.s64", base, b.op("cvt.u64.u32", boff))), q)
        lead = b.op("setp.eq.u32", lane, Imm(0, "u32"))
        dp = b.op("add.s64", base, b.op("cvt.u64.u32", b.op("mad.lo.u32", l, Imm(4, "u32"), Imm(1024, "u32"), type="u32")))
        b.emit("st.global.f32", Mem(dp), b.op("cvt.f32.f16", dh), pred=lead)
        # the block's Σq (an exact integer as fp32) at byte LANE_SUMS + 4·l: the K-quant lanes' min terms
        # (|q| ≤ 127: every partial sum is an integer below 2^12, exact in fp32 in any order)
        qsum = warp_sum(b, b.op("cvt.rn.f32.s32", q))
        b.emit("st.global.f32", Mem(dp, T4.LANE_SUMS - 1024), qsum, pred=lead)
    b.place(done)
    b.emit("ret")
    return b.finish()


def kernel_defs() -> list[KernelDef]:
    G = GemvKernel
    defs = [KernelDef(ActKernel("rotate").name, "TQ4_1S activation rotation (forward RHT), fp32 → fp32", build_rotate),
            KernelDef(ActKernel("rotate", f16=True).name, "TQ4_1S activation rotation, fp32 / fp16 → fp32 and fp16 "
                      "(x's or the register-A K order) with an overflow flag", build_rotate_f16),
            KernelDef(G("prep_lanes", "tq4_1s").name, "TQ4_1S activation: forward RHT into the GEMV's lane layout",
                      lambda arch: build_prep(arch, False)),
            KernelDef(G("prep_lanes", "tq4_1s", fast=True).name,
                      "TQ4_1S activation: forward RHT + Q8_1 into the GEMV's lane layout",
                      lambda arch: build_prep(arch, True)),
            KernelDef(G("prep_lanes", "q8_0", fast=True).name,
                      "activation: Q8_1 into the GEMV's lane layout (Q4_K, Q8_0 fast GEMVs)",
                      lambda arch: build_prep(arch, True, rotate=False)),
            KernelDef(G("prep_lanes", "q4_K").name, "activation: fp32 into the GEMV's lane layout (Q4_K exact GEMV)",
                      lambda arch: build_prep(arch, False, rotate=False)),
            KernelDef(G("prep_mma", "tq4_1s").name,
                      "TQ4_1S activation: forward RHT, scaled fp16 hi/lo B tiles (tensor-core GEMV)",
                      build_prep_mma, archs=TMA_ARCHS),
            KernelDef(G("mma", "tq4_1s").name, "tq4_1s decode GEMV, T <= 8, mma.sync hi/lo split, weights by TMA "
                      "(mul_mat at T = 3-8 on sm_90, M·K ≥ 2^25)", build_mma_gemv, archs=TMA_ARCHS),
            KernelDef(G("mma", "tq4_1s", small=True).name, "tq4_1s decode GEMV as gemv_tq4_1s_mma, one m16 tile per "
                      "warp (mul_mat at T = 3-8 on sm_90, M·K < 2^25; T = 5-8 below 14·2^20)",
                      lambda arch: build_mma_gemv(arch, small=True), archs=TMA_ARCHS),
            KernelDef(G("prep_mma", "q4_K").name,
                      "activation: scaled fp16 hi/lo B tiles + min-term fragments (Q4_K tensor-core GEMV)",
                      lambda arch: build_prep_mma(arch, rotate=False)),
            *[KernelDef(G("prep_lanes", f, fast=fast, x16=True).name, f"{G('prep_lanes', f, fast=fast).name} on fp16 x "
                        "(each value widened as it is loaded: no convert_f32 launch)",
                        lambda arch, f=f, fast=fast: build_prep(arch, fast, rotate=f == "tq4_1s", x16=True))
              for f, fast in (("tq4_1s", False), ("tq4_1s", True), ("q8_0", True), ("q4_K", False))],
            *[KernelDef(G("prep_mma", f, x16=True).name, f"{G('prep_mma', f).name} on fp16 x (each value widened as it "
                        "is loaded: no convert_f32 launch)",
                        lambda arch, f=f: build_prep_mma(arch, rotate=f == "tq4_1s", x16=True),
                        **({"archs": TMA_ARCHS} if f == "tq4_1s" else {}))
              for f in ("tq4_1s", "q4_K")],
            KernelDef(G("mma", "q4_K").name, "q4_K decode GEMV, T <= 8, exact, mma.sync on integer nibbles x hi/lo "
                      "activation, weights by TMA (sm_90a) or cp.async (sm_89, sm_120a)", build_q4k_mma_gemv),
            KernelDef(G("mma", "q4_K", 16).name, "q4_K skinny GEMM, T = 9-16, exact, as gemv_q4_k_mma with two "
                      "token groups (mul_mat's exact Q4_K at T = 9-16)", lambda arch: build_q4k_mma_gemv(arch, 2))]
    for t in TOKENS:
        if t <= 2:
            defs.append(KernelDef(G("gemv", "q4_K", t).name,
                                  f"q4_K decode GEMV, T={t}, fp32 activation from prep_f32_lanes",
                                  lambda arch, t=t: build_lanes_ggml(arch, "q4_K", t, exact=True)))
        else:  # measured on the H200: at T=4 the lane kernel (170 registers) is 15% slower than the
            # 8-weight-unit kernel, and at T=8 eight tokens of fp32 activations per lane spill: unit kernel, plain x
            spec = GemvSpec("q4_K", t, ROWS[t])
            defs.append(KernelDef(spec.name, f"q4_K decode GEMV, T={t}", lambda arch, spec=spec: build(arch, spec)))
        spec = GemvSpec("tq4_1s", t, LANE_ROWS[t])
        defs.append(KernelDef(spec.name, f"tq4_1s decode GEMV, T={t}, activation from prep_tq4_1s",
                              lambda arch, spec=spec: build_lanes(arch, spec)))
        defs.append(KernelDef(G("gemv", "tq4_1s", t, tma=True).name,
                              f"tq4_1s decode GEMV, T={t}, weights by TMA (K % 128 == 0), activation from prep_tq4_1s"
                              + (", codebook pairs per qs byte" if t in TMA_PAIRS else
                                 f" (mul_mat keeps {G('gemv', 'tq4_1s', t).name}: faster on the H200)"),
                              lambda arch, t=t: build_tma_lanes(arch, t, TMA_PAIRS.get(t)), archs=TMA_ARCHS))
        if t <= 4:  # fused rotation: the 8-weight-unit kernel (x read coalesced in its own layout)
            spec = GemvSpec("tq4_1s", t, ROWS[t], True)
            defs.append(KernelDef(spec.name, f"tq4_1s decode GEMV, T={t}, fused rotation",
                                  lambda arch, spec=spec: build(arch, spec)))
        for fmt in FAST_LANE_FORMATS:
            defs.append(KernelDef(G("gemv", fmt, t, fast=True).name,
                                  f"{fmt} decode GEMV, T={t}, int8 x Q8_1 (prep_q8_lanes), dp4a",
                                  lambda arch, fmt=fmt, t=t: build_lanes_ggml(arch, fmt, t)))
        spec = GemvSpec("tq4_1s", t, LANE_ROWS_FAST[t], False, "fast")
        defs.append(KernelDef(spec.name,
                              f"tq4_1s decode GEMV, T={t}, fast: int8 codebook x Q8_1 (prep_tq4_1s_q8), dp4a",
                              lambda arch, spec=spec: build_lanes(arch, spec)))
    return defs
