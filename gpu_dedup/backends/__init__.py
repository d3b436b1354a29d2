"""Backend implementations; import through :func:`gpu_dedup.backend.get_backend`."""
