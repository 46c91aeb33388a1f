"""Side-by-side step times against the anchors: ``peft`` LoRA and prompt tuning for the adapters,
``torch.optim.AdamW`` for NanoAdam (with its optimizer-state bytes). Needs the ``bench`` extra."""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from peft_zoo.config import CaPTConfig, LoPEConfig, PTMoEConfig
from peft_zoo.mapping import get_peft_model
from peft_zoo.nanoadam import NanoAdam

SHAPE = {"hidden": 256, "layers": 4, "vocab": 4096, "batch": 8, "length": 128}


@dataclass
class Report:
    """The benchmark's tables (``kernels_common.bench.Comparison``) and NanoAdam's state sizes."""

    tables: list
    state_bytes: dict[str, int]

    def to_markdown(self) -> str:
        parts = [table.to_markdown() for table in self.tables]
        lines = ["| optimizer | state bytes | ratio vs AdamW |", "|---|---:|---:|"]
        adamw = self.state_bytes["AdamW"]
        for name, size in self.state_bytes.items():
            lines.append(f"| {name} | {size:,d} | {size / adamw:.3f} |")
        return "\n".join([*parts, "\n".join(lines) + "\n"])


def _model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=SHAPE["vocab"],
        hidden_size=SHAPE["hidden"],
        intermediate_size=4 * SHAPE["hidden"],
        num_hidden_layers=SHAPE["layers"],
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=512,
    )
    return LlamaForCausalLM(config)


def _peft_model(base, kind: str):
    import peft

    if kind == "lora":
        config = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
    else:
        config = peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=40)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing`", FutureWarning)
        return peft.get_peft_model(base, config)


def _train_step(model, ids: torch.Tensor):
    params = [p for p in model.parameters() if p.requires_grad]

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        for p in params:
            p.grad = None

    return step


def run(device: str = "cpu", out: str | Path | None = None, repeat: int = 5) -> Report:
    """Forward + backward of each adapter, and one optimizer step of AdamW vs NanoAdam."""
    from kernels_common.bench import compare

    base = _model().to(device)
    ids = torch.randint(0, SHAPE["vocab"], (SHAPE["batch"], SHAPE["length"]), device=device)
    adapters = {
        "peft LoRA r=8 (q,v)": _peft_model(copy.deepcopy(base), "lora"),
        "LoPE r=4, 3+1 experts (q,v)": get_peft_model(copy.deepcopy(base), LoPEConfig()),
        "peft prompt tuning T=40": _peft_model(copy.deepcopy(base), "prompt"),
        "PT-MoE T=40, N=2, R=36": get_peft_model(copy.deepcopy(base), PTMoEConfig()),
        "CaPT": get_peft_model(copy.deepcopy(base), CaPTConfig()),
        "CaPT deep": get_peft_model(copy.deepcopy(base), CaPTConfig(deep=True)),
    }
    for model in adapters.values():
        model.train()
    shape = ", ".join(f"{k} {v}" for k, v in SHAPE.items())
    tables = [
        compare(
            {name: _train_step(model, ids) for name, model in adapters.items()},
            baseline="peft LoRA r=8 (q,v)",
            title=f"adapter train step (forward + backward), Llama {shape}",
            device=device,
            warmup=1,
            repeat=repeat,
            check_outputs=False,
        )
    ]
    model = copy.deepcopy(base)
    params = list(model.parameters())
    model(input_ids=ids, labels=ids).loss.backward()  # fixed gradients for every optimizer
    optimizers = {
        "AdamW": torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0),
        "NanoAdam density 0.05": NanoAdam(params, lr=1e-4, density=0.05),
        "NanoAdam density 0.2": NanoAdam(params, lr=1e-4, density=0.2),
    }
    snapshot = [p.detach().clone() for p in params]

    def stepper(optimizer):
        def step() -> None:
            optimizer.step()
            with torch.no_grad():  # undo, so every call sees the same weights
                for p, saved in zip(params, snapshot, strict=True):
                    p.copy_(saved)

        return step

    tables.append(
        compare(
            {name: stepper(opt) for name, opt in optimizers.items()},
            baseline="AdamW",
            title=f"optimizer step over all {sum(p.numel() for p in params):,d} parameters",
            device=device,
            warmup=1,
            repeat=repeat,
            check_outputs=False,
            memory=False,
        )
    )
    state_bytes = {
        name: sum(
            t.numel() * t.element_size()
            for state in opt.state.values()
            for key, t in state.items()
            if isinstance(t, torch.Tensor) and key != "step"
        )
        for name, opt in optimizers.items()
    }
    report = Report(tables, state_bytes)
    if out is not None:  # every file appears together, or none does
        from kernels_common.cli import atomic_folder

        with atomic_folder(out) as folder:
            for table, name in zip(tables, ("bench_adapters", "bench_optimizers"), strict=True):
                table.save(folder, name)
            (folder / "bench_peft_zoo.md").write_text(report.to_markdown())
    return report
