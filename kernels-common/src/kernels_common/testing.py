"""The kernel test contract: one reference, one implementation, the same inputs and gradients.

:func:`assert_kernel_matches` runs a reference and an implementation on the same seeded inputs,
pushes the same random output gradient through both, and compares the outputs and every input
gradient with per-dtype tolerances, reporting the largest absolute and relative error of each.
While the implementation runs, freshly allocated ``torch.empty`` buffers are filled with NaN
(:func:`poison_uninitialized`), so a kernel that leaves part of its output unwritten fails instead
of passing on whatever memory happened to hold.

Example:
    >>> import functools, torch
    >>> from kernels_common.swiglu import swiglu
    >>> def make_inputs(gen):
    ...     a = torch.randn(4, 33, generator=gen, requires_grad=True)
    ...     return {"a": a, "b": torch.randn(4, 33, generator=gen, requires_grad=True)}
    >>> report = assert_kernel_matches(
    ...     functools.partial(swiglu, backend="reference"),
    ...     lambda a, b: torch.nn.functional.silu(a) * b,
    ...     make_inputs,
    ... )
    >>> report.ok
    True
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True)
class Tolerance:
    """``|actual - expected| <= atol + rtol * |expected|`` elementwise."""

    atol: float
    rtol: float

    def __post_init__(self) -> None:
        if not (self.atol >= 0 and self.rtol >= 0):
            raise ValueError(
                f"tolerances must be non-negative, got atol={self.atol} rtol={self.rtol}"
            )


# torch.testing.assert_close's defaults: the rtol of each low-precision dtype is a few units of its
# rounding (bf16 keeps 8 significant bits, 2**-8 = 3.9e-3; fp16 11 bits, 2**-11 = 4.9e-4), which is
# what separates a correct low-precision kernel from a float32 reference. Kernels that reorder long
# reductions pass their own, justified, tolerances.
DEFAULT_TOLERANCES: Mapping[torch.dtype, Tolerance] = {
    torch.float64: Tolerance(atol=1e-7, rtol=1e-7),
    torch.float32: Tolerance(atol=1e-5, rtol=1.3e-6),
    torch.float16: Tolerance(atol=1e-5, rtol=1e-3),
    torch.bfloat16: Tolerance(atol=1e-5, rtol=1.6e-2),
}


@dataclass(frozen=True)
class TensorComparison:
    """How one output or gradient of the implementation compares with the reference.

    ``tolerance_used`` is the largest ``|actual - expected| / (atol + rtol * |expected|)``: the
    quantity that decides pass (``<= 1``) or fail, and how close a passing kernel came to failing.
    ``max_rel_error`` is dominated by elements whose expected value is near zero; read it with
    ``max_abs_error``.
    """

    name: str
    dtype: torch.dtype
    max_abs_error: float
    max_rel_error: float
    tolerance_used: float
    mismatched: int
    numel: int
    tolerance: Tolerance

    @property
    def ok(self) -> bool:
        return self.mismatched == 0

    def row(self) -> str:
        status = "ok" if self.ok else f"FAIL ({self.mismatched}/{self.numel} elements)"
        return (
            f"{self.name:<24} {str(self.dtype).removeprefix('torch.'):<9} "
            f"max_abs={self.max_abs_error:.3e} max_rel={self.max_rel_error:.3e} "
            f"used={self.tolerance_used:.2f} of (atol={self.tolerance.atol:.1e}, "
            f"rtol={self.tolerance.rtol:.1e}) {status}"
        )


@dataclass(frozen=True)
class KernelReport:
    """Every comparison made by :func:`assert_kernel_matches`."""

    comparisons: tuple[TensorComparison, ...]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.comparisons)

    def __getitem__(self, name: str) -> TensorComparison:
        for comparison in self.comparisons:
            if comparison.name == name:
                return comparison
        raise KeyError(f"no comparison named {name!r}; have {[c.name for c in self.comparisons]}")

    def __str__(self) -> str:
        return "\n".join(c.row() for c in self.comparisons)


def compare_tensors(
    name: str, actual: torch.Tensor, expected: torch.Tensor, tolerance: Tolerance
) -> TensorComparison:
    """Compare ``actual`` with ``expected`` (any dtypes, same shape) in float64.

    A NaN or infinity in ``actual`` where ``expected`` is finite counts as a mismatch with infinite
    error; NaN in both places matches.
    """
    if actual.shape != expected.shape:
        raise AssertionError(
            f"{name}: shape {tuple(actual.shape)} != reference {tuple(expected.shape)}"
        )
    a = actual.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    both_nan = a.isnan() & e.isnan()
    same_inf = a.isinf() & e.isinf() & (a == e)
    diff = (
        (a - e)
        .abs()
        .masked_fill(both_nan | same_inf, 0.0)
        .nan_to_num(nan=math.inf, posinf=math.inf)
    )
    allowed = tolerance.atol + tolerance.rtol * e.abs().nan_to_num(nan=0.0, posinf=0.0)
    bad = diff > allowed
    used = torch.where(diff == 0, torch.zeros_like(diff), diff / allowed)
    rel = (diff / e.abs().clamp_min(torch.finfo(torch.float64).tiny)).masked_fill(
        both_nan | same_inf, 0.0
    )
    rel = rel.nan_to_num(nan=math.inf)
    return TensorComparison(
        name=name,
        dtype=actual.dtype,
        max_abs_error=float(diff.max()) if diff.numel() else 0.0,
        max_rel_error=float(rel.max()) if rel.numel() else 0.0,
        tolerance_used=float(used.max()) if used.numel() else 0.0,
        mismatched=int(bad.sum()),
        numel=diff.numel(),
        tolerance=tolerance,
    )


def rebuild_sequence(value: tuple | list, items: Iterable[Any]) -> tuple | list:
    """A tuple, list or NamedTuple of the same type as ``value`` holding ``items``."""
    if hasattr(value, "_fields"):  # NamedTuple: fields are positional arguments
        return type(value)(*items)
    return type(value)(items)


def flatten_tensors(value: Any, prefix: str = "out") -> list[tuple[str, torch.Tensor | None]]:
    """Name every tensor (or ``None``) in a nest of tuples, lists and dicts: ``out[1][0]``..."""
    if value is None or isinstance(value, torch.Tensor):
        return [(prefix, value)]
    if isinstance(value, tuple | list):
        return [item for i, v in enumerate(value) for item in flatten_tensors(v, f"{prefix}[{i}]")]
    if isinstance(value, Mapping):
        return [item for k, v in value.items() for item in flatten_tensors(v, f"{prefix}[{k!r}]")]
    raise TypeError(
        f"{prefix}: outputs must be tensors or tuples/lists/dicts of them, got {type(value)}"
    )


_EMPTY_FACTORIES = ("empty", "empty_like", "empty_strided")


def _poison(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.is_floating_point() or tensor.is_complex():
        return tensor.fill_(math.nan)
    if tensor.dtype == torch.bool:
        return tensor.fill_(True)
    return tensor.fill_(torch.iinfo(tensor.dtype).max)


@contextlib.contextmanager
def poison_uninitialized() -> Iterator[None]:
    """Fill every buffer made by ``torch.empty*`` / ``Tensor.new_empty`` with NaN while active.

    Integer buffers get their dtype's maximum and booleans ``True``. Kernels that write every
    element of their outputs are unaffected; a kernel that skips some (a masked tail, an unlaunched
    block) now produces NaN there instead of stale memory that may happen to look right.
    """
    originals = {name: getattr(torch, name) for name in _EMPTY_FACTORIES}
    original_new_empty = torch.Tensor.new_empty

    def poisoned(factory: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def make(*args: Any, **kwargs: Any) -> torch.Tensor:
            out = factory(*args, **kwargs)
            with torch.no_grad():
                return _poison(out)

        return make

    try:
        for name, factory in originals.items():
            setattr(torch, name, poisoned(factory))
        torch.Tensor.new_empty = poisoned(original_new_empty)  # type: ignore[method-assign]
        yield
    finally:
        for name, factory in originals.items():
            setattr(torch, name, factory)
        torch.Tensor.new_empty = original_new_empty  # type: ignore[method-assign]


def _prepare(
    value: Any, name: str, dtype: torch.dtype | None, leaves: dict[str, torch.Tensor]
) -> Any:
    """A fresh leaf copy of ``value`` (tensors inside tuples, lists and dicts too), floating tensors
    promoted to at least ``dtype``; copies that need gradients are collected in ``leaves``."""
    if isinstance(value, torch.Tensor):
        copy = value.detach().clone()
        if dtype is not None and copy.is_floating_point():
            copy = copy.to(torch.promote_types(copy.dtype, dtype))  # only ever upcast
        if value.requires_grad:
            leaves[name] = copy.requires_grad_(True)
        return copy
    if isinstance(value, tuple | list):
        return rebuild_sequence(
            value, (_prepare(v, f"{name}[{i}]", dtype, leaves) for i, v in enumerate(value))
        )
    if isinstance(value, Mapping):
        return {k: _prepare(v, f"{name}[{k!r}]", dtype, leaves) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class _Run:
    outputs: list[tuple[str, torch.Tensor | None]]
    differentiable: tuple[str, ...]
    leaves: dict[str, torch.Tensor]
    grads: dict[str, torch.Tensor | None]


def _run(
    fn: Callable[..., Any],
    inputs: Mapping[str, Any],
    dtype: torch.dtype | None,
    grad_seed: int | None,
) -> _Run:
    leaves: dict[str, torch.Tensor] = {}
    prepared = {name: _prepare(value, name, dtype, leaves) for name, value in inputs.items()}
    outputs = flatten_tensors(fn(**prepared), "out")
    differentiable = [(n, o) for n, o in outputs if o is not None and o.requires_grad]
    grads: dict[str, torch.Tensor | None] = {}
    if grad_seed is not None:
        if not leaves:
            raise ValueError("check_grad=True but no input requires grad; mark them or pass False")
        if not differentiable:
            raise AssertionError(
                f"inputs {sorted(leaves)} require grad but no output of {fn!r} does: the "
                "implementation is not differentiable"
            )
        generator = torch.Generator().manual_seed(grad_seed)
        grad_outputs = [
            torch.randn(o.shape, generator=generator, dtype=torch.float32).to(o.device, o.dtype)
            for _, o in differentiable
        ]
        computed = torch.autograd.grad(
            [o for _, o in differentiable], list(leaves.values()), grad_outputs, allow_unused=True
        )
        grads = dict(zip(leaves, computed, strict=True))
    return _Run(outputs, tuple(n for n, _ in differentiable), leaves, grads)


def device_for_backend(backend: Any) -> str:
    """Where a kernel test puts its inputs for ``backend``: ``"cuda"`` for compiled Triton (it
    refuses CPU tensors), ``"cpu"`` for the interpreter and the reference path."""
    return "cuda" if getattr(backend, "value", backend) == "triton" else "cpu"


def assert_kernel_matches(
    reference: Callable[..., Any],
    implementation: Callable[..., Any],
    inputs: Mapping[str, Any] | Callable[[torch.Generator], Mapping[str, Any]],
    *,
    seed: int = 0,
    check_grad: bool = True,
    reference_dtype: torch.dtype | None = torch.float32,
    tolerances: Mapping[torch.dtype, Tolerance] | Tolerance | None = None,
    grad_tolerances: Mapping[torch.dtype, Tolerance] | Tolerance | None = None,
    poison: bool = True,
) -> KernelReport:
    """Check that ``implementation`` computes the same function as ``reference``.

    Args:
        reference: the oracle, called as ``reference(**inputs)``.
        implementation: the code under test, called the same way.
        inputs: keyword arguments for both, or a function of a seeded ``torch.Generator`` that
            makes them. Tensors, also inside tuples, lists and dicts (a recurrent state), are
            copied for each side; those with ``requires_grad=True`` get their gradients compared
            (named like ``grad[state[0]]``); non-tensor values pass through unchanged.
        seed: seeds the input generator and the random output gradient.
        check_grad: also compare the gradients of every ``requires_grad`` input (at least one
            input must require grad).
        reference_dtype: the reference runs on floating inputs promoted to at least this dtype
            (float32 by default, so a bf16 kernel is judged against an accurate answer; float64
            inputs stay float64); ``None`` keeps the inputs' dtypes.
        tolerances: for the outputs, per dtype of the implementation's tensor, or one for all;
            defaults to :data:`DEFAULT_TOLERANCES`.
        grad_tolerances: the same for the gradients; defaults to ``tolerances``.
        poison: fill ``torch.empty`` buffers with NaN while the implementation runs.

    Returns:
        The :class:`KernelReport` (every comparison passed).

    Raises:
        AssertionError: any output or gradient differs beyond tolerance, or the two sides return
            different structures or differentiable outputs; the message lists the errors of every
            compared tensor.
        ValueError: ``check_grad`` with no input requiring grad, or no tolerance for a dtype.
    """
    if callable(inputs):
        inputs = inputs(torch.Generator().manual_seed(seed))
    grad_seed = seed + 1 if check_grad else None

    expected = _run(reference, inputs, reference_dtype, grad_seed)
    with poison_uninitialized() if poison else contextlib.nullcontext():
        actual = _run(implementation, inputs, None, grad_seed)

    actual_names = [n for n, _ in actual.outputs]
    expected_names = [n for n, _ in expected.outputs]
    if actual_names != expected_names:
        raise AssertionError(
            f"output structure differs: implementation {actual_names}, reference {expected_names}"
        )
    if check_grad and actual.differentiable != expected.differentiable:
        raise AssertionError(
            f"differentiable outputs differ: implementation {list(actual.differentiable)}, "
            f"reference {list(expected.differentiable)}"
        )

    def tolerance_for(spec: Mapping[torch.dtype, Tolerance] | Tolerance | None, dtype: torch.dtype):
        if isinstance(spec, Tolerance):
            return spec
        table = DEFAULT_TOLERANCES if spec is None else spec
        if dtype not in table:
            raise ValueError(f"no tolerance for dtype {dtype}; give one in the tolerances mapping")
        return table[dtype]

    comparisons: list[TensorComparison] = []
    for (name, actual_out), (_, expected_out) in zip(actual.outputs, expected.outputs, strict=True):
        if actual_out is None or expected_out is None:
            if actual_out is not expected_out:
                raise AssertionError(f"{name}: one side returned None, the other a tensor")
            continue
        comparisons.append(
            compare_tensors(
                name, actual_out, expected_out, tolerance_for(tolerances, actual_out.dtype)
            )
        )
    grad_spec = tolerances if grad_tolerances is None else grad_tolerances
    # the implementation ran on copies in the inputs' own dtypes: its leaves name the gradients
    for name, leaf in actual.leaves.items() if check_grad else ():
        zeros = torch.zeros_like(leaf, requires_grad=False)
        actual_grad, expected_grad = actual.grads[name], expected.grads[name]
        comparisons.append(
            compare_tensors(
                f"grad[{name}]",
                zeros if actual_grad is None else actual_grad,
                zeros if expected_grad is None else expected_grad,
                tolerance_for(grad_spec, leaf.dtype),
            )
        )

    report = KernelReport(tuple(comparisons))
    if not report.ok:
        raise AssertionError(f"implementation differs from the reference:\n{report}")
    return report


_PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def markdown_python_blocks(path: str | Path) -> list[str]:
    """The ```` ```python ```` code blocks of a Markdown file, for tests that run README examples.

    Raises:
        ValueError: the file has no Python block (a README example test must test something).
    """
    blocks = _PYTHON_BLOCK.findall(Path(path).read_text())
    if not blocks:
        raise ValueError(f"{path} has no ```python code block")
    return blocks


