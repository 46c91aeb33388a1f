"""Selection cost side by side on SmolLM2-135M-Instruct: QCS against LESS and IFD on one pool,
and the exact frozen-prefix cache against running the whole model.

    python packages/qcs/benchmarks/bench_selection.py --out reports/bench/qcs

1. The two costs every method pays again and again, with LoRA on the top layers: one training
   step on a 5% coreset (QCS's inner step) and one per-example LoRA gradient (LESS's unit of
   work), through the cached prefix and through the whole model as LESS's code runs it. The
   outputs must agree (max abs error column).
2. Whole selections on the same pool and validation set: LESS (warm-up + gradients at each
   checkpoint), IFD (two forwards per example) and QCS (``--outer-steps`` policy steps of K
   draws), times as ratios to LESS.
No QCS code is public, so the anchors are the peers the paper compares with, run here.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import qcs
from kernels_common import compare, hardware_description
from qcs.task import TaskSettings, build_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu only (a GPU run uses the same code)")
    parser.add_argument("--pool", type=int, default=80, help="general pairs in the pool")
    parser.add_argument("--lora-layers", type=int, default=2)
    parser.add_argument("--outer-steps", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("reports/bench/qcs"))
    args = parser.parse_args()
    if args.device != "cpu":
        print(f"bench_selection.py runs on the CPU here; --device {args.device} ignored")
    torch.set_num_threads(2)
    model, tokenizer = qcs.load_model()
    settings = TaskSettings(
        pool_general=args.pool,
        pool_target=args.pool // 4,
        validation=16,
        heldout=1,
        target_test=1,
        max_length=96,
        max_prompt_tokens=48,
    )
    task = build_task(tokenizer, settings)
    bench = qcs.Workbench(model, task.pool, task.validation,
                          qcs.LoraSettings(layers=args.lora_layers))  # fmt: skip
    whole = qcs.ResponseScorer(bench.model, task.pool, cache_prefix=False)
    params = [p for p in bench.model.parameters() if p.requires_grad]
    coreset = list(range(qcs.budget_count(0.05, len(task.pool))))

    def step(scorer):
        def run():
            loss = scorer.weighted_loss(coreset)
            grads = torch.autograd.grad(loss, params)
            return torch.cat([loss.detach().reshape(1)] + [g.reshape(-1) for g in grads])

        return run

    def gradient(scorer):
        return lambda: torch.cat([g.reshape(-1) for g in torch.autograd.grad(
            scorer.weighted_loss([0]), params)])  # fmt: skip

    hardware = hardware_description("cpu")
    lines = [f"{hardware}; SmolLM2-135M-Instruct, LoRA on the top {args.lora_layers} layers, "
             f"pool {len(task.pool)}", ""]  # fmt: skip
    for name, make in (("inner_step", step), ("example_gradient", gradient)):
        comparison = compare({"whole model": make(whole), "cached prefix": make(bench.pool)},
                             baseline="whole model", title=name.replace("_", " "), warmup=1,
                             repeat=args.repeat, memory=False, check_outputs=True)  # fmt: skip
        comparison.save(args.out, name)
        print(comparison)
        lines.append(f"- {name.replace('_', ' ')}: cached / whole time "
                     f"{comparison.row('cached prefix').time_ratio:.2f}x")  # fmt: skip

    config = qcs.QCSConfig(outer_steps=args.outer_steps, samples=4,
                           inner=qcs.TrainConfig(steps=1, batch_size=8, lr=2e-3))  # fmt: skip
    less = qcs.LessConfig(warmup_epochs=2, projection_dim=1024)

    def run(method):
        def go():
            bench.forget_scores()  # every run pays its own scoring
            return bench.select(method, 0.05, config=config, less=less).indices.float()

        return go

    comparison = compare({m: run(m) for m in ("less", "ifd", "qcs")}, baseline="less",
                         title="selection of 5% of the pool", warmup=0, repeat=1, memory=True,
                         check_outputs=False)  # fmt: skip
    comparison.save(args.out, "selection")
    print(comparison)
    for method in ("ifd", "qcs"):
        lines.append(
            f"- {method} / LESS selection time: "
            f"{comparison.row(method).time_ratio:.2f}x ({args.outer_steps} QCS steps)"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
