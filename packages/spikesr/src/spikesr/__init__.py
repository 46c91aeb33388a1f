"""SpikeSR: spiking super-resolution of remote-sensing images with spiking attention blocks.

The LR image is repeated over T time steps and runs through multi-step spiking layers (LIF
neurons, threshold-dependent batch norm); each spiking attention block gates its membrane
potentials with a hybrid-dimension attention over time and channels and a deformable similarity
attention that matches every patch to its most similar other patch. The spikes are averaged over
time, refined and upsampled by pixel shuffle.

``SpikeSR`` is the network (``pretrained(scale)`` loads the small one shipped with the package),
``upscale`` runs it on an image of any size, ``evaluate`` scores upscalers (``model_upscaler``,
``bicubic_upscaler``) by PSNR / SSIM in the author's and BasicSR's conventions on LR/HR ``Pair``s
from ``make_pairs``, ``train`` fits a network on a ``PatchSampler``'s patches of such pairs,
``measure_energy`` counts synaptic operations from measured firing rates, and ``degrade`` makes LR
images with MATLAB's bicubic; ``read_image`` / ``folder_images`` / ``write_image`` read and write
image files.
"""

from __future__ import annotations

from importlib import metadata as _metadata

from spikesr.baselines import EDSR, bicubic_upscale, edsr_width_for
from spikesr.checkpoint import load, pretrained, save
from spikesr.data import Pair, PatchSampler, folder_images, make_pairs, read_image, write_image
from spikesr.dcn import DeformableConv2d, deform_conv2d
from spikesr.energy import E_AC_PJ, E_MAC_PJ, EnergyMeter, measure_energy
from spikesr.evaluate import Scores, bicubic_upscaler, evaluate, model_upscaler, upscale
from spikesr.metrics import AUTHOR, BASICSR, Convention, psnr, ssim
from spikesr.model import SpikeSR, SpikeSRConfig, match_patches, parameter_count
from spikesr.neuron import LIF, TDBatchNorm, make_neuron, spike
from spikesr.resize import degrade, imresize, modcrop
from spikesr.train import TrainConfig, TrainLog, train

__version__ = _metadata.version("spikesr")

__all__ = [
    "AUTHOR",
    "BASICSR",
    "EDSR",
    "E_AC_PJ",
    "E_MAC_PJ",
    "LIF",
    "Convention",
    "DeformableConv2d",
    "EnergyMeter",
    "Pair",
    "PatchSampler",
    "Scores",
    "SpikeSR",
    "SpikeSRConfig",
    "TDBatchNorm",
    "TrainConfig",
    "TrainLog",
    "__version__",
    "bicubic_upscale",
    "bicubic_upscaler",
    "deform_conv2d",
    "degrade",
    "edsr_width_for",
    "evaluate",
    "folder_images",
    "imresize",
    "load",
    "make_neuron",
    "make_pairs",
    "match_patches",
    "measure_energy",
    "modcrop",
    "model_upscaler",
    "parameter_count",
    "pretrained",
    "psnr",
    "read_image",
    "save",
    "spike",
    "ssim",
    "train",
    "upscale",
    "write_image",
]  # fmt: skip
