"""TMA tensor maps (`cuTensorMapEncodeTiled`) for kernels that take a CUtensorMap by value.

`tensor_map_2d` checks the arguments against the driver's rules first (so a bad box or stride is a
ValueError naming the rule, not CUDA_ERROR_INVALID_VALUE), then encodes the 128-byte map, which
`Function.launch` passes by value for a `.param .align 64 .b8 name[128]` parameter.
The checks are tested on the CPU; the GPU tier encodes them for the TMA kernels.
"""
from __future__ import annotations

import numpy as np

from .driver import _drv, check, current

_DTYPES = {"u8": "UINT8", "f16": "FLOAT16", "bf16": "BFLOAT16", "f32": "FLOAT32", "u32": "UINT32", "s32": "INT32"}
_SIZES = {"u8": 1, "f16": 2, "bf16": 2, "f32": 4, "u32": 4, "s32": 4}
_SWIZZLE = {"none": (0, "CU_TENSOR_MAP_SWIZZLE_NONE"), "32B": (32, "CU_TENSOR_MAP_SWIZZLE_32B"),
            "64B": (64, "CU_TENSOR_MAP_SWIZZLE_64B"), "128B": (128, "CU_TENSOR_MAP_SWIZZLE_128B")}


def check_tensor_map_2d(ptr: int, dtype: str, rows: int, cols: int, box_rows: int, box_cols: int,
                        swizzle: str = "128B", row_stride_bytes: int | None = None, chunks: int = 0) -> int:
    """Validate a 2-D tiled tensor map (`chunks`: tensor_map_2d's); returns the row stride in bytes."""
    if chunks and (cols % box_cols or not 1 <= chunks <= 256):
        raise ValueError(f"tensor map chunks={chunks}: columns ({cols}) a multiple of box_cols ({box_cols}), 1..256 "
                         "chunks a box")
    if dtype not in _DTYPES:
        raise ValueError(f"tensor map dtype {dtype!r}; supported: {', '.join(_DTYPES)}")
    if swizzle not in _SWIZZLE:
        raise ValueError(f"tensor map swizzle {swizzle!r}; supported: {', '.join(_SWIZZLE)}")
    es = _SIZES[dtype]
    stride = cols * es if row_stride_bytes is None else row_stride_bytes
    if ptr % 16:
        raise ValueError(f"tensor map base {ptr:#x} must be 16-byte aligned")
    if stride % 16:
        raise ValueError(f"tensor map row stride {stride} B must be a multiple of 16")
    if stride < cols * es:
        raise ValueError(f"tensor map row stride {stride} B is shorter than a row ({cols} × {es} B)")
    for name, v in (("box_rows", box_rows), ("box_cols", box_cols)):
        if not 1 <= v <= 256:
            raise ValueError(f"tensor map {name}={v}: a box dimension is 1..256")
    inner = box_cols * es
    if inner % 16:
        raise ValueError(f"tensor map inner box {inner} B must be a multiple of 16")
    span = _SWIZZLE[swizzle][0]
    if span and inner > span:
        raise ValueError(f"tensor map inner box {inner} B exceeds the {swizzle} swizzle span ({span} B)")
    return stride


def tensor_map_2d(ptr: int, dtype: str, rows: int, cols: int, box_rows: int, box_cols: int,
                  swizzle: str = "128B", row_stride_bytes: int | None = None, chunks: int = 0) -> bytes:
    """Encode a 2-D tiled CUtensorMap (row-major `rows × cols`, boxes of `box_rows × box_cols`). `chunks` > 0: the
    same matrix seen as 3-D — (column within a chunk of box_cols, row, chunk), strides (row, box_cols elements) —
    with boxes of `chunks` consecutive column chunks, each box_rows × box_cols, one after another in shared memory
    (coordinates: 0, the first row, the first chunk)."""
    stride = check_tensor_map_2d(ptr, dtype, rows, cols, box_rows, box_cols, swizzle, row_stride_bytes, chunks)
    current()
    drv = _drv()
    dims, strides = [cols, rows], [stride]
    box = [box_cols, box_rows]
    if chunks:
        dims, strides, box = [box_cols, rows, cols // box_cols], [stride, box_cols * _SIZES[dtype]], box + [chunks]
    tmap = check(drv.cuTensorMapEncodeTiled(
        getattr(drv.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{_DTYPES[dtype]}"), len(dims), ptr,
        [drv.cuuint64_t(v) for v in dims], [drv.cuuint64_t(v) for v in strides],
        [drv.cuuint32_t(v) for v in box], [drv.cuuint32_t(1)] * len(dims),
        drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        getattr(drv.CUtensorMapSwizzle, _SWIZZLE[swizzle][1]),
        drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE), "cuTensorMapEncodeTiled")
    return np.array([int(v) for v in tmap.opaque], np.uint64).tobytes()  # CUtensorMap.opaque: 16 × u64
