"""The 16 two-input Boolean functions, their real-valued relaxations, and their affine form.

Gate ``i`` follows difflogic's order, which is also its truth table read as a 4-bit number:
``i = 8·f(0,0) + 4·f(0,1) + 2·f(1,0) + 1·f(1,1)``.

Every relaxed gate is affine in ``{1, a, b, ab}``:
``f(a, b) = c0 + c1·a + c2·b + c3·ab`` with
``c0 = f00``, ``c1 = f10 − f00``, ``c2 = f01 − f00``, ``c3 = f00 − f01 − f10 + f11``,
so a mixture of gates (softmax or one-hot weights ``p``, shape ``(N, 16)``) is the affine map with
coefficients ``p @ GATE_COEFFS`` (shape ``(N, 4)``).
"""

from __future__ import annotations

import torch

__all__ = [
    "GATE_COEFFS",
    "GATE_NAMES",
    "GATE_TRUTH_TABLES",
    "PASS_THROUGH_OR_CONSTANT",
    "gate_coefficients",
    "gate_depends_on",
    "relaxed_gate",
]

GATE_NAMES: tuple[str, ...] = (
    "0",
    "A and B",
    "A and not B",
    "A",
    "not A and B",
    "B",
    "A xor B",
    "A or B",
    "not (A or B)",
    "not (A xor B)",
    "not B",
    "A or not B",
    "not A",
    "not A or B",
    "not (A and B)",
    "1",
)

# truth tables: GATE_TRUTH_TABLES[i] = (f(0,0), f(0,1), f(1,0), f(1,1))
GATE_TRUTH_TABLES: tuple[tuple[int, int, int, int], ...] = tuple(
    ((i >> 3) & 1, (i >> 2) & 1, (i >> 1) & 1, i & 1) for i in range(16)
)

# gates whose discretized output ignores at least one input: constants 0, 1 and A, B, not A, not B
PASS_THROUGH_OR_CONSTANT: frozenset[int] = frozenset({0, 3, 5, 10, 12, 15})


def _coefficients(table: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    f00, f01, f10, f11 = table
    return (f00, f10 - f00, f01 - f00, f00 - f01 - f10 + f11)


# (16, 4) integer-valued float32: row i holds (c0, c1, c2, c3) of gate i
GATE_COEFFS: torch.Tensor = torch.tensor(
    [_coefficients(t) for t in GATE_TRUTH_TABLES], dtype=torch.float32
)


def gate_coefficients(weights: torch.Tensor) -> torch.Tensor:
    """Affine coefficients of a mixture of gates.

    Args:
        weights: ``(N, 16)`` gate probabilities (softmax) or one-hot rows, floating.

    Returns:
        ``(N, 4)`` coefficients ``(c0, c1, c2, c3)`` in ``weights``' dtype; differentiable.
    """
    return weights @ GATE_COEFFS.to(device=weights.device, dtype=weights.dtype)


def gate_depends_on(gate: int) -> tuple[bool, bool]:
    """Whether the discretized gate's output depends on input A and on input B."""
    f00, f01, f10, f11 = GATE_TRUTH_TABLES[gate]
    return (f00 != f10 or f01 != f11, f00 != f01 or f10 != f11)


def relaxed_gate(gate: int, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Gate ``gate``'s real-valued relaxation, written out term by term (the plain reference).

    ``a``, ``b`` broadcast against each other, values in ``[0, 1]``.
    """
    formulas = (
        lambda: torch.zeros_like(a * b),
        lambda: a * b,
        lambda: a - a * b,
        lambda: a + 0 * b,
        lambda: b - a * b,
        lambda: b + 0 * a,
        lambda: a + b - 2 * a * b,
        lambda: a + b - a * b,
        lambda: 1 - (a + b - a * b),
        lambda: 1 - (a + b - 2 * a * b),
        lambda: 1 - b + 0 * a,
        lambda: 1 - b + a * b,
        lambda: 1 - a + 0 * b,
        lambda: 1 - a + a * b,
        lambda: 1 - a * b,
        lambda: torch.ones_like(a * b),
    )
    if not 0 <= gate < 16:
        raise ValueError(f"gate must be in 0..15, got {gate}")
    return formulas[gate]()
