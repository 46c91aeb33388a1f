"""Command line of PostNAS: ``jet-nemotron postnas train-supernet | search-placement |
select-block | search-hw``.

The four actions are the paper's four steps on a pretrained Llama / Qwen2 model (default
benchdata's SmolLM2-135M, or ``--model FOLDER``), each writing JSON and PNG plots into ``--out``:

1. ``train-supernet``: train the super-network's linear blocks; rerunning the same command on
   the same ``--out`` resumes from its checkpoint. ``run.json`` keeps the model and text
   settings, which ``search-placement`` reads back so that it probes held-out rows of the same
   text.
2. ``search-placement``: beam-search the full-attention layers with the trained super-network.
3. ``select-block``: train and rank candidate linear blocks at a fixed placement.
4. ``search-hw``: the JetBlock shapes of one recurrent-state size, distilled, scored and timed
   (resumable); the Pareto front of throughput against quality.

Nothing heavy is imported until an action runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from kernels_common import cli

# the names of jet_nemotron.postnas.blocks.LINEAR_BLOCKS, jet_nemotron.data.SOURCES and the
# objectives of jet_nemotron.postnas.search, spelled here so that parsing imports no model code
BLOCKS = ("jet", "gated_deltanet", "gla", "retnet", "mamba2")
SOURCES = ("sharegpt", "fortunes")
OBJECTIVES = ("combined", "lm", "retrieval", "arithmetic")
CHECKPOINT = "supernet.pt"
RUN_SETTINGS = "run.json"
_TEXT_KEYS = ("source", "seq_len", "num_texts")  # the text settings kept in run.json


def _add_model(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", type=cli.existing_folder, default=None,
        help="a Hugging Face Llama/Qwen2 folder (default: benchdata's SmolLM2-135M)",
    )  # fmt: skip


def _add_text(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--source", choices=SOURCES, default="sharegpt")
    parser.add_argument("--seq-len", type=cli.positive_int, default=128)
    parser.add_argument("--num-texts", type=cli.positive_int, default=1500)


def _add_probes(parser: argparse.ArgumentParser, retrieval: bool = True) -> None:
    if not retrieval:  # search-hw scores quality by the LM probe alone
        parser.add_argument("--examples", type=cli.positive_int, default=4,
                            help="held-out rows of the LM probe that scores quality")  # fmt: skip
        return
    parser.add_argument("--examples", type=cli.positive_int, default=4,
                        help="examples per probe (2x as many additions)")  # fmt: skip
    parser.add_argument("--retrieval-context", type=cli.positive_int, default=256,
                        help="tokens of each passkey prompt (>= 64)")  # fmt: skip


def _add_training(parser: argparse.ArgumentParser, layerwise: int, second: str, steps: int):
    parser.add_argument("--layerwise-steps", type=cli.nonnegative_int, default=layerwise)
    parser.add_argument(f"--{second}-steps", type=cli.nonnegative_int, default=steps)
    parser.add_argument("--batch-size", type=cli.positive_int, default=4)
    parser.add_argument("--lr", type=cli.positive_float, default=1e-3)
    parser.add_argument("--seed", type=cli.nonnegative_int, default=0)


def _add_placement(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--placement", type=cli.nonnegative_int, nargs="+", required=True,
                        help="the layers that keep full attention")  # fmt: skip


def add_postnas_parser(commands: Any) -> argparse.ArgumentParser:
    """Add the ``postnas`` sub-command and its four actions to ``commands`` (the action of
    ``parser.add_subparsers()``); returns the ``postnas`` parser."""
    postnas = commands.add_parser(
        "postnas", help="search a hybrid's design (PostNAS)",
        description="PostNAS in four steps: train-supernet, then search-placement, "
        "select-block and search-hw; each writes JSON and PNG plots into --out.",
    )  # fmt: skip
    actions = postnas.add_subparsers(dest="action", required=True)

    train = actions.add_parser("train-supernet", help="train the once-for-all super-network")
    _add_model(train)
    train.add_argument("--block", choices=BLOCKS, default="jet")
    _add_text(train)
    _add_training(train, 200, "path", 100)
    train.add_argument("--min-attention", type=cli.nonnegative_int, default=0)
    train.add_argument("--max-attention", type=cli.nonnegative_int, default=3)
    train.add_argument("--save-every", type=cli.positive_int, default=50)
    train.add_argument("--out", type=cli.output_folder, required=True,
                       help="checkpoint folder; rerun with the same --out to resume")  # fmt: skip

    place = actions.add_parser("search-placement", help="where to keep full attention")
    place.add_argument("--supernet", type=cli.existing_folder, required=True,
                       help="a train-supernet --out (its model and text are used)")  # fmt: skip
    place.add_argument("--budget", type=cli.positive_int, required=True,
                       help="how many layers keep full attention")  # fmt: skip
    place.add_argument("--beam-width", type=cli.positive_int, default=2)
    place.add_argument("--objectives", choices=OBJECTIVES, nargs="+", default=["combined"],
                       help="searched objectives; the placement is the first one's")  # fmt: skip
    _add_probes(place)
    place.add_argument("--out", type=cli.output_folder, required=True)

    select = actions.add_parser("select-block", help="rank linear blocks at a fixed placement")
    _add_model(select)
    _add_placement(select)
    select.add_argument("--blocks", choices=BLOCKS, nargs="+", default=list(BLOCKS))
    _add_training(select, 100, "path", 20)
    _add_text(select)
    _add_probes(select)
    select.add_argument("--out", type=cli.output_folder, required=True)

    hardware = actions.add_parser("search-hw", help="JetBlock shapes of one state size")
    _add_model(hardware)
    _add_placement(hardware)
    hardware.add_argument("--state-size", type=cli.positive_int, required=True,
                          help="H * Dk * Dv of every searched shape")  # fmt: skip
    hardware.add_argument("--heads", type=cli.positive_int, nargs="+", default=[3, 6, 9, 12])
    hardware.add_argument("--key-dims", type=cli.positive_int, nargs="+",
                          default=[32, 48, 64, 96, 128])  # fmt: skip
    hardware.add_argument("--value-dims", type=cli.positive_int, nargs="+",
                          default=[32, 64, 96, 128])  # fmt: skip
    _add_training(hardware, 60, "end-to-end", 0)
    hardware.add_argument("--context", type=cli.positive_int, default=4096,
                          help="cached tokens before the timed decoding steps")  # fmt: skip
    hardware.add_argument("--new-tokens", type=cli.positive_int, default=8)
    hardware.add_argument("--device", type=cli.device, default="cpu", help="cpu or cuda")
    _add_text(hardware)
    _add_probes(hardware, retrieval=False)
    hardware.add_argument("--out", type=cli.output_folder, required=True,
                          help="results folder; rerun with the same --out to resume")  # fmt: skip
    return postnas


def run_postnas(args: argparse.Namespace) -> int:
    """Run the parsed ``postnas`` action; returns the exit code.

    Raises:
        kernels_common.cli.CommandError: a refusal of the command line (placement outside the
            model, a folder without a super-network, settings that differ from a run resumed).
        ValueError: settings the library refuses (reported as one line by ``cli.run``).
    """
    action = {
        "train-supernet": _train_supernet,
        "search-placement": _search_placement,
        "select-block": _select_block,
        "search-hw": _search_hardware,
    }[args.action]
    return action(args)


# --- inputs ---------------------------------------------------------------------------------------


def _load_model(folder: Path | None) -> tuple[Any, Any]:
    """The float32 causal LM (eval mode) and tokenizer of ``folder``, or benchdata's SmolLM2."""
    import benchdata

    lm = benchdata.smollm2_135m(folder)
    return lm.model.eval(), lm.tokenizer


