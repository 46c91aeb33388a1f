"""``peft-zoo reproduce``: every method under one budget on SmolLM2-135M.

(a) domain adaptation to the fortunes corpus: held-out perplexity vs trainable parameters;
(b) generated arithmetic word problems: exact match; (c) noise robustness: (a) with 5% and 20% of
training texts corrupted; (d) forgetting: ShareGPT reply perplexity before and after (a).
Needs the ``reproduce`` extra.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from kernels_common import Claim, ReproduceResults
from kernels_common.cli import atomic_file, atomic_folder
from kernels_common.report import write_summary
from peft_zoo.data import arithmetic_problems, corrupt, lm_batch, qa_batch, sharegpt_replies
from peft_zoo.models import load_model
from peft_zoo.trainer import (
    METHODS,
    Learner,
    TrainSettings,
    build_learner,
    exact_match,
    perplexity,
    train,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Plan:
    """What one reproduce run does.

    Attributes:
        train: the shared budget and method settings.
        max_len, context_len: fortunes texts are cut to ``max_len`` tokens; the first
            ``context_len`` are context (no loss, and what prompt methods may summarise).
        train_texts, eval_texts, forget_texts: how many fortunes / ShareGPT texts are used.
        qa_train, qa_eval: arithmetic problems for training / exact match.
        qa_steps: optimizer steps on the arithmetic task (every method there gets the same).
        qa_max_value: operands of the arithmetic problems are drawn from ``[1, qa_max_value]``.
        qa_methods, noise_methods: methods run on (b) and (c); (a) and (d) run all.
        noise_fractions, noise_char_rate: share of corrupted training texts and per-character
            noise rate inside a corrupted text.
    """

    train: TrainSettings
    max_len: int
    context_len: int
    train_texts: int
    eval_texts: int
    forget_texts: int
    qa_train: int
    qa_eval: int
    qa_methods: tuple[str, ...]
    noise_methods: tuple[str, ...]
    qa_steps: int = 100
    qa_max_value: int = 50
    noise_fractions: tuple[float, ...] = (0.05, 0.2)
    noise_char_rate: float = 0.15
    model: str = "smollm2-135m"


QUICK = Plan(
    train=TrainSettings(steps=8, batch_size=4, num_virtual_tokens=16, ptmoe_rank=12),
    max_len=32,
    context_len=8,
    train_texts=400,
    eval_texts=16,
    forget_texts=8,
    qa_train=400,
    qa_eval=64,
    qa_methods=("prompt-tuning", "lora", "ptmoe"),
    noise_methods=("lora", "lope"),
    qa_steps=16,
    qa_max_value=9,
)
FULL = Plan(
    train=TrainSettings(steps=300, batch_size=8),
    max_len=64,
    context_len=8,
    train_texts=5000,
    eval_texts=200,
    forget_texts=64,
    qa_train=2000,
    qa_eval=200,
    qa_methods=METHODS,
    noise_methods=("full", "lora", "lope"),
    qa_steps=300,
    qa_max_value=20,
)


def _chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def run(out: str | Path, *, quick: bool = True, model_name: str | None = None) -> ReproduceResults:
    """Run the plan, write ``results.json``, ``summary.md`` and plots into ``out``."""
    from benchdata import fortunes_corpus

    started, cpu = time.perf_counter(), _CpuClock()
    plan = QUICK if quick else FULL
    if model_name is not None:
        plan = replace(plan, model=model_name)
    out = Path(out)
    torch.manual_seed(plan.train.seed)
    base, tok = load_model(plan.model)
    corpus = fortunes_corpus()
    train_texts = corpus.train[: plan.train_texts]
    lm = lambda texts: lm_batch(tok, texts, plan.max_len, plan.context_len)  # noqa: E731
    eval_batches = [lm(c) for c in _chunks(corpus.validation[: plan.eval_texts], 8)]
    forget = sharegpt_replies(plan.forget_texts)
    forget_batches = [lm(c) for c in _chunks(forget, 8)]
    problems = arithmetic_problems(
        plan.qa_train + plan.qa_eval, seed=plan.train.seed, max_value=plan.qa_max_value
    )
    qa_train, qa_eval = problems[: plan.qa_train], problems[plan.qa_train :]
    base_params = sum(p.numel() for p in base.parameters())
    cpu.lap("load")

    plain = Learner("base", base, None, 0)  # the untouched model (every run adapts a copy)
    base_ppl, base_forget = perplexity(plain, eval_batches), perplexity(plain, forget_batches)
    base_em = exact_match(plain, tok, qa_eval)
    logger.info(
        "base: fortunes ppl %.2f, ShareGPT ppl %.2f, EM %.3f", base_ppl, base_forget, base_em
    )
    cpu.lap("base evaluation")

    rows: dict[str, dict] = {}
    curves = {}

    def checkpoint() -> None:  # an interrupted run keeps what it measured, never half a file
        with atomic_file(out / "rows.json") as temporary:
            temporary.write_text(json.dumps(rows, indent=1))

    for method in METHODS:  # (a) + (d)
        t0 = time.perf_counter()
        learner = build_learner(method, copy.deepcopy(base), tok, plan.train)
        losses = train(learner, train_texts, lm, plan.train)
        rows[method] = {
            "trainable": learner.trainable,
            "fortunes_ppl": perplexity(learner, eval_batches),
            "sharegpt_ppl": perplexity(learner, forget_batches),
            "train_s": time.perf_counter() - t0,
        }
        curves[method] = (list(range(1, len(losses) + 1)), losses)
        if method in ("full", "nanoadam"):
            rows[method]["optimizer_state_bytes"] = _state_bytes(learner.optimizer)
        logger.info("(a) %s: %s", method, rows[method])
        checkpoint()
        del learner
    cpu.lap("(a)+(d) fortunes and forgetting")
    qa_settings = replace(plan.train, steps=plan.qa_steps)
    for method in plan.qa_methods:  # (b)
        learner = build_learner(method, copy.deepcopy(base), tok, qa_settings)
        train(learner, qa_train, lambda pairs: qa_batch(tok, pairs), qa_settings)
        rows[method]["arithmetic_em"] = exact_match(learner, tok, qa_eval)
        logger.info("(b) %s: EM %.3f", method, rows[method]["arithmetic_em"])
        checkpoint()
        del learner
    cpu.lap("(b) arithmetic")
    for fraction in plan.noise_fractions:  # (c)
        noisy = corrupt(train_texts, fraction, plan.noise_char_rate, seed=plan.train.seed)
        for method in plan.noise_methods:
            learner = build_learner(method, copy.deepcopy(base), tok, plan.train)
            train(learner, noisy, lm, plan.train)
            rows[method][f"noisy{round(100 * fraction)}_ppl"] = perplexity(learner, eval_batches)
            logger.info("(c) %s at %.0f%%: %s", method, 100 * fraction, rows[method])
            checkpoint()
            del learner

    cpu.lap("(c) noise")
    with atomic_folder(out) as folder:  # the plots, results.json and summary.md appear together
        return _finish(
            folder,
            plan,
            rows,
            curves,
            cpu,
            started,
            quick,
            base_params,
            (base_ppl, base_forget, base_em),
        )


def _finish(
    out: Path,
    plan: Plan,
    rows: dict,
    curves: dict,
    cpu: _CpuClock,
    started: float,
    quick: bool,
    base_params: int,
    base: tuple[float, float, float],
) -> ReproduceResults:
    base_ppl, base_forget, base_em = base
    figures = _plots(out, rows, curves, base_ppl)
    claims = _claims(plan, rows, base_params)
    summary = _summary(plan, rows, base_ppl, base_forget, base_em)
    results = ReproduceResults(
        package="peft-zoo",
        title="PT-MoE, CaPT, LoPE, NanoAdam vs full fine-tuning, LoRA, prompt tuning on SmolLM2",
        claims=claims,
        figures=figures,
        summary=summary,
        quick=quick,
        settings={
            "plan": {k: v for k, v in asdict(plan).items() if k != "train"},
            "train": asdict(plan.train),
            "base": {
                "fortunes_ppl": base_ppl,
                "sharegpt_ppl": base_forget,
                "arithmetic_em": base_em,
            },
            "rows": rows,
            "cpu_s": cpu.laps,
            "cpu_s_total": sum(cpu.laps.values()),
        },
        elapsed_s=time.perf_counter() - started,
    )
    results.save(out)
    write_summary(results, out, extra=_markdown(results, rows, plan))
    return results


class _CpuClock:
    """CPU time (``time.process_time``: all threads of this process) spent per phase; on a shared
    machine this is what a phase costs, whatever else runs."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._last = time.process_time()

    def lap(self, name: str) -> None:
        now = time.process_time()
        self.laps[name] = round(now - self._last, 1)
        self._last = now
        logger.info("CPU time of %s: %.0f s", name, self.laps[name])


