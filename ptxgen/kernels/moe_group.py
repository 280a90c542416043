"""moe_group: mul_mat_id's expert grouping on the device, the work list of the grouped MoE GEMM (mmq_*_moe).

One CTA of 1024 threads reads the (token, slot) pairs' expert ids once and writes, without a host round trip:
- `offsets` (E + 1 u32): expert e's pairs are order[offsets[e] .. offsets[e + 1]) (an exclusive scan of the
  per-expert counts, counted with shared-memory atomics);
- `order` (u32 per valid pair): the pair indices p = t·slots + j grouped by expert (in no fixed order inside an
  expert: each pair's output row is computed alone, so the result does not depend on it);
- `work`: work[0] = L, then L entries e | tile << 16, one per token tile of BN pairs of each expert with pairs
  (expert-major, its tiles in order) — the GEMM's items are (M tile, entry);
- y's row of a pair whose id is outside [0, E): NaN (the GEMM never sees the pair).
E ≤ MAX_EXPERTS = THREADS (thread e scans expert e); the pairs are walked 1024 at a time (any count)."""
from __future__ import annotations

from ..builder import KernelBuilder
from ..ir import Imm, Mem
from . import KernelDef
from ..specs import ActKernel

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


def _at(b):
    return lambda base, i: b.op("mad.lo.u32", i, Imm(4, "u32"), base)  # a u32 array's element i in shared memory


def _gat(b):
    return lambda base, i: b.op("mad.wide.u32", i, Imm(4, "u32"), base)  # ... in global memory


def _scan_and_list(b, bufs, tid, E, BN, OFF, WRK, writer=None):
    """The per-expert counts (shared `counts`) scanned: each expert's place (shared `cursor` and global `offsets`,
    offsets[E] the total) and its first token tile (shared `tile_start`), then the work list (work[0] = L, the
    entries e | tile << 16). `writer`: the predicate of the CTA that writes offsets and the work list (None: every
    CTA, moe_group's one)."""
    cb, kb, sb, wb = bufs
    at, gat = _at(b), _gat(b)
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
    b.emit("st.global.u32", Mem(gat(OFF, tid)), off, pred=_and(b, mine, writer))
    end = _and(b, b.op("setp.eq.u32", tid, b.op("sub.u32", E, Imm(1, "u32"))), writer)  # the last expert's: the totals
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
    if writer is None:
        _loop(b, tid, E, THREADS, entries, "entries")
        return
    skip = b.label("entries_skip")
    b.bra(skip, pred=b.op("not.pred", writer))
    _loop(b, tid, E, THREADS, entries, "entries")
    b.place(skip)


def _and(b, p, q):
    return p if q is None else b.op("and.pred", p, q)


def _nan_row(b, Y, p, M, skip):
    """y's row of pair p (M floats) NaN, unless `skip` (the pair's id is valid, or the pair is not this thread's)."""
    over = b.label("valid")
    b.bra(over, pred=skip, uniform=False)
    row = b.op("mul.lo.u32", p, M)
    _loop(b, b.op("mov.u32", Imm(0, "u32")), M, 1, lambda j: b.emit(
        "st.global.f32", Mem(_gat(b)(Y, b.op("add.u32", row, j))), Imm(float("nan"), "f32")), "nan_row")
    b.place(over)


