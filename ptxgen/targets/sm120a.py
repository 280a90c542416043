"""sm_120a (consumer Blackwell): mma.sync tensor cores with TMA copies and mbarriers. It has no wgmma:
ptxas rejects it, so a kernel that pins Mma(instr="wgmma") fails here with an error naming mma.sync."""
from ..arch import ARCHES
from . import Lowering

LOWERING = Lowering(ARCHES["sm_120a"], copy="tma", mma="mma.sync",
                    notes="TMA + mbarrier ring feeding ldmatrix + mma.sync; no wgmma")
