"""Where to keep full attention: beam search over placements scored with the super-network.

A placement (the layers that keep their attention) is scored on each probe with the trained
super-network's shared weights. Each task's score is its *normalised gap*: 0 when the placement
scores as the original model (all attention), 1 when it scores as no attention at all,

    gap_task(P) = (loss_task(P) - loss_task(all)) / (loss_task(none) - loss_task(all)),

and the combined objective is the mean gap over tasks, so that no task dominates by the scale
of its loss. The beam search grows placements one layer at a time, keeping the ``beam_width``
best at each size; every placement is evaluated once and cached, so the per-task searches and
the combined one share their evaluations. A task's *important layers* are the single layers
that recover most of its gap when they alone keep attention (the first step of every search).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from jet_nemotron.distill import progress_options
from jet_nemotron.postnas.probes import Probe, ProbeScore, score_probe
from jet_nemotron.postnas.supernet import SuperNetwork, check_budget
from kernels_common.cli import atomic_file, read_json

logger = logging.getLogger(__name__)

Placement = tuple[int, ...]
COMBINED = "combined"
MIN_SEPARATION = 1e-3  # nats: a task whose loss barely moves without attention has no gap


def beam_search(
    score: Callable[[Placement], float], num_layers: int, budget: int, beam_width: int
) -> list[tuple[Placement, float]]:
    """The best placement found of each size ``1..budget`` (lower ``score`` is better).

    Size ``s`` extends each of the ``beam_width`` best placements of size ``s - 1`` by every
    layer it lacks; ties go to the placement that sorts first. With ``beam_width`` at least the
    number of placements of every size this is exhaustive search.

    Raises:
        ValueError: a budget outside ``1..num_layers`` or ``beam_width < 1``.
    """
    check_budget(budget, num_layers)
    if isinstance(beam_width, bool) or not isinstance(beam_width, int) or beam_width < 1:
        raise ValueError(f"beam_width must be a positive integer, got {beam_width!r}")
    beams: list[Placement] = [()]
    best = []
    for _ in range(budget):
        candidates = sorted(
            {
                tuple(sorted((*beam, i)))
                for beam in beams
                for i in range(num_layers)
                if i not in beam
            }
        )
        ranked = sorted((score(c), c) for c in candidates)
        beams = [c for _, c in ranked[:beam_width]]
        best.append((ranked[0][1], ranked[0][0]))
    return best


class PlacementEvaluator:
    """Probe scores of placements on a super-network, each placement evaluated once.

    Args:
        supernet: the trained super-network.
        probes: the tasks, with distinct names.
        batch_size: rows per forward pass.
        cache: a JSON file of evaluated placements: read if it exists (it must come from the same
            super-network weights and probes, checked by a fingerprint) and rewritten after each
            new evaluation, so that an interrupted search resumes without re-scoring.

    Raises:
        ValueError: no probe, two probes of one name, ``batch_size < 1``, or a cache from other
            weights or probes.
    """

    def __init__(
        self,
        supernet: SuperNetwork,
        probes: Sequence[Probe],
        batch_size: int = 8,
        cache: str | os.PathLike[str] | None = None,
    ) -> None:
        names = [p.name for p in probes]
        if not probes:
            raise ValueError("give at least one probe to score placements on")
        if len(set(names)) != len(names):
            raise ValueError(f"probe names must be distinct, got {names}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.supernet, self.probes, self.batch_size = supernet, list(probes), batch_size
        self.scores: dict[Placement, dict[str, ProbeScore]] = {}
        self.cache = None if cache is None else Path(cache)
        if self.cache is not None:
            self.fingerprint = self._fingerprint()
            if self.cache.exists():
                self._load()

    def _fingerprint(self) -> str:
        digest = hashlib.sha256()
        for probe in self.probes:
            digest.update(probe.name.encode())
            digest.update(probe.input_ids.numpy().tobytes())
            digest.update(probe.answer_mask.numpy().tobytes())
        for name, tensor in sorted(self.supernet.linear_state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().float().cpu().numpy().tobytes())
        return digest.hexdigest()

    def _load(self) -> None:
        assert self.cache is not None
        data = read_json(self.cache, "placement cache")
        if data.get("fingerprint") != self.fingerprint:
            raise ValueError(
                f"{self.cache} holds scores of other super-network weights or probes; use a new "
                "cache file"
            )
        for key, scores in data["scores"].items():
            placement = tuple(int(i) for i in key.split(",")) if key else ()
            self.scores[placement] = {t: ProbeScore(**v) for t, v in scores.items()}

    def _save(self) -> None:
        assert self.cache is not None
        scores = {_key(p): {t: asdict(v) for t, v in s.items()} for p, s in self.scores.items()}
        with atomic_file(self.cache) as path:
            Path(path).write_text(json.dumps({"fingerprint": self.fingerprint, "scores": scores}))

    @property
    def tasks(self) -> list[str]:
        return [p.name for p in self.probes]

    def __call__(self, path: Placement) -> dict[str, ProbeScore]:
        path = tuple(sorted(path))
        if path not in self.scores:
            with self.supernet.path(path):
                self.scores[path] = {
                    p.name: score_probe(self.supernet.model, p, self.batch_size)
                    for p in self.probes
                }
            if self.cache is not None:
                self._save()
            if len(self.scores) % 10 == 0:
                logger.info("%d placements evaluated", len(self.scores))
        return self.scores[path]

    def separation(self, task: str) -> float:
        """``loss(no attention) - loss(all attention)`` of ``task``: the gap's denominator."""
        return self(())[task].loss - self(tuple(range(self.supernet.num_layers)))[task].loss

    def separating_tasks(self) -> list[str]:
        """The tasks on which removing every attention costs at least ``MIN_SEPARATION`` nats."""
        return [t for t in self.tasks if self.separation(t) >= MIN_SEPARATION]

    def gap(self, path: Placement, task: str) -> float:
        """The normalised gap of ``task`` (see the module docstring).

        Raises:
            ValueError: the task does not separate attention from none (its gap is undefined).
        """
        separation = self.separation(task)
        if separation < MIN_SEPARATION:
            raise ValueError(
                f"probe {task!r} does not separate attention from none (loss without attention "
                f"minus loss with every attention is {separation:.4g} nats < {MIN_SEPARATION}): "
                "its normalised gap is undefined; leave it out or give it more examples"
            )
        full = self(tuple(range(self.supernet.num_layers)))[task].loss
        return (self(path)[task].loss - full) / separation

    def objective(self, name: str) -> Callable[[Placement], float]:
        """``"combined"`` (mean gap over the separating tasks) or one task's gap, as a function
        of a placement.

        Raises:
            ValueError: an unknown name, or no task that separates attention from none.
        """
        if name == COMBINED:
            tasks = self.separating_tasks()
            if not tasks:
                raise ValueError(
                    f"no probe of {self.tasks} separates attention from none; the combined "
                    "objective is undefined"
                )
            return lambda path: sum(self.gap(path, t) for t in tasks) / len(tasks)
        if name not in self.tasks:
            raise ValueError(f"unknown objective {name!r}; allowed: {[COMBINED, *self.tasks]}")
        return lambda path: self.gap(path, name)


