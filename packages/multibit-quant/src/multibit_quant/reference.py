"""PyTorch reference of the fake quantizers: the CPU path and the oracle of the Triton kernels.

Weights are quantized per output channel: ``weight`` is ``(C, K)``, one row per output channel
(a conv's ``(C_out, C_in·kh·kw)``). Two quantizers:

* ``"dorefa"`` (DoReFa-Net, as Any-Precision DNNs use it, with per-channel statistics):
  ``t = tanh(w)``, ``u = t / max|t|`` in ``[-1, 1]``, code ``j = round((u + 1)/2 · n)`` in
  ``{0 … n}`` with ``n = 2^b − 1``, value ``E · (2j/n − 1)`` with ``E = mean|w|`` (detached):
  ``2^b`` levels, symmetric, no zero. The max is differentiable (ties share its gradient).
* ``"lsq"`` (Learned Step Size Quantization): ``q = clamp(round(w/s), −2^{b−1}, 2^{b−1} − 1)·s``
  with a learned step ``s`` per channel whose gradient is scaled by ``grad_scale`` (LSQ's
  ``1/sqrt(K·Q_p)``).

Rounding is straight-through (``round`` in the forward, identity in the backward; half to even,
as ``torch.round``). **Weight bias correction** then realigns every channel of the quantized
weights to the full-precision channel: ``"mean"`` gives ``Q − mean(Q) + mean(W)``, ``"mean_var"``
``(Q − mean(Q))·std(W)/std(Q) + mean(W)`` (population statistics, differentiated through). A
channel whose quantized values are all equal keeps ratio 1 (it becomes ``mean(W)``); a constant
full-precision channel has standard deviation 0.

Activations are quantized per tensor: ``"clamp"`` (DoReFa / Any-Precision: ``round(clamp(x, 0, 1)
· n)/n``, or ``[−1, 1]`` with ``n = 2^{b−1} − 1`` when signed) or ``"lsq"`` (a learned step,
unsigned ``[0, 2^b − 1]`` or signed ``[−2^{b−1}, 2^{b−1} − 1]``).

Everything is computed in float32 (float64 for float64 inputs) and returned in the input's dtype.
"""

from __future__ import annotations

import torch

FP_BITS = 32  # "full precision": no quantizer
MIN_BITS, MAX_BITS = 2, 8
WEIGHT_METHODS = ("dorefa", "lsq")
ACTIVATION_METHODS = ("clamp", "lsq")
CORRECTIONS = (None, "mean", "mean_var")


def compute_dtype(tensor: torch.Tensor) -> torch.dtype:
    """float64 for float64 tensors, float32 otherwise (half precision is computed in float32)."""
    return torch.float64 if tensor.dtype == torch.float64 else torch.float32


def ste_round(x: torch.Tensor) -> torch.Tensor:
    """``round(x)`` in the forward (half to even, exactly), the identity in the backward."""
    return torch.round(x).detach() + (x - x.detach())


def scale_gradient(x: torch.Tensor, scale: float | torch.Tensor) -> torch.Tensor:
    """``x`` in the forward (exactly: ``x·s + (x − x·s)`` can be an ulp off); its gradient
    multiplied by ``scale`` in the backward (LSQ)."""
    scaled = x * scale
    return x.detach() + (scaled - scaled.detach())


def lsq_range(bits: int, signed: bool = True) -> tuple[int, int]:
    """``(Q_n, Q_p)``: the integer codes run from ``−Q_n`` to ``Q_p``."""
    if signed:
        return 2 ** (bits - 1), 2 ** (bits - 1) - 1
    return 0, 2**bits - 1


def lsq_grad_scale(per_step: int, bits: int, signed: bool = True) -> float:
    """LSQ's step-size gradient scale ``1/sqrt(N·Q_p)`` for ``per_step`` values sharing a step."""
    if per_step < 1:
        raise ValueError(f"the values sharing a step must be at least 1, got {per_step}")
    _, q_p = lsq_range(bits, signed)
    return float((per_step * q_p) ** -0.5)


def lsq_init_step(values: torch.Tensor, bits: int, signed: bool = True, dim=None) -> torch.Tensor:
    """LSQ's initial step ``2·mean|v|/sqrt(Q_p)`` (over ``dim``, or all of ``values``)."""
    _, q_p = lsq_range(bits, signed)
    mean_abs = values.detach().abs().mean() if dim is None else values.detach().abs().mean(dim)
    return (2 * mean_abs / q_p**0.5).clamp_min(torch.finfo(torch.float32).tiny)


def _masked_sqrt(variance: torch.Tensor, positive: torch.Tensor) -> torch.Tensor:
    """``sqrt(variance)`` where ``positive``, 1 elsewhere, with finite gradients everywhere."""
    return torch.where(positive, variance, torch.ones_like(variance)).sqrt()


