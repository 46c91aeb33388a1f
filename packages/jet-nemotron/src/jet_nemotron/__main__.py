"""Command line: ``jet-nemotron convert | distill | bench | postnas | reproduce`` (or
``python -m``)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from jet_nemotron.postnas.cli import add_postnas_parser, run_postnas
from kernels_common import cli

LAYER_TYPES = ("attn", "swa", "jet")


def _layer_types(args: argparse.Namespace, num_layers: int) -> list[str]:
    """``--attention-layers`` (full attention there, JetBlocks elsewhere) or ``--layer-types``."""
    if args.layer_types:
        if len(args.layer_types) != num_layers:
            raise cli.CommandError(
                f"--layer-types needs {num_layers} entries (one per layer), got "
                f"{len(args.layer_types)}"
            )
        return list(args.layer_types)
    bad = [i for i in args.attention_layers if not 0 <= i < num_layers]
    if bad:
        raise cli.CommandError(f"--attention-layers {bad} are outside 0..{num_layers - 1}")
    return ["attn" if i in args.attention_layers else "jet" for i in range(num_layers)]


def _add_layer_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--attention-layers", type=cli.nonnegative_int, nargs="*", default=[],
        help="layers that keep full attention (the rest become JetBlocks)",
    )  # fmt: skip
    group.add_argument(
        "--layer-types", nargs="+", choices=LAYER_TYPES, help="one of attn / swa / jet per layer"
    )
    parser.add_argument("--sliding-window", type=cli.positive_int, default=None)


def main(argv: list[str] | None = None) -> int:
    parser = cli.ArgumentParser(prog="jet-nemotron", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    convert = commands.add_parser("convert", help="a hybrid from SmolLM2-135M (or a HF folder)")
    convert.add_argument(
        "--source", type=cli.existing_folder, default=None,
        help="a Llama/Qwen2 checkpoint folder (default: benchdata's SmolLM2)",
    )  # fmt: skip
    _add_layer_arguments(convert)
    convert.add_argument("--out", type=cli.output_folder, required=True)

    distil = commands.add_parser("distill", help="train a hybrid's JetBlocks against SmolLM2")
    distil.add_argument("--model", type=cli.existing_folder, required=True,
                        help="a hybrid saved by `convert`")  # fmt: skip
    distil.add_argument("--source", choices=("sharegpt", "fortunes"), default="sharegpt")
    distil.add_argument("--layerwise-steps", type=cli.nonnegative_int, default=200)
    distil.add_argument("--end-to-end-steps", type=cli.nonnegative_int, default=50)
    distil.add_argument("--batch-size", type=cli.positive_int, default=4)
    distil.add_argument("--seq-len", type=cli.positive_int, default=256)
    distil.add_argument("--lr", type=cli.positive_float, default=1e-3)
    distil.add_argument("--out", type=cli.output_folder, required=True)

    bench = commands.add_parser("bench", help="kernels vs FLA, or decoding vs the original LM")
    bench.add_argument("what", choices=("kernels", "generation"))
    bench.add_argument("--device", type=cli.device, default="cpu", help="cpu or cuda")
    bench.add_argument("--out", type=cli.output_folder, default=None)
    bench.add_argument("--seq-lens", type=cli.positive_int, nargs="+", default=None,
                       help="kernels: sequence lengths; generation: context lengths")  # fmt: skip
    bench.add_argument(
        "--repeat", type=cli.positive_int, default=5,
        help="kernels: timed rounds; generation: 4x this many decoding steps",
    )  # fmt: skip
    bench.add_argument(
        "--real-prefill", action="store_true",
        help="generation: prefill random tokens instead of filling the cache",
    )  # fmt: skip
    _add_layer_arguments(bench)

    add_postnas_parser(commands)
    repro = commands.add_parser("reproduce", help="the paper's claims at CPU scale")
    repro.add_argument("--quick", action="store_true", help="the few-minute version")
    repro.add_argument("--out", type=cli.output_folder, default=Path("reports/jet-nemotron"))
    repro.add_argument(
        "--part", choices=("all", "jetblock", "postnas"), default="all",
        help="the JetBlock hybrid's claims, the PostNAS search's, or both (default)",
    )  # fmt: skip
    return cli.run(parser, _dispatch, argv)


def _smollm2():
    import benchdata

    return benchdata.smollm2_135m().model.eval()


def _dispatch(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "postnas":
        return run_postnas(args)
    if args.command == "reproduce":
        from jet_nemotron.reproduce import reproduce

        with cli.atomic_folder(args.out) as staging:  # the results appear whole, or not at all
            parts = ("jetblock", "postnas") if args.part == "all" else (args.part,)
            results = reproduce(staging, quick=args.quick, parts=parts)
        for claim in results.claims:
            logging.getLogger("jet_nemotron").info(
                "%s: measured %.4f %s (%s)", claim.name, claim.measured, claim.unit,
                "agrees" if claim.passed else "does not agree",
            )  # fmt: skip
        return 0
    if args.command == "bench" and args.what == "kernels":
        from jet_nemotron.bench.kernels import run

        run(args.device, args.out, args.seq_lens, args.repeat)
        return 0
    from jet_nemotron.models.convert import from_pretrained_llama

    if args.command == "distill":
        return _distill(args)
    if args.command == "convert" and args.source is not None:
        from transformers import AutoModelForCausalLM

        source = AutoModelForCausalLM.from_pretrained(args.source, dtype="float32")
    else:
        source = _smollm2()
    layer_types = _layer_types(args, source.config.num_hidden_layers)
    hybrid = from_pretrained_llama(source, layer_types, sliding_window=args.sliding_window)
    if args.command == "convert":
        with cli.atomic_folder(args.out) as staging:
            hybrid.save_pretrained(staging)
        return 0
    return _bench_generation(args, source, hybrid)


def _distill(args: argparse.Namespace) -> int:
    import benchdata
    from jet_nemotron.data import text_rows
    from jet_nemotron.distill import DistillConfig, distill, heldout_loss
    from jet_nemotron.models.modeling import HybridForCausalLM

    lm = benchdata.smollm2_135m()
    teacher = lm.model.eval()
    student = HybridForCausalLM.from_pretrained(args.model)  # distill trains the JetBlocks only
    rows = text_rows(lm.tokenizer, args.source, seq_len=args.seq_len)
    config = DistillConfig(
        layerwise_steps=args.layerwise_steps, end_to_end_steps=args.end_to_end_steps,
        batch_size=args.batch_size, lr=args.lr,
    )  # fmt: skip
    log = logging.getLogger("jet_nemotron")
    log.info("held-out loss before: %.4f (original %.4f)", heldout_loss(student, rows.validation),
             heldout_loss(teacher, rows.validation))  # fmt: skip
    distill(student, teacher, rows.train, config)
    log.info("held-out loss after: %.4f", heldout_loss(student, rows.validation))
    with cli.atomic_folder(args.out) as staging:
        student.save_pretrained(staging)
    return 0


def _bench_generation(args: argparse.Namespace, source, hybrid) -> int:
    from jet_nemotron.bench.generation import decode_sweep

    contexts = args.seq_lens or [1024, 4096, 16384, 65536]
    models = {"original": source.to(args.device), "hybrid": hybrid.to(args.device).eval()}
    results = decode_sweep(
        models, contexts, new_tokens=args.repeat * 4, real_prefill=args.real_prefill
    )
    for name, points in results.items():
        for point in points:
            print(f"{name:>9} {point['context']:>7} tokens: {point['tokens_per_s']:8.1f} tok/s, "
                  f"cache {point['cache_bytes'] / 2**20:9.1f} MiB")  # fmt: skip
    if args.out is not None:
        import json

        with cli.atomic_file(args.out / "generation.json") as path:
            Path(path).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
