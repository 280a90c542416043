"""Fake-driver experiments against runtime/driver.py's DeviceBuffer.__del__ / _free_relaxed (no GPU)."""
import ctypes
import gc
import threading
from ptxgen.runtime import driver

MODE = threading.local()            # per-thread capture mode, as CUDA keeps it (0 global, 2 relaxed)
log = []
cfg = {"exchange_rc": 0, "free_rc": 0, "free_raises": False, "on_exchange": None}

def mode():
    return getattr(MODE, "m", 0)

class Lib:
    @staticmethod
    def cuThreadExchangeStreamCaptureMode(ref):
        if cfg["on_exchange"]:
            cb, cfg["on_exchange"] = cfg["on_exchange"], None
            cb()                      # a GC pass / __del__ running *inside* the exchange sequence
        if cfg["exchange_rc"]:
            return cfg["exchange_rc"]
        m = ctypes.cast(ref, ctypes.POINTER(ctypes.c_int)).contents
        m.value, MODE.m = mode(), m.value
        return 0
    @staticmethod
    def cuStreamIsCapturing(stream, ref):
        return 0

class Drv:
    @staticmethod
    def cuMemFree(ptr):
        log.append(("free", hex(ptr), mode(), threading.current_thread().name))
        if cfg["free_raises"]:
            raise RuntimeError("boom")
        return (cfg["free_rc"],)
    @staticmethod
    def cuMemFreeAsync(ptr, stream):
        log.append(("async", hex(ptr), stream, mode()))
        return (0,)

driver._drv = lambda: Drv
driver.libcuda = lambda: Lib
driver._CU[:] = [Lib]

def buf(ptr, kind="sync", stream=None):
    b = driver.DeviceBuffer.__new__(driver.DeviceBuffer)
    b.ptr, b.nbytes, b.stream, b._kind, b._owner, b._thread = ptr, 16, stream, kind, None, threading.get_ident()
    return b

def case(name, fn):
    log.clear(); MODE.m = 0
    try:
        fn()
        print(f"{name}: log={log} thread mode after={mode()} _HELD={driver._HELD}")
    except Exception as e:
        print(f"{name}: raised {type(e).__name__}: {e}")
    driver._HELD[:] = []

# 1. plain drop: relaxed around the free, restored
case("1 plain", lambda: buf(0x1000).__del__())

# 2. exchange fails (e.g. CUDA_ERROR_NOT_INITIALIZED / DEINITIALIZED): the free goes in global mode even while an
#    op records (HOLD_FREES) -- the old code held it in _HELD
def c2():
    cfg["exchange_rc"] = 4  # CUDA_ERROR_DEINITIALIZED
    driver.hold_frees(1)
    try:
        buf(0x2000).__del__()
    finally:
        driver.hold_frees(-1); cfg["exchange_rc"] = 0
case("2 exchange fails while an op records", c2)

# 3. cuMemFree fails (rc != 0): pointer dropped on the floor (no retry); old code kept failing held frees for later
def c3():
    cfg["free_rc"] = 201  # CUDA_ERROR_INVALID_CONTEXT, e.g. a GC pass in a thread without the context current
    driver.hold_frees(1)
    try:
        b = buf(0x3000); b.__del__(); print("   ptr after:", b.ptr, "held:", driver._HELD)
    finally:
        driver.hold_frees(-1); cfg["free_rc"] = 0
case("3 cuMemFree fails while an op records", c3)

# 4. cuMemFree raises: mode restored, exception swallowed
def c4():
    cfg["free_raises"] = True
    try:
        buf(0x4000).__del__()
    finally:
        cfg["free_raises"] = False
case("4 cuMemFree raises", c4)

# 5. a __del__ inside relaxed_capture, and one running inside the very exchange of relaxed_capture.__enter__
def c5():
    cfg["on_exchange"] = lambda: buf(0x5001).__del__()
    with driver.relaxed_capture():
        assert mode() == 2
        buf(0x5002).__del__()
        assert mode() == 2, mode()
    assert mode() == 0, mode()
case("5 nested in relaxed_capture (+ inside its exchange)", c5)

# 6. a __del__ inside _free_relaxed's own exchange (GC inside a __del__)
def c6():
    cfg["on_exchange"] = lambda: buf(0x6001).__del__()
    buf(0x6000).__del__()
case("6 __del__ inside __del__'s exchange", c6)

# 7. a thread already relaxed (relaxed_capture) keeps relaxed; one in thread-local mode (1) gets it back
def c7():
    MODE.m = 1
    buf(0x7000).__del__()
    assert mode() == 1
case("7 thread-local mode restored", c7)

# 8. threads dropping at once: each thread's own mode restored
def c8():
    errs = []
    def work(i):
        MODE.m = i % 2  # global / thread-local
        for j in range(2000):
            buf(0x10000 + i * 4096 + j).__del__()
            if mode() != i % 2: errs.append((i, j, mode()))
    ts = [threading.Thread(target=work, args=(i,), name=f"t{i}") for i in range(8)]
    [t.start() for t in ts]; [t.join() for t in ts]
    relaxed = sum(1 for e in log if e[2] == 2)
    print(f"   frees {len(log)}, relaxed {relaxed}, mode errors {errs[:3]}")
    log.clear()
case("8 threads", c8)

# 9. interpreter shutdown: module globals torn down
def c9():
    saved = driver.libcuda, driver._free_relaxed
    try:
        driver.libcuda = None
        buf(0x9000).__del__()
        driver.libcuda = saved[0]; driver._free_relaxed = None
        buf(0x9001).__del__()
    finally:
        driver.libcuda, driver._free_relaxed = saved
case("9 shutdown (libcuda / _free_relaxed None): silent leak, no raise", c9)

# 10. a legacy-stream buffer dropped by the caller's own capture code (no op recording): freed at once on the legacy
#     stream (a blocking stream's capture would be joined / invalidated) -- unchanged, but the comment says the
#     caller's capture code is now safe
case("10 legacy drop outside an op", lambda: buf(0xA000, "stream", driver.LEGACY_STREAM).__del__())

# 11. GC-driven drop of a cycle
def c11():
    class C: pass
    c = C(); c.me = c; c.b = buf(0xB000)
    del c; gc.collect()
case("11 gc cycle", c11)
