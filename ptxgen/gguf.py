"""GGUF files: a reader that checks every count, length and offset against the file before it trusts it, and a
minimal writer (for tests, examples and the TQ4_1S type ids that the `gguf` package does not know).

The reader needs only NumPy: it maps the file (`mmap`), parses the header and the tensor table, and copies out the
one tensor asked for. A corrupt, truncated or hostile file (wrong magic, a count larger than the file could hold,
a string or array running past the end, a tensor past the end of the data, an unknown type) gives one `GGUFError`
naming the file (and the tensor), never a crash or an allocation sized by the file's claims. The `gguf` package
is the tests' oracle, not a dependency.

GGUF type ids for TQ4_1S differ between llama.cpp forks (46 in TheTom's fork at 69d8e4be, 48 in others), so TQ4_1S
is recognised by id *and* by size: its 20 bytes per 32 weights must span the tensor's data up to the alignment
padding (another fork's type under the same id gives another size).
"""
from __future__ import annotations

import difflib
import math
import mmap
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAGIC = b"GGUF"
GGML_IDS = {12: "q4_K", 13: "q5_K", 14: "q6_K", 8: "q8_0", 9: "q8_1"}  # the ggml type ids ptxgen reads
TQ4_1S_IDS = (46, 48)  # TheTom/llama-cpp-turboquant HEAD, and the fork that moved it past TURBO*_TCQ
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NESTING = 4  # arrays of arrays in metadata values
# ggml's type ids (ggml.h's enum ggml_type): name, weights per block, bytes per block; ids ggml retired are left out.
# Q8_1 is 36 bytes (two fp16, as ggml-common.h has it; the `gguf` package's table still says 40)
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
}
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class GGUFError(ValueError):
    """A GGUF file ptxgen cannot read; the message names the file (and the tensor, where one is involved)."""


class GGUFTensorNotFound(GGUFError, KeyError):
    """No tensor of that name in the file: a GGUFError like every other reading failure, and a KeyError for the
    callers that catch a failed lookup as one."""

    def __str__(self) -> str:  # KeyError's own would quote the message
        return str(self.args[0])


def type_name(type_id: int) -> str:
    """ggml's name for a type id with the id in parentheses, "Q4_K (12)"; TQ4_1S under its forks' ids."""
    if type_id in TQ4_1S_IDS:
        return f"TQ4_1S ({type_id})"
    return f"{GGML_TYPES[type_id][0]} ({type_id})" if type_id in GGML_TYPES else f"unknown ({type_id})"


def _reads() -> str:
    """The types ptxgen reads, by name, for the messages that refuse another."""
    return (", ".join(type_name(i) for i in sorted(GGML_IDS)) + " and TQ4_1S ("
            + " or ".join(map(str, TQ4_1S_IDS)) + ")")


def format_of(type_id: int) -> str | None:
    """ptxgen's format name for a GGML type id, or None for a type it does not read."""
    if type_id in GGML_IDS:
        return GGML_IDS[type_id]
    return "tq4_1s" if type_id in TQ4_1S_IDS else None


@dataclass(frozen=True)
class TensorInfo:
    """One entry of a GGUF tensor table. `dims` as GGUF stores them, innermost first: a weight matrix of M rows
    of K weights is (K, M); `offset` is absolute in the file; `end` is where the next tensor's data (or the
    file) starts, the most bytes this tensor may occupy."""

    name: str
    type_id: int
    dims: tuple[int, ...]
    offset: int
    end: int

    @property
    def fmt(self) -> str | None:
        return format_of(self.type_id)

    @property
    def type_name(self) -> str:
        """ggml's name for the type with its id, "Q4_K (12)" (for listings: the id alone says little)."""
        return type_name(self.type_id)

    @property
    def shape(self) -> tuple[int, ...]:
        """(M, K): K the innermost dimension, M the next; a 3-D tensor (an MoE layer's experts, GGUF dims
        (K, M, E)) is (E, M, K); dimensions past the third multiply into E."""
        k, m = self.dims[0], (self.dims[1] if len(self.dims) > 1 else 1)
        if len(self.dims) <= 2:
            return m, k
        e = 1
        for d in self.dims[2:]:
            e *= d
        return e, m, k


