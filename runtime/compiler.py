"""PTX → cubin in-process with nvJitLink (no GPU needed), cached in memory and on disk.

The cache key covers everything that changes the binary: the PTX text, the target, the options, the
nvJitLink version and ptxgen's version. Disk entries carry a header with the payload's length and sha256;
a truncated or corrupted entry is detected, deleted and rebuilt, never loaded. Writes are atomic (temp
file, then os.replace). A failed compile leaves its PTX in the temp directory for the error's reproduce command,
one file per distinct failure (ptxgen-failed-<target>-<hash>.ptx): repeating a failure overwrites it.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ptxgen import __version__, knobs

_MAGIC = b"PTXGENC1"
_HEADER = struct.Struct("<8sQ32s")  # magic, payload length, sha256(payload)


class CompileError(RuntimeError):
    """nvJitLink rejected the PTX; the message carries its log and a command to reproduce."""


@dataclass
class CompileResult:
    cubin: bytes
    target: str
    log: str
    from_cache: str = ""  # "", "memory" or "disk"
    resources: dict = field(default_factory=dict)  # entry → {registers, smem, stack, spill_stores, spill_loads}


def nvjitlink_version() -> tuple[int, int]:
    from cuda.bindings import nvjitlink

    return tuple(nvjitlink.version())


def cache_key(ptx: str, target: str, options: tuple = ()) -> str:
    h = hashlib.sha256()
    for part in (ptx, target, "\0".join(options), repr(nvjitlink_version()), __version__):
        h.update(part.encode())
        h.update(b"\0\1")
    return h.hexdigest()


_MEMORY: dict[str, CompileResult] = {}

# two log dialects: ptxas' ("Compiling entry function 'k'", "Used 8 registers", "... spill stores") and the
# linker's summary ("Function properties for 'k':", "used 24 registers, ..., 0 stack, 0 bytes smem, ..., 0 bytes lmem")
_RES = re.compile(r"(?:Compiling entry function|Function properties for) '(?P<name>[^']+)'|"
                  r"(?P<stack>\d+) bytes stack frame, (?P<ss>\d+) bytes spill stores, (?P<sl>\d+) bytes spill loads|"
                  r"[Uu]sed (?P<regs>\d+) registers(?:, used (?P<bar>\d+) barriers)?(?:, (?P<stack2>\d+) stack)?"
                  r"(?:, (?P<smem>\d+) bytes smem)?(?:, \d+ bytes cmem\[\d+\])?(?:, (?P<lmem>\d+) bytes lmem)?")


def parse_resources(log: str) -> dict:
    """nvJitLink's verbose log → {entry: {registers, smem, stack, spill_stores, spill_loads, lmem}}."""
    out: dict = {}
    cur = None
    for m in _RES.finditer(log):
        if m.group("name"):
            cur = out.setdefault(m.group("name"), {"registers": 0, "smem": 0, "stack": 0, "spill_stores": 0,
                                                    "spill_loads": 0, "lmem": 0})
        elif cur is None:
            continue
        elif m.group("stack"):
            cur.update(stack=int(m.group("stack")), spill_stores=int(m.group("ss")), spill_loads=int(m.group("sl")))
        elif m.group("regs"):
            cur["registers"] = int(m.group("regs"))
            cur["smem"] = max(cur["smem"], int(m.group("smem") or 0))
            if m.group("stack2") is not None:
                cur["stack"] = max(cur["stack"], int(m.group("stack2")))
            if m.group("lmem") is not None:
                cur["lmem"] = int(m.group("lmem"))
    return out


