"""The command-line tools: the main job (`demo`), the benchmark runner (`benchmarks`) and the
workloads they run (`workloads`, with the convergence loops in `solvers`).

Why this subpackage exists: these are programs built on the library, not the library; nothing in
`gpuscalar` outside this folder imports them. They live in the package (not the repository's
``bench/``) so that ``gpuscalar demo`` and ``gpuscalar bench`` work after ``pip install``.
"""