def build(arch):
    b = KernelBuilder(ActKernel("group").name, arch, __doc__.splitlines()[0], block=(THREADS, 1, 1))
    ids_p, n_p, e_p = b.param("ids", "u64", "ptr:in"), b.param("npairs", "u32"), b.param("experts", "u32")
    bn_p = b.param("tile", "u32")
    ord_p, off_p = b.param("order", "u64", "ptr:scratch"), b.param("offsets", "u64", "ptr:scratch")
    wrk_p, y_p, m_p = b.param("work", "u64", "ptr:scratch"), b.param("y", "u64", "ptr:out"), b.param("m", "u32")
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
    cb, kb, sb, wb = (b.op("mov.u32", s) for s in (counts, cursor, tstart, wsums))

    at, gat = _at(b), _gat(b)
    b.comment("per-expert counts: zeroed, then one shared atomic per valid pair; a bad id's row of y is NaN")
    _loop(b, tid, E, THREADS, lambda e: b.emit("st.shared.u32", Mem(at(cb, e)), Imm(0, "u32")), "zero")
    b.emit("bar.sync", Imm(0, "u32"))

    def count(p, e, inb):
        ok = b.op("setp.lt.u32", e, E)  # unsigned: -1 is past E too
        b.emit("atom.shared.add.u32", b.reg("u32"), Mem(at(cb, e)), Imm(1, "u32"), pred=ok)
        _nan_row(b, Y, p, M, b.op("or.pred", ok, b.op("not.pred", inb)))
    _pairs_loop(b, IDS, P, tid, count, "count")
    b.emit("bar.sync", Imm(0, "u32"))

    _scan_and_list(b, (cb, kb, sb, wb), tid, E, BN, OFF, WRK)

    b.comment("each valid pair to its expert's next place in order")

    def scatter(p, e, inb):
        ok = b.op("setp.lt.u32", e, E)  # past P: e = 0xFFFFFFFF, not an expert
        slot = b.op("mov.u32", Imm(0, "u32"))  # written for every thread: the store's address reads it
        b.emit("atom.shared.add.u32", slot, Mem(at(kb, e)), Imm(1, "u32"), pred=ok)
        b.emit("st.global.u32", Mem(gat(ORD, slot)), p, pred=ok)
    _pairs_loop(b, IDS, P, tid, scatter, "scatter")
    b.emit("ret")
    return b.finish()



GATHER_ROWS = 2048  # pairs one moe_gather CTA gathers at most (its shared lists: each pair's expert, then its place)


