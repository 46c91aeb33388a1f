"""Tile sizes of the TFLA kernels, shared by the forward and backward launches."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels_common.triton_utils import next_power_of_2

MAX_TILE = 64  # fixed on-chip tile edge: chunks of 128-1024 steps loop over tiles of this size


@dataclass(frozen=True)
class Tiles:
    """``seq``: query / key block inside a chunk (level 2) and the step block of the chunk-state
    kernels; ``qk`` / ``v``: head-dimension blocks; ``precision``: ``tl.dot`` input precision
    (full float32 for float32 inputs, so the kernels match the float32 reference)."""

    seq: int
    qk: int
    v: int
    precision: str

    @classmethod
    def choose(cls, chunk_size: int, dqk: int, dv: int, dtype: torch.dtype) -> Tiles:
        def head(d: int) -> int:
            return min(max(16, next_power_of_2(d)), MAX_TILE)

        precision = "ieee" if dtype == torch.float32 else "tf32"
        return cls(min(chunk_size, MAX_TILE), head(dqk), head(dv), precision)
