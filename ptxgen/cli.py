"""The `ptxgen` command: emit PTX, list kernels, check them with nvJitLink, run a benchmark.

Exit codes: 0 success, 1 a check failed (compile error, spill, missing instruction), 2 bad input.
The emulator has its own command: `python -m ptxgen.emu --help`.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .arch import TARGETS, ArchError, target_archs


def source_checkout() -> Path | None:
    """The source checkout ptxgen runs from (pyproject.toml beside the package), or None for an installed package:
    that one's kernels are in ptxgen/emitted/ (the package data the runtime loads) and it has no bench/."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() else None


def default_output() -> Path:
    """Where `ptxgen emit` writes without -o: the checkout's emitted/ (what the tests diff), else ./emitted, never
    into site-packages."""
    root = source_checkout()
    return root / "emitted" if root else Path("emitted")


def _fail(msg: str, cmd: str = "") -> "None":
    print(f"ptxgen{' ' + cmd if cmd else ''}: {msg}", file=sys.stderr)
    raise SystemExit(2)


def _archs(names) -> list:
    try:
        return target_archs(names)
    except ArchError as e:
        _fail(str(e))


def _kernel_defs(names):
    from .kernels import KERNELS, SHIPPED, unknown_kernel

    if not names:
        return list(SHIPPED.values())  # the unshipped ones only when named (ptxgen.kernels.NOT_SHIPPED)
    names = list(dict.fromkeys(names))  # `--kernel X --kernel X`: one file, one manifest entry
    for n in names:
        if n not in KERNELS:
            _fail(unknown_kernel(n))
    return [KERNELS[n] for n in names]


def _unwritable(path: Path, e: OSError) -> str:
    """Why `path` cannot be written, naming the part of it that is a file where a folder must be."""
    for p in (path, *path.parents):
        if p.exists():
            return f"{p} is not a folder" if not p.is_dir() else (e.strerror or str(e))
    return e.strerror or str(e)


def _mkdir(path: Path, cmd: str) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        _fail(f"cannot write to {path}: {_unwritable(path, e)}", cmd)


def _write(path: Path, text: str, cmd: str) -> None:
    try:
        path.write_text(text)
    except OSError as e:
        _fail(f"cannot write to {path}: {_unwritable(path, e)}", cmd)


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _not_built(defs, archs, explicit_archs: bool) -> list:
    """Kernels named with --kernel that are not built for an arch asked for. With --arch given too, that is an
    error saying why (the builder's own reason where it refuses the arch: sm_120a has no wgmma, sm_89 no TMA);
    without, the kernel is emitted where it is built and the others are named on stderr."""
    missing = [(d, a) for a in archs for d in defs if a.name not in d.archs]
    msgs = []
    for d, a in missing:
        why = ""
        try:
            d.build(a)
        except ArchError as e:
            why = f": {e}"
        except Exception:  # noqa: BLE001 - any other failure is reported when the kernel is built where it exists
            pass
        msgs.append(f"{d.name} is not built for {a.name} (built for: {', '.join(d.archs)}){why}")
    if msgs and explicit_archs:
        _fail("; ".join(msgs))
    for m in msgs:
        print(f"ptxgen: note: {m}", file=sys.stderr)
    return missing


