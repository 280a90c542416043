"""The `QuantFormat` record and the shape/byte checks every format entry point shares."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class QuantFormat:
    """One block format: its byte layout and its NumPy quantize/dequantize."""

    name: str
    block_size: int  # weights per block
    block_bytes: int
    dtype: np.dtype  # structured dtype, itemsize == block_bytes, fields at ggml's offsets
    alignment: int  # guaranteed byte alignment of a block inside a row
    _dequantize: Callable[[np.ndarray], np.ndarray]  # (nblocks, block_bytes) u8 -> (nblocks, block_size) f32
    _quantize: Callable[[np.ndarray], np.ndarray] | None  # (nblocks, block_size) f32 -> (nblocks, block_bytes) u8
    activation: bool = False  # an activation format (Q8_1): non-finite values pass through, as in the kernels

    @property
    def bits_per_weight(self) -> float:
        return self.block_bytes * 8 / self.block_size

    def row_bytes(self, k: int) -> int:
        self.check_k(k)
        return k // self.block_size * self.block_bytes

    def check_k(self, k: int) -> None:
        if k <= 0 or k % self.block_size:
            raise ValueError(
                f"{self.name}: K={k} is not a positive multiple of the block size {self.block_size}"
            )

    def blocks(self, raw, shape) -> np.ndarray:
        """View `raw` as (nblocks, block_bytes) uint8 after checking it holds exactly `shape`."""
        shape = tuple(int(s) for s in np.atleast_1d(shape))
        if not shape:
            raise ValueError(f"{self.name}: shape must have at least one dimension")
        self.check_k(shape[-1])
        if isinstance(raw, (bytes, bytearray, memoryview)):
            raw = np.frombuffer(raw, dtype=np.uint8)
        if not isinstance(raw, np.ndarray):
            raise TypeError(f"{self.name}: raw must be bytes or a numpy uint8 array, got {type(raw).__name__}")
        if raw.dtype != np.uint8:
            raise TypeError(f"{self.name}: raw must have dtype uint8, got {raw.dtype}")
        want = int(np.prod(shape[:-1], dtype=np.int64)) * self.row_bytes(shape[-1])
        if raw.size != want:
            raise ValueError(
                f"{self.name}: shape {shape} needs {want} bytes "
                f"({shape[-1] // self.block_size} blocks of {self.block_bytes} B per row), got {raw.size}"
            )
        return np.ascontiguousarray(raw).reshape(-1, self.block_bytes)

    def dequantize(self, raw, shape) -> np.ndarray:
        shape = tuple(int(s) for s in np.atleast_1d(shape))
        blocks = self.blocks(raw, shape)
        return self._dequantize(blocks).reshape(shape)

    def quantize(self, x, *, allow_nonfinite: bool = False, **options) -> np.ndarray:
        """float32 (..., K) → uint8 blocks (..., K / block_size · block_bytes). A weight format refuses NaN and
        ±inf (ValueError naming the first such row and column): its block scales would turn them into
        plausible-looking garbage, differently per format. `allow_nonfinite=True` quantizes them anyway, as ggml
        does (the result is unspecified)."""
        if self._quantize is None:
            raise NotImplementedError(f"{self.name}: no quantizer")
        x = np.asarray(x)
        if x.dtype != np.float32:
            raise TypeError(f"{self.name}: quantize takes float32, got {x.dtype}")
        if x.ndim == 0:
            raise ValueError(f"{self.name}: quantize takes an array with a last dimension")
        self.check_k(x.shape[-1])
        if not (self.activation or allow_nonfinite):
            check_finite(x, f"{self.name}: quantize")
        blocks = np.ascontiguousarray(x).reshape(-1, self.block_size)
        with np.errstate(invalid="ignore", over="ignore"):  # (inf / NaN let through, or scales past fp16: handled)
            out = self._quantize(blocks, **options)
        if not (self.activation or allow_nonfinite):
            self._check_scales(out, x)
        return out.reshape(*x.shape[:-1], x.shape[-1] // self.block_size * self.block_bytes)

    def _check_scales(self, out: np.ndarray, x: np.ndarray) -> None:
        """ValueError where finite weights left a block's fp16 scale field inf or NaN: values that large are past
        what the format's fp16 scales reach, and ggml's quantizer writes such blocks anyway, every weight of them
        then decoding to inf / NaN — silently wrong, as the non-finite inputs check_finite refuses."""
        rec = np.ascontiguousarray(out).reshape(-1, self.block_bytes).view(self.dtype).reshape(-1)
        bad = np.zeros(rec.shape[0], bool)
        for v in self.scale_fields(rec):
            bad |= ~np.isfinite(v)
        if not bad.any():
            return
        i = int(np.argmax(bad))
        per_row = x.shape[-1] // self.block_size
        row, c0 = divmod(i, per_row)
        c0 *= self.block_size
        peak = float(np.abs(x.reshape(-1, x.shape[-1])[row, c0:c0 + self.block_size]).max())
        where = f"row {row}" if x.ndim == 2 else f"row {row} of the flattened (-1, K) weights"
        raise ValueError(f"{self.name}: quantize: {int(bad.sum())} block(s) whose fp16 scales overflow, the first at "
                         f"{where}, columns {c0}-{c0 + self.block_size - 1} (largest |value| {peak:.4g}); scale the "
                         "weights down (and the outputs up by the same factor), or pass allow_nonfinite=True for "
                         "ggml's blocks (their weights decode to inf / NaN)")

    def scale_fields(self, rec: np.ndarray):
        """Each fp16 scale field (d, dmin, ...) of structured blocks `rec` as float32, one array per field."""
        return [rec[n].astype(np.float32) for n in self.dtype.names if self.dtype[n] == np.dtype("<f2")]

    def fields(self, raw, shape) -> np.ndarray:
        """The blocks as a structured array (one record per block)."""
        return self.blocks(raw, shape).view(self.dtype).reshape(-1)


def check_finite(x: np.ndarray, what: str) -> None:
    """ValueError naming the first non-finite element of `x` (its row and column for a matrix) and how many there
    are; nothing when all are finite."""
    bad = ~np.isfinite(x)
    if not bad.any():
        return
    first = np.unravel_index(int(np.argmax(bad)), x.shape)
    where = f"row {first[0]}, column {first[1]}" if x.ndim == 2 else f"index {tuple(int(i) for i in first)}"
    raise ValueError(f"{what}: {int(bad.sum())} non-finite value(s), the first {x[first]} at {where}; "
                     "fix the weights or pass allow_nonfinite=True to quantize them anyway (unspecified result)")
