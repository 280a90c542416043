"""The CUDA driver, through cuda-python's `cuda.bindings.driver`: context, streams, device memory, modules, launches,
events.

Why the driver API and not `cuda.core` for launches: ptxgen's kernels take a CUtensorMap by value (a 128-byte
parameter, as nvcc passes a `__grid_constant__` one), opt into more than 48 KB of dynamic shared memory and may
set cluster dimensions; the driver's `cuLaunchKernelEx` with a packed `void**` does all three on every cuda-python
release we meet, so there is one launch path. The ops' hot path (`PreparedLaunch`) calls `cuLaunchKernel(Ex)`
through ctypes with argument buffers packed once: a cuda-python call converts its arguments on every call, which
costs more than the launch itself. cuda-python is imported on first use: importing ptxgen.runtime works on a
machine without a driver.

Streams: every launch and copy names a stream. `stream_handle` turns what a user passes (a raw handle, an object
with `__cuda_stream__`, a torch or cupy stream) into a handle, and picks the default: the current stream of the
library that owns the input (torch, cupy), else the per-thread default stream.
"""
from __future__ import annotations

import ctypes
import sys
import threading
from dataclasses import dataclass

import numpy as np

from ptxgen import knobs


class CudaError(RuntimeError):
    """A CUDA driver call failed; the message names the call and the driver's error."""


ORDINAL = 0  # the GPU ptxgen runs on (cuda:0)


def check_device(a, what: str) -> None:
    """A torch tensor or cupy array on another GPU than ptxgen's is refused: ValueError "<what> is on cuda:N; ptxgen
    runs on cuda:ORDINAL" (NumPy arrays, DeviceArrays and CPU tensors pass: other checks name those)."""
    dev = a.get_device() if hasattr(a, "get_device") and hasattr(a, "is_cuda") else getattr(
        getattr(a, "device", None), "id", None)
    if isinstance(dev, int) and dev >= 0 and dev != ORDINAL:
        raise ValueError(f"{what} is on cuda:{dev}; ptxgen runs on cuda:{ORDINAL}")
LEGACY_STREAM = 0x1  # CU_STREAM_LEGACY
PER_THREAD_STREAM = 0x2  # CU_STREAM_PER_THREAD

_LOCK = threading.RLock()
_CTX = None
_TLS = threading.local()  # per thread: whether the context is current here


def _drv():
    try:
        from cuda.bindings import driver
    except ImportError:  # very old cuda-python
        try:
            from cuda import cuda as driver  # type: ignore
        except ImportError as e:
            raise RuntimeError("ptxgen.runtime needs cuda-python (pip install cuda-bindings)") from e
    return driver


def _error_text(err) -> str:
    drv = _drv()
    _, name = drv.cuGetErrorName(err)
    _, text = drv.cuGetErrorString(err)
    name = name.decode() if isinstance(name, bytes) else str(name)
    text = text.decode() if isinstance(text, bytes) else str(text)
    return f"{name} ({text})"


def check(result, what: str = "CUDA call"):
    """Unpack a cuda-python result tuple, raising CudaError (or MemoryError for out-of-memory)."""
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        drv = _drv()
        msg = f"{what} failed: {_error_text(err)}"
        if int(err) == int(drv.CUresult.CUDA_ERROR_OUT_OF_MEMORY):
            raise MemoryError(msg)
        raise CudaError(msg)
    return rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)


def _check_rc(rc: int, what) -> None:
    """The same for a raw CUresult from a ctypes call; `what` a string or a callable making one (only on error)."""
    if rc:
        from cuda.bindings import driver as drv

        what = what() if callable(what) else what
        err = drv.CUresult(rc)
        msg = f"{what} failed: {_error_text(err)}"
        if err == drv.CUresult.CUDA_ERROR_OUT_OF_MEMORY:
            raise MemoryError(msg)
        raise CudaError(msg)


@dataclass
class Context:
    device: object
    ctx: object
    name: str
    sm: int  # compute capability as major*10+minor
    sm_count: int
    max_smem_optin: int
    l2_bytes: int
    ordinal: int = 0


def current() -> Context:
    """The process's CUDA context on device 0 (the primary context, which torch and cupy use too), created on first
    use and made current in every thread that calls."""
    ctx = _CTX
    if ctx is not None:
        if not getattr(_TLS, "bound", False):
            check(_drv().cuCtxSetCurrent(ctx.ctx), "cuCtxSetCurrent")
            _TLS.bound = True
        return ctx
    return _create_context()


