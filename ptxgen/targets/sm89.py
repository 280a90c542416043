"""sm_89 (Ada) and sm_80 (Ampere): mma.sync tensor cores, cp.async copies with commit/wait groups,
ldmatrix to feed fragments. No TMA, no mbarrier transaction counts, no wgmma."""
from ..arch import ARCHES
from . import Lowering

LOWERING = Lowering(ARCHES["sm_89"], copy="cp.async", mma="mma.sync",
                    notes="cp.async.cg 16-byte copies, 3-stage ring, ldmatrix + mma.sync")
LOWERING_SM80 = Lowering(ARCHES["sm_80"], copy="cp.async", mma="mma.sync", notes="as sm_89")
