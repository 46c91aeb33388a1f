"""The learning-curve PFN as a `CurveSurrogate`: whole-curve samples from per-epoch predictions.

The PFN predicts, for every configuration n and epoch t, a bar distribution F_{n,t} of the value
given everything observed. It says nothing about how the values at two epochs move together, so
sampled curves need a coupling:

* `sampling="quantile"` (default): a comonotone copula. Each sample path draws one level
  u ~ U(0, 1) and takes y_{n,t} = F_{n,t}⁻¹(u) at every epoch: the path sits at the same quantile
  all along its curve (smooth, and the paths of one configuration never cross). Every epoch's
  marginal is exactly F_{n,t}; the running maximum of a path, which the acquisition needs, is
  that of a plausible curve instead of the maximum of independent noise.
* `sampling="marginal"`: every epoch drawn independently from F_{n,t} (the CFBO authors' choice).
  Their code also averages 5 such draws per sample (`num_average_samples=5`), which shrinks the
  spread by √5; `average_draws=5` reproduces that (default 1: plain independent draws). Their
  transfer model draws bucket centres, their FT-PFN path uniform points inside the bucket; we
  always draw inside the bucket.

Observed epochs are queried too (`predict_logits` covers every epoch), and `sample_curves`
returns the observed values there, identical in every path.

Context size: the model was trained on at most `max_context` observations (its config; lower it
with `max_context=`). When there are more, `context_overflow="thin"` (default) keeps every
configuration's latest epoch and thins longer curves evenly (water-filling: curves with few
observations keep all of them, the longest ones are thinned most), with a warning;
`context_overflow="raise"` raises instead. Nothing is dropped silently.

Example:
    >>> import numpy as np, torch
    >>> from freeze_thaw_bo.surrogates.base import CurveObservations
    >>> obs = CurveObservations(
    ...     x=np.array([[0.2, 0.5], [0.8, 0.1]]),
    ...     curves=(np.array([0.3, 0.45, 0.52]), np.array([])),
    ...     horizon=10,
    ... )
    >>> samples = PFNSurrogate().sample_curves(obs, 100, torch.Generator().manual_seed(0))
    >>> tuple(samples.shape)
    (2, 100, 10)
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch

from freeze_thaw_bo.pfn.batch import CurveBatch
from freeze_thaw_bo.pfn.model import LearningCurvePFN
from freeze_thaw_bo.surrogates.base import CurveObservations

__all__ = ["PFNSurrogate", "thin_context"]


def thin_context(lengths: np.ndarray, cap: int) -> list[np.ndarray]:
    """Per configuration, the 0-based epochs to keep so that at most `cap` remain in all.

    Every observed curve keeps its latest epoch; the budget is shared by water-filling
    (k_n = min(L_n, level), leftovers to the longest curves) and each curve keeps k_n epochs
    evenly spread over its prefix. Raises when even one epoch per observed curve exceeds `cap`.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    observed = int((lengths > 0).sum())
    if observed > cap:
        raise ValueError(
            f"{observed} configurations have observations but the model takes at most {cap} "
            "context tokens, so not even one epoch per curve fits; train a model with a larger "
            "max_context or pass fewer configurations"
        )
    level = 0
    while np.minimum(lengths, level + 1).sum() <= cap and level < lengths.max(initial=0):
        level += 1
    keep = np.minimum(lengths, level)
    spare = cap - int(keep.sum())
    for n in np.argsort(-lengths, kind="stable")[:spare]:
        if keep[n] < lengths[n]:
            keep[n] += 1
    return [
        np.unique(np.round(np.linspace(length - 1, 0, k)).astype(np.int64))
        if k
        else np.zeros(0, np.int64)
        for length, k in zip(lengths, keep, strict=True)
    ]