def _create_context() -> Context:
    global _CTX
    with _LOCK:
        if _CTX is not None:
            return current()
        try:
            drv = _drv()
            check(drv.cuInit(0), "cuInit")
        except (CudaError, OSError, RuntimeError) as e:
            raise RuntimeError(f"ptxgen.runtime: no usable CUDA driver/GPU on this machine ({e}). "
                               "The GPU ops need an NVIDIA GPU and driver; ptxgen emit/check, QuantTensor and the "
                               "NumPy references work without one.") from None
        n = check(drv.cuDeviceGetCount(), "cuDeviceGetCount")
        if n == 0:
            raise RuntimeError("ptxgen.runtime: the CUDA driver sees no GPU")
        dev = check(drv.cuDeviceGet(ORDINAL), "cuDeviceGet")
        ctx = check(drv.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
        check(drv.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        _TLS.bound = True
        A = drv.CUdevice_attribute
        attr = lambda a: check(drv.cuDeviceGetAttribute(a, dev), "cuDeviceGetAttribute")  # noqa: E731
        major = attr(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
        minor = attr(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
        name = check(drv.cuDeviceGetName(256, dev), "cuDeviceGetName")
        name = name.split(b"\0")[0].decode() if isinstance(name, bytes) else str(name)
        _CTX = Context(dev, ctx, name, major * 10 + minor, attr(A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
                       attr(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
                       attr(A.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE), ORDINAL)
        return _CTX


def synchronize() -> None:
    """Wait for all work on the GPU (every stream); then free the buffers held while ops recorded into captures."""
    current()
    check(_drv().cuCtxSynchronize(), "cuCtxSynchronize")
    if _HELD or _UNFREED:
        free_held()


# ---------------------------------------------------------------------------------------------------
# the hot path's raw driver entry points (ctypes: no per-call argument conversion)

class _LaunchAttr(ctypes.Structure):  # CUlaunchAttribute: id, pad to 8, a 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint32 * 16)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttr)), ("numAttrs", ctypes.c_uint)]


_ATTR_CLUSTER = 4  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
_ATTR_PDL = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
_CU: list = []


def libcuda():
    """libcuda through ctypes, with the prototypes of the few entry points the hot path calls."""
    if _CU:
        return _CU[0]
    with _LOCK:
        if _CU:
            return _CU[0]
        lib = ctypes.CDLL("libcuda.so.1" if sys.platform != "win32" else "nvcuda.dll")
        vp, u = ctypes.c_void_p, ctypes.c_uint
        lib.cuLaunchKernel.argtypes = [vp, u, u, u, u, u, u, u, vp, vp, vp]
        lib.cuLaunchKernelEx.argtypes = [ctypes.POINTER(_LaunchConfig), vp, vp, vp]
        lib.cuStreamIsCapturing.argtypes = [vp, ctypes.POINTER(ctypes.c_int)]
        lib.cuStreamGetCaptureInfo_v2.argtypes = [vp, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_uint64),
                                                  vp, vp, vp]
        lib.cuThreadExchangeStreamCaptureMode.argtypes = [ctypes.POINTER(ctypes.c_int)]
        for f in (lib.cuLaunchKernel, lib.cuLaunchKernelEx, lib.cuStreamIsCapturing, lib.cuStreamGetCaptureInfo_v2,
                  lib.cuThreadExchangeStreamCaptureMode):
            f.restype = ctypes.c_int
        _CU.append(lib)
        return lib


# ---------------------------------------------------------------------------------------------------
# streams

_TORCH: list = []  # (torch.Tensor, torch.float32, torch's current-raw-stream accessor), once torch is imported


def torch_types():
    """(torch.Tensor, torch.float32, torch's cheapest accessor of its current raw stream on a device), found once
    torch is imported; None before (ptxgen never imports torch itself)."""
    if _TORCH:
        return _TORCH[0]
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    _TORCH.append((torch.Tensor, torch.float32,
                   raw if raw is not None else (lambda i: torch.cuda.current_stream(i).cuda_stream)))
    return _TORCH[0]


def torch_stream_getter():
    """torch's cheapest accessor of its current raw stream on a device (torch must be imported)."""
    return torch_types()[2]


def _torch_current_stream(device_index: int) -> int:
    return torch_types()[2](device_index)


def is_torch(obj) -> bool:
    tt = _TORCH[0] if _TORCH else torch_types()
    return tt is not None and isinstance(obj, tt[0])


def stream_handle(stream=None, like=None) -> int:
    """The raw CUstream a call runs on. `stream`: None (the default below), an int (a raw handle; 0 is the legacy
    default stream, 2 the per-thread one), an object with `__cuda_stream__` (cuda.core), a torch stream
    (`.cuda_stream`), a cupy stream (`.ptr`) or a cuda-python `CUstream`. The default is the current stream of the
    library that owns `like` (torch's current stream for a torch tensor, cupy's for a cupy array), else the
    per-thread default stream."""
    if stream is None:
        if like is not None:
            if is_torch(like):  # (a subclass of torch.Tensor too, wherever it is defined)
                return _torch_current_stream(like.device.index)
            mod = type(like).__module__
            if mod.startswith("cupy"):
                return sys.modules["cupy"].cuda.get_current_stream().ptr
        return PER_THREAD_STREAM
    if isinstance(stream, (int, np.integer)) and not isinstance(stream, bool):
        if stream < 0:
            raise ValueError(f"stream: a raw handle is a non-negative integer, got {stream}")
        return int(stream)
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        got = proto() if callable(proto) else proto
        if not (isinstance(got, tuple) and len(got) == 2):
            raise TypeError(f"stream: {type(stream).__name__}.__cuda_stream__() must return (version, handle), got {got!r}")
        return int(got[1])
    for attr in ("cuda_stream", "ptr"):  # torch.cuda.Stream, cupy.cuda.Stream
        v = getattr(stream, attr, None)
        if isinstance(v, (int, np.integer)):
            return int(v)
    if type(stream).__name__ == "CUstream":  # cuda.bindings.driver.CUstream
        return int(stream)
    raise TypeError(f"stream: expected None, a raw handle (int), an object with __cuda_stream__, or a torch / cupy "
                    f"stream, got {type(stream).__name__}")


_CAP = threading.local()  # per thread: the out-parameters of the capture queries, made once


def _capture_refs():
    refs = getattr(_CAP, "refs", None)
    if refs is None:
        current()  # the driver initialised and the context current in this thread, once per thread
        st, cid = ctypes.c_int(0), ctypes.c_uint64(0)
        refs = _CAP.refs = (st, cid, ctypes.byref(st), ctypes.byref(cid))
    return refs


def capture_status(stream: int) -> int:
    """0: the stream is not capturing a CUDA graph; 1: it is; 2: its capture was invalidated. One 2-argument
    ctypes call (cuStreamIsCapturing) with an out-parameter made once per thread: every op asks."""
    refs = _capture_refs()
    rc = (_CU[0] if _CU else libcuda()).cuStreamIsCapturing(stream, refs[2])
    if rc:
        _check_rc(rc, "cuStreamIsCapturing")
    return refs[0].value


# > 0 while an op records into a CUDA graph capture (mul_mat / mul_mat_id with a capturing stream; hold_frees): a
# buffer a GC pass drops then (one can run inside any Python call, and an op makes many objects) that the legacy stream
# would free waits in _HELD (free_held), since that free would join a blocking stream's capture or invalidate it (a GPU
# tier lost a graph so, 2026-12-06). A legacy-stream buffer dropped by the caller's own code while it captures, outside
# ptxgen's ops, is still freed at once (such buffers are rare: per-thread-stream buffers dropped in another thread).
# cuMemFree, which a global-mode capture anywhere refuses, goes at once with this thread's capture mode relaxed
# (_free_relaxed: the graph is kept, bench/probe_capture_free.py on an H100, 2026-12-06), so a GC pass in the
# caller's own capture code is safe for those. Frees on another stream are ordinary async calls and go at once.
HOLD_FREES = [0]
_HOLD_LOCK = threading.Lock()


def hold_frees(delta: int) -> None:
    """+1 as an op starts recording into a capture, -1 as it ends (HOLD_FREES; ops from several threads at once)."""
    with _HOLD_LOCK:
        HOLD_FREES[0] += delta


def capture_id(stream: int) -> int | None:
    """The id of the capture sequence `stream` is in (unique in the process), or None when it is not capturing;
    only a capturing stream is asked for its id (cuStreamGetCaptureInfo)."""
    if capture_status(stream) == 0:
        return None
    refs = _capture_refs()
    rc = (_CU[0] if _CU else libcuda()).cuStreamGetCaptureInfo_v2(stream, refs[2], refs[3], None, None, None)
    if rc:
        _check_rc(rc, "cuStreamGetCaptureInfo")
    if refs[0].value == 2:
        raise CudaError("the stream's CUDA graph capture was invalidated by an earlier call")
    return refs[1].value if refs[0].value == 1 else None


def _exchange_mode(mode: ctypes.c_int) -> int:
    """cuThreadExchangeStreamCaptureMode: this thread's capture mode becomes `mode`, and `mode` holds the old one
    (the same call with it puts that back); returns the driver's result code."""
    return libcuda().cuThreadExchangeStreamCaptureMode(ctypes.byref(mode))


class relaxed_capture:
    """`with relaxed_capture(): ...` lets this thread make calls that a global-mode capture would otherwise refuse
    (cuMemAlloc, a synchronous copy on another stream): for memory that ptxgen owns outside every graph."""

    def __enter__(self):
        self.mode = ctypes.c_int(2)  # CU_STREAM_CAPTURE_MODE_RELAXED
        _check_rc(_exchange_mode(self.mode), "cuThreadExchangeStreamCaptureMode")
        _TLS.relaxed = getattr(_TLS, "relaxed", 0) + 1
        return self

    def __exit__(self, *exc):
        _TLS.relaxed -= 1
        _check_rc(_exchange_mode(self.mode), "cuThreadExchangeStreamCaptureMode")
        return False


_SIDE: list = []


def side_stream() -> int:
    """ptxgen's own non-blocking stream, for set-up work (zeroing a workspace) that must not join a capture."""
    if not _SIDE:
        with _LOCK:
            if not _SIDE:
                current()
                s = check(_drv().cuStreamCreate(1), "cuStreamCreate")  # CU_STREAM_NON_BLOCKING
                _SIDE.append((s, int(s)))
    return _SIDE[0][1]


def stream_synchronize(stream: int) -> None:
    check(_drv().cuStreamSynchronize(stream), "cuStreamSynchronize")


# ---------------------------------------------------------------------------------------------------
# memory

_POOL: list = []
_DEFERRED: list = []  # stream-ordered buffers dropped while their stream was capturing: freed later
_HELD: list = []  # pointers the legacy stream frees, dropped while an op recorded into a capture (HOLD_FREES)
_UNFREED: list = []  # pointers whose cuMemFree failed (_free_relaxed): retried by free_held
_FREE_LOCK = threading.Lock()


def _mempool():
    """ptxgen's stream-ordered memory pool on the device (cuMemPoolCreate), keeping freed memory for reuse (release
    threshold: unlimited) instead of handing it back to the driver at every synchronization."""
    if not _POOL:
        with _LOCK:
            if not _POOL:
                drv = _drv()
                ctx = current()
                props = drv.CUmemPoolProps()
                props.allocType = drv.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
                props.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
                props.location.id = ctx.ordinal
                pool = check(drv.cuMemPoolCreate(props), "cuMemPoolCreate")
                check(drv.cuMemPoolSetAttribute(pool, drv.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                                                drv.cuuint64_t(2**64 - 1)), "cuMemPoolSetAttribute")
                _POOL.append(pool)
    return _POOL[0]


def _fresh_status(stream: int) -> int:
    """capture_status with an out-parameter of its own (a __del__ may run inside capture_status, whose per-thread
    one it would overwrite); an error (the legacy stream beside a blocking stream's capture) counts as capturing."""
    st = ctypes.c_int(0)
    return 1 if libcuda().cuStreamIsCapturing(stream, ctypes.byref(st)) else st.value


def _take(pending: list) -> list:
    with _FREE_LOCK:
        taken, pending[:] = pending[:], []
    return taken


def _free_deferred() -> None:
    """Free the stream-ordered buffers dropped while their stream captured, those whose capture has ended (at a
    stream-ordered allocation, as they were)."""
    for ptr, stream in _take(_DEFERRED):
        try:
            if _fresh_status(stream) == 0 and not _drv().cuMemFreeAsync(ptr, stream)[0]:
                continue
        except Exception:  # noqa: BLE001 - kept for a later pass
            pass
        _DEFERRED.append((ptr, stream))


def free_held() -> None:
    """Retry the cuMemFree calls that failed (_UNFREED; relaxed, so at any time), then free what _HELD holds
    (cuMemFreeAsync on the legacy stream) unless an op is recording into a capture: at synchronize() and
    empty_cache(), and after a cuMemAlloc that succeeded outside relaxed_capture (a global-mode capture anywhere would
    have refused it, so none was recording then)."""
    for ptr in _take(_UNFREED):
        _free_relaxed(ptr)
    if HOLD_FREES[0]:
        return
    for ptr in _take(_HELD):
        try:
            if not _drv().cuMemFreeAsync(ptr, LEGACY_STREAM)[0]:
                continue
        except Exception:  # noqa: BLE001 - kept for a later pass
            pass
        _HELD.append(ptr)


def _free_relaxed(ptr: int) -> None:
    """cuMemFree with this thread's capture mode relaxed for the call: a global-mode capture on any stream refuses a
    cuMemFree (and is invalidated by it) unless the freeing thread is relaxed, and a GC pass can drop a buffer while
    the caller captures. The context is made current first (a GC pass can run in a thread that never used ptxgen);
    a free that fails, or that cannot be made relaxed, waits in _UNFREED for free_held's next pass."""
    mode, swapped = ctypes.c_int(2), False  # CU_STREAM_CAPTURE_MODE_RELAXED
    try:
        if _CTX is not None and not getattr(_TLS, "bound", False):
            current()
        swapped = not _exchange_mode(mode)
        if not swapped or _drv().cuMemFree(ptr)[0]:
            _UNFREED.append(ptr)
    except Exception:  # noqa: BLE001 - kept for a later pass
        _UNFREED.append(ptr)
    finally:
        if swapped:
            _exchange_mode(mode)


class DeviceBuffer:
    """Device memory.

    `DeviceBuffer(n)`: cuMemAlloc, freed by cuMemFree when dropped (weights, workspaces that CUDA graphs keep).
    `DeviceBuffer(n, stream=s)`: from ptxgen's stream-ordered pool, allocated and freed in the order of stream `s`
    (cuMemAllocFromPoolAsync / cuMemFreeAsync): an op's output or an upload, usable on `s` at once; another stream
    must wait for `s` first, as with torch's allocator.
    `DeviceBuffer.wrap(ptr, n, owner)`: memory someone else owns (kept alive through `owner`), never freed here.
    """

    __slots__ = ("ptr", "nbytes", "stream", "_kind", "_owner", "_thread", "__weakref__")

    def __init__(self, nbytes: int, stream: int | None = None):
        current()
        self.nbytes, self.stream, self._owner = int(nbytes), stream, None
        self._thread = threading.get_ident()  # whose per-thread default stream PER_THREAD_STREAM means
        self.ptr, self._kind = 0, None
        drv = _drv()
        size = max(self.nbytes, 1)
        if stream is None:
            try:
                self.ptr = int(check(drv.cuMemAlloc(size), f"cuMemAlloc({self.nbytes} B)"))
            except MemoryError:
                empty_cache()  # (the stream-ordered pool's unused memory back to the driver, what is held freed)
                self.ptr = int(check(drv.cuMemAlloc(size), f"cuMemAlloc({self.nbytes} B)"))
            self._kind = "sync"
            if (_HELD or _UNFREED) and not getattr(_TLS, "relaxed", 0):
                free_held()
        else:
            if _DEFERRED:
                _free_deferred()
            self.ptr = int(check(drv.cuMemAllocFromPoolAsync(size, _mempool(), stream),
                                 f"cuMemAllocFromPoolAsync({self.nbytes} B)"))
            self._kind = "stream"

    @classmethod
    def wrap(cls, ptr: int, nbytes: int, owner=None) -> "DeviceBuffer":
        b = cls.__new__(cls)
        b.ptr, b.nbytes, b.stream, b._kind, b._owner = int(ptr), int(nbytes), None, "foreign", owner
        return b

    def __del__(self):
        ptr, kind = getattr(self, "ptr", 0), getattr(self, "_kind", None)
        if not ptr or kind == "foreign" or _drv is None:
            return
        self.ptr = 0
        try:
            stream = None if kind == "sync" else self.stream
            if stream == PER_THREAD_STREAM and threading.get_ident() != self._thread:
                # dropped in another thread (a GC pass, a worker): its per-thread stream is not the one the buffer
                # was used on; the legacy stream's free waits for every blocking stream's earlier work, that one's too
                stream = LEGACY_STREAM
            if stream is None:
                _free_relaxed(ptr)
            elif stream == LEGACY_STREAM:
                if HOLD_FREES[0]:  # an op records into a capture: this free would join it or invalidate it
                    _HELD.append(ptr)
                else:
                    _drv().cuMemFreeAsync(ptr, stream)
            elif _fresh_status(stream) == 0:
                _drv().cuMemFreeAsync(ptr, stream)
            else:  # a free now would be recorded into the capture (a per-thread stream's: on the legacy stream later,
                # which waits for it, whichever thread frees it)
                _DEFERRED.append((ptr, LEGACY_STREAM if stream == PER_THREAD_STREAM else stream))
        except Exception:  # noqa: BLE001 - interpreter shutdown, or the context is gone
            pass

    @classmethod
    def from_host(cls, arr: np.ndarray, stream: int | None = None) -> "DeviceBuffer":
        arr = np.ascontiguousarray(arr)
        buf = cls(arr.nbytes, stream)
        buf.upload(arr, stream=stream)
        return buf

    def upload(self, arr: np.ndarray, offset: int = 0, stream: int | None = None) -> None:
        """Copy host `arr` in, in the order of `stream` (or synchronously with None); returns when `arr` may be
        reused."""
        arr = np.ascontiguousarray(arr)
        if offset + arr.nbytes > self.nbytes:
            raise ValueError(f"upload of {arr.nbytes} B at {offset} overflows a {self.nbytes} B buffer")
        if arr.nbytes:
            drv = _drv()
            if stream is None:
                check(drv.cuMemcpyHtoD(self.ptr + offset, arr.ctypes.data, arr.nbytes), "cuMemcpyHtoD")
            else:
                check(drv.cuMemcpyHtoDAsync(self.ptr + offset, arr.ctypes.data, arr.nbytes, stream), "cuMemcpyHtoDAsync")
                stream_synchronize(stream)  # pageable memory: the copy must be done before `arr` may change

    def download(self, dtype, shape, offset: int = 0, stream: int | None = None) -> np.ndarray:
        """Copy out to a new host array after the work queued on `stream` (default: the buffer's own stream, or
        synchronous for a buffer without one)."""
        out = np.empty(shape, dtype)
        if offset + out.nbytes > self.nbytes:
            raise ValueError(f"download of {out.nbytes} B at {offset} overruns a {self.nbytes} B buffer")
        stream = self.stream if stream is None else stream
        if out.nbytes:
            drv = _drv()
            if stream is None:
                check(drv.cuMemcpyDtoH(out.ctypes.data, self.ptr + offset, out.nbytes), "cuMemcpyDtoH")
            else:
                check(drv.cuMemcpyDtoHAsync(out.ctypes.data, self.ptr + offset, out.nbytes, stream), "cuMemcpyDtoHAsync")
                stream_synchronize(stream)
        return out

    def fill_bytes(self, value: int, nbytes: int | None = None, offset: int = 0, stream: int | None = None) -> None:
        n = self.nbytes if nbytes is None else nbytes
        drv = _drv()
        if stream is None:
            check(drv.cuMemsetD8(self.ptr + offset, value & 0xFF, n), "cuMemsetD8")
        else:
            check(drv.cuMemsetD8Async(self.ptr + offset, value & 0xFF, n, stream), "cuMemsetD8Async")


def memcpy_dtod(dst: int, src: int, nbytes: int, stream=PER_THREAD_STREAM) -> None:
    check(_drv().cuMemcpyDtoDAsync(dst, src, nbytes, stream), "cuMemcpyDtoDAsync")


def empty_cache() -> None:
    """Hand the stream-ordered pool's unused memory back to the driver (after the work queued so far), and free the
    buffers held while ops recorded into captures."""
    synchronize()
    if _POOL:
        check(_drv().cuMemPoolTrimTo(_POOL[0], 0), "cuMemPoolTrimTo")


# ---------------------------------------------------------------------------------------------------
# modules and launches

_CTYPES = {"u64": ctypes.c_uint64, "u32": ctypes.c_uint32, "s32": ctypes.c_int32, "f32": ctypes.c_float,
           "s64": ctypes.c_int64}


def _address_of(a) -> int:
    if hasattr(a, "ptr"):
        return a.ptr
    if hasattr(a, "__cuda_array_interface__"):
        return a.__cuda_array_interface__["data"][0]
    return a


class Function:
    """A loaded kernel entry point with its parameter ABI (from the manifest)."""

    def __init__(self, module, handle, name: str, params: list, block, dynamic_smem: int = 0):
        self.module = module  # keep the module alive
        self.handle = handle
        self.name = name
        self.params = params
        self.block = tuple(block)
        self.dynamic_smem = 0
        self.meta: dict = {}
        if dynamic_smem:
            self.set_dynamic_smem(dynamic_smem)

    @property
    def address(self) -> int:
        """The CUfunction as an integer (for the ctypes launch path)."""
        return int(self.handle)

    def set_dynamic_smem(self, nbytes: int) -> None:
        ctx = current()
        if nbytes > ctx.max_smem_optin:
            raise ValueError(f"{self.name}: {nbytes} B of dynamic shared memory exceeds this GPU's "
                             f"{ctx.max_smem_optin} B per block")
        drv = _drv()
        check(drv.cuFuncSetAttribute(self.handle, drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                     int(nbytes)), f"cuFuncSetAttribute({self.name}, max dynamic smem {nbytes})")
        self.dynamic_smem = nbytes

    def resident_per_sm(self, threads: int | None = None, smem: int | None = None) -> int:
        """CTAs of this kernel that fit one SM at its block size and dynamic shared memory (or `threads` per CTA
        and `smem` bytes, for kernels launched with less) — the driver's occupancy calculator: registers,
        shared memory, threads — at least 1; cached."""
        threads = threads or self.block[0] * self.block[1] * self.block[2]
        smem = self.dynamic_smem if smem is None else smem
        cache = self.__dict__.setdefault("_resident", {})
        n = cache.get((threads, smem))
        if n is None:
            drv = _drv()
            err, n = drv.cuOccupancyMaxActiveBlocksPerMultiprocessor(self.handle, threads, smem)
            check(err, f"cuOccupancyMaxActiveBlocksPerMultiprocessor({self.name})")
            n = cache[threads, smem] = max(1, int(n))
        return n

    def resident_clusters(self, size: int) -> int:
        """Thread-block clusters of `size` CTAs (along x) of this kernel that can be resident on the whole GPU at
        once — cuOccupancyMaxActiveClusters, which knows that a cluster's CTAs share one GPC (so it can be less
        than sm_count x resident_per_sm / size) — at least 1; cached. A kernel that walks a static per-cluster
        schedule sizes its grid by it: a cluster past it waits for a whole cluster to finish."""
        cache = self.__dict__.setdefault("_clusters", {})
        if size not in cache:
            drv = _drv()
            cfg = drv.CUlaunchConfig()
            cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = size, 1, 1
            cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = self.block + (1,) * (3 - len(self.block))
            cfg.sharedMemBytes = self.dynamic_smem
            at = drv.CUlaunchAttribute()
            at.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            at.value.clusterDim.x, at.value.clusterDim.y, at.value.clusterDim.z = size, 1, 1
            cfg.attrs = [at]
            cfg.numAttrs = 1
            err, n = drv.cuOccupancyMaxActiveClusters(self.handle, cfg)
            check(err, f"cuOccupancyMaxActiveClusters({self.name}, cluster {size})")
            cache[size] = max(1, int(n))
        return cache[size]

    def smem_for_residency(self, n: int) -> int:
        """The least dynamic shared memory (≥ this kernel's own) at which at most `n` of its CTAs fit one SM
        (the occupancy calculator, bisected); the function's limit is raised to allow it. Launching with it
        trades occupancy for a grid that fills the GPU better (ops._mma_gemv). Cached."""
        cache = self.__dict__.setdefault("_residency_smem", {})
        if n not in cache:
            drv = _drv()
            threads = self.block[0] * self.block[1] * self.block[2]
            err, static = drv.cuFuncGetAttribute(drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, self.handle)
            check(err, f"cuFuncGetAttribute({self.name}, static smem)")
            limit = int(current().max_smem_optin) - int(static)  # static + dynamic ≤ the opt-in maximum
            check(drv.cuFuncSetAttribute(self.handle, drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                         limit), f"cuFuncSetAttribute({self.name}, max dynamic smem {limit})")

            def fits(nbytes):
                err, k = drv.cuOccupancyMaxActiveBlocksPerMultiprocessor(self.handle, threads, nbytes)
                check(err, f"cuOccupancyMaxActiveBlocksPerMultiprocessor({self.name})")
                return int(k)
            lo, hi = self.dynamic_smem, limit
            if fits(hi) > n:
                raise ValueError(f"{self.name}: no shared-memory size limits it to {n} CTAs per SM")
            if fits(lo) <= n:
                hi = lo
            while hi - lo > 16:  # fits(lo) > n >= fits(hi)
                mid = (lo + hi) // 2 // 16 * 16
                lo, hi = (mid, hi) if fits(mid) > n else (lo, mid)
            cache[n] = hi
        return cache[n]

    def _ctypes(self):
        return [(ctypes.c_ubyte * p["size"]) if p["type"] == "b8" else _CTYPES[p["type"]] for p in self.params]

    def cells(self, args) -> list:
        """Kernel arguments → one ctypes cell per parameter, typed by the manifest's ABI. Python ints become exactly
        the parameter's C type (never a pointer-sized guess); CUtensorMaps are copied by value."""
        if len(args) != len(self.params):
            names = ", ".join(p["name"] for p in self.params)
            raise TypeError(f"{self.name} takes {len(self.params)} arguments ({names}), got {len(args)}")
        types = self.__dict__.get("_types") or self.__dict__.setdefault("_types", self._ctypes())
        cells = []
        for p, t, a in zip(self.params, types, args):
            if p["type"] == "b8":
                blob = bytes(a)
                if len(blob) != p["size"]:
                    raise ValueError(f"{self.name}: parameter {p['name']} is {p['size']} B, got {len(blob)}")
                cells.append(t.from_buffer_copy(blob))
            else:
                v = _address_of(a)
                if p["type"][0] == "u" and v < 0:
                    raise ValueError(f"{self.name}: parameter {p['name']} is unsigned, got {v}")
                cells.append(t(v))
        return cells

    def pack(self, args) -> tuple:
        """(keep-alive storage, void** address) of the arguments (`cells`)."""
        cells = self.cells(args)
        ptrs = (ctypes.c_void_p * len(cells))(*[ctypes.addressof(c) for c in cells])
        cells.append(ptrs)
        return cells, ctypes.addressof(ptrs)

    def prepare(self, grid, cells, *, block=None, smem: int | None = None, cluster=None,
                pdl: bool = False) -> "PreparedLaunch":
        """A launch of this kernel with its argument cells packed once: `PreparedLaunch.run(stream)` issues it;
        a caller may change a cell's `.value` between runs."""
        return PreparedLaunch(self, grid, cells, block or self.block, self.dynamic_smem if smem is None else smem,
                              cluster, pdl)

    def launch(self, grid, args, *, block=None, smem: int | None = None, stream=PER_THREAD_STREAM, cluster=None,
               pdl: bool = False) -> None:
        """Pack `args` and launch on `stream` (a raw handle; default the per-thread stream). `cluster`:
        thread-block cluster dims; `pdl`: programmatic dependent launch (the kernel may start while the previous one
        in the stream runs; it must `griddepcontrol.wait` before reading its output)."""
        self.prepare(grid, self.cells(args), block=block, smem=smem, cluster=cluster, pdl=pdl).run(
            stream if type(stream) is int else stream_handle(stream))


def grid_fault(grid) -> str:
    """What CUDA would refuse in a launch's grid (x, y, z; missing dimensions 1): "" where nothing."""
    g = tuple(int(v) for v in grid) + (1,) * (3 - len(tuple(grid)))
    if min(g) < 1:
        return "every dimension at least 1"
    if g[0] >= 2**31 or max(g[1:]) > 65535:
        return "x below 2^31, y and z at most 65535"
    return ""


class PreparedLaunch:
    """One kernel launch with its grid, block, shared memory, cluster / PDL attributes and argument buffer fixed:
    `run(stream)` sets the stream of a cuLaunchKernelEx config built once and makes one ctypes call with 4 arguments
    (on the H200's host 4.5 µs, where ctypes' cuLaunchKernel with its 11 arguments took 6.6 µs:
    bench/results/probe_launch_cost_2026-12-01.log)."""

    __slots__ = ("fn", "cells", "grid", "block", "smem", "cluster", "pdl", "_ptrs", "_params", "_cfg", "_cfg_ref",
                 "_attrs", "_handle", "verbose")

    def __init__(self, fn: Function, grid, cells, block, smem: int, cluster=None, pdl: bool = False):
        grid = tuple(int(g) for g in grid) + (1,) * (3 - len(tuple(grid)))
        block = tuple(int(b) for b in block) + (1,) * (3 - len(tuple(block)))
        if grid_fault(grid):
            raise ValueError(f"{fn.name}: bad grid {grid}: {grid_fault(grid)}")
        self.fn, self.cells, self.grid, self.block, self.smem = fn, list(cells), grid, block, int(smem)
        self.cluster, self.pdl = cluster, bool(pdl)
        self.verbose = knobs.verbose()  # read once per prepared launch (a plan's are remade when a knob changes)
        self._ptrs = (ctypes.c_void_p * max(len(self.cells), 1))(*[ctypes.addressof(c) for c in self.cells])
        self._params = ctypes.addressof(self._ptrs)
        self._handle = fn.address
        attrs = []
        if cluster is not None:
            a = _LaunchAttr()
            a.id = _ATTR_CLUSTER
            a.value[0], a.value[1], a.value[2] = tuple(cluster) + (1,) * (3 - len(tuple(cluster)))
            attrs.append(a)
        if pdl:
            a = _LaunchAttr()
            a.id = _ATTR_PDL
            a.value[0] = 1
            attrs.append(a)
        self._attrs = (_LaunchAttr * max(len(attrs), 1))(*attrs)
        cfg = _LaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block
        cfg.sharedMemBytes = self.smem
        cfg.attrs = ctypes.cast(self._attrs, ctypes.POINTER(_LaunchAttr))
        cfg.numAttrs = len(attrs)
        self._cfg, self._cfg_ref = cfg, ctypes.byref(cfg)

    def run(self, stream: int) -> None:
        self._cfg.hStream = stream
        rc = (_CU[0] if _CU else libcuda()).cuLaunchKernelEx(self._cfg_ref, self._handle, self._params, None)
        if rc:
            self.fail(rc)
        if self.verbose:
            print(f"ptxgen: launch {self.fn.name} grid={self.grid} block={self.block} smem={self.smem} "
                  f"stream={stream:#x}", file=sys.stderr)

    def fail(self, rc: int) -> None:
        _check_rc(rc, f"launch {self.fn.name} (grid {self.grid}, block {self.block}, smem {self.smem}, cluster "
                      f"{self.cluster}, pdl {self.pdl})")


class Module:
    def __init__(self, cubin: bytes, name: str = "module"):
        current()
        self.name = name
        self._cubin = cubin  # the driver copies it, but keep it for inspection
        self.handle = check(_drv().cuModuleLoadData(cubin), f"cuModuleLoadData({name})")

    def function(self, entry: str, params: list, block, dynamic_smem: int = 0) -> Function:
        h = check(_drv().cuModuleGetFunction(self.handle, entry.encode()), f"cuModuleGetFunction({entry})")
        return Function(self, h, entry, params, block, dynamic_smem)

    def __del__(self):
        h = getattr(self, "handle", None)
        if h is not None:
            try:
                _drv().cuModuleUnload(h)
            except Exception:  # noqa: BLE001
                pass


class Timer:
    """Events-based timing of device work on a stream: `with Timer(stream) as t: ...; t.ms`."""

    def __init__(self, stream=None):
        current()
        drv = _drv()
        self.stream = stream_handle(stream)
        self.start = check(drv.cuEventCreate(0), "cuEventCreate")
        self.stop = check(drv.cuEventCreate(0), "cuEventCreate")
        self.ms = float("nan")

    def __enter__(self):
        check(_drv().cuEventRecord(self.start, self.stream), "cuEventRecord")
        return self

    def __exit__(self, *exc):
        drv = _drv()
        check(drv.cuEventRecord(self.stop, self.stream), "cuEventRecord")
        check(drv.cuEventSynchronize(self.stop), "cuEventSynchronize")
        self.ms = float(check(drv.cuEventElapsedTime(self.start, self.stop), "cuEventElapsedTime"))
        return False