def _link(ptx: str, target: str, options: tuple) -> tuple[bytes, str]:
    from cuda.bindings import nvjitlink

    opts = [f"-arch={target}", "-verbose", *options]
    handle = nvjitlink.create(len(opts), opts)
    try:
        data = ptx.encode()
        try:
            nvjitlink.add_data(handle, nvjitlink.InputType.PTX, data, len(data), "ptxgen.ptx")
            nvjitlink.complete(handle)
        except Exception as e:  # nvJitLinkError: report the error log, not just the code
            size = nvjitlink.get_error_log_size(handle)
            buf = bytearray(size)
            if size:
                nvjitlink.get_error_log(handle, buf)
            log = buf.decode(errors="replace").rstrip("\0")
            raise CompileError(_failure_message(ptx, target, options, f"{e}\n{log}")) from None
        n = nvjitlink.get_linked_cubin_size(handle)
        cubin = bytearray(n)
        nvjitlink.get_linked_cubin(handle, cubin)
        size = nvjitlink.get_info_log_size(handle)
        buf = bytearray(size)
        if size:
            nvjitlink.get_info_log(handle, buf)
        return bytes(cubin), buf.decode(errors="replace").rstrip("\0")
    finally:
        nvjitlink.destroy(handle)


def _ptxas(ptx: str, target: str, options: tuple) -> tuple[bytes, str]:
    """Whole-program compile with the ptxas binary: (cubin, its -v log)."""
    tool = _tool("ptxas", "nvidia-cuda-nvcc")
    with tempfile.TemporaryDirectory(prefix="ptxgen-ptxas-") as d:
        src, out = Path(d) / "k.ptx", Path(d) / "k.cubin"
        src.write_text(ptx)
        run = subprocess.run([tool, f"-arch={target}", "-v", *options, str(src), "-o", str(out)],
                             capture_output=True, text=True)
        if run.returncode:
            raise CompileError(_failure_message(ptx, target, options, run.stderr).replace("nvJitLink", "ptxas", 1))
        return out.read_bytes(), run.stderr


