"""Per-kernel harnesses for the emulator: draw inputs, launch the emitted PTX in the emulator, compare
with the NumPy reference. The same launch geometry the runtime uses (from the manifest's meta)."""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .. import formats, layouts
from ..formats import tq4_1s as T4
from ..testing.accuracy import mul_mat_id_scale, product_scale, rel_error
from .machine import Memory, run_kernel


class EmulatorBackend:
    """Where a harness allocates, launches and reads back: the emulator (default). A GPU backend with the
    same four methods runs the very same harness code on the device (tests/test_gpu_emu_crosscheck.py),
    so GPU and emulator see identical inputs and their outputs can be compared bit for bit. `warp_serial`:
    the emulator runs a CTA's warps (128: warpgroups) one at a time between waits (Emulator.run), to find missing
    barriers."""

    def __init__(self, warp_serial: bool | int = False):
        self.warp_serial = warp_serial

    def memory(self):
        return Memory()

    def run(self, ptx, grid, block, args, mem, dynamic_smem=0, seed=None, interleave=False, cluster=None):
        run_kernel(ptx, grid, block, args, mem, dynamic_smem=dynamic_smem, seed=seed, interleave=interleave,
                   cluster=cluster, warp_serial=self.warp_serial)

    def tensor_map(self, mem, addr, *args):
        from .hopper import tensor_map_2d

        return tensor_map_2d(addr, *args)


BACKEND = [EmulatorBackend()]  # the active backend (a stack: use_backend pushes)


class use_backend:
    def __init__(self, backend):
        self.backend = backend

    def __enter__(self):
        BACKEND.append(self.backend)
        return self.backend

    def __exit__(self, *exc):
        BACKEND.pop()



def tiny_groups(h16, v32) -> bool:
    """Whether some group (the last axis) of the fp16 values `h16`, rounded from the fp32 `v32`, lies wholly under
    2^-11 while not all zero: the test that raises the conversions' flag for a token too small for fp16
    (kernels/convert_f16.py too_small)."""
    small = ((np.asarray(h16, np.float16).view(np.uint16) & 0x7000) == 0).all(axis=-1)
    nonzero = ((np.asarray(v32, np.float32).view(np.uint32) & 0x7FFFFFFF) != 0).any(axis=-1)
    return bool((small & nonzero).any())


