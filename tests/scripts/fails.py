"""Sample script for the profiler tests: one sync, then an exception."""

import numpy as np

import gpuscalar as gs

total = gs.sum(np.arange(4.0))
print(f"total {total}")  # an f-string (format) read: one sync
raise ValueError("the sample script fails on purpose")