def _key(placement: Placement) -> str:
    return ",".join(map(str, placement))


@dataclass
class PlacementSearch:
    """What :func:`search_placement` found.

    Attributes:
        budget: the largest number of attention layers searched.
        reference: the scores with every layer's attention (``"all"``) and with none.
        separation: per task, ``loss(none) - loss(all)``, the gaps' denominator.
        unseparated: tasks whose separation is under ``MIN_SEPARATION`` nats: they have no gap
            and take no part in the objectives.
        single_layer: per separating task, the normalised gap with only layer ``i`` keeping
            attention.
        important_layers: per task, layers ordered from the most important (lowest gap alone).
        best: per objective, ``[(placement, objective)]`` for sizes ``1..budget``.
        placement: the combined objective's best placement at ``budget``.
        scores: every evaluated placement's probe scores.
    """

    budget: int
    reference: dict[str, dict[str, ProbeScore]]
    separation: dict[str, float]
    unseparated: list[str]
    single_layer: dict[str, list[float]]
    important_layers: dict[str, list[int]]
    best: dict[str, list[tuple[Placement, float]]]
    placement: Placement
    scores: dict[str, dict[str, ProbeScore]] = field(default_factory=dict)


def search_placement(
    supernet: SuperNetwork,
    probes: Sequence[Probe],
    budget: int,
    *,
    beam_width: int = 2,
    objectives: Sequence[str] = (COMBINED,),
    batch_size: int = 8,
    cache: str | os.PathLike[str] | None = None,
    progress: bool | None = None,
) -> PlacementSearch:
    """Beam-search the attention placement of ``budget`` layers on ``probes``.

    Args:
        supernet: a trained :class:`SuperNetwork`.
        probes: the tasks (e.g. :func:`~jet_nemotron.postnas.probes.lm_probe`, ...).
        budget: how many layers keep attention (searched for every size up to it).
        beam_width: placements kept per size.
        objectives: ``"combined"`` and/or task names, each searched (evaluations are shared);
            the chosen placement is the first objective's.
        batch_size: rows per forward pass when scoring.
        cache: a JSON file keeping every evaluation, to resume an interrupted search (see
            :class:`PlacementEvaluator`).
        progress: progress bar over the single-layer evaluations (``None``: on a terminal).

    Raises:
        ValueError: no probe, a budget outside ``1..num_layers``, no or unknown objectives, an
            objective on a task that does not separate attention from none.
    """
    n = supernet.num_layers
    check_budget(budget, n)
    evaluator = PlacementEvaluator(supernet, probes, batch_size, cache)
    allowed = [COMBINED, *evaluator.tasks]
    unknown = [name for name in objectives if name not in allowed]
    if not objectives or unknown:
        raise ValueError(f"objectives must name some of {allowed}, got {list(objectives)}")
    reference = {"all": evaluator(tuple(range(n))), "none": evaluator(())}
    functions = {name: evaluator.objective(name) for name in objectives}
    for layer in tqdm(range(n), desc="single layers", **progress_options(progress)):
        evaluator((layer,))
    separating = evaluator.separating_tasks()
    single = {t: [evaluator.gap((i,), t) for i in range(n)] for t in separating}
    important = {t: sorted(range(n), key=lambda i, t=t: (single[t][i], i)) for t in single}
    best = {}
    for name, function in functions.items():
        best[name] = beam_search(function, n, budget, beam_width)
        logger.info(
            "%s: best placements %s (%d evaluated)", name, best[name], len(evaluator.scores)
        )
    return PlacementSearch(
        budget=budget,
        reference=reference,
        separation={t: evaluator.separation(t) for t in evaluator.tasks},
        unseparated=[t for t in evaluator.tasks if t not in separating],
        single_layer=single,
        important_layers=important,
        best=best,
        placement=best[objectives[0]][-1][0],
        scores={_key(p): s for p, s in evaluator.scores.items()},
    )
