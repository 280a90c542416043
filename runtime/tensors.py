"""`QuantTensor`: a quantized weight matrix in its original GGUF byte layout, held on the host until its first GPU
use (so it can be built, saved and inspected on a machine without a GPU), then on the GPU.

GGUF files are read by `ptxgen.gguf` (NumPy only; every count and offset checked against the file).
"""
from __future__ import annotations

import math
import operator

import numpy as np

from ptxgen import formats
from ptxgen.gguf import GGML_IDS, TQ4_1S_IDS, GGUFError, list_gguf_tensors, read_gguf_tensor, write_gguf  # noqa: F401

from .driver import DeviceBuffer


def _fmt(fmt) -> str:
    """ggml's spelling of weight format `fmt` (any letter case); an activation format (q8_1) is refused."""
    f = formats.get(fmt)
    if f.activation:
        weights = ", ".join(n for n, g in formats.FORMATS.items() if not g.activation)
        raise ValueError(f"{f.name} is an activation format; weight tensors are {weights}")
    return f.name


def _shape(fmt: str, shape) -> tuple[int, ...]:
    """(M, K) or (E, M, K) as ints, checked: positive, K whole blocks of `fmt`."""
    try:
        shape = tuple(operator.index(s) for s in shape)
    except TypeError:
        raise TypeError(f"{fmt}: shape must be a tuple of ints, (M, K) or (E, M, K); got {shape!r}") from None
    if len(shape) not in (2, 3):
        raise ValueError(f"{fmt}: a weight tensor is (M, K), or (E, M, K) for an MoE layer's experts; got {shape}")
    if min(shape[:-1]) <= 0:
        raise ValueError(f"{fmt}: shape {shape} has no rows")
    formats.get(fmt).check_k(shape[-1])
    return shape


