"""PostNAS step 4: hardware-aware search of the JetBlock's shape at a fixed recurrent-state size.

Decoding at long context is bound by the memory each step reads: the KV cache of the kept
attention layers and the recurrent state ``S (H, Dk, Dv)`` of every JetBlock. With the
full-attention placement fixed, the paper therefore fixes the state size ``H · Dk · Dv`` and
searches the number of heads ``H``, key dim ``Dk`` and value dim ``Dv`` under it: configurations
of equal state size differ in parameters (the projections grow with ``H · Dk`` and ``H · Dv``),
in quality, and in the throughput measured on the actual machine, so the result is the Pareto
front of measured generation throughput against quality.

:func:`state_size_grid` lists the shapes of one state size, :func:`search_hardware` builds,
distils, scores and times a hybrid for each (resumable from a JSON file, since many shapes take
long), :meth:`HardwareSearch.pareto_front` keeps the non-dominated ones and :func:`plot_pareto`
draws them. The convolution state ``(H · Dv, conv_size)`` also changes with the shape; it is
``conv_size / Dk`` of the recurrent state, small beside it, and measured in ``cache_bytes``.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from jet_nemotron.bench.generation import decode_point
from jet_nemotron.distill import DistillConfig, distill, jet_blocks
from jet_nemotron.models import convert
from jet_nemotron.models.configuration import check_layer_types
from jet_nemotron.modules.jet_block import JetBlockConfig
from kernels_common.cli import atomic_file, read_json
from kernels_common.plotting import new_figure, save_figure

LOGGER = logging.getLogger(__name__)

_SHAPE_FIELDS = ("num_heads", "head_dim", "expand_v")


def _check_positive_ints(name: str, values: Any) -> list[int]:
    if isinstance(values, str | int) or not isinstance(values, Sequence) or not values:
        raise ValueError(f"{name} must be a non-empty sequence of positive ints, got {values!r}")
    bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int) or v < 1]
    if bad:
        raise ValueError(f"{name} must hold positive integers only, got {bad}")
    return sorted(set(values))


@dataclass(frozen=True, order=True)
class JetShape:
    """The searched part of a JetBlock's shape.

    Attributes:
        num_heads: heads ``H`` of q, k and v.
        head_dim: key (and query) dim per head ``Dk``.
        head_v_dim: value dim per head ``Dv``.

    Example:
        >>> shape = JetShape(num_heads=2, head_dim=16, head_v_dim=32)
        >>> shape.state_numel, shape.label
        (1024, '2x16x32')
        >>> shape.jet_block_config(chunk_size=16).expand_v
        2.0
    """

    num_heads: int
    head_dim: int
    head_v_dim: int

    def __post_init__(self) -> None:
        for name in ("num_heads", "head_dim", "head_v_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"JetShape.{name} must be a positive integer, got {value!r}")

    @property
    def state_numel(self) -> int:
        """Elements of one sequence's recurrent state ``(H, Dk, Dv)`` in one layer."""
        return self.num_heads * self.head_dim * self.head_v_dim

    @property
    def label(self) -> str:
        """``"HxDkxDv"``."""
        return f"{self.num_heads}x{self.head_dim}x{self.head_v_dim}"

    def jet_block_config(self, **overrides: Any) -> JetBlockConfig:
        """A :class:`JetBlockConfig` of this shape (``expand_v = Dv / Dk``); ``overrides`` set
        its other fields (``chunk_size``, ``conv_size``, ...).

        Raises:
            ValueError: an override of a field the shape sets, or a field value the config
                rejects.
        """
        clash = sorted(set(overrides) & set(_SHAPE_FIELDS))
        if clash:
            raise ValueError(f"{clash} are set by the JetShape; override only the other fields")
        expand_v = self.head_v_dim / self.head_dim
        return JetBlockConfig.from_dict(
            {"num_heads": self.num_heads, "head_dim": self.head_dim, "expand_v": expand_v}
            | overrides
        )


