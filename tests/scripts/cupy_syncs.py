"""Sample script for the profiler tests: syncs declared by CuPy itself, as ndarray.get() does.

Runs without a GPU: it calls CuPy's sync declaration directly instead of copying an array.
"""

import numpy as np
from cupy._core import syncdetect

import gpuscalar as gs

for _ in range(2):
    syncdetect._declare_synchronize()  # what every CuPy device->host copy declares
print(float(gs.mean(np.ones(3))))
