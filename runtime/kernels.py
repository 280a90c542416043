"""Finding, compiling and loading ptxgen's kernels: from the packaged `emitted/` (works with numpy and
cuda-python alone) or emitted on the fly from the DSL (needs jinja2)."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from ptxgen import knobs

from .compiler import compile_ptx
from .driver import Function, Module, current


class KernelNotFound(ValueError):
    pass


def _emitted_root():
    d = knobs.emitted_dir()
    return d if d is not None else _packaged_root()


@lru_cache(maxsize=None)
def _packaged_root():
    import importlib.util

    # find the folder without importing the package (no __pycache__ inside emitted/)
    spec = importlib.util.find_spec("ptxgen.emitted")
    if spec is None or not spec.submodule_search_locations:
        raise KernelNotFound("the packaged emitted/ kernels are missing; reinstall ptxgen or set PTXGEN_EMITTED_DIR")
    return Path(list(spec.submodule_search_locations)[0])


@lru_cache(maxsize=None)
def manifest(arch: str) -> dict:
    root = _emitted_root()
    path = root / arch / "manifest.json"
    try:
        text = path.read_text()
    except (FileNotFoundError, OSError):
        return {}
    return {k["kernel"]: k for k in json.loads(text)["kernels"]}


def available(kernel: str) -> list[str]:
    """The targets `kernel` has a build for: emitted/'s, or for a kernel ptxgen does not ship
    (ptxgen.kernels.NOT_SHIPPED) the targets its DSL builds it for, on demand."""
    from ptxgen.arch import ARCHES

    unshipped = _unshipped(kernel)
    return [a for a in ARCHES if kernel in manifest(a) or (unshipped is not None and a in unshipped.archs)]


def _unshipped(kernel: str):
    """The KernelDef of a kernel built on demand instead of shipped in emitted/, else None."""
    from ptxgen.kernels import KERNELS, NOT_SHIPPED

    return KERNELS[kernel] if kernel in NOT_SHIPPED else None


@lru_cache(maxsize=None)
def _built(kernel: str, arch: str) -> tuple[str, dict]:
    from ptxgen.kernels import get_kernel

    k = get_kernel(kernel).for_arch(arch)
    text = k.ptx()
    return text, k.manifest(text)


def entry(kernel: str, arch: str) -> dict:
    """`kernel`'s manifest entry for `arch` (emitted/'s, or its on-demand build's), without reading its PTX."""
    got = manifest(arch).get(kernel)
    return got if got is not None else ptx_source(kernel, arch)[1]


def candidate_arches(device_sm: int) -> list[str]:
    """PTX targets runnable on a device, best first: its own a-suffixed arch, then plain arches ≤ it."""
    from ptxgen.arch import ARCHES

    own = [a.name for a in ARCHES.values() if a.suffix == "a" and a.sm == device_sm]
    plain = sorted((a for a in ARCHES.values() if a.suffix == "" and a.sm <= device_sm), key=lambda a: -a.sm)
    return own + [a.name for a in plain]


def build_for(kernel: str, arch: str | None = None) -> str | None:
    """The target whose emitted build of `kernel` `load(kernel, arch)` runs on the current device — `arch` if
    it has one, else the device's best candidate that does — or None where there is none."""
    have = available(kernel)
    if arch:
        return arch if arch in have else None
    return next((a for a in candidate_arches(current().sm) if a in have), None)


def ptx_source(kernel: str, arch: str, source: str = "emitted") -> tuple[str, dict]:
    """(PTX text, manifest entry) of `kernel` built for `arch`."""
    if source == "dsl":
        return _built(kernel, arch)
    entry = manifest(arch).get(kernel)
    if entry is None and arch in available(kernel):  # not shipped: built from the DSL on demand
        return _built(kernel, arch)
    if entry is None:
        raise KernelNotFound(f"kernel {kernel!r} has no build for {arch} in emitted/ "
                             f"(built for: {', '.join(available(kernel)) or 'none'})")
    return (_emitted_root() / arch / f"{kernel}.ptx").read_text(), entry


_LOADED: dict = {}
_BEST: dict = {}  # (kernel, requested arch, source) → Function: the per-call fast path


def load(kernel: str, arch: str | None = None, source: str = "emitted") -> Function:
    """Compile (through the cache) and load `kernel` for the current device. `arch` picks the PTX target
    (e.g. "sm_89" to run the mma.sync path on an sm_90 device); default: the best one available."""
    from ptxgen.arch import device_target, get_arch

    fast = _BEST.get((kernel, arch, source))
    if fast is not None:
        return fast
    ctx = current()
    name = arch or (next(iter(candidate_arches(ctx.sm)), None) if source == "dsl" else build_for(kernel))
    if name is None:
        raise KernelNotFound(f"kernel {kernel!r} has no build this {ctx.name} (sm_{ctx.sm}) can run; "
                             f"built for: {', '.join(available(kernel)) or 'none'}")
    a = get_arch(name)
    key = (kernel, a.name, source)
    fn = _LOADED.get(key)
    if fn is not None:
        _BEST[(kernel, arch, source)] = fn
        return fn
    target = device_target(a, ctx.sm)
    text, entry = ptx_source(kernel, a.name, source)
    if entry.get("meta", {}).get("compile") == "whole-program":  # the driver's JIT (honours setmaxnreg)
        mod = Module(text.encode() + b"\0", kernel)
    else:
        mod = Module(compile_ptx(text, target, name=kernel).cubin, kernel)
    fn = mod.function(entry["entry"], entry["params"], entry["block"], entry.get("dynamic_smem", 0))
    fn.meta = entry.get("meta", {})
    fn.arch = a.name
    _LOADED[key] = fn
    _BEST[(kernel, arch, source)] = fn
    return fn