class GGUFFile:
    """An open GGUF file: `metadata` (key → value), `tensors` (name → TensorInfo), `raw(name)` (the bytes).
    Use it as a context manager, or call `close()`. `tensor`: the one tensor the caller is after, named in an
    error about the file itself (a truncated header) so that it says what the caller asked for.

    The header and the tensor table must be whole; a tensor whose data lies past the end of the file (a truncated
    file) is still listed, and only reading that tensor fails."""

    def __init__(self, path, *, tensor: str | None = None):
        self.path = Path(path)
        self._wanted = tensor
        try:
            self._file = open(self.path, "rb")
        except OSError as e:
            raise GGUFError(f"{self.path}: cannot open: {e.strerror}") from None
        try:
            size = self.path.stat().st_size
            if size < 24:
                raise self._error(f"{size} bytes is too short for a GGUF header (24 bytes)")
            self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
            self._parse()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        m = getattr(self, "_map", None)
        if m is not None:
            m.close()
            self._map = None
        self._file.close()

    def _error(self, msg: str, tensor: str | None = None) -> GGUFError:
        if tensor is not None:
            where = f"tensor {tensor!r}: "
        else:  # about the file itself: say which tensor the caller was after
            where = f"reading tensor {self._wanted!r}: " if self._wanted is not None else ""
        return GGUFError(f"{self.path}: {where}{msg}")

    # --- parsing, every read bounded by the file --------------------------------------------------------
    def _take(self, fmt: str):
        n = struct.calcsize(fmt)
        if self._pos + n > len(self._map):
            raise self._error(f"truncated: {n} bytes wanted at offset {self._pos}, the file has {len(self._map)}")
        v = struct.unpack_from(fmt, self._map, self._pos)[0]
        self._pos += n
        return v

    def _count(self, n: int, least_bytes: int, what: str) -> int:
        """A count read from the file, refused when its items (at least `least_bytes` each) could not fit in what
        is left of the file: a hostile count must not size an allocation or a loop."""
        left = len(self._map) - self._pos
        if n * least_bytes > left:
            raise self._error(f"{what} {n} cannot fit in the {left} bytes left at offset {self._pos}")
        return n

    def _string(self, what: str) -> str:
        n = self._count(self._take("<Q"), 1, f"{what} length")
        raw = self._map[self._pos:self._pos + n]
        self._pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self._error(f"{what} at offset {self._pos - n} is not UTF-8") from None

    def _value(self, type_id: int, key: str, depth: int = 0):
        if type_id in _SCALAR:
            return self._take(_SCALAR[type_id])
        if type_id == _STRING:
            return self._string(f"metadata {key!r} string")
        if type_id == _ARRAY:
            if depth >= MAX_NESTING:
                raise self._error(f"metadata {key!r}: arrays nested deeper than {MAX_NESTING}")
            et = self._take("<I")
            least = struct.calcsize(_SCALAR[et]) if et in _SCALAR else 8 if et == _STRING else 12 if et == _ARRAY else 0
            if not least:
                raise self._error(f"metadata {key!r}: unknown array element type {et}")
            n = self._count(self._take("<Q"), least, f"metadata {key!r} array length")
            if et in _SCALAR and et != 7:  # numbers: one read, not a Python loop over a long array
                out = np.frombuffer(self._map, np.dtype(_SCALAR[et]), n, self._pos).tolist()
                self._pos += n * least
                return out
            return [self._value(et, key, depth + 1) for _ in range(n)]
        raise self._error(f"metadata {key!r}: unknown value type {type_id}")

    def _parse(self) -> None:
        self._pos = 0
        if self._map[:4] != MAGIC:
            raise self._error(f"not a GGUF file (magic {bytes(self._map[:4])!r}, expected {MAGIC!r})")
        self._pos = 4
        self.version = self._take("<I")
        if self.version not in (2, 3):
            raise self._error(f"GGUF version {self.version} is not supported (2 and 3 are)")
        n_tensors, n_kv = self._take("<Q"), self._take("<Q")
        self._count(n_kv, 13, "metadata count")  # key length (8), an empty key, value type (4), a 1-byte value
        self._count(n_tensors, 32, "tensor count")  # name length, n_dims, one dim, type, offset
        self.metadata: dict = {}
        for _ in range(n_kv):
            key = self._string("metadata key")
            self.metadata[key] = self._value(self._take("<I"), key)
        alignment = self.metadata.get("general.alignment", 32)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1) or alignment > 1 << 20:
            raise self._error(f"general.alignment {alignment!r} is not a power of two up to 1 MiB")
        self.alignment = alignment
        entries = []
        for _ in range(n_tensors):
            name = self._string("tensor name")
            nd = self._take("<I")
            if not 1 <= nd <= MAX_DIMS:
                raise self._error(f"the tensor table's entry {name!r} has {nd} dimensions (1 to {MAX_DIMS} are valid)")
            dims = tuple(self._take("<Q") for _ in range(nd))
            if any(d == 0 for d in dims):
                raise self._error(f"the tensor table's entry {name!r} has a zero dimension in {dims}")
            entries.append((name, self._take("<I"), dims, self._take("<Q")))
        start = -(-self._pos // alignment) * alignment
        size = len(self._map)
        ends = sorted({start + e[3] for e in entries} | {size})
        self.tensors: dict[str, TensorInfo] = {}
        for name, type_id, dims, offset in entries:
            if name in self.tensors:
                raise self._error(f"the tensor table names {name!r} twice")
            at = start + offset
            end = next(e for e in ends if e > at) if at < size else at  # data past the end: none of it is there
            self.tensors[name] = TensorInfo(name, type_id, dims, at, end)

    # --- tensors ----------------------------------------------------------------------------------------
    def info(self, name: str) -> TensorInfo:
        t = self.tensors.get(name)
        if t is None:
            n = len(self.tensors)
            close = difflib.get_close_matches(str(name), list(self.tensors), n=5, cutoff=0.6)
            if close:
                hint = f"; the closest: {', '.join(map(repr, close))}"
            elif n:
                hint = f"; the first: {', '.join(map(repr, list(self.tensors)[:5]))}"
            else:
                hint = ""
            raise GGUFTensorNotFound(f"{self.path}: no tensor {name!r}; the file has {n} tensor{'s' * (n != 1)}{hint}")
        return t

    def raw(self, name: str) -> tuple[str, tuple[int, ...], np.ndarray]:
        """(format, (M, K) or (E, M, K), raw uint8 bytes, a copy) of one tensor that ptxgen reads."""
        from ptxgen import formats

        t = self.info(name)
        fmt = t.fmt
        if fmt is None:
            what = (f"that is {t.type_name}" if t.type_id in GGML_TYPES
                    else f"ggml names no type {t.type_id} (another fork's type?)")
            raise self._error(f"GGML type id {t.type_id} is not one ptxgen reads: {what}; ptxgen reads {_reads()}",
                              name)
        *lead, k = t.shape
        m = math.prod(lead)  # (Python ints: a hostile E·M past 2^63 must not wrap in int64 to a size the file holds)
        shown = "x".join(map(str, t.shape))
        try:
            nbytes = m * formats.get(fmt).row_bytes(k)
        except ValueError as e:
            raise self._error(f"type {fmt} with dimensions {t.dims}: {e}", name) from None
        if t.offset + nbytes > t.end:
            size = len(self._map)
            if t.offset >= size:
                raise self._error(f"its data at file offset {t.offset} lies past the end of the file ({size} bytes): "
                                  f"the file is truncated (or the offset corrupt)", name)
            if t.end >= size:
                raise self._error(f"{fmt} {shown} needs {nbytes} bytes at file offset {t.offset}, but the end of the "
                                  f"file comes {size - t.offset} bytes after it: the file is truncated", name)
            raise self._error(f"{fmt} {shown} needs {nbytes} bytes at file offset {t.offset}, but "
                              f"the next tensor's data starts {t.end - t.offset} bytes after it", name)
        if t.type_id in TQ4_1S_IDS and t.end - t.offset - nbytes >= self.alignment:
            raise self._error(f"type id {t.type_id} read as TQ4_1S needs {nbytes} bytes for {shown}, but its data "
                              f"spans {t.end - t.offset}: another fork's type under this id?", name)
        return fmt, t.shape, np.frombuffer(self._map, np.uint8, nbytes, t.offset).copy()


def read_gguf_tensor(path, tensor_name: str) -> tuple[str, tuple[int, ...], np.ndarray]:
    """(format, (M, K) — (E, M, K) for an MoE layer's experts — raw uint8 bytes) of one tensor of a .gguf file."""
    with GGUFFile(path, tensor=tensor_name) as f:
        return f.raw(tensor_name)


def list_gguf_tensors(path) -> list[TensorInfo]:
    """Every tensor of a .gguf file (name, type id, dims, format ptxgen reads it as or None)."""
    with GGUFFile(path) as f:
        return list(f.tensors.values())


TYPE_IDS = {fmt: i for i, fmt in GGML_IDS.items()} | {"tq4_1s": TQ4_1S_IDS[0]}  # what write_gguf writes per format


def _described(v) -> str:
    """What a caller passed, for a message: its type, and a NumPy array's dtype and shape."""
    if isinstance(v, np.ndarray):
        return f"a {v.dtype} array of shape {v.shape}"
    r = repr(v)
    return f"{r} ({type(v).__name__})" if len(r) <= 60 else f"a {type(v).__name__}"


def _tensor_entry(name, t) -> tuple[int, tuple[int, ...], np.ndarray]:
    """One of write_gguf's tensors as (type id, shape, raw uint8), checked: a wrong kind of value, a type id or
    shape the file cannot hold, or a byte count that is not the type's for the shape gives one TypeError /
    ValueError naming the tensor, before anything is written (the reader would refuse the file later)."""
    if not isinstance(name, str):
        raise TypeError(f"write_gguf: tensor names must be str, got {_described(name)}")
    where = f"write_gguf: tensor {name!r}"
    if hasattr(t, "fmt") and hasattr(t, "raw"):  # a QuantTensor
        if t.fmt not in TYPE_IDS:
            raise ValueError(f"{where}: format {t.fmt!r} has no GGUF type id here (have: {', '.join(TYPE_IDS)})")
        t = (TYPE_IDS[t.fmt], t.shape, t.raw())
    if not isinstance(t, (tuple, list)) or len(t) != 3:
        hint = " (quantize a float array first: QuantTensor.from_numpy(w, 'q4_K'))" if isinstance(t, np.ndarray) else ""
        raise TypeError(f"{where}: expected a QuantTensor or a (type_id, (M, K) or (E, M, K), raw uint8) tuple, "
                        f"got {_described(t)}{hint}")
    type_id, shape, raw = t
    if isinstance(type_id, bool) or not isinstance(type_id, (int, np.integer)) or not 0 <= type_id < 1 << 32:
        raise ValueError(f"{where}: the type id must be a GGML type id, a u32 int (12 for Q4_K), "
                         f"got {_described(type_id)}")
    type_id = int(type_id)
    if (not isinstance(shape, (tuple, list)) or not 1 <= len(shape) <= MAX_DIMS
            or any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) or not 0 < d < 1 << 64 for d in shape)):
        raise ValueError(f"{where}: the shape must be 1 to {MAX_DIMS} positive ints, (M, K) or (E, M, K), "
                         f"got {_described(shape)}")
    shape = tuple(int(d) for d in shape)
    if isinstance(raw, (bytes, bytearray, memoryview)):
        raw = np.frombuffer(raw, np.uint8)
    if not isinstance(raw, np.ndarray) or raw.dtype != np.uint8:
        raise TypeError(f"{where}: raw must be the tensor's bytes, uint8 (an F32 array: a.view(np.uint8)), "
                        f"got {_described(raw)}")
    raw = raw.reshape(-1)
    if type_id in GGML_TYPES:  # a size ggml fixes; TQ4_1S's ids and other forks' types are sized by the fork
        _, block, size = GGML_TYPES[type_id]
        *lead, k = shape
        rows = math.prod(lead)
        if k % block:
            raise ValueError(f"{where}: {type_name(type_id)} stores K in blocks of {block} weights; K={k} (shape "
                             f"{shape}) is not a multiple of {block}")
        want = rows * (k // block) * size
        if raw.size != want:
            raise ValueError(f"{where}: {type_name(type_id)} of shape {shape} needs {want} bytes ({rows} rows of "
                             f"{k // block} blocks of {size} B), got {raw.size}")
    return type_id, shape, raw


def write_gguf(path, tensors: dict, metadata: dict | None = None) -> None:
    """Write a minimal GGUF v3 file: tensors {name: QuantTensor, or (type_id, (M, K) or (E, M, K), raw uint8)}, metadata
    {key: str | int} (strings and unsigned 32-bit integers). TQ4_1S gets type id 46 (TheTom's fork). Used by tests
    and examples (the `gguf` package's writer does not know TQ4_1S's type ids). Every tensor and key is checked
    before the file is opened: a bad call leaves no file behind."""
    if not isinstance(tensors, Mapping):
        raise TypeError(f"write_gguf: tensors must be a dict {{name: QuantTensor or (type_id, shape, raw)}}, "
                        f"got {_described(tensors)}")
    tensors = [_tensor_entry(name, t) + (name,) for name, t in tensors.items()]
    out = bytearray(MAGIC)
    metadata = metadata or {}
    align = metadata.get("general.alignment", 32)  # the readers align the data (and each tensor) to it
    if isinstance(align, bool) or not isinstance(align, int) or align <= 0 or align & (align - 1) or align > 1 << 20:
        raise ValueError(f"write_gguf: general.alignment must be a power of two up to 1 MiB, got {align!r}")
    out += struct.pack("<IQQ", 3, len(tensors), len(metadata))
    for key, v in metadata.items():
        if not isinstance(key, str):
            raise TypeError(f"write_gguf: metadata keys must be str, got {_described(key)}")
        kb = key.encode()
        out += struct.pack("<Q", len(kb)) + kb
        if isinstance(v, str):
            vb = v.encode()
            out += struct.pack("<IQ", _STRING, len(vb)) + vb
        elif isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 32:
            out += struct.pack("<II", 4, v)
        else:
            raise TypeError(f"write_gguf: metadata {key!r} must be a str or a u32 int, got {v!r}")
    offset = 0
    blobs = []
    for type_id, shape, raw, name in tensors:
        nb = name.encode()
        dims = tuple(reversed(shape))  # innermost first: (K, M) or (K, M, E)
        out += struct.pack("<Q", len(nb)) + nb + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        out += struct.pack("<IQ", type_id, offset)
        pad = (-raw.size) % align
        blobs.append(raw.tobytes() + bytes(pad))
        offset += raw.size + pad
    out += bytes((-len(out)) % align)
    for b in blobs:
        out += b
    Path(path).write_bytes(bytes(out))
