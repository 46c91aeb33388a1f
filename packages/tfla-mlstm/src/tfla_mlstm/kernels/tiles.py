"""Tile sizes of the TFLA kernels, shared by the forward and backward launches."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch

from kernels_common.triton_utils import next_power_of_2

# on-chip tile edge: float32 tiles, and 16-bit step blocks at level 2 and the 16-bit state
# kernels' head tiles; 16-bit level-2 head tiles and state step blocks go to twice this. Chunks of
# 128-1024 steps loop over blocks of these sizes.
MAX_TILE = 64

# the three groups of TFLA kernels with a layout of their own (see ``Tiles.choose``)
Kernel = Literal["states", "output", "gradients"]
KERNELS = get_args(Kernel)


@dataclass(frozen=True)
class Tiles:
    """``seq``: query / key block inside a chunk (level 2), or the step block of the chunk-state
    kernels (level 1); ``qk`` / ``v``: head-dimension blocks; ``precision``: ``tl.dot`` input
    precision (full float32 for float32 inputs, so the kernels match the float32 reference);
    ``warps``, ``stages``: Triton launch options."""

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
        cls, chunk_size: int, dqk: int, dv: int, dtype: torch.dtype, *, kernel: Kernel = "output"
    ) -> Tiles:
        """The layout of one group of kernels. float32: 64-wide tiles everywhere (full-precision
        dots need twice the shared memory; no other layout was measured).

        bf16/fp16:

        * ``"output"`` (the forward's level 2) and ``"gradients"`` (the backward's level 2):
          head-dimension tiles up to 128, so the dq/dk/dv kernels recompute the intra-chunk
          scores for fewer head-dimension blocks, 4 warps, 2 stages; 64-step blocks forward and
          32-step blocks backward. A sweep on an H200 (bf16, DQK 128, DV 256, chunk 128, S 8192;
          see the README) timed, against the 64-wide layout, the forward with 64-step blocks at
          0.73x and forward + backward with 32-step blocks in both passes at 0.87x.
        * ``"states"`` (level 1: the chunk states, their recompute in the backward pass and their
          gradients): the anchor's layout for these kernels, 64-wide head tiles over whole chunks
          of up to 128 steps, one stage, 4 warps (2 when the DQK tile is narrower than 64).
          These kernels loop over all chunks of one head, so their programs are the (DQK, DV)
          tiles of the batch-heads: 8 per head at DQK 128, DV 256, where 128-wide tiles gave 2
          (64 programs for 32 batch-heads on an H200's 132 SMs). Both passes use the same
          layout, so the backward pass recomputes exactly the states the forward pass used.
        """

        def head(d: int, cap: int) -> int:
            return min(max(16, next_power_of_2(d)), cap)

        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
        if dtype == torch.float32:
            return cls(min(chunk_size, MAX_TILE), head(dqk, MAX_TILE), head(dv, MAX_TILE), "ieee")
        if kernel == "states":
            qk = head(dqk, MAX_TILE)
            return cls(min(chunk_size, 2 * MAX_TILE), qk, head(dv, MAX_TILE), "tf32",
                       4 if qk == MAX_TILE else 2, 1)  # fmt: skip
        seq = min(chunk_size, 32 if kernel == "gradients" else MAX_TILE)
        return cls(seq, head(dqk, 2 * MAX_TILE), head(dv, 2 * MAX_TILE), "tf32", 4, 2)
