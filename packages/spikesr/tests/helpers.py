"""Shared test settings: a tiny SpikeSR that runs in well under a second."""

from __future__ import annotations

from spikesr.model import SpikeSRConfig

TINY = SpikeSRConfig(scale=2, width=16, groups=1, blocks=1, time_steps=2, qk_dim=8, mlp_dim=16)