class Progress:
    """A one-line progress display on stderr, shown only once work has taken more than a second."""

    def __init__(self, total: int, what: str):
        self.total, self.what, self.done, self.t0 = total, what, 0, time.monotonic()
        self.shown = False

    def step(self, label: str) -> None:
        self.done += 1
        if time.monotonic() - self.t0 > 1.0 and sys.stderr.isatty() or self.shown:
            self.shown = True
            print(f"\r{self.what} {self.done}/{self.total} {label:<40}", end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.shown:
            print(file=sys.stderr)


def _manifest_of(path: Path, arch) -> list | None:
    """The entries of the manifest already at `path` (None if there is none). A folder holds one arch's kernels:
    one whose manifest is another arch's is refused, not merged into (its entries would be listed as `arch`'s)."""
    try:
        old = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except OSError as e:
        _fail(f"cannot read {path}: {e.strerror or e}", "emit")
    except ValueError:
        old = None
    if not isinstance(old, dict) or not isinstance(old.get("kernels"), list) or "arch" not in old:
        _fail(f"{path} is not a ptxgen manifest; emit into another folder", "emit")
    if old["arch"] != arch.name:
        _fail(f"{path.parent} holds {old['arch']}'s kernels (its manifest.json); emit {arch.name} into another "
              f"folder (with several --arch, -o gets one sub-folder per arch)", "emit")
    return old["kernels"]


def emit_arch(arch, defs, out: Path, progress: Progress | None = None, merge: bool = False) -> list[dict]:
    """Write each kernel of `defs` built for `arch` (.ptx) and the manifest into `out`; returns the entries emitted.
    `merge`: the manifest keeps the entries of kernels not in `defs` (emitting a subset)."""
    path = out / "manifest.json"
    _mkdir(out, "emit")
    old = _manifest_of(path, arch)  # before any file is written: a folder of another arch is left as it was
    manifest = []
    for d in defs:
        if arch.name not in d.archs:
            continue
        k = d.for_arch(arch)
        text = k.ptx()
        _write(out / f"{k.name}.ptx", text, "emit")
        manifest.append(k.manifest(text))
        if progress:
            progress.step(f"{arch.name}/{k.name}")
    entries = manifest
    if merge and old is not None:  # the other kernels' entries stay, the emitted ones replace theirs
        fresh = {e["kernel"]: e for e in manifest}
        entries = [fresh.pop(e["kernel"], e) for e in old] + list(fresh.values())
    _write(path, json.dumps({"arch": arch.name, "kernels": entries}, indent=1) + "\n", "emit")
    return manifest


def cmd_emit(args) -> int:
    archs = _archs(args.arch)
    defs = _kernel_defs(args.kernel)
    if args.kernel:
        _not_built(defs, archs, bool(args.arch))
    prog = Progress(len(archs) * len(defs), "emit")
    for arch in archs:
        if args.kernel and not any(arch.name in d.archs for d in defs):
            continue  # (named above) nothing of the selection is built for this arch
        out = Path(args.output) if args.output and len(archs) == 1 else \
            (Path(args.output) / arch.name if args.output else default_output() / arch.name)
        manifest = emit_arch(arch, defs, out, prog, merge=bool(args.kernel))
        if not args.quiet:
            prog.close()
            print(f"{arch.name}: {_count(len(manifest), 'kernel')} → {out}")
    prog.close()
    return 0


def cmd_list(args) -> int:
    from .kernels import KERNELS, NOT_SHIPPED

    defs = list(KERNELS.values()) if args.all else _kernel_defs(None)
    w = max(len(d.name) for d in defs)
    for d in defs:
        why = f" [not shipped: {NOT_SHIPPED[d.name]}]" if d.name in NOT_SHIPPED else ""
        print(f"{d.name:<{w}} {', '.join(d.archs):<28} {d.doc}{why}")
        if args.verbose:
            for a in d.archs:
                k = d.for_arch(a)
                print(f"    {a:<8} block={k.block} smem={k.static_smem + k.dynamic_smem} meta={k.meta}")
    return 0


def cmd_check(args) -> int:
    from ptxgen.runtime.compiler import HOT_OPS, CompileError, compile_ptx, hot_loop, sass

    archs = _archs(args.arch)
    defs = _kernel_defs(args.kernel)
    if args.kernel:
        _not_built(defs, archs, bool(args.arch))
    if args.sass:  # before any compile: an unwritable folder is bad input, found at once
        _mkdir(Path(args.sass), "check")
    failed = 0
    w = max([len("kernel")] + [len(d.name) for d in defs if any(a.name in d.archs for a in archs)])
    print(f"{'kernel':<{w}} {'arch':<8} {'regs':>4} {'smem':>7} {'stack':>5} {'spill':>5}  status")
    for arch in archs:
        for d in defs:
            if arch.name not in d.archs:
                continue
            k = d.for_arch(arch)
            whole = k.meta.get("compile") == "whole-program"  # loaded by the driver's JIT: check it the same way
            ptx = k.ptx()
            try:
                res = compile_ptx(ptx, arch.name, name=k.name, whole_program=whole)
            except CompileError as e:
                failed += 1
                print(f"{k.name:<{w}} {arch.name:<8} {'-':>4} {'-':>7} {'-':>5} {'-':>5}  FAILED\n{e}")
                continue
            except FileNotFoundError as e:  # no ptxas binary for a whole-program kernel: not checked here
                print(f"{k.name:<{w}} {arch.name:<8} {'-':>4} {'-':>7} {'-':>5} {'-':>5}  skipped ({e})")
                continue
            r = res.resources.get(k.entry, {})
            spills = r.get("spill_stores", 0) + r.get("spill_loads", 0) + r.get("lmem", 0)
            status = "ok" if spills == 0 and r.get("stack", 0) <= arch.allowed_stack(ptx) else "SPILLS"
            failed += status != "ok"
            print(f"{k.name:<{w}} {arch.name:<8} {r.get('registers', 0):>4} {r.get('smem', 0) + k.dynamic_smem:>7} "
                  f"{r.get('stack', 0):>5} {spills:>5}  {status}")
            if args.sass or args.loops:
                text = sass(res.cubin)
            if args.sass:
                _write(Path(args.sass) / f"{k.name}.{arch.name}.sass", text, "check")
            if args.loops:
                loop = hot_loop(text)
                if loop is None:
                    print(f"{'':<{w + 9}} main loop: none (no loop holds {', '.join(HOT_OPS)})")
                else:
                    mix = ", ".join(f"{op} {n}" for op, n in list(loop["ops"].items())[:8])
                    print(f"{'':<{w + 9}} main loop ({loop['marker']}): {loop['instructions']} SASS per iteration "
                          f"per thread; {mix}")
    return 1 if failed else 0


def cmd_bench(args) -> int:
    import runpy

    root = source_checkout()
    if root is None or not (root / "bench").is_dir():  # bench/ is not package data: a wheel has no benchmarks
        _fail("the benchmarks (bench/bench_*.py) come with a source checkout of ptxgen, not an installed package; "
              "run `ptxgen bench` from a clone (pip install -e .)", "bench")
    script = root / "bench" / f"bench_{args.what}.py"
    if not script.exists():
        _fail(f"no benchmark {args.what!r} (looked for {script}); available: "
              + ", ".join(sorted(p.stem[6:] for p in script.parent.glob("bench_*.py"))), "bench")
    sys.argv = [str(script), *args.rest]
    sys.path.insert(0, str(script.parent))  # the benchmarks share helpers (bench_gemv.timed)
    runpy.run_path(str(script), run_name="__main__")
    return 0


def main(argv=None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # `ptxgen list | head`: the reader left; not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at interpreter exit
        return 0


def _main(argv=None) -> int:
    from . import __version__

    p = argparse.ArgumentParser(prog="ptxgen", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1].strip())
    p.add_argument("--version", action="version", version=f"ptxgen {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("emit", help="write one .ptx per kernel and a manifest.json (default: emitted/<arch>/)")
    e.add_argument("--arch", action="append", help=f"one of {', '.join(TARGETS)}; repeatable; default: all of them")
    e.add_argument("--kernel", action="append", help="kernel name (`ptxgen list`); repeatable; default: all shipped")
    e.add_argument("-o", "--output", help="output folder, one arch's kernels per folder (with several arches: one "
                                          "sub-folder per arch); default: emitted/<arch>/ of the source checkout, "
                                          "or ./emitted/<arch>/ when ptxgen is an installed package")
    e.add_argument("-q", "--quiet", action="store_true")
    e.set_defaults(fn=cmd_emit)
    ls = sub.add_parser("list", help="kernels and their configurations")
    ls.add_argument("-v", "--verbose", action="store_true", help="also each arch's block, shared memory and meta")
    ls.add_argument("--all", action="store_true", help="also the kernels built but not shipped (probes, knob-only "
                                                      "builds, those not timed yet), with why")
    ls.set_defaults(fn=cmd_list)
    c = sub.add_parser("check", help="compile every kernel with nvJitLink; registers, smem, spills (no GPU needed)")
    c.add_argument("--arch", action="append", help=f"one of {', '.join(TARGETS)}; repeatable; default: all of them")
    c.add_argument("--kernel", action="append", help="kernel name (`ptxgen list`); repeatable; default: all shipped")
    c.add_argument("--sass", metavar="DIR", help="also write each kernel's SASS into DIR")
    c.add_argument("--loops", action="store_true",
                   help="also count the SASS instructions of each kernel's main loop (one iteration, one thread)")
    c.set_defaults(fn=cmd_check)
    b = sub.add_parser("bench", help="run a benchmark program from bench/ (needs a GPU)")
    b.add_argument("what", help="mmq, gemv, runtime, ...")
    b.add_argument("rest", nargs=argparse.REMAINDER)
    b.set_defaults(fn=cmd_bench)
    args = p.parse_args(argv)
    try:
        return args.fn(args)
    except ArchError as e:
        _fail(str(e))


if __name__ == "__main__":
    sys.exit(main())