def fp16_flag(v32, group: int) -> bool:
    """The flag a conversion of the fp32 values `v32` to fp16 raises, testing `group` consecutive values (in the
    order given) at a time: some value not finite in fp16, or a group too small for it (tiny_groups)."""
    v32 = np.ascontiguousarray(v32, np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        h16 = v32.astype(np.float16)
    return bool(not np.isfinite(h16).all() or tiny_groups(h16.reshape(-1, group), v32.reshape(-1, group)))

def weight_rows_map(mem, wa, meta, rows, row_bytes):
    """The raw weight rows' tensor map of a TMA-fed GEMM, as runtime.ops._raw_rows_map makes it: boxes of the meta's
    tma_box (Q4_K's 16-byte columns x 128 rows unless the build says otherwise), in u32 words where tma_dtype says."""
    box, box_rows = meta.get("tma_box", (16, 128))
    dtype = meta.get("tma_dtype", "u8")
    es = 4 if dtype == "u32" else 1
    g = int(meta.get("row_group", 1))  # groups of g rows (kernels/mmq.py ROW_GROUP_NOTE)
    assert row_bytes % es == 0 and rows % g == 0, (row_bytes, dtype, rows, g)
    return BACKEND[-1].tensor_map(mem, wa, dtype, rows // g, g * row_bytes // es, box_rows, box, "none")


def _memory():
    return BACKEND[-1].memory()


def _run(ptx, grid, block, args, mem, dynamic_smem=0, seed=None, interleave=False, cluster=None):
    """Run on the active backend (`interleave`: the emulator's CTAs take turns; a GPU does that anyway)."""
    BACKEND[-1].run(ptx, grid, block, args, mem, dynamic_smem=dynamic_smem, seed=seed, interleave=interleave,
                    cluster=cluster)


@dataclass
class Outcome:
    kernel: str
    ok: bool
    detail: str
    got: np.ndarray
    want: np.ndarray


def _q8_1(ptx: str, rng, shape=(4, 96), seed=None) -> Outcome:
    t, k = shape
    x = rng.standard_normal((t, k)).astype(np.float32) * np.float32(rng.choice([1e-3, 1.0, 50.0]))
    x[0, :32] = 0
    mem = _memory()
    xa = mem.alloc(x)
    nb = t * k // 32
    ya = mem.alloc(nb * 36, poison=0xFF)
    _run(ptx, ((nb + 7) // 8,), (256,), (xa, ya, nb), mem, seed=seed)
    got = mem.view(ya, np.uint8, (t, k // 32 * 36))
    want = formats.quantize("q8_1", x)
    ok = np.array_equal(got, want)
    return Outcome("quantize_q8_1", ok, "bit-exact" if ok else f"{np.count_nonzero(got != want)} bytes differ", got, want)


def _q8_1_mmq(ptx: str, rng, shape=(4, 96), seed=None, big=False) -> Outcome:
    """quantize_q8_1_mmq: bit-exact to ggml.q8_1_mmq_layout(quantize_q8_1(x)), a zero block, a NaN and an inf
    included, flag down; with `big` one value past 65504·127 and the flag up."""
    t, k = shape
    x = rng.standard_normal((t, k)).astype(np.float32) * np.float32(rng.choice([1e-3, 1.0, 50.0]))
    x[0, :32] = 0
    x[-1, -1] = np.nan
    x[-1, 0] = -np.inf
    if big:
        x[1, 40] = 1e10
    mem = _memory()
    xa = mem.alloc(x)
    nb = t * k // 32
    ya, fa = mem.alloc(nb * 40, poison=0xFF), mem.alloc(4, poison=0)
    _run(ptx, ((nb + 7) // 8,), (256,), (xa, ya, nb, fa), mem, seed=seed)
    got = mem.view(ya, np.uint8, (nb * 40,))
    want = formats.ggml.q8_1_mmq_layout(formats.quantize("q8_1", x))
    flag = int(mem.view(fa, np.uint32, (1,))[0])
    if big:  # the flag is raised for the overflowing block (its bytes are whatever Q8_1 makes of it)
        return Outcome("quantize_q8_1_mmq", flag == 1, f"overflow flag {flag}", got, want)
    # the int8 bytes exactly; the scales bit for bit, except that any NaN matches any NaN (payloads differ)
    ok = np.array_equal(got[:nb * 32], want[:nb * 32]) and flag == 0
    gs, ws = got[nb * 32:].view(np.float32), want[nb * 32:].view(np.float32)
    ok = ok and bool(((gs.view(np.uint32) == ws.view(np.uint32)) | (np.isnan(gs) & np.isnan(ws))).all())
    return Outcome("quantize_q8_1_mmq", ok, "bit-exact (NaN as NaN)" if ok else f"{np.count_nonzero(got != want)} bytes differ",
                   got, want)


def _deq(fmt: str):
    """dequantize_<fmt>: drawn GGUF bytes (random quants, finite scales; Q4_K's from its quantizer) → fp16 equal to
    formats.dequantize(...).astype(float16) bit for bit (NaNs as NaNs); the output is poisoned first. Q8_0 takes a
    block count that is not a multiple of its 8-block groups (the last group's idle lanes must not write)."""
    from ptxgen.testing.blocks import random_raw

    def run(ptx: str, rng, shape=None, seed=None) -> Outcome:
        m, k = shape or ((5, 512) if fmt != "q8_0" else (5, 96))
        raw = random_raw(fmt, m, k, rng) if fmt != "q4_K" else formats.quantize(
            fmt, rng.standard_normal((m, k)).astype(np.float32))
        f = formats.get(fmt)
        count = m * k // f.block_size
        mem = _memory()
        wa = mem.alloc(raw)
        ya = mem.alloc(m * k * 2 + 64, poison=0xFF)  # 64 bytes past the end: must stay poisoned
        groups = count if f.block_size == 256 else -(-count // 8)
        _run(ptx, ((groups + 7) // 8,), (256,), (wa, ya, count), mem, seed=seed)
        got = mem.view(ya, np.uint16, (m * k * 2 + 64) // 2)
        with np.errstate(all="ignore"):
            want = formats.dequantize(fmt, raw, (m, k)).astype(np.float16).reshape(-1)
        g, tail = got[:m * k], got[m * k:]
        same = (g == want.view(np.uint16)) | (np.isnan(g.view(np.float16)) & np.isnan(want))
        ok = bool(same.all() and (tail == 0xFFFF).all())
        return Outcome(f"dequantize_{fmt.lower()}", ok, "bit-exact" if ok else
                       f"{np.count_nonzero(~same)} of {g.size} differ, tail {'kept' if (tail == 0xFFFF).all() else 'written'}",
                       g, want.view(np.uint16))
    return run


def gemv_codec_case(ptx: str, meta: dict, rng, shape=None, ntok=None, seed=None, kparts=None) -> Outcome:
    """gemv_<fmt>_f32_t<nt> (kernels/gemv_codec.py): ggml-quantized weights of a shape with a partial last CTA (and,
    for Q8_0, a K that is not a multiple of 256: a partial last step), 1..nt tokens of fp32 x; y NaN-poisoned
    first. Against the float64 reference, relative error ≤ 1e-5. The builds with the kparts parameter (meta
    kparts_param) run `kparts` warps a row (drawn from 1, 2, .. the CTA's warps if not given)."""
    fmt = meta["fmt"]
    m, k = shape or (21, 544 if fmt == "q8_0" else 768)  # odd block counts: a wide codec's last half-warp is idle
    n = ntok or int(rng.integers(1, meta["tokens"] + 1))
    raw = formats.quantize(fmt, rng.standard_normal((m, k)).astype(np.float32))
    x = (rng.standard_normal((n, k)) * rng.choice([1e-3, 1.0, 40.0])).astype(np.float32)
    x16 = meta["activation"].startswith("fp16")  # the _x16 builds: fp16 x, against the same values' product
    if x16:
        x = x.astype(np.float16)
    mem = _memory()
    wa, xa, ya = mem.alloc(raw), mem.alloc(x), mem.alloc(n * m * 4, poison=0xFF)
    kp = ()
    if meta.get("kparts_param"):
        kp = (kparts or 2 ** int(rng.integers(0, (int(meta["warps"]) & -int(meta["warps"])).bit_length())),)
    _run(ptx, (-(-m * (kp or (1,))[0] // meta["rows_per_cta"]),), (32 * meta["warps"],), (wa, xa, ya, m, k, n) + kp,
         mem, seed=seed)
    got = mem.view(ya, np.float32, (n, m)).astype(np.float64)
    want = formats.gemm_ref(fmt, raw, m, k, x)
    rel = np.linalg.norm(got - want) / np.linalg.norm(want)
    ok = bool(np.isfinite(got).all() and rel <= 1e-5)
    return Outcome(meta["name"], ok, f"relative error {rel:.2e} (T={n}{f', kparts {kp[0]}' if kp else ''})", got,
                   want)


def gemv_id_case(ptx: str, meta: dict, rng, shape=None, ids=None, x_per_slot=None, seed=None, gate=None,
                 experts_grid=None) -> Outcome:
    """gemv_<fmt>_f32_id / _idg (mul_mat_id's GEMVs: one pair per grid row / per expert its pairs 8 at a time, the
    ids scanned in windows of 1024 pairs): E experts of ggml-quantized (M, K) weights (M with a partial last CTA), T tokens × `slots` expert ids
    with repeats (several pairs on one expert; the grouped build gets more than 8 on one) and, unless `ids` is
    given, one id out of range (−1 or E); x (T, K) or, with `x_per_slot`, (T, slots, K); y NaN-poisoned first.
    Against formats.mul_mat_id_ref: within 1e-5 relative where the id is valid, NaN exactly where it is not. `gate`
    (the grouped build): the value of the u32 its gate points at — 0: nothing may be written; raised: the last CTA
    lowers it and zeroes the arrival count beside it. `experts_grid`: the
    grouped build's grid.y (default E; fewer: each CTA loops over the experts ctaid.y + nctaid.y·i)."""
    fmt, grouped = meta["fmt"], "window" in meta
    e, m, k = shape or (3, 21, 544 if fmt == "q8_0" else 512)
    if ids is None:
        t, slots = (int(rng.integers(5, 8)), 2) if grouped else (int(rng.integers(1, 4)), int(rng.integers(1, 3)))
        ids = rng.integers(0, e, (t, slots)).astype(np.int32)
        ids.flat[int(rng.integers(ids.size))] = rng.choice([-1, e])
    ids = np.asarray(ids, np.int32)
    t, slots = ids.shape
    per_slot = bool(rng.integers(2)) if x_per_slot is None else x_per_slot
    raw = formats.quantize(fmt, rng.standard_normal((e * m, k)).astype(np.float32))
    x = (rng.standard_normal((t, slots, k) if per_slot else (t, k)) * rng.choice([1e-3, 1.0, 40.0])).astype(np.float32)
    x16 = bool(meta.get("x16"))  # (the _x16 twins: x is fp16; the reference on its widening)
    x, xm = _widened(x, x16)
    mem = _memory()
    wa, xa, ia = mem.alloc(raw), mem.alloc(xm if x16 else _moe_x(fmt, x)), mem.alloc(ids)
    ya = mem.alloc(t * slots * m * 4, poison=0x11)  # finite (1e-28): a row never written fails, NaN rows included
    expert_bytes = m * formats.get(fmt).row_bytes(k)
    ga = None if gate is None else mem.alloc(np.array([gate], np.uint32))
    da = None if gate is None else mem.alloc(np.zeros(1, np.uint32))
    _run(ptx, (-(-m // meta["rows_per_cta"]), (experts_grid or e) if grouped else t * slots), (32 * meta["warps"],),
         (wa, xa, ya, m, k, t * slots if grouped else 1, e, expert_bytes, ia, slots, int(per_slot))
         + ((ga or 0, da or 0) if grouped else ()), mem, seed=seed)
    if gate == 0:
        untouched = bool((mem.view(ya, np.uint32, (t, slots, m)) == 0x11111111).all())
        return Outcome(meta["name"], untouched, f"gate 0: y {'untouched' if untouched else 'WRITTEN'}", None, None)
    if gate is not None and (mem.view(ga, np.uint32, (1,))[0] or mem.view(da, np.uint32, (1,))[0]):
        return Outcome(meta["name"], False, "the raised gate (or its arrival count) not lowered", None, None)
    got = mem.view(ya, np.float32, (t, slots, m)).astype(np.float64)
    want = formats.mul_mat_id_ref(fmt, raw, (e, m, k), x, ids)
    bad = np.isnan(want)
    ok_nan = bool((np.isnan(got) == bad).all())
    rel = np.linalg.norm(got[~bad] - want[~bad]) / max(np.linalg.norm(want[~bad]), 1e-300)
    ok = ok_nan and bool(np.isfinite(got[~bad]).all() and rel <= 1e-5)
    return Outcome(meta["name"], ok, f"relative error {rel:.2e}, NaN rows {'as the ids say' if ok_nan else 'WRONG'} "
                   f"(T={t}, slots={slots}, x per slot: {per_slot})", got, want)


def moe_check_ids_case(ptx: str, rng, ids=None, experts: int = 7, start: int = 5, seed=None) -> Outcome:
    """moe_check_ids: (T, slots) ids with some below 0 and some ≥ E (unless `ids` is given), a count already in
    errors[0] (the kernel adds to it, as across a caller's steps), errors[1] untouched."""
    if ids is None:
        ids = rng.integers(-3, experts + 3, (int(rng.integers(1, 40)), int(rng.integers(1, 9)))).astype(np.int32)
    ids = np.asarray(ids, np.int32)
    mem = _memory()
    ia = mem.alloc(ids)
    ea = mem.alloc(np.array([start, 0xDEADBEEF], np.uint32))
    n = ids.size
    _run(ptx, (-(-n // 256),), (256,), (ia, n, experts, ea), mem, seed=seed)
    got = mem.view(ea, np.uint32, (2,)).copy()
    want = np.array([start + int(((ids < 0) | (ids >= experts)).sum()), 0xDEADBEEF], np.uint32)
    ok = bool((got == want).all())
    return Outcome("moe_check_ids", ok, f"errors {got.tolist()}, expected {want.tolist()}", got, want)


def moe_group_case(ptx: str, meta: dict, rng, shape=None, ids=None, tile=64, seed=None) -> Outcome:
    """moe_group: E experts, (T, slots) ids drawn with repeats, empty experts and one out of range (unless `ids` is
    given); offsets and the work list as kernels.moe_group.reference says, each expert's slice of order a
    permutation of its pairs, y's rows NaN exactly for the bad pairs (others untouched)."""
    from ptxgen.kernels.moe_group import reference

    e, t, slots, m = shape or (9, 37, 3, 5)
    if ids is None:
        ids = rng.integers(0, e - 2, (t, slots)).astype(np.int32)  # the last two experts empty
        ids.flat[int(rng.integers(ids.size))] = rng.choice([-1, e])
    ids = np.asarray(ids, np.int32)
    p = ids.size
    offsets, groups, work = reference(ids, e, tile)
    mem = _memory()
    ia, oa = mem.alloc(ids), mem.alloc(4 * max(p, 1), poison=0xFF)
    fa, wa = mem.alloc(4 * (e + 1), poison=0xFF), mem.alloc(4 * (1 + p // tile + e), poison=0xFF)
    ya = mem.alloc(np.zeros((p, m), np.float32))
    _run(ptx, (1,), (1024,), (ia, p, e, tile, oa, fa, wa, ya, m), mem, seed=seed)
    got_off = mem.view(fa, np.uint32, (e + 1,))
    wl = mem.view(wa, np.uint32, (1 + p // tile + e,))
    L = int(wl[0])
    got_work = wl[1:1 + L]
    order = mem.view(oa, np.uint32, (max(p, 1),))
    why = []
    if not np.array_equal(got_off, offsets):
        why.append(f"offsets {got_off} != {offsets}")
    if not np.array_equal(got_work, work):
        why.append(f"work {got_work} != {work}")
    for ex, pairs in groups.items():
        if not np.array_equal(np.sort(order[offsets[ex]:offsets[ex + 1]]), pairs):
            why.append(f"expert {ex}'s pairs")
    y = mem.view(ya, np.float32, (p, m))
    bad = (ids.reshape(-1) < 0) | (ids.reshape(-1) >= e)
    if not (np.isnan(y[bad]).all() and (y[~bad] == 0).all()):
        why.append("NaN rows")
    # what a GPU run must match byte for byte: the order inside an expert depends on the atomics' order, so sorted
    canon = np.concatenate([np.sort(order[got_off[x]:got_off[x + 1]]) for x in range(e)] or [np.zeros(0, np.uint32)])
    got = np.concatenate([got_off, wl[:1 + L], canon.astype(np.uint32), y.view(np.uint32).reshape(-1)])
    return Outcome("moe_group", not why, "; ".join(why) or f"{len(groups)} experts with pairs, L = {L}", got, None)


def _moe_x(fmt: str, x):
    """The x mul_mat_id's kernels read: x, or for a rotated codec (TQ4_1S) x rotated as its ROTATION kernel does
    (mul_mat_id launches it first)."""
    return formats.rht_forward(x) if fmt == "tq4_1s" else x


def _widened(x, x16: bool):
    """For the harness of an _x16 twin (`x16`): (x rounded to fp16 and widened — the values the twin reads, its
    reference's x —, the fp16 array to put in its memory); else (x, x)."""
    if not x16:
        return x, x
    with np.errstate(over="ignore"):
        h = x.astype(np.float16)
    return h.astype(np.float32), h


def mmq_moe_case(ptx: str, meta: dict, rng, shape=None, ids=None, x_per_slot=None, seed=None, ctas=3,
                 interleave=False, scale=1.0) -> Outcome:
    """mmq_<fmt>_f16_n<BN>_moe: E experts of ggml-quantized (M, K) weights (M past one tile), (T, slots) ids with
    repeats, empty experts, one expert with more than a tile of pairs and one id out of range (unless `ids` is
    given); the grouping (order, offsets, work list) from kernels.moe_group.reference, as moe_group leaves it; `ctas`
    persistent CTAs. Within 1e-3 of formats.mul_mat_id_ref (fp16 activations) on the valid pairs, the bad pairs'
    rows untouched (moe_group writes their NaN), the queue reset, the flag down."""
    from ptxgen.kernels.moe_group import reference

    bn, fmt = meta["bn"], meta["fmt"]
    e, m, k = shape or ((4, 136, 768) if meta.get("row_group", 1) > 1 else  # (row groups: whole groups, short rows)
                        (4, 131, 256 if "wgmma" not in meta.get("mma", "") else _ra_min_k(fmt, 256)))  # K = 256:
    # the slow tier runs every build of every target 5 times (the wgmma builds' raw rows: 16-byte multiples)
    if ids is None:
        t, slots = bn + 3, 2
        ids = rng.integers(0, e - 1, (t, slots)).astype(np.int32)  # the last expert empty
        ids[:bn + 1, 0] = 1  # more than a tile of pairs on expert 1
        ids.flat[int(rng.integers(ids.size))] = rng.choice([-1, e])
    ids = np.asarray(ids, np.int32)
    t, slots = ids.shape
    per_slot = bool(rng.integers(2)) if x_per_slot is None else x_per_slot
    raw = formats.quantize(fmt, rng.standard_normal((e * m, k)).astype(np.float32))
    x = (rng.standard_normal((t, slots, k) if per_slot else (t, k)) * scale).astype(np.float32)
    offsets, groups, work = reference(ids, e, bn)
    order = np.zeros(max(ids.size, 1), np.uint32)
    for ex, pairs in groups.items():
        order[offsets[ex]:offsets[ex + 1]] = rng.permutation(pairs)  # moe_group's order inside an expert: any
    mem = _memory()
    xk = _moe_x(fmt, x)
    wa, xa = mem.alloc(raw), mem.alloc(xk)
    ya, fa, qa = mem.alloc(t * slots * m * 4, poison=0x11), mem.alloc(4, poison=0), mem.alloc(8, poison=0)
    oa, na = mem.alloc(order), mem.alloc(offsets)
    ka = mem.alloc(np.concatenate([[len(work)], work]).astype(np.uint32))
    expert_bytes = m * formats.get(fmt).row_bytes(k)
    items = -(-m // meta["bm"]) * len(work)
    grid = (max(1, min(items, ctas)),)
    if "wgmma" in meta.get("mma", ""):  # sm_90a's register-A build: x gathered in grouped order and K-permuted (as
        # moe_gather writes it; its own test checks that bit for bit), both operands by tensor map
        p = max(ids.size, 1)
        rows = xk.reshape(-1, k)[order[:p] if per_slot else order[:p] // slots]
        with np.errstate(over="ignore", invalid="ignore"):
            x16 = rows.astype(np.float16).reshape(p, k // 64, 64)[:, :, layouts.q4k_rega_k_order()].reshape(p, k)
        # the build's box (columns, rows): Q4_K's / Q5_K's 16-byte columns or a codec's whole blocks, the M tile's rows
        tw = weight_rows_map(mem, wa, meta, e * m, formats.get(fmt).row_bytes(k))
        tx = BACKEND[-1].tensor_map(mem, mem.alloc(np.ascontiguousarray(x16)), "f16", p, k, bn, 64, "128B", None,
                                    meta.get("x_box_chunks", 0))
        ts = ()
        if "int_weights" in meta or "min_lo_sums" in meta:  # the rows' sub-block sums too, as the gather writes them
            xs = gather_sub_block_sums(rows)
            ts = (BACKEND[-1].tensor_map(mem, mem.alloc(xs), "f16", p, k // 16, bn, 8, "none", None,
                                        meta.get("s_box_chunks", 0)),)
        _run(ptx, grid, (32 * meta["warps"],), (tw, tx, *ts, ya, m, k, oa, na, ka, qa), mem,
             dynamic_smem=meta["dynamic_smem"], seed=seed, interleave=interleave)
    else:
        _run(ptx, grid, (256,), (wa, xa, ya, fa, m, k, slots, int(per_slot), expert_bytes, oa, na, ka, qa), mem,
             dynamic_smem=meta["dynamic_smem"], seed=seed, interleave=interleave)
    assert not mem.view(qa, np.uint32, (2,)).any(), "the work queue was not reset by the last CTA"
    got = mem.view(ya, np.float32, (t, slots, m)).astype(np.float64)
    want = formats.mul_mat_id_ref(fmt, raw, (e, m, k), x, ids)
    bad = np.isnan(want[..., 0])
    untouched = bool((mem.view(ya, np.uint32, (t, slots, m))[bad] == 0x11111111).all())
    rel = rel_error(got[~bad], want[~bad], mul_mat_id_scale(fmt, raw, (e, m, k), x, ids)[~bad])  # (fp16 x: scaled)
    flag = int(mem.view(fa, np.uint32, (1,))[0])
    want_flag = 0
    if "wgmma" not in meta.get("mma", ""):  # the mma.sync build converts x itself: 4 values of a unit too small for
        # fp16 raise the flag (_f16_activations' tiny; the gated GEMV behind it then recomputes)
        valid = ~bad.reshape(-1)
        used = xk.reshape(-1, k)[np.flatnonzero(valid) if per_slot else np.flatnonzero(valid) // slots]
        with np.errstate(over="ignore"):
            want_flag = int(tiny_groups(used.astype(np.float16).reshape(-1, 4), used.reshape(-1, 4)))  # (an
            # overflow's flag stays a failure here: test_moe's overflowing case expects it so)
    if want_flag and flag == want_flag:
        return Outcome(meta["name"], untouched, f"too small for fp16: flagged (the caller recomputes); bad rows "
                       f"untouched: {untouched}", got, want)
    ok = untouched and flag == want_flag and bool(np.isfinite(got[~bad]).all() and rel <= 1e-3)
    return Outcome(meta["name"], ok, f"relative error {rel:.2e}, bad rows untouched: {untouched}, flag {flag} "
                   f"(T={t}, slots={slots}, x per slot: {per_slot}, {len(work)} entries, {items} items)", got, want)


def _frags(fmt: str):
    """dequantize_<fmt>_frags (kernels/frags.py): drawn GGUF bytes → layouts.q4k_prepared_fragments(raw, fmt) bit for
    bit (NaN as NaN), rows past M zero; the output poisoned first."""
    from ptxgen.testing.blocks import random_raw

    def run(ptx: str, rng, shape=(133, 512), seed=None) -> Outcome:
        m, k = shape
        raw = random_raw(fmt, m, k, rng)
        want = layouts.q4k_prepared_fragments(raw, m, k, fmt)
        mem = _memory()
        wa, ya = mem.alloc(raw), mem.alloc(want.size, poison=0xFF)
        _run(ptx, (k // 64, -(-m // 128)), (256,), (wa, ya, m, k), mem, seed=seed)
        got = mem.view(ya, np.uint8, want.shape)
        g, w = got.view(np.float16), want.view(np.float16)
        same = (g.view(np.uint16) == w.view(np.uint16)) | (np.isnan(g) & np.isnan(w))
        ok = bool(same.all())
        return Outcome(f"dequantize_{fmt.lower()}_frags", ok, "bit-exact" if ok else
                       f"{np.count_nonzero(~same)} of {same.size} halves differ", got, want)
    return run


def _rotate(ptx: str, rng, shape=(3, 128), seed=None) -> Outcome:
    t, k = shape
    x = rng.standard_normal((t, k)).astype(np.float32)
    mem = _memory()
    xa, ya = mem.alloc(x), mem.alloc(x.nbytes, poison=0xFF)
    nb = t * k // 32
    _run(ptx, ((nb + 7) // 8,), (256,), (xa, ya, nb), mem, seed=seed)
    got = mem.view(ya, np.float32, (t, k))
    want = formats.rht_forward(x)
    ok = np.array_equal(got.view(np.uint32), want.view(np.uint32))
    return Outcome("rotate_tq4_1s", ok, "bit-exact" if ok else f"{np.count_nonzero(got != want)} differ", got, want)


def _rotate_f16(ptx: str, rng, shape=(3, 128), seed=None, mode: int = 2, overflow: bool = False,
                tiny: bool = False) -> Outcome:
    """rotate_tq4_1s_f16 (kernels/gemv.py ROT_*): y32 bit for bit rht_forward of x (fp32, or fp16 widened), y16 bit
    for bit its fp16 rounding in x's or the register-A K order (untouched under ROT_NO_F16), the flag raised exactly
    where a rotated value leaves fp16 (`overflow`: one block scaled past it) or a rotated block is too small for it
    (`tiny`: the first token scaled by 1e-6; a token of zeros beside it raises nothing)."""
    from ..kernels.gemv import ROT_NO_F16, ROT_REGA, ROT_X16

    t, k = shape
    x = rng.standard_normal((t, k)).astype(np.float32)
    if overflow:
        e0 = np.zeros((1, 32), np.float32)
        e0[0, 5] = 7e4  # the block whose rotation is 7e4 at one place: its x (±12374) fits fp16, that value not
        x[t - 1, 32:64] = formats.rht_inverse(e0)[0]
    if tiny:
        x[0] *= np.float32(1e-6)
    if t > 2:
        x[1] = 0
    xin = x.astype(np.float16) if mode & ROT_X16 else x
    mem = _memory()
    xa = mem.alloc(xin)
    ya, ha, fa = mem.alloc(x.nbytes, poison=0xFF), mem.alloc(t * k * 2, poison=0xAB), mem.alloc(4, poison=0)
    nb = t * k // 32
    _run(ptx, ((nb + 7) // 8,), (256,), (xa, ya, ha, fa, nb, mode), mem, seed=seed)
    want = formats.rht_forward(xin.astype(np.float32))
    got = mem.view(ya, np.float32, (t, k))
    name = "rotate_tq4_1s_f16"
    if not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
        return Outcome(name, False, f"y32: {np.count_nonzero(got != want)} values differ", got, want)
    g16 = mem.view(ha, np.uint16, (t, k))
    if mode & ROT_NO_F16:
        ok = bool((g16 == 0xABAB).all()) and int(mem.view(fa, np.uint32, (1,))[0]) == 0
        return Outcome(name, ok, "y16 untouched" if ok else "y16 or the flag written under ROT_NO_F16", g16, None)
    with np.errstate(over="ignore"):
        w16 = want.astype(np.float16)
    if mode & ROT_REGA:
        w16 = w16.reshape(t, k // 64, 64)[:, :, layouts.q4k_rega_k_order()].reshape(t, k)
    flag = int(mem.view(fa, np.uint32, (1,))[0])
    want_flag = fp16_flag(want, 32)  # (a 32-element block's values in x's order: the warp that tests them)
    same = np.array_equal(g16, w16.view(np.uint16))
    ok = same and flag == int(want_flag)
    return Outcome(name, ok, f"y16 {'bit-exact' if same else 'differs'}, flag {flag} (expected {int(want_flag)})",
                   g16, w16)


def _prep(fast, rotate=True, x16=False):
    def run(ptx: str, rng, shape=(3, 32 * 45), seed=None) -> Outcome:
        """prep_tq4_1s{_q8}: x → forward_rht(x) (→ Q8_1) in the lane layout, bit for bit; padding untouched.
        `x16` (the _x16 twins): x is fp16, the output that of its fp32 widening."""
        t, k = shape
        x = (rng.standard_normal((t, k)) * rng.choice([1e-3, 1.0, 40.0])).astype(np.float32)
        x, xm = _widened(x, x16)
        want = formats.rht_forward(x) if rotate else x
        want = T4.to_lanes_q8(formats.quantize("q8_1", want), k) if fast else T4.to_lanes_f32(want)
        mem = _memory()
        xa = mem.alloc(xm)
        ya = mem.alloc(want.nbytes, poison=0)
        nb = t * k // 32
        _run(ptx, ((nb + 7) // 8,), (256,), (xa, ya, nb, k), mem, seed=seed)
        got = mem.view(ya, np.uint8, (want.nbytes,))
        ok = np.array_equal(got, want.view(np.uint8).reshape(-1))
        name = (("prep_tq4_1s_q8" if fast else "prep_tq4_1s") if rotate else ("prep_q8_lanes" if fast else "prep_f32_lanes")) \
            + ("_x16" if x16 else "")
        return Outcome(name, ok, "bit-exact" if ok else f"{np.count_nonzero(got != want.view(np.uint8).reshape(-1))} bytes differ",
                       got, want)
    return run


def _prep_mma(ptx: str, rng, shape=(3, 32 * 9), seed=None, special=True, x16=False) -> Outcome:
    """prep_tq4_1s_mma: x → forward RHT → per (token, block) 2^s, fp16 hi + lo B tiles and factors, bit for
    bit against ptxgen.formats.tq4_1s.to_mma_tiles; tokens past T zero. `special`: a zero block, a tiny
    block, a huge one and an inf. `x16` (prep_tq4_1s_mma_x16): x is fp16 (tiny and huge within fp16's range)."""
    t, k = shape
    x = (rng.standard_normal((t, k)) * rng.choice([1e-3, 1.0, 40.0])).astype(np.float32)
    if special and k >= 128:
        x[0, 0:32] = 0
        x[-1, 32:64] *= np.float32(1e-4 if x16 else 1e-30)
        x[0, 64:96] *= np.float32(100.0 if x16 else 1e30)
        x[-1, 100] = np.inf
    x, xm = _widened(x, x16)
    tiles, factors = T4.to_mma_tiles(formats.rht_forward(x))
    mem = _memory()
    xa = mem.alloc(xm)
    ta, fa = mem.alloc(tiles.nbytes, poison=0xFF), mem.alloc(factors.nbytes, poison=0xFF)
    nitems = 8 * (k // 32)
    _run(ptx, ((nitems + 7) // 8,), (256,), (xa, ta, fa, t, k), mem, seed=seed)
    got_t, got_f = mem.view(ta, np.uint8, (tiles.nbytes,)), mem.view(fa, np.uint32, (factors.size,))
    want_f = factors.view(np.uint32).reshape(-1)
    # NaN halves compare by "is NaN" (the hi - hi of an inf block), everything else bit for bit
    gh, wh = got_t.view(np.float16), tiles.view(np.float16)
    same = (gh.view(np.uint16) == wh.view(np.uint16)) | (np.isnan(gh) & np.isnan(wh))
    ok = bool(same.all() and np.array_equal(got_f, want_f))
    return Outcome("prep_tq4_1s_mma" + ("_x16" if x16 else ""), ok, "bit-exact" if ok else
                   f"{np.count_nonzero(~same)} halves, {np.count_nonzero(got_f != want_f)} factors differ",
                   got_t, tiles)


def _prep_mma_f16(ptx: str, rng, shape=(3, 512), seed=None, x16=False) -> Outcome:
    """prep_mma_f16: x → per (token, super-block) 2^s, fp16 hi + lo B tiles, factors and the min-term fragments
    (no rotation), bit for bit against to_mma_tiles(x, Q4K_GROUP) and mma_min_fragments; tokens past T zero.
    `x16` (prep_mma_f16_x16): x is fp16 (tiny and huge within fp16's range)."""
    t, k = shape
    x = (rng.standard_normal((t, k)) * rng.choice([1e-3, 1.0, 40.0])).astype(np.float32)
    if k >= 96:
        x[0, 0:32] = 0
        x[-1, 32:64] *= np.float32(1e-4 if x16 else 1e-30)
        x[0, 64:96] *= np.float32(100.0 if x16 else 1e30)
    if k >= 512:  # a super-block whose largest value is an order of magnitude below the next one's
        x[-1, 256:512] *= np.float32(1e-3)
    x, xm = _widened(x, x16)
    tiles, factors = T4.to_mma_tiles(x, T4.Q4K_GROUP)
    sums = T4.mma_min_fragments(x)
    mem = _memory()
    xa = mem.alloc(xm)
    ta, fa, sa = (mem.alloc(a.nbytes, poison=0xFF) for a in (tiles, factors, sums))
    nitems = 8 * (k // 32)
    _run(ptx, ((nitems + 7) // 8,), (256,), (xa, ta, fa, sa, t, k), mem, seed=seed)
    outs = (("tiles", ta, tiles), ("factors", fa, factors), ("min fragments", sa, sums))
    got = [mem.view(addr, np.uint8, (want.nbytes,)) for _, addr, want in outs]
    want = [want.view(np.uint8).reshape(-1) for *_, want in outs]
    bad = [name for (name, *_), g, w in zip(outs, got, want) if not np.array_equal(g, w)]
    # got/want: the three outputs' bytes end to end (the GPU crosscheck compares them with the emulator's)
    return Outcome("prep_mma_f16" + ("_x16" if x16 else ""), not bad, "bit-exact" if not bad else f"{', '.join(bad)} differ",
                   np.concatenate(got), np.concatenate(want))


def _prep_q4k_records(nt: int, hi_only: bool = False, order: str = "q4k", x16: bool = False):
    name = (f"prep_{'q4k' if order == 'q4k' else 'q4k_i8' if order == 'i8' else 'q6k_i8' if order == 'i8q6' else order}"
            f"_t{nt}{'h' if hi_only else ''}{'_x16' if x16 else ''}")

    def run(ptx: str, rng, shape=None, seed=None) -> Outcome:
        """prep_q4k_t{nt}(h) / prep_sub16_t{nt}: up to nt tokens → q4k_mma_records(x, nt, hi_only, order) bit for bit
        (a zero, a tiny and a huge block, a quiet super-block, an inf; fewer tokens than nt: the rest zeros). The
        _x16 builds: x in fp16 (those values rounded there: subnormals, zeros, infs), against the records of the
        same values in fp32."""
        t, k = shape or (nt, 768)
        x = (rng.standard_normal((t, k)) * rng.choice([1e-3, 1.0, 40.0])).astype(np.float32)
        if k >= 512:
            x[0, 0:32] = 0
            x[-1, 32:64] *= np.float32(1e-30)
            x[0, 64:96] *= np.float32(1e30)
            x[-1, 256:512] *= np.float32(1e-3)
        if k >= 768:
            x[0, 600] = np.inf
            x[-1, 160:192] *= np.float32(1e35)  # past 2^115: the clamped scale leaves |x·2^s| ≥ 2^15
        if x16:
            with np.errstate(over="ignore"):  # (the huge blocks become ±inf in fp16)
                x16v = x.astype(np.float16)
            if k >= 512:
                x16v[-1, 32:64] = (rng.standard_normal(32) * 2.0 ** -20).astype(np.float16)  # fp16 subnormals
            x = x16v.astype(np.float32)
        want = T4.q4k_mma_records(x, nt, hi_only, order)
        mem = _memory()
        xa, ra = mem.alloc(x16v if x16 else x), mem.alloc(want.nbytes, poison=0xFF)
        items = nt * (k // 32)
        ctas = (items + 7) // 8
        ready = re.search(r"\.param \.u64 ready\b", ptx) is not None  # gemv_t1.T1_FLAG's build: a count of CTAs done
        rd = (mem.alloc(np.zeros(1, np.uint32)),) if ready else ()
        _run(ptx, (ctas,), (256,), (xa, ra, t, k, *rd), mem, seed=seed)
        got = mem.view(ra, np.uint8, (want.nbytes,))
        same = _same_records(got, want, nt, order)
        ok = bool(same.all())
        if ready and int(mem.view(rd[0], np.uint32, (1,))[0]) != ctas:
            return Outcome(name, False, f"ready count {int(mem.view(rd[0], np.uint32, (1,))[0])}, not {ctas}", got,
                           want)
        return Outcome(name, ok, "bit-exact" if ok else f"{np.count_nonzero(~same)} halves differ", got, want)
    return run


def _same_records(got: np.ndarray, want: np.ndarray, nt: int, order: str) -> np.ndarray:
    """Per fp16 half of two record buffers: the same bits, or both NaN (NaN payloads are no contract) — but the
    int8 records' digit planes byte for byte (a NaN half there is two digits)."""
    gh, wh = got.view(np.float16), want.view(np.float16)
    same = (gh.view(np.uint16) == wh.view(np.uint16)) | (np.isnan(gh) & np.isnan(wh))
    if order in ("i8", "i8q6"):
        moff, _, rb = T4.q4k_i8_record_layout(nt) if order == "i8" else T4.q6k_i8_record_layout(nt)
        planes = (got != want).reshape(-1, rb)[:, :moff].reshape(-1, moff // 2, 2).any(axis=2)
        same.reshape(-1, rb // 2)[:, :moff // 2] &= ~planes
    return same


def gemv_q4k_mma_case(ptx: str, meta: dict, rng, shape=None, ntok=None, seed=None, splits=None, poison_x=None,
                      kparts=None, warps=None) -> Outcome:
    """The tensor-core Q4_K GEMV on tiles, factors and min fragments from the NumPy model (to_mma_tiles(x,
    Q4K_GROUP), mma_min_fragments of the unrotated x) — or, for the few-token builds (meta layout
    "q4k_mma_records"), on q4k_mma_records(x, tokens, hi_only): against the float64 reference, relative error
    ≤ 1e-5 (≤ 1e-3 for the hi-only build: fp16 activations, the prefill GEMMs' bar); split-K counters back at
    zero. The fused builds (meta fused_prep) take x and build the records themselves, CTAs taking turns: the
    records must equal q4k_mma_records bit for bit, and their three sync counters be back at zero too. Builds with
    the kparts parameter (meta k_parts) run with `kparts` warps a row tile (drawn from the powers of two dividing the warps if not
    given; more parts than super-blocks leave some parts empty), and those with meta block_warps CTAs of `warps`
    warps (drawn from it if not given) with shared memory for as many rings."""
    rows, groups = meta["rows_per_cta"], meta["token_groups"]
    records = meta["layout"] == "q4k_mma_records"
    order = meta.get("record_order", "q4k")  # "sub16" / "rot16": an mma_block codec's build (Q6_K, Q8_0 / TQ4_1S)
    fused = bool(meta.get("fused_prep"))
    zgroups = groups == "gridDim.z"  # mmq_q4_k_rega_n*: token groups of meta tokens over gridDim.z
    # (an mma_block codec's: m·row_bytes a multiple of 16, Q6_K's rows a multiple of 4 bytes — mul_mat asks that)
    m, k = shape or ((rows * 2 + 5, 512) if order == "q4k" else (rows * 2 + 8, 512))
    n = ntok or int(rng.integers(1, (2 if zgroups else 1) * meta["tokens"] + 1) if records else
                    rng.integers(8 * groups - 7, 8 * groups + 1))
    nz = -(-n // meta["tokens"]) if zgroups else 1
    fmt = meta.get("fmt", "q4_K")  # the few-token builds of another codec (gemv_t1.FEW_FORMATS, CODEC_FORMATS)
    if order == "q4k":
        raw = formats.quantize(fmt, rng.standard_normal((m, k)).astype(np.float32))
    else:  # every scale and bit pattern
        from ..testing.blocks import random_raw
        raw = random_raw(fmt, m, k, rng)
    x = (rng.standard_normal((n, k)) * rng.choice([1e-3, 1.0, 40.0])).astype(np.float32)
    if poison_x is not None:
        x[poison_x[0], poison_x[1]] = poison_x[2]
    x16 = bool(meta.get("x16"))  # (a fused build's _x16 twin: x is fp16; the references on its widening)
    x, xm = _widened(x, x16)
    mem = _memory()
    wa = mem.alloc(raw)
    if records:
        c_ = meta["tokens"]
        want_rec = np.concatenate([T4.q4k_mma_records(x[c_ * i:c_ * i + c_], c_, bool(meta.get("hi_only")), order)
                                   for i in range(nz)])
        acts = (mem.alloc(want_rec.nbytes, poison=0xFF) if fused else mem.alloc(want_rec),)
    else:  # one prep per group of 8 tokens, the groups' buffers back to back
        parts = [T4.to_mma_tiles(x[8 * i:8 * i + 8], T4.Q4K_GROUP) + (T4.mma_min_fragments(x[8 * i:8 * i + 8]),)
                 for i in range(groups)]
        acts = tuple(mem.alloc(np.concatenate([p_[j] for p_ in parts])) for j in range(3))  # tiles, factors, sums
    ya = mem.alloc(n * m * 4, poison=0xFF)
    ctas = (m + rows - 1) // rows
    nsteps = k // 256
    splits = int(rng.integers(1, min(3, nsteps) + 1)) if splits is None else splits
    kp, nw, smem = (), meta["warps"], meta["dynamic_smem"]
    if "block_warps" in meta:
        nw = warps or int(rng.choice(meta["block_warps"]))
        smem = nw * meta["ring_bytes_per_warp"] + meta.get("smem_besides_rings", 128)
    if "k_parts" in meta:  # (a power of two dividing the CTA's warps)
        kp = (kparts or 2 ** int(rng.integers(0, (nw & -nw).bit_length())),)
        ctas = -(-m // (meta["rows_per_warp"] * nw // kp[0]))
    ncnt = ctas * meta["warps"] * nz + (3 if fused else 0)
    ca = mem.alloc(np.zeros(ncnt, np.uint32))
    part = mem.alloc(splits * n * m * 4, poison=0xFF)
    tw = (BACKEND[-1].tensor_map(mem, wa, "u32", m, k // 256 * 36, meta["tma_box"][1], meta["tma_box"][0], "none")
          if meta["copy"] == "tma" else wa)  # the cp.async build takes the weight pointer
    tail = (mem.alloc(xm),) if fused else ()
    # gemv_t1.T1_FLAG's builds: the prep's count of CTAs done (k/256 x tokens), as if it ran; reset by the kernel
    rd = (mem.alloc(np.array([k // 256 * meta["tokens"], 0], np.uint32)),) if meta.get("ready_flag") else ()
    _run(ptx, (ctas, splits, nz), (32 * nw,), (tw, *acts, ya, m, k, n, part, ca, *tail, *kp, *rd), mem,
         dynamic_smem=smem, seed=seed, interleave=fused or bool(rd))
    assert not mem.view(ca, np.uint32, (ncnt,)).any(), "split-K / sync counters were not reset"
    assert not rd or not mem.view(rd[0], np.uint32, (2,)).any(), "the ready count was not reset"
    if fused:
        gr = mem.view(acts[0], np.uint8, (want_rec.nbytes,))
        same = _same_records(gr, want_rec, meta["tokens"], order)
        if not same.all():
            return Outcome(meta["name"], False, f"records: {np.count_nonzero(~same)} halves differ", gr, want_rec)
    got = mem.view(ya, np.float32, (n, m)).astype(np.float64)
    want = formats.gemm_ref(fmt, raw, m, k, x)
    if poison_x is not None:  # non-finite exactly where the reference is; an inf gives NaN where the reference
        # has ±inf (d·sc·Σq·x − dmin·m·Σx is inf − inf), as any kernel that factors the min term out
        ok = bool(np.array_equal(np.isfinite(got), np.isfinite(want)))
        return Outcome(meta["name"], ok, "non-finite outputs match" if ok else "non-finite outputs differ", got, want)
    rel = rel_error(got, want, product_scale(fmt, raw, m, k, x))  # (the products' scale: a few outputs may cancel)
    ok = bool(np.isfinite(got).all() and rel <= (1e-3 if meta.get("hi_only") else 1e-5))
    return Outcome(meta["name"], ok, f"relative error {rel:.2e} (T={n}, splits {splits}, kparts {kp}, warps {nw})",
                   got, want)


def gemv_codec_mma_case(ptx: str, meta: dict, rng, shape=None, ntok=None, seed=None, splits=None, poison_x=None,
                        raw=None, kparts=None) -> Outcome:
    """A codec's tensor-core GEMV (kernels/gemv_mma_codec.py): random raw blocks of meta's format (every scale and
    bit pattern: ptxgen.testing.blocks.random_raw; or `raw`), the prep's tiles and factors from the NumPy model
    (to_mma_tiles(x, Q4K_GROUP)), the weights by a tensor map for the TMA build; against the float64 reference,
    relative error ≤ 1e-5; split-K counters back at zero. `poison_x` = (token, k, value): non-finite
    outputs exactly where the reference has them. `kparts`: the warps of a row tile (drawn from 1, 2, .. warps if
    not given)."""
    from ..testing.blocks import random_raw

    fmt, rows, groups = meta["fmt"], meta["rows_per_cta"], meta["token_groups"]
    # m·k/256 a multiple of 8: the weights end on a 16-byte boundary (the TMA build: each row does)
    m, k = shape or (rows * 2 + 8, 2048 if meta.get("copy") == "tma" else 512)
    n = ntok or int(rng.integers(8 * groups - 7, 8 * groups + 1))
    raw = random_raw(fmt, m, k, rng) if raw is None else raw
    x = (rng.standard_normal((n, k)) * rng.choice([1e-3, 1.0, 40.0])).astype(np.float32)
    if poison_x is not None:
        x[poison_x[0], poison_x[1]] = poison_x[2]
    mem = _memory()
    wa = mem.alloc(raw)
    if meta.get("copy") == "tma":  # the 16 rows' step by one box (rows a multiple of 16 bytes)
        wa = BACKEND[-1].tensor_map(mem, wa, "u32", m, formats.get(fmt).row_bytes(k) // 4, meta["tma_box"][1],
                                    meta["tma_box"][0], "none")
    parts = [T4.to_mma_tiles(x[8 * i:8 * i + 8], T4.Q4K_GROUP) for i in range(groups)]  # one prep per 8 tokens
    acts = tuple(mem.alloc(np.concatenate([p_[j] for p_ in parts])) for j in range(2))  # tiles, factors
    ya = mem.alloc(n * m * 4, poison=0xFF)
    ctas = (m + rows - 1) // rows
    nsteps = k // 256
    splits = int(rng.integers(1, min(3, nsteps) + 1)) if splits is None else splits
    kp = ()
    if "k_parts" in meta:
        kp = (kparts or 2 ** int(rng.integers(0, (int(meta["warps"]) & -int(meta["warps"])).bit_length())),)
        ctas = -(-m // (rows // kp[0]))
    ncnt = ctas * meta["warps"]
    ca = mem.alloc(np.zeros(ncnt, np.uint32))
    part = mem.alloc(splits * n * m * 4, poison=0xFF)
    _run(ptx, (ctas, splits), (32 * meta["warps"],), (wa, *acts, ya, m, k, n, part, ca, *kp), mem,
         dynamic_smem=meta["dynamic_smem"], seed=seed)
    assert not mem.view(ca, np.uint32, (ncnt,)).any(), "split-K counters were not reset"
    got = mem.view(ya, np.float32, (n, m)).astype(np.float64)
    return _exact_outcome(meta["name"], got, formats.gemm_ref(fmt, raw, m, k, x), poison_x,
                          f"T={n}, splits {splits}, kparts {kp}")


def gemv_xr_case(ptx: str, meta: dict, rng, shape=None, rows_per_cta=None, seed=None, poison_x=None) -> Outcome:
    """gemv_q4_k_xr (T = 1, the activation in registers): raw Q4_K and the plain fp32 x, a block of 32·ceil(K /
    2048) threads (idle lanes where K / 64 is not a multiple of 32), rows_per_cta rows per CTA (the last CTA
    partial); y NaN-poisoned. Against the float64 reference, relative error ≤ 1e-5; `poison_x` = (k, value)
    plants one value: the outputs are then non-finite exactly where the reference's are."""
    m, k = shape or (45, 1280)
    rpc = rows_per_cta or int(rng.integers(1, 17))
    raw = formats.quantize("q4_K", rng.standard_normal((m, k)).astype(np.float32))
    x = (rng.standard_normal((1, k)) * rng.choice([1e-3, 1.0, 40.0])).astype(np.float32)
    if poison_x is not None:
        x[0, poison_x[0]] = poison_x[1]
    mem = _memory()
    wa, xa, ya = mem.alloc(raw), mem.alloc(x), mem.alloc(m * 4, poison=0xFF)
    threads = 32 * -(-(k // 64) // 32)
    _run(ptx, ((m + rpc - 1) // rpc,), (threads,), (wa, xa, ya, m, k, rpc), mem,
         dynamic_smem=meta["stages"] * 48 * threads, seed=seed)  # the ring for the threads launched, as mul_mat
    got = mem.view(ya, np.float32, (1, m)).astype(np.float64)
    return _exact_outcome(meta["name"], got, formats.gemm_ref("q4_K", raw, m, k, x), poison_x,
                          f"M={m}, K={k}, {rpc} rows per CTA")


def _exact_outcome(name, got, want, poison_x, what) -> Outcome:
    """An exact GEMV's verdict: with a poisoned x, non-finite outputs exactly where the reference has them; else
    finite and within 1e-5 of the float64 reference (relative, Frobenius)."""
    if poison_x is not None:
        ok = bool(np.array_equal(np.isfinite(got), np.isfinite(want)))
        return Outcome(name, ok, "non-finite outputs match" if ok else "non-finite outputs differ", got, want)
    rel = np.linalg.norm(got - want) / np.linalg.norm(want)
    ok = bool(np.isfinite(got).all() and rel <= 1e-5)
    return Outcome(name, ok, f"relative error {rel:.2e} ({what})", got, want)


def gemv_mma_case(ptx: str, meta: dict, rng, shape=None, ntok=None, seed=None, splits=None, poison_x=None) -> Outcome:
    """The tensor-core TQ4_1S GEMV on activation tiles from the NumPy model (to_mma_tiles): against the
    float64 fused reference, relative error ≤ 1e-5; split-K counters back at zero."""
    rows = meta["rows_per_cta"]
    m, k = shape or (rows * 2 + 5, 32 * 20)
    n = ntok or int(rng.integers(1, 9))
    raw = formats.quantize("tq4_1s", rng.standard_normal((m, k)).astype(np.float32))
    x = rng.standard_normal((n, k)).astype(np.float32)
    if poison_x is not None:
        x[poison_x[0], poison_x[1]] = poison_x[2]
    tiles, factors = T4.to_mma_tiles(formats.rht_forward(x))
    mem = _memory()
    wa, ta, fa = mem.alloc(raw), mem.alloc(tiles), mem.alloc(factors)
    ya = mem.alloc(n * m * 4, poison=0xFF)
    ctas = (m + rows - 1) // rows
    nsteps = -(-(k // 32) // meta["lane_cols"])  # a step: lane_cols blocks
    splits = int(rng.integers(1, min(3, nsteps) + 1)) if splits is None else splits
    ca = mem.alloc(np.zeros(ctas * meta["warps"], np.uint32))
    part = mem.alloc(splits * n * m * 4, poison=0xFF)
    tw = BACKEND[-1].tensor_map(mem, wa, "u32", m, k * 20 // 128, meta["tma_box"][1], meta["tma_box"][0], "none")
    _run(ptx, (ctas, splits), (32 * meta["warps"],), (tw, ta, fa, ya, m, k, n, part, ca), mem,
         dynamic_smem=meta["dynamic_smem"], seed=seed)
    assert not mem.view(ca, np.uint32, (ctas * meta["warps"],)).any(), "split-K counters were not reset"
    got = mem.view(ya, np.float32, (n, m)).astype(np.float64)
    want = formats.gemv_tq4_1s_ref(raw, m, k, x)
    if poison_x is not None:  # non-finite x: the same outputs non-finite
        ok = bool(np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(np.isinf(got), np.isinf(want)))
        return Outcome("gemv_tq4_1s_mma", ok, "non-finite outputs match" if ok else "non-finite outputs differ", got, want)
    rel = np.linalg.norm(got - want) / np.linalg.norm(want)
    ok = bool(np.isfinite(got).all() and rel <= 1e-5)
    return Outcome("gemv_tq4_1s_mma", ok, f"relative error {rel:.2e} (T={n}, splits {splits})", got, want)


def _convert_f16(ptx: str, rng, shape=(3, 256), seed=None, permuted=False, x=None) -> Outcome:
    """convert_f16 (or convert_f16_perm: each 64-column chunk in layouts.q4k_rega_k_order): bit for bit numpy's
    fp16 rounding, and the overflow flag exactly when some value leaves fp16's range or a group of 8 is too small
    for it (tiny_groups: the 1e-6 draws)."""
    if x is None:
        t, k = shape
        x = (rng.standard_normal((t, k)) * rng.choice([1e-6, 1.0, 3e4])).astype(np.float32)
        if rng.integers(0, 2):  # one value past fp16's range must raise the flag
            x[rng.integers(0, t), rng.integers(0, k)] = np.float32(7e4)
    x = np.asarray(x, np.float32)
    t, k = x.shape
    mem = _memory()
    xa, fa = mem.alloc(x), mem.alloc(np.zeros(1, np.uint32))
    n8 = x.size // 8
    ya = mem.alloc(n8 * 16, poison=0xFF)
    _run(ptx, ((n8 + 255) // 256,), (256,), (xa, ya, fa, n8), mem, seed=seed)
    got = mem.view(ya, np.uint16, (t, k))
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).view(np.uint16)
        want_flag = int(fp16_flag(x, 8))
    if permuted:
        want = want.reshape(t, k // 64, 64)[:, :, layouts.q4k_rega_k_order()].reshape(t, k)
    flag = int(mem.view(fa, np.uint32, (1,))[0])
    ok = np.array_equal(got, want) and flag == want_flag
    name = "convert_f16_perm" if permuted else "convert_f16"
    return Outcome(name, ok, "bit-exact" if ok else f"{np.count_nonzero(got != want)} differ, flag {flag} "
                   f"(want {want_flag})", got, want)


def _from_f16(ptx: str, rng, shape=(3, 256), seed=None, widen=False, copy=False) -> Outcome:
    """permute_f16 (fp16 x into each 64-column chunk's layouts.q4k_rega_k_order), copy_f16 (as it is) or convert_f32
    (fp16 → fp32): bit for bit, on fp16 values of every scale with an inf and a NaN among them."""
    t, k = shape
    with np.errstate(over="ignore"):
        x = (rng.standard_normal((t, k)) * rng.choice([1e-6, 1.0, 3e4])).astype(np.float16)
    x.reshape(-1)[rng.integers(0, x.size, 2)] = [np.inf, np.nan]
    mem = _memory()
    xa = mem.alloc(x)
    n8 = x.size // 8
    ya = mem.alloc(n8 * (32 if widen else 16), poison=0xFF)
    _run(ptx, ((n8 + 255) // 256,), (256,), (xa, ya, n8), mem, seed=seed)
    if widen:
        got = mem.view(ya, np.uint32, (t, k))
        want = x.astype(np.float32).view(np.uint32)
        same = (got == want) | (np.isnan(got.view(np.float32)) & np.isnan(want.view(np.float32)))
    else:
        got = mem.view(ya, np.uint16, (t, k))
        want = x.view(np.uint16)
        if not copy:
            want = want.reshape(t, k // 64, 64)[:, :, layouts.q4k_rega_k_order()].reshape(t, k)
        same = got == want
    ok = bool(same.all())
    name = "convert_f32" if widen else "copy_f16" if copy else "permute_f16"
    return Outcome(name, ok, "bit-exact" if ok else f"{np.count_nonzero(~same)} differ", got, want)


def moe_gather_case(ptx: str, meta: dict, rng, shape=None, ids=None, per_slot=None, rows=None, tile=32, seed=None,
                    sums=False, x16=False) -> Outcome:
    """moe_gather (_sums): E experts, (T, slots) ids drawn with repeats, empty experts and one out of range (unless
    `ids` is given), x (T, K) or per slot (T, slots, K) with a value past fp16 half the time; `rows` pairs a CTA,
    whole rows of x (a multiple of slots where the slots share x; default drawn, so CTAs split the pairs unevenly).
    The grouping as moe_group's (offsets and the work list exactly as kernels.moe_group.reference, each expert's slice of order a permutation of its pairs); x16 row n bit for bit
    the fp16 of pair order[n]'s x row in the register-A K order, rows past offsets[E] untouched; with `sums` each
    row's sub-block sums as gather_sub_block_sums where finite; NaN rows of y for the bad pairs (others untouched);
    the flag raised exactly when a gathered value (or a sum's hi) leaves fp16. `x16` (moe_gather(_sums)_x16): x is
    fp16 (its value past fp16 an inf), the expectations those of its widening."""
    from ptxgen.kernels.moe_group import reference

    e, t, slots, k = shape or (9, 13, 3, 512)
    m = 5
    if ids is None:
        ids = rng.integers(0, e - 2, (t, slots)).astype(np.int32)  # the last two experts empty
        ids.flat[int(rng.integers(ids.size))] = rng.choice([-1, e])
    ids = np.asarray(ids, np.int32)
    p, k8 = ids.size, k // 8
    per_slot = bool(rng.integers(2)) if per_slot is None else per_slot
    unit = 1 if per_slot else slots  # a CTA's pairs are whole rows of x (moe_gather converts a row once)
    rows = int(rows or unit * rng.integers(1, max(2, p // unit // 2)))
    assert rows % unit == 0, (rows, unit)
    x = (rng.standard_normal((p if per_slot else t, k)) * rng.choice([1e-3, 1.0, 3e3])).astype(np.float32)
    if rng.integers(0, 2):
        x[rng.integers(0, len(x)), rng.integers(0, k)] = np.float32(7e4)
    if rng.integers(0, 3) == 0:  # a row too small for fp16 (convert_f16.too_small) must raise it too
        x[rng.integers(0, len(x))] *= np.float32(1e-6)
    x, xm = _widened(x, x16)
    offsets, groups, work = reference(ids, e, tile)
    mem = _memory()
    ia, xa, fa = mem.alloc(ids), mem.alloc(xm), mem.alloc(np.zeros(1, np.uint32))
    oa, offa = mem.alloc(4 * p, poison=0xFF), mem.alloc(4 * (e + 1), poison=0xFF)
    wa, ya = mem.alloc(4 * (1 + p // tile + e), poison=0xFF), mem.alloc(np.zeros((p, m), np.float32))
    x16a = mem.alloc(2 * p * k, poison=0xFF)
    xsa = (mem.alloc(p * k // 8, poison=0xFF),) if sums else ()
    _run(ptx, (-(-p // rows),), (1024,), (ia, p, e, tile, oa, offa, wa, ya, m, xa, x16a, fa, k8, slots, int(per_slot),
                                          rows) + xsa, mem, seed=seed)
    why = []
    got_off = mem.view(offa, np.uint32, (e + 1,))
    wl = mem.view(wa, np.uint32, (1 + p // tile + e,))
    L = int(wl[0])
    if not np.array_equal(got_off, offsets):
        why.append(f"offsets {got_off} != {offsets}")
    if not np.array_equal(wl[1:1 + L], work):
        why.append(f"work {wl[1:1 + L]} != {work}")
    order = mem.view(oa, np.uint32, (p,))
    for ex, pairs in groups.items():
        if not np.array_equal(np.sort(order[offsets[ex]:offsets[ex + 1]]), pairs):
            why.append(f"expert {ex}'s pairs")
    valid = int(offsets[e])
    src = order[:valid] if per_slot else order[:valid] // slots
    if why:  # a wrong grouping: the rows' check below would index past x
        return Outcome(meta["name"], False, "; ".join(why), None, None)
    rows_f = x[src]
    x16 = mem.view(x16a, np.uint16, (p, k))
    with np.errstate(over="ignore"):
        want = rows_f.astype(np.float16).view(np.uint16)
        want_flag = int(fp16_flag(rows_f, 8))
    want = want.reshape(valid, k // 64, 64)[:, :, layouts.q4k_rega_k_order()].reshape(valid, k)
    if not np.array_equal(x16[:valid], want):
        why.append(f"{np.count_nonzero(x16[:valid] != want)} x16 halves differ")
    if not (x16[valid:] == 0xFFFF).all():
        why.append("x16 rows past offsets[E] written")
    got_parts = [got_off, wl[:1 + L]]
    if sums:
        xs = mem.view(xsa[0], np.uint16, (p, k // 16))
        want_xs = gather_sub_block_sums(rows_f).view(np.uint16)
        with np.errstate(over="ignore", invalid="ignore"):
            want_flag |= int(not np.isfinite(want_xs.view(np.float16)[:, [16 * j + i for j in range(k // 256)
                                                                          for i in range(8)]]).all())
        fin = np.isfinite(want_xs.view(np.float16))  # (where the flag is up the route recomputes: NaN bits vary)
        if not np.array_equal(xs[:valid][fin], want_xs[fin]):
            why.append("sub-block sums differ")
        if not (xs[valid:] == 0xFFFF).all():
            why.append("sums rows past offsets[E] written")
    flag = int(mem.view(fa, np.uint32, (1,))[0])
    if flag != want_flag:
        why.append(f"flag {flag}, want {want_flag}")
    y = mem.view(ya, np.float32, (p, m))
    bad = (ids.reshape(-1) < 0) | (ids.reshape(-1) >= e)
    if not (np.isnan(y[bad]).all() and (y[~bad] == 0).all()):
        why.append("NaN rows")
    # what a GPU run must match byte for byte: the places inside an expert follow the atomics, so the rows by pair
    by_pair = np.argsort(order[:valid], kind="stable")
    got_parts += [np.sort(order[:valid]), x16[:valid][by_pair].reshape(-1).view(np.uint32) if valid else
                  np.zeros(0, np.uint32), y.view(np.uint32).reshape(-1), np.array([flag], np.uint32)]
    if sums and valid:
        got_parts.append(xs[:valid][by_pair][fin[by_pair]].astype(np.uint32))
    got = np.concatenate([np.asarray(g, np.uint32).reshape(-1) for g in got_parts])
    return Outcome(meta["name"], not why, "; ".join(why) or f"{len(groups)} experts with pairs, {valid} rows, "
                   f"{-(-p // rows)} CTAs of {rows} pairs", got, None)


def _fixup(ptx: str, rng, shape=(40, 5, 512), seed=None, flag=None, ctas=3, interleave=False, fmt="q4_K") -> Outcome:
    """mul_mat_fixup_<fmt> behind a GEMM's output: flag clear, y untouched; flag set, the tokens with a value past
    fp16 (a 7e4, an inf, a NaN) or a row too small for it (scaled by 1e-6) recomputed within 1e-5 of the float64
    reference (NaN / inf rows where the reference has them), the other tokens (one of them all zeros) untouched;
    flag and done back at zero either way."""
    m, t, k = shape
    raw = formats.quantize(fmt, rng.standard_normal((m, k)).astype(np.float32))
    x = rng.standard_normal((t, k)).astype(np.float32)
    flagged = bool(rng.integers(0, 2)) if flag is None else bool(flag)
    bad = sorted({int(i) for i in rng.choice(t, size=min(t, 2), replace=False)}) if flagged else []
    big = np.float32(7e4 if fmt != "tq4_1s" else 8e5)  # TQ4_1S: past fp16 after the rotation (÷√32 spread)
    for j, i in enumerate(bad):
        x[i, rng.integers(0, k)] = [big, np.float32(-np.inf), np.float32(np.nan)][(j + int(rng.integers(0, 3))) % 3]
    tiny = None
    rest = [i for i in range(t) if i not in bad]
    if flagged and rest:  # a token too small for fp16 (its row max under convert_f16.TINY_ROW): recomputed too
        tiny = int(rng.choice(rest))
        x[tiny] *= np.float32(1e-6)
        rest.remove(tiny)
    if rest:  # a token of zeros: left alone
        x[int(rng.choice(rest))] = 0
    bad = sorted(bad + ([tiny] if tiny is not None else []))
    y0 = rng.standard_normal((t, m)).astype(np.float32)  # what the GEMM left
    mem = _memory()
    fa, da = mem.alloc(np.array([int(flagged)], np.uint32)), mem.alloc(np.zeros(1, np.uint32))
    wa, xa, ya = mem.alloc(raw), mem.alloc(x), mem.alloc(y0)
    g = max(1, min(t, ctas))
    if fmt == "tq4_1s":  # its fixup sees the rotated activation the GEMM saw; the reference takes x itself
        xa = mem.alloc(formats.rht_forward(x))
    _run(ptx, (g,), (256,), (fa, da, wa, xa, ya, m, k, t), mem, seed=seed, interleave=interleave)
    got = mem.view(ya, np.float32, (t, m)).copy()
    state = np.concatenate([mem.view(fa, np.uint32, (1,)), mem.view(da, np.uint32, (1,))])
    with np.errstate(all="ignore"):
        want = y0.astype(np.float64)
        if bad:
            want[bad] = (formats.gemv_tq4_1s_ref if fmt == "tq4_1s" else  # the product with the rotated x
                         lambda *a: formats.gemm_ref(fmt, *a))(raw, m, k, x[bad])
    fin = np.isfinite(want)
    same_nonfinite = np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(np.isinf(got), np.isinf(want))
    ok_rows = [i for i in range(t) if i not in bad]
    untouched = np.array_equal(got[ok_rows].view(np.uint32), y0[ok_rows].view(np.uint32))
    err = 0.0
    if bad and fin[bad].any():
        g_, w_ = got[bad][fin[bad]].astype(np.float64), want[bad][fin[bad]]
        err = float(np.linalg.norm(g_ - w_) / max(np.linalg.norm(w_), 1e-30))
    # TQ4_1S: the planted 8e5 spreads over its block's 32 rotated values (~1.4e5 each, both signs), whose products
    # cancel in the fp32 sum: 1e-5 of that token's (much smaller) result is below fp32's reach there
    if tiny is not None:  # (its result is far below the poisoned tokens': measured alone)
        err_tiny = float(np.linalg.norm(got[tiny] - want[tiny]) / max(np.linalg.norm(want[tiny]), 1e-300))
        err = max(err, err_tiny if np.isfinite(err_tiny) else np.inf)
    ok = untouched and same_nonfinite and err <= (5e-5 if fmt == "tq4_1s" else 1e-5) and not state.any()
    return Outcome(f"mul_mat_fixup_{fmt.lower()}", ok, f"flag {int(flagged)}, tokens {bad} recomputed (rel err {err:.2e}), others "
                   f"{'untouched' if untouched else 'CHANGED'}, flag/done after {state.tolist()}", got, want)


def gemv_case(ptx: str, meta: dict, rng, shape=None, ntok=None, seed=None, splits=None) -> Outcome:
    """Run a GEMV kernel on random weights in its format; compare with the float64 reference."""
    fmt, tokens, rows = meta["fmt"], meta["tokens"], meta["rows_per_cta"]
    tma = meta.get("copy") == "tma"  # weights through a TMA tensor map: K a multiple of 128
    m, k = shape or ((rows * 3 - 1, 512) if fmt in ("q4_K", "q5_K", "q6_K", "q8_0") else (rows * 3 - 1, 640 if tma else 480))
    n = ntok or tokens
    w = rng.standard_normal((m, k)).astype(np.float32)
    raw = formats.quantize(fmt, w)
    x = rng.standard_normal((n, k)).astype(np.float32)
    fast = meta.get("mode") == "fast"
    a = x if meta.get("fused_rotation") or fmt != "tq4_1s" else formats.rht_forward(x)
    if fast:
        a = formats.quantize("q8_1", a)
    if meta.get("layout") == "lanes":  # what prep_tq4_1s / prep_tq4_1s_q8 / prep_q8_lanes write
        a = T4.to_lanes_q8(a, k) if fast else T4.to_lanes_f32(a)
    mem = _memory()
    wa, aa = mem.alloc(raw), mem.alloc(a)
    ya = mem.alloc(n * m * 4, poison=0xFF)
    grid = ((m + rows - 1) // rows,)
    extra = ()
    if "split_k" in meta:  # split K over gridDim.y; the last warp of each row group sums the splits
        splits = int(rng.integers(1, 4)) if splits is None else splits
        grid = (grid[0], splits)
        nwarps = grid[0] * meta["warps"]
        ca = mem.alloc(np.zeros(nwarps, np.uint32))
        extra = (mem.alloc(splits * n * m * 4, poison=0xFF), ca)
    if tma:  # u32 elements, a box of 160 x rows_per_warp: one step of a warp's rows
        wa = BACKEND[-1].tensor_map(mem, wa, "u32", m, k * 20 // 128, meta["tma_box"][1], meta["tma_box"][0], "none")
    _run(ptx, grid, (32 * meta.get("warps", 8),), (wa, aa, ya, m, k, n, *extra), mem,
         dynamic_smem=meta.get("dynamic_smem", 0), seed=seed)
    if extra:
        assert not mem.view(ca, np.uint32, (nwarps,)).any(), "split-K counters were not reset"
    got = mem.view(ya, np.float32, (n, m)).astype(np.float64)
    if fast and fmt != "tq4_1s":  # int8 x Q8_1: exact integer dots, so only fp32 rounding of the scales, which
        # scales with the products' magnitudes Σ|w||x_q| (a K-quant's scale and min terms may cancel in y)
        want = formats.gemm_q8_1_ref(fmt, raw, m, k, x)
        xq = formats.ggml.dequantize_q8_1(formats.quantize("q8_1", x.reshape(-1, 32))).reshape(x.shape)
        mag = np.abs(xq).astype(np.float64) @ np.abs(formats.dequantize(fmt, raw, (m, k))).astype(np.float64).T
        rel = np.linalg.norm(got - want) / np.linalg.norm(mag)
        ok = bool(np.isfinite(got).all() and rel <= 1e-5)
        return Outcome(meta.get("name", "gemv"), ok, f"error {rel:.2e} of Σ|w||x_q| vs the Q8_1 reference", got, want)
    if fast:  # matches its own integer model tightly, and the exact result within the fork's NMSE bar
        exact = formats.gemv_tq4_1s_ref(raw, m, k, x)
        want = formats.gemv_tq4_1s_fast_ref(raw, m, k, x)
        rel = np.linalg.norm(got - want) / np.linalg.norm(want)
        nmse = np.linalg.norm(got - exact) ** 2 / np.linalg.norm(exact) ** 2
        ok = bool(np.isfinite(got).all() and rel <= 1e-5 and nmse <= 5e-4)
        return Outcome(meta.get("name", "gemv"), ok, f"relative error {rel:.2e} vs the int8 model, NMSE {nmse:.1e} vs exact",
                       got, want)
    want = formats.gemv_tq4_1s_ref(raw, m, k, x) if fmt == "tq4_1s" else formats.gemm_ref(fmt, raw, m, k, x)
    rel = np.linalg.norm(got - want) / np.linalg.norm(want)
    ok = bool(np.isfinite(got).all() and rel <= 1e-5)
    return Outcome(meta.get("name", "gemv"), ok, f"relative error {rel:.2e}", got, want)


def _with_meta(case, name, shape_len=None):
    """A harness that runs `case` with the kernel's manifest meta as built for the PTX's `.target` (meta may
    differ by arch, and a kernel may exist for one arch only: the TMA-fed TQ4_1S GEMV is sm_90a's)."""
    def run(ptx, rng, seed=None, **kw):
        from ..arch import get_arch
        from ..kernels import get_kernel

        if shape_len and "shape" in kw and len(kw["shape"]) != shape_len:
            raise ValueError(f"{name}: the harness shape has {shape_len} numbers")
        target = re.search(r"^\s*\.target\s+(sm_\w+)", ptx, re.M)
        arch = get_arch(target.group(1) if target else "sm_89")
        meta = dict(get_kernel(name).for_arch(arch).meta, name=name)
        return case(ptx, meta, rng, seed=seed, **kw)
    return run


def _gemv(name):
    return _with_meta(gemv_case, name, 2)


def _mmq_scratch(mem, t, m, k, bn, bm, splits, tile_partials=False):
    """What every MMQ launch takes after its operands (ptxgen.kernels.mmq._mmq_params): y (NaN-poisoned), the
    work queue, split-K partials (splits x T x M, or `tile_partials`: splits x tiles x bm·bn, fragment order)
    and tile counters. Returns (y, tiles, the parameter tail from m on, the scratch to check with _mmq_result)."""
    ya, qa = mem.alloc(t * m * 4, poison=0xFF), mem.alloc(8, poison=0)
    tiles_n = (t + bn - 1) // bn
    tiles = tiles_n * ((m + bm - 1) // bm)
    part_floats = splits * (tiles * bm * bn if tile_partials else t * m)
    pa, ca = mem.alloc(part_floats * 4, poison=0xFF), mem.alloc(4 * tiles, poison=0)
    per = -(-(k // 64) // splits)
    return ya, tiles, (m, k, t, per, qa, tiles_n, splits, pa, ca), (qa, pa, ca)


def _mmq_result(mem, ya, tiles, scratch, t, m, splits):
    """After an MMQ launch: the queue and the tile counters are back at zero; y (float64)."""
    qa, pa, ca = scratch
    assert not mem.view(qa, np.uint32, (2,)).any(), "the work queue was not reset by the last CTA"
    assert not mem.view(ca, np.uint32, (tiles,)).any(), "the split-K counters were not reset"
    return mem.view(ya, np.float32, (t, m)).astype(np.float64)


def mmq_case(ptx: str, meta: dict, rng, shape=None, seed=None, scale=1.0, splits=1, whole=None, per=None, ctas=3,
             interleave=False, run_seed=None, poison_x=None, spread=None) -> Outcome:
    """Run the fp16 mma.sync MMQ on random weights of its format (meta fmt: Q4_K, or a codec the build decodes with
    its run8) quantized as ggml does, and fp32 activations (the _x16 builds: converted to fp16 first, as convert_f16
    does; Q4_K's sm_120a builds take the weights, and fp16 x, as TMA tensor maps); float64 reference. Its queue holds the first `whole` tiles over all of K, then the others in `splits` K ranges of `per`
    K-steps (default: every tile split when splits > 1, evenly); the kernel's own fixup must leave y complete and the
    tile counters zero. `ctas` persistent CTAs share the queue (one after another, or taking turns with `interleave`,
    in an order `run_seed` draws). `poison_x` = (t, k, value) plants one value in x: the overflow flag must be up
    exactly when it is not finite in fp16 (the caller then recomputes exactly), and the result within the bar
    otherwise. `spread`: the split fixup (default: the runtime's rule, ops.mmq_spread_fixup, with `ctas` CTAs)."""
    m, t, k = shape or (meta["bm"] + 3, meta["bn"] + 5, 512)
    fmt = meta.get("fmt", "q4_K")
    w = rng.standard_normal((m, k)).astype(np.float32)
    raw = formats.quantize(fmt, w)
    x = (rng.standard_normal((t, k)) * scale).astype(np.float32)
    if poison_x is not None:
        x[poison_x[0], poison_x[1]] = poison_x[2]
    xk = formats.rht_forward(x) if fmt == "tq4_1s" else x  # TQ4_1S: the kernel sees the rotated x (mul_mat's
    # route rotates first); the reference takes x itself
    x16 = meta.get("x_layout", "").startswith("fp16")  # the _x16 builds read convert_f16's output
    with np.errstate(over="ignore"):
        # (the _x16 builds: inf in the accumulators only; the converting builds: 4 values of a unit too small for
        # fp16 too, _f16_activations' tiny)
        want_flag = not np.isfinite(xk.astype(np.float16)).all() if x16 else fp16_flag(xk, 4)
    mem = _memory()
    with np.errstate(over="ignore"):
        wa, xa, fa = mem.alloc(raw), mem.alloc(xk.astype(np.float16) if x16 else xk), mem.alloc(4, poison=0)
    ops = (wa, xa)
    if "tensormaps" in meta:  # sm_120a: the weights (and fp16 x) through TMA, the maps as the runtime encodes them
        ops = (BACKEND[-1].tensor_map(mem, wa, "u8", m, k // 256 * 144, 128, 16, "none"),
               BACKEND[-1].tensor_map(mem, xa, "f16", t, k, meta["bn"], 64, "128B") if x16 else xa)
    ya, tiles, tail, scratch = _mmq_scratch(mem, t, m, k, meta["bn"], meta["bm"], splits, tile_partials=True)
    whole = (0 if splits > 1 else tiles) if whole is None else whole
    if per is not None:
        assert -(-(k // 64) // per) == splits, "per and splits disagree"
        tail = (*tail[:3], per, *tail[4:])
    items = whole + (tiles - whole) * splits
    grid = max(1, min(items, ctas))
    if spread is None:
        from ptxgen.runtime.ops import mmq_spread_fixup

        spread = mmq_spread_fixup(tiles - whole, splits, grid)
    _run(ptx, (grid,), (256,), (*ops, ya, fa, *tail, whole, int(spread)), mem,
         dynamic_smem=meta["dynamic_smem"], seed=seed if run_seed is None else run_seed, interleave=interleave)
    got = _mmq_result(mem, ya, tiles, scratch, t, m, splits)
    flag = int(mem.view(fa, np.uint32, (1,))[0])
    if bool(flag) != want_flag:
        return Outcome(meta.get("name", "mmq"), False, f"overflow flag {flag}, expected {int(want_flag)}", None, None)
    if want_flag:
        return Outcome(meta.get("name", "mmq"), True, "overflow flagged (the caller recomputes)", None, None)
    want = formats.gemm_ref(fmt, raw, m, k, x)
    rel = rel_error(got, want, product_scale(fmt, raw, m, k, x))  # fp16 x: scaled by the products (testing.accuracy)
    ok = bool(np.isfinite(got).all() and rel <= 1e-3)  # the flag was checked above (down: no overflow)
    return Outcome(meta.get("name", "mmq"), ok, f"relative error {rel:.2e}, overflow flag {flag}, {splits} split(s)",
                   got, want)


def mmq_q8_case(ptx: str, meta: dict, rng, shape=None, seed=None, splits=1, scale=1.0, poison_x=None) -> Outcome:
    """The Q8_1 MMQ (int8 mma.sync): fp32 activations quantized inside the kernel (fused) or first (`_pre`
    reads `ggml.q8_1_mmq_layout`); a few persistent CTAs share the queue. Within 1e-5 of the float64 product
    with the Q8_1-rounded activations (`formats.gemm_q8_1_ref`). With splits > 1 the kernel's own fixup (the
    last CTA of a tile sums the partials) must leave y complete and the counters zero. `poison_x` = (t, k,
    value) plants one value in x."""
    m, t, k = shape or (meta["bm"] + 3, meta["bn"] + 5, 512)
    raw = formats.quantize("q4_K", rng.standard_normal((m, k)).astype(np.float32))
    x = (rng.standard_normal((t, k)) * scale).astype(np.float32)
    if poison_x is not None:
        x[poison_x[0], poison_x[1]] = poison_x[2]
    fused = meta["x_layout"].startswith("fp32")
    mem = _memory()
    wa = mem.alloc(raw)
    xa = mem.alloc(x if fused else formats.ggml.q8_1_mmq_layout(formats.quantize("q8_1", x)))
    fa = mem.alloc(4, poison=0)
    ya, tiles, tail, scratch = _mmq_scratch(mem, t, m, k, meta["bn"], meta["bm"], splits)
    _run(ptx, (max(1, min(tiles * splits, 3)),), (256,), (wa, xa, ya, fa, *tail), mem,
         dynamic_smem=meta["dynamic_smem"], seed=seed)
    got = _mmq_result(mem, ya, tiles, scratch, t, m, splits)
    flag = int(mem.view(fa, np.uint32, (1,))[0])
    if fused:  # the flag is up exactly when some block's d overflows fp16 (amax/127 > 65504, amax finite)
        amax = np.abs(x.reshape(-1, 32)).max(axis=1)
        with np.errstate(over="ignore", invalid="ignore"):
            want_flag = bool((np.isfinite(amax) & ((amax / np.float32(127)).astype(np.float16) == np.inf)).any())
        if bool(flag) != want_flag:
            return Outcome(meta.get("name", "mmq"), False, f"overflow flag {flag}, expected {int(want_flag)}", None, None)
        if want_flag:
            return Outcome(meta.get("name", "mmq"), True, "overflow flagged (the caller recomputes)", None, None)
    want = formats.gemm_q8_1_ref("q4_K", raw, m, k, x)
    if poison_x is not None:  # NaN/Inf: the same outputs non-finite as in the reference, the rest within the bar
        fin = np.isfinite(want)
        same = bool((np.isfinite(got) == fin).all())
        rel = np.linalg.norm((got - want)[fin]) / np.linalg.norm(want[fin])
        return Outcome(meta.get("name", "mmq"), same and rel <= 1e-5,
                       f"non-finite pattern {'matches' if same else 'differs'}, relative error {rel:.2e}", got, want)
    rel = np.linalg.norm(got - want) / np.linalg.norm(want)
    ok = bool(np.isfinite(got).all() and rel <= 1e-5)
    return Outcome(meta.get("name", "mmq"), ok, f"relative error {rel:.2e} vs the Q8_1 reference ({splits} split(s))",
                   got, want)


def _ra_min_k(fmt: str, start: int = 512) -> int:
    """The smallest K ≥ start whose raw rows of `fmt` are 16-byte multiples (a tensor map's row stride): Q6_K's 2048."""
    return next(k for k in range(start, 1 << 16, 256) if formats.get(fmt).row_bytes(k) % 16 == 0)


def gather_sub_block_sums(rows: np.ndarray) -> np.ndarray:
    """moe_gather_sums' Σx of fp32 rows (P x K) as the kernel forms them: each group of 8 input columns'
    fp16 values summed in fp32 in column order, a sub-block's 4 groups as (g0 + g1) + (g2 + g3) (shfl.bfly 1, 2), split
    into fp16 hi and lo: [P][K / 16] halves, super-block j's sub-block i at 16j + i (hi) and 16j + 8 + i (lo)."""
    p, k = rows.shape
    with np.errstate(over="ignore", invalid="ignore"):
        v = rows.astype(np.float16).astype(np.float32).reshape(p, k // 8, 8)
        g = v[..., 0]
        for c in range(1, 8):
            g = (g + v[..., c]).astype(np.float32)
        g = g.reshape(p, k // 32, 4)
        tot = ((g[..., 0] + g[..., 1]).astype(np.float32) + (g[..., 2] + g[..., 3]).astype(np.float32)).astype(np.float32)
        hi = tot.astype(np.float16)
        lo = (tot - hi.astype(np.float32)).astype(np.float16)
    out = np.zeros((p, k // 256, 16), np.float16)
    out[:, :, :8] = hi.reshape(p, k // 256, 8)
    out[:, :, 8:] = lo.reshape(p, k // 256, 8)
    return out.reshape(p, k // 16)


def mmq_wgmma_case(ptx: str, meta: dict, rng, shape=None, seed=None, splits=1, ctas=2, interleave=False,
                   run_seed=None, poison_x=None, tiny_token=None) -> Outcome:
    """The sm_90a MMQ: raw Q4_K and fp16 activations reach it through TMA tensor maps (encoded for the
    emulator from the runtime's arguments); `ctas` persistent CTAs share the work queue (one after another, or
    taking turns with `interleave`: then the CTAs claim items in a seed-drawn order and a tile's splits arrive in
    any order; `run_seed` draws that order and the emulator's other choices, `seed` by default, so the same inputs
    can meet several orders). With splits > 1 the kernel's own fixup (partials in fragment order, the last CTA of a tile sums
    them) must leave y complete and the tile counters zero. The converting builds (meta "convert": fp32 x in, the
    producer warpgroup's idle warps write the fp16 copy the TMA reads) run interleaved whenever there are two CTAs or
    more (a CTA's TMA thread waits for chunks other CTAs convert); their fp16 copy must be bit for bit
    convert_f16_perm's, the x_ready counters back at zero, and the overflow flag up exactly when some x is not finite
    in fp16 (`poison_x` = (t, k, value) plants one value) or a group of its values is too small for fp16
    (`tiny_token`: that token's row scaled by 1e-6)."""
    bn, fmt = meta["bn"], meta.get("fmt", "q4_K")  # another codec: its raw blocks in boxes of meta["tma_box"]
    # (row groups: M whole groups, 8 · 17, and K = 768, rows of 630 bytes that a row map could not take)
    m, t, k = shape or ((136, bn + 5, 768) if meta.get("row_group", 1) > 1 else
                        (128 + 3, bn + 5, _ra_min_k(meta.get("fmt", "q4_K"))))
    raw = formats.quantize(fmt, rng.standard_normal((m, k)).astype(np.float32))
    x = rng.standard_normal((t, k)).astype(np.float32)
    if tiny_token is not None:
        x[tiny_token] *= np.float32(1e-6)
    if poison_x is not None:
        x[poison_x[0], poison_x[1]] = poison_x[2]
    xk = formats.rht_forward(x) if fmt == "tq4_1s" else x  # TQ4_1S: the kernel sees the rotated x (mul_mat's
    # route rotates first); the reference takes x itself
    mem = _memory()
    with np.errstate(over="ignore", invalid="ignore"):
        x16 = xk.astype(np.float16)  # convert_f16 rounds to nearest even too
        want_flag = not np.isfinite(x16).all()
    if "q4k_rega_k_order" in meta.get("activations", ""):  # the register-A build's K order (convert_f16_perm)
        x16 = np.ascontiguousarray(x16.reshape(t, k // 64, 64)[:, :, layouts.q4k_rega_k_order()].reshape(t, k))
    cx = "convert" in meta
    if cx and not want_flag:  # its converters test 8 values of a group in x16's order (convert_f16.too_small)
        xk_stored = xk
        if "q4k_rega_k_order" in meta.get("activations", ""):
            xk_stored = xk.reshape(t, k // 64, 64)[:, :, layouts.q4k_rega_k_order()].reshape(t, k)
        want_flag = fp16_flag(xk_stored, 8)
    xa = mem.alloc(t * k * 2, poison=0xFF) if cx else mem.alloc(x16)  # cx: NaN until written
    if meta.get("f16a"):  # the weights as dequantize_<fmt> writes them: fp16 rows (M, K), 128B-swizzled boxes
        with np.errstate(over="ignore", invalid="ignore"):
            w16 = formats.dequantize(fmt, raw, (m, k)).astype(np.float16)
        wa = mem.alloc(w16)
        tw = BACKEND[-1].tensor_map(mem, wa, "f16", m, k, 128, 64, "128B")
    elif "prepared" in meta:  # A fragments as dequantize_q4_k_frags writes them (its own test checks it bit for bit)
        frags = layouts.q4k_prepared_fragments(raw, m, k, fmt)
        wa = mem.alloc(frags)
        tw = BACKEND[-1].tensor_map(mem, wa, "u8", frags.shape[0], 256, 64, 256, "none")
    else:
        wa = mem.alloc(raw)
        tw = weight_rows_map(mem, wa, meta, m, formats.get(fmt).row_bytes(k))
    cl = meta.get("cluster", (1, 1, 1))[0]  # clusters: each rank loads bn / cl rows of the activation tile
    tx = BACKEND[-1].tensor_map(mem, xa, "f16", t, k, bn // cl, 64, "128B")
    ya, tiles, tail, scratch = _mmq_scratch(mem, t, m, k, bn, 128, splits, tile_partials=True)
    # whole clusters (the kernel walks items per cluster); cl = 1: one CTA per item at most
    grid = cl * max(1, min(-(-tiles // cl) * splits, ctas // cl))
    cluster = (cl, 1, 1) if cl > 1 else None
    if "cluster_split" in meta:  # cluster split-K: one cluster a tile, its `splits` CTAs the tile's K splits
        grid, cluster = tiles * splits, (splits, 1, 1)
    if "stream" in meta:  # stream-K: `ctas` chunks of L = ceil(U / ctas) K-steps, two partial planes a chunk (one
        # more chunk where `ctas` would cut only at tile boundaries: the default case cuts tiles too)
        units = tiles * (k // 64)
        per = -(-units // ctas)
        if per % (k // 64) == 0:
            per = -(-units // (ctas + 1))
        grid = -(-units // per)
        pa = mem.alloc(2 * grid * 128 * bn * 4, poison=0xFF)
        tail = tail[:3] + (per,) + tail[4:6] + (0, pa) + tail[8:]
        scratch = (scratch[0], pa, scratch[2])
    extra = ()
    if cx:
        nready = -(-t // bn) * -(-(k // 64) // meta["convert_steps"])
        x32a, ready, fa = mem.alloc(xk), mem.alloc(4 * nready, poison=0), mem.alloc(4, poison=0)
        extra = (x32a, xa, ready, fa)
        interleave = interleave or grid > 1
    _run(ptx, (grid,), (384,), (tw, tx, ya, *tail, *extra), mem, dynamic_smem=meta["dynamic_smem"],
         seed=seed if run_seed is None else run_seed, interleave=interleave, cluster=cluster)
    got = _mmq_result(mem, ya, tiles, scratch, t, m, splits)
    if cx:
        name = meta.get("name", "mmq")
        if mem.view(ready, np.uint32, (nready,)).any():
            return Outcome(name, False, "the x_ready counters were not reset by the last CTA", got, None)
        conv = mem.view(xa, np.uint16, (t, k))
        if not np.array_equal(conv, x16.view(np.uint16)):
            return Outcome(name, False, f"the fp16 copy of x differs from convert_f16_perm's in "
                           f"{np.count_nonzero(conv != x16.view(np.uint16))} values", got, None)
        flag = int(mem.view(fa, np.uint32, (1,))[0])
        if bool(flag) != want_flag:
            return Outcome(name, False, f"overflow flag {flag}, expected {int(want_flag)}", got, None)
        if want_flag:
            return Outcome(name, True, "overflow flagged (the caller recomputes)", got, None)
    want = formats.gemm_ref(fmt, raw, m, k, x)
    rel = rel_error(got, want, product_scale(fmt, raw, m, k, x))  # fp16 x: scaled by the products (testing.accuracy)
    ok = bool(np.isfinite(got).all() and rel <= 1e-3)
    how = f"{grid} stream-K chunks of {tail[3]} K-steps" if "stream" in meta else f"{splits} split(s)"
    return Outcome(meta.get("name", "mmq"), ok, f"relative error {rel:.2e} ({how})", got, want)


def _mmq_wgmma(name):
    def run(ptx, rng, seed=None, **kw):
        from ..arch import get_arch
        from ..kernels import get_kernel

        meta = dict(get_kernel(name).for_arch(get_arch("sm_90a")).meta, name=name)
        return mmq_wgmma_case(ptx, meta, rng, seed=seed, **kw)
    return run


def _mmq(name):
    return _with_meta(mmq_case, name, 3)  # shape (M, T, K)


HARNESSES: dict[str, Callable] = {"quantize_q8_1": _q8_1, "quantize_q8_1_mmq": _q8_1_mmq,
                                  "dequantize_q4_k_frags": _frags("q4_K"), "rotate_tq4_1s": _rotate,
                                  "rotate_tq4_1s_f16": _rotate_f16,
                                  "convert_f16": _convert_f16, "prep_tq4_1s": _prep(False), "prep_tq4_1s_q8": _prep(True),
                                  "prep_q8_lanes": _prep(True, rotate=False), "prep_f32_lanes": _prep(False, rotate=False),
                                  "prep_tq4_1s_x16": _prep(False, x16=True), "prep_tq4_1s_q8_x16": _prep(True, x16=True),
                                  "prep_q8_lanes_x16": _prep(True, rotate=False, x16=True),
                                  "prep_f32_lanes_x16": _prep(False, rotate=False, x16=True)}
for _n in [f"gemv_{f}_t{t}{s}" for f in ("tq4_1s", "q4_k") for t in (1, 2, 4, 8) for s in ("", "_fused")
           if not ((f == "q4_k" or t == 8) and s)]:
    HARNESSES[_n] = _gemv(_n)
HARNESSES["gemv_tq4_1s_xt_t1"] = _gemv("gemv_tq4_1s_xt_t1")
for _t in (1, 2, 4, 8):
    for _n in (f"gemv_tq4_1s_fast_t{_t}", f"gemv_q4_k_fast_t{_t}", f"gemv_q5_k_fast_t{_t}", f"gemv_q6_k_fast_t{_t}", f"gemv_q8_0_t{_t}",
               f"gemv_tq4_1s_tma_t{_t}"):
        HARNESSES[_n] = _gemv(_n)
for _bn in (32, 64, 128):
    for _f in ("q4_k", "q5_k", "q6_k", "q8_0", "tq4_1s"):  # Q4_K's raw ring, the codecs' run8 (mmq.F16_CODECS)
        for _n in (f"mmq_{_f}_f16_n{_bn}", f"mmq_{_f}_f16_n{_bn}_x16"):
            HARNESSES[_n] = _mmq(_n)
for _bn in (16, 32, 64):
    for _n in (f"mmq_q4_k_q8_n{_bn}", f"mmq_q4_k_q8_n{_bn}_pre"):
        HARNESSES[_n] = _with_meta(mmq_q8_case, _n, 3)
HARNESSES["prep_tq4_1s_mma"] = _prep_mma
HARNESSES["prep_tq4_1s_mma_x16"] = functools.partial(_prep_mma, x16=True)
HARNESSES["gemv_tq4_1s_mma"] = _with_meta(gemv_mma_case, "gemv_tq4_1s_mma", 2)
HARNESSES["gemv_tq4_1s_mma_m16"] = _with_meta(gemv_mma_case, "gemv_tq4_1s_mma_m16", 2)
HARNESSES["prep_mma_f16"] = _prep_mma_f16
HARNESSES["prep_mma_f16_x16"] = functools.partial(_prep_mma_f16, x16=True)
HARNESSES["gemv_q4_k_mma"] = _with_meta(gemv_q4k_mma_case, "gemv_q4_k_mma", 2)
HARNESSES["gemv_q4_k_mma_n16"] = _with_meta(gemv_q4k_mma_case, "gemv_q4_k_mma_n16", 2)
HARNESSES["gemv_q4_k_xr"] = _with_meta(gemv_xr_case, "gemv_q4_k_xr", 2)
for _f in ("q6_k", "q8_0"):
    for _n in (f"gemv_{_f}_mma", f"gemv_{_f}_mma_n16", f"gemv_{_f}_mma_tma"):
        HARNESSES[_n] = _with_meta(gemv_codec_mma_case, _n, 2)
for _nt, _h in [(_nt, False) for _nt in T4.Q4K_RECORD_TOKENS] + [(T4.Q4K_HI_TOKENS, True)]:
    _sfx = f"t{_nt}{'h' if _h else ''}"
    for _f in ("q4_k", "q5_k"):  # (gemv_t1.FEW_FORMATS: the same builds with Q5_K's register decode)
        HARNESSES[f"gemv_{_f}_mma_{_sfx}"] = _with_meta(gemv_q4k_mma_case, f"gemv_{_f}_mma_{_sfx}", 2)
    HARNESSES[f"prep_q4k_{_sfx}"] = _prep_q4k_records(_nt, _h)
    if not _h:  # the mma_block codecs' builds (gemv_t1.CODEC_FORMATS) on their records
        for _f in ("q6_k", "q8_0"):
            HARNESSES[f"gemv_{_f}_mma_{_sfx}"] = _with_meta(gemv_q4k_mma_case, f"gemv_{_f}_mma_{_sfx}", 2)
        HARNESSES[f"prep_sub16_{_sfx}"] = _prep_q4k_records(_nt, False, "sub16")
        HARNESSES[f"gemv_tq4_1s_mma_{_sfx}"] = _with_meta(gemv_q4k_mma_case, f"gemv_tq4_1s_mma_{_sfx}", 2)
        HARNESSES[f"prep_rot16_{_sfx}"] = _prep_q4k_records(_nt, False, "rot16")
        for _f in ("q4_k", "q5_k", "q6_k", "q8_0"):
            HARNESSES[f"gemv_{_f}_i8_{_sfx}"] = _with_meta(gemv_q4k_mma_case, f"gemv_{_f}_i8_{_sfx}", 2)
        HARNESSES[f"prep_q4k_i8_{_sfx}"] = _prep_q4k_records(_nt, False, "i8")
        HARNESSES[f"prep_q6k_i8_{_sfx}"] = _prep_q4k_records(_nt, False, "i8q6")
        for _o, _p in (("q4k", "q4k"), ("sub16", "sub16"), ("i8", "q4k_i8"), ("i8q6", "q6k_i8")):  # on fp16 x
            HARNESSES[f"prep_{_p}_{_sfx}_x16"] = _prep_q4k_records(_nt, False, _o, x16=True)
for _nt in (1, 2, 4):
    for _f in ("q4_k", "q5_k", "q6_k", "q8_0"):
        HARNESSES[f"gemv_{_f}_mma_t{_nt}_fused"] = _with_meta(gemv_q4k_mma_case, f"gemv_{_f}_mma_t{_nt}_fused", 2)
    for _f in ("q4_k", "q5_k", "q6_k", "q8_0"):
        HARNESSES[f"gemv_{_f}_i8_t{_nt}_fused"] = _with_meta(gemv_q4k_mma_case, f"gemv_{_f}_i8_t{_nt}_fused", 2)
    for _n in [f"gemv_{_f}_mma_t{_nt}_fused_x16" for _f in ("q4_k", "q5_k", "q6_k", "q8_0")] + [
            f"gemv_{_f}_i8_t{_nt}_fused_x16" for _f in ("q4_k", "q5_k", "q6_k", "q8_0")]:  # the twins on fp16 x
        HARNESSES[_n] = _with_meta(gemv_q4k_mma_case, _n, 2)
for _c in (T4.Q4K_HI_TOKENS, T4.Q4K_SKINNY_COLUMNS):
    HARNESSES[f"mmq_q4_k_rega_n{_c}"] = _with_meta(gemv_q4k_mma_case, f"mmq_q4_k_rega_n{_c}", 2)
for _f in ("q4_k", "q5_k", "q6_k", "q8_0", "tq4_1s"):  # the exact builds with records shared by the CTA's warps
    # (gemv_t1.SHARED_FORMATS, SHARED_NOTE)
    for _nt in (4, 8):
        HARNESSES[f"gemv_{_f}_mma_t{_nt}s"] = _with_meta(gemv_q4k_mma_case, f"gemv_{_f}_mma_t{_nt}s", 2)
HARNESSES[f"mmq_q5_k_rega_n{T4.Q4K_SKINNY_COLUMNS}"] = _with_meta(gemv_q4k_mma_case,
                                                                  f"mmq_q5_k_rega_n{T4.Q4K_SKINNY_COLUMNS}", 2)
HARNESSES[f"prep_q4k_t{T4.Q4K_SKINNY_COLUMNS}h"] = _prep_q4k_records(T4.Q4K_SKINNY_COLUMNS, True)
for _c in (T4.Q4K_HI_TOKENS, T4.Q4K_SKINNY_COLUMNS):  # the hi-only preps on fp16 x
    HARNESSES[f"prep_q4k_t{_c}h_x16"] = _prep_q4k_records(_c, True, x16=True)
for _f in ("q6_k", "q8_0"):  # the mma_block codecs' 9-16-token builds (fp16 activations) on prep_sub16_t16h's records
    HARNESSES[f"gemv_{_f}_mma_t{T4.Q4K_HI_TOKENS}h"] = _with_meta(gemv_q4k_mma_case, f"gemv_{_f}_mma_t{T4.Q4K_HI_TOKENS}h", 2)
HARNESSES[f"prep_sub16_t{T4.Q4K_HI_TOKENS}h"] = _prep_q4k_records(T4.Q4K_HI_TOKENS, True, "sub16")
HARNESSES[f"prep_sub16_t{T4.Q4K_HI_TOKENS}h_x16"] = _prep_q4k_records(T4.Q4K_HI_TOKENS, True, "sub16", x16=True)
for _bn in (32, 64, 128, 256):
    HARNESSES[f"mmq_q4_k_wgmma_n{_bn}"] = _mmq_wgmma(f"mmq_q4_k_wgmma_n{_bn}")
for _bn in (64, 128, 192, 256):
    HARNESSES[f"mmq_q4_k_wgmma_ra_n{_bn}"] = _mmq_wgmma(f"mmq_q4_k_wgmma_ra_n{_bn}")
for _bn in (128, 256):
    HARNESSES[f"mmq_q4_k_wgmma_ra_n{_bn}_mc2"] = _mmq_wgmma(f"mmq_q4_k_wgmma_ra_n{_bn}_mc2")
for _bn in (64, 128, 256):
    HARNESSES[f"mmq_q4_k_wgmma_ra_n{_bn}_cx"] = _mmq_wgmma(f"mmq_q4_k_wgmma_ra_n{_bn}_cx")
for _f in ("q4_k", "q5_k", "q6_k", "q8_0", "tq4_1s"):  # (kernels/mmq.py STREAM_FORMATS, STREAM_TOKEN_TILES)
    for _bn in (128, 256):
        HARNESSES[f"mmq_{_f}_wgmma_ra_n{_bn}_sk"] = _mmq_wgmma(f"mmq_{_f}_wgmma_ra_n{_bn}_sk")
for _f in ("q4_k", "q6_k"):  # (kernels/mmq.py CSPLIT_FORMATS, CSPLIT_TOKEN_TILES)
    for _bn in (64, 128, 256):
        HARNESSES[f"mmq_{_f}_wgmma_ra_n{_bn}_cs"] = _mmq_wgmma(f"mmq_{_f}_wgmma_ra_n{_bn}_cs")
for _bn in (64, 128, 256):  # (kernels/mmq.py ROW_GROUP_FORMATS x RA_CODEC_TOKEN_TILES, with cluster split or not)
    for _sfx in ("_g8", "_g8_cs"):
        HARNESSES[f"mmq_q6_k_wgmma_ra_n{_bn}{_sfx}"] = _mmq_wgmma(f"mmq_q6_k_wgmma_ra_n{_bn}{_sfx}")
for _bn in (256,):
    for _sfx in ("", "_cx"):
        HARNESSES[f"mmq_q4_k_wgmma_pre_n{_bn}{_sfx}"] = _mmq_wgmma(f"mmq_q4_k_wgmma_pre_n{_bn}{_sfx}")
        HARNESSES[f"mmq_q4_k_wgmma_f16a_n{_bn}{_sfx}"] = _mmq_wgmma(f"mmq_q4_k_wgmma_f16a_n{_bn}{_sfx}")
HARNESSES["mul_mat_fixup_q4_k"] = _fixup
for _f in ("q5_K", "q6_K", "q8_0", "tq4_1s"):
    HARNESSES[f"mul_mat_fixup_{_f.lower()}"] = (lambda f: lambda ptx, rng, **kw: _fixup(ptx, rng, fmt=f, **kw))(_f)
HARNESSES["dequantize_tq4_1s_frags"] = _frags("tq4_1s")
for _f in ("q4_K", "q5_K", "q6_K", "q8_0"):
    HARNESSES[f"dequantize_{_f.lower()}"] = _deq(_f)
for _f in ("q5_K", "q6_K", "q8_0"):
    HARNESSES[f"dequantize_{_f.lower()}_frags"] = _frags(_f)
    for _t in (1, 2, 4, 8, 16):
        HARNESSES[f"gemv_{_f.lower()}_f32_t{_t}"] = _with_meta(gemv_codec_case, f"gemv_{_f.lower()}_f32_t{_t}", 2)
HARNESSES["gemv_q4_k_f32_t1"] = _with_meta(gemv_codec_case, "gemv_q4_k_f32_t1", 2)  # (route small_gemv)
for _f in ("q4_k", "q5_k", "q6_k", "q8_0"):  # the one-token builds on fp16 x
    for _t in ((1, 2, 4, 8, 16) if _f != "q4_k" else (1,)):
        HARNESSES[f"gemv_{_f}_f32_t{_t}_x16"] = _with_meta(gemv_codec_case, f"gemv_{_f}_f32_t{_t}_x16", 2)
for _f in ("q4_K", "q5_K", "q6_K", "q8_0", "tq4_1s"):
    HARNESSES[f"gemv_{_f.lower()}_f32_id"] = _with_meta(gemv_id_case, f"gemv_{_f.lower()}_f32_id", 3)
    HARNESSES[f"gemv_{_f.lower()}_f32_idg"] = _with_meta(gemv_id_case, f"gemv_{_f.lower()}_f32_idg", 3)
    if _f != "tq4_1s":  # their twins on fp16 x
        for _s in ("id", "idg"):
            HARNESSES[f"gemv_{_f.lower()}_f32_{_s}_x16"] = _with_meta(gemv_id_case, f"gemv_{_f.lower()}_f32_{_s}_x16", 3)
for _f in ("q4_k", "q5_k", "q6_k", "q8_0", "tq4_1s"):
    for _bn in (32, 64):
        HARNESSES[f"mmq_{_f}_f16_n{_bn}_moe"] = _with_meta(mmq_moe_case, f"mmq_{_f}_f16_n{_bn}_moe", 3)
for _bn in (64, 128, 256):
    for _f in ("q8_0", "q5_k", "q6_k", "tq4_1s"):
        HARNESSES[f"mmq_{_f}_wgmma_ra_n{_bn}"] = _mmq_wgmma(f"mmq_{_f}_wgmma_ra_n{_bn}")
        if _f in ("q8_0", "q5_k"):  # mmq.WGMMA_CX_CODECS x WGMMA_CX_TOKEN_TILES
            HARNESSES[f"mmq_{_f}_wgmma_ra_n{_bn}_cx"] = _mmq_wgmma(f"mmq_{_f}_wgmma_ra_n{_bn}_cx")
for _bn in (32, 64, 128):
    for _f in ("q4_k", "q5_k", "q8_0", "q6_k", "tq4_1s"):
        HARNESSES[f"mmq_{_f}_wgmma_ra_n{_bn}_moe"] = _with_meta(mmq_moe_case, f"mmq_{_f}_wgmma_ra_n{_bn}_moe", 3)
    HARNESSES[f"mmq_q6_k_wgmma_ra_n{_bn}_g8_moe"] = _with_meta(mmq_moe_case, f"mmq_q6_k_wgmma_ra_n{_bn}_g8_moe", 3)
for _bn in (48, 96):  # Q4_K's in-between tiles (mmq.GROUPED_WGMMA_Q4K_TILES; n96: half-block stages)
    HARNESSES[f"mmq_q4_k_wgmma_ra_n{_bn}_moe"] = _with_meta(mmq_moe_case, f"mmq_q4_k_wgmma_ra_n{_bn}_moe", 3)
from ..kernels import mmq as _mmq_tiles  # noqa: E402

for _bn in _mmq_tiles.GROUPED_WIDE_TILES:  # Q4_K's 256-row tiles (four consumer warpgroups)
    HARNESSES[f"mmq_q4_k_wgmma_ra_n{_bn}_m256_moe"] = _with_meta(mmq_moe_case, f"mmq_q4_k_wgmma_ra_n{_bn}_m256_moe", 3)
HARNESSES["moe_group"] = lambda ptx, rng, seed=None, **kw: moe_group_case(ptx, None, rng, seed=seed, **kw)
HARNESSES["moe_check_ids"] = lambda ptx, rng, seed=None, **kw: moe_check_ids_case(ptx, rng, seed=seed, **kw)
HARNESSES["convert_f16_perm"] = lambda ptx, rng, seed=None, **kw: _convert_f16(ptx, rng, seed=seed, permuted=True, **kw)
HARNESSES["permute_f16"] = lambda ptx, rng, seed=None, **kw: _from_f16(ptx, rng, seed=seed, **kw)
HARNESSES["convert_f32"] = lambda ptx, rng, seed=None, **kw: _from_f16(ptx, rng, seed=seed, widen=True, **kw)
HARNESSES["copy_f16"] = lambda ptx, rng, seed=None, **kw: _from_f16(ptx, rng, seed=seed, copy=True, **kw)
HARNESSES["moe_gather"] = lambda ptx, rng, seed=None, **kw: moe_gather_case(ptx, {"name": "moe_gather"}, rng,
                                                                            seed=seed, **kw)
HARNESSES["moe_gather_sums"] = lambda ptx, rng, seed=None, **kw: moe_gather_case(
    ptx, {"name": "moe_gather_sums"}, rng, seed=seed, sums=True, **kw)
HARNESSES["moe_gather_x16"] = lambda ptx, rng, seed=None, **kw: moe_gather_case(
    ptx, {"name": "moe_gather_x16"}, rng, seed=seed, x16=True, **kw)
HARNESSES["moe_gather_sums_x16"] = lambda ptx, rng, seed=None, **kw: moe_gather_case(
    ptx, {"name": "moe_gather_sums_x16"}, rng, seed=seed, sums=True, x16=True, **kw)

# kernels the emulator cannot run yet, with the reason (the test tier lists them as skipped, not passed)
UNCOVERED: dict[str, str] = {}


def check_kernel(name: str, ptx: str, seed: int = 0, **kw) -> Outcome:
    if name not in HARNESSES:
        raise KeyError(f"no emulator harness for {name}; have: {', '.join(HARNESSES)}")
    return HARNESSES[name](ptx, np.random.default_rng(seed), seed=seed, **kw)
for _bn in (16,):  # the integer-weight grouped build (not shipped: mmq.GROUPED_IW_TOKEN_TILES)
    HARNESSES[f"mmq_q4_k_wgmma_iw_n{_bn}_moe"] = _with_meta(mmq_moe_case, f"mmq_q4_k_wgmma_iw_n{_bn}_moe", 3)