class PFNSurrogate:
    """Samples whole learning curves from a `LearningCurvePFN` (default: the shipped weights).

    Args:
        model: the PFN; None loads the shipped `ftpfn_small` weights.
        sampling: "quantile" (joint, comonotone paths) or "marginal" (independent epochs).
        batch_size: query tokens per forward chunk (memory vs. overhead).
        initial_value: every curve's value before training (epoch 0), if known (e.g. chance
            accuracy); None lets the model infer it.
        average_draws: with "marginal", average this many draws per sample (the authors: 5).
        max_context: most observations given to the model (default: the model's training cap).
        context_overflow: "thin" (warn and thin, see module docstring) or "raise".
    """

    def __init__(
        self,
        model: LearningCurvePFN | None = None,
        *,
        sampling: Literal["quantile", "marginal"] = "quantile",
        batch_size: int = 8192,
        initial_value: float | None = None,
        average_draws: int = 1,
        max_context: int | None = None,
        context_overflow: Literal["thin", "raise"] = "thin",
    ) -> None:
        if model is None:
            from freeze_thaw_bo.pfn.checkpoint import load_default_pfn

            model = load_default_pfn()
        if not isinstance(model, LearningCurvePFN):
            raise TypeError(f"model must be a LearningCurvePFN, got {type(model).__name__}")
        if sampling not in ("quantile", "marginal"):
            raise ValueError(f"sampling must be 'quantile' or 'marginal', got {sampling!r}")
        if context_overflow not in ("thin", "raise"):
            raise ValueError(
                f"context_overflow must be 'thin' or 'raise', got {context_overflow!r}"
            )
        if batch_size < 1 or average_draws < 1:
            raise ValueError(
                f"batch_size and average_draws must be >= 1, got {batch_size}, {average_draws}"
            )
        if initial_value is not None and not 0.0 <= initial_value <= 1.0:
            raise ValueError(f"initial_value must lie in [0, 1] or be None, got {initial_value}")
        cap = model.config.max_context if max_context is None else max_context
        if not 0 <= cap <= model.config.max_context:
            raise ValueError(
                f"max_context must lie in [0, {model.config.max_context}] (the model's), got {cap}"
            )
        self.model = model.eval()
        self.sampling = sampling
        self.batch_size = batch_size
        self.initial_value = initial_value
        self.average_draws = average_draws
        self.max_context = cap
        self.context_overflow = context_overflow

    # ------------------------------------------------------------------ inputs
    def _check(self, observations: CurveObservations) -> None:
        if not isinstance(observations, CurveObservations):
            raise TypeError(
                f"observations must be CurveObservations, got {type(observations).__name__}"
            )
        config = self.model.config
        x = observations.x
        if observations.num_configs and not 1 <= x.shape[1] <= config.max_dim_x:
            raise ValueError(
                f"configurations have {x.shape[1]} dimensions; this model accepts "
                f"1..{config.max_dim_x}"
            )
        if not np.isfinite(x).all() or (x < 0).any() or (x > 1).any():
            raise ValueError("configurations x must be finite and encoded in [0, 1]")
        if observations.horizon > config.max_horizon:
            raise ValueError(
                f"horizon {observations.horizon} exceeds the {config.max_horizon} epochs this "
                "model was trained for; train or fine-tune a model with a larger max_horizon"
            )
        for n, curve in enumerate(observations.curves):
            if curve.size and (curve.min() < 0 or curve.max() > 1):
                raise ValueError(f"curve {n} has values outside [0, 1]; normalise them first")

    def _context_epochs(self, lengths: np.ndarray) -> list[np.ndarray]:
        total = int(lengths.sum())
        if total <= self.max_context:
            return [np.arange(length) for length in lengths]
        if self.context_overflow == "raise":
            raise ValueError(
                f"{total} observations exceed the model's context cap of {self.max_context}; use "
                "context_overflow='thin' or a model trained with a larger max_context"
            )
        warnings.warn(
            f"{total} observations exceed the model's context cap of {self.max_context}: "
            "thinning older epochs of the longest curves (every curve keeps its latest epoch)",
            RuntimeWarning,
            stacklevel=5,  # the caller of predict_logits / quantiles
        )
        return thin_context(lengths, self.max_context)

    def _batch(self, observations: CurveObservations) -> CurveBatch:
        """One task: the (possibly thinned) context and a query for every (config, epoch)."""
        self._check(observations)
        device = next(self.model.parameters()).device
        n, horizon = observations.num_configs, observations.horizon
        x = torch.as_tensor(observations.x, dtype=torch.float32, device=device)
        kept = self._context_epochs(observations.lengths)
        empty = [np.zeros(0, dtype=np.int64)]
        ids = np.concatenate(
            [np.full(k.size, i, dtype=np.int64) for i, k in enumerate(kept)] + empty
        )
        epochs = np.concatenate(kept + empty)
        values = np.concatenate(
            [c[k] for c, k in zip(observations.curves, kept, strict=True)] + [np.zeros(0)]
        )
        ids_t = torch.as_tensor(ids, device=device)
        query_ids = torch.arange(n, device=device).repeat_interleave(horizon)
        query_t = torch.arange(1, horizon + 1, device=device, dtype=torch.float32).repeat(n)
        context_t = torch.as_tensor((epochs + 1) / horizon, dtype=torch.float32, device=device)
        start = 0.0 if self.initial_value is None else self.initial_value
        return CurveBatch(
            x_context=x[ids_t][None],
            t_context=context_t[None],
            y_context=torch.as_tensor(values, dtype=torch.float32, device=device)[None],
            id_context=ids_t[None],
            x_query=x[query_ids][None],
            t_query=(query_t / horizon)[None],
            id_query=query_ids[None],
            y_start=torch.tensor([start], dtype=torch.float32, device=device),
            start_known=torch.tensor([self.initial_value is not None], device=device),
        )

    # ------------------------------------------------------------------ predictions
    @torch.no_grad()
    def predict_logits(self, observations: CurveObservations) -> torch.Tensor:
        """(N, T, num_bars) float32 CPU logits of every configuration's value at every epoch."""
        batch = self._batch(observations)
        logits = self.model(batch, chunk_size=self.batch_size)
        shape = (observations.num_configs, observations.horizon, self.model.config.num_bars)
        return logits.reshape(shape).float().cpu()

    def quantiles(
        self, observations: CurveObservations, qs: Sequence[float] | torch.Tensor
    ) -> torch.Tensor:
        """(N, T, len(qs)) predictive quantiles at levels `qs` (each in [0, 1])."""
        levels = torch.as_tensor(qs, dtype=torch.float32).reshape(-1)
        return self.model.bar.icdf(self.predict_logits(observations), levels)

    def sample_curves(
        self, observations: CurveObservations, num_samples: int, generator: torch.Generator
    ) -> torch.Tensor:
        """(N, num_samples, T) float32 sampled curves (joint paths unless `sampling="marginal"`).

        `generator`: a CPU torch.Generator; the same state gives the same samples.
        """
        if not isinstance(generator, torch.Generator):
            raise TypeError("generator must be a torch.Generator")
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        logits = self.predict_logits(observations)  # (N, T, K)
        n = observations.num_configs
        bar = self.model.bar
        if self.sampling == "quantile":
            levels = torch.rand(n, 1, num_samples, generator=generator)
            samples = bar.icdf(logits, levels)  # (N, T, S)
        else:
            draws = bar.sample(logits, num_samples * self.average_draws, generator)
            samples = draws.reshape(n, observations.horizon, self.average_draws, num_samples)
            samples = samples.mean(dim=2)
        samples = samples.transpose(1, 2).contiguous()
        for i, curve in enumerate(observations.curves):
            if curve.size:
                samples[i, :, : curve.size] = torch.as_tensor(curve, dtype=torch.float32)
        return samples
