"""Sizes of the ``reproduce`` runs (quick: a few minutes on 2 CPU cores)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from scaling_laws.models import GPTConfig


@dataclass(frozen=True)
class Settings:
    """All sizes; batch sizes are sequences of ``seq_len`` bytes."""

    # LR-annealing: four schedules of the same tiny GPT
    annealing_steps: int
    # 3e-3: at 1e-2 this model's constant-lr curve leaves the law's form (fit error > 2%)
    annealing_lr: float = 3e-3
    annealing_warmup: int = 20
    annealing_batch: int = 16
    eval_every: int = 10
    width: int = 64
    depth: int = 2
    seq_len: int = 64
    # Power Lines: widths x run lengths x timescales
    sweep_widths: tuple[int, ...] = (16, 32)
    sweep_steps: tuple[int, ...] = (100, 200, 400)
    sweep_taus: tuple[float, ...] = (1.0, 3.0, 10.0, 30.0, 100.0)
    sweep_batch: int = 8
    sweep_lr: float = 1e-2
    # DiLoCo: replicas vs data-parallel at equal tokens
    diloco_steps: int = 300
    diloco_inner_steps: int = 10
    diloco_batch: int = 16
    diloco_lr: float = 1e-2
    # the paper tunes the outer lr in 0.2-1.0; 0.4 (lowest of 0.4/0.7/1.0) was best at every M
    # and 1.0 worst by >0.15 nats: the grid reaches below the paper's range to bracket the optimum
    diloco_outer_lrs: tuple[float, ...] = (0.1, 0.2, 0.4, 0.7)
    replicas: tuple[int, ...] = (1, 2, 4)
    data_parallel_workers: int = 2
    seed: int = 0

    def gpt(self, width: int | None = None) -> GPTConfig:
        return GPTConfig(seq_len=self.seq_len, width=width or self.width, depth=self.depth)

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


QUICK = Settings(annealing_steps=600)
FULL = Settings(
    annealing_steps=2000,
    sweep_widths=(16, 32, 64),
    sweep_steps=(100, 200, 400, 800, 1600),
    sweep_taus=(0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0),
    diloco_steps=1000,
    diloco_inner_steps=20,
    replicas=(1, 2, 4, 8),
)