def _state_bytes(optimizer: torch.optim.Optimizer) -> int:
    return sum(
        t.numel() * t.element_size()
        for state in optimizer.state.values()
        for key, t in state.items()
        if isinstance(t, torch.Tensor) and key != "step"
    )


def _plots(out: Path, rows: dict, curves: dict, base_ppl: float) -> tuple[str, ...]:
    from kernels_common.plotting import new_figure, plot_curves, save_figure

    figure = new_figure()
    axes = figure.add_subplot()
    for method, row in rows.items():
        axes.scatter(row["trainable"], row["fortunes_ppl"], label=method)
    axes.axhline(base_ppl, color="gray", linestyle="--", label="base model")
    axes.set_xscale("log")
    axes.set_xlabel("trainable (updated) parameters")
    axes.set_ylabel("held-out perplexity (fortunes)")
    axes.legend(fontsize=7)
    save_figure(figure, out / "ppl_vs_params.png")
    plot_curves(
        curves,
        out / "train_loss.png",
        title="(a) fortunes: training loss",
        xlabel="step",
        ylabel="loss (nats/token)",
    )
    return ("ppl_vs_params.png", "train_loss.png")


def beats_claim(
    name: str,
    paper: str,
    ours: float,
    theirs: float,
    unit: str,
    higher_is_better: bool,
    floor: float | None = None,
    ceiling: float | None = None,
    paper_value: float | None = None,
) -> Claim:
    """The claim "ours is better than theirs", strict: ``measured = ours - theirs``.

    A tie, or both values at the metric's ``floor`` / ``ceiling`` (e.g. exact match 0 for both:
    the task did not measure anything), is not evidence either way: the measurement becomes NaN
    (reported as not measured), which never passes.
    """
    degenerate = ours == theirs or any(
        bound is not None and ours == bound and theirs == bound for bound in (floor, ceiling)
    )
    return Claim(
        name=name,
        paper=paper,
        measured=math.nan if degenerate else ours - theirs,
        unit=unit,
        direction="at_least" if higher_is_better else "at_most",
        threshold=0.0,
        paper_value=paper_value,
    )


