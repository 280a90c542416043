"""TQ4_1S's one-token exact GEMV on tables of x's products (gemv_tq4_1s_xt_t1, sm_90a; not shipped: measured slower).

Why: the lane GEMVs look each weight's codebook value up (8 bytes a qs byte: (C[lo], C[hi]) as fp32, one LDS.64),
so a warp-step of 4096 weights spends ~128 shared-memory wavefronts on lookups and ~200 in all — 12.7 µs of the
H200's L1 on 18944x3584 with the pipe never idle, where #36 asks 14.2 µs of the op (bench/NOTES.md, 2026-12-06).
Here a table holds the *products*: for a chunk of 8 blocks (256 columns, 128 qs bytes), T[v][p] = C[v & 15]·x[2p] +
C[v >> 4]·x[2p + 1] for every byte value v and byte position p (x rotated: the RHT of each block by shfl
butterflies, bit-identical to rht_forward), built once by the CTA and read by all its rows: one 4-byte lookup per
qs byte, its two weights' products already summed — half the lookup bytes, no FFMA per weight.

- A CTA of 16 warps owns 48·16 = 768 consecutive rows and a contiguous run of K's blocks (gridDim.y splits K into
  runs of whole quads of blocks that differ by at most one quad; the last warp of a row group to arrive sums the splits in z order, as the
  other split-K GEMVs). Per chunk: warps 0-7 rotate its blocks into shared memory, then every thread builds 64
  entries of the 128 KB table (position p = 4·lane + warp % 4, values v in the warp's quarter warp / 4), then each
  warp walks its 48 rows: lane l loads qs word l % 4 of block l / 4 (byte positions 4l .. 4l + 3) and that
  half-block's scale d, looks the four bytes up and adds d·(T0 + T1 + T2 + T3) into the row's accumulator.
- The table is two halves of 64 KB (bytes 0-1, 2-3 of a lane's word), entry v·256 + 4·l + 128·(i % 2) for byte i of
  lane l: one prmt makes the offset (the byte beside the lane's), the 32 lanes of a lookup hit 32 banks whatever
  their bytes; the builders' stores likewise.
- The weights come by TMA into a ring a warp (4 stages of 8 rows x the chunk's 160 bytes, one box each, zero-filled
  past M; 32 rows in flight a warp, 80 KB an SM beside the table), across chunk boundaries: the next chunk's rows
  land while the CTA rotates and builds. K % 128 == 0 (the tensor map's row stride). The op's only kernel:
  launched behind the op before (PDL), it waits for it before touching memory (pdl_head).
- At the end a lane holds 48 partial sums; a halving butterfly (padded to 64; five shfl rounds, 32 + 16 + 8 + 4 + 2
  exchanges) leaves rows 2l and 2l + 1 of the warp's 48 on lane l < 24.
Measured (H200, graph µs over 24 weights; bench/NOTES.md 2026-12-06): 19.9 / 20.9 on 18944x3584 / 3584x18944 against
the shipped prep + TMA lane GEMV's 19.6 / 19.5. ncu: the lookups run the shared-memory pipe ~85% busy (7 wavefronts a
row-chunk: 4 lookups, 2 for the qs words — the raw 20-byte blocks put the 32 lanes' words on 2-way conflicting banks —
and 1 for the scales), and the rotation, the build and the prologue / epilogue (~47% of the samples) do not overlap
them; by that count the design tops out near 15 µs, above #36's 14.2. XT_PREFETCH (x a chunk ahead) won ~0.9 µs.
Numerics: fp32 throughout (the entry's two products and their sum, the four entries' sum, d times it), x rotated
as rotate_tq4_1s does: relative error ~1e-7 of float64, like the lane GEMVs (a different order, not their bits).
"""
from __future__ import annotations

from ..builder import KernelBuilder
from ..codecs.tq4_1s import _codebook
from ..formats import tq4_1s as T4
from ..ir import Imm, Mem, TensorRef
from ..specs import GemvKernel
from . import KernelDef
from .gemv import TMA_STEP, _rotate_lane, _store_or_split, _wait_step, _warp_rings, _warp_rows

