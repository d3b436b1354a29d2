"""Evaluation against exact similarity, layout tuning, planted and real corpora."""
