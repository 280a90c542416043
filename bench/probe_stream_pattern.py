"""Probe (#6 / #7): how the per-warp access pattern over a Q4_K matrix's rows bounds the few-token kernels'
weight stream — no arithmetic, only the bytes of a Q4_K matrix read the way a kernel reads them.

The few-token Q4_K kernels (gemv_q4_k_mma_t{1,2,4}, t16h) copy, per warp and step, 16 rows x one 144-byte
super-block into a cp.async ring (session 12: that ring alone took 17 of the op's 20 µs on 4096x14336, while a
flat read of the same 33 MB takes 12.2). Variants, each over the same matrix (rows of K/256 x 144 bytes), 4 warps
per CTA, a warp on 16 rows, K split over gridDim.y into runs of super-blocks (as the kernels do):
- cp{SB}s{S}c{C}: a warp's ring of S stages of 16 rows x SB consecutive super-blocks (rows' runs of 144·SB
  contiguous bytes), cp.async.cg 16 bytes per lane, chunks c = lane + 32u = (9·SB)·row + column, C CTAs per SM;
  consume = xor one word of the lane's chunks (keeps the copies live);
- ldg{SB}: the same chunks into registers (ld.global.nc.L1::no_allocate v4), two steps in flight;
- rowrun: a warp walks its 16 rows one after another, 32 lanes x 16 consecutive bytes of the row's run, 4 loads in
  flight per lane (the fast dp4a GEMV's pattern: long contiguous runs per warp);
- flat: the read floor (probe_read_floor.py's kernel, 8 CTAs of 256 threads per SM) over the same bytes.
Timing as bench_gemv (events around one launch after a sleep; weights rotated past the L2).

Usage: probe_stream_pattern.py MxK,MxK [reps]"""
import math
import sys

import cupy as cp
import torch

from bench_gemv import timed
from probe_read_floor import SRC as FLAT_SRC  # the read floor's kernel, read16

SRC = r"""
#include <cuda_pipeline.h>
template <int SB, int S>
__global__ void __launch_bounds__(128) ring_cp(const unsigned char* __restrict__ w, int M, int nsb, int per,
                                               unsigned* out) {
    extern __shared__ __align__(128) unsigned char smem[];
    const int R = 16, CH = R * 9 * SB, STAGE = CH * 16;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int row0 = (blockIdx.x * 4 + warp) * R;
    if (row0 >= M) return;
    unsigned char* ring = smem + warp * S * STAGE;
    long row_bytes = (long)(nsb) * 144;
    int jb = blockIdx.y * per, jend = min(jb + per, nsb);
    const unsigned char* wb = w + (long)row0 * row_bytes;
    auto issue = [&](int j, int st) {
        if (j < jend) {
            for (int c = lane; c < CH; c += 32) {
                int row = c / (9 * SB), col = c % (9 * SB);
                int r = min(row0 + row, M - 1) - row0;
                __pipeline_memcpy_async(ring + st * STAGE + c * 16, wb + r * row_bytes + (long)j * 144 + col * 16, 16);
            }
        }
        __pipeline_commit();
    };
    for (int s = 0; s < S; ++s) issue(jb + s * SB, s);
    unsigned acc = 0;
    int st = 0;
    for (int j = jb; j < jend; j += SB) {
        __pipeline_wait_prior(S - 1);
        __syncwarp();
        acc ^= *(const unsigned*)(ring + st * STAGE + lane * 16);
        __syncwarp();
        issue(j + S * SB, st);
        st = st + 1 == S ? 0 : st + 1;
    }
    if (acc == 0x12345678u) out[blockIdx.x] = acc;
}

__device__ __forceinline__ uint4 ldg_na(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

template <int SB>
__global__ void __launch_bounds__(128, 4) ring_ldg(const unsigned char* __restrict__ w, int M, int nsb, int per,
                                                   unsigned* out) {
    const int R = 16, CH = R * 9 * SB, U = (CH + 31) / 32;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int row0 = (blockIdx.x * 4 + warp) * R;
    if (row0 >= M) return;
    long row_bytes = (long)(nsb) * 144;
    int jb = blockIdx.y * per, jend = min(jb + per, nsb);
    const unsigned char* wb = w + (long)row0 * row_bytes;
    int offs[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
        int c = lane + 32 * u;
        c = min(c, CH - 1);
        int row = c / (9 * SB), col = c % (9 * SB);
        int r = min(row0 + row, M - 1) - row0;
        offs[u] = r * row_bytes + col * 16;
    }
    uint4 a[U], b[U];
    unsigned acc = 0;
#pragma unroll
    for (int u = 0; u < U; ++u) a[u] = ldg_na(wb + offs[u] + (long)jb * 144);
    for (int j = jb; j < jend; j += 2 * SB) {
        bool n1 = j + SB < jend, n2 = j + 2 * SB < jend;
#pragma unroll
        for (int u = 0; u < U; ++u) if (n1) b[u] = ldg_na(wb + offs[u] + (long)(j + SB) * 144);
#pragma unroll
        for (int u = 0; u < U; ++u) acc ^= a[u].x ^ a[u].w;
        if (!n1) break;
#pragma unroll
        for (int u = 0; u < U; ++u) if (n2) a[u] = ldg_na(wb + offs[u] + (long)(j + 2 * SB) * 144);
#pragma unroll
        for (int u = 0; u < U; ++u) acc ^= b[u].x ^ b[u].w;
    }
    if (acc == 0x12345678u) out[blockIdx.x] = acc;
}

__global__ void __launch_bounds__(128, 4) rowrun(const unsigned char* __restrict__ w, int M, int nsb, int per,
                                                 unsigned* out) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int row0 = (blockIdx.x * 4 + warp) * 16;
    if (row0 >= M) return;
    long row_bytes = (long)(nsb) * 144;
    int jb = blockIdx.y * per, jend = min(jb + per, nsb);
    int n16 = (jend - jb) * 9;  // 16-byte chunks of the run
    unsigned acc = 0;
    for (int r = 0; r < 16 && row0 + r < M; ++r) {
        const uint4* p = (const uint4*)(w + (long)(row0 + r) * row_bytes + (long)jb * 144);
        int i = lane;
        for (; i + 96 < n16; i += 128) {
            uint4 a = ldg_na(p + i), b = ldg_na(p + i + 32), c = ldg_na(p + i + 64), d = ldg_na(p + i + 96);
            acc ^= a.x ^ b.x ^ c.x ^ d.x ^ a.w ^ b.w ^ c.w ^ d.w;
        }
        for (; i < n16; i += 32) { uint4 a = ldg_na(p + i); acc ^= a.x ^ a.w; }
    }
    if (acc == 0x12345678u) out[blockIdx.x] = acc;
}

"""
CP = [(1, 4, 4), (1, 3, 4), (2, 2, 4), (2, 3, 3), (4, 2, 2)]  # (SB, S, CTAs per SM)
LDG = [1, 2, 4]
NAMES = [f"ring_cp<{sb},{s}>" for sb, s, _ in CP] + [f"ring_ldg<{sb}>" for sb in LDG] + ["rowrun"]