def run_markdown_python(path: str | Path) -> dict[str, Any]:
    """Run a Markdown file's ```` ```python ```` blocks in order, in one namespace (as a reader
    would), and return that namespace; tracebacks point into the file.

    Raises:
        ValueError: the file has no Python block.
    """
    namespace: dict[str, Any] = {"__name__": "readme"}
    for block in markdown_python_blocks(path):
        exec(compile(block, str(path), "exec"), namespace)
    return namespace


def import_footprint(code: str, watch: Iterable[str] = ("triton",)) -> dict[str, bool]:
    """Run ``code`` (imports, a call or two) in a fresh interpreter and report what it loaded.

    For tests that a package stays cheap to import: returns ``{module: imported}`` for every name
    in ``watch``, plus ``"cuda"``: whether CUDA got initialised. ``TRITON_INTERPRET`` is removed
    from the child's environment, so the result is what a user's import does, not the test
    session's.

    Example:
        >>> import_footprint("import colorsys", watch=["colorsys", "triton"])
        {'colorsys': True, 'triton': False, 'cuda': False}
    """
    modules = list(watch)
    probe = (
        f"{code}\nimport sys\n"  # sys is always loaded; json only after the check
        f"found = {{name: name in sys.modules for name in {modules!r}}}\n"
        "torch = sys.modules.get('torch')\n"
        "found['cuda'] = bool(torch is not None and torch.cuda.is_initialized())\n"
        "import json\n"
        "print(json.dumps(found))"
    )
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"the import probe failed:\n{result.stderr}")
    return json.loads(result.stdout.splitlines()[-1])