XT_WARPS = 16
XT_ROWS = 48  # rows a warp (accumulators a lane): 768-row CTAs fill the H200 in fewer chunk rounds than 1024-row ones on
# 18944x3584 / 3584x18944 (25 x 5 / 5 x 26 CTAs of 3 chunks against 19 x 6 / 4 x 33 of 3: ~22% less a CTA)
XT_GROUP = 8  # rows a TMA box brings (one ring stage; a step's lookups)
XT_CHUNK = 8  # blocks a chunk: 128 qs byte positions, the table's
XT_PREFETCH = True  # x's loads a chunk ahead of its rotation (False: at the rotation, as first timed)
XT_STAGES = 4  # the warp's TMA ring: stages of G rows x a chunk's 160 bytes (4 x 8 rows in flight a warp)
# (module attributes a probe may vary: probe_build_ab.py --variant 'g16: gemv_xt.XT_GROUP=16; gemv_xt.XT_STAGES=2')
TABLE_BYTES = 256 * 4 * XT_CHUNK * 16  # 256 byte values x 128 positions x fp32
ARCHS = ("sm_90a",)  # 129 KB of shared memory a CTA: not on sm_89 / sm_120a (~100 KB)


def _load_x(b, warp, lane, A, cb, b1, xv):
    """Warps 0-7: element `lane` of block cb + warp of x into xv (zero past the run's end), issued a chunk ahead so
    that its latency hides behind the chunk before's lookups."""
    blk = b.op("add.u32", cb, warp)
    ok = b.op("and.pred", b.op("setp.lt.u32", warp, Imm(XT_CHUNK, "u32")), b.op("setp.lt.u32", blk, b1))
    addr = b.op("mad.wide.u32", b.op("mad.lo.u32", blk, Imm(32, "u32"), lane), Imm(4, "u32"), A)
    b.emit("mov.f32", xv, Imm(0.0, "f32"))
    b.emit("ld.global.nc.f32", xv, Mem(addr), pred=ok)


def _rotate_chunk(b, warp, lane, xv, xr):
    """Warps 0-7: their block of x (xv, loaded by _load_x), rotated, into xr (zero past the run's end, so that the
    table reads nothing unwritten)."""
    skip = b.label("no_rotate")
    b.bra(skip, pred=b.op("setp.ge.u32", warp, Imm(XT_CHUNK, "u32")))
    dst = b.op("mad.lo.u32", b.op("mad.lo.u32", warp, Imm(32, "u32"), lane), Imm(4, "u32"), xr)
    b.emit("st.shared.f32", Mem(dst), _rotate_lane(b, xv, lane))
    b.place(skip)


def _build_table(b, xrb, bst, chi):
    """This thread's 64 entries: position p (x[2p], x[2p + 1] at xrb), values v = 64·(warp / 4) + 16·h + lo."""
    x01 = b.regs("f32", 2)
    b.emit("ld.shared.v2.f32", b.vec(x01), Mem(xrb))
    for lo, c in enumerate(T4.CODEBOOK):
        p0 = b.op("mul.rn.f32", x01[0], Imm(float(c), "f32"))
        for h in range(4):
            e = b.op("fma.rn.f32", chi[h], x01[1], p0)
            b.emit("st.shared.f32", Mem(bst, (16 * h + lo) * 256), e)


