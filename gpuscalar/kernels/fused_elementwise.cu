// gpuscalar fused elementwise kernels: shared device helpers.
//
// Why this file exists: gpuscalar.optim describes each optimizer update once, as per-element
// expression strings (see gpuscalar/optim.py, `Program`). The same strings are evaluated with
// NumPy on the CPU and pasted, below this header, into one CUDA kernel per (program, dtype,
// scalar-argument kinds), so the CPU and GPU math cannot drift. The expressions may only use
// + - * / ( ), comparisons, and the helpers defined here, which have NumPy twins in optim.py:
//   sqrt(x)           numpy.sqrt     (CUDA's float/double overloads)
//   pow(a, b)         numpy.power    (CUDA's float/double overloads)
//   select(c, a, b)   numpy.where
//   minimum(a, b)     numpy.minimum  (NaN-propagating, like NumPy)
//
// Hyperparameters arrive either as plain values (Python numbers) or as pointers to 0-d device
// arrays (GPUScalars), which the kernel dereferences itself: no host ever reads them.

template <typename T>
__device__ __forceinline__ T select(bool c, T a, T b) { return c ? a : b; }

template <typename T>
__device__ __forceinline__ T minimum(T a, T b) { return (a != a || a < b) ? a : b; }
