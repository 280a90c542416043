"""`python -m ptxgen.emu KERNEL [--arch sm_89] [--ptx FILE] [--seed N] [--shape M K]`: run a kernel's PTX in
the emulator on random inputs and compare with the NumPy reference. Exit 1 on a mismatch."""
import argparse
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    from .harness import HARNESSES, check_kernel

    ap = argparse.ArgumentParser(prog="python -m ptxgen.emu", description=__doc__.splitlines()[0])
    ap.add_argument("kernel", choices=sorted(HARNESSES))
    ap.add_argument("--arch", default="sm_89")
    ap.add_argument("--ptx", help="a PTX file to run instead of emitted/<arch>/<kernel>.ptx")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shape", type=int, nargs="+")
    ap.add_argument("--early-landing", action="store_true", help="land cp.async copies at random early times")
    args = ap.parse_args(argv)
    if args.ptx:
        ptx = Path(args.ptx).read_text()
    else:
        from ptxgen.kernels import get_kernel

        ptx = get_kernel(args.kernel).for_arch(args.arch).ptx()
    kw = {"shape": tuple(args.shape)} if args.shape else {}
    t0 = time.perf_counter()
    out = check_kernel(args.kernel, ptx, seed=args.seed, **kw)
    print(f"{args.kernel} ({args.arch}): {'OK' if out.ok else 'MISMATCH'} - {out.detail} "
          f"[{time.perf_counter() - t0:.2f} s]")
    return 0 if out.ok else 1


if __name__ == "__main__":
    sys.exit(main())