def _token_rows(tokenizer: Any, text: dict[str, Any]) -> Any:
    """:class:`~jet_nemotron.data.TokenRows` of ``text`` (``source``, ``seq_len``,
    ``num_texts``)."""
    from jet_nemotron.data import text_rows

    return text_rows(
        tokenizer, text["source"], seq_len=text["seq_len"], num_texts=text["num_texts"]
    )


def _filler() -> list[str]:
    """Real text hiding the retrieval probe's passkeys."""
    import benchdata

    return benchdata.fortunes_corpus().validation


def _text_settings(args: argparse.Namespace) -> dict[str, Any]:
    return {key: getattr(args, key) for key in _TEXT_KEYS}


def _probes(tokenizer: Any, validation: Any, args: argparse.Namespace) -> list[Any]:
    from jet_nemotron.postnas.probes import default_probes

    return default_probes(tokenizer, validation, _filler(), examples=args.examples,
                          retrieval_context=args.retrieval_context)  # fmt: skip


def _placement(args: argparse.Namespace, num_layers: int) -> list[int]:
    bad = sorted({i for i in args.placement if not 0 <= i < num_layers})
    if bad:
        raise cli.CommandError(
            f"--placement {bad} are outside the model's layers 0..{num_layers - 1}"
        )
    return sorted(set(args.placement))


