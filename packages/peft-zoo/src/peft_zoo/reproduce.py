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
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from kernels_common import Claim, ReproduceResults
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
    noise_fractions: tuple[float, ...] = (0.05, 0.2)
    noise_char_rate: float = 0.15
    model: str = "smollm2-135m"


QUICK = Plan(
    train=TrainSettings(steps=10, batch_size=4, num_virtual_tokens=16, ptmoe_rank=12),
    max_len=32,
    context_len=8,
    train_texts=400,
    eval_texts=16,
    forget_texts=8,
    qa_train=200,
    qa_eval=20,
    qa_methods=("prompt-tuning", "lora", "ptmoe"),
    noise_methods=("lora", "lope"),
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
)


def _chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def run(out: str | Path, *, quick: bool = True, model_name: str | None = None) -> ReproduceResults:
    """Run the plan, write ``results.json``, ``summary.md`` and plots into ``out``."""
    from benchdata import fortunes_corpus

    started = time.perf_counter()
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
    problems = arithmetic_problems(plan.qa_train + plan.qa_eval, seed=plan.train.seed)
    qa_train, qa_eval = problems[: plan.qa_train], problems[plan.qa_train :]

    plain = Learner("base", base, None, 0)  # the untouched model (every run adapts a copy)
    base_ppl, base_forget = perplexity(plain, eval_batches), perplexity(plain, forget_batches)
    base_em = exact_match(plain, tok, qa_eval)
    logger.info(
        "base: fortunes ppl %.2f, ShareGPT ppl %.2f, EM %.3f", base_ppl, base_forget, base_em
    )

    rows: dict[str, dict] = {}
    curves = {}
    out.mkdir(parents=True, exist_ok=True)

    def checkpoint() -> None:  # an interrupted run keeps what it measured
        (out / "rows.json").write_text(json.dumps(rows, indent=1))

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
    for method in plan.qa_methods:  # (b)
        learner = build_learner(method, copy.deepcopy(base), tok, plan.train)
        train(learner, qa_train, lambda pairs: qa_batch(tok, pairs), plan.train)
        rows[method]["arithmetic_em"] = exact_match(learner, tok, qa_eval)
        logger.info("(b) %s: EM %.3f", method, rows[method]["arithmetic_em"])
        checkpoint()
        del learner
    for fraction in plan.noise_fractions:  # (c)
        noisy = corrupt(train_texts, fraction, plan.noise_char_rate, seed=plan.train.seed)
        for method in plan.noise_methods:
            learner = build_learner(method, copy.deepcopy(base), tok, plan.train)
            train(learner, noisy, lm, plan.train)
            rows[method][f"noisy{round(100 * fraction)}_ppl"] = perplexity(learner, eval_batches)
            logger.info("(c) %s at %.0f%%: %s", method, 100 * fraction, rows[method])
            checkpoint()
            del learner

    figures = _plots(out, rows, curves, base_ppl)
    claims = _claims(plan, rows, base_ppl)
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
        },
        elapsed_s=time.perf_counter() - started,
    )
    results.save(out)
    (out / "summary.md").write_text(_markdown(results, rows, plan))
    return results


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


