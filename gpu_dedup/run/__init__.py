"""Executors: where a run's data lives and how it moves (one process, a Dask cluster).

They run the one stage sequence; no dedup logic lives here beyond placing data.
"""
