"""Train-step time of the adapters vs peft LoRA / prompt tuning; NanoAdam vs AdamW.

python packages/peft-zoo/benchmarks/bench_peft_zoo.py --device cpu --out reports/bench/peft-zoo
"""

from __future__ import annotations

import argparse

from peft_zoo.benchmark import run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--out", default=None, help="folder for the JSON/Markdown tables")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(run(args.device, args.out, repeat=args.repeat).to_markdown())


if __name__ == "__main__":
    main()
