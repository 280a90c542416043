"""Array interop without importing torch: anything with `__cuda_array_interface__` (torch, cupy, numba),
anything with `__dlpack__` on a CUDA device, or a NumPy host array (uploaded into a DeviceBuffer).

`DeviceArray` is ptxgen's own result type: a device pointer with shape and dtype that exports
`__cuda_array_interface__` (so `torch.as_tensor(out, device="cuda")` and `cupy.asarray(out)` take it
without a copy) and `.numpy()`.
"""
from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass, field

import numpy as np

from .driver import DeviceBuffer, is_torch


@dataclass
class DeviceArray:
    ptr: int
    shape: tuple
    dtype: np.dtype
    owner: object = field(default=None, repr=False)  # whatever keeps the memory alive
    host: bool = False  # came from a NumPy array: results go back to NumPy
    stream: int | None = None  # the stream whose work writes it (.numpy() waits for that stream); None: synchronous

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize  # (Python ints: np.prod costs ~3 µs a call)

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": tuple(self.shape), "typestr": self.dtype.str, "data": (self.ptr, False), "version": 3,
                "strides": None}

    def numpy(self) -> np.ndarray:
        """A host copy, made after the work queued on the array's stream (so after the op that wrote it)."""
        out = np.empty(self.shape, self.dtype)
        if out.nbytes:
            from .driver import _drv, check, stream_synchronize

            if self.stream is None:
                check(_drv().cuMemcpyDtoH(out.ctypes.data, self.ptr, out.nbytes), "cuMemcpyDtoH")
            else:
                check(_drv().cuMemcpyDtoHAsync(out.ctypes.data, self.ptr, out.nbytes, self.stream), "cuMemcpyDtoHAsync")
                stream_synchronize(self.stream)
        return out

    @classmethod
    def empty(cls, shape, dtype, stream: int | None = None) -> "DeviceArray":
        """Uninitialised device memory; with `stream`, allocated in that stream's order (DeviceBuffer)."""
        dtype = np.dtype(dtype)
        shape = tuple(int(s) for s in shape)
        buf = DeviceBuffer(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, stream)
        return cls(buf.ptr, shape, dtype, buf, stream=stream)


def _contiguous_strides(shape, itemsize):
    strides, acc = [], itemsize
    for s in reversed(shape):
        strides.append(acc)
        acc *= s
    return tuple(reversed(strides))


def _from_cai(obj, what: str) -> DeviceArray:
    cai = obj.__cuda_array_interface__
    shape = tuple(cai["shape"])
    dtype = np.dtype(cai["typestr"])
    strides = cai.get("strides")
    if strides is not None and tuple(strides) != _contiguous_strides(shape, dtype.itemsize) and np.prod(shape) > 1:
        raise ValueError(f"{what}: a non-contiguous array (strides {tuple(strides)} for shape {shape}); "
                         "pass a contiguous one (e.g. .contiguous())")
    return DeviceArray(int(cai["data"][0]), shape, dtype, obj)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


def _from_dlpack(obj, what: str) -> DeviceArray:
    dev_type, _ = obj.__dlpack_device__()
    if int(dev_type) not in (2, 13):  # kDLCUDA, kDLCUDAManaged
        raise ValueError(f"{what}: DLPack device type {dev_type} is not a CUDA device")
    capsule = obj.__dlpack__()
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    ptr = get(capsule, b"dltensor")
    t = _DLTensor.from_address(ptr)  # DLManagedTensor starts with its DLTensor
    shape = tuple(t.shape[i] for i in range(t.ndim))
    kind = {0: "i", 1: "u", 2: "f"}.get(t.dtype.code)
    if kind is None or t.dtype.lanes != 1:
        raise TypeError(f"{what}: unsupported DLPack dtype code {t.dtype.code}")
    dtype = np.dtype(f"{kind}{t.dtype.bits // 8}")
    if t.strides:
        strides = tuple(t.strides[i] * dtype.itemsize for i in range(t.ndim))
        if strides != _contiguous_strides(shape, dtype.itemsize) and np.prod(shape) > 1:
            raise ValueError(f"{what}: a non-contiguous DLPack tensor; pass a contiguous one")
    return DeviceArray(int(t.data) + int(t.byte_offset), shape, dtype, (obj, capsule))


