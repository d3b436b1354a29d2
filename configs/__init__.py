"""Configuration presets shipped with gpu_dedup (installed as gpu_dedup.configs)."""
