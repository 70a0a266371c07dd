"""Sample script for the profiler tests: one sync, then more output than a pipe holds."""

import numpy as np

import gpuscalar as gs

print(f"total {gs.sum(np.ones(3))}")  # one sync
for i in range(200_000):
    print(i)