def _spread(rows: torch.Tensor) -> torch.Tensor:
    """Whether a row holds two different values (``(C, 1)`` bool); exact, unlike ``var > 0``."""
    return rows.amax(1, keepdim=True) > rows.amin(1, keepdim=True)


def correction_terms(
    q: torch.Tensor, w: torch.Tensor, correction: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(mean_q, ratio, mean_w)``, each ``(C, 1)``: the corrected rows are
    ``(q − mean_q)·ratio + mean_w``."""
    mean_w, mean_q = w.mean(1, keepdim=True), q.mean(1, keepdim=True)
    if correction == "mean":
        return mean_q, torch.ones_like(mean_q), mean_w
    var_q = (q - mean_q).square().mean(1, keepdim=True)
    var_w = (w - mean_w).square().mean(1, keepdim=True)
    spread_q, spread_w = _spread(q.detach()), _spread(w.detach())
    std_w = torch.where(spread_w, _masked_sqrt(var_w, spread_w), torch.zeros_like(var_w))
    ratio = torch.where(spread_q, std_w / _masked_sqrt(var_q, spread_q), torch.ones_like(var_q))
    return mean_q, ratio, mean_w


def bias_correct(q: torch.Tensor, w: torch.Tensor, correction: str | None) -> torch.Tensor:
    """Realign each row of ``q`` to the mean (and standard deviation) of the row of ``w``."""
    if correction is None:
        return q
    mean_q, ratio, mean_w = correction_terms(q, w, correction)
    if correction == "mean":
        return q - mean_q + mean_w
    return (q - mean_q) * ratio + mean_w


def dorefa_weight(w: torch.Tensor, bits: int) -> torch.Tensor:
    """Per-channel DoReFa values ``E·(2j/n − 1)`` of a ``(C, K)`` weight."""
    levels = 2**bits - 1
    t = torch.tanh(w)
    peak = t.abs().amax(1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
    code = ste_round((t / peak + 1.0) * 0.5 * levels)
    scale = w.abs().mean(1, keepdim=True).detach()
    return scale * (code * (2.0 / levels) - 1.0)


def lsq_weight(w: torch.Tensor, step: torch.Tensor, bits: int, grad_scale: float) -> torch.Tensor:
    """Per-channel LSQ values of a ``(C, K)`` weight with steps ``(C,)``."""
    q_n, q_p = lsq_range(bits)
    s = scale_gradient(step.to(w.dtype).view(-1, 1), grad_scale)
    return ste_round((w / s).clamp(-q_n, q_p)) * s


def fake_quant_weight_reference(
    weight: torch.Tensor,
    bits: int,
    method: str = "dorefa",
    step: torch.Tensor | None = None,
    correction: str | None = "mean_var",
    grad_scale: float | None = None,
) -> torch.Tensor:
    """Fake-quantized ``(C, K)`` weight (see the module docstring); differentiable in ``weight``
    and, for LSQ, in ``step (C,)``. ``grad_scale`` defaults to LSQ's ``1/sqrt(K·Q_p)``."""
    w = weight.to(compute_dtype(weight))
    if method == "dorefa":
        q = dorefa_weight(w, bits)
    else:
        scale = lsq_grad_scale(w.shape[1], bits) if grad_scale is None else grad_scale
        q = lsq_weight(w, step, bits, scale)
    return bias_correct(q, w, correction).to(weight.dtype)


def fake_quant_activation_reference(
    x: torch.Tensor,
    bits: int,
    method: str = "clamp",
    step: torch.Tensor | None = None,
    signed: bool = False,
    grad_scale: float | None = None,
) -> torch.Tensor:
    """Fake-quantized activation (see the module docstring); differentiable in ``x`` and, for
    LSQ, in the scalar ``step (1,)``. ``grad_scale`` defaults to ``1/sqrt(numel·Q_p)`` (the
    layers pass LSQ's ``1/sqrt(N_F·Q_p)`` with ``N_F`` the features of one example)."""
    v = x.to(compute_dtype(x))
    if method == "clamp":
        low, levels = (-1.0, 2 ** (bits - 1) - 1) if signed else (0.0, 2**bits - 1)
        return (ste_round(v.clamp(low, 1.0) * levels) / levels).to(x.dtype)
    q_n, q_p = lsq_range(bits, signed)
    scale = lsq_grad_scale(v.numel(), bits, signed) if grad_scale is None else grad_scale
    s = scale_gradient(step.to(v.dtype).reshape(()), scale)
    return (ste_round((v / s).clamp(-q_n, q_p)) * s).to(x.dtype)
