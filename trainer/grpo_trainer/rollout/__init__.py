"""Rollout engines behind one interface: transformers ``generate`` (CPU, tests) and vLLM (GPUs).

Deliberately empty: ``config.py`` imports ``engine_limits`` from here, and re-exporting
``base`` would pull the samples and data modules (which import ``config``) into it.
"""
