"""hypothesis strategies that draw raw quantized blocks byte by byte, fp16 scale fields from every finite
half, and matrix shapes at the edges.

Kernel tests reuse these: `raw_matrix("q4_K", m, k)` gives bytes a GGUF file could hold.
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from ptxgen import formats

from .blocks import random_raw  # noqa: F401 (NumPy only: the emulator's harnesses draw with it, no hypothesis)

# where each format keeps its fp16 scale fields (byte offsets inside a block)
HALF_FIELDS = {
    "q4_K": (0, 2),
    "q5_K": (0, 2),
    "q6_K": (208,),
    "q8_0": (0,),
    "q8_1": (0, 2),
    "tq4_1s": (0, 2),
}

_ALL_HALF_BITS = np.arange(1 << 16, dtype=np.uint16)
FINITE_HALF_BITS = _ALL_HALF_BITS[np.isfinite(_ALL_HALF_BITS.view(np.float16))]


# raw blocks fed to kernels that hold the weights in fp16 (the GEMMs) take scales up to this (`max_abs_scale=`):
# past it such a kernel's weight is inf where float64's is finite (mul_mat routes such tensors elsewhere)
fp16_weight_scale = formats.fp16_weight_scale


def half_bits(finite: bool = True, max_abs: float | None = None) -> st.SearchStrategy[int]:
    """fp16 bit patterns: zero, ±subnormal, ±normal up to 65504 (and ±inf/NaN if not `finite`)."""
    pool = FINITE_HALF_BITS if finite else _ALL_HALF_BITS
    if max_abs is not None:
        pool = pool[np.abs(pool.view(np.float16).astype(np.float32)) <= max_abs]
    specials = [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x3C00, 0x7BFF, 0xFBFF]
    specials = [s for s in specials if s in set(pool.tolist())]
    return st.one_of(st.sampled_from(specials), st.sampled_from(pool.tolist()))


@st.composite
def raw_blocks(draw, fmt: str, nblocks: int, finite: bool = True, max_abs_scale: float | None = None):
    """`nblocks` blocks of `fmt` as uint8 (nblocks, block_bytes): payload bytes free, scales drawn as halves."""
    f = formats.get(fmt)
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(nblocks, f.block_bytes), dtype=np.uint8)
    pool = FINITE_HALF_BITS if finite else _ALL_HALF_BITS
    if max_abs_scale is not None:
        pool = pool[np.abs(pool.view(np.float16).astype(np.float32)) <= max_abs_scale]
    for off in HALF_FIELDS[fmt]:
        bits = rng.choice(pool, size=nblocks)
        # make sure the edge values show up: pin one block's field to a drawn special
        bits[draw(st.integers(0, nblocks - 1))] = draw(half_bits(finite, max_abs_scale))
        raw[:, off:off + 2] = bits.astype("<u2").view(np.uint8).reshape(nblocks, 2)
    return raw


def block_counts(max_blocks: int = 8) -> st.SearchStrategy[int]:
    return st.integers(1, max_blocks)


@st.composite
def matrix_shapes(draw, fmt: str, max_rows: int = 70, max_blocks_per_row: int = 4):
    """(M, K) with M from 1 (and not tile multiples) and K from one block."""
    f = formats.get(fmt)
    m = draw(st.one_of(st.sampled_from([1, 2, 7, 16, 31, 33, 64, 65]), st.integers(1, max_rows)))
    k = f.block_size * draw(st.integers(1, max_blocks_per_row))
    return m, k


@st.composite
def raw_matrix(draw, fmt: str, m: int, k: int, **kw):
    f = formats.get(fmt)
    nb = m * (k // f.block_size)
    return draw(raw_blocks(fmt, nb, **kw)).reshape(m, k // f.block_size * f.block_bytes)


@st.composite
def float_blocks(draw, block_size: int, max_blocks: int = 6):
    """float32 inputs for quantizers: Gaussian with a drawn scale, plus zero, tiny, constant, tied rows."""
    n = draw(st.integers(1, max_blocks))
    seed = draw(st.integers(0, 2**32 - 1))
    kind = draw(st.sampled_from(["gauss", "student", "zero", "tiny", "huge", "const", "halfzero", "ints"]))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, block_size)).astype(np.float32)
    scale = np.float32(draw(st.sampled_from([1e-3, 0.02, 1.0, 30.0])))
    if kind == "gauss":
        x *= scale
    elif kind == "student":
        x = (rng.standard_t(3, (n, block_size)) * scale).astype(np.float32)
    elif kind == "zero":
        x[:] = 0
    elif kind == "tiny":
        x *= np.float32(1e-30)
    elif kind == "huge":
        x *= np.float32(1e3)
    elif kind == "const":
        x[:] = scale
    elif kind == "halfzero":
        x[:, : block_size // 2] = 0
    elif kind == "ints":
        x = rng.integers(-8, 8, (n, block_size)).astype(np.float32)
    return x
