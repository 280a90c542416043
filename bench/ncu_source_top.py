"""Summarise ncu's source page (`ncu --page source --print-source sass --csv ...` saved to a file): the SASS
instructions with the most warp-stall samples, each with its stall reasons. Usage: python3 bench/ncu_source_top.py
FILE [N]. Prints the CSV's columns once (ncu versions name them differently)."""
import csv
import sys


def main():
    path, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 60
    lines = open(path, errors="replace").read().splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"') and "Source" in ln), None)
    if start is None:
        sys.exit(f"{path}: no source-page header (run ncu with --page source --print-source sass --csv)")
    rows = list(csv.DictReader(lines[start:]))
    cols = list(rows[0].keys())
    print("columns:", cols)
    total = next((c for c in cols if "Warp Stall Sampling (All" in c), None)
    if total is None:
        sys.exit(f"{path}: no warp-stall sampling column (collect the SourceCounters section)")
    stall = [c for c in cols if c.lower().startswith("stall") or "stalled" in c.lower()]

    def num(v):
        try:
            return float(str(v).replace(",", ""))
        except ValueError:
            return 0.0
    allsum = sum(num(r[total]) for r in rows) or 1
    # the kernel's stall profile first: each reason's share of all samples (issued ones included), then by line
    sums = sorted(((sum(num(r[c]) for r in rows), c) for c in stall if "Not Issued" not in c), reverse=True)
    print("all lines:", " ".join(f"{c}={v / allsum:.1%}" for v, c in sums if v > 0))
    rows.sort(key=lambda r: -num(r[total]))
    for r in rows[:n]:
        parts = sorted(((num(r[c]), c) for c in stall if num(r[c]) > 0), reverse=True)[:4]
        print(f"{num(r[total]) / allsum:6.1%} {r.get('Address', '')} {r.get('Source', '')[:70]:70s} "
              + " ".join(f"{c}={v:.0f}" for v, c in parts))


if __name__ == "__main__":
    main()
