"""Ops: validated Python calls that pick a kernel, check every input before launching, and launch it.

Results follow the inputs: NumPy in → NumPy out; a device array in → a DeviceArray out (exports
`__cuda_array_interface__`), unless `out=` is given.
"""
from __future__ import annotations

import numpy as np

from ptxgen import formats

from . import kernels
from .arrays import DeviceArray, as_device_array, shape_of
from .tensors import QuantTensor


def _result(out: DeviceArray, host: bool):
    return out.numpy() if host else out


def _blocks_per_cta(fn, key: str, default: int = 8) -> int:
    return int(getattr(fn, "meta", {}).get(key, default))


def quantize_q8_1(x, *, out=None, arch: str | None = None):
    """fp32 (..., K) with K a multiple of 32 → Q8_1 blocks (..., K/32·36) uint8, s = Σx (formats' "sum_x")."""
    shape = shape_of(x, "quantize_q8_1: x")
    if not shape or shape[-1] % 32:
        raise ValueError(f"quantize_q8_1: the last dimension must be a multiple of 32, got shape {shape}")
    xa = as_device_array(x, "quantize_q8_1: x", np.float32)
    nblocks = int(np.prod(xa.shape, dtype=np.int64)) // 32
    oshape = (*xa.shape[:-1], xa.shape[-1] // 32 * 36)
    o = DeviceArray.empty(oshape, np.uint8) if out is None else as_device_array(out, "quantize_q8_1: out", np.uint8)
    if o.nbytes != nblocks * 36:
        raise ValueError(f"quantize_q8_1: out holds {o.nbytes} B, needs {nblocks * 36}")
    if nblocks:
        fn = kernels.load("quantize_q8_1", arch)
        per = _blocks_per_cta(fn, "blocks_per_cta")
        fn.launch(((nblocks + per - 1) // per,), (xa, o, nblocks))
    return _result(o, xa.host and out is None)


def dequantize(w: QuantTensor, *, out=None, arch: str | None = None):
    """QuantTensor → fp16 (M, K). Q4_K runs on the GPU; the result equals ptxgen.formats' float32 dequant
    rounded to fp16, bit for bit. Returns a DeviceArray (or fills `out`)."""
    if not isinstance(w, QuantTensor):
        raise TypeError(f"dequantize: expected a QuantTensor, got {type(w).__name__}")
    kernel = {"q4_K": "dequantize_q4_k"}.get(w.fmt)
    if kernel is None:
        raise ValueError(f"dequantize: no GPU kernel for {w.fmt} yet (have: q4_K)")
    m, k = w.shape
    o = DeviceArray.empty((m, k), np.float16) if out is None else \
        as_device_array(out, "dequantize: out", np.float16, align=8)
    if tuple(o.shape) != (m, k):
        raise ValueError(f"dequantize: out has shape {tuple(o.shape)}, expected {(m, k)}")
    fn = kernels.load(kernel, arch)
    nsuper = m * k // 256
    per = _blocks_per_cta(fn, "superblocks_per_cta")
    fn.launch(((nsuper + per - 1) // per,), (w.buffer, o, nsuper))
    return o


def mul_mat(w: QuantTensor, x, *, out=None):
    """y = x @ W.T for x (T, K) fp32 → (T, M) fp32, like torch.nn.functional.linear(x, W).

    The API is fixed here; the kernels land with the MMQ/GEMV issues."""
    raise NotImplementedError(f"mul_mat for {getattr(w, 'fmt', w)}: the GEMM kernels are not built yet")