def main():
    shapes = [tuple(int(v) for v in s.split("x")) for s in sys.argv[1].split(",")]
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 60
    mod = cp.RawModule(code=SRC, options=("-std=c++17",), name_expressions=NAMES)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = cp.zeros(1 << 16, dtype=cp.uint32)
    stream = cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    for m, k in shapes:
        nsb = k // 256
        nbytes = m * nsb * 144
        copies = max(2, math.ceil(4 * 60e6 / nbytes))
        bufs = [torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda") for _ in range(copies)]
        gx = -(-m // 64)
        res = []

        def go(kern, grid, smem, per, i):
            kern(grid, (128,), (cp.uint64(bufs[i % copies].data_ptr()), cp.int32(m), cp.int32(nsb), cp.int32(per),
                                out), shared_mem=smem, stream=stream)

        def plan(sb, slots):
            want = max(1, round(slots / gx))
            per = -(-nsb // want)
            per = -(-per // sb) * sb
            return per, -(-nsb // per)

        for sb, s, ctas in CP:
            kern = mod.get_function(f"ring_cp<{sb},{s}>")
            smem = 4 * s * 16 * 9 * sb * 16
            kern.max_dynamic_shared_size_bytes = smem
            per, ny = plan(sb, sms * ctas)
            fn = lambda i, kern=kern, ny=ny, per=per, smem=smem: go(kern, (gx, ny), smem, per, i)
            fn(0)
            res.append((f"cp{sb}s{s}c{ctas} ({ny} splits)", timed(fn, reps, torch)))
        for sb in LDG:
            kern = mod.get_function(f"ring_ldg<{sb}>")
            per, ny = plan(sb, sms * 4)
            fn = lambda i, kern=kern, ny=ny, per=per: go(kern, (gx, ny), 0, per, i)
            fn(0)
            res.append((f"ldg{sb} ({ny} splits)", timed(fn, reps, torch)))
        kern = mod.get_function("rowrun")
        for slots in (4, 8):
            per, ny = plan(1, sms * slots)
            fn = lambda i, ny=ny, per=per: go(kern, (gx, ny), 0, per, i)
            fn(0)
            res.append((f"rowrun ({ny} splits)", timed(fn, reps, torch)))
        flat = cp.RawKernel(FLAT_SRC, "read16")
        fn = lambda i: flat((sms * 8,), (256,), (cp.uint64(bufs[i % copies].data_ptr()), cp.uint64(nbytes // 16), out),
                            stream=stream)
        fn(0)
        res.append(("flat", timed(fn, reps, torch)))
        print(f"{m}x{k} ({nbytes / 1e6:.1f} MB): " + ", ".join(f"{n} {us:.1f} us ({nbytes / us / 4.27e6:.0%})"
                                                             for n, us in res), flush=True)
        bufs.clear()  # free this shape's copies before the next


if __name__ == "__main__":
    main()
