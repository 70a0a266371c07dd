// gpuscalar fused elementwise kernels: shared device helpers.
//
// Why this file exists: gpuscalar.optim describes each optimizer update once, as per-element
// rules built from lazy expression nodes (gpuscalar/optim/program.py, gpuscalar/lazy/rules.py).
// The same rules are evaluated with NumPy on the CPU and printed as C, below this header, into
// one CUDA kernel per (program, dtype, scalar kinds, layout: one tensor, or many through address
// tables), so the CPU and GPU math cannot drift. The step-counter kernel includes this header
// too. The rules may only use + - * / ( ), comparisons, and the helpers defined here, which have
// NumPy twins in gpuscalar/lazy/rules.py:
//   sqrt(x)           numpy.sqrt     (CUDA's float/double overloads)
//   pow(a, b)         numpy.power    (CUDA's float/double overloads)
//   select(c, a, b)   numpy.where
//   minimum(a, b)     numpy.minimum  (NaN-propagating, like NumPy)
//
// Hyperparameters arrive as plain values (Python numbers), as pointers to 0-d device arrays
// (GPUScalars), or as a pointer with inlined arithmetic (the optimizer's step counter), which
// the kernel dereferences itself: no host ever reads them.

template <typename T>
__device__ __forceinline__ T select(bool c, T a, T b) { return c ? a : b; }

template <typename T>
__device__ __forceinline__ T minimum(T a, T b) { return (a != a || a < b) ? a : b; }