def _check_run(out: Path, settings: dict[str, Any]) -> None:
    """Refuse to resume in ``out`` a run of other settings; record them for the next run."""
    saved = out / RUN_SETTINGS
    previous = cli.read_json(saved, "run settings file") if saved.exists() else settings
    if previous != settings:
        raise cli.CommandError(
            f"{out} holds a run with other settings ({previous}, now {settings}); resume with "
            "the same ones or choose another --out"
        )
    out.mkdir(parents=True, exist_ok=True)
    _write_json(saved, settings)


def _model_setting(args: argparse.Namespace) -> dict[str, Any]:
    return {"model": None if args.model is None else str(args.model.resolve())}


def _write_json(path: Path, data: Any) -> None:
    with cli.atomic_file(path) as temporary:
        temporary.write_text(json.dumps(data, indent=1))


# --- actions --------------------------------------------------------------------------------------


def _train_supernet(args: argparse.Namespace) -> int:
    from jet_nemotron.postnas.supernet import SupernetTrainConfig, SuperNetwork, train_supernet
    from kernels_common.plotting import plot_curves

    if args.layerwise_steps + args.path_steps == 0:
        raise cli.CommandError("--layerwise-steps and --path-steps are both 0: nothing to train")
    settings = _model_setting(args) | _text_settings(args)
    config = SupernetTrainConfig(
        layerwise_steps=args.layerwise_steps, path_steps=args.path_steps,
        batch_size=args.batch_size, lr=args.lr, min_attention=args.min_attention,
        max_attention=args.max_attention, seed=args.seed, save_every=args.save_every,
    )  # fmt: skip
    model, tokenizer = _load_model(args.model)
    rows = _token_rows(tokenizer, settings)
    _check_run(args.out, settings)
    supernet = SuperNetwork(model, args.block)
    history = train_supernet(supernet, rows.train, config, checkpoint=args.out / CHECKPOINT)
    _write_json(args.out / "history.json", dataclasses.asdict(history))
    layerwise, paths = history.layerwise, history.paths
    curves = {
        "layer-wise": (list(range(1, len(layerwise) + 1)), layerwise),
        "paths": (list(range(len(layerwise) + 1, len(layerwise) + len(paths) + 1)), paths),
    }
    plot_curves({name: curve for name, curve in curves.items() if curve[1]},
                args.out / "losses.png", title=f"super-network ({args.block}) training",
                xlabel="step", ylabel="loss", logy=True)  # fmt: skip
    print(f"super-network trained for {len(layerwise) + len(paths)} steps: {args.out / CHECKPOINT}")
    return 0


def _search_placement(args: argparse.Namespace) -> int:
    from jet_nemotron.postnas.search import search_placement
    from jet_nemotron.postnas.supernet import from_checkpoint, load_checkpoint
    from kernels_common.plotting import plot_curves

    checkpoint = args.supernet / CHECKPOINT
    if not checkpoint.is_file():
        raise cli.CommandError(
            f"{args.supernet} holds no {CHECKPOINT}; give the --out of `postnas train-supernet`"
        )
    settings = cli.read_json(args.supernet / RUN_SETTINGS, "run settings file")
    if not isinstance(settings, dict) or set(settings) != {"model", *_TEXT_KEYS}:
        raise cli.CommandError(
            f"{args.supernet / RUN_SETTINGS} must hold the keys model, {', '.join(_TEXT_KEYS)}"
        )
    model, tokenizer = _load_model(None if settings["model"] is None else Path(settings["model"]))
    if args.budget > model.config.num_hidden_layers:
        raise cli.CommandError(
            f"--budget {args.budget} exceeds the model's {model.config.num_hidden_layers} layers"
        )
    trained = load_checkpoint(checkpoint)
    steps = trained["config"]["layerwise_steps"] + trained["config"]["path_steps"]
    if trained["step"] < steps:
        raise cli.CommandError(
            f"{checkpoint} stopped at step {trained['step']} of {steps}; finish it by rerunning "
            "`postnas train-supernet` with the same --out"
        )
    if args.budget > trained["config"]["max_attention"]:
        raise cli.CommandError(
            f"--budget {args.budget} is above the super-network's max_attention="
            f"{trained['config']['max_attention']}: paths with that many attention layers were "
            "never trained; retrain with a larger --max-attention"
        )
    probes = _probes(tokenizer, _token_rows(tokenizer, settings).validation, args)
    supernet = from_checkpoint(model, checkpoint)
    result = search_placement(supernet, probes, args.budget, beam_width=args.beam_width,
                              objectives=args.objectives,
                              cache=args.supernet / "placement_scores.json")  # fmt: skip
    with cli.atomic_folder(args.out) as staging:
        _write_json(staging / "placement.json", dataclasses.asdict(result))
        plot_curves(
            {task: (list(range(len(gaps))), [1 - gap for gap in gaps])
             for task, gaps in result.single_layer.items()},
            staging / "importance.png", markers=True,
            title="attention kept in one layer only", xlabel="layer",
            ylabel="fraction of the gap recovered",
        )  # fmt: skip
    print(f"placement of {args.budget} attention layers: {list(result.placement)}")
    for task, layers in result.important_layers.items():
        print(f"{task}: most important layers {layers[:3]}")
    if result.unseparated:
        print(f"left out (no loss gap between all and no attention): {result.unseparated}")
    return 0


