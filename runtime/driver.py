"""The CUDA driver, through cuda-python's `cuda.bindings.driver`: context, device memory, modules, launches,
events.

Why the driver API and not `cuda.core` for launches: ptxgen's kernels take a CUtensorMap by value (a
128-byte parameter, as nvcc passes a `__grid_constant__` one), opt into more than 48 KB of dynamic shared
memory and may set cluster dimensions; the driver's `cuLaunchKernelEx` with a packed `void**` does all
three on every cuda-python release we meet (12.x on older images, 13.x here), so there is one launch path.
cuda-python is imported on first use: importing ptxgen.runtime works on a machine without a driver.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from ptxgen import knobs


class CudaError(RuntimeError):
    """A CUDA driver call failed; the message names the call and the driver's error."""


_LOCK = threading.Lock()
_CTX = None


def _drv():
    try:
        from cuda.bindings import driver
    except ImportError:  # very old cuda-python
        try:
            from cuda import cuda as driver  # type: ignore
        except ImportError as e:
            raise RuntimeError("ptxgen.runtime needs cuda-python (pip install cuda-bindings)") from e
    return driver


def check(result, what: str = "CUDA call"):
    """Unpack a cuda-python result tuple, raising CudaError (or MemoryError for out-of-memory)."""
    drv = _drv()
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        _, name = drv.cuGetErrorName(err)
        _, text = drv.cuGetErrorString(err)
        name = name.decode() if isinstance(name, bytes) else str(name)
        text = text.decode() if isinstance(text, bytes) else str(text)
        msg = f"{what} failed: {name} ({text})"
        if int(err) == int(drv.CUresult.CUDA_ERROR_OUT_OF_MEMORY):
            raise MemoryError(msg)
        raise CudaError(msg)
    return rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)


@dataclass
class Context:
    device: object
    ctx: object
    name: str
    sm: int  # compute capability as major*10+minor
    sm_count: int
    max_smem_optin: int
    l2_bytes: int


