"""Host memory the engine gives back: glibc keeps freed model-loading buffers unless told to return them."""

from __future__ import annotations

M_MMAP_THRESHOLD = -3  # glibc mallopt parameter


def _libc():
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:  # pragma: no cover - not glibc
        return None


def host_memory_returns_to_the_os() -> None:
    """Large host tensors (cache slots and drafts on a CPU device, quantization temporaries) are mapped one by one
    (glibc's ``M_MMAP_THRESHOLD`` fixed at 1 MiB instead of growing with every freed block), so freeing them gives
    the memory back at once rather than leaving the heap fragmented across cells. A no-op without glibc."""
    libc = _libc()
    if libc is not None and hasattr(libc, "mallopt"):
        libc.mallopt(M_MMAP_THRESHOLD, 1 << 20)


def trim_host_memory() -> None:
    """Return free heap pages to the OS (glibc ``malloc_trim``), e.g. when a cell ends."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