def build_gather(arch, sums: bool = False, x16: bool = False):
    """moe_gather (sm_90's grouped wgmma route; moe_gather_sums for the integer-weight build): moe_group and
    convert_f16_perm_gather as one kernel, without the round trip between them. CTA c gathers the pairs
    [c·rows, (c + 1)·rows): every CTA counts all P ids itself (counts, and per expert the pairs before its own), scans
    them as moe_group does (CTA 0 writes offsets and the work list), places its pairs (expert e's pairs of this CTA at
    offsets[e] + the pairs of e before it + a rank from a shared atomic: every CTA's pairs of e get a slice of their
    own, in any order inside it, as moe_group's), writes their order entries and converts their rows of x into
    their places (fp16 in the register-A K order, convert_f16.rega_words, and with `sums` the sub-block sums). `rows`
    is a multiple of the pairs that share a row of x (slots, or 1 per slot): each row is converted once and stored
    at each of its pairs' places (a token's 8 slots cost one conversion, not 8). Its first group of
    x is loaded before the ids are counted: the x reads do not wait for the grouping. An fp16
    overflow raises `flag` (the workspace's zero-kept word: the gated GEMV behind the GEMM clears it). `x16`
    (moe_gather(_sums)_x16): x is fp16, a group of 8 by one 16-byte load, widened — the same stores, sums and flag
    as for its fp32 widening (an inf or NaN of x raises it)."""
    from .convert_f16 import (conversion_flag, overflowed, rega_halves, rega_store, rega_words, store_sub_block_sum,
                              sub_block_sum)

    name = ActKernel("group", gather=True, sums=sums, x16=x16).name
    doc = "mul_mat_id's expert grouping and x gathered into fp16 in grouped order" + (", with sub-block sums" if sums
                                                                                      else "")
    b = KernelBuilder(name, arch, doc, block=(THREADS, 1, 1))
    ids_p, n_p, e_p = b.param("ids", "u64", "ptr:in"), b.param("npairs", "u32"), b.param("experts", "u32")
    bn_p = b.param("tile", "u32")
    ord_p, off_p = b.param("order", "u64", "ptr:scratch"), b.param("offsets", "u64", "ptr:scratch")
    wrk_p, y_p, m_p = b.param("work", "u64", "ptr:scratch"), b.param("y", "u64", "ptr:out"), b.param("m", "u32")
    x_p, x16_p = b.param("x", "u64", "ptr:in"), b.param("x16", "u64", "ptr:scratch")
    f_p = b.param("flag", "u64", "ptr:scratch")  # the workspace's zero-kept flag: the route's gate
    k8_p, sl_p, ps_p = b.param("k8", "u32"), b.param("slots", "u32"), b.param("per_slot", "u32")
    r_p = b.param("rows", "u32")
    xs_p = b.param("xs", "u64", "ptr:scratch") if sums else None
    b.directives += [f".maxntid {THREADS}, 1, 1"]
    b.meta.update(grid="ceil(npairs / rows)", max_experts=MAX_EXPERTS, max_rows=GATHER_ROWS,
                  rows_unit="rows is a multiple of slots where x is shared by the slots (whole rows of x a CTA)",
                  work="work[0] = L; work[1 + i] = expert | token tile << 16",
                  order="u32 per valid pair, grouped by expert", offsets="u32 × (experts + 1)",
                  rows="x16 row n < offsets[experts] = x row order[n] / slots (x shared by the slots) or order[n] (per "
                       "slot), in layouts.q4k_rega_k_order within each 64-column chunk; rows past it untouched")
    bufs = [b.shared_buffer(n, 4 * MAX_EXPERTS) for n in ("counts", "cursor", "tile_start", "before", "mine")]
    wsums = b.shared_buffer("warp_sums", 4 * 64)
    lexp, lpos = b.shared_buffer("pair_expert", 4 * GATHER_ROWS), b.shared_buffer("pair_place", 4 * GATHER_ROWS)
    b.pdl_head()  # it reads ids and x, which the op before may have written; the GEMM behind it may launch now
    IDS, ORD, OFF, WRK, Y, X, X16 = (b.ptr(p) for p in (ids_p, ord_p, off_p, wrk_p, y_p, x_p, x16_p))
    P, E, BN, M, K8, SL, R = (b.ld_param(p, "u32") for p in (n_p, e_p, bn_p, m_p, k8_p, sl_p, r_p))
    per_slot = b.op("setp.ne.u32", b.ld_param(ps_p, "u32"), Imm(0, "u32"))
    tid = b.special("tid.x")
    cb, kb, sb, bb, mb, wb, eb, pb = (b.op("mov.u32", s) for s in (*bufs, wsums, lexp, lpos))
    at, gat = _at(b), _gat(b)
    p0 = b.op("mul.lo.u32", b.special("ctaid.x"), R)
    p1 = b.op("max.u32", p0, b.op("min.u32", b.op("add.u32", p0, R), P))
    gend = b.op("mul.lo.u32", p1, K8)

    b.comment("this thread's first group of x in flight while the pairs are grouped; its group g = n·K8 + r (of x's "
              "row n: this CTA's pairs are whole rows' slots, rows a multiple of SLe) kept as quotient and remainder, "
              "stepped by THREADS groups without a division in the loop (dq, dr = THREADS / K8, % K8)")
    SLe = b.op("selp.b32", Imm(1, "u32"), SL, per_slot, type="b32")  # one x row a pair, or one per `slots` pairs
    g = b.op("mad.lo.u32", b.op("div.u32", p0, SLe), K8, tid)
    gend = b.op("mul.lo.u32", b.op("div.u32", p1, SLe), K8)
    n, r = b.reg("u32"), b.reg("u32")
    b.emit("div.u32", n, g, K8)  # (n is x's row, the unit of SLe pairs n·SLe ..)
    b.emit("sub.u32", r, g, b.op("mul.lo.u32", n, K8))
    dq = b.op("div.u32", Imm(THREADS, "u32"), K8)
    dr = b.op("sub.u32", Imm(THREADS, "u32"), b.op("mul.lo.u32", dq, K8))
    v = b.regs("f32", 8)
    hw = b.regs("b32", 4) if x16 else None

    def step():  # g += THREADS: n += dq (+ 1 where r passes K8)
        b.emit("add.u32", r, r, dr)
        c = b.op("setp.ge.u32", r, K8)
        b.emit("sub.u32", r, r, K8, pred=c)
        b.emit("add.u32", n, n, dq)
        b.emit("add.u32", n, n, Imm(1, "u32"), pred=c)

    def load():  # group g of the CTA's rows: x's row n, its input group r, as two 16-byte loads (x16: one, its 8
        # halves widened)
        src = b.op("mad.wide.u32", b.op("mad.lo.u32", n, K8, r), Imm(16 if x16 else 32, "u32"), X)
        live = b.op("setp.lt.u32", g, gend)
        if x16:
            for i in range(4):
                b.emit("mov.b32", hw[i], Imm(0, "b32"))
            b.emit("ld.global.nc.v4.b32", b.vec(hw), Mem(src), pred=live)
            for i in range(4):
                lo, hi = b.reg("b16"), b.reg("b16")
                b.emit("mov.b32", b.vec([lo, hi]), hw[i])
                b.emit("cvt.f32.f16", v[2 * i], lo)
                b.emit("cvt.f32.f16", v[2 * i + 1], hi)
            return
        b.emit("ld.global.nc.v4.f32", b.vec(v[0:4]), Mem(src), pred=live)
        b.emit("ld.global.nc.v4.f32", b.vec(v[4:8]), Mem(src, 16), pred=live)
    load()

    b.comment("per expert: all pairs, the pairs before this CTA's, and a rank for each of this CTA's own pairs")
    _loop(b, tid, E, THREADS, lambda e: [b.emit("st.shared.u32", Mem(at(x, e)), Imm(0, "u32")) for x in (cb, bb, mb)],
          "zero")
    b.emit("bar.sync", Imm(0, "u32"))

    def count(p, e, inb):
        ok = b.op("setp.lt.u32", e, E)  # unsigned: -1 is past E too
        b.emit("atom.shared.add.u32", b.reg("u32"), Mem(at(cb, e)), Imm(1, "u32"), pred=ok)
        b.emit("atom.shared.add.u32", b.reg("u32"), Mem(at(bb, e)), Imm(1, "u32"),
               pred=b.op("and.pred", ok, b.op("setp.lt.u32", p, p0)))
        own = b.op("and.pred", b.op("setp.ge.u32", p, p0), b.op("setp.lt.u32", p, p1))
        rank = b.op("mov.u32", Imm(0, "u32"))
        b.emit("atom.shared.add.u32", rank, Mem(at(mb, e)), Imm(1, "u32"), pred=b.op("and.pred", ok, own))
        j = b.op("sub.u32", p, p0)
        b.emit("st.shared.u32", Mem(at(eb, j)), e, pred=own)
        b.emit("st.shared.u32", Mem(at(pb, j)), rank, pred=own)
        _nan_row(b, Y, p, M, b.op("or.pred", ok, b.op("not.pred", own)))
    _pairs_loop(b, IDS, P, tid, count, "count")
    b.emit("bar.sync", Imm(0, "u32"))

    _scan_and_list(b, (cb, kb, sb, wb), tid, E, BN, OFF, WRK, writer=b.op("setp.eq.u32", b.special("ctaid.x"),
                                                                         Imm(0, "u32")))

    b.comment("this CTA's pairs to their places: offsets[e] + e's pairs before this CTA + the rank; order[place] = p")

    def place(j):
        e = b.op("ld.shared.u32", Mem(at(eb, j)))
        ok = b.op("setp.lt.u32", e, E)
        ee = b.op("min.u32", e, b.op("sub.u32", E, Imm(1, "u32")))  # (a bad id reads expert E - 1, then drops it)
        pos = b.op("add.u32", b.op("add.u32", b.op("ld.shared.u32", Mem(at(kb, ee))),
                                   b.op("ld.shared.u32", Mem(at(bb, ee)))), b.op("ld.shared.u32", Mem(at(pb, j))))
        b.emit("st.global.u32", Mem(gat(ORD, pos)), b.op("add.u32", p0, j), pred=ok)
        b.emit("st.shared.u32", Mem(at(pb, j)), b.op("selp.b32", pos, Imm(0xFFFFFFFF, "b32"), ok, type="b32"))
    _loop(b, tid, b.op("sub.u32", p1, p0), THREADS, place, "place")
    b.emit("bar.sync", Imm(0, "u32"))

    over = b.op("setp.ne.u32", tid, tid)  # false
    top, out = b.label("group"), b.label("groups_done")
    b.place(top)
    b.bra(out, pred=b.op("setp.ge.u32", g, gend), uniform=False)
    b.comment("the CTA's groups of x's rows, THREADS at a time, each converted once, then stored at the places of "
              "the row's SLe pairs n·SLe + j (a bad id's pair: none; a quad is one row's: its lanes take the same "
              "branches)")
    XS = b.ptr(xs_p) if sums else None
    h = rega_halves(b, v)
    words = rega_words(b, h)
    ovf = conversion_flag(b, v)  # (raises the flag only where a pair gathers the row; a row too small for fp16 too:
    # convert_f16.TINY_ROW)
    if sums:
        hi, lo = sub_block_sum(b, h)
        ovf = b.op("or.pred", ovf, overflowed(b, [b.op("mov.b32", b.vec([hi, hi]), type="b32")]))
    pair = b.op("sub.u32", b.op("mul.lo.u32", n, SLe), p0)  # the row's first pair, in this CTA's lists
    pend = b.op("add.u32", pair, SLe)
    slot_top, slot_next = b.label("slot"), b.label("slot_next")
    b.place(slot_top)
    pos = b.op("ld.shared.u32", Mem(at(pb, pair)))
    b.bra(slot_next, pred=b.op("setp.eq.u32", pos, Imm(0xFFFFFFFF, "u32")), uniform=False)
    rega_store(b, words, b.op("mad.lo.u32", pos, K8, r), X16)
    if sums:
        store_sub_block_sum(b, hi, lo, r, K8, pos, XS)
    b.emit("or.pred", over, over, ovf)
    b.place(slot_next)
    b.emit("add.u32", pair, pair, Imm(1, "u32"))
    b.bra(slot_top, pred=b.op("setp.lt.u32", pair, pend), uniform=False)
    b.emit("add.u32", g, g, Imm(THREADS, "u32"))
    step()
    load()
    b.bra(top, uniform=False)
    b.place(out)
    b.emit("st.global.u32", Mem(b.ptr(f_p)), Imm(1, "u32"), pred=over)
    b.emit("ret")
    return b.finish()


