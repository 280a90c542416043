"""Layouts modelled in NumPy: which lane holds which element of an mma fragment, what ldmatrix delivers,
how a wgmma shared-memory descriptor and the 128-byte swizzle address a tile, where a TMA box lands.

The emitter uses these to place data, the tests check them against the PTX ISA's fragment tables, and the
emulator uses them to execute mma.sync/ldmatrix.
"""
from __future__ import annotations

import numpy as np

LANES = np.arange(32)
GROUP = LANES // 4  # "groupID" in the PTX ISA
TIG = LANES % 4  # "threadID_in_group"


def _per(shape: str, bits: int) -> tuple[int, int]:
    """(elements per 32-bit register, K) of an mma.sync shape whose A / B elements are `bits` wide."""
    k = {"m16n8k16": 16, "m16n8k32": 32}[shape]
    if (shape, bits) not in (("m16n8k16", 16), ("m16n8k16", 8), ("m16n8k32", 8)):
        raise ValueError(f"mma.sync {shape} has no {bits}-bit form here")
    return 32 // bits, k


def mma_a_layout(shape: str, bits: int | None = None) -> np.ndarray:
    """A fragment of mma.sync (row-major A): array [lane, element] → (row, col) of the M×K tile.

    m16n8k16 f16: 8 halves per lane (4 regs × 2); m16n8k16 s8 / u8 (`bits` 8): 8 bytes (2 regs × 4: rows g, g + 8);
    m16n8k32 s8: 16 bytes per lane (4 regs × 4). `bits` defaults to the shape's usual width (16, or 8 for k32)."""
    per, k = _per(shape, bits or (16 if shape == "m16n8k16" else 8))
    n = k // 2  # 16 rows x K over 32 lanes
    i = np.arange(n)
    row = GROUP[:, None] + 8 * ((i[None, :] // per) % 2)
    col = TIG[:, None] * per + (i[None, :] % per) + 4 * per * (i[None, :] // (2 * per))
    return np.stack([row, col], axis=-1)


def mma_b_layout(shape: str, bits: int | None = None) -> np.ndarray:
    """B fragment (column-major K×N tile): [lane, element] → (k, n) (`bits` as mma_a_layout's)."""
    per, k = _per(shape, bits or (16 if shape == "m16n8k16" else 8))
    n = k // 4  # K x 8 columns over 32 lanes
    i = np.arange(n)
    k = TIG[:, None] * per + (i[None, :] % per) + 4 * per * (i[None, :] // per)
    col = np.broadcast_to(GROUP[:, None], k.shape)
    return np.stack([k, col], axis=-1)


def mma_c_layout() -> np.ndarray:
    """C/D fragment (16×8, f32 or s32) of both shapes: [lane, element 0..3] → (row, col)."""
    i = np.arange(4)
    row = GROUP[:, None] + 8 * (i[None, :] // 2)
    col = TIG[:, None] * 2 + (i[None, :] % 2)
    return np.stack([row, col], axis=-1)


def mma_reference(shape: str, a_frag: np.ndarray, b_frag: np.ndarray, c_frag: np.ndarray,
                  bits: int | None = None) -> np.ndarray:
    """Execute one mma.sync on fragments (lane-major arrays) through the layouts: D = A·B + C."""
    m, n, k = 16, 8, {"m16n8k16": 16, "m16n8k32": 32}[shape]
    la, lb, lc = mma_a_layout(shape, bits), mma_b_layout(shape, bits), mma_c_layout()
    acc_t = np.int64 if np.issubdtype(a_frag.dtype, np.integer) else np.float64
    A = np.zeros((m, k), acc_t)
    B = np.zeros((k, n), acc_t)
    A[la[..., 0], la[..., 1]] = a_frag
    B[lb[..., 0], lb[..., 1]] = b_frag
    C = np.zeros((m, n), acc_t)
    C[lc[..., 0], lc[..., 1]] = c_frag
    D = A @ B + C
    return D[lc[..., 0], lc[..., 1]]


def ldmatrix_layout(num: int, trans: bool = False) -> np.ndarray:
    """ldmatrix.m8n8.x{num}.b16: [lane, reg, half] → (matrix, row, col). Row addresses of matrix q come
    from lanes 8q..8q+7 (row r from lane 8q+r)."""
    q = np.arange(num)
    h = np.arange(2)
    row = np.broadcast_to(GROUP[:, None, None], (32, num, 2))
    col = np.broadcast_to(TIG[:, None, None] * 2 + h[None, None, :], (32, num, 2))
    if trans:
        row, col = col, row
    mat = np.broadcast_to(q[None, :, None], (32, num, 2))
    return np.stack([mat, row, col], axis=-1)


def ldmatrix_address_lane(matrix: int, row: int) -> int:
    """Which lane supplies the shared-memory address of `row` of `matrix`."""
    return 8 * matrix + row


# ---------------------------------------------------------------------------------------------------
# shared-memory swizzles and the wgmma descriptor

SWIZZLE_MODES = {"none": 0, "128B": 1, "64B": 2, "32B": 3}
_SWIZZLE_BYTES = {"none": 16, "32B": 32, "64B": 64, "128B": 128}


def swizzle(offset, mode: str = "128B"):
    """Byte offset inside a swizzle atom → swizzled offset (16-byte chunks XOR-ed by the row in the atom),
    the pattern TMA writes and wgmma reads."""
    off = np.asarray(offset)
    if mode == "none":
        return off
    span = _SWIZZLE_BYTES[mode]
    bits = {32: 1, 64: 2, 128: 3}[span]
    return off ^ (((off >> 7) & ((1 << bits) - 1)) << 4)


def wgmma_descriptor(start_addr: int, leading_byte_offset: int, stride_byte_offset: int,
                     swizzle_mode: str = "128B", base_offset: int = 0) -> int:
    """The 64-bit shared-memory matrix descriptor of wgmma (PTX ISA "Matrix Descriptor Format")."""
    for name, v in (("start address", start_addr), ("leading byte offset", leading_byte_offset),
                    ("stride byte offset", stride_byte_offset)):
        if v % 16:
            raise ValueError(f"wgmma descriptor: {name} {v} is not a multiple of 16 bytes")
        if v >> 4 >= 1 << 14:
            raise ValueError(f"wgmma descriptor: {name} {v} does not fit in 14 bits of 16-byte units")
    return ((start_addr >> 4) & 0x3FFF) | (((leading_byte_offset >> 4) & 0x3FFF) << 16) \
        | (((stride_byte_offset >> 4) & 0x3FFF) << 32) | ((base_offset & 7) << 49) \
        | (SWIZZLE_MODES[swizzle_mode] << 62)


def decode_wgmma_descriptor(desc: int) -> dict:
    return {"start_addr": (desc & 0x3FFF) << 4, "leading_byte_offset": ((desc >> 16) & 0x3FFF) << 4,
            "stride_byte_offset": ((desc >> 32) & 0x3FFF) << 4, "base_offset": (desc >> 49) & 7,
            "swizzle": {v: k for k, v in SWIZZLE_MODES.items()}[(desc >> 62) & 3]}


def tma_box_offsets(box_rows: int, box_cols: int, elem_bytes: int, swizzle_mode: str = "128B") -> np.ndarray:
    """Where each element (row, col) of a 2-D TMA box lands in shared memory, in bytes."""
    row_bytes = box_cols * elem_bytes
    if swizzle_mode != "none" and row_bytes > _SWIZZLE_BYTES[swizzle_mode]:
        raise ValueError(f"TMA box inner dimension {row_bytes} B exceeds the {swizzle_mode} swizzle span")
    r, c = np.meshgrid(np.arange(box_rows), np.arange(box_cols), indexing="ij")
    linear = r * row_bytes + c * elem_bytes
    return swizzle(linear, swizzle_mode)


def wgmma_d_layout(n: int) -> np.ndarray:
    """Accumulator of wgmma m64nNk16 (f32): [thread of the warpgroup, register] → (row, col). Each warp
    holds 16 rows; within it the m16n8 C-fragment pattern repeats along N every 4 registers."""
    t = np.arange(128)[:, None]
    i = np.arange(n // 2)[None, :]
    warp, lane = t // 32, t % 32
    row = 16 * warp + lane // 4 + 8 * ((i // 2) % 2)
    col = 8 * (i // 4) + 2 * (lane % 4) + (i % 2)
    return np.stack(np.broadcast_arrays(row, col), axis=-1)


def smem_operand_offsets(desc: int, rows: int, kbytes: int) -> np.ndarray:
    """Shared addresses of a K-major wgmma operand (rows × kbytes bytes) under its matrix descriptor:
    [row, byte] → address. 128B swizzle: 128-byte rows, 8-row groups SBO apart, the swizzle on the
    address; no swizzle: 8×16-byte core matrices, LBO apart along K and SBO apart along rows."""
    d = decode_wgmma_descriptor(desc)
    r = np.arange(rows)[:, None]
    c = np.arange(kbytes)[None, :]
    start, lbo, sbo = d["start_addr"], d["leading_byte_offset"], d["stride_byte_offset"]
    if d["base_offset"]:
        raise NotImplementedError("wgmma descriptor with a non-zero matrix base offset")
    if d["swizzle"] == "128B":
        return swizzle(start + (r // 8) * sbo + (r % 8) * 128 + c, "128B")
    if d["swizzle"] == "none":
        return start + (r // 8) * sbo + (r % 8) * 16 + (c // 16) * lbo + c % 16
    raise NotImplementedError(f"wgmma operand with {d['swizzle']} swizzle")


# ---------------------------------------------------------------------------------------------------
# prmt

def prmt_selector(*lanes: int, sign: tuple = ()) -> int:
    """A `prmt.b32` selector picking bytes `lanes` (0..7) into result bytes 0..3. Bit 3 of a nibble means
    sign-replicate in PTX; it is set only for the positions listed in `sign`."""
    if len(lanes) != 4 or any(not 0 <= v < 8 for v in lanes):
        raise ValueError(f"prmt selector needs 4 byte indices in 0..7, got {lanes}")
    sel = 0
    for pos, v in enumerate(lanes):
        sel |= (v | (8 if pos in sign else 0)) << (4 * pos)
    return sel


def prmt(a: int, b: int, sel: int) -> int:
    """Reference semantics of `prmt.b32` (default mode), sign-replicate included."""
    src = (a & 0xFFFFFFFF) | ((b & 0xFFFFFFFF) << 32)
    out = 0
    for pos in range(4):
        s = (sel >> (4 * pos)) & 0xF
        byte = (src >> (8 * (s & 7))) & 0xFF
        if s & 8:
            byte = 0xFF if byte & 0x80 else 0x00
        out |= byte << (8 * pos)
    return out


def smem_bank(byte_addr) -> np.ndarray:
    """The shared-memory bank (32 banks of 4 bytes) of a byte address."""
    return (np.asarray(byte_addr) // 4) % 32


def q4k_rega_k_order() -> np.ndarray:
    """The K order, within each 64-column chunk, of the register-A wgmma MMQ (mmq_q4_k_wgmma_ra_*): position L of
    the GEMM's K order holds physical column order[L]. wgmma's A fragment is mma.sync m16n8k16's — lane (g, t)
    holds k = 2t + 8p + e of each k16 slice j in register 2j' + p — and lane t dequantizes the qs bytes 8t..8t+7
    of its rows: f16x2 number n = 2j + p is (lop3 trick) bytes (0, 2), (1, 3), (4, 6) or (5, 7) of those 8 (by
    n % 4), low nibbles for n < 4 (columns 8t + byte), high nibbles for n ≥ 4 (32 + 8t + byte). The activation
    is written in this order by convert_f16_perm, so A and B agree."""
    pairs = ((0, 2), (1, 3), (4, 6), (5, 7))
    order = np.empty(64, np.int64)
    for j in range(4):
        for t in range(4):
            for p in range(2):
                n = 2 * j + p
                for e in range(2):
                    order[16 * j + 2 * t + 8 * p + e] = 8 * t + pairs[n % 4][e] + 32 * (n // 4)
    return order


RA_FRAG_BYTES = 4 * 256 * 16  # one (M-tile, K-step) block of q4k_rega_fragments: 4 k16 slices x 256 threads x 16 B


def q4k_rega_fragments(w16: np.ndarray) -> np.ndarray:
    """fp16 weights (M, K) → the register-A wgmma MMQ's A fragments, as dequantize_q4_k_frags writes them for the
    prepared build (mmq_q4_k_wgmma_pre_*): uint8 (tiles_m·ksteps·64, 256), block (M-tile tm, K-step s) = rows
    64·(tm·ksteps + s) .. + 63, that is [k16 slice kk][consumer thread ct][4 registers of f16x2]. Thread ct is lane
    (g, t) of consumer warp cw = ct / 32, rows 16·cw + g and + 8 of the 128-row tile; register j of slice kk holds
    row 16·cw + g + 8·(j & 1) at GEMM-K positions 16·kk + 2t + 8·(j >> 1) + (0, 1), i.e. physical columns
    q4k_rega_k_order() of them (the order convert_f16_perm writes x in). Rows past M are zero."""
    m, k = w16.shape
    if k % 64:
        raise ValueError(f"q4k_rega_fragments: K must be a multiple of 64, got {k}")
    tiles_m, ksteps = -(-m // 128), k // 64
    w = np.zeros((tiles_m * 128, k), np.float16)
    w[:m] = w16
    ct = np.arange(256)
    cw, g, t = ct // 32, (ct % 32) // 4, ct % 4
    kk, j, e = np.arange(4), np.arange(4), np.arange(2)
    row = (16 * cw + g)[None, :, None, None] + 8 * (j & 1)[None, None, :, None]  # (1, 256, 4, 1)
    pos = 16 * kk[:, None, None, None] + 2 * t[None, :, None, None] + 8 * (j >> 1)[None, None, :, None] + e
    col = q4k_rega_k_order()[pos]  # (4, 256, 4, 2)
    blocks = w.reshape(tiles_m, 128, ksteps, 64).transpose(0, 2, 1, 3)  # (tm, s, row, col in the step)
    out = blocks[:, :, np.broadcast_to(row, col.shape), col]  # (tm, s, kk, ct, j, e)
    return np.ascontiguousarray(out).view(np.uint8).reshape(tiles_m * ksteps * 64, 256)


def q4k_prepared_fragments(raw: np.ndarray, m: int, k: int, fmt: str = "q4_K") -> np.ndarray:
    """GGUF bytes (M, K) of `fmt` → what dequantize_<fmt>_frags writes: the weights dequantized as ggml does
    (float32; TQ4_1S: in the rotated domain, C[idx]·d), rounded once to fp16, in q4k_rega_fragments' order."""
    from . import formats

    with np.errstate(over="ignore", invalid="ignore"):
        if fmt == "tq4_1s":
            w = formats.tq4_1s.rotated_values(formats.get(fmt).blocks(raw, (m, k))).reshape(m, k)
        else:
            w = formats.dequantize(fmt, raw, (m, k))
        return q4k_rega_fragments(w.astype(np.float16))