def state_size_grid(
    state_numel: int,
    num_heads: Sequence[int],
    head_dims: Sequence[int],
    value_dims: Sequence[int],
) -> list[JetShape]:
    """Every ``(H, Dk, Dv)`` from the candidate lists whose state ``H · Dk · Dv`` is exactly
    ``state_numel``, sorted by ``(H, Dk, Dv)`` (duplicate candidates count once).

    Raises:
        ValueError: a non-positive ``state_numel`` or candidate, an empty candidate list, or no
            combination of exactly that state size.

    Example:
        >>> [s.label for s in state_size_grid(256, [1, 2, 4], [8, 16], [8, 16, 32])]
        ['1x8x32', '1x16x16', '2x8x16', '2x16x8', '4x8x8']
    """
    if isinstance(state_numel, bool) or not isinstance(state_numel, int) or state_numel < 1:
        raise ValueError(f"state_numel must be a positive integer, got {state_numel!r}")
    heads = _check_positive_ints("num_heads", num_heads)
    keys = _check_positive_ints("head_dims", head_dims)
    values = set(_check_positive_ints("value_dims", value_dims))
    grid = [
        JetShape(h, k, state_numel // (h * k))
        for h in heads
        for k in keys
        if state_numel % (h * k) == 0 and state_numel // (h * k) in values
    ]
    if not grid:
        raise ValueError(
            f"no (num_heads, head_dim, head_v_dim) from num_heads={heads}, head_dims={keys}, "
            f"value_dims={sorted(values)} has a state of exactly {state_numel} elements"
        )
    return grid


@dataclass(frozen=True)
class HardwareRecord:
    """One searched shape.

    Attributes:
        num_heads, head_dim, head_v_dim: the JetBlock shape (:class:`JetShape`).
        state_numel: ``H · Dk · Dv``, elements of one layer's recurrent state.
        jet_params: parameters of all the hybrid's JetBlocks together.
        quality: the caller's score after distillation (higher is better).
        tokens_per_s: measured greedy decoding throughput after a filled cache of the search's
            ``context`` tokens (:func:`jet_nemotron.bench.generation.decode_point`).
        cache_bytes: bytes of that cache (attention KV plus JetBlock states).
    """

    num_heads: int
    head_dim: int
    head_v_dim: int
    state_numel: int
    jet_params: int
    quality: float
    tokens_per_s: float
    cache_bytes: int

    @property
    def shape(self) -> JetShape:
        return JetShape(self.num_heads, self.head_dim, self.head_v_dim)


@dataclass
class HardwareSearch:
    """The setup of a :func:`search_hardware` run and its records (one per shape, in the order
    the shapes were given). ``to_json()`` / ``from_json()`` round-trip it through plain JSON
    values; the same form is the resume file."""

    layer_types: list[str]
    context: int
    new_tokens: int
    device: str
    sliding_window: int | None
    distill_config: DistillConfig
    records: list[HardwareRecord] = field(default_factory=list)

    def pareto_front(self) -> list[HardwareRecord]:
        """The records no other record dominates in (throughput higher, quality higher), by
        throughput ascending (so quality descending). A record is dominated by one at least as
        good in both and better in one; records that tie exactly stay on the front together."""
        ordered = sorted(self.records, key=lambda r: (-r.tokens_per_s, -r.quality))
        front: list[HardwareRecord] = []
        best_faster = -math.inf  # best quality among strictly faster records
        start = 0
        while start < len(ordered):
            speed = ordered[start].tokens_per_s
            end = start
            while end < len(ordered) and ordered[end].tokens_per_s == speed:
                end += 1
            top = ordered[start].quality  # best of this throughput: the group is sorted
            if top > best_faster:
                front.extend(r for r in ordered[start:end] if r.quality == top)
            best_faster = max(best_faster, top)
            start = end
        return front[::-1]

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values (``dataclasses.asdict``)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HardwareSearch:
        """Inverse of :meth:`to_json`.

        Raises:
            ValueError: missing or unknown fields.
        """
        names = {f.name for f in fields(cls)}
        if not isinstance(data, dict) or set(data) != names:
            got = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"a HardwareSearch has exactly the fields {sorted(names)}, got {got}")
        values = dict(data)
        values["distill_config"] = DistillConfig(**values["distill_config"])
        values["records"] = [HardwareRecord(**record) for record in values["records"]]
        return cls(**values)

    def _setup(self) -> dict[str, Any]:
        return {name: v for name, v in self.to_json().items() if name != "records"}