CHECK_THREADS = 256


def build_check(arch):
    """moe_check_ids: errors[0] += the number of ids outside [0, experts) (as u32, so negative ids count), one id a
    thread, one red.global.add per bad id — mul_mat_id(errors=) launches it behind the op, on the op's stream: a
    count the caller reads when it synchronizes anyway."""
    b = KernelBuilder("moe_check_ids", arch, build_check.__doc__.splitlines()[0], block=(CHECK_THREADS, 1, 1))
    ids_p, n_p = b.param("ids", "u64", "ptr:in"), b.param("n", "u32")
    e_p, err_p = b.param("experts", "u32"), b.param("errors", "u64", "ptr:out")
    b.meta.update(grid=f"ceil(n / {CHECK_THREADS})")
    n = b.ld_param(n_p, "u32")
    i = b.op("mad.lo.u32", b.special("ctaid.x"), Imm(CHECK_THREADS, "u32"), b.special("tid.x"))
    done = b.label("done")
    b.bra(done, pred=b.op("setp.ge.u32", i, n), uniform=False)
    eid = b.reg("u32")
    b.emit("ld.global.nc.u32", eid, Mem(b.op("mad.wide.u32", i, Imm(4, "u32"), b.ptr(ids_p))))
    bad = b.op("setp.ge.u32", eid, b.ld_param(e_p, "u32"))
    b.emit("red.global.add.u32", Mem(b.ptr(err_p)), Imm(1, "u32"), pred=bad)
    b.place(done)
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