_TORCH_NP: dict = {}  # torch dtype → NumPy dtype (filled from the imported torch on first use)


def _from_torch(obj, what: str) -> DeviceArray | None:
    """A CUDA torch tensor as a DeviceArray from its attributes: torch builds `__cuda_array_interface__` anew on
    every read (microseconds; mul_mat_id read it five times a call). None where this path does not apply (a CPU
    tensor, a dtype NumPy lacks): the generic paths then say why."""
    if not _TORCH_NP:
        import sys

        torch = sys.modules["torch"]
        _TORCH_NP.update({getattr(torch, n): np.dtype(n) for n in ("float32", "float16", "float64", "int8", "uint8",
                                                                  "int16", "int32", "int64")})
    dt = _TORCH_NP.get(obj.dtype)
    if dt is None or not obj.is_cuda:
        return None
    if not obj.is_contiguous() and obj.numel() > 1:
        raise ValueError(f"{what}: a non-contiguous array (strides {tuple(obj.stride())} for shape "
                         f"{tuple(obj.shape)}); pass a contiguous one (e.g. .contiguous())")
    return DeviceArray(obj.data_ptr(), tuple(obj.shape), dt, obj)


def as_device_array(obj, what: str = "array", dtype=None, ndim: int | None = None, align: int = 4,
                    stream: int | None = None) -> DeviceArray:
    """Any supported array → DeviceArray, checked (dtype, dimensions, contiguity, alignment) before any
    device work; NumPy arrays are uploaded after their checks pass (in the order of `stream`, if given)."""
    if isinstance(obj, np.ndarray):
        _check_meta(obj.shape, obj.dtype, what, dtype, ndim)
        if not obj.flags.c_contiguous:
            raise ValueError(f"{what}: a non-contiguous NumPy array; pass np.ascontiguousarray(...)")
        buf = DeviceBuffer.from_host(obj, stream)
        return DeviceArray(buf.ptr, obj.shape, obj.dtype, buf, host=True, stream=stream)
    if isinstance(obj, DeviceArray):
        a = obj
    elif is_torch(obj) and (a := _from_torch(obj, what)) is not None:
        pass
    elif hasattr(obj, "__cuda_array_interface__"):
        a = _from_cai(obj, what)
    elif hasattr(obj, "__dlpack_device__"):
        a = _from_dlpack(obj, what)
    else:
        raise TypeError(f"{what}: expected a NumPy array or a CUDA array (__cuda_array_interface__ / DLPack), "
                        f"got {type(obj).__name__}")
    _check_meta(a.shape, a.dtype, what, dtype, ndim)
    if a.ptr % align:
        raise ValueError(f"{what}: device pointer {a.ptr:#x} is not {align}-byte aligned")
    return a


def shape_of(obj, what: str = "array") -> tuple:
    """The shape of any supported array, without touching the device; TypeError for anything else."""
    if isinstance(obj, (np.ndarray, DeviceArray)) or is_torch(obj):
        return tuple(obj.shape)
    if hasattr(obj, "__cuda_array_interface__"):
        return tuple(obj.__cuda_array_interface__["shape"])
    if hasattr(obj, "__dlpack_device__") and hasattr(obj, "shape"):
        return tuple(obj.shape)
    raise TypeError(f"{what}: expected a NumPy array or a CUDA array (__cuda_array_interface__ / DLPack), "
                    f"got {type(obj).__name__}")


def _check_meta(shape, dt, what, dtype, ndim) -> None:
    if dtype is not None and np.dtype(dt) != np.dtype(dtype):
        raise TypeError(f"{what}: expected dtype {np.dtype(dtype)}, got {np.dtype(dt)}")
    if ndim is not None and len(shape) != ndim:
        raise ValueError(f"{what}: expected {ndim} dimensions, got shape {tuple(shape)}")
