"""Headless plots for ``reproduce`` reports (matplotlib's Agg canvas; no display, no pyplot).

Needs the ``report`` extra (``pip install 'kernels-common[report]'``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kernels_common.cli import atomic_file

_MISSING = "matplotlib is needed for plots: pip install 'kernels-common[report]'"


def new_figure(width: float = 6.0, height: float = 4.0) -> Any:
    """A matplotlib ``Figure`` drawn on the Agg canvas, independent of any GUI backend."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError(_MISSING) from error
    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def save_figure(figure: Any, path: str | Path, *, dpi: int = 120) -> Path:
    """Save ``figure`` as PNG (parent folders created) and return the path."""
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ValueError(f"figures are saved as PNG, got {path.name!r}")
    with atomic_file(path) as temporary:  # a failed save leaves no truncated PNG
        figure.savefig(temporary, dpi=dpi)
    return path


def plot_curves(
    curves: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    path: str | Path,
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    logx: bool = False,
    logy: bool = False,
    markers: bool = False,
) -> Path:
    """One line per named ``(x, y)`` curve (loss curves, scaling plots), saved as PNG.

    Example:
        >>> import tempfile, pathlib
        >>> out = pathlib.Path(tempfile.mkdtemp()) / "loss.png"
        >>> plot_curves(
        ...     {"a": ([1, 2], [3.0, 2.5])}, out, title="t", xlabel="step", ylabel="loss"
        ... ).exists()
        True
    """
    if not curves:
        raise ValueError("plot_curves needs at least one curve")
    figure = new_figure()
    axes = figure.add_subplot()
    for label, (x, y) in curves.items():
        if len(x) != len(y):
            raise ValueError(f"curve {label!r}: {len(x)} x values but {len(y)} y values")
        axes.plot(x, y, label=label, marker="o" if markers else None)
    axes.set(title=title, xlabel=xlabel, ylabel=ylabel)
    if logx:
        axes.set_xscale("log")
    if logy:
        axes.set_yscale("log")
    axes.grid(alpha=0.3)
    axes.legend()
    return save_figure(figure, path)
