"""moe_group: mul_mat_id's expert grouping on the device, the work list of the grouped MoE GEMM (mmq_*_moe).

One CTA of 1024 threads reads the (token, slot) pairs' expert ids once and writes, without a host round trip:
- `offsets` (E + 1 u32): expert e's pairs are order[offsets[e] .. offsets[e + 1]) (an exclusive scan of the
  per-expert counts, counted with shared-memory atomics);
- `order` (u32 per valid pair): the pair indices p = t·slots + j grouped by expert (in no fixed order inside an
  expert: each pair's output row is computed alone, so the result does not depend on it);
- `work`: work[0] = L, then L entries e | tile << 16, one per token tile of BN pairs of each expert with pairs
  (expert-major, its tiles in order) — the GEMM's items are (M tile, entry);
- y's row of a pair whose id is outside [0, E): NaN (the GEMM never sees the pair);
- `gate` = 0 (the grouped GEMM sets it where an activation overflowed fp16; the exact GEMV behind it runs then).
E ≤ MAX_EXPERTS = THREADS (thread e scans expert e); the pairs are walked 1024 at a time (any count)."""
from __future__ import annotations

from ..builder import KernelBuilder
from ..ir import Imm, Mem
from . import KernelDef

THREADS = 1024
MAX_EXPERTS = THREADS  # thread e scans expert e
TILE_SHIFT = 16  # work entry = expert | token tile << TILE_SHIFT


def _loop(b, start, end, step, body, name):
    """for (i = start; i < end; i += step) body(i), per thread (divergent)."""
    i = b.op("mov.u32", start)
    top, out = b.label(name), b.label(name + "_end")
    b.place(top)
    b.bra(out, pred=b.op("setp.ge.u32", i, end), uniform=False)
    body(i)
    b.emit("add.u32", i, i, Imm(step, "u32") if isinstance(step, int) else step)
    b.bra(top, uniform=False)
    b.place(out)


UNROLL = 4  # pairs a thread's id loads keep in flight per round of the count and scatter walks


def _pairs_loop(b, IDS, P, tid, use, name):
    """for each pair p = tid + THREADS·i < P: use(p, its id, in-range predicate), UNROLL pairs a round with their id
    loads issued together (a 4096-pair walk is 4 rounds of one load latency, not 4 latencies in a row); a load past
    P is predicated off and leaves id 0xFFFFFFFF."""
    i = b.op("mov.u32", tid)
    top, out = b.label(name), b.label(name + "_end")
    b.place(top)
    b.bra(out, pred=b.op("setp.ge.u32", i, P), uniform=False)
    got = []
    for u in range(UNROLL):
        p = b.op("add.u32", i, Imm(u * THREADS, "u32")) if u else i
        inb = b.op("setp.lt.u32", p, P)
        e = b.op("mov.u32", Imm(0xFFFFFFFF, "u32"))
        b.emit("ld.global.nc.u32", e, Mem(b.op("mad.wide.u32", p, Imm(4, "u32"), IDS)), pred=inb)
        got.append((p, e, inb))
    for p, e, inb in got:
        use(p, e, inb)
    b.emit("add.u32", i, i, Imm(UNROLL * THREADS, "u32"))
    b.bra(top, uniform=False)
    b.place(out)


def _warp_scan(b, v, lane):
    """Inclusive prefix sum of u32 `v` over the warp (shfl.up, lanes below the offset add nothing)."""
    for d in (1, 2, 4, 8, 16):
        o = b.op("shfl.sync.up.b32", v, Imm(d, "u32"), Imm(0, "u32"), Imm(0xFFFFFFFF, "b32"), type="u32")
        v = b.op("add.u32", v, b.op("selp.b32", o, Imm(0, "b32"), b.op("setp.ge.u32", lane, Imm(d, "u32"))))
    return v


