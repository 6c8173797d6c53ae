"""Effects: side effects outside the file, run exactly once in effect.

One package per concept: :mod:`.registry` (what an effect is, how its
function answers), :mod:`.executor` (the sync driver), :mod:`.step` (one
step of a pass: every decision's I/O, written once for both faces),
:mod:`.inflight` (calls off the executor's thread) and :mod:`.feedback`
(results advanced into a producer); its totals, ``ExecutorStats``, are a
record (:mod:`reliable_flow.records`).  The decisions are in
:mod:`reliable_flow._core.effects`.  Only the registry is imported here (the
consumer needs it; the executor needs the consumer).
"""

# The registry is this package's face: its names, and only those, are the package's.
from .registry import *
from .registry import __all__ as __all__
