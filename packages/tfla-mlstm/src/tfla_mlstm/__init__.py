"""Tiled Flash Linear Attention (TFLA) for the mLSTM and the mLSTMsig, with xLSTM blocks.

Ops follow ``mlstm-kernels``' calling convention; :func:`mlstm_chunkwise` and
:func:`mlstmsig_chunkwise` run TFLA's Triton kernels on CUDA and a PyTorch chunkwise path on the
CPU. Importing this package neither imports Triton nor touches CUDA.
"""

from importlib import metadata as _metadata

from tfla_mlstm.layers import mLSTMLayer, xLSTMBlock
from tfla_mlstm.model import xLSTMConfig, xLSTMLM
from tfla_mlstm.ops import (
    default_chunk_size,
    mlstm_chunkwise,
    mlstm_parallel,
    mlstm_recurrent,
    mlstm_step,
    mlstmsig_chunkwise,
    mlstmsig_parallel,
    mlstmsig_recurrent,
    mlstmsig_step,
)
from tfla_mlstm.states import MLSTMSigState, MLSTMState

try:
    __version__ = _metadata.version("tfla-mlstm")
except _metadata.PackageNotFoundError:  # imported from a source tree (PYTHONPATH), not installed
    __version__ = "0.0.0+source"

__all__ = [
    "MLSTMSigState",
    "MLSTMState",
    "__version__",
    "default_chunk_size",
    "mLSTMLayer",
    "mlstm_chunkwise",
    "mlstm_parallel",
    "mlstm_recurrent",
    "mlstm_step",
    "mlstmsig_chunkwise",
    "mlstmsig_parallel",
    "mlstmsig_recurrent",
    "mlstmsig_step",
    "xLSTMBlock",
    "xLSTMConfig",
    "xLSTMLM",
]
