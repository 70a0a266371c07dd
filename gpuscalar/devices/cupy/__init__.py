"""The CuPy device (a wing of `gpuscalar.devices`): everything gpuscalar does on a CUDA GPU.

Why this subpackage exists: a device owns its code. `backend` is the root (`CupyBackend`, and
`CudaSeam`, the one seam through which CuPy code reaches CUDA); beside it the pieces that exist
only for a CUDA GPU, most of them a feature's executor (`Backend.executors`): `graphs`
(``"graphs"``: `gs.capture`'s steps as CUDA graphs on a private stream and pool), `control` and
`conditional` (``"loops"``: CUDA conditional nodes for `gs.while_loop`/`gs.cond`), `linalg`
(``"blas"``: cuBLAS products usable inside a capture, and gs.dot/gs.vdot) over `cublas` (the
ctypes binding to the libcublas CuPy uses, and its handle pool), `products` (``"sparse"``, and
the dot and CSR kernels recordable in a graph), `fusion` (``"scalars"``: pending expressions
as generated ElementwiseKernels, their bounded caches, the fold's fast path), `steps`
(``"steps"``: the optimizers' generated kernels in one bounded cache), `metrics`
(``"metrics"``: `gs.MetricLog`'s record kernel and asynchronous copies) and `collectives`
(``"collectives"``: NCCL on the current stream) over `mpi` (MPI over device memory).
Importing this package imports none of them (nor CuPy): the registry (`gpuscalar.devices`)
imports `backend` only.
"""