def _claims(plan: Plan, rows: dict, base_params: int) -> tuple[Claim, ...]:
    claims = [
        Claim(
            name="PT-MoE parameters vs LoRA",
            paper="PT-MoE uses 25% fewer parameters than LoRA",
            measured=rows["ptmoe"]["trainable"] / rows["lora"]["trainable"],
            unit="ratio (PT-MoE / LoRA r=8 on q,v)",
            direction="at_most",
            threshold=0.75,
            paper_value=0.75,
        ),
        Claim(
            name="CaPT parameter share",
            paper="CaPT is nearly parameter-free (0.003% of Llama-3.2-1B)",
            measured=100 * rows["capt"]["trainable"] / base_params,
            unit=f"% of {plan.model}",
            direction="at_most",
            threshold=0.003,
            paper_value=0.003,
        ),
        beats_claim(
            "CaPT vs prompt tuning (fortunes ppl)",
            "one capsule token beats multi-token prompt tuning",
            rows["capt"]["fortunes_ppl"],
            rows["prompt-tuning"]["fortunes_ppl"],
            "ppl difference (CaPT − PT)",
            higher_is_better=False,
        ),
        beats_claim(
            "NanoAdam generalisation (fortunes ppl)",
            "NanoAdam generalises better than AdamW (GLUE 85.65 vs 84.58)",
            rows["nanoadam"]["fortunes_ppl"],
            rows["full"]["fortunes_ppl"],
            "ppl difference (NanoAdam − AdamW)",
            higher_is_better=False,
        ),
        beats_claim(
            "NanoAdam forgetting (ShareGPT ppl)",
            "NanoAdam forgets less than AdamW",
            rows["nanoadam"]["sharegpt_ppl"],
            rows["full"]["sharegpt_ppl"],
            "ppl difference after (a) (NanoAdam − AdamW)",
            higher_is_better=False,
        ),
        Claim(
            name="NanoAdam optimizer memory",
            paper="NanoAdam needs less memory than AdamW (OPT-1.3B 11.6 vs 18.2 GB in total)",
            measured=rows["nanoadam"]["optimizer_state_bytes"]
            / rows["full"]["optimizer_state_bytes"],
            unit="ratio of optimizer state bytes",
            direction="at_most",
            threshold=11.6 / 18.2,
            paper_value=11.6 / 18.2,
        ),
    ]
    if "arithmetic_em" in rows["ptmoe"]:
        for peer, label, gain in (("prompt-tuning", "PT", 10.75), ("lora", "LoRA", 0.44)):
            if "arithmetic_em" in rows.get(peer, {}):
                claims.append(
                    beats_claim(
                        f"PT-MoE vs {label} (arithmetic EM)",
                        f"PT-MoE beats {label} on math by {gain} points",
                        100 * rows["ptmoe"]["arithmetic_em"],
                        100 * rows[peer]["arithmetic_em"],
                        "exact-match points (PT-MoE − peer)",
                        higher_is_better=True,
                        floor=0.0,
                        ceiling=100.0,
                        paper_value=gain,
                    )
                )
    for fraction in plan.noise_fractions:
        key = f"noisy{round(100 * fraction)}_ppl"
        if key in rows.get("lope", {}) and key in rows.get("lora", {}):
            claims.append(
                beats_claim(
                    f"LoPE vs LoRA, {round(100 * fraction)}% noisy texts",
                    "LoPE is more robust to noisy training data than LoRA",
                    rows["lope"][key],
                    rows["lora"][key],
                    "clean held-out ppl difference (LoPE − LoRA)",
                    higher_is_better=False,
                )
            )
    return tuple(claims)


