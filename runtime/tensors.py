"""`QuantTensor`: a quantized weight matrix on the GPU in its original GGUF byte layout, and GGUF loading.

GGUF type ids for TQ4_1S differ between llama.cpp forks (46 in TheTom's fork at 69d8e4be, 48 in others),
and `gguf`'s reader refuses ids it does not know. So a tensor whose id the reader rejects is read by a small
header parser here, and TQ4_1S is recognised by id *and* by size: 20 bytes per 32 weights.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ptxgen import formats

from .driver import DeviceBuffer

GGML_IDS = {12: "q4_K", 13: "q5_K", 14: "q6_K", 8: "q8_0", 9: "q8_1"}
TQ4_1S_IDS = (46, 48)  # TheTom/llama-cpp-turboquant HEAD, and the fork that moved it past TURBO*_TCQ


@dataclass
class QuantTensor:
    fmt: str
    shape: tuple  # logical (M, K): M rows of K weights
    buffer: DeviceBuffer

    def __post_init__(self):
        f = formats.get(self.fmt)
        m, k = self.shape
        if m <= 0:
            raise ValueError(f"{self.fmt}: M={m} rows")
        f.check_k(k)
        want = m * f.row_bytes(k)
        if self.buffer.nbytes < want:
            raise ValueError(f"{self.fmt} {self.shape}: buffer holds {self.buffer.nbytes} B, needs {want}")

    @property
    def format(self):
        return formats.get(self.fmt)

    @property
    def nbytes(self) -> int:
        return self.shape[0] * self.format.row_bytes(self.shape[1])

    @property
    def ptr(self) -> int:
        return self.buffer.ptr

    @classmethod
    def from_raw(cls, fmt: str, raw, shape) -> "QuantTensor":
        """Upload raw GGUF bytes (uint8, whole rows of blocks) of logical shape (M, K)."""
        m, k = (int(s) for s in shape)
        blocks = formats.get(fmt).blocks(raw, (m, k))  # checks dtype and size, names the format
        return cls(fmt, (m, k), DeviceBuffer.from_host(blocks.reshape(-1)))

    @classmethod
    def from_numpy(cls, w: np.ndarray, fmt: str) -> "QuantTensor":
        """Quantize float32 weights (M, K) with ptxgen.formats and upload."""
        w = np.asarray(w)
        if w.ndim != 2:
            raise ValueError(f"from_numpy: weights must be 2-D (M, K), got shape {w.shape}")
        return cls.from_raw(fmt, formats.quantize(fmt, w), w.shape)

    @classmethod
    def from_gguf(cls, path, tensor_name: str) -> "QuantTensor":
        fmt, shape, raw = read_gguf_tensor(path, tensor_name)
        return cls.from_raw(fmt, raw, shape)

    def raw(self) -> np.ndarray:
        """The bytes back on the host."""
        return self.buffer.download(np.uint8, (self.nbytes,))


def _format_of(type_id: int, n_elems: int, n_bytes_avail: int | None, name: str) -> str:
    if type_id in GGML_IDS:
        return GGML_IDS[type_id]
    if type_id in TQ4_1S_IDS:
        return "tq4_1s"
    raise ValueError(f"{name}: GGML type id {type_id} is not one ptxgen reads "
                     f"(ids: {GGML_IDS}, TQ4_1S: {TQ4_1S_IDS})")


def read_gguf_tensor(path, tensor_name: str) -> tuple[str, tuple, np.ndarray]:
    """(format, (M, K), raw uint8 bytes) of one tensor of a .gguf file."""
    path = Path(path)
    try:
        from gguf import GGUFReader

        reader = GGUFReader(str(path))
    except ValueError as e:  # an id the gguf package does not know (TQ4_1S in a fork's file)
        if "GGMLQuantizationType" not in str(e) and "is not a valid" not in str(e):
            raise
        return _read_unknown_type(path, tensor_name)
    names = [t.name for t in reader.tensors]
    for t in reader.tensors:
        if t.name == tensor_name:
            k = int(t.shape[0])
            m = int(np.prod(t.shape[1:])) if len(t.shape) > 1 else 1
            fmt = _format_of(int(t.tensor_type), m * k, int(t.n_bytes), tensor_name)
            return fmt, (m, k), np.asarray(t.data, np.uint8).reshape(-1)
    raise KeyError(f"{path}: no tensor {tensor_name!r}; it has {len(names)}: {', '.join(names[:10])}...")


# --- a minimal GGUF v2/v3 parser for tensors whose type the gguf package rejects ------------------------

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def _read_unknown_type(path: Path, tensor_name: str):
    data = path.read_bytes()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return v[0]

    def string():
        nonlocal pos
        n = take("<Q")
        s = data[pos:pos + n].decode("utf-8", "replace")
        pos += n
        return s

    def value(t):
        if t in _SCALAR:
            return take(_SCALAR[t])
        if t == 8:
            return string()
        if t == 9:
            et, n = take("<I"), take("<Q")
            return [value(et) for _ in range(n)]
        raise ValueError(f"{path}: unknown GGUF value type {t}")

    if data[:4] != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    pos = 4
    version = take("<I")
    if version < 2:
        raise ValueError(f"{path}: GGUF version {version} is not supported")
    n_tensors, n_kv = take("<Q"), take("<Q")
    alignment = 32
    for _ in range(n_kv):
        key = string()
        v = value(take("<I"))
        if key == "general.alignment":
            alignment = int(v)
    infos = []
    for _ in range(n_tensors):
        name = string()
        nd = take("<I")
        dims = [take("<Q") for _ in range(nd)]
        infos.append((name, dims, take("<I"), take("<Q")))
    start = (pos + alignment - 1) // alignment * alignment
    for name, dims, type_id, offset in infos:
        if name != tensor_name:
            continue
        k = int(dims[0])
        m = int(np.prod(dims[1:])) if len(dims) > 1 else 1
        fmt = _format_of(type_id, m * k, None, name)
        nbytes = m * formats.get(fmt).row_bytes(k)
        if fmt == "tq4_1s" and nbytes != m * k // 32 * 20:
            raise ValueError(f"{name}: type id {type_id} but {nbytes} B is not 20 B per 32 weights")
        raw = np.frombuffer(data, np.uint8, nbytes, start + offset)
        return fmt, (m, k), raw.copy()
    raise KeyError(f"{path}: no tensor {tensor_name!r}; it has: {', '.join(i[0] for i in infos[:10])}")


def write_gguf(path, tensors: dict) -> None:
    """Write a minimal GGUF v3 file: {name: (type_id, (M, K), raw uint8)}. Used by tests and examples to
    make TQ4_1S files (the gguf package's writer does not know its type ids)."""
    out = bytearray(b"GGUF")
    out += struct.pack("<IQQ", 3, len(tensors), 0)
    offset = 0
    blobs = []
    for name, (type_id, (m, k), raw) in tensors.items():
        nb = name.encode()
        out += struct.pack("<Q", len(nb)) + nb + struct.pack("<I", 2) + struct.pack("<QQ", k, m)
        out += struct.pack("<IQ", type_id, offset)
        raw = np.asarray(raw, np.uint8).reshape(-1)
        pad = (-raw.size) % 32
        blobs.append(raw.tobytes() + bytes(pad))
        offset += raw.size + pad
    out += bytes((-len(out)) % 32)
    for b in blobs:
        out += b
    Path(path).write_bytes(bytes(out))
