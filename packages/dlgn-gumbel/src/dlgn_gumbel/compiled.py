"""Exact Boolean inference of a trained logic gate network, 64 samples per machine word.

:func:`compile_logic_net` turns a :class:`~dlgn_gumbel.LogicNet` into a
:class:`CompiledLogicNet`: the argmax gate of every neuron, with neurons that cannot reach an
output removed. Inputs are bit-packed sample-wise (bit ``j`` of word ``w`` of input ``i`` is
sample ``64·w + j``), every gate becomes one bitwise operation per word, and each class's group
count is a per-sample popcount. Two engines compute the same thing:

* ``"c"``: a small C evaluator compiled once with the system compiler (it packs the Boolean
  rows itself, runs blocks of 256 samples through all layers in cache, and counts with
  bit-sliced adders); the faster one, chosen by default when a compiler exists;
* ``"numpy"``: vectorized numpy over whole layers, no compiler needed.

Scores equal the torch eval-mode network's bit for bit: both divide the same integer counts by
``tau`` with the same float32 operation.
"""

from __future__ import annotations

import ctypes
import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from safetensors.numpy import save_file

from dlgn_gumbel.discrete import DiscreteLayer, alive_masks, discretize
from dlgn_gumbel.gates import GATE_TRUTH_TABLES
from dlgn_gumbel.layers import group_scores
from kernels_common import cli

__all__ = ["CompiledLogicNet", "compile_logic_net"]

logger = logging.getLogger(__name__)

Engine = Literal["auto", "c", "numpy"]
_ENGINES = ("auto", "c", "numpy")
_FORMAT = "dlgn-gumbel-compiled/1"
_ALL = np.uint64(0xFFFFFFFFFFFFFFFF)
# _MINTERMS[g] = (f00, f01, f10, f11) of gate g as all-zero / all-one words
_MINTERMS = np.array(GATE_TRUTH_TABLES, dtype=np.uint64) * _ALL


def _prune(layers: list[DiscreteLayer], in_dim: int) -> list[DiscreteLayer]:
    """Drop neurons with no path to an output and renumber the survivors' inputs."""
    masks = alive_masks(layers, in_dim)
    for mask in masks[1:]:
        if not mask.any():  # keep one neuron so the next layer has something to index
            mask[0] = True
    pruned = []
    for level, layer in enumerate(layers):
        keep_in = masks[level] if level else np.ones(in_dim, dtype=bool)
        renumber = np.cumsum(keep_in) - 1
        keep = masks[level + 1]
        # a kept neuron's gate may ignore an input that was pruned; point it at input 0 instead
        a = np.where(keep_in[layer.idx_a], renumber[layer.idx_a], 0)[keep]
        b = np.where(keep_in[layer.idx_b], renumber[layer.idx_b], 0)[keep]
        pruned.append(DiscreteLayer(a, b, layer.gates[keep]))
    return pruned


def _as_bool_matrix(x: np.ndarray | torch.Tensor, in_dim: int) -> np.ndarray:
    array = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    if array.ndim != 2 or array.shape[1] != in_dim:
        raise ValueError(f"x_bool must have shape (batch, {in_dim}), got {array.shape}")
    if array.dtype != np.bool_:
        if not np.isin(array, (0, 1)).all():
            raise ValueError(
                "x_bool must be binary (bool, or numbers that are all 0 or 1); got other values "
                "(threshold the inputs first, e.g. with ThermometerEncoder)"
            )
        array = array.astype(np.bool_)
    return array


def _pack(x: np.ndarray) -> np.ndarray:
    """``(B, in_dim)`` bool -> ``(in_dim, ceil(B / 64))`` uint64, sample ``s`` at bit ``s % 64``."""
    packed = np.packbits(x.T, axis=1, bitorder="little")
    pad = (-packed.shape[1]) % 8
    if pad:
        packed = np.pad(packed, ((0, 0), (0, pad)))
    return np.ascontiguousarray(packed).view("<u8").astype(np.uint64, copy=False)


