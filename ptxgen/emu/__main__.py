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
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    from ptxgen.arch import ArchError

    from .harness import HARNESSES, check_kernel
    from .machine import EmulationError
    from .parser import PtxParseError

    head, _, rest = __doc__.partition("\n\n")
    ap = argparse.ArgumentParser(prog="python -m ptxgen.emu", description=head.replace("`", ""), epilog=rest,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kernel", metavar="KERNEL", help="a kernel name (`ptxgen list`); one of the harnessed kernels")
    ap.add_argument("--arch", default="sm_89", help="the emitted build to run (default sm_89)")
    ap.add_argument("--ptx", help="a PTX file to run instead of the kernel's emitted build")
    ap.add_argument("--seed", type=int, default=0, help="random inputs' seed (default 0)")
    ap.add_argument("--shape", type=int, nargs="+", help="the problem shape, e.g. M K (default: the harness's)")
    ap.add_argument("--early-landing", action="store_true", help="land cp.async copies at random early times")
    args = ap.parse_args(argv)

    def fail(msg: str) -> int:
        print(f"python -m ptxgen.emu: {msg}", file=sys.stderr)
        return 2

    if args.kernel not in HARNESSES:
        return fail(f"no emulator harness for {args.kernel!r}; harnessed: {', '.join(sorted(HARNESSES))}")
    try:
        if args.ptx:
            ptx = Path(args.ptx).read_text()
        else:
            from ptxgen.kernels import get_kernel

            ptx = get_kernel(args.kernel).for_arch(args.arch).ptx()
        kw = {"shape": tuple(args.shape)} if args.shape else {}
        t0 = time.perf_counter()
        out = check_kernel(args.kernel, ptx, seed=args.seed, **kw)
    except OSError as e:
        return fail(f"cannot read {args.ptx}: {e.strerror}")
    except (PtxParseError, EmulationError, ArchError, KeyError, ValueError, TypeError) as e:
        return fail(f"{type(e).__name__}: {e}")
    print(f"{args.kernel} ({args.arch}): {'OK' if out.ok else 'MISMATCH'} - {out.detail} "
          f"[{time.perf_counter() - t0:.2f} s]")
    return 0 if out.ok else 1


if __name__ == "__main__":
    sys.exit(main())