KERNEL = KernelDef(ActKernel("group").name, "mul_mat_id's expert grouping: per-expert offsets, pairs by expert, "
                   "the grouped GEMM's work list", build)
KERNEL_GATHER = KernelDef(ActKernel("group", gather=True).name, "mul_mat_id's expert grouping and x gathered into "
                          "fp16 in grouped order (sm_90's grouped wgmma GEMM)", build_gather, archs=("sm_90a",))
KERNEL_CHECK = KernelDef("moe_check_ids", "mul_mat_id(errors=): counts the ids outside [0, E) into errors[0]",
                         build_check)
KERNEL_GATHER_SUMS = KernelDef(ActKernel("group", gather=True, sums=True).name, "moe_gather and each row's sub-block "
                               "sums of x (fp16 hi / lo) for a grouped GEMM with integer weights",
                               lambda arch: build_gather(arch, sums=True), archs=("sm_90a",))
KERNELS_GATHER_X16 = [KernelDef(ActKernel("group", gather=True, sums=sm, x16=True).name,
                                f"{ActKernel('group', gather=True, sums=sm).name} on fp16 x (a group of 8 by one 16-byte "
                                "load, widened: no convert_f32 launch)",
                                lambda arch, sm=sm: build_gather(arch, sums=sm, x16=True), archs=("sm_90a",))
                      for sm in (False, True)]
