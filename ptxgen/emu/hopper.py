"""The Hopper instructions of the emulator: mbarrier, TMA (`cp.async.bulk.tensor`), wgmma, setmaxnreg.

Models (each a legal behaviour of the hardware, chosen so that a missing wait shows up):
- an mbarrier is a phase counter with a pending-arrival count and a transaction count; a phase completes
  when both reach zero. `try_wait.parity` suspends the thread until the phase of that parity has
  completed (a legal outcome of its time limit); if every live thread is suspended and no copy is in
  flight, that is a deadlock and an error that lists where each thread waits.
- a TMA copy lands as late as it may: when no thread can run (or, with a seed, at random earlier), then
  completes its bytes on the mbarrier. The box is read from global memory with out-of-bound elements
  filled with zeros and written to shared memory in the box's row-major order, swizzled on the shared
  address (16-byte chunk index XOR address bits [7, 10) for 128B), as `ptxgen.layouts.swizzle` states.
- wgmma runs when its group retires (`wgmma.wait_group`), reading shared memory then; until then its
  accumulator registers are in flight and any read or write of them is an error.
Tensor maps: the emulator cannot read a driver-encoded CUtensorMap (it is opaque), so harnesses pass
the 128-byte map that `tensor_map_2d` below encodes from the same arguments the runtime gives the driver.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from .. import layouts
from ..layouts import smem_operand_offsets, wgmma_d_layout
from .tensorcore import mma_f32

MAGIC = b"ptxgen-emu-tmap\0"
PARAM_BASE = 0x7E0000000000  # where the emulator places kernel parameters for `mov.b64 %rd, param`
_ESIZE = {"u8": 1, "f16": 2, "bf16": 2, "f32": 4, "u32": 4, "s32": 4}
_SWZ = {"none": 0, "32B": 32, "64B": 64, "128B": 128}


def tensor_map_2d(addr: int, dtype: str, rows: int, cols: int, box_rows: int, box_cols: int,
                  swizzle: str = "128B", row_stride_bytes: int | None = None, chunks: int = 0) -> bytes:
    """A 2-D tiled tensor map for the emulator (the arguments of runtime.tma.tensor_map_2d; `chunks` > 0: the 3-D
    view of column chunks, loaded by cp.async.bulk.tensor.3d at (0, row, chunk))."""
    es = _ESIZE[dtype]
    stride = cols * es if row_stride_bytes is None else row_stride_bytes
    if not (1 <= box_rows <= 256 and 1 <= box_cols <= 256) or (box_cols * es) % 16 or stride % 16 or addr % 16:
        raise ValueError("tensor map: box dimensions 1..256, inner box, row stride and base multiples of 16 B")
    if _SWZ[swizzle] and box_cols * es > _SWZ[swizzle]:
        raise ValueError(f"tensor map: inner box {box_cols * es} B exceeds the {swizzle} swizzle span")
    if chunks and (cols % box_cols or not 1 <= chunks <= 256):
        raise ValueError("tensor map: chunks need columns a multiple of box_cols, 1..256 chunks a box")
    return (MAGIC + struct.pack("<9Q", addr, es, cols, rows, stride, box_cols, box_rows, _SWZ[swizzle], chunks)
            + bytes(40))


def decode_tensor_map(raw: bytes) -> dict:
    if raw[:16] != MAGIC:
        raise ValueError("the tensor map parameter was not made by ptxgen.emu.hopper.tensor_map_2d "
                         "(a driver-encoded CUtensorMap is opaque to the emulator)")
    keys = ("addr", "es", "cols", "rows", "stride", "box_cols", "box_rows", "swizzle", "chunks")
    return dict(zip(keys, struct.unpack("<9Q", raw[16:88])))


@dataclass
class MBarrier:
    count: int
    pending: int
    tx: int = 0
    phase: int = 0

    def __str__(self):
        return f"phase {self.phase}, {self.pending} of {self.count} arrivals pending, tx-count {self.tx}"


@dataclass
class WgmmaQueue:
    open: list = field(default_factory=list)
    groups: list = field(default_factory=list)


class HopperOps:
    """Mixed into Emulator: needs its cta, pcs, blocked, rng, memory, params and operand helpers."""

    # --- mbarrier ---------------------------------------------------------------------------------------
    def _mbar(self, addr: int):
        mb = self.cta.mbars.get(addr)
        if mb is None:
            raise self.Error(f"no mbarrier was initialised at shared address {addr}")
        return mb

    def _mbar_addrs(self, tok, ex):
        addrs, _ = self._addr(tok, ex)
        addrs = addrs.astype(np.int64)
        if (addrs % 8).any() or ((addrs < 0) | (addrs + 8 > self.cta.smem.size)).any():
            raise self.Error(f"mbarrier address {addrs[0]} is not an 8-byte aligned shared address")
        return addrs

    def _mbar_complete(self, addr: int, mb: MBarrier, cta=None):
        """After an arrival or a transaction on the mbarrier at `addr` of `cta` (default: the current CTA)."""
        if mb.pending < 0:
            raise self.Error(f"mbarrier at shared {addr}: more arrivals than its count {mb.count} in one phase")
        if mb.pending == 0 and mb.tx == 0:
            mb.phase += 1
            mb.pending = mb.count
            st = (cta or self.cta).state
            blocked, waiting_on = st["blocked"], st["waiting_on"]
            waiting = blocked & (waiting_on == addr)
            blocked[waiting] = False  # they re-execute their try_wait, which now succeeds
            waiting_on[waiting] = -1

    # --- clusters: shared::cluster addresses are rank + 1 in bits 24.. over the CTA's own offset ------------
    CLUSTER_SHIFT = 24

    def _cluster_targets(self, addrs, what):
        """(CTA, shared offset) for each shared::cluster address (bits 24..: rank + 1 from mapa; 0: this CTA)."""
        out = []
        for a in np.asarray(addrs, np.int64).tolist():
            rank, off = (a >> self.CLUSTER_SHIFT) - 1, a & ((1 << self.CLUSTER_SHIFT) - 1)
            if rank < 0:
                out.append((self.cta, off))
                continue
            cl = self.cta.cluster
            if cl is None or rank >= len(cl.ctas):
                raise self.Error(f"{what}: shared::cluster address {a:#x} names CTA rank {rank}, outside the cluster")
            peer = cl.ctas[rank]
            if not peer.state["alive"].any():
                raise self.Error(f"{what}: CTA rank {rank} of the cluster has exited; its shared memory is gone "
                                 "(end with a barrier.cluster so that no CTA leaves while its peers use it)")
            out.append((peer, off))
        return out

    def cluster_smem_load(self, addrs, width, what, tidx):
        """ld.shared::cluster: `width` bytes a thread from the shared memory of the CTA its address names (a
        peer's, from mapa, or this CTA's), each byte written before (as smem_load checks)."""
        out = np.zeros((len(addrs), width), np.uint8)
        for i, (cta, off) in enumerate(self._cluster_targets(addrs, what)):
            if off < 0 or off + width > cta.smem.size or off % width:
                raise self.Error(f"{what}: shared::cluster access at {off} (+{width}) misaligned or outside the "
                                 f"{cta.smem.size} B of its CTA (thread {tidx[i]})")
            if not cta.written[off:off + width].all():
                raise self.Error(f"{what}: thread {tidx[i]} reads a peer's shared bytes at {off} that nothing wrote")
            out[i] = cta.smem[off:off + width]
        return out

    def _op_mapa(self, ins, ex, grp):
        """mapa.shared::cluster.u32/u64 d, a, rank: the address of a's offset in CTA `rank`'s shared memory."""
        if "shared::cluster" not in ins.mods:
            raise self.Unsupported(f"{ins.opcode}: only the shared::cluster form is modelled")
        t = "u64" if "u64" in ins.mods else "u32"
        a = self._val(ins.operands[1], t, ex).astype(np.int64) & ((1 << self.CLUSTER_SHIFT) - 1)
        r = self._val(ins.operands[2], "u32", ex).astype(np.int64)
        n = len(self.cta.cluster.ctas) if self.cta.cluster is not None else 1
        if (r >= n).any():
            raise self.Error(f"{ins.opcode}: CTA rank {int(r.max())} outside a cluster of {n}")
        self._set(ins.operands[0], ex, (a | (r + 1) << self.CLUSTER_SHIFT).astype(np.uint64), "u64")

    def _op_barrier(self, ins, ex, grp):
        """barrier.cluster.arrive{.release,.relaxed} / barrier.cluster.wait{.acquire}: a wait returns once every
        live thread of every CTA in the cluster has arrived in the phase the waiting thread arrived in."""
        if ins.mods[1] != "cluster":
            raise self.Unsupported(ins.opcode)
        cta = self.cta
        cl = cta.cluster
        if cl is None:  # a grid without clusters is a cluster of one CTA
            from .machine import ClusterState  # (machine imports this module)

            cl = cta.cluster = ClusterState([cta])
        if ins.mods[2] == "arrive":
            if (cta.cl_arrived[ex] == cl.phase).any():
                raise self.Error(f"{ins.opcode}: a thread arrives twice in one cluster-barrier phase (no wait between)")
            cta.cl_arrived[ex] = cl.phase
            self._recheck_cluster_barrier()
            return
        if ins.mods[2] == "wait":
            pending = ex[cta.cl_arrived[ex] == cl.phase]  # arrived, phase not complete yet
            if (cta.cl_arrived[ex] < cl.phase - 1).any() or (cta.cl_arrived[ex] < 0).any():
                raise self.Error(f"{ins.opcode}: a thread waits without having arrived")
            self.pcs[pending] = self.cur_pc
            self.blocked[pending] = True
            self.waiting_on[pending] = -2  # the cluster barrier
            return
        raise self.Unsupported(ins.opcode)

    def _recheck_cluster_barrier(self):
        cl = self.cta.cluster
        if cl is None:
            return
        if all((c.cl_arrived[c.state["alive"]] == cl.phase).all() for c in cl.ctas):
            cl.phase += 1
            for c in cl.ctas:
                st = c.state
                w = st["blocked"] & (st["waiting_on"] == -2)
                st["blocked"][w] = False  # they re-execute the wait, which now passes
                st["waiting_on"][w] = -1

    def _op_mbarrier(self, ins, ex, grp):
        kind = ins.mods[1]
        if kind == "init":
            addrs = self._mbar_addrs(ins.operands[0], ex)
            counts = self._val(ins.operands[1], "u32", ex)
            for a, c in zip(addrs.tolist(), counts.tolist()):
                if not 1 <= c < 1 << 20:
                    raise self.Error(f"mbarrier.init count {c} outside 1..2^20-1")
                self.cta.mbars[a] = MBarrier(c, c)
                self.cta.smem[a:a + 8] = 0
                self.cta.written[a:a + 8] = True
            return
        if kind == "arrive":
            tx = self._val(ins.operands[2], "u32", ex) if "expect_tx" in ins.mods else np.zeros(ex.size, np.uint32)
            state = np.empty(ex.size, np.uint64)
            if "shared::cluster" in ins.mods:  # possibly a peer CTA's mbarrier (an address from mapa)
                addrs, _ = self._addr(ins.operands[1], ex)
                targets = self._cluster_targets(addrs, ins.opcode)
            else:
                targets = [(self.cta, a) for a in self._mbar_addrs(ins.operands[1], ex).tolist()]
            for i, ((cta, a), t) in enumerate(zip(targets, tx.tolist())):  # arrivals in thread order
                mb = cta.mbars.get(a)
                if mb is None or a % 8:
                    raise self.Error(f"{ins.opcode}: no mbarrier was initialised at shared address {a} of CTA rank "
                                     f"{cta.rank}")
                state[i] = mb.phase
                mb.tx += t
                mb.pending -= 1
                self._mbar_complete(a, mb, cta)
            if not ins.operands[0].startswith("_"):
                self._set(ins.operands[0], ex, state, "u64")
            return
        if kind == "expect_tx":
            addrs = self._mbar_addrs(ins.operands[0], ex)
            for a, t in zip(addrs.tolist(), self._val(ins.operands[1], "u32", ex).tolist()):
                self._mbar(a).tx += t
            return
        if kind in ("try_wait", "test_wait"):
            if "parity" not in ins.mods:
                raise self.Unsupported(f"{ins.opcode}: only the .parity form is modelled")
            addrs = self._mbar_addrs(ins.operands[1], ex)
            parity = self._val(ins.operands[2], "u32", ex).astype(np.int64) & 1
            phase = np.array([self._mbar(a).phase for a in addrs.tolist()], np.int64)
            done = (phase & 1) != parity  # the phase with this parity has completed
            if kind == "try_wait":
                wait = ex[~done]
                self.pcs[wait] = self.cur_pc
                self.blocked[wait] = True
                self.waiting_on[wait] = addrs[~done]
                if done.any():
                    self._set(ins.operands[0], ex[done], np.ones(int(done.sum()), bool), "pred")
            else:
                self._set(ins.operands[0], ex, done, "pred")
            return
        raise self.Unsupported(f"{ins.opcode}")

    # --- TMA -----------------------------------------------------------------------------------------------
    def _param_bytes(self, addr: int) -> bytes:
        for p in self.mod.params:
            if PARAM_BASE + p.offset == addr:
                return bytes(self.params[p.name])
        raise self.Error(f"address {addr:#x} is not the address of a kernel parameter (a tensor map must be "
                         "passed as a .param .b8[128] and addressed with mov + cvta.param)")

    def _bulk_copy(self, ins, ex):
        """`cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [src], size, [mbar]`: `size`
        bytes (a multiple of 16) from a 16-byte aligned global address to a 16-byte aligned shared one, landing
        (maybe later) as a TMA box does."""
        mods = ins.mods
        if "global" not in mods or not any(m.startswith("shared") for m in mods[3:4]) or "multicast::cluster" in mods:
            raise self.Unsupported(f"{ins.opcode}: only global → shared bulk copies to this CTA are modelled")
        dst, src, size, bar = ins.operands[:4]
        daddr, _ = self._addr(dst, ex)
        saddr, _ = self._addr(src, ex)
        n = self._val(size, "u32", ex).astype(np.int64)
        bars = self._mbar_addrs(bar, ex)
        for i in range(ex.size):
            d, sa, nb = int(daddr[i]), int(saddr[i]), int(n[i])
            if d % 16 or sa % 16 or nb % 16 or nb <= 0:
                raise self.Error(f"{ins.opcode}: addresses {sa:#x} → {d} and size {nb} must be multiples of 16")
            data = self.memory.load(np.arange(sa, sa + nb, dtype=np.uint64), 1, ins.text)
            job = (d + np.arange(nb), np.asarray(data, np.uint8).reshape(-1), int(bars[i]), nb, ins.text, int(ex[i]),
                   self.cta)
            if self.rng is not None and self.rng.random() < 0.5:
                self._land_tma(job)
            else:
                self.cta.tma_pending.append(job)

    def _bulk_prefetch(self, ins, ex):
        """`cp.async.bulk.prefetch.tensor.2d.L2.global.tile [tmap, {c0, c1}]`: no data moves here; the map must
        decode and the box start 16-byte aligned in the row, as for a load (rows past the map are the GPU's to drop)."""
        from .parser import split_operands

        if ins.mods[4:] != ["tensor", "2d", "L2", "global", "tile"]:
            raise self.Unsupported(f"{ins.opcode}: only 2-D tiled prefetches to L2 are modelled")
        tmap_tok, coords_tok = split_operands(ins.operands[0].strip()[1:-1])
        coords = self._vec(coords_tok)
        if len(coords) != 2:
            raise self.Error(f"{ins.opcode}: {len(coords)} coordinates for a 2-D prefetch")
        tmaps = self._val(tmap_tok, "u64", ex)
        c0 = self._val(coords[0], "s32", ex).astype(np.int64)
        self._val(coords[1], "s32", ex)  # (read, as a load reads it: an unwritten row register is an error)
        for i in range(ex.size):
            try:
                tm = decode_tensor_map(self._param_bytes(int(tmaps[i])))
            except ValueError as e:
                raise self.Error(str(e)) from None
            if tm["chunks"]:
                raise self.Error(f"{ins.opcode}: a 2-D prefetch through a tensor map with chunks={tm['chunks']}")
            if (int(c0[i]) * tm["es"]) % 16:
                raise self.Error(f"TMA prefetch box starts at column {int(c0[i])}: not 16-byte aligned in the row")

    def _bulk_tensor(self, ins, ex):
        mods = ins.mods
        if mods[3] == "prefetch":
            return self._bulk_prefetch(ins, ex)
        if mods[3] != "tensor":
            return self._bulk_copy(ins, ex)
        if "tile" not in mods or "global" not in mods or mods[4] not in ("2d", "3d"):
            raise self.Unsupported(f"{ins.opcode}: only 2-D (and column-chunked 3-D) tiled global → shared loads "
                                   "are modelled")
        rank = int(mods[4][0])
        from .parser import split_operands

        dst, src, bar = ins.operands[:3]
        multicast = "multicast::cluster" in mods
        masks = self._val(ins.operands[3], "u16", ex).astype(np.int64) if multicast else None
        tmap_tok, coords_tok = split_operands(src.strip()[1:-1])
        coords = self._vec(coords_tok)
        daddr, _ = self._addr(dst, ex)
        tmaps = self._val(tmap_tok, "u64", ex)
        c0 = self._val(coords[0], "s32", ex).astype(np.int64)
        c1 = self._val(coords[1], "s32", ex).astype(np.int64)
        if len(coords) != rank:
            raise self.Error(f"{ins.opcode}: {len(coords)} coordinates for a {rank}-D copy")
        c2 = self._val(coords[2], "s32", ex).astype(np.int64) if rank == 3 else None
        bars = self._mbar_addrs(bar, ex)
        for i in range(ex.size):
            try:
                tm = decode_tensor_map(self._param_bytes(int(tmaps[i])))
            except ValueError as e:
                raise self.Error(str(e)) from None
            es, bc, br = tm["es"], tm["box_cols"], tm["box_rows"]
            d = int(daddr[i])
            if d % 128:
                raise self.Error(f"TMA destination {d} is not 128-byte aligned")
            if (int(c0[i]) * es) % 16:  # the H200 stops with an illegal instruction (6-block boxes of 20-byte blocks did)
                raise self.Error(f"TMA box starts at column {int(c0[i])}: {int(c0[i]) * es} bytes into the row, not a "
                                 "multiple of 16 (the innermost coordinate must be 16-byte aligned)")
            if (rank == 3) != bool(tm["chunks"]):
                raise self.Error(f"{ins.opcode}: a {rank}-D copy through a tensor map with chunks={tm['chunks']}")
            if rank == 3:  # (column in the chunk, row, chunk): the box's chunks one after another, each br x bc
                nch = tm["chunks"]
                ch, rr, cj = np.meshgrid(np.arange(nch) + c2[i], np.arange(br) + c1[i], np.arange(bc) + c0[i],
                                         indexing="ij")
                inb = ((cj >= 0) & (cj < bc) & (ch >= 0) & (ch < tm["cols"] // bc) & (rr >= 0) & (rr < tm["rows"]))
                rr, cc = rr.reshape(nch * br, bc), (ch * bc + cj).reshape(nch * br, bc)
                inb, br = inb.reshape(nch * br, bc), nch * br
            else:
                rr, cc = np.meshgrid(np.arange(br) + c1[i], np.arange(bc) + c0[i], indexing="ij")
                inb = (rr >= 0) & (rr < tm["rows"]) & (cc >= 0) & (cc < tm["cols"])
            data = np.zeros((br, bc, es), np.uint8)
            if inb.any():
                g = tm["addr"] + rr[inb].astype(np.uint64) * np.uint64(tm["stride"]) + cc[inb].astype(np.uint64) * np.uint64(es)
                data[inb] = self.memory.load(g.astype(np.uint64), es, ins.text)
            linear = d + np.arange(br * bc * es).reshape(br, bc * es)
            swz = {0: "none", 32: "32B", 64: "64B", 128: "128B"}[tm["swizzle"]]
            if swz not in ("none", "128B"):
                raise self.Unsupported(f"TMA with {swz} swizzle")
            where = layouts.swizzle(linear, swz) if swz != "none" else linear
            if multicast:  # the same box into each CTA of the mask, at the same offsets, each on its own mbarrier
                n = len(self.cta.cluster.ctas) if self.cta.cluster is not None else 1
                m = int(masks[i])
                if m == 0 or m >> n:
                    raise self.Error(f"{ins.opcode}: ctaMask {m:#x} names CTAs outside a cluster of {n}")
                dests = [self.cta.cluster.ctas[r] if self.cta.cluster is not None else self.cta
                         for r in range(n) if m >> r & 1]
            else:
                dests = [self.cta]
            for cta in dests:
                job = (where.reshape(-1), data.reshape(-1), int(bars[i]), data.size, ins.text, int(ex[i]), cta)
                if self.rng is not None and self.rng.random() < 0.5:
                    self._land_tma(job)
                else:
                    cta.tma_pending.append(job)

    def _land_tma(self, job):
        where, data, bar, nbytes, what, tid, cta = job
        if (where < 0).any() or (where >= cta.smem.size).any():
            raise self.Error(f"{what}: TMA box lands outside the {cta.smem.size} B of shared memory")
        if cta is not self.cta and not cta.state["alive"].any():
            raise self.Error(f"{what}: a multicast lands in CTA rank {cta.rank}, which has exited")
        cta.smem[where] = data
        cta.written[where] = True
        mb = cta.mbars.get(bar)
        if mb is None:
            raise self.Error(f"{what}: no mbarrier was initialised at shared address {bar} of CTA rank {cta.rank}")
        mb.tx -= nbytes
        self._mbar_complete(bar, mb, cta)

    # --- wgmma ---------------------------------------------------------------------------------------------
    def _warpgroups(self, ex, ins):
        wgs = np.unique(ex // 128)
        for g in wgs:
            if (ex // 128 == g).sum() != 128:
                raise self.Error(f"{ins.text}: warpgroup {g} is not converged (needs all 128 threads)")
        return wgs

    def _op_setmaxnreg(self, ins, ex, grp):
        self._warpgroups(ex, ins)
        n = int(ins.operands[0], 0)
        if not (24 <= n <= 256 and n % 8 == 0):
            raise self.Error(f"setmaxnreg {n}: the count is a multiple of 8 in 24..256")

    def _op_wgmma(self, ins, ex, grp):
        kind = ins.mods[1]
        wgs = self._warpgroups(ex, ins)
        for g in wgs:
            q = self.cta.wgmma.setdefault(int(g), WgmmaQueue())
            threads = np.arange(128 * g, 128 * g + 128)
            if kind == "fence":
                continue
            if kind == "commit_group":
                q.groups.append(q.open)
                q.open = []
            elif kind == "wait_group":
                keep = int(ins.operands[0], 0)
                while len(q.groups) > keep:
                    for job in q.groups.pop(0):
                        self._wgmma_run(job)
            elif kind == "mma_async":
                q.open.append(self._wgmma_issue(ins, threads))
            else:
                raise self.Unsupported(ins.opcode)

    def _wgmma_issue(self, ins, threads):
        shape = next(m for m in ins.mods if m.startswith("m64"))
        n = int(shape[4:shape.index("k")])
        dt, at, bt = ins.mods[-3:]
        if (dt, at, bt) != ("f32", "f16", "f16") or not shape.endswith("k16"):
            raise self.Unsupported(f"{ins.opcode}: only m64nNk16 f32 += f16 × f16 is modelled")
        d = self._vec(ins.operands[0])
        if len(d) != n // 2:
            raise self.Error(f"{ins.text}: {len(d)} accumulator registers for N = {n} (needs {n // 2})")
        a_tok, b_tok, scale_d = ins.operands[1:4]
        rest = [int(x, 0) for x in ins.operands[4:]]
        a_in_regs = a_tok.startswith("{")
        if a_in_regs:
            imm_a, imm_b, tb = rest
            ta = 0
        else:
            imm_a, imm_b, ta, tb = rest
        if imm_a != 1 or imm_b != 1 or ta or tb:
            raise self.Unsupported(f"{ins.text}: negated or transposed (MN-major) operands")

        def uniform(tok):
            v = self._val(tok, "u64", threads)
            if (v != v[0]).any():
                raise self.Error(f"{ins.text}: descriptor {tok} differs between threads of the warpgroup")
            return int(v[0])

        a = ([self._reg(r, threads).copy() for r in self._vec(a_tok)] if a_in_regs else uniform(a_tok))
        sd = bool(self._val(scale_d, "pred", threads)[0]) if scale_d.startswith("%") else bool(int(scale_d, 0))
        for r in d:
            m = self.cta.inflight.setdefault(r, np.zeros(self.cta.n, np.int32))
            m[threads] += 1  # wgmma ops in flight that write r
        a_regs = self._vec(a_tok) if a_in_regs else []
        for r in a_regs:  # the hardware reads register A asynchronously: no writes to them until the wait
            m = self.cta.inflight_a.setdefault(r, np.zeros(self.cta.n, np.int32))
            m[threads] += 1
        return dict(n=n, d=d, a=a, a_regs=a_regs, b=uniform(b_tok), scale_d=sd, threads=threads, text=ins.text)

    def _wgmma_run(self, job):
        n, threads = job["n"], job["threads"]
        smem = self.cta.smem

        def operand(desc, rows, what):
            try:
                where = smem_operand_offsets(desc, rows, 32)
            except NotImplementedError as e:
                raise self.Unsupported(f"{job['text']}: {e}") from None
            if (where < 0).any() or (where >= smem.size).any():
                raise self.Error(f"{job['text']}: {what} operand reaches outside shared memory")
            if not self.cta.written[where].all():
                raise self.Error(f"{job['text']}: {what} operand reads shared bytes nothing wrote")
            return smem[where].view(np.float16).astype(np.float64)  # [rows, 16]

        if isinstance(job["a"], list):  # register A: per warp the m16n8k16 A fragment of its 16 rows
            la = layouts.mma_a_layout("m16n8k16")  # [lane, 8 halves] → (row, col)
            regs = np.stack(job["a"], axis=1).astype(np.uint32)  # [thread, 4]
            halves = regs.view(np.uint16).reshape(128, 8).view(np.float16).astype(np.float64)
            A = np.zeros((64, 16))
            for w in range(4):
                A[16 * w + la[..., 0], la[..., 1]] = halves[32 * w:32 * w + 32]
        else:
            A = operand(job["a"], 64, "A")
        B = operand(job["b"], n, "B")  # [N, K]
        lay = wgmma_d_layout(n)
        D = np.zeros((64, n))
        if job["scale_d"]:
            for i, r in enumerate(job["d"]):
                D[lay[:, i, 0], lay[:, i, 1]] = self.cta.regs[r][threads].astype(np.uint32).view(np.float32)
        out = mma_f32(A, B.T, D)  # the tensor cores' alignment and truncation (tensorcore.py)
        for r in job["a_regs"]:
            self.cta.inflight_a[r][threads] -= 1
        for i, r in enumerate(job["d"]):
            self.cta.inflight[r][threads] -= 1
            if r not in self.cta.regs:
                self.cta.regs[r] = np.zeros(self.cta.n, np.uint64)
            self.cta.regs[r][threads] = out[lay[:, i, 0], lay[:, i, 1]].view(np.uint32).astype(np.uint64)
