"""`python -m ptxgen.emu KERNEL`: run one kernel's PTX in the emulator on random inputs and compare the result
with the NumPy reference of its format.

Examples:
  python -m ptxgen.emu dequantize_q4_k --arch sm_89
  python -m ptxgen.emu gemv_tq4_1s_t2_fused --shape 45 2048
  python -m ptxgen.emu quantize_q8_1 --ptx emitted/sm_89/quantize_q8_1.ptx   (any PTX file, e.g. a hand edit)

Exit codes: 0 the outputs match, 1 a mismatch, 2 bad input (an unknown kernel or arch, a file that cannot be
read, PTX the emulator cannot parse, an instruction it does not implement); errors are one line on stderr.
"""
import argparse
import re
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    from ptxgen.arch import ArchError
    from ptxgen.arch import target_archs
    from ptxgen.kernels import unknown_kernel

    from .harness import HARNESSES, check_kernel
    from .machine import EmulationError
    from .parser import PtxParseError

    head, _, rest = __doc__.partition("\n\n")
    ap = argparse.ArgumentParser(prog="python -m ptxgen.emu", description=head.replace("`", ""), epilog=rest,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kernel", metavar="KERNEL", help="a kernel name (`ptxgen list`); one of the harnessed kernels")
    ap.add_argument("--arch", help="the emitted build to run (default sm_89; with --ptx, the file's .target)")
    ap.add_argument("--ptx", help="a PTX file to run instead of the kernel's emitted build")
    ap.add_argument("--seed", type=int, default=0,
                    help="random inputs' seed, and of when cp.async copies land (some early) (default 0)")
    ap.add_argument("--shape", type=int, nargs="+", help="the problem shape, e.g. M K (default: the harness's)")
    args = ap.parse_args(argv)

    def fail(msg: str) -> int:
        print(f"python -m ptxgen.emu: {msg}", file=sys.stderr)
        return 2

    if args.kernel not in HARNESSES:
        return fail(unknown_kernel(args.kernel, HARNESSES).replace("unknown kernel", "no emulator harness for", 1))
    if args.shape and min(args.shape) < 1:
        return fail(f"--shape {' '.join(map(str, args.shape))}: each size must be a positive integer")
    if args.ptx:
        try:
            ptx = Path(args.ptx).read_text()
        except (OSError, UnicodeDecodeError) as e:
            return fail(f"cannot read {args.ptx}: {getattr(e, 'strerror', None) or e}")
        entries = re.findall(r"^\s*(?:\.visible\s+)?\.entry\s+([\w$]+)", ptx, re.M)
        if entries and args.kernel not in entries:  # another kernel's file: its parameters would not fit the harness
            return fail(f"{args.ptx}: the file's entry is {', '.join(entries)}, not {args.kernel}")
        target = re.search(r"^\s*\.target\s+(sm_\w+)", ptx, re.M)
        arch = target.group(1) if target else args.arch or "sm_89"
        if args.arch and args.arch != arch:
            return fail(f"--arch {args.arch}, but {args.ptx} is built for {arch} (its .target); leave --arch out")
    else:
        arch = args.arch or "sm_89"
    try:
        target_archs([arch])
    except ArchError as e:
        return fail(f"{args.ptx}: {e}" if args.ptx else str(e))
    try:
        if not args.ptx:
            from ptxgen.kernels import get_kernel

            ptx = get_kernel(args.kernel).for_arch(arch).ptx()
    except (ArchError, ValueError) as e:
        return fail(str(e))
    kw = {"shape": tuple(args.shape)} if args.shape else {}
    t0 = time.perf_counter()
    try:
        out = check_kernel(args.kernel, ptx, seed=args.seed, **kw)
    except (PtxParseError, EmulationError, ArchError, KeyError, ValueError, TypeError) as e:
        if args.shape and type(e) in (ValueError, TypeError):  # the harness's own limits (K a block multiple)
            return fail(f"--shape {' '.join(map(str, args.shape))}: {e}")
        return fail(f"{type(e).__name__}: {e}")
    print(f"{args.kernel} ({arch}): {'OK' if out.ok else 'MISMATCH'} - {out.detail} "
          f"[{time.perf_counter() - t0:.2f} s]")
    return 0 if out.ok else 1


if __name__ == "__main__":
    sys.exit(main())