def _lookup_group(b, words, acc, tabs, lbs, ok_lane):
    """acc[j] += d·(T[byte 0] + .. + T[byte 3]) for each row's (qs word, scale half) in `words`, where the lane's block
    is in the run (`ok_lane`). Byte i's entry: half table tabs[i / 2], offset v·256 + lbs[i % 2] — one prmt puts the
    byte v beside the lane's byte lbs."""
    for (q, dh), a in zip(words, acc):
        ent = []
        for i in range(4):
            off = b.op("prmt.b32", q, lbs[i % 2], Imm(0x5504 | (i << 4), "b32"))  # (v << 8) | lane's byte
            ent.append(b.op("ld.shared.f32", Mem(b.op("add.u32", off, tabs[i // 2]))))
        s = b.op("add.rn.f32", b.op("add.rn.f32", ent[0], ent[1]), b.op("add.rn.f32", ent[2], ent[3]))
        b.emit("fma.rn.f32", a, b.op("cvt.f32.f16", dh), s, a, pred=ok_lane)


def _reduce_scatter(b, lane, vals):
    """The warp's sums of each of len(vals) rows (a power of two, 2·32 here), lane l left with rows
    (len / 32)·l ... : per round h = 16 .. 1 a lane keeps the half its bit h picks and adds its partner's."""
    for h in (16, 8, 4, 2, 1):
        n = len(vals) // 2
        upper = b.op("setp.ne.u32", b.op("and.b32", lane, Imm(h, "b32")), Imm(0, "u32"))
        new = []
        for j in range(n):
            send = b.op("selp.f32", vals[j], vals[j + n], upper)
            keep = b.op("selp.f32", vals[j + n], vals[j], upper)
            o = b.op("shfl.sync.bfly.b32", send, Imm(h, "u32"), Imm(31, "u32"), Imm(0xFFFFFFFF, "b32"), type="f32")
            new.append(b.op("add.rn.f32", keep, o))
        vals = new
    return vals


def build_xtab(arch):
    """gemv_tq4_1s_xt_t1: the module docstring's kernel (ABI of the TMA lane GEMVs: tmap_w, a = x unrotated fp32, y,
    m, k, ntok = 1, part, counters)."""
    NW, RW, G, S = XT_WARPS, XT_ROWS, XT_GROUP, XT_STAGES
    STAGE_BYTES = 20 * XT_CHUNK * G
    NG = RW // G
    name = GemvKernel("gemv", "tq4_1s", 1, xtab=True).name
    b = KernelBuilder(name, arch, "TQ4_1S GEMV (exact), one token, codebook products of x by qs byte from a "
                      "table the CTA builds per 256 columns, weights by TMA", block=(32 * NW, 1, 1))
    tw_p = b.param("tmap_w", "b8", "tensormap", array=128, align=64)  # u32 [M][K·20/128], box 40 x G, no swizzle
    a_p, y_p = b.param("a", "u64", "ptr:in"), b.param("y", "u64", "ptr:out")
    m_p, k_p, n_p = b.param("m", "u32"), b.param("k", "u32"), b.param("ntok", "u32")
    part_p, cnt_p = b.param("part", "u64", "ptr:scratch"), b.param("counters", "u64", "ptr:scratch")
    b.directives += [f".maxntid {32 * NW}, 1, 1", ".minnctapersm 1"]
    b.pdl_head()  # an op's only kernel: it may start behind the op before, touching nothing until that has completed
    xr_sym = b.shared_buffer("xr", 4 * 32 * XT_CHUNK, align=16)
    dyn = b.dynamic_shared(TABLE_BYTES + NW * S * STAGE_BYTES + 128)  # (+ 128: aligned up at run time for TMA)
    b.meta.update(split_k="gridDim.y splits K's blocks into contiguous runs of whole quads (within a quad of each "
                          "other); part: "
                          "splits x ntok x m fp32, counters: one u32 per warp (zero, left zero)",
                  ctas_per_sm=1, tokens=1, rows_per_cta=RW * NW, rows_per_warp=RW, warps=NW,
                  grid="ceil(m / rows_per_cta)", pdl=arch.has("griddepcontrol"), fmt="tq4_1s", mode="exact",
                  # gemv_splits: a "step" of 32 lanes x lane_cols columns is a block here, 4 at least a split (half a
                  # chunk: the table's build is a chunk's whatever its blocks)
                  lane_cols=1, min_split_steps=XT_CHUNK // 2, max_splits=64, fused_rotation=True,
                  activation="x (fp32)", copy="tma", tma_box=(5 * XT_CHUNK, G), stages=S,
                  tensormaps=f"tmap_w: u32, dims (k*20/128, m), box ({5 * XT_CHUNK}, {G}), no swizzle; needs "
                             "k % 128 == 0",
                  dynamic_smem=b.dynamic_smem,
                  lookup=f"one ld.shared.f32 per qs byte: C[lo]·x[2p] + C[hi]·x[2p + 1] from a {TABLE_BYTES // 1024} KB "
                         "table of the chunk's products (256 values x 128 positions)")
    A, Y = b.ptr(a_p), b.ptr(y_p)
    M, K, ntok = b.ld_param(m_p, "u32"), b.ld_param(k_p, "u32"), b.ld_param(n_p, "u32")
    tid, lane, warp, gwarp, row0 = _warp_rows(b, NW, RW)
    leader = b.op("setp.eq.u32", lane, Imm(0, "u32"))
    kz, nz = b.special("ctaid.y"), b.special("nctaid.y")
    nblk = b.op("shr.u32", K, Imm(5, "u32"))
    # runs of whole quads of blocks (80 bytes: a TMA box starts 16-byte aligned; K % 128 == 0 makes nblk one's multiple)
    nq = b.op("shr.u32", nblk, Imm(2, "u32"))
    b0 = b.op("shl.b32", b.op("div.u32", b.op("mul.lo.u32", kz, nq), nz), Imm(2, "u32"))
    b1 = b.op("shl.b32", b.op("div.u32", b.op("mul.lo.u32", b.op("add.u32", kz, Imm(1, "u32")), nq), nz), Imm(2, "u32"))
    nsteps = b.op("mul.lo.u32", b.op("div.u32", b.op("add.u32", b.op("sub.u32", b1, b0), Imm(XT_CHUNK - 1, "u32")),
                                     Imm(XT_CHUNK, "u32")), Imm(NG, "u32"))  # (chunk, row group) steps of the run
    lblk = b.op("shr.u32", lane, Imm(2, "u32"))
    lw = b.op("and.b32", lane, Imm(3, "b32"))
    # the lane's qs word and scale half in a row of a stage (160 bytes: the chunk's 8 blocks)
    qoff = b.op("mad.lo.u32", lblk, Imm(20, "u32"), b.op("mad.lo.u32", lw, Imm(4, "u32"), Imm(4, "u32")))
    doff = b.op("mad.lo.u32", lblk, Imm(20, "u32"), b.op("shl.b32", b.op("shr.u32", lw, Imm(1, "u32")), Imm(1, "u32")))
    ring, bars, tab = _warp_rings(b, dyn, warp, leader, NW, S, STAGE_BYTES, skip=TABLE_BYTES)  # the table at tab
    xr = b.op("mov.u32", xr_sym)
    # byte i of lane l's word, value v: half table i / 2 (64 KB each), entry v·256 + 4·l + 128·(i % 2)
    tabs = [tab, b.op("add.u32", tab, Imm(1 << 16, "u32"))]
    lbs = [b.op("shl.b32", lane, Imm(2, "u32")), b.op("mad.lo.u32", lane, Imm(4, "u32"), Imm(128, "u32"))]
    quarter = b.op("and.b32", warp, Imm(3, "b32"))
    vq = b.op("shr.u32", warp, Imm(2, "u32"))
    # the builder's position p = 4·lane + quarter: x[2p], x[2p + 1]; its entries from v = 64·vq
    xrb = b.op("mad.lo.u32", b.op("mad.lo.u32", lane, Imm(8, "u32"), b.op("shl.b32", quarter, Imm(1, "u32"))),
               Imm(4, "u32"), xr)
    bst = b.op("add.u32", b.op("mad.lo.u32", vq, Imm(64 * 256, "u32"), b.op("mad.lo.u32", lane, Imm(4, "u32"), tab)),
               b.op("add.u32", b.op("shl.b32", b.op("shr.u32", quarter, Imm(1, "u32")), Imm(16, "u32")),
                    b.op("shl.b32", b.op("and.b32", quarter, Imm(1, "b32")), Imm(7, "u32"))))
    cbp = _codebook(b)
    chi = [b.op("ld.global.nc.f32", Mem(b.op("mad.wide.u32", b.op("mad.lo.u32", vq, Imm(4, "u32"), Imm(h, "u32")),
                                             Imm(4, "u32"), cbp))) for h in range(4)]
    b.emit("fence.proxy.async.shared::cta")
    b.emit("bar.sync", Imm(0, "u32"))  # the stage barriers initialised (lane 0 of each warp) before TMA uses them
    tw = b.op("cvta.param.u64", b.op("mov.b64", tw_p))

    def issue(step, stage):
        """Lane 0: step `step` of the run (chunk step / NG, row group step % NG) — 40 words x G rows — into `stage`."""
        go = b.op("and.pred", leader, b.op("setp.lt.u32", step, nsteps))
        cbs = b.op("mad.lo.u32", b.op("div.u32", step, Imm(NG, "u32")), Imm(XT_CHUNK, "u32"), b0)
        rowg = b.op("mad.lo.u32", b.op("rem.u32", step, Imm(NG, "u32")), Imm(G, "u32"), row0)
        bar = b.op("mad.lo.u32", stage, Imm(8, "u32"), bars) if not isinstance(stage, int) else \
            b.op("add.u32", bars, Imm(8 * stage, "u32"))
        dst = b.op("mad.lo.u32", stage, Imm(STAGE_BYTES, "u32"), ring) if not isinstance(stage, int) else \
            b.op("add.u32", ring, Imm(stage * STAGE_BYTES, "u32"))
        b.emit("mbarrier.arrive.expect_tx.shared::cta.b64", b.reg("b64"), Mem(bar), Imm(STAGE_BYTES, "u32"), pred=go)
        b.emit(TMA_STEP, Mem(dst), TensorRef(tw, (b.op("mul.lo.u32", cbs, Imm(5, "u32")), rowg)), Mem(bar), pred=go)

    assert RW % G == 0 and RW <= 64
    for s_ in range(S):
        issue(b.op("mov.u32", Imm(s_, "u32")), s_)
    count = b.op("mov.u32", Imm(0, "u32"))  # steps consumed (ring position and phase)
    acc = [b.op("mov.f32", Imm(0.0, "f32")) for _ in range(RW)]
    cb = b.op("mov.u32", b0)
    loop, done = b.label("chunk"), b.label("chunks_done")
    xv = b.reg("f32")
    if XT_PREFETCH:
        _load_x(b, warp, lane, A, cb, b1, xv)
    b.bra(done, pred=b.op("setp.ge.u32", cb, b1))
    b.place(loop)
    # two CTA barriers a chunk: after the rotation (every warp's lookups of the chunk before are done, so the table may
    # be rebuilt; xr is written), after the build (the table is whole; xr was read, so the next rotation may write it)
    if not XT_PREFETCH:
        _load_x(b, warp, lane, A, cb, b1, xv)
    _rotate_chunk(b, warp, lane, xv, xr)
    if XT_PREFETCH:
        _load_x(b, warp, lane, A, b.op("add.u32", cb, Imm(XT_CHUNK, "u32")), b1, xv)  # the next chunk's, in flight meanwhile
    b.emit("bar.sync", Imm(0, "u32"))
    _build_table(b, xrb, bst, chi)
    b.emit("bar.sync", Imm(0, "u32"))
    ok_lane = b.op("setp.lt.u32", b.op("add.u32", cb, lblk), b1)  # the lane's block in the run
    for g in range(NG):
        stage = _wait_step(b, bars, count, S)
        src = b.op("mad.lo.u32", stage, Imm(STAGE_BYTES, "u32"), ring)
        sq, sd = b.op("add.u32", src, qoff), b.op("add.u32", src, doff)
        words = [(b.op("ld.shared.b32", Mem(sq, 160 * j)), b.op("ld.shared.b16", Mem(sd, 160 * j))) for j in range(G)]
        b.emit("bar.warp.sync", Imm(0xFFFFFFFF, "b32"))  # every lane has read the stage before TMA refills it
        issue(b.op("add.u32", count, Imm(S, "u32")), stage)
        b.emit("add.u32", count, count, Imm(1, "u32"))
        _lookup_group(b, words, acc[g * G:(g + 1) * G], tabs, lbs, ok_lane)
    b.emit("add.u32", cb, cb, Imm(XT_CHUNK, "u32"))
    b.bra(loop, pred=b.op("setp.lt.u32", cb, b1))
    b.place(done)
    b.comment(f"rows 2·lane, 2·lane + 1 of the warp's {RW} (lanes below {RW // 2}): a halving butterfly over the "
              "lanes' partial sums, padded to 64 with zeros")
    zero = b.op("mov.f32", Imm(0.0, "f32"))
    tot = _reduce_scatter(b, lane, acc + [zero] * (64 - RW))
    items = []
    for e in range(2):
        r = b.op("mad.lo.u32", lane, Imm(2, "u32"), Imm(e, "u32"))
        row = b.op("add.u32", row0, r)
        items.append((b.op("and.pred", b.op("setp.lt.u32", r, Imm(RW, "u32")), b.op("setp.lt.u32", row, M)), row,
                      tot[e]))
    _store_or_split(b, items, lane, gwarp, kz, nz, M, ntok, Y, part_p, cnt_p)
    return b.finish()


KERNELS = [KernelDef(GemvKernel("gemv", "tq4_1s", 1, xtab=True).name,
                     "TQ4_1S exact GEMV, one token: the products of x's rotated values by qs byte from a table the CTA "
                     "builds per 256 columns (one 4-byte lookup per two weights)", build_xtab, archs=ARCHS)]
