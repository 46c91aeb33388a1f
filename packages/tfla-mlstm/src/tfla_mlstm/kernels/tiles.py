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
    (full float32 for float32 inputs, so the kernels match the float32 reference); ``warps``,
    ``stages``: Triton launch options."""

    seq: int
    qk: int
    v: int
    precision: str
    warps: int = 4
    stages: int = 3

    @property
    def launch(self) -> dict[str, int]:
        """Triton launch options of every TFLA kernel."""
        return {"num_warps": self.warps, "num_stages": self.stages}

    @classmethod
    def choose(
        cls, chunk_size: int, dqk: int, dv: int, dtype: torch.dtype, *, backward: bool = False
    ) -> Tiles:
        """The layout for one pass. float32: 64-wide tiles everywhere (full-precision dots).

        bf16/fp16: head-dimension tiles up to 128, so the dq/dk/dv kernels recompute the
        intra-chunk scores for fewer head-dimension blocks, 4 warps, 2 stages, and 32-step blocks
        in the backward pass. A sweep on an H200 (bf16, DQK 128, DV 256, chunk 128, S 8192; see
        the README) timed, against the 64-wide layout, the forward with 64-step blocks at 0.73x
        and forward + backward with 32-step blocks in both passes at 0.87x.
        """

        def head(d: int, cap: int) -> int:
            return min(max(16, next_power_of_2(d)), cap)

        if dtype == torch.float32:
            return cls(min(chunk_size, MAX_TILE), head(dqk, MAX_TILE), head(dv, MAX_TILE), "ieee")
        seq = min(chunk_size, 32 if backward else MAX_TILE)
        return cls(seq, head(dqk, 2 * MAX_TILE), head(dv, 2 * MAX_TILE), "tf32", 4, 2)