class QuantTensor:
    """M rows of K weights in format `fmt` (ggml's spelling: q4_K, q5_K, q6_K, q8_0, tq4_1s), GGUF bytes unchanged;
    or E experts of M rows each, shape (E, M, K), as GGUF stores an MoE layer's `ffn_*_exps` (for `mul_mat_id`).

    The bytes stay on the host until the first GPU op uses the tensor (or `to_device()`), which uploads them once
    and drops the host copy. Do that before capturing a CUDA graph: an upload is not allowed while capturing.

    `max_scale`: the largest |fp16 scale field| of its blocks, read from the host bytes when the tensor is made
    (None for bytes wrapped on the GPU, unless given); past `formats.fp16_weight_scale(fmt)` some weight the
    blocks can express leaves fp16's range, and mul_mat / mul_mat_id skip the kernels that hold weights in fp16
    (the GEMMs) for the fp32 ones (`fp16_weights`).
    """

    __slots__ = ("fmt", "shape", "_host", "_device", "_owner", "_plans", "max_scale", "__weakref__")

    def __init__(self, fmt: str, shape, *, host: np.ndarray | None = None, device: DeviceBuffer | None = None,
                 owner=None, max_scale: float | None = None):
        fmt = _fmt(fmt)
        self.fmt, self.shape = fmt, _shape(fmt, shape)
        want = self.nbytes
        if (host is None) == (device is None):
            raise ValueError("QuantTensor: give exactly one of host= (bytes) or device= (a device buffer)")
        if host is not None:
            if not isinstance(host, np.ndarray) or host.dtype != np.uint8:
                what = f"dtype {host.dtype}" if isinstance(host, np.ndarray) else type(host).__name__
                raise TypeError(f"{fmt} {self.shape}: host= must be a NumPy uint8 array of the GGUF bytes, got {what} "
                                "(QuantTensor.from_raw takes bytes)")
            host = np.ascontiguousarray(host).reshape(-1)  # (.raw() gives the bytes flat, as after to_device)
        if max_scale is not None:  # (a string failed only in the op, comparing it with the fp16 bound)
            try:
                max_scale = float(max_scale) if not isinstance(max_scale, (str, bytes)) else None
            except (TypeError, ValueError):
                max_scale = None
            if max_scale is None:
                raise TypeError(f"{fmt} {self.shape}: max_scale must be a number (the largest |fp16 scale field|) or "
                                "None") from None
        if host is not None and host.nbytes != want:
            raise ValueError(f"{fmt} {self.shape}: {host.nbytes} bytes given, needs {want}")
        if device is not None and device.nbytes < want:
            raise ValueError(f"{fmt} {self.shape}: the device buffer holds {device.nbytes} B, needs {want}")
        self._host, self._device, self._owner = host, device, owner
        self._plans: dict = {}  # launch plans of the ops on this tensor (runtime.plans), dropped with it
        if max_scale is None and host is not None:
            max_scale = formats.max_scale(fmt, host, (self.rows, self.shape[-1]))
        self.max_scale = max_scale

    @property
    def fp16_weights(self) -> bool:
        """Whether every weight its blocks can express fits in fp16, so the kernels that hold weights in fp16 (the
        GEMMs) may run on it: `max_scale` within formats.fp16_weight_scale (true where it is not known)."""
        return self.max_scale is None or self.max_scale <= formats.fp16_weight_scale(self.fmt)

    def __repr__(self) -> str:
        where = "host" if self._device is None else f"device {self._device.ptr:#x}"
        return f"QuantTensor({self.fmt!r}, {self.shape}, {self.nbytes} B on the {where})"

    @property
    def format(self):
        return formats.get(self.fmt)

    @property
    def nbytes(self) -> int:
        return self.rows * self.format.row_bytes(self.shape[-1])

    @property
    def rows(self) -> int:
        """Rows of K weights in all (E·M for experts)."""
        return math.prod(self.shape[:-1])  # (Python ints: NumPy's int64 would wrap for absurd shapes)

    @property
    def experts(self) -> int:
        """E for an (E, M, K) tensor, else 1."""
        return self.shape[0] if len(self.shape) == 3 else 1

    @property
    def on_device(self) -> bool:
        return self._device is not None

    def to_device(self) -> "QuantTensor":
        """Upload the bytes now (once; later calls do nothing) and drop the host copy. Returns self."""
        if self._device is None:
            self._device = DeviceBuffer.from_host(self._host)
            self._host = None
        return self

    @property
    def buffer(self) -> DeviceBuffer:
        """The device buffer (uploading first if the bytes are still on the host)."""
        return self._device if self._device is not None else self.to_device()._device

    @property
    def ptr(self) -> int:
        return self.buffer.ptr

    @classmethod
    def from_raw(cls, fmt: str, raw, shape) -> "QuantTensor":
        """Raw GGUF bytes (uint8, whole rows of blocks) of logical shape (M, K) or (E, M, K), kept on the host until
        first use."""
        if isinstance(fmt, (np.ndarray, bytes, bytearray, memoryview)):
            raise TypeError("from_raw(fmt, raw, shape): the format comes first, then the bytes; got "
                            f"a {type(fmt).__name__} first")
        fmt = _fmt(fmt)
        shape = _shape(fmt, shape)
        rows = math.prod(shape[:-1])  # (Python ints: np.prod wrapped, to 0 rows or to -1, for absurd shapes)
        want = rows * formats.get(fmt).row_bytes(shape[-1])
        if want >= 2**63:
            raise ValueError(f"{fmt}: shape {shape} needs {want} bytes")
        blocks = formats.get(fmt).blocks(raw, (rows, shape[-1]))  # checks dtype and size
        return cls(fmt, shape, host=np.array(blocks.reshape(-1), copy=True))

    @classmethod
    def from_numpy(cls, w, fmt: str, *, allow_nonfinite: bool = False) -> "QuantTensor":
        """Quantize float32 weights (M, K) or (E, M, K) on the CPU with ptxgen.formats (NaN / inf refused unless
        `allow_nonfinite`). Needs no GPU."""
        if isinstance(w, str):
            raise TypeError(f"from_numpy(w, fmt): the weights come first, then the format; got the string {w!r} first")
        fmt = _fmt(fmt)
        w = np.asarray(w)
        if w.ndim not in (2, 3) or 0 in w.shape:
            raise ValueError(f"from_numpy: weights must be (M, K) or (E, M, K) with no empty dimension, got shape {w.shape}")
        flat = w.reshape(-1, w.shape[-1])
        return cls.from_raw(fmt, formats.quantize(fmt, flat, allow_nonfinite=allow_nonfinite), w.shape)

    @classmethod
    def from_gguf(cls, path, tensor_name: str) -> "QuantTensor":
        """One tensor of a .gguf file (its GGML type decides the format). Needs no GPU."""
        fmt, shape, raw = read_gguf_tensor(path, tensor_name)
        try:
            return cls(fmt, shape, host=raw)
        except ValueError as e:  # a tensor the file holds but QuantTensor refuses (a Q8_1 one): name it
            raise GGUFError(f"{path}: tensor {tensor_name!r}: {e}") from None

    @classmethod
    def from_device(cls, fmt: str, array, shape, *, max_scale: float | None = None) -> "QuantTensor":
        """Wrap GGUF bytes already on the GPU (a torch / cupy uint8 tensor, anything with __cuda_array_interface__ or
        DLPack), without a copy; the tensor keeps `array` alive. The bytes are not read: `max_scale` (the largest
        |fp16 scale field| of the blocks, e.g. formats.max_scale of a host copy) is what the GEMM routes check;
        left None, every weight is taken to fit fp16 (true of any real model's weights)."""
        from . import driver
        from .arrays import as_device_array

        if isinstance(array, (np.ndarray, bytes, bytearray, memoryview)):  # (uploaded, then freed under the tensor)
            raise TypeError(f"QuantTensor.from_device: array is a host {type(array).__name__}: it wraps bytes already "
                            "on the GPU; QuantTensor.from_raw(fmt, raw, shape) takes host bytes")
        driver.check_device(array, "QuantTensor.from_device: array")
        a = as_device_array(array, "QuantTensor.from_device", np.uint8, align=16)
        buf = DeviceBuffer.wrap(a.ptr, a.nbytes, owner=array)
        return cls(fmt, shape, device=buf, owner=array, max_scale=max_scale)

    @classmethod
    def cat(cls, tensors) -> "QuantTensor":
        """The rows of several (M_i, K) tensors of one format and K as one (ΣM_i, K) tensor, in order: one op instead
        of several on the same activation, as inference engines fuse a layer's q / k / v or gate / up projections.
        `mul_mat(QuantTensor.cat([wq, wk]), x)` is x @ [Wq; Wk].T, q and k its column ranges: one activation prep,
        one launch whose grid covers the GPU better than the small projections' alone (`torch.split(y, [M_q, M_k],
        dim=-1)` gives views). GGUF rows are independent, so the bytes are the inputs' bytes one after another;
        the result lives on the host until its first GPU use (inputs already on the GPU are read back first, a
        load-time copy) and its max_scale is read from those bytes."""
        if isinstance(tensors, QuantTensor):
            raise TypeError("QuantTensor.cat: takes a list of tensors, got one QuantTensor (cat([a, b]), not cat(a))")
        tensors = list(tensors)
        if not tensors:
            raise ValueError("QuantTensor.cat: no tensors given")
        for i, t in enumerate(tensors):
            if not isinstance(t, QuantTensor):
                raise TypeError(f"QuantTensor.cat: item {i} is a {type(t).__name__}, not a QuantTensor")
            if len(t.shape) != 2:
                raise ValueError(f"QuantTensor.cat: item {i} {t!r} holds experts: cat takes (M, K) tensors")
        first = tensors[0]
        for i, t in enumerate(tensors[1:], 1):
            if t.fmt != first.fmt or t.shape[1] != first.shape[1]:
                raise ValueError(f"QuantTensor.cat: item {i} is {t.fmt} with K = {t.shape[1]}, item 0 {first.fmt} with "
                                 f"K = {first.shape[1]}: the rows of one format and K only")
        raw = np.concatenate([t._host.reshape(-1).view(np.uint8) if t._device is None else t.raw() for t in tensors])
        return cls(first.fmt, (sum(t.shape[0] for t in tensors), first.shape[1]), host=raw)  # max_scale: the bytes

    def expert(self, e: int) -> "QuantTensor":
        """Expert `e` of an (E, M, K) tensor as an (M, K) QuantTensor over the same bytes (no copy on the GPU; on
        the host, a copy of its rows): what mul_mat runs for one expert, e.g. a reference or a dense fallback."""
        if len(self.shape) != 3:
            raise ValueError(f"expert: {self!r} holds no experts (shape {self.shape})")
        n, m, k = self.shape
        if isinstance(e, bool) or not isinstance(e, (int, np.integer)):  # (int(1.5) picked expert 1)
            raise TypeError(f"expert: e must be an int, got {e!r}")
        if not 0 <= int(e) < n:
            raise IndexError(f"expert: {e} is not one of the {n} experts")
        size = m * self.format.row_bytes(k)
        if self._device is None:
            return QuantTensor(self.fmt, (m, k), host=self._host[int(e) * size:(int(e) + 1) * size].copy())
        view = DeviceBuffer.wrap(self._device.ptr + int(e) * size, size, owner=self)
        return QuantTensor(self.fmt, (m, k), device=view, owner=self, max_scale=self.max_scale)  # (≥ the expert's)

    def raw(self) -> np.ndarray:
        """The GGUF bytes on the host (a copy)."""
        if self._device is None:
            return self._host.copy()
        return self._device.download(np.uint8, (self.nbytes,))