def _summary(plan: Plan, rows: dict, base_ppl: float, base_forget: float, base_em: float) -> str:
    t = plan.train
    noise = ", ".join(f"{round(100 * f)}%" for f in plan.noise_fractions)
    return (
        f"{plan.model}, every method {t.steps} steps of batch {t.batch_size}; fortunes texts cut "
        f"to {plan.max_len} tokens (first {plan.context_len} are context, perplexity on the rest) "
        f"from {plan.train_texts} training texts, {plan.eval_texts} held-out texts; arithmetic: "
        f"{plan.qa_train} generated word problems (one + or − of numbers in "
        f"1..{plan.qa_max_value}) for training, {plan.qa_steps} steps per method, "
        f"{plan.qa_eval} held out for greedy exact match, computed teacher-forced in one pass "
        f"({', '.join(plan.qa_methods)}); noise: {', '.join(plan.noise_methods)} at {noise} "
        f"corrupted texts (character noise rate {plan.noise_char_rate}); forgetting: "
        f"{plan.forget_texts} ShareGPT replies. Prompt tuning / PT-MoE use "
        f"T = {t.num_virtual_tokens} (PT-MoE R = {t.ptmoe_rank}, 2 experts), both initialised "
        f"from the same text. Base model: fortunes ppl {base_ppl:.2f}, ShareGPT ppl "
        f"{base_forget:.2f}, arithmetic EM {base_em:.2f}."
    )


def _markdown(results: ReproduceResults, rows: dict, plan: Plan) -> str:
    """The per-method measurements and the CPU time per phase (below the claims table)."""
    keys = ["trainable", "fortunes_ppl", "sharegpt_ppl", "arithmetic_em"]
    keys += [f"noisy{round(100 * f)}_ppl" for f in plan.noise_fractions]
    lines = ["| method | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for method, row in rows.items():
        cells = [
            f"{row[k]:,d}" if isinstance(row.get(k), int) else f"{row[k]:.3f}" if k in row else "–"
            for k in keys
        ]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    cpu = results.settings["cpu_s"]
    lines.append(
        f"\nElapsed: {results.elapsed_s:.0f} s wall, {sum(cpu.values()):.0f} s CPU time ("
        + ", ".join(f"{k} {v:.0f} s" for k, v in cpu.items())
        + "). A claim with no value (NaN) was not measured: a tie, or both methods at the "
        "metric's floor or ceiling."
    )
    return "\n".join(lines) + "\n"
