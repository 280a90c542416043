"""L0: the NumPy layout models against the PTX ISA's fragment tables."""
import numpy as np
import pytest

from ptxgen import layouts as L


def test_mma_m16n8k16_a_fragment_table():
    a = L.mma_a_layout("m16n8k16")  # [lane, elem] → (row, col); ISA: a0,a1 row=g; a2,a3 row=g+8; a4.. col+8
    assert a.shape == (32, 8, 2)
    assert tuple(a[5, 0]) == (1, 2) and tuple(a[5, 1]) == (1, 3)
    assert tuple(a[5, 2]) == (9, 2) and tuple(a[5, 4]) == (1, 10) and tuple(a[5, 7]) == (9, 11)
    cells = {tuple(x) for x in a.reshape(-1, 2)}
    assert len(cells) == 16 * 16  # every element exactly once


def test_mma_m16n8k32_s8_fragments():
    a = L.mma_a_layout("m16n8k32")
    assert tuple(a[6, 0]) == (1, 8) and tuple(a[6, 3]) == (1, 11) and tuple(a[6, 4]) == (9, 8)
    assert tuple(a[6, 8]) == (1, 24) and tuple(a[6, 15]) == (9, 27)
    assert len({tuple(x) for x in a.reshape(-1, 2)}) == 16 * 32
    b = L.mma_b_layout("m16n8k32")  # b0..b3: k = tig*4+i, b4..b7: +16; n = groupID
    assert tuple(b[6, 0]) == (8, 1) and tuple(b[6, 4]) == (24, 1)
    assert len({tuple(x) for x in b.reshape(-1, 2)}) == 32 * 8
    b16 = L.mma_b_layout("m16n8k16")
    assert tuple(b16[6, 0]) == (4, 1) and tuple(b16[6, 2]) == (12, 1)
    c = L.mma_c_layout()
    assert tuple(c[6, 0]) == (1, 4) and tuple(c[6, 3]) == (9, 5)
    assert len({tuple(x) for x in c.reshape(-1, 2)}) == 16 * 8


def test_mma_m16n8k16_8bit_fragments():
    """m16n8k16 .s8 / .u8 (ISA: a0..a3 row g, k 4·tig + i; a4..a7 row g + 8; b0..b3 k 4·tig + i, n = g)."""
    a = L.mma_a_layout("m16n8k16", 8)
    assert a.shape == (32, 8, 2)
    assert tuple(a[6, 0]) == (1, 8) and tuple(a[6, 3]) == (1, 11) and tuple(a[6, 4]) == (9, 8)
    assert len({tuple(x) for x in a.reshape(-1, 2)}) == 16 * 16
    b = L.mma_b_layout("m16n8k16", 8)
    assert b.shape == (32, 4, 2) and tuple(b[6, 0]) == (8, 1) and tuple(b[6, 3]) == (11, 1)
    assert len({tuple(x) for x in b.reshape(-1, 2)}) == 16 * 8
    with pytest.raises(ValueError):
        L.mma_a_layout("m16n8k32", 16)


def test_mma_reference_computes_a_times_b():
    rng = np.random.default_rng(0)
    A = rng.integers(-128, 128, (16, 32))
    B = rng.integers(-128, 128, (32, 8))
    la, lb, lc = L.mma_a_layout("m16n8k32"), L.mma_b_layout("m16n8k32"), L.mma_c_layout()
    d = L.mma_reference("m16n8k32", A[la[..., 0], la[..., 1]], B[lb[..., 0], lb[..., 1]], np.zeros((32, 4), np.int64))
    D = np.zeros((16, 8), np.int64)
    D[lc[..., 0], lc[..., 1]] = d
    np.testing.assert_array_equal(D, A @ B)


def test_ldmatrix_layout():
    x4 = L.ldmatrix_layout(4)
    assert tuple(x4[9, 2, 1]) == (2, 2, 3)  # lane 9, reg 2 (matrix 2), half 1 → row 9//4, col 2*(9%4)+1
    t = L.ldmatrix_layout(1, trans=True)
    assert tuple(t[9, 0, 1]) == (0, 3, 2)
    assert L.ldmatrix_address_lane(3, 5) == 29


def test_swizzle_and_descriptor():
    # 128B swizzle: 16-byte chunk index XOR row-in-atom (offset bits [7:9] into [4:6])
    assert L.swizzle(0x80, "128B") == 0x90 and L.swizzle(0x3F0, "128B") == 0x3F0 ^ (7 << 4)
    offs = L.tma_box_offsets(8, 64, 2, "128B")
    assert sorted(offs.reshape(-1).tolist()) == list(range(0, 8 * 128, 2))  # a permutation of the box
    d = L.wgmma_descriptor(0x1000, 16, 1024, "128B")
    assert L.decode_wgmma_descriptor(d) == {"start_addr": 0x1000, "leading_byte_offset": 16,
                                            "stride_byte_offset": 1024, "base_offset": 0, "swizzle": "128B"}


