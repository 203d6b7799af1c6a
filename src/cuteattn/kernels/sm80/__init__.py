"""Ampere-class family: warp-level mma.sync + cp.async (sm_80..sm_90, sm_120)."""