def _select_block(args: argparse.Namespace) -> int:
    from jet_nemotron.postnas.selection import select_block
    from jet_nemotron.postnas.supernet import SupernetTrainConfig

    model, tokenizer = _load_model(args.model)
    placement = _placement(args, model.config.num_hidden_layers)
    rows = _token_rows(tokenizer, _text_settings(args))
    probes = _probes(tokenizer, rows.validation, args)
    config = SupernetTrainConfig(
        layerwise_steps=args.layerwise_steps, path_steps=args.path_steps,
        batch_size=args.batch_size, lr=args.lr, seed=args.seed,
    )  # fmt: skip
    _check_run(args.out, _model_setting(args) | _text_settings(args))
    original, results = select_block(model, rows.train, placement, probes, args.blocks, config,
                                     checkpoint_dir=args.out)  # fmt: skip
    _write_json(args.out / "blocks.json", {
        "placement": placement,
        "original": {task: dataclasses.asdict(score) for task, score in original.items()},
        "results": [dataclasses.asdict(result) for result in results],
    })  # fmt: skip
    with cli.atomic_file(args.out / "blocks.png") as path:
        _plot_blocks(original, results, path)
    for rank, result in enumerate(results, 1):
        print(f"{rank}. {result.block}: excess loss {result.excess_loss:.4f} nats, "
              f"{result.parameters} parameters, state {result.state_numel} per layer")  # fmt: skip
    return 0


def _plot_blocks(original: dict[str, Any], results: list[Any], path: Path) -> None:
    """Grouped bars: each candidate's excess loss over the original model, per task."""
    from kernels_common.plotting import new_figure, save_figure

    tasks = list(original)
    width = 0.8 / len(results)
    figure = new_figure()
    axes = figure.add_subplot()
    for index, result in enumerate(results):
        excess = [result.scores[task].loss - original[task].loss for task in tasks]
        positions = [t + (index - (len(results) - 1) / 2) * width for t in range(len(tasks))]
        axes.bar(positions, excess, width, label=result.block)
    axes.set_xticks(range(len(tasks)), tasks)
    axes.axhline(0.0, color="0.3", linewidth=0.8)
    axes.set(title="linear blocks at a fixed placement", ylabel="excess loss over original (nats)")
    axes.grid(alpha=0.3, axis="y")
    axes.legend()
    save_figure(figure, path)


def _search_hardware(args: argparse.Namespace) -> int:
    from jet_nemotron.distill import DistillConfig
    from jet_nemotron.postnas.hardware import plot_pareto, search_hardware, state_size_grid
    from jet_nemotron.postnas.probes import lm_probe, score_probe

    shapes = state_size_grid(args.state_size, args.heads, args.key_dims, args.value_dims)
    model, tokenizer = _load_model(args.model)
    num_layers = model.config.num_hidden_layers
    placement = _placement(args, num_layers)
    layer_types = ["attn" if i in placement else "jet" for i in range(num_layers)]
    rows = _token_rows(tokenizer, _text_settings(args))
    probe = lm_probe(rows.validation[: args.examples])
    config = DistillConfig(
        layerwise_steps=args.layerwise_steps, end_to_end_steps=args.end_to_end_steps,
        batch_size=args.batch_size, lr=args.lr, seed=args.seed,
    )  # fmt: skip
    _check_run(args.out, _model_setting(args) | _text_settings(args) | {"examples": args.examples})
    search = search_hardware(
        model, layer_types, shapes, rows.train,
        quality=lambda hybrid: -score_probe(hybrid, probe).loss, distill_config=config,
        context=args.context, new_tokens=args.new_tokens, device=args.device,
        resume=args.out / "hardware.json",
    )  # fmt: skip
    plot_pareto(search, args.out / "pareto.png")
    print(f"Pareto front of {len(shapes)} shapes of state {args.state_size} (H x Dk x Dv):")
    for record in search.pareto_front():
        print(f"{record.shape.label:>12}: quality {record.quality:.4f}, "
              f"{record.tokens_per_s:.1f} tokens/s, {record.jet_params} JetBlock parameters, "
              f"cache {record.cache_bytes / 2**20:.2f} MiB")  # fmt: skip
    return 0
