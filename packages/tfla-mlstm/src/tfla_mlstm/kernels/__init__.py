"""TFLA Triton kernels (imported only when a Triton backend runs): ``forward.py`` and
``backward.py`` hold ``@triton.jit`` code and launch wrappers, nothing else."""