def build(arch):
    b = KernelBuilder("moe_group", arch, __doc__.splitlines()[0], block=(THREADS, 1, 1))
    ids_p, n_p, e_p = b.param("ids", "u64", "ptr:in"), b.param("npairs", "u32"), b.param("experts", "u32")
    bn_p = b.param("tile", "u32")
    ord_p, off_p = b.param("order", "u64", "ptr:scratch"), b.param("offsets", "u64", "ptr:scratch")
    wrk_p, y_p, m_p = b.param("work", "u64", "ptr:scratch"), b.param("y", "u64", "ptr:out"), b.param("m", "u32")
    g_p = b.param("gate", "u64", "ptr:scratch")  # zeroed here: the grouped GEMM raises it, the exact recompute reads it
    b.directives += [f".maxntid {THREADS}, 1, 1"]
    b.meta.update(grid="1", max_experts=MAX_EXPERTS, work="work[0] = L; work[1 + i] = expert | token tile << 16",
                  order="u32 per valid pair, grouped by expert", offsets="u32 × (experts + 1)")
    counts = b.shared_buffer("counts", 4 * MAX_EXPERTS)
    cursor = b.shared_buffer("cursor", 4 * MAX_EXPERTS)
    tstart = b.shared_buffer("tile_start", 4 * MAX_EXPERTS)
    wsums = b.shared_buffer("warp_sums", 4 * 64)  # per warp: its count total, then its tile total
    b.pdl_head()  # it reads ids, which the op before may have written
    IDS, ORD, OFF, WRK, Y = (b.ptr(p) for p in (ids_p, ord_p, off_p, wrk_p, y_p))
    P, E, BN, M = (b.ld_param(p, "u32") for p in (n_p, e_p, bn_p, m_p))
    tid = b.special("tid.x")
    b.emit("st.global.u32", Mem(b.ptr(g_p)), Imm(0, "u32"), pred=b.op("setp.eq.u32", tid, Imm(0, "u32")))
    cb, kb, sb, wb = (b.op("mov.u32", s) for s in (counts, cursor, tstart, wsums))

    def at(base, i):
        return b.op("mad.lo.u32", i, Imm(4, "u32"), base)

    def gat(base, i):
        return b.op("mad.wide.u32", i, Imm(4, "u32"), base)

    b.comment("per-expert counts: zeroed, then one shared atomic per valid pair; a bad id's row of y is NaN")
    _loop(b, tid, E, THREADS, lambda e: b.emit("st.shared.u32", Mem(at(cb, e)), Imm(0, "u32")), "zero")
    b.emit("bar.sync", Imm(0, "u32"))

    def count(p, e, inb):
        ok = b.op("setp.lt.u32", e, E)  # unsigned: -1 is past E too
        b.emit("atom.shared.add.u32", b.reg("u32"), Mem(at(cb, e)), Imm(1, "u32"), pred=ok)
        skip = b.label("valid")
        b.bra(skip, pred=b.op("or.pred", ok, b.op("not.pred", inb)), uniform=False)
        row = b.op("mul.lo.u32", p, M)
        _loop(b, b.op("mov.u32", Imm(0, "u32")), M, 1, lambda j: b.emit(
            "st.global.f32", Mem(gat(Y, b.op("add.u32", row, j))), Imm(float("nan"), "f32")), "nan_row")
        b.place(skip)
    _pairs_loop(b, IDS, P, tid, count, "count")
    b.emit("bar.sync", Imm(0, "u32"))

    b.comment("exclusive scans of the counts (offsets, cursors) and of their token tiles (work starts): thread e owns "
              "expert e; warp scans by shuffles, then the 32 warps' totals scanned by warp 0")
    bm1 = b.op("sub.u32", BN, Imm(1, "u32"))
    lane, warp = b.op("and.b32", tid, Imm(31, "b32")), b.op("shr.u32", tid, Imm(5, "u32"))
    mine = b.op("setp.lt.u32", tid, E)
    c = b.op("mov.u32", Imm(0, "u32"))
    b.emit("ld.shared.u32", c, Mem(at(cb, tid)), pred=mine)
    n = b.op("div.u32", b.op("add.u32", c, bm1), BN)
    ic, it = _warp_scan(b, c, lane), _warp_scan(b, n, lane)
    last = b.op("setp.eq.u32", lane, Imm(31, "u32"))
    b.emit("st.shared.u32", Mem(at(wb, warp)), ic, pred=last)
    b.emit("st.shared.u32", Mem(at(wb, b.op("add.u32", warp, Imm(32, "u32")))), it, pred=last)
    b.emit("bar.sync", Imm(0, "u32"))
    lead = b.label("warp_totals")
    b.bra(lead, pred=b.op("setp.ne.u32", warp, Imm(0, "u32")))
    for half in (0, 32):  # warp 0: the warps' totals → their exclusive prefixes, in place
        v = b.op("ld.shared.u32", Mem(at(wb, b.op("add.u32", lane, Imm(half, "u32")))))
        b.emit("st.shared.u32", Mem(at(wb, b.op("add.u32", lane, Imm(half, "u32")))), b.op("sub.u32", _warp_scan(b, v, lane), v))
    b.place(lead)
    b.emit("bar.sync", Imm(0, "u32"))
    off = b.op("add.u32", b.op("sub.u32", ic, c), b.op("ld.shared.u32", Mem(at(wb, warp))))
    tile0 = b.op("add.u32", b.op("sub.u32", it, n), b.op("ld.shared.u32", Mem(at(wb, b.op("add.u32", warp, Imm(32, "u32"))))))
    b.emit("st.shared.u32", Mem(at(kb, tid)), off, pred=mine)
    b.emit("st.shared.u32", Mem(at(sb, tid)), tile0, pred=mine)
    b.emit("st.global.u32", Mem(gat(OFF, tid)), off, pred=mine)
    end = b.op("setp.eq.u32", tid, b.op("sub.u32", E, Imm(1, "u32")))  # the last expert's thread: the totals
    b.emit("st.global.u32", Mem(gat(OFF, E)), b.op("add.u32", off, c), pred=end)
    b.emit("st.global.u32", Mem(WRK), b.op("add.u32", tile0, n), pred=end)
    b.emit("bar.sync", Imm(0, "u32"))

    b.comment("the work entries of expert e: e | tile << 16 for each of its token tiles")

    def entries(e):
        c = b.op("ld.shared.u32", Mem(at(cb, e)))
        n = b.op("div.u32", b.op("add.u32", c, bm1), BN)
        s = b.op("ld.shared.u32", Mem(at(sb, e)))
        dst = b.op("mad.wide.u32", b.op("add.u32", s, Imm(1, "u32")), Imm(4, "u32"), WRK)
        _loop(b, b.op("mov.u32", Imm(0, "u32")), n, 1, lambda j: b.emit(
            "st.global.u32", Mem(b.op("mad.wide.u32", j, Imm(4, "u32"), dst)),
            b.op("or.b32", e, b.op("shl.b32", j, Imm(TILE_SHIFT, "u32")))), "tile")
    _loop(b, tid, E, THREADS, entries, "entries")

    b.comment("each valid pair to its expert's next place in order")

    def scatter(p, e, inb):
        ok = b.op("setp.lt.u32", e, E)  # past P: e = 0xFFFFFFFF, not an expert
        slot = b.op("mov.u32", Imm(0, "u32"))  # written for every thread: the store's address reads it
        b.emit("atom.shared.add.u32", slot, Mem(at(kb, e)), Imm(1, "u32"), pred=ok)
        b.emit("st.global.u32", Mem(gat(ORD, slot)), p, pred=ok)
    _pairs_loop(b, IDS, P, tid, scatter, "scatter")
    b.emit("ret")
    return b.finish()


def reference(ids, experts: int, tile: int):
    """NumPy model: (offsets, {expert: sorted pair indices}, work entries) — what moe_group writes, the order inside
    an expert aside."""
    import numpy as np

    flat = np.asarray(ids, np.int64).reshape(-1)
    valid = (flat >= 0) & (flat < experts)
    counts = np.bincount(flat[valid], minlength=experts)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.uint32)
    groups = {e: np.nonzero(flat == e)[0] for e in range(experts) if counts[e]}
    work = [e | j << TILE_SHIFT for e in range(experts) for j in range(-(-int(counts[e]) // tile))]
    return offsets, groups, np.array(work, np.uint32)


KERNEL = KernelDef("moe_group", "mul_mat_id's expert grouping: per-expert offsets, pairs by expert, the grouped "
                   "GEMM's work list", build)