def _tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*"))}


def assert_refused(
    main: Callable[[list[str]], int | None],
    argv: list[str],
    capsys: Any,
    program: str,
    *expect: str,
    unchanged: Path | None = None,
    other_lines: Callable[[str], bool] | None = None,
) -> str:
    """Run a command line's ``main(argv)`` and check that it refused the input the
    :mod:`kernels_common.cli` way; return the error line.

    It must exit with code 2 (from the parser or from ``cli.run``) and write exactly one stderr
    line, ``<program>[ <sub-command>]: error: …``, containing every ``expect`` string, with no
    traceback. ``unchanged``: a folder in which nothing may be created, removed or resized.
    ``other_lines``: stderr lines to pass over (a progress bar drawn before a late refusal).
    """
    before = None if unchanged is None else _tree(unchanged)
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exit_info:  # the parser's refusals exit from parse_args
        code = exit_info.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    if other_lines is not None:
        lines = [line for line in lines if not other_lines(line)]
    assert code == 2, err
    assert "Traceback" not in err, err
    assert len(lines) == 1, err
    assert lines[0].startswith(program), lines[0]
    assert ": error: " in lines[0], lines[0]
    for text in expect:
        assert text in lines[0], lines[0]
    if before is not None:
        assert _tree(unchanged) == before, "a refused command changed files"
    return lines[0]