def current() -> Context:
    """The process's CUDA context on device 0 (PTXGEN_DEVICE later), created on first use."""
    global _CTX
    if _CTX is not None:
        return _CTX
    with _LOCK:
        if _CTX is not None:
            return _CTX
        try:
            drv = _drv()
            check(drv.cuInit(0), "cuInit")
        except (CudaError, OSError, RuntimeError) as e:
            raise RuntimeError(f"ptxgen.runtime: no usable CUDA driver/GPU on this machine ({e}). "
                               "The GPU ops need an NVIDIA GPU and driver; ptxgen emit/check and the "
                               "NumPy references work without one.") from None
        n = check(drv.cuDeviceGetCount(), "cuDeviceGetCount")
        if n == 0:
            raise RuntimeError("ptxgen.runtime: the CUDA driver sees no GPU")
        dev = check(drv.cuDeviceGet(0), "cuDeviceGet")
        ctx = check(drv.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
        check(drv.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        A = drv.CUdevice_attribute
        attr = lambda a: check(drv.cuDeviceGetAttribute(a, dev), "cuDeviceGetAttribute")  # noqa: E731
        major = attr(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
        minor = attr(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
        name = check(drv.cuDeviceGetName(256, dev), "cuDeviceGetName")
        name = name.split(b"\0")[0].decode() if isinstance(name, bytes) else str(name)
        _CTX = Context(dev, ctx, name, major * 10 + minor, attr(A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
                       attr(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
                       attr(A.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE))
        return _CTX


def synchronize() -> None:
    current()
    check(_drv().cuCtxSynchronize(), "cuCtxSynchronize")


# ---------------------------------------------------------------------------------------------------
# memory

_POOL: dict[int, list[int]] = {}  # rounded size → free device pointers (cuMemFree synchronises the GPU)


def _bucket(nbytes: int) -> int:
    n = max(int(nbytes), 256)
    return 1 << (n - 1).bit_length() if n <= 1 << 26 else (n + (1 << 20) - 1) >> 20 << 20


def empty_cache() -> None:
    """Return every pooled block to the driver."""
    drv = _drv()
    for ptrs in _POOL.values():
        for p in ptrs:
            check(drv.cuMemFree(p), "cuMemFree")
    _POOL.clear()


class DeviceBuffer:
    """Device memory (cuMemAlloc) from a size-bucketed pool: freeing returns the block to the pool, because
    cuMemFree waits for the whole GPU and would serialise every op that allocates its output."""

    def __init__(self, nbytes: int):
        current()
        self.nbytes = int(nbytes)
        self._bucket = _bucket(self.nbytes)
        free = _POOL.get(self._bucket)
        if free:
            self.ptr = free.pop()
            return
        drv = _drv()
        try:
            self.ptr = int(check(drv.cuMemAlloc(self._bucket), f"cuMemAlloc({self.nbytes} B)"))
        except MemoryError:
            empty_cache()
            self.ptr = int(check(drv.cuMemAlloc(self._bucket), f"cuMemAlloc({self.nbytes} B)"))

    def __del__(self):
        ptr = getattr(self, "ptr", 0)
        if ptr:
            _POOL.setdefault(self._bucket, []).append(ptr)
            self.ptr = 0

    @classmethod
    def from_host(cls, arr: np.ndarray) -> "DeviceBuffer":
        arr = np.ascontiguousarray(arr)
        buf = cls(arr.nbytes)
        buf.upload(arr)
        return buf

    def upload(self, arr: np.ndarray, offset: int = 0) -> None:
        arr = np.ascontiguousarray(arr)
        if offset + arr.nbytes > self.nbytes:
            raise ValueError(f"upload of {arr.nbytes} B at {offset} overflows a {self.nbytes} B buffer")
        if arr.nbytes:
            check(_drv().cuMemcpyHtoD(self.ptr + offset, arr.ctypes.data, arr.nbytes), "cuMemcpyHtoD")

    def download(self, dtype, shape, offset: int = 0) -> np.ndarray:
        out = np.empty(shape, dtype)
        if offset + out.nbytes > self.nbytes:
            raise ValueError(f"download of {out.nbytes} B at {offset} overruns a {self.nbytes} B buffer")
        if out.nbytes:
            check(_drv().cuMemcpyDtoH(out.ctypes.data, self.ptr + offset, out.nbytes), "cuMemcpyDtoH")
        return out

    def fill_bytes(self, value: int, nbytes: int | None = None, offset: int = 0) -> None:
        n = self.nbytes if nbytes is None else nbytes
        check(_drv().cuMemsetD8(self.ptr + offset, value & 0xFF, n), "cuMemsetD8")


def memcpy_dtod(dst: int, src: int, nbytes: int, stream=0) -> None:
    check(_drv().cuMemcpyDtoDAsync(dst, src, nbytes, stream), "cuMemcpyDtoDAsync")


# ---------------------------------------------------------------------------------------------------
# modules and launches

class Function:
    """A loaded kernel entry point with its parameter ABI (from the manifest)."""

    def __init__(self, module, handle, name: str, params: list, block, dynamic_smem: int = 0):
        self.module = module  # keep the module alive
        self.handle = handle
        self.name = name
        self.params = params
        self.block = tuple(block)
        self.dynamic_smem = 0
        if dynamic_smem:
            self.set_dynamic_smem(dynamic_smem)

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
        import ctypes

        table = {"u64": ctypes.c_uint64, "u32": ctypes.c_uint32, "s32": ctypes.c_int32, "f32": ctypes.c_float,
                 "s64": ctypes.c_int64}
        return [(ctypes.c_ubyte * p["size"]) if p["type"] == "b8" else table[p["type"]] for p in self.params]

    def pack(self, args) -> tuple:
        """Kernel arguments → (keep-alive storage, void** address), typed by the manifest's ABI. Python ints
        become exactly the parameter's C type (never a pointer-sized guess); CUtensorMaps are copied by value."""
        import ctypes

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
                v = a.ptr if hasattr(a, "ptr") else a.__cuda_array_interface__["data"][0] \
                    if hasattr(a, "__cuda_array_interface__") else a
                if p["type"][0] == "u" and v < 0:
                    raise ValueError(f"{self.name}: parameter {p['name']} is unsigned, got {v}")
                cells.append(t(v))
        ptrs = (ctypes.c_void_p * len(cells))(*[ctypes.addressof(c) for c in cells])
        cells.append(ptrs)
        return cells, ctypes.addressof(ptrs)

    def launch(self, grid, args, *, block=None, smem: int | None = None, stream=0, cluster=None,
               pdl: bool = False) -> None:
        """`cluster`: thread-block cluster dims; `pdl`: programmatic dependent launch (the kernel may start
        while the previous one in the stream runs; it must `griddepcontrol.wait` before reading its output)."""
        drv = _drv()
        grid = tuple(grid) + (1,) * (3 - len(tuple(grid)))
        block = tuple(block or self.block)
        block = block + (1,) * (3 - len(block))
        if any(g <= 0 for g in grid) or any(g >= 2**31 for g in grid):
            raise ValueError(f"{self.name}: bad grid {grid}")
        smem = self.dynamic_smem if smem is None else smem
        storage, params = self.pack(args)
        if cluster is None and not pdl:
            check(drv.cuLaunchKernel(self.handle, *grid, *block, smem, stream, params, 0), f"launch {self.name}")
        else:
            cfg = drv.CUlaunchConfig()
            cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
            cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block
            cfg.sharedMemBytes = smem
            cfg.hStream = stream
            attrs = []
            if cluster is not None:
                at = drv.CUlaunchAttribute()
                at.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
                at.value.clusterDim.x, at.value.clusterDim.y, at.value.clusterDim.z = tuple(cluster) + (1,) * (3 - len(cluster))
                attrs.append(at)
            if pdl:
                at = drv.CUlaunchAttribute()
                at.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
                at.value.programmaticStreamSerializationAllowed = 1
                attrs.append(at)
            cfg.attrs = attrs
            cfg.numAttrs = len(attrs)
            check(drv.cuLaunchKernelEx(cfg, self.handle, params, 0), f"launch {self.name} (cluster {cluster}, pdl {pdl})")
        del storage
        if knobs.verbose():
            import sys

            print(f"ptxgen: launch {self.name} grid={grid} block={block} smem={smem}", file=sys.stderr)


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
    """Events-based timing of device work: `with Timer() as t: ...; t.ms`."""

    def __init__(self, stream=0):
        current()
        drv = _drv()
        self.stream = stream
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
