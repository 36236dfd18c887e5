"""Small helpers with no basebn dependencies (the bottom of the package graph)."""
from .fs import atomic_write_bytes, remove_stale_tmp, sha256_of

__all__ = ["atomic_write_bytes", "remove_stale_tmp", "sha256_of"]
