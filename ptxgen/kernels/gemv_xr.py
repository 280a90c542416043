"""gemv_q4_k_xr: the exact Q4_K decode GEMV for one token, with the activation held in registers.

The other decode GEMVs reload the activation for every row they compute (from L1, or as tensor-core B tiles), so
for one token the activation traffic inside the SM is several times the weight traffic. Here a CTA covers all
of K once: thread u owns unit u — super-block u / 4, qs group u % 4, i.e. sub-blocks 2·(u % 4) and + 1, 64
weights — and keeps those 64 activation values (and their two sums) in registers for every row the CTA walks.
Per row a thread loads 48 bytes (the 16-byte header and its 32 qs bytes) and spends about three instructions
per weight; there is no prep kernel.

Exact fp32 arithmetic without an int → float conversion: a nibble q goes to bits 19-22 of 0x40000000 (one
shift + mask per 4 nibbles of a word, then one `prmt` per weight), which is the float 2 + q/8 exactly. With A =
Σ (2 + q/8)·x and X = Σ x over a 32-weight sub-block, Σ q·x = 8·(A − 2X) — no catastrophic cancellation (the
factor 2 + q/8 lies in [2, 3.875]) — and the sub-block adds d·sc·8·(A − 2X) − dmin·m·X. Relative error ~1e-6.

Rows: the CTA walks rows [r0, r0 + rows_per_cta); each thread copies its 48 bytes per row with cp.async into its
own slots of a 4-row ring in shared memory (rows in flight without holding registers) and reads them back after
wait_group — no barrier, no other thread reads them; each row's 64-weight partials meet by shfl within a warp, then in shared
memory across warps, summed in warp order (deterministic). Idle lanes (K / 64 not a multiple of 32) load unit
0's bytes and contribute zero.
"""
from __future__ import annotations

from .. import codecs
from ..builder import KernelBuilder
from ..dsl import warp_sum
from ..ir import Imm, Mem
from . import KernelDef

XR_THREADS = 384  # at most 384 units of 64 weights: K ≤ 24576 (448 caps registers at 128: sm_89 spilled)
XR_MAX_K = 64 * XR_THREADS
XR_MAX_ROWS = 64  # rows per CTA (the cross-warp sums in shared memory)
XR_WARP_STRIDE = 16  # shared-memory slots per row (≥ XR_THREADS / 32)
XR_CHAINS = 2  # FMA chains per sub-block (4 spilled on sm_89 at the 128-register cap)
XR_STAGES = 4  # rows in flight per thread (cp.async ring in shared memory: no registers held)
FLOAT_2 = 0x40000000  # 2.0f: byte 3 0x40, the nibble·8 goes to byte 2 → 2 + q/8


