"""The Hopper family: TMA loads, WGMMA, warp specialisation (sm_90a)."""
