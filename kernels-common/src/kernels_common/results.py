"""The ``results.json`` every ``reproduce`` command writes: the paper's claims next to measurements.

A :class:`Claim` states what the paper reports, what was measured here, and the direction that
counts as agreeing (``at_least`` / ``at_most`` a threshold, or ``within`` a tolerance of a target);
its pass/fail is computed, never typed in. :class:`ReproduceResults` gathers the claims, figures
and settings of one run and saves/loads them with schema validation.

Example:
    >>> claim = Claim(
    ...     name="throughput vs non-DP",
    ...     paper="FlashDP keeps 90% of non-DP throughput",
    ...     measured=0.93,
    ...     unit="ratio",
    ...     direction="at_least",
    ...     threshold=0.9,
    ...     paper_value=0.9,
    ... )
    >>> claim.passed
    True
"""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from kernels_common.cli import atomic_file

SCHEMA_VERSION = 1
RESULTS_FILE = "results.json"

Direction = Literal["at_least", "at_most", "within"]

_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def encode_float(value: float) -> float | str:
    """A float as JSON can hold it: non-finite values become ``"nan"``, ``"inf"``, ``"-inf"``."""
    if math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def decode_float(value: float | str) -> float:
    """Inverse of :func:`encode_float`."""
    if isinstance(value, str):
        if value not in _NON_FINITE:
            raise ValueError(f"not a number: {value!r}")
        return _NON_FINITE[value]
    return value


_DIRECTIONS = ("at_least", "at_most", "within")


@dataclass(frozen=True)
class Claim:
    """One claim of the paper and what this run measured for it.

    Attributes:
        name: short label (table row).
        paper: the claim in words, as the paper makes it.
        measured: the value measured here.
        unit: unit of ``measured`` (``"nats"``, ``"ratio"``, ``"%"``...).
        direction: ``"at_least"``: passes if ``measured >= threshold``; ``"at_most"``: if
            ``measured <= threshold``; ``"within"``: if ``|measured - threshold| <= tolerance``.
        threshold: the bound, or the target for ``"within"``.
        tolerance: allowed distance for ``"within"`` (required there, unused otherwise).
        paper_value: the paper's own number, when it gives one, shown beside the measurement.
    """

    name: str
    paper: str
    measured: float
    unit: str
    direction: Direction
    threshold: float
    tolerance: float | None = None
    paper_value: float | None = None

    def __post_init__(self) -> None:
        if not self.name or not self.paper:
            raise ValueError("a claim needs a name and the paper's statement")
        if self.direction not in _DIRECTIONS:
            raise ValueError(f"direction must be one of {_DIRECTIONS}, got {self.direction!r}")
        if self.direction == "within" and (self.tolerance is None or self.tolerance < 0):
            raise ValueError("direction 'within' needs a non-negative tolerance")
        if self.direction != "within" and self.tolerance is not None:
            raise ValueError(
                f"tolerance is only used with direction 'within', not {self.direction!r}"
            )
        for label, value in (("measured", self.measured), ("threshold", self.threshold)):
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise TypeError(f"{label} must be a number, got {type(value).__name__}")
        # the measurement may be NaN or infinite (a diverged run fails its claim), the bounds not
        for label, value in (
            ("threshold", self.threshold),
            ("tolerance", self.tolerance),
            ("paper_value", self.paper_value),
        ):
            if value is not None and not math.isfinite(value):
                raise ValueError(f"{label} must be finite, got {value}")

    @property
    def passed(self) -> bool:
        """Whether the measurement agrees with the claim (a NaN measurement never does)."""
        if math.isnan(self.measured):
            return False
        if self.direction == "at_least":
            return self.measured >= self.threshold
        if self.direction == "at_most":
            return self.measured <= self.threshold
        assert self.tolerance is not None
        return abs(self.measured - self.threshold) <= self.tolerance

    @property
    def expectation(self) -> str:
        """The pass condition in words: ``>= 0.9``, ``<= 1.15``, ``3.2 ± 0.1``."""
        if self.direction == "at_least":
            return f">= {self.threshold:g}"
        if self.direction == "at_most":
            return f"<= {self.threshold:g}"
        return f"{self.threshold:g} ± {self.tolerance:g}"


