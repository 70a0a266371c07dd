"""The host device (a wing of `gpuscalar.devices`): NumPy arrays, always there.

Why this subpackage exists: every device is one folder that owns its code, the smallest one
included. `backend` is its root (`NumpyBackend` and its one instance); its executors compute on
NumPy data in one counted device op and serve the strict device too (one home for both):
`blas` (``"blas"``: gs.matmul, gs.dot, gs.vdot) and `sparse` (``"sparse"``: gs.spmv,
gs.as_csr, which the strict device's extends for its own CSR matrices).
"""
