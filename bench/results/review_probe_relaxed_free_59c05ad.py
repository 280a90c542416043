"""Review probe (the change 59c05ad..c6c664f): cuMemFree with the thread's capture mode relaxed, during a global-mode
capture, on a blocking and a non-blocking capture stream; the free in the capturing thread, in another thread with
the context current, and in another thread without it; and whether the free still waits for eager work in flight."""
import ctypes
import threading
import time

from cuda.bindings import driver as d

from ptxgen.runtime import driver as pd

pd.current()
CTX = pd.current().ctx
lib = pd.libcuda()


def ok(r, what=""):
    assert int(r[0]) == 0, (what, r[0])
    return r[1] if len(r) > 1 else None


def relaxed_free(p):  # runtime/driver.py _free_relaxed, returning cuMemFree's rc
    mode = ctypes.c_int(2)
    swapped = not lib.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode))
    try:
        return int(d.cuMemFree(p)[0])
    finally:
        if swapped:
            lib.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode))


def relaxed(fn):
    mode = ctypes.c_int(2)
    lib.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode))
    try:
        return fn()
    finally:
        lib.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode))


BIG = 4 << 30
big = ok(d.cuMemAlloc(BIG))
busy = ok(d.cuStreamCreate(1))


def keep_busy(n=100):
    for _ in range(n):
        ok(d.cuMemsetD8Async(big, 1, BIG, busy))


def busy_done():
    return relaxed(lambda: int(d.cuStreamQuery(busy)[0]) == 0)


keep_busy()
t = time.perf_counter()
ok(d.cuStreamSynchronize(busy))
print(f"busy work alone: {1e3 * (time.perf_counter() - t):.1f} ms")
keep_busy()
p = ok(d.cuMemAlloc(1 << 20))
t = time.perf_counter()
rc = relaxed_free(p)
print(f"no capture: relaxed cuMemFree rc {rc}, took {1e3 * (time.perf_counter() - t):.1f} ms, busy done after: "
      f"{busy_done()}")
ok(d.cuCtxSynchronize())

for flags, sname in ((0, "blocking"), (1, "non-blocking")):
    for how in ("relaxed, capturing thread", "relaxed, other thread with ctx", "relaxed, other thread no ctx",
                "raw global, capturing thread"):
        cs = ok(d.cuStreamCreate(flags))
        scratch = ok(d.cuMemAlloc(1 << 20))
        ok(d.cuMemsetD8(scratch, 0, 1 << 20))
        p = ok(d.cuMemAlloc(1 << 20))
        keep_busy()
        ok(d.cuStreamBeginCapture(cs, d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL))
        ok(d.cuMemsetD8Async(scratch, 7, 1 << 20, cs))
        out = {}
        t = time.perf_counter()
        if how.startswith("relaxed, capturing"):
            out["rc"] = relaxed_free(p)
        elif how.startswith("relaxed, other"):
            def work():
                if "with ctx" in how:
                    d.cuCtxSetCurrent(CTX)
                out["rc"] = relaxed_free(p)
            th = threading.Thread(target=work)
            th.start()
            th.join()
        else:
            out["rc"] = int(d.cuMemFree(p)[0])
        dt = 1e3 * (time.perf_counter() - t)
        done = busy_done()
        st = relaxed(lambda: d.cuStreamIsCapturing(cs))
        d.cuMemsetD8Async(int(scratch) + 4096, 9, 4096, cs)  # (fails where the free invalidated the capture)
        err, g = d.cuStreamEndCapture(cs)
        res = "graph lost"
        if int(err) == 0:
            ge = ok(d.cuGraphInstantiate(g, 0))
            ok(d.cuMemsetD8(scratch, 0, 1 << 20))
            ok(d.cuGraphLaunch(ge, cs))
            ok(d.cuStreamSynchronize(cs))
            import numpy as np
            h = np.empty(1 << 20, np.uint8)
            ok(d.cuMemcpyDtoH(h.ctypes.data, scratch, 1 << 20))
            good = (h[:4096] == 7).all() and (h[4096:8192] == 9).all() and (h[8192:] == 7).all()
            res = f"graph kept, replay {'right' if good else 'WRONG'}"
        ok(d.cuCtxSynchronize())
        if out.get("rc", 0) != 0:
            d.cuMemFree(p)
        print(f"{sname:12s} | {how:32s} | cuMemFree rc {out.get('rc')} took {dt:7.1f} ms, eager busy done after "
              f"it: {done!s:5s} | capture status {int(st[1]) if int(st[0]) == 0 else st[0]} | end {err} | {res}")
