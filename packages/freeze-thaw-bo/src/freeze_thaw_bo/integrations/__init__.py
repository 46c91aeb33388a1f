"""Adapters that run freeze-thaw BO inside other HPO libraries.

Each adapter lives in its own module and imports its library only when that module is imported, so
`import freeze_thaw_bo` never imports Optuna, Syne Tune or Ray:

- `freeze_thaw_bo.integrations.optuna`: `CFBOPruner` and `CFBOStudyStopper`, CFBO's stopping rule
  for an Optuna study (Optuna cannot resume a pruned trial, so there is no freeze/thaw).
  Needs `pip install freeze-thaw-bo[optuna]`.
- `freeze_thaw_bo.integrations.syne_tune`: `FreezeThawScheduler`, a pause/resume Syne Tune
  scheduler driven by any `FreezeThawOptimizer`. Needs `pip install freeze-thaw-bo[syne-tune]`.
- `freeze_thaw_bo.integrations.ray_tune`: `FreezeThawScheduler` (a Ray Tune `TrialScheduler`) and
  its companion searcher, driven by any `FreezeThawOptimizer`, resuming paused trials from their
  checkpoints. Needs `pip install freeze-thaw-bo[ray]`.
"""

from __future__ import annotations

__all__: list[str] = []
