"""Execute ptxgen's PTX on the CPU: one CTA at a time, every thread of the CTA vectorised in NumPy.

Registers hold raw bits (uint64 per thread); each instruction reinterprets them by its type. Control flow
runs by the smallest-PC-first rule (the group of runnable threads with the lowest PC executes next),
which reconverges structured divergence; warp-synchronous instructions (shfl.sync, bar.sync, mma.sync,
ldmatrix; wgmma and setmaxnreg per warpgroup) check that every thread they need is there and raise
otherwise. A thread at `bar.sync` (named barriers with thread counts included) or at an unsatisfied
`mbarrier.try_wait` is suspended, so warp-specialised kernels (a producer warp and consumer warpgroups)
run; if every live thread is suspended and nothing is in flight, that is a deadlock error. Shared memory
starts poisoned: reading a byte no thread wrote is an error naming the instruction and the thread. Warps at
one pc run together, which hides a missing bar.sync; `run(warp_serial=True)` runs a CTA's warps one at a time
between waits instead, so such a kernel reads bytes its peers have not written yet.
Floating point is IEEE float32/float16 with the PTX rounding the modifier names (NumPy float32
arithmetic is round-to-nearest-even; `fma` is computed exactly and rounded once). The Hopper
instructions (mbarrier, TMA, wgmma, setmaxnreg) are in `hopper.py`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import layouts
from .hopper import PARAM_BASE, HopperOps
from .tensorcore import mma_f32
from .parser import Ins, Module, parse


class EmulationError(RuntimeError):
    pass


class Unsupported(EmulationError):
    pass


_NP = {"bf16x2": np.uint32, "u8": np.uint8, "s8": np.int8, "b8": np.uint8, "u16": np.uint16, "s16": np.int16, "b16": np.uint16,
       "f16": np.float16, "bf16": np.uint16, "u32": np.uint32, "s32": np.int32, "b32": np.uint32, "f32": np.float32,
       "u64": np.uint64, "s64": np.int64, "b64": np.uint64, "f64": np.float64, "f16x2": np.uint32, "pred": np.bool_}
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_TYPES = set(_NP)
_ORDER_SCOPE = {"weak", "relaxed", "acquire", "release", "acq_rel", "volatile", "cta", "cluster", "gpu", "sys"}


def bits_of(values: np.ndarray, t: str) -> np.ndarray:
    """Typed values → raw bits zero-extended to uint64."""
    v = np.asarray(values)
    if t == "pred":
        return v.astype(bool).astype(np.uint64)
    dt = np.dtype(_NP[t])
    v = v.astype(dt, copy=False)
    return v.view(_UINT[dt.itemsize]).astype(np.uint64)


def _canonical_nan(v: np.ndarray) -> np.ndarray:
    """NaN results of fp32 arithmetic as the H200 makes them (probed by tests/test_gpu_emu_crosscheck.py): always
    the canonical 0x7FFFFFFF, whatever NaN operand or invalid operation (inf·0, inf − inf) produced them."""
    v = np.asarray(v, np.float32)
    bad = np.isnan(v)
    if bad.any():
        v = np.where(bad, np.uint32(0x7FFFFFFF).view(np.float32), v)
    return v


def typed(bits: np.ndarray, t: str) -> np.ndarray:
    if t == "pred":
        return bits != 0
    dt = np.dtype(_NP[t])
    return bits.astype(_UINT[dt.itemsize]).view(dt)


class Memory:
    """Global memory: allocations at fake device addresses, bounds and alignment checked per access."""

    BASE = 0x7F0000000000

    def __init__(self):
        self.bufs: list[np.ndarray] = []
        self.bases: list[int] = []
        self._next = self.BASE

    def alloc(self, data, poison: int | None = None) -> int:
        if isinstance(data, int):
            buf = np.full(data, 0 if poison is None else poison, np.uint8)
        else:
            buf = np.frombuffer(np.ascontiguousarray(data).tobytes(), np.uint8).copy()
        addr = self._next
        self.bufs.append(buf)
        self.bases.append(addr)
        self._next += (buf.size + 4095) // 4096 * 4096 + 4096
        return addr

    def view(self, addr: int, dtype, shape) -> np.ndarray:
        i = self.bases.index(addr)
        return self.bufs[i].view(dtype).reshape(shape)

    def _locate(self, addrs: np.ndarray, width: int, what: str):
        bases = np.array(self.bases, np.uint64)
        k = np.searchsorted(bases, addrs, side="right") - 1
        if (k < 0).any():
            raise EmulationError(f"{what}: address {int(addrs[k < 0][0]):#x} is outside every allocation")
        off = (addrs - bases[k]).astype(np.int64)
        sizes = np.array([b.size for b in self.bufs])
        bad = off + width > sizes[k]
        if bad.any():
            j = int(np.nonzero(bad)[0][0])
            raise EmulationError(f"{what}: out-of-bounds access at {int(addrs[j]):#x} "
                                 f"(offset {off[j]} + {width} B in a {sizes[k[j]]} B buffer)")
        if (addrs % width).any():
            j = int(np.nonzero(addrs % width)[0][0])
            raise EmulationError(f"{what}: misaligned {width}-byte access at {int(addrs[j]):#x}")
        return k, off

    def load(self, addrs: np.ndarray, width: int, what: str) -> np.ndarray:
        """→ (n, width) uint8"""
        k, off = self._locate(addrs, width, what)
        out = np.empty((addrs.size, width), np.uint8)
        for b in np.unique(k):
            sel = k == b
            out[sel] = self.bufs[b][off[sel, None] + np.arange(width)]
        return out

    def store(self, addrs: np.ndarray, data: np.ndarray, what: str) -> None:
        width = data.shape[1]
        k, off = self._locate(addrs, width, what)
        for b in np.unique(k):
            sel = k == b
            self.bufs[b][off[sel, None] + np.arange(width)] = data[sel]


@dataclass
class CTA:
    n: int
    ctaid: tuple
    ntid: tuple
    nctaid: tuple
    smem: np.ndarray
    written: np.ndarray
    regs: dict = field(default_factory=dict)
    async_groups: list = field(default_factory=list)  # committed cp.async groups, oldest first
    async_open: list = field(default_factory=list)
    bars: dict = field(default_factory=dict)  # named barrier id → (arrived mask, thread count or None)
    mbars: dict = field(default_factory=dict)  # shared address → MBarrier
    tma_pending: list = field(default_factory=list)  # bulk tensor copies issued, not landed, oldest first
    wgmma: dict = field(default_factory=dict)  # warpgroup → WgmmaQueue
    inflight: dict = field(default_factory=dict)  # register → per thread, wgmma ops in flight that write it
    inflight_a: dict = field(default_factory=dict)  # register → per thread, wgmma ops in flight that read it (A)
    rank: int = 0  # in its cluster
    cluster: object = None  # ClusterState, when the grid runs in clusters
    state: dict = None  # the emulator's per-CTA state (pcs, alive, blocked, waiting_on): for peers' arrivals
    cl_arrived: np.ndarray = None


@dataclass
class ClusterState:
    ctas: list  # by rank
    phase: int = 0  # barrier.cluster phases completed


class _Stalled(Exception):
    """The current CTA cannot move (interleaved run): another CTA's progress may free it."""


def _imm(tok: str, t: str):
    if tok.startswith(("0f", "0F")):
        return np.uint32(int(tok[2:], 16)).view(np.float32)
    if tok.startswith(("0d", "0D")):
        return np.uint64(int(tok[2:], 16)).view(np.float64)
    v = int(tok, 0)
    if t in ("f32", "f64", "f16"):
        return float(v)
    return v


def _fma_f32(a, b, c):
    """Exact a·b + c rounded once to float32 (a·b is exact in float64; the sum's rounding error is tracked
    with TwoSum so a double-rounding tie is resolved in the right direction)."""
    a64, b64, c64 = (np.asarray(x, np.float64) for x in (a, b, c))
    with np.errstate(invalid="ignore", over="ignore"):  # (inf / NaN operands: IEEE results, as the GPU's, no warning)
        p = a64 * b64
        s = p + c64
        bb = s - p
        err = (p - (s - bb)) + (c64 - bb)
        r = s.astype(np.float32)
        # a tie at float32 precision that the float64 rounding created or hid: step toward the true value
        r64 = r.astype(np.float64)
        up = np.nextafter(r, np.float32(np.inf)).astype(np.float64)
        dn = np.nextafter(r, np.float32(-np.inf)).astype(np.float64)
        tie_hi = (s - r64 == (up - r64) / 2) & (err > 0)
        tie_lo = (r64 - s == (r64 - dn) / 2) & (err < 0)
    r = np.where(tie_hi, up.astype(np.float32), r)
    r = np.where(tie_lo, dn.astype(np.float32), r)
    return r.astype(np.float32)


