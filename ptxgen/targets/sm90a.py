"""sm_90a (Hopper): wgmma from warpgroups, TMA (cp.async.bulk.tensor) into a shared-memory ring tracked
by mbarrier transaction counts, setmaxnreg for producer/consumer warp specialization."""
from ..arch import ARCHES
from . import Lowering

LOWERING = Lowering(ARCHES["sm_90a"], copy="tma", mma="wgmma",
                    notes="TMA + mbarrier ring, wgmma m64nNk16, warp-specialized producer")
