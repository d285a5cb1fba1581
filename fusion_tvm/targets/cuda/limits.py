"""CUDA facts the backend and its kernels share."""

#: Static shared memory a kernel may declare without the dynamic opt-in (CUDA's 48 KiB).
STATIC_SMEM_BYTES = 48 * 1024