def failed_ptx_path(ptx: str, target: str, options: tuple = ()) -> Path:
    """Where a failed compile's PTX is kept for the user: the temp directory, named by a hash of what was
    compiled, so that the same failure again overwrites its file instead of adding one per attempt."""
    h = hashlib.sha256("\0".join((ptx, target, *options)).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"ptxgen-failed-{target}-{h}.ptx"


def _failure_message(ptx: str, target: str, options: tuple, log: str) -> str:
    path = failed_ptx_path(ptx, target, options)
    try:
        _write_atomic(path, ptx.encode(), prefix=".ptxgen-failed-")  # test workers may fail on the same PTX at once
        where = f"reproduce: ptxas -arch={target} {' '.join(options)} -v {path} -o /dev/null"
    except OSError as e:
        where = f"(the PTX could not be saved to {path}: {e.strerror})"
    return f"nvJitLink failed for {target}:\n{log.strip()}\n{where}"


def _read_disk(path: Path) -> bytes | None:
    try:
        blob = path.read_bytes()
    except OSError:
        return None
    if len(blob) >= _HEADER.size:
        magic, n, digest = _HEADER.unpack_from(blob)
        payload = blob[_HEADER.size:]
        if magic == _MAGIC and n == len(payload) and hashlib.sha256(payload).digest() == digest:
            return payload
    if knobs.verbose():
        print(f"ptxgen: cache entry {path} is corrupt; rebuilding", file=sys.stderr)
    try:
        path.unlink()
    except OSError:
        pass
    return None


def _write_disk(path: Path, payload: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(path, _HEADER.pack(_MAGIC, len(payload), hashlib.sha256(payload).digest()) + payload)


def _write_atomic(path: Path, blob: bytes, prefix: str = ".tmp-") -> None:
    """`blob` to `path` through a temp file and os.replace: a reader sees the old file or the new one, never part."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=prefix)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _pack_entry(cubin: bytes, log: str) -> bytes:
    lb = log.encode()
    return struct.pack("<Q", len(lb)) + lb + cubin


def _unpack_entry(payload: bytes) -> tuple[bytes, str]:
    (n,) = struct.unpack_from("<Q", payload)
    return payload[8 + n:], payload[8:8 + n].decode()


def compile_ptx(ptx: str, target: str, options: tuple = (), name: str = "kernel",
                whole_program: bool = False) -> CompileResult:
    """Compile `ptx` for `target` (e.g. "sm_90", "sm_90a"), through the memory and disk caches. nvJitLink
    compiles PTX as a relocatable unit, where ptxas ignores `setmaxnreg`; `whole_program=True` runs the ptxas
    binary instead (PATH or an nvidia-* wheel's bin/; FileNotFoundError if there is none) — what the driver's
    JIT does when the runtime loads such a kernel (manifest meta "compile": "whole-program")."""
    options = tuple(options) + (("--whole-program",) if whole_program else ())
    key = cache_key(ptx, target, options)
    hit = _MEMORY.get(key)
    if hit is not None:
        return CompileResult(hit.cubin, target, hit.log, "memory", hit.resources)
    path = knobs.cache_dir() / key[:2] / f"{key}.cubin"
    payload = _read_disk(path) if knobs.cache_enabled() else None
    source = "disk"
    if payload is None:
        cubin, log = _ptxas(ptx, target, options[:-1]) if whole_program else _link(ptx, target, options)
        source = ""
        if knobs.cache_enabled():
            _write_disk(path, _pack_entry(cubin, log))
    else:
        cubin, log = _unpack_entry(payload)
    res = CompileResult(cubin, target, log, source, parse_resources(log))
    _MEMORY[key] = res
    if knobs.verbose():
        print(f"ptxgen: {name} for {target}: {'cache ' + source if source else 'compiled'} ({key[:12]})", file=sys.stderr)
    keep = knobs.keep_dir()
    if keep is not None:
        keep_artifacts(keep / f"{name}.{target}", ptx, res)
    return res


def keep_artifacts(stem: Path, ptx: str, res: CompileResult) -> None:
    stem.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{stem}.ptx").write_text(ptx)
    Path(f"{stem}.cubin").write_bytes(res.cubin)
    Path(f"{stem}.log").write_text(res.log)
    try:
        Path(f"{stem}.sass").write_text(sass(res.cubin))
    except FileNotFoundError:
        pass


def _tool(name: str, wheel: str = "nvidia-cuda-nvdisasm (the `tools` extra)") -> str:
    found = shutil.which(name)
    if found:
        return found
    try:
        import nvidia

        for base in nvidia.__path__:
            for cand in Path(base).glob(f"*/bin/{name}"):
                return str(cand)
    except ImportError:
        pass
    raise FileNotFoundError(f"{name} not found: pip install {wheel} or put the CUDA toolkit's bin/ on PATH")


def sass(cubin: bytes) -> str:
    """Disassemble a cubin with nvdisasm (from the nvidia-cuda-nvdisasm wheel or the toolkit)."""
    tool = _tool("nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, "-c", f.name], check=True,
                              capture_output=True, text=True).stdout


HOT_OPS = ("HGMMA", "IGMMA", "HMMA", "IMMA", "IDP", "FFMA")  # what marks a kernel's main loop, first found wins


def hot_loop(sass_text: str) -> dict | None:
    """The main loop of a kernel from its SASS (nvdisasm -c): the innermost backward branch whose body holds
    the kernel's hottest kind of instruction (tensor-core ops first, then dp4a, then FFMA). Returns
    {"instructions": per iteration (one thread), "ops": {opcode: count}, "marker": that kind}, or None when no
    loop holds any of them. Static: it counts each instruction of the body once, predicated or not."""
    lines = sass_text.splitlines()
    labels = {}
    for i, line in enumerate(lines):
        m = re.match(r"^\s*(\.L_x_\d+):", line)
        if m:
            labels[m.group(1)] = i
    loops = []  # (first line, last line) of every backward branch
    for i, line in enumerate(lines):
        m = re.search(r"\bBRA\b[^`]*`\((\.L_x_\d+)\)", line)
        if m and m.group(1) in labels and labels[m.group(1)] < i:
            loops.append((labels[m.group(1)], i))
    instr = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]*)")

    def body(a, b):
        return [m.group(1) for m in (instr.match(x) for x in lines[a:b + 1]) if m]

    for marker in HOT_OPS:
        hot = [(b - a, a, b) for a, b in loops if any(op.startswith(marker) for op in body(a, b))]
        if hot:
            _, a, b = min(hot)
            ops = body(a, b)
            counts: dict = {}
            for op in ops:
                counts[op] = counts.get(op, 0) + 1
            return {"instructions": len(ops), "ops": dict(sorted(counts.items(), key=lambda kv: -kv[1])),
                    "marker": marker}
    return None