@dataclass(frozen=True)
class CompiledLogicNet:
    """A discretized logic gate network evaluated bit-parallel (see the module docstring).

    Attributes:
        in_dim: number of Boolean inputs.
        layers: the pruned discretized layers.
        num_classes: number of class groups; ``tau``: the GroupSum temperature.
        engine: ``"c"`` or ``"numpy"``.
    """

    in_dim: int
    layers: tuple[DiscreteLayer, ...]
    num_classes: int
    tau: float
    engine: Literal["c", "numpy"] = "numpy"

    def __post_init__(self) -> None:
        # The C engine indexes raw buffers with these tables, so a network read from a file (or
        # built by hand) is checked in full before it can run: dtypes, index ranges, gate ids.
        if not isinstance(self.in_dim, int) or self.in_dim < 1:
            raise ValueError(f"in_dim must be a positive int, got {self.in_dim!r}")
        if not isinstance(self.num_classes, int) or self.num_classes < 1:
            raise ValueError(f"num_classes must be a positive int, got {self.num_classes!r}")
        if not self.tau > 0:
            raise ValueError(f"tau must be > 0, got {self.tau}")
        if self.engine not in ("c", "numpy"):
            raise ValueError(f"engine must be 'c' or 'numpy', got {self.engine!r}")
        if not self.layers:
            raise ValueError("a compiled network needs at least one layer")
        checked, width = [], self.in_dim
        for i, layer in enumerate(self.layers):
            idx_a, idx_b = np.asarray(layer.idx_a), np.asarray(layer.idx_b)
            gates = np.asarray(layer.gates)
            n = gates.shape[0] if gates.ndim == 1 else -1
            if n < 1 or idx_a.shape != (n,) or idx_b.shape != (n,):
                raise ValueError(
                    f"layer {i}: idx_a, idx_b and gates must be 1-D of one non-zero length, got "
                    f"{idx_a.shape}, {idx_b.shape}, {gates.shape}"
                )
            for name, values, bound in (("idx_a", idx_a, width), ("idx_b", idx_b, width)):
                if values.dtype.kind not in "iu" or values.min() < 0 or values.max() >= bound:
                    raise ValueError(
                        f"layer {i}: {name} must be integers in [0, {bound}) (the width of "
                        f"the layer before)"
                    )
            if gates.dtype.kind not in "iu" or gates.min() < 0 or gates.max() > 15:
                raise ValueError(f"layer {i}: gates must be integers in 0..15")
            checked.append(
                DiscreteLayer(
                    np.ascontiguousarray(idx_a, dtype=np.int64),
                    np.ascontiguousarray(idx_b, dtype=np.int64),
                    np.ascontiguousarray(gates, dtype=np.uint8),
                )
            )
            width = n
        if width % self.num_classes:
            raise ValueError(
                f"the last layer's width {width} must be divisible by num_classes="
                f"{self.num_classes}"
            )
        object.__setattr__(self, "layers", tuple(checked))

    def counts(self, x_bool: np.ndarray | torch.Tensor) -> np.ndarray:
        """``(B, num_classes)`` int64: how many output neurons of each class group are 1.

        Args:
            x_bool: ``(B, in_dim)`` bool, or 0/1 numbers (numpy or torch).
        """
        x = _as_bool_matrix(x_bool, self.in_dim)
        batch = x.shape[0]
        if batch == 0:
            return np.zeros((0, self.num_classes), dtype=np.int64)
        if self.engine == "c":
            return self._counts_c(np.ascontiguousarray(x), batch)
        return self._counts_numpy(_pack(x), batch)

    def scores(self, x_bool: np.ndarray | torch.Tensor) -> torch.Tensor:
        """``(B, num_classes)`` float32 class scores, equal to the eval-mode network's."""
        counts = torch.from_numpy(self.counts(x_bool).astype(np.float32))
        return group_scores(counts, self.tau)

    def predict(self, x_bool: np.ndarray | torch.Tensor) -> torch.Tensor:
        """``(B,)`` int64 predicted classes (first maximum on ties, like ``torch.argmax``)."""
        return self.scores(x_bool).argmax(1)

    @property
    def num_gates(self) -> int:
        return sum(layer.width for layer in self.layers)

    def _counts_numpy(self, state: np.ndarray, batch: int) -> np.ndarray:
        for layer in self.layers:
            a, b = state[layer.idx_a], state[layer.idx_b]
            m = _MINTERMS[layer.gates]
            not_b = ~b
            state = (a & ((b & m[:, 3:4]) | (not_b & m[:, 2:3]))) | (
                ~a & ((b & m[:, 1:2]) | (not_b & m[:, 0:1]))
            )
        bits = np.unpackbits(state.view(np.uint8), axis=1, bitorder="little")[:, :batch]
        groups = bits.reshape(self.num_classes, -1, batch)
        return groups.sum(axis=1, dtype=np.int64).T.copy()

    def _counts_c(self, x: np.ndarray, batch: int) -> np.ndarray:
        from dlgn_gumbel.cbuild import load_evaluator

        lib = load_evaluator()
        widths = np.array([self.in_dim, *(layer.width for layer in self.layers)], dtype=np.int64)
        idx_a = np.ascontiguousarray(np.concatenate([layer.idx_a for layer in self.layers]))
        idx_b = np.ascontiguousarray(np.concatenate([layer.idx_b for layer in self.layers]))
        gates = np.ascontiguousarray(np.concatenate([layer.gates for layer in self.layers]))
        words = -(-batch // 64)
        block = lib.dlgn_block_words()
        buf_a = np.empty(int(widths.max()) * block, dtype=np.uint64)
        buf_b = np.empty_like(buf_a)
        counts = np.zeros((batch, self.num_classes), dtype=np.int64)

        def ptr(array: np.ndarray) -> ctypes.c_void_p:
            return array.ctypes.data_as(ctypes.c_void_p)

        lib.dlgn_eval(
            ptr(x),
            ctypes.c_int64(self.in_dim),
            ctypes.c_int64(words),
            ctypes.c_int64(len(self.layers)),
            ptr(widths),
            ptr(idx_a),
            ptr(idx_b),
            ptr(gates),
            ctypes.c_int64(self.num_classes),
            ctypes.c_int64(batch),
            ptr(counts),
            ptr(buf_a),
            ptr(buf_b),
        )
        return counts

    def with_engine(self, engine: Engine) -> CompiledLogicNet:
        """The same network evaluated by another engine."""
        return CompiledLogicNet(
            self.in_dim, self.layers, self.num_classes, self.tau, _resolve_engine(engine)
        )

    def save(self, directory: str | Path) -> Path:
        """Write ``compiled.safetensors`` (connections, gates) and ``config.json``."""
        directory = Path(directory)
        tensors = {}
        for i, layer in enumerate(self.layers):
            tensors[f"layers.{i}.idx_a"] = np.ascontiguousarray(layer.idx_a, dtype=np.int64)
            tensors[f"layers.{i}.idx_b"] = np.ascontiguousarray(layer.idx_b, dtype=np.int64)
            tensors[f"layers.{i}.gates"] = np.ascontiguousarray(layer.gates, dtype=np.uint8)
        config = {
            "format": _FORMAT,
            "in_dim": self.in_dim,
            "num_layers": len(self.layers),
            "num_classes": self.num_classes,
            "tau": self.tau,
        }
        # written into a temporary folder, then renamed into ``directory`` (created only then):
        # a failed save leaves neither half a file nor an empty folder
        try:
            with cli.atomic_folder(directory) as staging:
                save_file(tensors, str(staging / "compiled.safetensors"))
                (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        except OSError as error:  # name the output folder, not the temporary one
            raise OSError(
                error.errno,
                f"cannot save the compiled network ({error.strerror or error})",
                str(directory),
            ) from error
        return directory

    @classmethod
    def load(cls, directory: str | Path, *, engine: Engine = "auto") -> CompiledLogicNet:
        """Load a network written by :meth:`save`."""
        directory = Path(directory)
        config_path, weights_path = directory / "config.json", directory / "compiled.safetensors"
        for path in (config_path, weights_path):
            if not path.is_file():
                raise FileNotFoundError(f"{path} not found (expected a CompiledLogicNet.save dir)")
        config = cli.read_json(config_path, "compiled network config")
        if not isinstance(config, dict):
            raise ValueError(f"{config_path} is not a compiled network config (not a JSON object)")
        if config.get("format") != _FORMAT:
            raise ValueError(f"{config_path}: format {config.get('format')!r}, expected {_FORMAT}")
        tensors = cli.read_safetensors(weights_path, "compiled network", framework="numpy")
        try:
            layers = tuple(
                DiscreteLayer(
                    tensors[f"layers.{i}.idx_a"],
                    tensors[f"layers.{i}.idx_b"],
                    tensors[f"layers.{i}.gates"],
                )
                for i in range(config["num_layers"])
            )
            fields = (config["in_dim"], layers, config["num_classes"], config["tau"])
        except (KeyError, TypeError) as error:
            raise ValueError(f"{directory}: incomplete compiled network, missing {error}") from None
        return cls(*fields, _resolve_engine(engine))  # __post_init__ validates every table


def _resolve_engine(engine: str) -> Literal["c", "numpy"]:
    if engine not in _ENGINES:
        raise ValueError(f"engine must be one of {_ENGINES}, got {engine!r}")
    if engine == "c" and sys.byteorder != "little":
        raise ValueError("engine='c' packs inputs with little-endian loads; use engine='numpy'")
    if engine == "auto":
        from dlgn_gumbel.cbuild import CompilerUnavailableError, find_compiler, load_evaluator

        if find_compiler() is None or sys.byteorder != "little":
            return "numpy"
        try:  # a compiler that exists but cannot build the evaluator: fall back as well
            load_evaluator()
        except CompilerUnavailableError as error:
            logger.warning("C engine unavailable, using numpy: %s", error)
            return "numpy"
        return "c"
    return engine  # type: ignore[return-value]


def compile_logic_net(net, *, engine: Engine = "auto", prune: bool = True) -> CompiledLogicNet:
    """Compile a :class:`~dlgn_gumbel.LogicNet` to an exact bit-parallel Boolean program.

    Args:
        net: the trained network (its argmax gates are used, whatever its mode).
        engine: ``"auto"`` (C when a compiler exists, else numpy), ``"c"`` or ``"numpy"``.
        prune: drop neurons with no path to an output (does not change any output).

    Returns:
        A :class:`CompiledLogicNet` whose ``scores`` equal ``net.eval()(x)`` exactly on
        Boolean inputs.
    """
    from dlgn_gumbel.layers import LogicNet

    if not isinstance(net, LogicNet):
        raise TypeError(f"compile_logic_net expects a LogicNet, got {type(net).__name__}")
    layers = discretize(net)
    if prune:
        layers = _prune(layers, net.config.in_dim)
    return CompiledLogicNet(
        net.config.in_dim,
        tuple(layers),
        net.config.num_classes,
        net.config.tau,
        _resolve_engine(engine),
    )
