"""The CuPy device (a wing of `gpuscalar.devices`): everything gpuscalar does on a CUDA GPU.

Why this subpackage exists: a device owns its code. `backend` is the root (`CupyBackend`, and
`CudaSeam`, the one seam through which CuPy code reaches CUDA); beside it the pieces that exist
only for a CUDA GPU: `graphs` (`gs.capture`: CUDA graphs of sync-free steps, re-run under the
sync guard on the CPU), `control` and `conditional` (CUDA conditional nodes for
`gs.while_loop`/`gs.cond`), `cublas` (the ctypes binding to the libcublas CuPy uses, and its
handle pool), `linalg` (`gs.matmul`: cuBLAS products usable inside a capture; `np.matmul` on
the CPU), `products` (dot and CSR kernels recordable in a graph) and `metrics` (`gs.MetricLog`'s
record kernel and asynchronous copies). Importing this package imports none of them (nor CuPy):
the registry (`gpuscalar.devices`) imports `backend` only.
"""