def _claims(plan: Plan, rows: dict, base_ppl: float) -> tuple[Claim, ...]:
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
            measured=100 * rows["capt"]["trainable"] / 134_515_008,
            unit="% of SmolLM2-135M",
            direction="at_most",
            threshold=0.003,
            paper_value=0.003,
        ),
        Claim(
            name="CaPT vs prompt tuning (fortunes ppl)",
            paper="one capsule token beats multi-token prompt tuning",
            measured=rows["capt"]["fortunes_ppl"] - rows["prompt-tuning"]["fortunes_ppl"],
            unit="ppl difference (CaPT − PT)",
            direction="at_most",
            threshold=0.0,
        ),
        Claim(
            name="NanoAdam generalisation (fortunes ppl)",
            paper="NanoAdam generalises better than AdamW (GLUE 85.65 vs 84.58)",
            measured=rows["nanoadam"]["fortunes_ppl"] - rows["full"]["fortunes_ppl"],
            unit="ppl difference (NanoAdam − AdamW)",
            direction="at_most",
            threshold=0.0,
        ),
        Claim(
            name="NanoAdam forgetting (ShareGPT ppl)",
            paper="NanoAdam forgets less than AdamW",
            measured=rows["nanoadam"]["sharegpt_ppl"] - rows["full"]["sharegpt_ppl"],
            unit="ppl difference after (a) (NanoAdam − AdamW)",
            direction="at_most",
            threshold=0.0,
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
                    Claim(
                        name=f"PT-MoE vs {label} (arithmetic EM)",
                        paper=f"PT-MoE beats {label} on math by {gain} points",
                        measured=100
                        * (rows["ptmoe"]["arithmetic_em"] - rows[peer]["arithmetic_em"]),
                        unit="EM points",
                        direction="at_least",
                        threshold=0.0,
                        paper_value=gain,
                    )
                )
    for fraction in plan.noise_fractions:
        key = f"noisy{round(100 * fraction)}_ppl"
        if key in rows.get("lope", {}) and key in rows.get("lora", {}):
            claims.append(
                Claim(
                    name=f"LoPE vs LoRA, {round(100 * fraction)}% noisy texts",
                    paper="LoPE is more robust to noisy training data than LoRA",
                    measured=rows["lope"][key] - rows["lora"][key],
                    unit="clean held-out ppl difference (LoPE − LoRA)",
                    direction="at_most",
                    threshold=0.0,
                )
            )
    return tuple(claims)


def _summary(plan: Plan, rows: dict, base_ppl: float, base_forget: float, base_em: float) -> str:
    t = plan.train
    return (
        f"{plan.model}, every method {t.steps} steps of batch {t.batch_size}; fortunes texts cut "
        f"to {plan.max_len} tokens (first {plan.context_len} are context, perplexity on the rest) "
        f"from {plan.train_texts} training texts, {plan.eval_texts} held-out texts; arithmetic: "
        f"{plan.qa_train} generated problems for training, {plan.qa_eval} for exact match "
        f"({', '.join(plan.qa_methods)}); noise: {', '.join(plan.noise_methods)} at "
        f"{', '.join(f'{round(100 * f)}%' for f in plan.noise_fractions)} corrupted texts "
        f"(character noise rate {plan.noise_char_rate}); forgetting: {plan.forget_texts} ShareGPT "
        f"replies. Prompt tuning / PT-MoE use T = {t.num_virtual_tokens} (PT-MoE R = "
        f"{t.ptmoe_rank}, 2 experts). Base model: fortunes ppl {base_ppl:.2f}, ShareGPT ppl "
        f"{base_forget:.2f}, arithmetic EM {base_em:.2f}."
    )


def _markdown(results: ReproduceResults, rows: dict, plan: Plan) -> str:
    keys = ["trainable", "fortunes_ppl", "sharegpt_ppl", "arithmetic_em"]
    keys += [f"noisy{round(100 * f)}_ppl" for f in plan.noise_fractions]
    lines = [f"# {results.title}", "", results.summary, ""]
    lines += ["| method | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for method, row in rows.items():
        cells = [
            f"{row[k]:,d}" if isinstance(row.get(k), int) else f"{row[k]:.3f}" if k in row else "–"
            for k in keys
        ]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    lines += ["", "| claim | paper | measured | expected | ok |", "|---|---|---:|---|---|"]
    for c in results.claims:
        lines.append(
            f"| {c.name} | {c.paper} | {c.measured:.4g} {c.unit} | {c.expectation} | "
            f"{'yes' if c.passed else 'no'} |"
        )
    lines.append(f"\nElapsed: {results.elapsed_s:.0f} s.")
    return "\n".join(lines) + "\n"
