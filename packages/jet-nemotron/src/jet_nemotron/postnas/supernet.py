"""The once-for-all super-network of PostNAS, and its training.

Every decoder layer of a pretrained Llama / Qwen2 causal LM holds both its original attention
and a linear-attention block (:class:`SwitchMixer`); a *path* names the layers that use their
attention, every other layer uses its linear block. Only the linear blocks train: embeddings,
norms, MLPs, the LM head and the attentions are the pretrained model's and stay frozen, so the
all-attention path *is* the original model and serves as the distillation teacher (no second
copy of the model is held).

Training (:func:`train_supernet`) has two stages on real text:

1. **Layer-wise**: on the all-attention path, every linear block learns to reproduce its
   layer's attention output from the same input (relative squared error), all layers at once.
2. **Path sampling**: each step samples a path -- a number of attention layers uniformly in
   ``[min_attention, max_attention]``, then which layers, uniformly -- and pulls that sub-network
   towards the all-attention one (KL of the next-token distributions plus the relative squared
   error of every layer's output), so that any placement can later be scored with shared weights.

A path is seeded by ``(seed, step)`` and a batch by ``(seed, epoch)``, so a run stopped at any
step and resumed from its checkpoint continues bit for bit.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import logging
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from jet_nemotron.distill import (
    attention_io,
    distillation_loss,
    log_progress,
    optimizer_step,
    progress_options,
    relative_mse,
)
from jet_nemotron.models.convert import (
    PROJECTIONS,
    SUPPORTED_MODEL_TYPES,
    copy_attention_projections,
    from_pretrained_llama,
)
from jet_nemotron.postnas.blocks import build_linear_block
from kernels_common.cli import atomic_file

logger = logging.getLogger(__name__)

CHECKPOINT_FORMAT = 1


class SwitchMixer(nn.Module):
    """A layer's token mixer in the super-network: its pretrained ``attention`` or its
    ``linear`` block, as ``use_attention`` says. Called as the attention is (same arguments,
    ``(output, None)`` back)."""

    def __init__(self, attention: nn.Module, linear: nn.Module) -> None:
        super().__init__()
        self.attention = attention
        self.linear = linear
        self.use_attention = True

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if self.use_attention:
            return self.attention(hidden_states, *args, **kwargs)
        if kwargs.get("cache") is not None or kwargs.get("past_key_values") is not None:
            raise ValueError(
                "the super-network scores paths without a cache; build the hybrid "
                "(SuperNetwork.to_hybrid) to generate"
            )
        output, _ = self.linear(hidden_states)
        return output, None


def _check_layers(layers: Iterable[int], num_layers: int, what: str) -> tuple[int, ...]:
    chosen = tuple(sorted(set(layers)))
    bad = [i for i in chosen if isinstance(i, bool) or not isinstance(i, int)]
    bad += [i for i in chosen if isinstance(i, int) and not 0 <= i < num_layers]
    if bad:
        raise ValueError(f"{what} {bad} are not layer indices in 0..{num_layers - 1}")
    return chosen


class SuperNetwork(nn.Module):
    """A pretrained causal LM whose every layer can use its attention or a linear block.

    Args:
        model: a Hugging Face ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` (copied; the copy's
            weights are frozen).
        block: the linear block of every layer, one of
            :data:`jet_nemotron.postnas.blocks.LINEAR_BLOCKS` (default the JetBlock).
        head_v_dim: value dim per head of the blocks (default the attention's head dim).
        init_from_attention: start each block's q/k/v/o projections from its layer's attention
            (as :func:`~jet_nemotron.models.convert.from_pretrained_llama` does).

    Raises:
        TypeError: ``model`` is not a Llama / Qwen2 causal LM.
        ValueError: an unknown ``block``.

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> llama = LlamaForCausalLM(
        ...     LlamaConfig(
        ...         vocab_size=64,
        ...         hidden_size=32,
        ...         intermediate_size=64,
        ...         num_hidden_layers=3,
        ...         num_attention_heads=4,
        ...     )
        ... )
        >>> supernet = SuperNetwork(llama)
        >>> with supernet.path([1]):
        ...     supernet(torch.tensor([[1, 2, 3]])).logits.shape
        torch.Size([1, 3, 64])
    """

    def __init__(
        self,
        model: nn.Module,
        block: str = "jet",
        *,
        head_v_dim: int | None = None,
        init_from_attention: bool = True,
    ) -> None:
        super().__init__()
        config = getattr(model, "config", None)
        if getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES or not hasattr(
            model, "lm_head"
        ):
            raise TypeError(
                f"the super-network wraps causal LMs with model_type in {SUPPORTED_MODEL_TYPES}, "
                f"got {type(model).__name__}"
            )
        model = copy.deepcopy(model).eval().requires_grad_(False)
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        parameter = next(model.parameters())
        for index, layer in enumerate(model.model.layers):
            attention = layer.self_attn
            linear = build_linear_block(
                block, config.hidden_size, heads, head_dim, head_v_dim=head_v_dim,
                layer_idx=index, initializer_range=config.initializer_range,
            )  # fmt: skip
            linear.to(device=parameter.device, dtype=parameter.dtype)
            if init_from_attention:
                weights = {name: getattr(attention, name).weight for name in PROJECTIONS}
                copy_attention_projections(linear, weights, heads, head_dim)
            layer.self_attn = SwitchMixer(attention, linear)
        self.model = model
        self.block = block
        self.head_v_dim = head_v_dim
        self.eval()

    def train(self, mode: bool = True) -> SuperNetwork:
        """Set the wrapped model's mode; the linear blocks stay in training mode, i.e. in their
        chunked form at every length (the super-network scores whole sequences and never
        decodes, and the chunked form is the fastest for that on any length)."""
        super().train(mode)
        for mixer in self.mixers():
            mixer.linear.train()
        return self

    @property
    def config(self) -> Any:
        return self.model.config

    @property
    def num_layers(self) -> int:
        return len(self.model.model.layers)

    def mixers(self) -> list[SwitchMixer]:
        """The :class:`SwitchMixer` of each layer, in order."""
        return [layer.self_attn for layer in self.model.model.layers]

    def linear_blocks(self) -> dict[int, nn.Module]:
        """The linear block of each layer, by layer index."""
        return {i: mixer.linear for i, mixer in enumerate(self.mixers())}

    @property
    def current_path(self) -> tuple[int, ...]:
        """The layers that use their attention now."""
        return tuple(i for i, mixer in enumerate(self.mixers()) if mixer.use_attention)

    def set_path(self, attention_layers: Iterable[int]) -> None:
        """Use attention in ``attention_layers`` and the linear block everywhere else.

        Raises:
            ValueError: an index outside ``0..num_layers - 1``.
        """
        chosen = _check_layers(attention_layers, self.num_layers, "attention layers")
        for index, mixer in enumerate(self.mixers()):
            mixer.use_attention = index in chosen

    @contextlib.contextmanager
    def path(self, attention_layers: Iterable[int]) -> Iterator[None]:
        """Run the block under :meth:`set_path`; the previous path comes back afterwards."""
        previous = self.current_path
        self.set_path(attention_layers)
        try:
            yield
        finally:
            self.set_path(previous)

    def forward(self, input_ids: torch.Tensor, output_hidden_states: bool = False) -> Any:
        """The current path's causal-LM output for ``input_ids (B, T)`` (no padding, no cache)."""
        return self.model(
            input_ids=input_ids, use_cache=False, output_hidden_states=output_hidden_states
        )

    def linear_state_dict(self) -> dict[str, torch.Tensor]:
        """The linear blocks' weights, keyed ``"<layer>.<name>"``."""
        return {
            f"{index}.{name}": tensor
            for index, block in self.linear_blocks().items()
            for name, tensor in block.state_dict().items()
        }

    def load_linear_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load what :meth:`linear_state_dict` gave (all blocks, strictly)."""
        for index, block in self.linear_blocks().items():
            prefix = f"{index}."
            block.load_state_dict(
                {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
            )

    @contextlib.contextmanager
    def _unwrapped(self) -> Iterator[nn.Module]:
        """The wrapped model with its attentions back in place (for conversion)."""
        mixers = self.mixers()
        for layer, mixer in zip(self.model.model.layers, mixers, strict=True):
            layer.self_attn = mixer.attention
        try:
            yield self.model
        finally:
            for layer, mixer in zip(self.model.model.layers, mixers, strict=True):
                layer.self_attn = mixer

    def to_hybrid(self, attention_layers: Iterable[int]) -> nn.Module:
        """A :class:`~jet_nemotron.models.modeling.HybridForCausalLM` with attention in
        ``attention_layers`` and this super-network's trained JetBlocks everywhere else.

        Raises:
            ValueError: the super-network's block is not the JetBlock (the hybrid model hosts
                JetBlocks), or bad layer indices.
        """
        if self.block != "jet":
            raise ValueError(
                f"to_hybrid builds JetBlock hybrids; this super-network has {self.block!r}"
            )
        chosen = _check_layers(attention_layers, self.num_layers, "attention layers")
        layer_types = ["attn" if i in chosen else "jet" for i in range(self.num_layers)]
        blocks = self.linear_blocks()
        with self._unwrapped() as model:
            hybrid = from_pretrained_llama(
                model, layer_types, jet_block=blocks[0].config, init_from_attention=False
            )
        for index, kind in enumerate(layer_types):
            if kind == "jet":
                hybrid.model.layers[index].self_attn.load_state_dict(blocks[index].state_dict())
        return hybrid.eval().requires_grad_(False)


@dataclass(frozen=True)
class SupernetTrainConfig:
    """Settings of :func:`train_supernet`.

    Attributes:
        layerwise_steps: steps of the layer-wise stage (0 skips it).
        path_steps: steps of the path-sampling stage (0 skips it).
        batch_size: rows per step.
        lr: AdamW learning rate.
        temperature: softmax temperature of the KL term.
        hidden_weight: weight of the hidden-state term.
        max_grad_norm: gradient clipping.
        min_attention, max_attention: how many attention layers a sampled path has (uniform).
        fixed_path: train this one path instead of sampling (linear-block selection at a
            fixed placement); the layer-wise stage then trains only its linear layers.
        seed: batches and paths.
        save_every: steps between checkpoints (and one at the end).
    """

    layerwise_steps: int = 200
    path_steps: int = 100
    batch_size: int = 4
    lr: float = 1e-3
    temperature: float = 1.0
    hidden_weight: float = 1.0
    max_grad_norm: float = 1.0
    min_attention: int = 0
    max_attention: int = 3
    fixed_path: tuple[int, ...] | None = None
    seed: int = 0
    save_every: int = 50

    def __post_init__(self) -> None:
        for name in ("layerwise_steps", "path_steps", "min_attention"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("batch_size", "save_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("lr", "temperature", "max_grad_norm"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.hidden_weight < 0:
            raise ValueError(f"hidden_weight must be >= 0, got {self.hidden_weight}")
        if self.max_attention < self.min_attention:
            raise ValueError(
                f"max_attention ({self.max_attention}) < min_attention ({self.min_attention})"
            )
        if self.fixed_path is not None:
            object.__setattr__(self, "fixed_path", tuple(sorted(set(self.fixed_path))))


@dataclass
class SupernetHistory:
    """Loss per step of each stage, and the path of every path-sampling step."""

    layerwise: list[float] = field(default_factory=list)
    paths: list[float] = field(default_factory=list)
    sampled: list[list[int]] = field(default_factory=list)


def _generator(stream: str, seed: int, index: int) -> torch.Generator:
    """A generator seeded from ``(stream, seed, index)``: separate streams for paths and
    batches, no two ``(seed, index)`` pairs alike."""
    digest = hashlib.sha256(f"{stream}:{seed}:{index}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))


def sample_path(num_layers: int, config: SupernetTrainConfig, step: int) -> tuple[int, ...]:
    """The attention layers of training step ``step``: seeded by ``(config.seed, step)``.

    The count is uniform in ``[min_attention, min(max_attention, num_layers)]``, the layers a
    uniform subset of that size.

    Raises:
        ValueError: ``min_attention`` above ``num_layers``.
    """
    if config.min_attention > num_layers:
        raise ValueError(
            f"min_attention={config.min_attention} exceeds the model's {num_layers} layers"
        )
    if config.fixed_path is not None:
        return _check_layers(config.fixed_path, num_layers, "fixed_path layers")
    generator = _generator("path", config.seed, step)
    high = min(config.max_attention, num_layers)
    count = int(torch.randint(min(config.min_attention, high), high + 1, (1,), generator=generator))
    return tuple(sorted(torch.randperm(num_layers, generator=generator)[:count].tolist()))


def batch_at(rows: torch.Tensor, batch_size: int, seed: int, step: int) -> torch.Tensor:
    """Rows of step ``step``: epoch ``e`` walks a permutation seeded by ``(seed, e)``, dropping
    the last partial batch."""
    per_epoch = len(rows) // batch_size
    epoch, position = divmod(step, per_epoch)
    order = torch.randperm(len(rows), generator=_generator("batch", seed, epoch))
    return rows[order[position * batch_size : (position + 1) * batch_size]]


def _save(path: Path, payload: dict[str, Any]) -> None:
    with atomic_file(path) as staging:  # a checkpoint is whole or absent
        torch.save(payload, staging)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """A checkpoint written by :func:`train_supernet`.

    Raises:
        ValueError: not a super-network checkpoint of this format.
    """
    payload = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a super-network checkpoint (format {CHECKPOINT_FORMAT})")
    return payload


def from_checkpoint(model: nn.Module, path: Path) -> SuperNetwork:
    """The super-network of ``model`` with the linear blocks saved in ``path``."""
    payload = load_checkpoint(path)
    supernet = SuperNetwork(
        model, payload["block"], head_v_dim=payload["head_v_dim"], init_from_attention=False
    )
    supernet.load_linear_state_dict(payload["linear"])
    return supernet


def train_supernet(
    supernet: SuperNetwork,
    rows: torch.Tensor,
    config: SupernetTrainConfig = SupernetTrainConfig(),
    *,
    checkpoint: Path | None = None,
    progress: bool | None = None,
) -> SupernetHistory:
    """Train the linear blocks of ``supernet`` (see the module docstring).

    Args:
        supernet: the super-network (its linear blocks train in place).
        rows: ``(N, L)`` int64 token rows, ``N >= batch_size``.
        config: steps, learning rate, losses, path sampling.
        checkpoint: a file to save to every ``save_every`` steps; if it exists, training resumes
            from it (same config required) and continues bit for bit.
        progress: show a progress bar (``None``: only on a terminal).

    Returns:
        The history of every step so far (including steps before a resume).

    Raises:
        ValueError: bad ``rows``, or a checkpoint from another block or config.
    """
    if rows.dim() != 2 or rows.dtype != torch.long or len(rows) < config.batch_size:
        raise ValueError(
            f"rows must be an int64 (N, L) tensor with N >= batch_size={config.batch_size}, got "
            f"{rows.dtype} {tuple(rows.shape)}"
        )
    n = supernet.num_layers
    first = sample_path(n, config, 0)  # checks the settings against the depth
    fixed = None if config.fixed_path is None else set(first)
    trained = [i for i in range(n) if fixed is None or i not in fixed]
    if not trained:
        raise ValueError(
            f"fixed_path {config.fixed_path} keeps attention in every layer: no linear block "
            "to train"
        )
    blocks = supernet.linear_blocks()
    params = [p for i in trained for p in blocks[i].parameters()]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
    history, start = SupernetHistory(), 0
    settings = asdict(config)
    if checkpoint is not None and Path(checkpoint).exists():
        payload = load_checkpoint(Path(checkpoint))
        written = (payload["block"], payload["head_v_dim"], payload["config"])
        if written != (supernet.block, supernet.head_v_dim, settings):
            raise ValueError(
                f"{checkpoint} was written by another run (block {payload['block']!r}, head_v_dim "
                f"{payload['head_v_dim']}, config {payload['config']}); resume with the same "
                "block and config or a new file"
            )
        supernet.load_linear_state_dict(payload["linear"])
        optimizer.load_state_dict(payload["optimizer"])
        history, start = SupernetHistory(**payload["history"]), payload["step"]
        logger.info("resuming from step %d of %s", start, checkpoint)
    device = next(supernet.parameters()).device
    total = config.layerwise_steps + config.path_steps
    for block in blocks.values():
        block.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    supernet.eval()
    try:
        for step in tqdm(range(start, total), desc="super-network", initial=start, total=total,
                         **progress_options(progress)):  # fmt: skip
            batch = batch_at(rows, config.batch_size, config.seed, step).to(device)
            if step < config.layerwise_steps:
                with supernet.path(range(n)):
                    pairs = attention_io(supernet.model, trained, batch)
                loss = sum(relative_mse(blocks[i](x)[0], y) for i, (x, y) in pairs.items())
                loss = loss / len(pairs)
                stage, losses, steps = "layer-wise", history.layerwise, config.layerwise_steps
            else:
                path = sample_path(n, config, step)
                with torch.no_grad(), supernet.path(range(n)):
                    target = supernet(batch, output_hidden_states=True)
                with supernet.path(path):
                    output = supernet(batch, output_hidden_states=True)
                loss = distillation_loss(output, target, config.temperature, config.hidden_weight)
                history.sampled.append(list(path))
                stage, losses, steps = "paths", history.paths, config.path_steps
            optimizer_step(loss, params, optimizer, config.max_grad_norm)
            losses.append(loss.item())
            log_progress(stage, losses, steps)
            if checkpoint is not None and (
                (step + 1) % config.save_every == 0 or step + 1 == total
            ):
                _save(Path(checkpoint), {
                    "format": CHECKPOINT_FORMAT, "block": supernet.block,
                    "head_v_dim": supernet.head_v_dim, "config": settings, "step": step + 1,
                    "linear": supernet.linear_state_dict(), "optimizer": optimizer.state_dict(),
                    "history": dataclasses.asdict(history),
                })  # fmt: skip
    finally:
        supernet.eval()
        supernet.requires_grad_(False)
    return history


def uniform_placement(num_layers: int, budget: int) -> tuple[int, ...]:
    """``budget`` attention layers spread evenly: the middle layer of each of ``budget`` equal
    spans (the usual hand-placed hybrid)."""
    if not 0 <= budget <= num_layers:
        raise ValueError(f"budget must be in 0..{num_layers}, got {budget}")
    return tuple(int((i + 0.5) * num_layers / budget) for i in range(budget))


def check_budget(budget: int, num_layers: int) -> int:
    """``budget`` after checking it is a count of layers in ``1..num_layers``."""
    if isinstance(budget, bool) or not isinstance(budget, int) or not 1 <= budget <= num_layers:
        raise ValueError(
            f"the attention budget must be an integer in 1..{num_layers} (the model's layers), "
            f"got {budget!r}"
        )
    return budget
