"""Sample script for the profiler tests: four syncs on the strict device, one of them gpuscalar's.

The other three are the device's own reads, declared as CuPy declares its own: they are counted
by `gpuscalar profile` on any machine, with or without CuPy or a GPU.
"""

import gpuscalar as gs
from gpuscalar.strict import xp

x = xp.arange(4.0)
print(f"total {gs.sum(x)}")  # gpuscalar's read (format): one sync
first = x.get()[0]  # the device's own explicit read: one sync
mean = float(xp.mean(x))  # float() of a 0-d device array: one sync
positive = bool((x > 0).any())  # bool() of a 0-d device array: one sync
print(first, mean, positive)