def _check_search(
    teacher: nn.Module,
    layer_types: Sequence[str],
    shapes: Sequence[JetShape],
    quality: Any,
    context: int,
    new_tokens: int,
) -> list[str]:
    config = getattr(teacher, "config", None)
    if not isinstance(teacher, nn.Module) or config is None:
        raise TypeError(f"teacher must be a Hugging Face causal LM, got {type(teacher).__name__}")
    layer_types = check_layer_types(layer_types, config.num_hidden_layers)
    if "jet" not in layer_types:
        raise ValueError(f"layer_types {layer_types} has no 'jet' layer: nothing to search")
    if not shapes or not all(isinstance(s, JetShape) for s in shapes):
        raise TypeError(f"shapes must be a non-empty sequence of JetShape, got {shapes!r}")
    if len(set(shapes)) != len(shapes):
        raise ValueError(f"shapes repeat: {[s.label for s in shapes]}")
    sizes = sorted({s.state_numel for s in shapes})
    if len(sizes) > 1:
        raise ValueError(
            f"the search compares shapes of one state size, got sizes {sizes} "
            f"(state_size_grid lists the shapes of one size)"
        )
    for shape in shapes:
        shape.jet_block_config()  # a shape the JetBlock rejects fails before any work
    if not callable(quality):
        raise TypeError(f"quality must be a callable model -> float, got {quality!r}")
    for name, value in (("context", context), ("new_tokens", new_tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return layer_types


def _load_resume(path: Path, search: HardwareSearch) -> dict[JetShape, HardwareRecord]:
    """The records of ``path`` when its setup is ``search``'s (empty if the file is missing)."""
    if not path.exists():
        return {}
    saved = HardwareSearch.from_json(read_json(path, "hardware search resume file"))
    if saved._setup() != search._setup():
        raise ValueError(
            f"resume file {path} holds a search with another setup: {saved._setup()} "
            f"(this one: {search._setup()}); use another file or the same setup"
        )
    return {record.shape: record for record in saved.records}


def _save_resume(path: Path, search: HardwareSearch, done: dict[JetShape, HardwareRecord]) -> None:
    snapshot = HardwareSearch(**{**vars(search), "records": list(done.values())})
    with atomic_file(path) as temporary:  # an interrupted write keeps the previous file
        temporary.write_text(json.dumps(snapshot.to_json(), indent=1))


def _measure(
    shape: JetShape,
    teacher: nn.Module,
    train_rows: torch.Tensor,
    quality: Callable[[nn.Module], float],
    search: HardwareSearch,
    progress: bool | None,
) -> HardwareRecord:
    """Build, distil, score and time the hybrid of one shape."""
    config = search.distill_config
    # every shape starts from the same seed (and the same copied teacher weights); the
    # caller's random state is left as it was
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        hybrid = convert.from_pretrained_llama(
            teacher,
            search.layer_types,
            jet_block=shape.jet_block_config(),
            sliding_window=search.sliding_window,
            init_from_attention=False,
        )
    hybrid.to(search.device)
    distill(hybrid, teacher, train_rows, config, progress=progress)
    hybrid.eval()
    score = float(quality(hybrid))
    if not math.isfinite(score):
        raise ValueError(f"quality returned {score} for shape {shape.label}; it must be finite")
    with torch.random.fork_rng(devices=[]):
        point = decode_point(hybrid, search.context, search.new_tokens)
    blocks = jet_blocks(hybrid).values()
    return HardwareRecord(
        num_heads=shape.num_heads,
        head_dim=shape.head_dim,
        head_v_dim=shape.head_v_dim,
        state_numel=shape.state_numel,
        jet_params=sum(p.numel() for block in blocks for p in block.parameters()),
        quality=score,
        tokens_per_s=point.tokens_per_s,
        cache_bytes=point.cache_bytes,
    )


def search_hardware(
    teacher: nn.Module,
    layer_types: Sequence[str],
    shapes: Sequence[JetShape],
    train_rows: torch.Tensor,
    *,
    quality: Callable[[nn.Module], float],
    distill_config: DistillConfig,
    context: int,
    new_tokens: int,
    device: str | torch.device = "cpu",
    sliding_window: int | None = None,
    resume: str | Path | None = None,
    progress: bool | None = None,
) -> HardwareSearch:
    """Build, distil, score and time one hybrid per JetBlock shape (PostNAS step 4).

    For each shape: ``from_pretrained_llama(teacher, layer_types, jet_block=shape,
    init_from_attention=False)`` under the seed ``distill_config.seed`` (the searched shapes
    mostly differ from the attention's, so no block starts from it; every shape gets the same
    initialisation scheme and seed and the same copied teacher weights, a fair comparison),
    :func:`jet_nemotron.distill.distill` with ``distill_config`` (identical data order), then
    ``quality(hybrid)`` in eval mode, then the median greedy decoding throughput (batch 1) after
    a cache filled with ``context`` positions
    (:func:`jet_nemotron.bench.generation.decode_point`).

    Args:
        teacher: the pretrained Llama/Qwen2 causal LM; moved to ``device`` in place.
        layer_types: ``"attn"``/``"swa"``/``"jet"`` per layer (the fixed placement; at least
            one ``"jet"``).
        shapes: the candidate shapes, all of one state size (:func:`state_size_grid`).
        train_rows: ``(N, L)`` int64 token rows to distil on.
        quality: ``model -> float``, higher is better (e.g. minus the held-out loss).
        distill_config: steps, learning rate and seed of every distillation.
        context: cached tokens before the timed decoding steps.
        new_tokens: timed decoding steps (their median is reported).
        device: where the hybrids are distilled, scored and timed.
        sliding_window: window of the ``"swa"`` layers, if any.
        resume: a JSON file of finished records: shapes already there are skipped (their record
            is reused as is) and each newly finished shape is added at once, so an interrupted
            search continues where it stopped. The file must come from a search with the same
            setup (layer types, context, new tokens, device, window, distillation settings);
            the teacher, rows and ``quality`` cannot be checked and must be the same too.
        progress: progress bars (``None``: only on a terminal).

    Returns:
        A :class:`HardwareSearch` with one record per shape, in the order of ``shapes``.

    Raises:
        TypeError: a teacher that is not a model, shapes that are not :class:`JetShape`, or a
            ``quality`` that is not callable.
        ValueError: bad ``layer_types`` (or none ``"jet"``), repeated shapes or shapes of
            several state sizes, a shape the JetBlock rejects, a non-positive ``context`` or
            ``new_tokens``, a non-finite quality, or a resume file of another setup.
    """
    layer_types = _check_search(teacher, layer_types, shapes, quality, context, new_tokens)
    search = HardwareSearch(
        layer_types=layer_types,
        context=context,
        new_tokens=new_tokens,
        device=str(torch.device(device)),
        sliding_window=sliding_window,
        distill_config=distill_config,
    )
    path = None if resume is None else Path(resume)
    done = {} if path is None else _load_resume(path, search)
    teacher.to(search.device)
    todo = [shape for shape in shapes if shape not in done]
    resumed = "" if path is None else f", {len(shapes) - len(todo)} from {path}"
    LOGGER.info("%d shapes of state %d: %d to run%s", len(shapes), shapes[0].state_numel,
                len(todo), resumed)  # fmt: skip
    for shape in tqdm(todo, desc="shapes", disable=None if progress is None else not progress):
        record = _measure(shape, teacher, train_rows, quality, search, progress)
        LOGGER.info("%s: quality %.4f, %.1f tokens/s, %d JetBlock parameters", shape.label,
                    record.quality, record.tokens_per_s, record.jet_params)  # fmt: skip
        done[shape] = record
        if path is not None:
            _save_resume(path, search, done)
    search.records = [done[shape] for shape in shapes]
    return search


def plot_pareto(search: HardwareSearch, path: str | Path) -> Path:
    """Scatter of throughput (x) against quality (y), every point labelled ``HxDkxDv``, the
    Pareto front highlighted and joined; saved as PNG at ``path`` (needs matplotlib, the
    ``kernels-common[report]`` extra).

    Raises:
        ValueError: a search without records, or a path that is not ``.png``.
    """
    if not search.records:
        raise ValueError("the search has no records to plot")
    front = search.pareto_front()
    figure = new_figure()
    axes = figure.add_subplot()
    axes.scatter([r.tokens_per_s for r in search.records], [r.quality for r in search.records],
                 color="0.6", label="searched")  # fmt: skip
    axes.plot([r.tokens_per_s for r in front], [r.quality for r in front], "o-", color="C3",
              label="Pareto front")  # fmt: skip
    for record in search.records:
        axes.annotate(record.shape.label, (record.tokens_per_s, record.quality), fontsize=7,
                      textcoords="offset points", xytext=(3, 3))  # fmt: skip
    axes.set(
        title=f"JetBlock shapes of state {search.records[0].state_numel}, context {search.context}",
        xlabel=f"decoding throughput (tokens/s, {search.device})",
        ylabel="quality (higher is better)",
    )
    axes.grid(alpha=0.3)
    axes.legend()
    return save_figure(figure, path)