def test_prmt_model_sign_replicate():
    assert L.prmt(0x80_7F_01_FF, 0, 0x3210) == 0x807F01FF
    assert L.prmt(0x80_7F_01_FF, 0, 0x0008 | 0x3210 & 0xFFF0) == 0x807F01FF  # byte 0 (0xFF) sign → 0xFF
    assert L.prmt(0x00_00_00_7F, 0, 0x4448) == 0x00000000  # 0x7F is positive → 0x00
    assert L.prmt_selector(3, 2, 1, 0) == 0x0123 and L.prmt_selector(0, 1, 2, 3, sign=(3,)) == 0xB210


def test_padding_is_bank_conflict_free():
    # ldmatrix rows of a 32-half (64 B) tile padded to 80 B: the 8 row addresses hit distinct 16-byte bank groups
    rows = np.arange(8) * 80
    groups = {tuple(L.smem_bank(r + np.arange(0, 16, 4))) for r in rows}
    assert len(groups) == 8
    unpadded = {tuple(L.smem_bank(r + np.arange(0, 16, 4))) for r in np.arange(8) * 64}
    assert len(unpadded) < 8


@pytest.mark.parametrize("n", [8, 32, 64, 256])
def test_wgmma_accumulator_layout_covers_the_tile_once(n):
    lay = L.wgmma_d_layout(n).reshape(-1, 2)
    assert len({tuple(x) for x in lay}) == 64 * n and lay[:, 0].max() == 63 and lay[:, 1].max() == n - 1


def test_tma_128b_box_is_what_a_k_major_128b_descriptor_reads():
    """A TMA box of 64-element fp16 rows with 128B swizzle lands exactly where a K-major wgmma operand with
    the 128B descriptor (SBO 1024) looks for element (row, k): the MMQ relies on it for the activation tile."""
    box = L.tma_box_offsets(64, 64, 2, "128B")  # [row, col] → byte
    desc = L.wgmma_descriptor(0, 16, 1024, "128B")
    for kk in range(4):  # the four k16 steps: +32 bytes in the descriptor's start address
        reads = L.smem_operand_offsets(desc + 2 * kk, 64, 32)  # [row, byte of the 16 k values]
        want = box[:, 16 * kk:16 * kk + 16]
        np.testing.assert_array_equal(reads[:, 0::2], want)


@pytest.mark.parametrize("stride,offset", [("RAW_ROW", 16), ("RAW_ROW", 32), ("ACT_ROW", 0), ("ACT_ROW", 48),
                                           ("PAD_ROW", 0)])
def test_mmq_ldmatrix_rows_are_bank_conflict_free(stride, offset):
    """The MMQs' ldmatrix phases read 8 rows x 16 bytes: the Q8_1 kernel's A from the raw Q4_K ring (48-byte
    rows, qs at +16 / +32), its B from the int8 tile (80-byte rows, +0..+48), the fp16 tiles (144-byte rows).
    Each phase's 8 row addresses must hit 8 distinct 16-byte bank groups (one wavefront, no conflict)."""
    from ptxgen.kernels import mmq

    rows = np.arange(8) * getattr(mmq, stride) + offset
    groups = {tuple(L.smem_bank(r + np.arange(0, 16, 4))) for r in rows}
    assert len(groups) == 8


def test_register_a_k_order_matches_the_nibble_decode():
    """q4k_rega_k_order against an independent model of what lane t of the register-A MMQ holds: from the qs
    bytes 8t..8t+7 of a row, f16x2 number n is (word n % 4 // 2, shifted by 8 if n is odd, low nibbles for
    n < 4 else high) — (v & 0x000F000F) puts byte 0 in the low half, byte 2 in the high half — and sits in
    wgmma's A fragment at k = 16·(n // 2) + 2t + 8·(n % 2) (+1 for the high half)."""
    from ptxgen.layouts import q4k_rega_k_order

    order = q4k_rega_k_order()
    assert sorted(order.tolist()) == list(range(64))
    qs = np.arange(32, dtype=np.uint8)  # byte i of the 32-byte qs chunk: weights i (low) and 32 + i (high)
    for t in range(4):
        words = qs[8 * t:8 * t + 8].view("<u4")
        for n in range(8):
            v = int(words[n % 4 // 2]) >> (8 * (n % 2))
            lo_byte, hi_byte = v & 0xFF, (v >> 16) & 0xFF  # the bytes whose nibbles the two halves hold
            for e, byte in enumerate((lo_byte, hi_byte)):
                physical = byte + (32 if n >= 4 else 0)
                logical = 16 * (n // 2) + 2 * t + 8 * (n % 2) + e
                assert order[logical] == physical, (t, n, e)
