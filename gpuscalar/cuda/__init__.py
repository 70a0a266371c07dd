"""The pieces that exist only for a CUDA GPU: graph capture, cuBLAS, and `gs.matmul`.

Why this subpackage exists: CuPy reaches CUDA through one seam (`gpuscalar.backend.CudaSeam`),
but some features are CUDA concepts with no host counterpart to share code with: `graphs`
(`gs.capture`: CUDA graphs of sync-free steps, re-run under the sync guard on the CPU), `cublas`
(the ctypes binding to the libcublas CuPy uses, and its handle pool) and `linalg` (`gs.matmul`:
cuBLAS products usable inside a capture; `np.matmul` on the CPU).
"""
