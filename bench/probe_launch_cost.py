"""Host µs per launch of one small kernel by each route the runtime could take (needs a GPU and torch): ctypes
cuLaunchKernel, ctypes cuLaunchKernelEx without / with the PDL attribute, cuda-python's cuLaunchKernel on packed
parameters, and the capture-status queries an op makes. Calls in bursts of 50, the GPU drained between bursts."""
import ctypes

import numpy as np
import torch

import ptxgen.runtime as r
from bench_op import host_us
from ptxgen.runtime import driver


def main():
    fn = r.load("quantize_q8_1")
    x = r.DeviceArray.empty((1, 32), np.float32)
    y = r.DeviceArray.empty((1, 36), np.uint8)
    s = torch.cuda.current_stream().cuda_stream
    cells = fn.cells((x, y, 1))
    plain = fn.prepare((1,), cells)
    pdl = fn.prepare((1,), cells, pdl=True)
    lib = driver.libcuda()
    h, params = plain._handle, plain._params
    g, b = plain.grid, plain.block
    drv = driver._drv()
    st, cid = ctypes.c_int(0), ctypes.c_uint64(0)
    rs, rc = ctypes.byref(st), ctypes.byref(cid)
    rows = {
        "ctypes cuLaunchKernel": lambda: lib.cuLaunchKernel(h, g[0], g[1], g[2], b[0], b[1], b[2], 0, s, params, None),
        "ctypes cuLaunchKernelEx (no attributes)": lambda: plain.run(s),
        "ctypes cuLaunchKernelEx (PDL)": lambda: pdl.run(s),
        "cuda-python cuLaunchKernel": lambda: drv.cuLaunchKernel(fn.handle, 1, 1, 1, b[0], 1, 1, 0, s, params, 0),
        "ctypes cuStreamIsCapturing": lambda: lib.cuStreamIsCapturing(s, rs),
        "ctypes cuStreamGetCaptureInfo_v2": lambda: lib.cuStreamGetCaptureInfo_v2(s, rs, rc, None, None, None),
        "driver.capture_id": lambda: driver.capture_id(s),
        "torch.cuda.is_current_stream_capturing": torch.cuda.is_current_stream_capturing,
        "torch raw current stream": lambda: driver.torch_stream_getter()(0),
    }
    for f in rows.values():
        f()
    got = {name: [] for name in rows}
    for _ in range(5):  # interleaved rounds: the host's clock drifts during a run
        for name, f in rows.items():
            got[name].append(host_us(torch, lambda i, f=f: f(), calls=400))
    print("| route | host µs per call (median of 5 interleaved rounds) |\n|---|---|")
    for name, v in got.items():
        print(f"| {name} | {np.median(v):.2f} |", flush=True)


if __name__ == "__main__":
    main()