def _f32_to_f16(v: np.ndarray, rounding: str = "rn", sat: bool = False) -> np.ndarray:
    v = np.asarray(v, np.float32)
    if rounding not in ("rn", "rz"):
        raise Unsupported(f"cvt f16 rounding .{rounding}")
    with np.errstate(over="ignore", invalid="ignore"):
        h = v.astype(np.float16)
        if rounding == "rz":  # step back toward zero where round-to-nearest went away from it
            away = np.isfinite(v) & (np.abs(h.astype(np.float32)) > np.abs(v))
            h = np.where(away, np.nextafter(h, np.float16(0)), h).astype(np.float16)
            big = np.isfinite(v) & np.isinf(h)
            h = np.where(big, np.copysign(np.float16(65504), v).astype(np.float16), h).astype(np.float16)
    bits = h.view(np.uint16).copy()
    bits[np.isnan(v)] = 0x7FFF  # the GPU's canonical NaN
    h = bits.view(np.float16)
    if sat:
        h = np.clip(np.nan_to_num(h, nan=0.0), 0, 1).astype(np.float16)
    return h


def _round_int(v: np.ndarray, mode: str) -> np.ndarray:
    f = {"rni": np.rint, "rzi": np.trunc, "rmi": np.floor, "rpi": np.ceil}[mode]
    with np.errstate(invalid="ignore"):
        return f(v)