def build(arch):
    b = KernelBuilder("gemv_q4_k_xr", arch, "Q4_K decode GEMV, T = 1, exact, the activation in registers",
                      block=(XR_THREADS, 1, 1))
    w_p, x_p, y_p = b.param("w", "u64", "ptr:in"), b.param("x", "u64", "ptr:in"), b.param("y", "u64", "ptr:out")
    m_p, k_p, r_p = b.param("m", "u32"), b.param("k", "u32"), b.param("rows_per_cta", "u32")
    b.directives += [f".maxntid {XR_THREADS}, 1, 1"]
    b.pdl_trigger()  # the op's last kernel: the next op's first may start (it waits for this one)
    b.meta.update(fmt="q4_K", tokens=1, mode="exact", max_k=XR_MAX_K, max_rows_per_cta=XR_MAX_ROWS,
                  block="32·ceil(K / 2048) threads: thread u owns 64 weights (super-block u / 4, qs group u % 4)",
                  grid="ceil(M / rows_per_cta)", layout="gguf rows (16-byte aligned), fp32 activation (T = 1)",
                  dequant="nibble → 2 + q/8 by prmt into 0x40000000; Σq·x = 8·(Σ(2 + q/8)·x − 2Σx)")
    red = b.shared_buffer("red", XR_MAX_ROWS * XR_WARP_STRIDE * 4)
    W, X, Y = b.ptr(w_p), b.ptr(x_p), b.ptr(y_p)
    M, K, RPC = b.ld_param(m_p, "u32"), b.ld_param(k_p, "u32"), b.ld_param(r_p, "u32")
    block = Imm(codecs.get("q4_K").BLOCK_BYTES, "u32")
    tid = b.special("tid.x")
    lane = b.op("and.b32", tid, Imm(31, "b32"))
    warp = b.op("shr.u32", tid, Imm(5, "u32"))
    units = b.op("shr.u32", K, Imm(6, "u32"))
    live = b.op("setp.lt.u32", tid, units)
    unit = b.op("selp.b32", tid, Imm(0, "b32"), live)  # idle lanes read unit 0 (valid bytes) and add zero
    grp = b.op("and.b32", unit, Imm(3, "b32"))
    hdr_off = b.op("mul.lo.u32", b.op("shr.u32", unit, Imm(2, "u32")), block)
    qs_off = b.op("add.u32", hdr_off, b.op("mad.lo.u32", grp, Imm(32, "u32"), Imm(16, "u32")))
    sub_lo = b.op("shl.b32", grp, Imm(1, "u32"))
    sub_hi = b.op("add.u32", sub_lo, Imm(1, "u32"))

    row_bytes = b.op("mul.lo.u32", b.op("shr.u32", K, Imm(8, "u32")), block)
    r0 = b.op("mul.lo.u32", b.special("ctaid.x"), RPC)
    rend = b.op("min.u32", b.op("add.u32", r0, RPC), M)
    nw = b.op("shr.u32", b.op("add.u32", units, Imm(31, "u32")), Imm(5, "u32"))
    magic = b.op("mov.b32", Imm(FLOAT_2, "b32"))
    nib = Imm(0x78787878, "b32")
    ring = b.op("mov.u32", b.dynamic_shared(XR_STAGES * 3 * 16 * XR_THREADS))
    b.meta.update(dynamic_smem=b.dynamic_smem, stages=XR_STAGES, copy="cp.async (16 bytes, per thread)",
                  smem_per_launch=f"{XR_STAGES * 3 * 16} bytes per thread launched (the ring's planes are ntid.x wide)")
    mine = b.op("mad.lo.u32", tid, Imm(16, "u32"), ring)  # plane p of stage s: + (3·s + p)·16·ntid
    plane = b.op("shl.b32", b.special("ntid.x"), Imm(4, "u32"))
    stage_bytes = b.op("mul.lo.u32", plane, Imm(3, "u32"))

    def issue(r, stage):
        """cp.async of row r's 48 bytes into this thread's slots of `stage` (nothing past the CTA's rows), one
        commit group per row either way, so that wait_group counts rows."""
        ok = b.op("setp.lt.u32", r, rend)
        base = b.op("mad.wide.u32", r, row_bytes, W)
        dst = b.op("mad.lo.u32", stage, stage_bytes, mine)
        srcs = (b.op("add.u64", base, b.op("cvt.u64.u32", hdr_off)), b.op("add.u64", base, b.op("cvt.u64.u32", qs_off)))
        for part, (src, off) in enumerate(((srcs[0], 0), (srcs[1], 0), (srcs[1], 16))):
            b.emit("cp.async.cg.shared.global", Mem(dst if part == 0 else b.op("mad.lo.u32", plane, Imm(part, "u32"), dst)),
                   Mem(src, off), Imm(16, "u32"), pred=ok)
        b.emit("cp.async.commit_group")

    def compute(r, stage):
        from ..codecs.q4_k import lane_scales

        src = b.op("mad.lo.u32", stage, stage_bytes, mine)
        hdr, qs = b.regs("b32", 4), b.regs("b32", 8)
        b.emit("ld.shared.v4.b32", b.vec(hdr), Mem(src))
        b.emit("ld.shared.v4.b32", b.vec(qs[0:4]), Mem(b.op("add.u32", src, plane)))
        b.emit("ld.shared.v4.b32", b.vec(qs[4:8]), Mem(b.op("mad.lo.u32", plane, Imm(2, "u32"), src)))
        d_lo, min_lo, d_hi, min_hi = lane_scales(b, hdr, sub_lo, sub_hi)
        acc = [[None] * XR_CHAINS, [None] * XR_CHAINS]  # [sub-block][chain]: independent FMA chains
        for wi, word in enumerate(qs):
            halves = (b.op("and.b32", b.op("shl.b32", word, Imm(3, "u32")), nib),  # low nibbles·8 per byte
                      b.op("and.b32", b.op("shr.u32", word, Imm(1, "u32")), nib))  # high nibbles·8 per byte
            for h, nibs in enumerate(halves):
                for byte in range(4):
                    v = b.op("prmt.b32", nibs, magic, Imm(0x7044 | byte << 8, "b32"))  # 2 + q/8
                    x = xs[32 * h + 4 * wi + byte]
                    c = byte % XR_CHAINS
                    if acc[h][c] is None:
                        acc[h][c] = b.op("mul.rn.f32", v, x)
                    else:
                        b.emit("fma.rn.f32", acc[h][c], v, x, acc[h][c])
        part = None
        for h, (dsc, dmm) in enumerate(((d_lo, min_lo), (d_hi, min_hi))):
            a = acc[h]
            s_ = a[0]
            for v in a[1:]:
                s_ = b.op("add.rn.f32", s_, v)
            qx = b.op("mul.rn.f32", b.op("fma.rn.f32", sums[h], Imm(-2.0, "f32"), s_), Imm(8.0, "f32"))  # Σ q·x
            c = b.op("fma.rn.f32", dsc, qx, b.op("neg.f32", b.op("mul.rn.f32", dmm, sums[h])))
            part = c if part is None else b.op("add.rn.f32", part, c)
        part = b.op("selp.f32", part, Imm(0.0, "f32"), live)
        warp_sum(b, part, inplace=True)
        store = b.op("and.pred", b.op("setp.eq.u32", lane, Imm(0, "u32")), b.op("setp.lt.u32", r, rend))
        slot = b.op("mad.lo.u32", b.op("sub.u32", r, r0), Imm(XR_WARP_STRIDE, "u32"), warp)
        b.emit("st.shared.f32", Mem(b.op("mad.lo.u32", slot, Imm(4, "u32"), b.op("mov.u32", red))), part, pred=store)

    b.comment(f"rows through a {XR_STAGES}-row cp.async ring per thread (each thread reads back only its own bytes: "
              "wait_group, no barrier)")
    for i in range(XR_STAGES - 1):
        issue(b.op("add.u32", r0, Imm(i, "u32")), Imm(i, "u32"))
    b.comment("the thread's 64 activation values (x[64u .. 64u + 63]) and the two sub-block sums, kept for all rows (loaded while the ring's first rows are in flight)")
    xs = b.regs("f32", 64)
    xp = b.op("mad.wide.u32", unit, Imm(256, "u32"), X)
    for i in range(16):
        b.emit("ld.global.nc.v4.f32", b.vec(xs[4 * i:4 * i + 4]), Mem(xp, 16 * i))
    sums = []
    for h in range(2):
        s = b.op("mov.f32", xs[32 * h])
        for v in xs[32 * h + 1:32 * h + 32]:
            b.emit("add.rn.f32", s, s, v)
        sums.append(s)

    r = b.op("mov.u32", r0)
    g = b.op("mov.u32", Imm(0, "u32"))  # ring position of row r
    top = b.label("rows")
    b.place(top)
    ahead = b.op("add.u32", g, Imm(XR_STAGES - 1, "u32"))
    issue(b.op("add.u32", r, Imm(XR_STAGES - 1, "u32")), b.op("rem.u32", ahead, Imm(XR_STAGES, "u32")))
    b.emit("cp.async.wait_group", Imm(XR_STAGES - 1, "u32"))  # row r's group is complete
    compute(r, b.op("rem.u32", g, Imm(XR_STAGES, "u32")))
    b.emit("add.u32", r, r, Imm(1, "u32"))
    b.emit("add.u32", g, g, Imm(1, "u32"))
    b.bra(top, pred=b.op("setp.lt.u32", r, rend))
    b.emit("cp.async.wait_group", Imm(0, "u32"))

    b.comment("each row: the warps' partials in warp order → y (threads stride over the CTA's rows)")
    b.emit("bar.sync", Imm(0, "u32"))
    done = b.label("done")
    nrows = b.op("sub.u32", rend, r0)
    rl = b.op("mov.u32", tid)
    rows_l, wl, wend = b.label("out_rows"), b.label("warps"), b.label("warps_done")
    b.place(rows_l)
    b.bra(done, pred=b.op("setp.lt.u32", rl, nrows), neg=True, uniform=False)
    rp = b.op("mad.lo.u32", rl, Imm(XR_WARP_STRIDE * 4, "u32"), b.op("mov.u32", red))
    tot = b.op("ld.shared.f32", Mem(rp))
    wv = b.op("mov.u32", Imm(1, "u32"))
    b.place(wl)
    b.bra(wend, pred=b.op("setp.ge.u32", wv, nw), uniform=False)
    b.emit("add.rn.f32", tot, tot, b.op("ld.shared.f32", Mem(b.op("mad.lo.u32", wv, Imm(4, "u32"), rp))))
    b.emit("add.u32", wv, wv, Imm(1, "u32"))
    b.bra(wl, uniform=False)
    b.place(wend)
    b.emit("st.global.f32", Mem(b.op("mad.wide.u32", b.op("add.u32", r0, rl), Imm(4, "u32"), Y)), tot)
    b.emit("add.u32", rl, rl, b.special("ntid.x"))
    b.bra(rows_l, uniform=False)
    b.place(done)
    b.emit("ret")
    return b.finish()


KERNEL = KernelDef("gemv_q4_k_xr", "q4_K decode GEMV, T = 1, exact, the activation in registers (no prep)", build)
