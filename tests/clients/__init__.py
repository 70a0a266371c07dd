"""Real clients, as tests (issue 21): code nobody here wrote, run with GPUScalars in place of the
floats it reads, to show that a GPUScalar is a drop-in for the float it replaces (the same
results bit for bit, no more syncs). Each module names its source, version and license."""
