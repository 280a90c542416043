"""Probe: HBM read rate against the length of the contiguous run a kernel reads from each weight row at a time.

The weight-streaming kernels read a tile of R rows a K-step at a time: the register-A MMQs 3 x 16 bytes of each of
128 rows (the header and the step's qs), the decode GEMVs a super-block (144 bytes) of each of 16 rows. Rows are
row_bytes apart, so DRAM sees runs of W bytes at a stride. This kernel reads a row-major byte matrix the same way —
CTA c owns rows R·c .. R·c + R − 1 and walks their K in W-byte columns, UNROLL 16-byte loads a thread in flight —
and prints GB/s per (R, W) beside a plain linear read of the same bytes. Weights rotate over copies that exceed L2.

  python3 bench/probe_dram_bursts.py --rows 4096 --row-bytes 8064
"""
import argparse

import cupy as cp

SRC = r"""
extern "C" __global__ void walk(const uint4* __restrict__ w, long long row_vecs, int rows_per_cta, int w_vecs,
                                int steps_ahead, unsigned* out) {
    long long r0 = (long long)blockIdx.x * rows_per_cta;
    int box = rows_per_cta * w_vecs;            // 16-byte vectors a K-step
    int chunk = box * steps_ahead;              // vectors an iteration: steps_ahead K-steps of the tile
    int nsteps = (int)(row_vecs / w_vecs);
    unsigned acc = 0;
    for (int s0 = 0; s0 < nsteps; s0 += steps_ahead) {
        for (int base = threadIdx.x; base < chunk; base += 8 * blockDim.x) {
            uint4 v[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                int i = base + u * blockDim.x;
                int st = s0 + i / box;
                v[u] = make_uint4(0, 0, 0, 0);
                if (i < chunk && st < nsteps) {
                    int j = i % box, r = j / w_vecs, c = j % w_vecs;
                    v[u] = __ldcs(&w[(r0 + r) * row_vecs + (long long)st * w_vecs + c]);
                }
            }
#pragma unroll
            for (int u = 0; u < 8; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
        }
    }
    if (acc == 0x9E3779B9u) out[0] = acc;
}
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--row-bytes", type=int, default=8064)
    ap.add_argument("--widths", default="16,48,144,288,576,1152")
    ap.add_argument("--tile-rows", default="16,64,128")
    ap.add_argument("--ahead", default="1,4,16", help="K-steps of the tile a CTA loads at once")
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    walk = cp.RawKernel(SRC, "walk")
    nbytes = a.rows * a.row_bytes
    copies = max(2, -(-(256 << 20) // nbytes))
    buf = cp.random.randint(0, 2**31, size=copies * nbytes // 4, dtype=cp.int32)
    out = cp.zeros(1, dtype=cp.uint32)
    row_vecs = a.row_bytes // 16

    def time(rows_per_cta, w, ahead):
        starts = [cp.cuda.Event() for _ in range(a.reps)]
        ends = [cp.cuda.Event() for _ in range(a.reps)]
        for i in range(a.reps + 2):
            base = buf[(i % copies) * nbytes // 4:]
            if i >= 2:
                starts[i - 2].record()
            walk((a.rows // rows_per_cta,), (256,), (base, cp.int64(row_vecs), cp.int32(rows_per_cta),
                                                    cp.int32(w // 16), cp.int32(ahead), out))
            if i >= 2:
                ends[i - 2].record()
        ends[-1].synchronize()
        us = sorted(cp.cuda.get_elapsed_time(s, e) * 1e3 for s, e in zip(starts, ends))[a.reps // 2]
        return us, nbytes / us / 1e3
    us, gbs = time(1, a.row_bytes, 1)
    print(f"{a.rows} rows x {a.row_bytes} bytes, CTAs of 256 threads, 8 loads of 16 bytes a thread in flight ({nbytes / 1e6:.1f} MB), {copies} copies; a CTA a row, the whole "
          f"row at once: {us:.1f} µs, {gbs:.0f} GB/s")
    print("| tile rows | K-steps ahead | " + " | ".join(f"W={w}" for w in a.widths.split(",")) + " |")
    print("|---|---|" + "---|" * len(a.widths.split(",")))
    for r in map(int, a.tile_rows.split(",")):
        for ahead in map(int, a.ahead.split(",")):
            cells = []
            for w in map(int, a.widths.split(",")):
                if a.row_bytes % w:
                    cells.append("-")
                    continue
                us, gbs = time(r, w, ahead)
                cells.append(f"{gbs:.0f} GB/s ({us:.1f} µs)")
            print(f"| {r} | {ahead} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
