"""DiLoCo on torch.distributed: trainer, launcher, checkpoints, and the paper's scaling laws."""

from scaling_laws.diloco.config import ALGORITHMS, DiLoCoConfig
from scaling_laws.diloco.launch import WorkerFailed, init_from_env, launch_local
from scaling_laws.diloco.laws import (
    PAPER_JOINT_LAWS,
    PAPER_LOSS_LAWS,
    fit_joint_law,
    fit_model_size_law,
)
from scaling_laws.diloco.trainer import (
    DiLoCoTrainer,
    latest_checkpoint,
    resumable_checkpoint,
    verify_checkpoint,
)

__all__ = [
    "ALGORITHMS",
    "PAPER_JOINT_LAWS",
    "PAPER_LOSS_LAWS",
    "DiLoCoConfig",
    "DiLoCoTrainer",
    "WorkerFailed",
    "fit_joint_law",
    "fit_model_size_law",
    "init_from_env",
    "latest_checkpoint",
    "launch_local",
    "resumable_checkpoint",
    "verify_checkpoint",
]
