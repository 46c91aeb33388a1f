"""A PFN training or prediction batch, and how whole curves are cut into one.

A task is N configurations with whole curves over epochs 1..T. The PFN sees a *context* (the
observed prefixes of some curves, every token tagged with its curve's id) and predicts *queries*
(later epochs of any curve, including curves with nothing observed). `cut_tasks` draws such cuts
the way a freeze-thaw run produces them, following FT-PFN's `get_batch` (ifBO):

* the context holds C tokens, C uniform on {0, …, min(max_context, N·T − 1)}, one C per batch so
  tensors stay rectangular (FT-PFN likewise draws one `single_eval_pos` per batch);
* the C tokens are spread over curves by drawing C (curve, epoch) slots without replacement with
  slot weight p_n, and each curve n then shows its first c_n epochs (its prefix). FT-PFN draws p
  from Gamma(a, a) with a = 10^U(−4, −1), which puts nearly all tokens on a few curves; we use
  p = softmax(s·z), z ~ N(0, 1), log₁₀ s ~ U(−1, 1.3), which ranges from evenly spread prefixes
  (many one-epoch curves, as after a freeze-thaw warm-up) to one long curve, and needs nothing but
  a torch.Generator;
* queries are Q = min(num_queries, N·T − C) not-yet-observed slots drawn without replacement with
  weight p_n + 1/N: half their mass follows the context's curves (continuations, as FT-PFN's
  queries do), half is uniform over curves (so unseen curves are queried too).

Curve ids are the curve's index in its task. The model only compares ids for equality, so no
permutation is needed: relabelling ids leaves its predictions unchanged (tested).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["CurveBatch", "cut_tasks"]


@dataclass(frozen=True)
class CurveBatch:
    """B tasks, each a context of C observed tokens and Q query tokens.

    Attributes:
        x_context: (B, C, D) float32 configurations in [0, 1]^D of the context tokens.
        t_context: (B, C) float32 epoch / horizon, in (0, 1].
        y_context: (B, C) float32 observed values in [0, 1].
        id_context: (B, C) int64 curve id of each context token.
        x_query: (B, Q, D) float32.
        t_query: (B, Q) float32 epoch / horizon.
        id_query: (B, Q) int64 curve id of each query (equal ids = same curve as in the context).
        y_start: (B,) float32 every curve's value at epoch 0 (used where `start_known`).
        start_known: (B,) bool whether `y_start` is given to the model.
        y_query: (B, Q) float32 targets, or None when predicting.
    """

    x_context: torch.Tensor
    t_context: torch.Tensor
    y_context: torch.Tensor
    id_context: torch.Tensor
    x_query: torch.Tensor
    t_query: torch.Tensor
    id_query: torch.Tensor
    y_start: torch.Tensor
    start_known: torch.Tensor
    y_query: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.x_context.ndim != 3 or self.x_query.ndim != 3:
            raise ValueError("x_context and x_query must be (B, C, D) and (B, Q, D)")
        b, c, d = self.x_context.shape
        q = self.x_query.shape[1]
        expected = {
            "t_context": (b, c),
            "y_context": (b, c),
            "id_context": (b, c),
            "x_query": (b, q, d),
            "t_query": (b, q),
            "id_query": (b, q),
            "y_start": (b,),
            "start_known": (b,),
        }
        if self.y_query is not None:
            expected["y_query"] = (b, q)
        for name, shape in expected.items():
            got = tuple(getattr(self, name).shape)
            if got != shape:
                raise ValueError(f"{name} must have shape {shape}, got {got}")
        if self.id_context.dtype != torch.int64 or self.id_query.dtype != torch.int64:
            raise TypeError("curve ids must be int64 tensors")
        if self.start_known.dtype != torch.bool:
            raise TypeError("start_known must be a bool tensor")

    @property
    def num_tasks(self) -> int:
        return self.x_context.shape[0]


def _gather_slots(table: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """table (B, S, ...) indexed by slots (B, M) → (B, M, ...)."""
    index = slots.reshape(*slots.shape, *([1] * (table.ndim - 2)))
    return table.gather(1, index.expand(*slots.shape, *table.shape[2:]))


def cut_tasks(
    x: torch.Tensor,
    curves: torch.Tensor,
    y_start: torch.Tensor,
    start_known: torch.Tensor,
    generator: torch.Generator,
    *,
    max_context: int,
    num_queries: int,
) -> CurveBatch:
    """Cut whole curves into observed prefixes (context) and later epochs (queries).

    Args:
        x: (B, N, D) configurations in [0, 1]^D.
        curves: (B, N, T) whole curves, values in [0, 1].
        y_start: (B,) value at epoch 0; start_known: (B,) bool, whether the model may see it.
        generator: the CPU torch.Generator every draw comes from.
        max_context: the most context tokens; num_queries: the most query tokens.

    Returns:
        a `CurveBatch` with targets (`y_query`).
    """
    if x.ndim != 3 or curves.ndim != 3 or x.shape[:2] != curves.shape[:2]:
        raise ValueError(f"x (B, N, D) and curves (B, N, T) disagree: {x.shape}, {curves.shape}")
    if max_context < 0 or num_queries < 1:
        raise ValueError(
            f"need max_context >= 0 and num_queries >= 1, got {max_context}, {num_queries}"
        )
    b, n, t = curves.shape
    slots = n * t
    c = int(torch.randint(0, min(max_context, slots - 1) + 1, (1,), generator=generator))
    q = min(num_queries, slots - c)

    log_scale = -1.0 + 2.3 * torch.rand(b, 1, generator=generator)
    logits = 10.0**log_scale * torch.randn(b, n, generator=generator)
    # the floor keeps every slot drawable (softmax of large logits underflows to exact zeros)
    curve_weight = torch.softmax(logits, dim=-1).clamp_min(1e-9)
    slot_curve = torch.arange(slots) // t  # (S,) curve of each slot (curve-major order)
    slot_epoch = torch.arange(slots) % t
    counts = torch.zeros(b, n, dtype=torch.int64)
    if c > 0:
        chosen = torch.multinomial(curve_weight[:, slot_curve], c, generator=generator)
        counts.scatter_add_(1, slot_curve[chosen], torch.ones_like(chosen))
    observed = slot_epoch[None, :] < counts[:, slot_curve]  # (B, S), exactly c per row
    context = torch.argsort((~observed).to(torch.int8), dim=1, stable=True)[:, :c]
    query_weight = (curve_weight + 1.0 / n)[:, slot_curve] * (~observed)
    query = torch.multinomial(query_weight, q, generator=generator)

    flat_x = x.reshape(b, n, 1, -1).expand(b, n, t, x.shape[-1]).reshape(b, slots, -1)
    flat_y = curves.reshape(b, slots)
    epoch = (slot_epoch + 1).to(torch.float32) / t
    return CurveBatch(
        x_context=_gather_slots(flat_x, context),
        t_context=epoch[context],
        y_context=flat_y.gather(1, context),
        id_context=slot_curve[context],
        x_query=_gather_slots(flat_x, query),
        t_query=epoch[query],
        id_query=slot_curve[query],
        y_start=y_start.to(torch.float32),
        start_known=start_known,
        y_query=flat_y.gather(1, query),
    )