class Emulator(HopperOps):
    Error = EmulationError
    Unsupported = Unsupported

    def __init__(self, ptx: str | Module):
        self.mod = ptx if isinstance(ptx, Module) else parse(ptx)
        self.steps = 0
        self.warp_serial = False

    # ---------------------------------------------------------------------------------------------------
    def run(self, grid, block, args, memory: Memory, dynamic_smem: int = 0, seed: int | None = None,
            max_steps: int = 50_000_000, interleave: bool = False, cluster=None, warp_serial: bool = False):
        """Run the kernel over `grid`. CTAs run one after another, each to its end, unless `interleave`: then
        all CTAs are resident at once and take turns of a few instructions each, in an order drawn from `seed`
        (as on a GPU whose SMs hold the whole grid): protocols between CTAs through global memory — a split-K
        tile's last arrival, a work queue — meet other orders than the sequential one. `cluster` = (cx, 1, 1):
        thread-block clusters of cx consecutive CTAs along x (interleaved): %cluster_ctarank and friends, mapa,
        mbarrier arrivals on a peer's shared memory, barrier.cluster, TMA multicast to the CTAs of a mask; a CTA
        that touches an exited peer's shared memory, or a cluster whose every thread waits, is an error.
        `warp_serial`: inside a CTA, the lowest-numbered warp that can run runs until it waits (a barrier, an
        mbarrier) or ends, then the next — instead of all warps at one pc together, which hides a missing
        bar.sync between warps that write and read the same shared memory (the reader then meets bytes no thread
        wrote yet, an error, or stale ones). For kernels whose instructions are per warp (mma.sync); wgmma's
        warpgroups need their four warps together: `warp_serial` = 128 runs warpgroups one at a time (a consumer
        warpgroup overwriting shared memory another's wgmmas still read, without a barrier between them)."""
        grid = tuple(grid) + (1,) * (3 - len(tuple(grid)))
        block = tuple(block) + (1,) * (3 - len(tuple(block)))
        if len(args) != len(self.mod.params):
            raise EmulationError(f"{self.mod.entry} takes {len(self.mod.params)} parameters, got {len(args)}")
        self.params = {}
        for p, a in zip(self.mod.params, args):
            if p.type == "b8":
                self.params[p.name] = np.frombuffer(bytes(a), np.uint8)
            else:
                self.params[p.name] = np.frombuffer(np.array([a], _NP[p.type]).tobytes(), np.uint8)
        self.memory = memory
        self.const_addr = {name: memory.alloc(np.frombuffer(data, np.uint8)) for name, data in self.mod.consts.items()}
        self.rng = np.random.default_rng(seed) if seed is not None else None
        self.max_steps = max_steps
        self.warp_serial = warp_serial
        ids = [(x, y, z) for z in range(grid[2]) for y in range(grid[1]) for x in range(grid[0])]
        cx = 1
        if cluster is not None:
            cluster = tuple(cluster) + (1,) * (3 - len(tuple(cluster)))
            cx = cluster[0]
            if cluster[1:] != (1, 1) or not 1 <= cx <= 8 or grid[0] % cx:
                raise EmulationError(f"cluster {cluster}: only (cx, 1, 1) with 1 ≤ cx ≤ 8 dividing grid x {grid[0]}")
            interleave = True
        self.cluster_x = cx
        if not interleave:
            for ctaid in ids:
                self._start_cta(ctaid, grid, block, dynamic_smem)
                while self._step():
                    pass
            return
        turns = self.rng or np.random.default_rng(0)
        live, clusters = [], {}
        for c in ids:
            self._start_cta(c, grid, block, dynamic_smem)
            cl = clusters.setdefault((c[0] // cx, c[1], c[2]), ClusterState([]))
            self.cta.rank, self.cta.cluster = len(cl.ctas), cl
            cl.ctas.append(self.cta)
            live.append(self.cta.state)
        stalled = set()  # CTAs that could not move since the last step any CTA made
        while live:
            i = int(turns.integers(len(live)))
            self._load_cta(live[i])
            try:
                for _ in range(int(turns.integers(1, 65))):  # a turn of 1-64 instructions (state mutated in place)
                    if not self._step(stall_ok=True):
                        del live[i]
                        break
                    stalled.clear()
            except _Stalled:
                stalled.add(id(live[i]))
                if len(stalled) == len(live):
                    raise EmulationError("deadlock: every live thread of every CTA waits and no copy is in flight\n"
                                         + "\n".join(f"CTA {st['cta'].ctaid}:\n" + self._deadlock_report(st)
                                                      for st in live)) from None

    _CTA_STATE = ("cta", "pcs", "alive", "blocked", "waiting_on", "yielding")

    def _save_cta(self) -> dict:
        return {k: getattr(self, k) for k in self._CTA_STATE}

    def _load_cta(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, v)

    def _start_cta(self, ctaid, grid, block, dynamic_smem):
        n = block[0] * block[1] * block[2]
        self.dyn_base = (self.mod.shared_bytes + 127) // 128 * 128
        nsm = self.dyn_base + dynamic_smem
        cta = CTA(n, ctaid, block, grid, np.full(nsm, 0xFF, np.uint8), np.zeros(nsm, bool))
        tids = np.arange(n)
        cta.tid = (tids % block[0], (tids // block[0]) % block[1], tids // (block[0] * block[1]))
        self.cta = cta
        # per thread: its pc, whether it still runs, whether it is suspended (at a barrier or an mbarrier
        # wait; a suspended thread's pc stays on the instruction that suspended it)
        self.pcs = np.zeros(n, np.int64)
        self.alive = np.ones(n, bool)
        self.blocked = np.zeros(n, bool)
        self.yielding = np.zeros(n, bool)  # after nanosleep: runs only when no other thread of the CTA can
        self.waiting_on = np.full(n, -1, np.int64)  # the mbarrier a suspended try_wait waits on
        cta.cl_arrived = np.full(n, -1, np.int64)  # per thread: the cluster-barrier phase it last arrived in
        cta.state = self._save_cta()

    def _step(self, stall_ok: bool = False) -> bool:
        """One instruction of the current CTA (its lowest pc among the runnable threads); False once it has ended.
        With `stall_ok` (interleaved CTAs) a CTA whose threads all wait raises _Stalled: a peer may free it."""
        cta, body, pcs, alive, blocked = self.cta, self.mod.body, self.pcs, self.alive, self.blocked
        if not alive.any():
            return False
        self.steps += 1
        if self.steps > self.max_steps:
            raise EmulationError("step limit reached (an endless loop?)")
        runnable = alive & ~blocked
        if self.yielding.any():  # a thread that slept (a spin loop's nanosleep) lets every other one go first
            others = runnable & ~self.yielding
            if others.any():
                runnable = others
            else:
                self.yielding[:] = False
        if not runnable.any():
            if cta.tma_pending:  # async copies land as late as they may: when nothing else can run
                self._land_tma(cta.tma_pending.pop(0))
                return True
            if stall_ok:
                raise _Stalled()
            raise EmulationError(self._deadlock_report())
        if self.warp_serial:  # the lowest warp (or warpgroup: warp_serial 128) that can run, alone
            n = 32 if self.warp_serial is True else int(self.warp_serial)
            w = int(np.argmax(runnable)) // n
            runnable = runnable.copy()
            runnable[:n * w] = False
            runnable[n * (w + 1):] = False
        pc = pcs[runnable].min()
        if pc >= len(body):
            raise EmulationError("ran off the end of the kernel without ret")
        idx = np.nonzero(runnable & (pcs == pc))[0]
        ins = body[pc]
        ex = idx
        if ins.guard is not None:
            g = self._reg(ins.guard, ex) != 0
            ex = idx[~g] if ins.guard_neg else idx[g]
        pcs[idx] = pc + 1
        self.cur_pc = pc
        if ins.mods[0] in ("bra",):
            if ins.mods[-1] == "uni":
                self._check_uniform(idx, ex, ins)
            pcs[ex] = self.mod.labels[ins.operands[0]]
            return True
        if ins.mods[0] in ("ret", "exit"):
            alive[ex] = False
            self._recheck_barriers()
            if cta.cluster is not None:
                self._recheck_cluster_barrier()
            return True
        if ins.mods[0] == "bar" or (ins.mods[0] == "barrier" and ins.mods[1] == "sync"):
            self._bar(ins, ex, idx)
            return True
        if ex.size == 0:
            return True
        try:
            self._exec(ins, ex, idx)
        except EmulationError as e:
            if str(e).startswith("line "):
                raise
            raise type(e)(f"line {ins.line}: {ins.text}: {e}") from None
        return True

    # --- barriers -------------------------------------------------------------------------------------------
    def _bar(self, ins, ex, idx):
        """bar.sync a{, b} (= barrier.sync.aligned): every live lane of an arriving warp arrives together;
        the barrier opens when b threads (all live threads of the CTA when b is absent) have arrived."""
        if ins.mods[1] == "warp":  # bar.warp.sync membermask: the named lanes must all be here
            mask = int(self._val(ins.operands[0], "u32", idx)[0])
            for w in np.unique(idx // 32):
                need = {i for i in range(32) if mask >> i & 1 and 32 * w + i < self.cta.n and self.alive[32 * w + i]}
                missing = need - set((idx[idx // 32 == w] % 32).tolist())
                if missing:
                    raise EmulationError(f"line {ins.line}: {ins.text}: lanes {sorted(missing)[:4]} of warp {w} "
                                         "are not here (divergent bar.warp.sync)")
            return
        if ins.mods[1] != "sync":
            raise Unsupported(f"{ins.opcode} (only bar.sync and bar.warp.sync are modelled)")
        for w in np.unique(idx // 32):
            lanes = np.arange(32 * w, min(32 * w + 32, self.cta.n))
            missing = lanes[self.alive[lanes] & ~np.isin(lanes, idx)]
            if missing.size:
                raise EmulationError(f"line {ins.line}: {ins.text}: threads {missing[:4]} did not reach this barrier "
                                     "(divergent bar.sync)")
        if ex.size == 0:
            return
        ids = self._val(ins.operands[0], "u32", ex).astype(np.int64)
        count = self._val(ins.operands[1], "u32", ex).astype(np.int64) if len(ins.operands) > 1 else None
        for bid in np.unique(ids).tolist():  # warps at one bar.sync may use different barriers
            sel = ex[ids == bid]
            cnts = np.unique(count[ids == bid]) if count is not None else [None]
            if len(cnts) > 1:
                raise EmulationError(f"line {ins.line}: {ins.text}: threads at barrier {bid} give different counts")
            cnt = None if cnts[0] is None else int(cnts[0])
            if bid > 15 or (cnt is not None and (cnt % 32 or cnt == 0)):
                raise EmulationError(f"line {ins.line}: {ins.text}: barrier {bid} with {cnt} threads (ids 0..15, "
                                     "counts a non-zero multiple of 32)")
            arrived, want = self.cta.bars.get(bid, (None, None))
            if arrived is None:
                arrived = np.zeros(self.cta.n, bool)
            elif want != cnt:
                raise EmulationError(f"line {ins.line}: {ins.text}: barrier {bid} is in use with a thread count of {want}")
            arrived[sel] = True
            self.cta.bars[bid] = (arrived, cnt)
            self.pcs[sel] = self.cur_pc  # suspended on the barrier
            self.blocked[sel] = True
        self._recheck_barriers(ins)

    def _recheck_barriers(self, ins=None):
        for bid, (arrived, cnt) in list(self.cta.bars.items()):
            need = cnt if cnt is not None else int(self.alive.sum())
            have = int(arrived.sum())
            if have > need:
                where = f"line {ins.line}: {ins.text}: " if ins is not None else ""
                raise EmulationError(f"{where}{have} threads arrived at barrier {bid}, which expects {need}")
            if have == need:
                self.blocked[arrived] = False
                self.pcs[arrived] += 1
                del self.cta.bars[bid]

    def _deadlock_report(self, state=None) -> str:
        st = state or self._save_cta()
        pcs, alive = st["pcs"], st["alive"]
        lines = []
        for pc in np.unique(pcs[alive]):
            who = np.nonzero(alive & (pcs == pc))[0]
            ins = self.mod.body[pc]
            lines.append(f"  {who.size} thread(s) {who[:4].tolist()}... at line {ins.line}: {ins.text}")
        extra = "".join(f"\n  mbarrier at shared {a}: {mb}" for a, mb in st["cta"].mbars.items())
        head = "" if state is not None else "deadlock: every live thread waits and no copy is in flight\n"
        return head + "\n".join(lines) + extra

    def _check_uniform(self, idx, ex, ins):
        taken = np.isin(idx, ex)
        warps = idx // 32
        for w in np.unique(warps):
            t = taken[warps == w]
            if t.any() != t.all():
                raise EmulationError(f"line {ins.line}: {ins.text}: bra.uni diverges inside warp {w}")

    # --- operands ------------------------------------------------------------------------------------------
    def _reg(self, name: str, idx) -> np.ndarray:
        if self.cta.inflight:
            self._check_inflight(name, idx, "reads")
        r = self.cta.regs.get(name)
        if r is None:
            raise EmulationError(f"register {name} read before it was written")
        return r[idx]

    def _check_inflight(self, name, idx, verb):
        m = self.cta.inflight.get(name)
        if m is not None and m[idx].any():
            raise EmulationError(f"{verb} {name} while a wgmma that writes it is in flight (thread "
                                 f"{np.asarray(idx)[m[idx] > 0][0]}; missing wgmma.wait_group?)")

    def _set(self, name: str, idx, values, t: str):
        if self.cta.inflight:
            self._check_inflight(name, idx, "writes")
        if self.cta.inflight_a:
            m = self.cta.inflight_a.get(name)
            if m is not None and m[idx].any():
                raise EmulationError(f"writes {name} while a wgmma that reads it as A is in flight (thread "
                                     f"{np.asarray(idx)[m[idx] > 0][0]}; the A registers must outlive their wgmma)")
        r = self.cta.regs.get(name)
        if r is None:
            r = self.cta.regs[name] = np.zeros(self.cta.n, np.uint64)
        r[idx] = bits_of(values, t)

    def _special(self, tok: str, idx):
        name, _, comp = tok[1:].partition(".")
        c = "xyz".index(comp) if comp else 0
        if name == "tid":
            return self.cta.tid[c][idx].astype(np.uint32)
        if name == "ntid":
            return np.full(idx.size, self.cta.ntid[c], np.uint32)
        if name == "ctaid":
            return np.full(idx.size, self.cta.ctaid[c], np.uint32)
        if name == "nctaid":
            return np.full(idx.size, self.cta.nctaid[c], np.uint32)
        if name.startswith(("cluster_", "clusterid", "nclusterid")):
            cx, rank = getattr(self, "cluster_x", 1), getattr(self.cta, "rank", 0)
            v = {"cluster_ctarank": rank, "cluster_nctarank": cx, "cluster_ctaid": rank if c == 0 else 0,
                 "cluster_nctaid": cx if c == 0 else 1,
                 "clusterid": self.cta.ctaid[c] // cx if c == 0 else self.cta.ctaid[c],
                 "nclusterid": self.cta.nctaid[c] // cx if c == 0 else self.cta.nctaid[c]}.get(name)
            if v is None:
                raise Unsupported(f"special register {tok}")
            return np.full(idx.size, v, np.uint32)
        if name == "laneid":
            return (idx % 32).astype(np.uint32)
        if name == "warpid":
            return (idx // 32).astype(np.uint32)
        if name == "smid":  # two emulated CTAs an SM (as the paired grouped builds run): CTAs 2s and 2s + 1 on SM s
            return np.full(idx.size, self.cta.ctaid[0] // 2, np.uint32)
        if name == "globaltimer_lo":  # a clock that only moves forward (trace builds: bench/probe_moe_trace.py)
            self._ticks = getattr(self, "_ticks", 0) + 1
            return np.full(idx.size, self._ticks, np.uint32)
        raise Unsupported(f"special register {tok}")

    def _val(self, tok: str, t: str, idx) -> np.ndarray:
        """An operand as typed values over threads `idx`."""
        if tok.startswith("%"):
            if tok in self.cta.regs:
                return typed(self._reg(tok, idx), t)
            if tok.split(".")[0][1:] in ("tid", "ntid", "ctaid", "nctaid", "laneid", "warpid", "cluster_ctarank",
                                         "cluster_nctarank", "cluster_ctaid", "cluster_nctaid", "clusterid",
                                         "nclusterid", "smid", "globaltimer_lo"):
                return self._special(tok, idx).astype(_NP[t]) if t != "pred" else self._special(tok, idx) != 0
            return typed(self._reg(tok, idx), t)
        if tok in self.mod.shared:
            return np.full(idx.size, self.mod.shared[tok][0], _NP[t])
        if tok in self.params:  # the address of a parameter (mov.b64 %rd, tmap; then cvta.param)
            off = next(p.offset for p in self.mod.params if p.name == tok)
            return np.full(idx.size, PARAM_BASE + off, _NP[t])
        if tok in self.const_addr:
            return np.full(idx.size, self.const_addr[tok], _NP[t])
        if tok == self.mod.dynamic_shared:
            return np.full(idx.size, self.dyn_base, _NP[t])
        v = _imm(tok, t)
        with np.errstate(over="ignore"):
            if t in ("f32", "f16", "f64"):
                return np.full(idx.size, v, _NP[t])
            if isinstance(v, float):
                raise EmulationError(f"float immediate {tok} for a .{t} operand")
            return np.full(idx.size, v & ((1 << (8 * np.dtype(_NP[t]).itemsize)) - 1), _UINT[np.dtype(_NP[t]).itemsize]).view(_NP[t])

    def _addr(self, tok: str, idx):
        inner = tok.strip()[1:-1].strip()
        off = 0
        if "+" in inner:
            base, o = inner.split("+")
            off = int(o, 0)
        elif "-" in inner[1:]:
            base, o = inner.rsplit("-", 1)
            off = -int(o, 0)
        else:
            base = inner
        base = base.strip()
        if base in self.params:
            return base, off
        if base in self.mod.shared:
            return np.full(idx.size, self.mod.shared[base][0] + off, np.uint64), None
        if base == self.mod.dynamic_shared:
            return np.full(idx.size, self.dyn_base + off, np.uint64), None
        b = self._reg(base, idx).astype(np.uint64)
        return (b + np.uint64(off & 0xFFFFFFFFFFFFFFFF)) & np.uint64(0xFFFFFFFFFFFFFFFF), None

    @staticmethod
    def _vec(tok: str) -> list:
        return [t.strip() for t in tok.strip()[1:-1].split(",")] if tok.startswith("{") else [tok]

    # --- shared memory --------------------------------------------------------------------------------------
    def _smem_access(self, addrs, width, what, tidx):
        addrs = addrs.astype(np.int64)
        if ((addrs < 0) | (addrs + width > self.cta.smem.size)).any():
            j = int(np.nonzero((addrs < 0) | (addrs + width > self.cta.smem.size))[0][0])
            raise EmulationError(f"{what}: shared-memory access at {addrs[j]} (+{width}) outside the "
                                 f"{self.cta.smem.size} B of this CTA (thread {tidx[j]})")
        if (addrs % width).any():
            j = int(np.nonzero(addrs % width)[0][0])
            raise EmulationError(f"{what}: misaligned {width}-byte shared access at {addrs[j]} (thread {tidx[j]})")
        return addrs[:, None] + np.arange(width)

    def smem_load(self, addrs, width, what, tidx):
        cells = self._smem_access(addrs, width, what, tidx)
        unw = ~self.cta.written[cells]
        if unw.any():
            j = int(np.nonzero(unw.any(axis=1))[0][0])
            raise EmulationError(f"{what}: thread {tidx[j]} reads shared byte {cells[j][unw[j]][0]} that nothing wrote")
        return self.cta.smem[cells]

    def smem_store(self, addrs, data, what, tidx):
        cells = self._smem_access(addrs, data.shape[1], what, tidx)
        self.cta.smem[cells] = data
        self.cta.written[cells] = True

    # --- execution ------------------------------------------------------------------------------------------
    def _exec(self, ins: Ins, ex, grp):
        op = ins.mods[0]
        h = getattr(self, f"_op_{op}", None)
        if h is None:
            raise Unsupported(f"the emulator does not implement {ins.opcode} (line {ins.line})")
        h(ins, ex, grp)

    def _type(self, ins: Ins) -> str:
        for m in reversed(ins.mods):
            if m in _TYPES:
                return m
        raise EmulationError(f"{ins.opcode}: no type suffix")

    def _space(self, ins) -> str:
        """The state space of a memory instruction, past its memory-order and scope qualifiers (ld.acquire.gpu.
        global, red.release.gpu.global: global memory is sequentially consistent here, so they order nothing)."""
        return next(m for m in ins.mods[1:] if m not in _ORDER_SCOPE)

    def _op_ld(self, ins, ex, grp):
        t = self._type(ins)
        space = self._space(ins)
        vec = next((int(m[1:]) for m in ins.mods if m in ("v2", "v4", "v8")), 1)
        width = np.dtype(_NP[t]).itemsize
        dsts = self._vec(ins.operands[0])
        base, off = self._addr(ins.operands[1], ex)
        if space == "param":
            raw = self.params[base][off:off + width * vec]
            data = np.broadcast_to(raw, (ex.size, raw.size))
        elif space in ("global", "const"):
            data = self.memory.load(base, width * vec, ins.text)
        elif space == "shared":
            data = self.smem_load(base, width * vec, ins.text, ex)
        elif space == "shared::cluster":  # distributed shared memory: this CTA's or a peer's (mapa's address)
            data = self.cluster_smem_load(base, width * vec, ins.text, ex)
        else:
            raise Unsupported(f"ld.{space}")
        data = np.ascontiguousarray(data)
        for i, d in enumerate(dsts):
            chunk = np.ascontiguousarray(data[:, i * width:(i + 1) * width]).view(_NP[t]).reshape(-1)
            dt = self.mod.reg_types.get(_prefix(d), t)
            if dt in ("b32", "b64", "f32") and t in ("s8", "s16", "s32"):
                chunk = chunk.astype(np.int64)  # sign-extend into a wider register
                self._set(d, ex, chunk, "s64" if dt == "b64" else "s32")
            else:
                self._set(d, ex, chunk, t)

    def _op_st(self, ins, ex, grp):
        t = self._type(ins)
        space = self._space(ins)
        width = np.dtype(_NP[t]).itemsize
        srcs = self._vec(ins.operands[1])
        addrs, _ = self._addr(ins.operands[0], ex)
        parts = []
        for s in srcs:
            if s.startswith("%"):
                bits = self._reg(s, ex)
            else:
                bits = bits_of(self._val(s, t, ex), t)
            parts.append(bits.astype(np.uint64).view(np.uint8).reshape(-1, 8)[:, :width])
        data = np.concatenate(parts, axis=1)
        if space == "global":
            self.memory.store(addrs, data, ins.text)
        elif space == "shared":
            self.smem_store(addrs, data, ins.text, ex)
        else:
            raise Unsupported(f"st.{space}")

    def _op_mov(self, ins, ex, grp):
        t = self._type(ins)
        d, s = ins.operands
        if d.startswith("{"):  # unpack b32 → {b16, b16} / b64 → {b32, b32}
            parts = self._vec(d)
            bits = self._reg(s, ex)
            w = 64 // len(parts) if t == "b64" else 32 // len(parts)
            for i, p in enumerate(parts):
                self._set(p, ex, (bits >> np.uint64(i * w)) & np.uint64((1 << w) - 1), "u64")
            return
        if s.startswith("{"):
            parts = self._vec(s)
            w = (64 if t == "b64" else 32) // len(parts)
            acc = np.zeros(ex.size, np.uint64)
            for i, p in enumerate(parts):
                acc |= (self._reg(p, ex) & np.uint64((1 << w) - 1)) << np.uint64(i * w)
            self._set(d, ex, acc, "u64")
            return
        self._set(d, ex, self._val(s, t, ex), t)

    def _op_cvta(self, ins, ex, grp):
        self._set(ins.operands[0], ex, self._val(ins.operands[1], "u64", ex), "u64")

    def _halves(self, tok, ex):
        bits = self._val(tok, "u32", ex).astype(np.uint32)
        return ((bits & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float64),
                (bits >> 16).astype(np.uint16).view(np.float16).astype(np.float64))

    def _f16x2(self, ins, ex, f):
        """A packed-half op: each half computed exactly in float64 and rounded once to fp16."""
        d, *srcs = ins.operands
        lo = f(*[self._halves(s_, ex)[0] for s_ in srcs])
        hi = f(*[self._halves(s_, ex)[1] for s_ in srcs])
        out = []
        for v in (lo, hi):  # float64 → fp16 directly (NumPy rounds it once, to nearest even)
            h = np.asarray(v, np.float64).astype(np.float16).view(np.uint16).copy()
            h[np.isnan(v)] = 0x7FFF
            out.append(h)
        bits = out[0].astype(np.uint64) | (out[1].astype(np.uint64) << np.uint64(16))
        self._set(d, ex, bits, "u64")

    def _binary(self, ins, ex, f):
        t = self._type(ins)
        if t == "f16x2":
            with np.errstate(all="ignore"):
                return self._f16x2(ins, ex, lambda a, b: f(a, b, "f64"))
        d, a, b = ins.operands
        va, vb = self._val(a, t, ex), self._val(b, t, ex)
        with np.errstate(all="ignore"):
            r = f(va, vb, t)
        self._set(d, ex, _canonical_nan(r) if t == "f32" and r.dtype == np.float32 else r, t)

    def _op_add(self, ins, ex, grp):
        self._binary(ins, ex, lambda a, b, t: a + b)

    def _op_sub(self, ins, ex, grp):
        self._binary(ins, ex, lambda a, b, t: a - b)

    def _op_and(self, ins, ex, grp):
        self._binary(ins, ex, lambda a, b, t: a & b if t != "pred" else a & b)

    def _op_or(self, ins, ex, grp):
        self._binary(ins, ex, lambda a, b, t: a | b)

    def _op_xor(self, ins, ex, grp):
        self._binary(ins, ex, lambda a, b, t: a ^ b)

    def _op_not(self, ins, ex, grp):
        t = self._type(ins)
        self._set(ins.operands[0], ex, ~self._val(ins.operands[1], t, ex), t)

    def _op_shl(self, ins, ex, grp):
        t = self._type(ins)
        bits = 8 * np.dtype(_NP[t]).itemsize
        a = typed(bits_of(self._val(ins.operands[1], t, ex), t), f"u{bits}" if bits > 8 else "u8").astype(np.uint64)
        s = self._val(ins.operands[2], "u32", ex).astype(np.uint64)
        r = np.where(s >= bits, 0, (a << np.minimum(s, 63)) & np.uint64((1 << bits) - 1))
        self._set(ins.operands[0], ex, r.astype(np.uint64), "u64")

    def _op_shr(self, ins, ex, grp):
        t = self._type(ins)
        bits = 8 * np.dtype(_NP[t]).itemsize
        s = self._val(ins.operands[2], "u32", ex).astype(np.int64)
        if t.startswith("s"):
            a = self._val(ins.operands[1], t, ex).astype(np.int64)
            r = a >> np.minimum(s, bits - 1)
            self._set(ins.operands[0], ex, r, t)
        else:
            a = bits_of(self._val(ins.operands[1], t, ex), t)
            r = np.where(s >= bits, 0, a >> np.minimum(s, 63).astype(np.uint64))
            self._set(ins.operands[0], ex, r.astype(np.uint64), "u64")

    def _op_shf(self, ins, ex, grp):
        """shf.{l,r}.{wrap,clamp}.b32 d, a, b, c: funnel shift of the 64-bit b:a by c."""
        direction, mode = ins.mods[1], ins.mods[2]
        a = self._val(ins.operands[1], "u32", ex).astype(np.uint64)
        b_ = self._val(ins.operands[2], "u32", ex).astype(np.uint64)
        c = self._val(ins.operands[3], "u32", ex).astype(np.uint64)
        n = c & np.uint64(31) if mode == "wrap" else np.minimum(c, np.uint64(32))
        both = (b_ << np.uint64(32)) | a
        if direction == "l":
            r = (both << n) >> np.uint64(32)
        else:
            r = both >> n
        self._set(ins.operands[0], ex, r & np.uint64(0xFFFFFFFF), "u64")

    def _float_ok(self, ins):
        mods = set(ins.mods)
        if mods & {"rz", "rm", "rp"}:
            raise Unsupported(f"{ins.opcode}: only .rn float rounding is modelled")

    def _op_mul(self, ins, ex, grp):
        t = self._type(ins)
        d, a, b = ins.operands
        if t in ("f32", "f64", "f16", "f16x2"):  # f16x2: per half, one rounding (_f16x2)
            self._float_ok(ins)
            return self._binary(ins, ex, lambda x, y, t: x * y)
        va = self._val(a, t, ex).astype(object if t.endswith("64") else np.int64)
        vb = self._val(b, t, ex).astype(object if t.endswith("64") else np.int64)
        bits = 8 * np.dtype(_NP[t]).itemsize
        if "wide" in ins.mods:
            p = va.astype(np.int64) * vb.astype(np.int64)
            self._set(d, ex, p, {"u32": "s64", "s32": "s64", "u16": "s32", "s16": "s32"}[t])
            return
        p = va * vb
        if "hi" in ins.mods:
            p = np.array([int(v) >> bits for v in p], dtype=object)
        mask = (1 << bits) - 1
        self._set(d, ex, np.array([int(v) & mask for v in p], np.uint64) if p.dtype == object else (p & mask).astype(np.uint64), "u64")

    def _op_mad(self, ins, ex, grp):
        t = self._type(ins)
        d, a, b, c = ins.operands
        if t in ("f32", "f64"):
            return self._op_fma(ins, ex, grp)
        bits = 8 * np.dtype(_NP[t]).itemsize
        va, vb = self._val(a, t, ex).astype(np.int64), self._val(b, t, ex).astype(np.int64)
        if "wide" in ins.mods:
            wt = {"u32": "u64", "s32": "s64"}[t]
            vc = self._val(c, wt, ex)
            p = (va * vb).astype(np.uint64 if wt == "u64" else np.int64) + vc
            self._set(d, ex, p, wt)
            return
        if bits == 64:  # mad.lo.u64 / .s64: the low 64 bits, numpy's uint64 arithmetic wraps as the hardware's
            with np.errstate(over="ignore"):
                p = (self._val(a, t, ex).astype(np.uint64) * self._val(b, t, ex).astype(np.uint64)
                     + self._val(c, t, ex).astype(np.uint64))
            self._set(d, ex, p, "u64")
            return
        vc = self._val(c, t, ex).astype(np.int64)
        mask = (1 << bits) - 1
        self._set(d, ex, ((va * vb + vc) & mask).astype(np.uint64), "u64")

    def _op_fma(self, ins, ex, grp):
        t = self._type(ins)
        self._float_ok(ins)
        if t == "f16x2":  # a·b + c is exact in float64 for fp16 operands: one rounding, as the hardware does
            with np.errstate(all="ignore"):
                return self._f16x2(ins, ex, lambda a, b, c: a * b + c)
        d, a, b, c = ins.operands
        if t != "f32":
            raise Unsupported(f"fma.{t}")
        ops = [self._val(x, t, ex) for x in (a, b, c)]
        self._set(d, ex, _canonical_nan(_fma_f32(*ops)), t)

    def _op_div(self, ins, ex, grp):
        t = self._type(ins)
        if t in ("f32", "f64"):
            if "approx" in ins.mods or "full" in ins.mods:
                raise Unsupported(f"{ins.opcode}: only div.rn is modelled")
            return self._binary(ins, ex, lambda a, b, t: a / b)
        def idiv(a, b, t):
            b = np.where(b == 0, 1, b)
            return (np.trunc(a.astype(np.float64) / b)).astype(a.dtype) if t.startswith("s") else a // b
        self._binary(ins, ex, idiv)

    def _op_rem(self, ins, ex, grp):
        self._binary(ins, ex, lambda a, b, t: np.where(b == 0, 0, np.fmod(a, np.where(b == 0, 1, b))))

    def _minmax(self, ins, ex, is_max):
        t = self._type(ins)
        if t == "f16x2":
            if "NaN" in ins.mods:
                raise Unsupported(f"{ins.opcode}")
            return self._f16x2(ins, ex, lambda a, b: np.fmax(a, b) if is_max else np.fmin(a, b))
        a = self._val(ins.operands[1], t, ex)
        b = self._val(ins.operands[2], t, ex)
        if t in ("f32", "f64", "f16"):
            if "NaN" in ins.mods:
                r = np.where(np.isnan(a) | np.isnan(b), np.nan, np.maximum(a, b) if is_max else np.minimum(a, b))
            else:
                r = np.fmax(a, b) if is_max else np.fmin(a, b)
            # ±0: max(-0, +0) = +0, min(-0, +0) = -0
            z = (a == 0) & (b == 0)
            if z.any():
                both_neg = np.signbit(a) & np.signbit(b)
                any_neg = np.signbit(a) | np.signbit(b)
                r = np.where(z, np.where(both_neg if is_max else any_neg, -0.0, 0.0), r)
            self._set(ins.operands[0], ex, r.astype(_NP[t]), t)
        else:
            self._set(ins.operands[0], ex, np.maximum(a, b) if is_max else np.minimum(a, b), t)

    def _op_max(self, ins, ex, grp):
        self._minmax(ins, ex, True)

    def _op_min(self, ins, ex, grp):
        self._minmax(ins, ex, False)

    def _op_abs(self, ins, ex, grp):
        t = self._type(ins)
        v = self._val(ins.operands[1], t, ex)
        self._set(ins.operands[0], ex, np.abs(v), t)

    def _op_neg(self, ins, ex, grp):
        t = self._type(ins)
        with np.errstate(over="ignore"):
            self._set(ins.operands[0], ex, -self._val(ins.operands[1], t, ex), t)

    def _op_rcp(self, ins, ex, grp):
        if "rn" not in ins.mods:
            raise Unsupported(f"{ins.opcode}: only rcp.rn is modelled")
        t = self._type(ins)
        with np.errstate(divide="ignore"):
            self._set(ins.operands[0], ex, (np.float32(1) / self._val(ins.operands[1], t, ex)).astype(_NP[t]), t)

    def _op_setp(self, ins, ex, grp):
        cmp, t = ins.mods[1], self._type(ins)
        a = self._val(ins.operands[1], t, ex)
        b = self._val(ins.operands[2], t, ex)
        f = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
             "ge": np.greater_equal, "lo": np.less, "ls": np.less_equal, "hi": np.greater, "hs": np.greater_equal}
        if cmp in ("nan", "num") and t.startswith("f"):  # either operand NaN / neither
            a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
            r = np.isnan(a) | np.isnan(b)
            self._set(ins.operands[0], ex, r if cmp == "nan" else ~r, "pred")
            return
        if cmp not in f:
            raise Unsupported(f"setp.{cmp}")
        with np.errstate(invalid="ignore"):
            r = f[cmp](a, b)
        if cmp == "ne" and t.startswith("f"):
            r = r & ~np.isnan(a) & ~np.isnan(b)
        self._set(ins.operands[0], ex, r, "pred")

    def _op_selp(self, ins, ex, grp):
        t = self._type(ins)
        d, a, b, p = ins.operands
        c = self._val(p, "pred", ex)
        self._set(d, ex, np.where(c, self._val(a, t, ex), self._val(b, t, ex)), t)

    def _op_bfe(self, ins, ex, grp):
        t = self._type(ins)
        bits = 8 * np.dtype(_NP[t]).itemsize
        a = bits_of(self._val(ins.operands[1], t, ex), t).astype(np.uint64)
        pos = self._val(ins.operands[2], "u32", ex).astype(np.int64) & 0xFF
        ln = self._val(ins.operands[3], "u32", ex).astype(np.int64) & 0xFF
        shifted = np.where(pos >= bits, 0, a >> np.minimum(pos, 63).astype(np.uint64))
        mask = np.where(ln >= 64, np.uint64(0xFFFFFFFFFFFFFFFF), (np.uint64(1) << np.minimum(ln, 63).astype(np.uint64)) - np.uint64(1))
        r = shifted & mask
        if t.startswith("s"):
            # sign bit: bit (pos+len-1) of a, or the msb when the field runs past it
            sbit_pos = np.minimum(pos + ln - 1, bits - 1)
            sign = (a >> sbit_pos.astype(np.uint64)) & np.uint64(1)
            sign = np.where(ln == 0, 0, sign)
            fill = ~mask & np.uint64((1 << bits) - 1)
            r = np.where(sign == 1, r | fill, r)
        self._set(ins.operands[0], ex, r & np.uint64((1 << bits) - 1), "u64")

    def _op_bfi(self, ins, ex, grp):
        t = self._type(ins)
        bits = 8 * np.dtype(_NP[t]).itemsize
        a = bits_of(self._val(ins.operands[1], t, ex), t)
        b = bits_of(self._val(ins.operands[2], t, ex), t)
        pos = self._val(ins.operands[3], "u32", ex).astype(np.uint64) & np.uint64(0xFF)
        ln = self._val(ins.operands[4], "u32", ex).astype(np.uint64) & np.uint64(0xFF)
        ln = np.minimum(ln, np.uint64(bits) - np.minimum(pos, np.uint64(bits)))
        mask = ((np.uint64(1) << ln) - np.uint64(1)) << np.minimum(pos, np.uint64(63))
        mask &= np.uint64((1 << bits) - 1)
        r = (b & ~mask) | ((a << np.minimum(pos, np.uint64(63))) & mask)
        self._set(ins.operands[0], ex, r & np.uint64((1 << bits) - 1), "u64")

    def _op_prmt(self, ins, ex, grp):
        if len(ins.mods) > 2:
            raise Unsupported(f"{ins.opcode}: only the default prmt mode is modelled")
        a = self._val(ins.operands[1], "u32", ex).astype(np.uint64)
        b = self._val(ins.operands[2], "u32", ex).astype(np.uint64)
        c = self._val(ins.operands[3], "u32", ex).astype(np.uint64)
        src = a | (b << np.uint64(32))
        out = np.zeros(ex.size, np.uint64)
        for pos in range(4):
            s = (c >> np.uint64(4 * pos)) & np.uint64(0xF)
            byte = (src >> ((s & np.uint64(7)) * np.uint64(8))) & np.uint64(0xFF)
            sign = (s & np.uint64(8)) != 0
            byte = np.where(sign, np.where(byte & np.uint64(0x80), np.uint64(0xFF), np.uint64(0)), byte)
            out |= byte << np.uint64(8 * pos)
        self._set(ins.operands[0], ex, out, "u64")

    def _op_lop3(self, ins, ex, grp):
        a, b, c = (self._val(x, "u32", ex).astype(np.uint64) for x in ins.operands[1:4])
        lut = int(ins.operands[4], 0)
        out = np.zeros(ex.size, np.uint64)
        for bit in range(8):
            if lut >> bit & 1:
                ta = a if bit & 4 else ~a
                tb = b if bit & 2 else ~b
                tc = c if bit & 1 else ~c
                out |= ta & tb & tc
        self._set(ins.operands[0], ex, out & np.uint64(0xFFFFFFFF), "u64")

    def _op_cvt(self, ins, ex, grp):
        mods = ins.mods[1:]
        types = [m for m in mods if m in _TYPES]
        if len(types) != 2:
            raise Unsupported(ins.opcode)
        dt, st = types
        rnd = next((m for m in mods if m in ("rn", "rz", "rm", "rp", "rni", "rzi", "rmi", "rpi")), None)
        sat = "sat" in mods
        d = ins.operands[0]
        if dt == "bf16x2":  # cvt.rn.bf16x2.f32 d, hi, lo: round to nearest even on the upper 16 bits
            def bf16(v):
                bits = v.astype(np.float32).view(np.uint32).astype(np.uint64)
                r = (bits + np.uint64(0x7FFF) + ((bits >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)
                return np.where(np.isnan(v), np.uint64(0x7FFF), r & np.uint64(0xFFFF))
            hi = bf16(self._val(ins.operands[1], "f32", ex))
            lo = bf16(self._val(ins.operands[2], "f32", ex))
            self._set(d, ex, (hi << np.uint64(16)) | lo, "u64")
            return
        if dt == "f16x2":  # cvt.rn.f16x2.f32 d, hi, lo
            hi = _f32_to_f16(self._val(ins.operands[1], "f32", ex), rnd or "rn").view(np.uint16).astype(np.uint64)
            lo = _f32_to_f16(self._val(ins.operands[2], "f32", ex), rnd or "rn").view(np.uint16).astype(np.uint64)
            self._set(d, ex, (hi << np.uint64(16)) | lo, "u64")
            return
        v = self._val(ins.operands[1], st, ex)
        if dt == "f16":
            self._set(d, ex, _f32_to_f16(v.astype(np.float32), rnd or "rn", sat), "f16")
        elif dt == "f32":
            if st in ("f16", "f32"):
                r = v.astype(np.float32)
                if st == "f32" and rnd in ("rni", "rzi", "rmi", "rpi"):
                    r = _round_int(r, rnd).astype(np.float32)
                self._set(d, ex, r, "f32")
            else:
                if rnd not in (None, "rn"):
                    raise Unsupported(f"{ins.opcode}: int → f32 with .{rnd}")
                self._set(d, ex, v.astype(np.float64).astype(np.float32) if v.dtype.itemsize == 8 else v.astype(np.float32), "f32")
        elif dt[0] in "us" and st in ("f32", "f16", "f64"):
            bits = 8 * np.dtype(_NP[dt]).itemsize
            lo, hi = (0, 2**bits - 1) if dt[0] == "u" else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
            r = _round_int(v.astype(np.float64), rnd or "rzi")
            r = np.where(np.isnan(r), 0, np.clip(r, lo, hi)).astype(np.int64)
            self._set(d, ex, r, "s64" if dt[0] == "s" else "u64") if bits == 64 else self._set(d, ex, r, dt if dt[0] == "s" else "s64")
        elif dt[0] in "usb" and st[0] in "usb":
            bits = 8 * np.dtype(_NP[dt]).itemsize
            w = v.astype(np.int64) if st[0] == "s" else v.astype(np.uint64)
            if sat:
                lo, hi = (0, 2**bits - 1) if dt[0] == "u" else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
                w = np.clip(w.astype(np.int64), lo, hi)
            r = w.astype(np.int64) if dt[0] == "s" else w
            self._set(d, ex, r.astype(_NP[dt]) if not sat else r.astype(_NP[dt]), dt)
        else:
            raise Unsupported(ins.opcode)

    def _op_shfl(self, ins, ex, grp):
        mode = ins.mods[2]
        d = ins.operands[0]
        if "|" in d:
            raise Unsupported("shfl with a predicate destination")
        a, b, c, mask = ins.operands[1:5]
        lanes = ex % 32
        warps = ex // 32
        if mask.startswith("%"):  # a register membermask: each thread's own (its lane in it; all named lanes here)
            masks = self._val(mask, "u32", ex).astype(np.int64)
        else:
            masks = np.full(len(ex), int(mask, 0), np.int64)
        for w in np.unique(warps):
            have = set((lanes[warps == w]).tolist())
            for mm in np.unique(masks[warps == w]):
                need = {i for i in range(32) if int(mm) >> i & 1}
                if not need <= have:
                    raise EmulationError(f"{ins.text}: lanes {sorted(need - have)[:6]} of warp {w} are not here "
                                         "(divergent shfl.sync)")
        if ((masks >> lanes) & 1 == 0).any():
            raise EmulationError(f"{ins.text}: a thread outside its own membermask")
        src = self._reg(a, np.arange(self.cta.n))
        bv = self._val(b, "u32", ex).astype(np.int64)
        cv = self._val(c, "u32", ex).astype(np.int64)
        segmask = (cv >> 8) & 0x1F
        maxlane = (lanes & segmask) | (cv & 0x1F & ~segmask)
        minlane = lanes & segmask
        if mode == "bfly":
            j = lanes ^ bv
            ok = j <= maxlane
        elif mode == "down":
            j = lanes + bv
            ok = j <= maxlane
        elif mode == "up":
            j = lanes - bv
            ok = j >= maxlane
        elif mode == "idx":
            j = minlane | (bv & 0x1F & ~segmask)
            ok = j <= maxlane
        else:
            raise Unsupported(f"shfl mode {mode}")
        j = np.where(ok, j, lanes)
        if ((masks >> j) & 1 == 0).any():
            raise EmulationError(f"{ins.text}: reads a lane outside the membermask")
        self._set(d, ex, src[warps * 32 + j], "u64")

    def _op_red(self, ins, ex, grp):
        """red.{order}.{scope}.global.op.type [a], v: an atom without the old value."""
        self._op_atom(ins, ex, grp, red=True)

    def _op_atom(self, ins, ex, grp, red=False):
        t = self._type(ins)
        mods = [m for m in ins.mods[1:] if m not in _ORDER_SCOPE]
        op = mods[1]
        if mods[0] not in ("global", "shared") or op not in ("add", "exch", "max", "min"):
            raise Unsupported(ins.opcode)
        d, addr, v = (None, *ins.operands) if red else ins.operands
        addrs, _ = self._addr(addr, ex)
        vals = self._val(v, t, ex)
        width = np.dtype(_NP[t]).itemsize
        if mods[0] == "global":
            load = lambda i: self.memory.load(addrs[i:i + 1], width, ins.text)  # noqa: E731
            store = lambda i, data: self.memory.store(addrs[i:i + 1], data, ins.text)  # noqa: E731
        else:  # a CTA's shared memory: the word must have been written before (as ld.shared)
            load = lambda i: self.smem_load(addrs[i:i + 1], width, ins.text, ex[i:i + 1])  # noqa: E731
            store = lambda i, data: self.smem_store(addrs[i:i + 1], data, ins.text, ex[i:i + 1])  # noqa: E731
        old = np.empty(ex.size, _NP[t])
        for i in range(ex.size):  # atomics serialise in thread order
            cur = np.ascontiguousarray(load(i)).view(_NP[t]).reshape(-1)[0]
            old[i] = cur
            new = {"add": lambda: cur + vals[i], "exch": lambda: vals[i], "max": lambda: max(cur, vals[i]),
                   "min": lambda: min(cur, vals[i])}[op]()
            store(i, np.array([new], _NP[t]).view(np.uint8).reshape(1, -1))
        if d is not None:
            self._set(d, ex, old, t)

    def _op_dp4a(self, ins, ex, grp):
        ta, tb = ins.mods[1], ins.mods[2]
        a = self._val(ins.operands[1], "u32", ex).astype(np.uint32).view(np.uint8).reshape(-1, 4)
        b = self._val(ins.operands[2], "u32", ex).astype(np.uint32).view(np.uint8).reshape(-1, 4)
        a = a.view(np.int8) if ta == "s32" else a
        b = b.view(np.int8) if tb == "s32" else b
        c = self._val(ins.operands[3], "s32", ex).astype(np.int64)
        r = (a.astype(np.int64) * b.astype(np.int64)).sum(axis=1) + c
        self._set(ins.operands[0], ex, (r & 0xFFFFFFFF).astype(np.uint64), "u64")

    def _op_membar(self, ins, ex, grp):
        pass

    def _op_nanosleep(self, ins, ex, grp):
        """nanosleep t: no time here; the sleeping threads yield — they run again only once no other thread of
        the CTA can (a spin loop waiting for another warp of its CTA lets that warp move, whatever the pcs)."""
        self.yielding[ex] = True

    def _op_fence(self, ins, ex, grp):
        pass

    def _op_prefetch(self, ins, ex, grp):
        """prefetch.global.L2 [a]: no data moves here; the byte at `a` must lie in an allocation (the kernels
        prefetch only bytes they own, so a stray address is a bug the emulator reports)."""
        addrs, _ = self._addr(ins.operands[0], ex)
        self.memory.load(addrs, 1, ins.text)

    def _op_griddepcontrol(self, ins, ex, grp):
        """launch_dependents / wait: the emulator runs grids one after the other, so both are no-ops."""
        if ins.mods[1] not in ("launch_dependents", "wait"):
            raise Unsupported(ins.opcode)

    # --- tensor-core and async-copy instructions -----------------------------------------------------------
    def _op_cp(self, ins, ex, grp):
        if ins.mods[1] != "async":
            raise Unsupported(ins.opcode)
        cta = self.cta
        if ins.mods[2] == "bulk":
            return self._bulk_tensor(ins, ex)
        if ins.mods[2] == "commit_group":
            cta.async_groups.append(cta.async_open)
            cta.async_open = []
            return
        if ins.mods[2] == "wait_group" or ins.mods[2] == "wait_all":
            keep = int(ins.operands[0], 0) if ins.operands else 0
            while len(cta.async_groups) > keep:
                for job in cta.async_groups.pop(0):
                    self._land(job)
            return
        if ins.mods[2] in ("ca", "cg"):
            dst, src, size = ins.operands[:3]
            n = int(size, 0)
            daddr, _ = self._addr(dst, ex)
            saddr, _ = self._addr(src, ex)
            src_bytes = self._val(ins.operands[3], "u32", ex).astype(np.int64) if len(ins.operands) > 3 else np.full(ex.size, n)
            data = self.memory.load(saddr, n, ins.text) if (src_bytes > 0).any() else np.zeros((ex.size, n), np.uint8)
            data = np.where(np.arange(n)[None, :] < src_bytes[:, None], data, 0).astype(np.uint8)
            job = (daddr, data, ins.text, ex.copy())
            if self.rng is not None and self.rng.random() < 0.5:
                self._land(job)  # a copy may land any time before its wait: sometimes early
            else:
                cta.async_open.append(job)
            return
        raise Unsupported(ins.opcode)

    def _land(self, job):
        daddr, data, what, tidx = job
        self.smem_store(daddr, data, what, tidx)

    def _op_ldmatrix(self, ins, ex, grp):
        num = int(next(m for m in ins.mods if m.startswith("x"))[1:])
        trans = "trans" in ins.mods
        self._whole_warps(ex, ins)
        dsts = self._vec(ins.operands[0])
        addrs, _ = self._addr(ins.operands[1], ex)
        lay = layouts.ldmatrix_layout(num, trans)  # [lane, reg, half] → (matrix, row, col)
        lanes = ex % 32
        for w in np.unique(ex // 32):
            sel = np.nonzero(ex // 32 == w)[0]
            order = sel[np.argsort(lanes[sel])]
            row_addr = addrs[order]
            rows = np.stack([self.smem_load(row_addr[8 * q:8 * q + 8], 16, ins.text, ex[order][8 * q:8 * q + 8])
                             .view(np.uint16) for q in range(num)])  # [matrix, row, 8 halves]
            vals = rows[lay[..., 0], lay[..., 1], lay[..., 2]]  # [lane, reg, half]
            packed = vals[..., 0].astype(np.uint64) | (vals[..., 1].astype(np.uint64) << np.uint64(16))
            for r, dname in enumerate(dsts):
                self._set(dname, ex[order], packed[:, r], "u64")

    def _whole_warps(self, ex, ins):
        lanes = ex % 32
        for w in np.unique(ex // 32):
            if (ex // 32 == w).sum() != 32:
                raise EmulationError(f"{ins.text}: warp {w} is not converged (needs all 32 lanes)")
        del lanes

    def _op_mma(self, ins, ex, grp):
        shape = ins.mods[3]
        a_t, b_t = ins.mods[-3], ins.mods[-2]  # equal, except the mixed-sign integer forms (u8 x s8)
        acct = ins.mods[-1]
        self._whole_warps(ex, ins)
        d, a, b, c = (self._vec(o) for o in ins.operands)
        per = {"f16": 2, "bf16": 2, "s8": 4, "u8": 4}[a_t]
        for w in np.unique(ex // 32):
            sel = np.sort(ex[ex // 32 == w])

            def unpack(regs, abt):
                bits = np.stack([self._reg(r, sel) for r in regs], axis=1).astype(np.uint32)  # [lane, reg]
                if per == 2:
                    h = bits.view(np.uint16).reshape(32, len(regs), 2)
                    if abt == "f16":
                        return h.view(np.float16).astype(np.float64).reshape(32, -1)
                    return (h.astype(np.uint32) << 16).view(np.float32).astype(np.float64).reshape(32, -1)
                q = bits.view(np.uint8).reshape(32, len(regs), 4)
                return (q.view(np.int8) if abt == "s8" else q).astype(np.int64).reshape(32, -1)

            A, B = unpack(a, a_t), unpack(b, b_t)
            if acct == "f32":
                C = np.stack([typed(self._reg(r, sel), "f32") for r in c], axis=1).astype(np.float64)
                out = _mma_fragments_f32(shape, A, B, C)
                for i, r in enumerate(d):
                    self._set(r, sel, out[:, i], "f32")
            else:
                C = np.stack([typed(self._reg(r, sel), "s32") for r in c], axis=1).astype(np.int64)
                out = layouts.mma_reference(shape, A.astype(np.int64), B.astype(np.int64), C, bits=8)
                out = np.clip(out, -2**31, 2**31 - 1) if "satfinite" in ins.mods else (out + 2**31) % 2**32 - 2**31
                for i, r in enumerate(d):
                    self._set(r, sel, out[:, i], "s32")


def _mma_fragments_f32(shape, a_frag, b_frag, c_frag):
    """mma.sync with f32 accumulation on lane-major fragments, through the tensor-core rounding model."""
    la, lb, lc = layouts.mma_a_layout(shape), layouts.mma_b_layout(shape), layouts.mma_c_layout()
    k = {"m16n8k16": 16, "m16n8k8": 8}[shape]
    A, B, C = np.zeros((16, k)), np.zeros((k, 8)), np.zeros((16, 8))
    A[la[..., 0], la[..., 1]] = a_frag
    B[lb[..., 0], lb[..., 1]] = b_frag
    C[lc[..., 0], lc[..., 1]] = c_frag
    return mma_f32(A, B, C)[lc[..., 0], lc[..., 1]]


def _prefix(reg: str) -> str:
    i = 1
    while i < len(reg) and not reg[i].isdigit():
        i += 1
    return reg[:i]


def run_kernel(ptx: str, grid, block, args, memory: Memory, dynamic_smem: int = 0, seed: int | None = None,
               interleave: bool = False, cluster=None, warp_serial: bool = False):
    emu = Emulator(ptx)
    emu.run(grid, block, args, memory, dynamic_smem, seed, interleave=interleave, cluster=cluster,
            warp_serial=warp_serial)
    return emu