@dataclass(frozen=True)
class ReproduceResults:
    """Everything one ``reproduce`` run reports.

    Attributes:
        package: distribution name (``"flashdp"``).
        title: the experiment in a line.
        claims: the claims checked.
        figures: paths of the plots, relative to the results directory.
        summary: a few sentences of Markdown: what was run, on which data, and what it shows.
        quick: whether this was the ``--quick`` run.
        settings: the run's configuration (sizes, seeds, steps), JSON-serialisable.
        elapsed_s: wall-clock time of the run.
        created: ISO timestamp, filled in when omitted.
    """

    package: str
    title: str
    claims: tuple[Claim, ...]
    figures: tuple[str, ...] = ()
    summary: str = ""
    quick: bool = True
    settings: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float | None = None
    created: str = field(
        default_factory=lambda: dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    )

    def __post_init__(self) -> None:
        if not self.package or not self.title:
            raise ValueError("results need the package name and a title")
        object.__setattr__(self, "claims", tuple(self.claims))
        names = [claim.name for claim in self.claims]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"claim names must be unique; repeated: {duplicates}")
        object.__setattr__(self, "figures", tuple(str(f) for f in self.figures))
        if self.elapsed_s is not None and not math.isfinite(self.elapsed_s):
            raise ValueError(f"elapsed_s must be finite, got {self.elapsed_s}")
        try:
            json.dumps(self.settings, allow_nan=False)
        except (TypeError, ValueError) as error:
            raise ValueError(f"settings must be plain JSON (finite numbers): {error}") from error
        for figure in self.figures:
            if Path(figure).is_absolute() or ".." in Path(figure).parts:
                raise ValueError(
                    f"figure paths must be relative to the results directory: {figure!r}"
                )

    @property
    def passed(self) -> bool:
        return all(claim.passed for claim in self.claims)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["schema_version"] = SCHEMA_VERSION
        data["claims"] = [
            {
                **asdict(c),
                "measured": encode_float(c.measured),
                "passed": c.passed,
            }
            for c in self.claims
        ]
        data["passed"] = self.passed
        return data

    def save(self, directory: str | Path) -> Path:
        """Write ``results.json`` into ``directory`` (created if needed) and return its path."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        missing = [f for f in self.figures if not (directory / f).exists()]
        if missing:
            raise FileNotFoundError(
                f"figures listed in the results do not exist in {directory}: {missing}"
            )
        path = directory / RESULTS_FILE
        text = json.dumps(self.to_json(), indent=2, allow_nan=False) + "\n"
        with atomic_file(path) as temporary:  # a reader never sees half a results file
            temporary.write_text(text)
        return path

    @classmethod
    def load(cls, path: str | Path) -> ReproduceResults:
        """Read a ``results.json`` (or the directory holding one), validating its schema."""
        path = Path(path)
        if path.is_dir():
            path = path / RESULTS_FILE
        if not path.exists():
            raise FileNotFoundError(f"no results file at {path}")
        try:
            data = json.loads(path.read_text())
            version = data.pop("schema_version", None)
            if version != SCHEMA_VERSION:
                raise ValueError(f"schema_version {version!r}, expected {SCHEMA_VERSION}")
            stored_claims = data.pop("claims")
            stored_pass = [claim.pop("passed", None) for claim in stored_claims]
            stored_overall = data.pop("passed", None)
            claims = []
            for claim in stored_claims:
                claim["measured"] = decode_float(claim["measured"])
                claims.append(Claim(**claim))
            results = cls(claims=tuple(claims), **data)
        except (TypeError, KeyError, AttributeError, json.JSONDecodeError, ValueError) as error:
            raise ValueError(f"{path}: malformed results ({error})") from error
        for claim, stored in zip(results.claims, stored_pass, strict=True):
            if stored not in (None, claim.passed):
                raise ValueError(
                    f"{path}: stored pass/fail of {claim.name!r} disagrees with its values"
                )
        if stored_overall not in (None, results.passed):
            raise ValueError(f"{path}: stored overall pass/fail disagrees with its claims")
        return results
