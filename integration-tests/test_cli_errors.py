"""Every package's command line refuses bad input the same way, as a new user meets it.

Each case is one wrong argument (or one damaged input file) in an otherwise valid command, run as
a real process in an empty folder. Required: exit code 2, no traceback, exactly one line on
stderr, ``<program>[ <sub-command>]: error: …``, naming the bad value; no file written; and
refused before any work (every case is far under the time its command would take).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SECONDS_PER_CASE = 15  # a refusal is Python + torch start-up (2-4 s on this machine), no work


@dataclass(frozen=True)
class Case:
    program: str
    argv: list[str]
    expect: str  # the error line contains this (the bad value or file)
    why: str  # what is wrong with the invocation
    files: dict[str, str | bytes] = field(default_factory=dict)  # inputs created beforehand
    env: dict[str, str] = field(default_factory=dict)


# a checkpoint.json that is complete, for cases that damage only the tensors beside it
DLGN_STATE = (
    '{"config": {}, "net_config": {"in_dim": 192, "layer_sizes": [100], "num_classes": 10}, '
    '"steps": 1, "train_time_s": 0, "history": [], "param_groups": []}'
)
DLGN_TRAIN = ["train", "--dataset", "digits", "--out", "run"]
# a complete DiLoCo checkpoint's meta.json (one replica, step 4), for a truncated replica file
DILOCO_CONFIG = (
    '{"algorithm": "diloco", "total_steps": 4, "inner_steps": 2, "inner_lr": 0.003, '
    '"inner_betas": [0.9, 0.99], "inner_weight_decay": 0.1, "warmup_steps": 1, '
    '"min_lr_ratio": 0.1, "max_grad_norm": 1.0, "outer_lr": 0.7, "outer_momentum": 0.9, '
    '"nesterov": true, "seed": 0}'
)
DILOCO_META = (
    f'{{"format": 1, "config": {DILOCO_CONFIG}, "world_size": 1, "step": 4, "outer_steps": 2}}'
)
DILOCO_RUN = ["diloco", "--replicas", "1", "--steps", "4", "--inner-steps", "2",
              "--warmup-steps", "1"]  # fmt: skip
# one complete request of a trace, and a predictor config, for cases that damage what is beside
LPC_LINE = (
    '{"time": 0, "conversation_id": "c0", "turn": 0, "prompt_token_ids": [1, 2, 3], '
    '"output_tokens": 4, "last_turn": true, "user_text": "hi"}\n'
)
LPC_CONFIG = '{"embedding_dim": 4, "history": 0}'
LPC_SIMULATE = ["simulate", "--trace", "t.jsonl", "--capacity-tokens", "100"]
PEFT_TRAIN = ["train", "--method", "capt", "--model", "tiny", "--task", "arithmetic"]

CASES = [
    # kernels-common
    Case("kernels-common", ["report", "index.md"], files={"index.md": "x"}, expect="index.md",
         why="the reports folder is a file"),
    Case("kernels-common", ["report", "r/sub"], files={"r": "x"}, expect="r/sub",
         why="the reports folder would be under a file"),
    Case("kernels-common", ["reprot"], expect="'reprot'", why="a misspelt sub-command"),
    # benchdata
    Case("benchdata", ["info"], env={"BENCHDATA_CACHE": "cache"}, files={"cache": "x"},
         expect="BENCHDATA_CACHE=cache", why="the cache variable points at a file"),
    Case("benchdata", ["prepare", "gpt5"], expect="'gpt5'",
         why="a model benchdata cannot prepare"),
    Case("benchdata", ["info", "--verbose"], expect="--verbose",
         why="an option info does not have"),
    # dlgn-gumbel
    Case("dlgn-gumbel", [*DLGN_TRAIN, "--steps", "-5"], expect="-5", why="a negative step count"),
    Case("dlgn-gumbel", [*DLGN_TRAIN, "--lr", "nan"], expect="nan",
         why="a learning rate that is not a number"),
    Case("dlgn-gumbel", [*DLGN_TRAIN, "--backend", "bogus"], expect="bogus",
         why="an unknown logic-layer backend"),
    Case("dlgn-gumbel", [*DLGN_TRAIN, "--layers", "105x2"], expect="105",
         why="a last layer that does not split into the 10 classes"),
    Case("dlgn-gumbel", [*DLGN_TRAIN, "--resume"], expect="run",
         why="--resume without a checkpoint in --out"),
    Case("dlgn-gumbel", ["train", "--dataset", "digits", "--out", "taken"], files={"taken": "x"},
         expect="taken", why="--out is an existing file"),
    Case("dlgn-gumbel", ["compile", "--checkpoint", "missing", "--out", "c"], expect="missing",
         why="a checkpoint folder that does not exist"),
    Case("dlgn-gumbel", ["compile", "--checkpoint", "ck", "--out", "c"],
         files={"ck/notes.txt": "x"}, expect="checkpoint.json",
         why="a folder without a checkpoint"),
    Case("dlgn-gumbel", ["compile", "--checkpoint", "ck", "--out", "c"],
         files={"ck/checkpoint.json": '{"config":', "ck/checkpoint.safetensors": b"\0"},
         expect="checkpoint.json", why="a truncated checkpoint.json"),
    Case("dlgn-gumbel", ["compile", "--checkpoint", "ck", "--out", "c"],
         files={"ck/checkpoint.json": DLGN_STATE, "ck/checkpoint.safetensors": b"garbage"},
         expect="checkpoint.safetensors", why="tensors that are not safetensors"),
    Case("dlgn-gumbel", ["reproduce", "--threads", "-1"], expect="-1",
         why="a negative thread count"),
    Case("dlgn-gumbel", ["diagnose", "--dataset", "digits", "--draws", "1"], expect="'1'",
         why="one gradient draw has no mean to compare with"),
    Case("dlgn-gumbel", [*DLGN_TRAIN, "--init", "dirichlet"], expect="dirichlet",
         why="an init the layers do not have (Dirichlet is a relaxation)"),
    # scaling-laws
    Case("scaling-laws", ["diloco", "--steps", "0"], expect="'0'", why="zero training steps"),
    Case("scaling-laws", ["diloco", "--replicas", "0"], expect="--replicas", why="zero replicas"),
    Case("scaling-laws", ["diloco", "--inner-lr", "nan"], expect="'nan'",
         why="a NaN learning rate"),
    Case("scaling-laws", ["diloco", "--steps", "4"], expect="--warmup-steps 15",
         why="the default warmup (15 steps) is not below --steps 4"),
    Case("scaling-laws", ["diloco", "--out", "afile/summary.json"], files={"afile": "x"},
         expect="afile is a file", why="the summary's folder is a file"),
    Case("scaling-laws", [*DILOCO_RUN, "--checkpoint-dir", "ck"],
         files={"ck/step_00000004/meta.json": DILOCO_META,
                "ck/step_00000004/rank0.safetensors": b"\x10\x00\x00"},
         expect="ck/step_00000004/rank0.safetensors",
         why="the latest checkpoint's replica file is truncated"),
    Case("scaling-laws", ["fit", "missing.csv"], expect="missing.csv",
         why="the curve file does not exist"),
    Case("scaling-laws", ["fit", "empty.csv"], files={"empty.csv": ""},
         expect="empty.csv is empty", why="an empty curve file"),
    Case("scaling-laws", ["fit", "cut.csv"], files={"cut.csv": "lr,loss\n0.001,3.0\n0.00"},
         expect="cut.csv is truncated", why="a curve CSV cut off mid-row"),
    Case("scaling-laws", ["fit", "nan.csv"], files={"nan.csv": "lr,loss\n0.001,nan\n0.001,2.9\n"},
         expect="nan.csv: row 1 (line 2), column 'loss'", why="a NaN loss"),
    Case("scaling-laws", ["fit", "c.csv"],
         files={"c.csv": "lr,loss\n" + "".join(f"0.001,{3 - i / 10}\n" for i in range(5))},
         expect="C cannot be identified",
         why="a constant schedule alone cannot identify the annealing term"),
    Case("scaling-laws", ["fit", "sweep.csv", "--law", "tau"],
         files={"sweep.csv": "params,tokens,batch_size,lr,weight_decay,loss\n"
                             "1e6,1e7,1024,abc,0.1,3.0\n"},
         expect="sweep.csv: row 1 (line 2), column 'lr'",
         why="'abc' in a numeric column of a sweep CSV"),
    Case("scaling-laws", ["fit", "c.csv", "--out", "afile/fit"],
         files={"c.csv": "lr,loss\n0.001,3.0\n", "afile": "x"}, expect="afile is a file",
         why="the output folder's parent is a file"),
    # tfla-mlstm
    Case("tfla-mlstm", ["bench", "--device", "nosuch"], expect="'nosuch'", why="not a device"),
    Case("tfla-mlstm", ["bench", "--seq-lens", "-64"], expect="'-64'",
         why="a negative sequence length"),
    Case("tfla-mlstm", ["bench", "--repeat", "0"], expect="'0'",
         why="zero repeats measure nothing"),
    Case("tfla-mlstm", ["reproduce", "--out", "f"], files={"f": "x"}, expect="f",
         why="the results folder is a file"),
    # flashdp
    Case("flashdp", ["bench", "--device", "cuda"], expect="CUDA",
         why="CUDA asked of a CPU-only torch (CI has no GPU)"),
    Case("flashdp", ["bench", "--device", "tpu"], expect="'tpu'", why="not a device"),
    Case("flashdp", ["bench", "--out", "f"], files={"f": "x"}, expect="f",
         why="the table folder is a file"),
    Case("flashdp", ["reproduce", "--out", "f/sub"], files={"f": "x"}, expect="f/sub",
         why="the results folder would be under a file"),
    # lpc-cache
    Case("lpc-cache", [*LPC_SIMULATE, "--policy", "lru", "--block-size", "0"],
         files={"t.jsonl": LPC_LINE}, expect="--block-size",
         why="a block size of zero tokens (was a ZeroDivisionError)"),
    Case("lpc-cache", [*LPC_SIMULATE, "--policy", "lpc", "--predictor", "pred"],
         files={"t.jsonl": LPC_LINE, "pred/config.json": LPC_CONFIG,
                "pred/model.safetensors": b"\x08\x00\x00\x00\x00\x00\x00\x00{\"a\":"},
         expect="pred/model.safetensors", why="truncated predictor weights"),
    Case("lpc-cache", ["sweep", "--trace", "t.jsonl", "--capacities", "100",
                       "--policies", "lru,lpc", "--predictor", "pred", "--out", "sw"],
         files={"t.jsonl": LPC_LINE, "pred/config.json": '{"embedding_dim": 4, "hist',
                "pred/model.safetensors": b"\0"},
         expect="pred/config.json", why="a truncated predictor config.json"),
    Case("lpc-cache", ["train-predictor", "--trace", "missing.jsonl", "--out", "pred"],
         expect="missing.jsonl", why="a trace file that does not exist"),
    Case("lpc-cache", ["trace", "build", "--conversations", "-3", "--out", "t.jsonl"],
         expect="-3", why="a negative number of conversations"),
    Case("lpc-cache", ["sweep", "--trace", "t.jsonl", "--capacities", "100,200",
                       "--out", "FILE/sub"],
         files={"t.jsonl": LPC_LINE, "FILE": "a plain file\n"}, expect="FILE",
         why="an output folder under a plain file"),
    Case("lpc-cache", [*LPC_SIMULATE, "--policy", "lru"],
         files={"t.jsonl": LPC_LINE + '{"time": 1, "conversation_id": "c1", "tu'},
         expect="t.jsonl:2", why="a trace whose last line is cut short"),
    Case("lpc-cache", ["sweep", "--trace", "t.jsonl", "--capacities", "100,abc", "--out", "sw"],
         files={"t.jsonl": LPC_LINE}, expect="abc", why="a capacity that is not a number"),
    Case("lpc-cache", ["train-predictor", "--trace", "t.jsonl", "--out", "pred",
                       "--validation-fraction", "1.5"],
         files={"t.jsonl": LPC_LINE}, expect="1.5", why="a validation fraction above 1"),
    # peft-zoo
    Case("peft-zoo", [*PEFT_TRAIN, "--steps", "-2"], expect="-2", why="a negative step count"),
    Case("peft-zoo", [*PEFT_TRAIN, "--max-len", "0"], expect="--max-len",
         why="texts of zero tokens"),
    Case("peft-zoo", [*PEFT_TRAIN, "--save", "FILE/sub"], files={"FILE": "a plain file\n"},
         expect="FILE", why="an adapter folder under a plain file (was found after training)"),
    Case("peft-zoo", [*PEFT_TRAIN, "--lr", "nan"], expect="nan",
         why="a learning rate that is not finite"),
    Case("peft-zoo", [*PEFT_TRAIN, "--batch-size", "0"], expect="--batch-size",
         why="an empty batch"),
    Case("peft-zoo", [*PEFT_TRAIN, "--max-value", "1"], expect="--max-value",
         why="arithmetic operands up to 1 only"),
    Case("peft-zoo", ["reproduce", "--quick", "--out", "FILE"], files={"FILE": "a plain file\n"},
         expect="FILE", why="a results folder that is a plain file"),
    Case("peft-zoo", ["bench", "--device", "tpu"], expect="tpu", why="an unknown device"),
    # multibit-quant
    Case("multibit-quant", ["train", "--epochs", "-5", "--out", "ck"], expect="'-5'",
         why="a negative epoch count"),
    Case("multibit-quant", ["train", "--lr", "nan", "--out", "ck"], expect="'nan'",
         why="a learning rate that is not a number"),
    Case("multibit-quant", ["train", "--bits", "2,16", "--out", "ck"], expect="'2,16'",
         why="a bit-width the quantizers do not support"),
    Case("multibit-quant", ["train", "--out", "f"], files={"f": "x"}, expect="f",
         why="the checkpoint folder is a file"),
    Case("multibit-quant", ["evaluate", "--checkpoint", "missing"], expect="missing",
         why="no such checkpoint folder"),
    Case("multibit-quant", ["evaluate", "--checkpoint", "ck"],
         files={"ck/config.json": '{"format_version": 1, "archi', "ck/model.safetensors": b"\0"},
         expect="ck/config.json", why="a truncated checkpoint config"),
    Case("multibit-quant", ["export", "--out", "model.bin", "--checkpoint", "ck"],
         expect="model.bin", why="an export that is not a .safetensors file"),
    # cads
    Case("cads", ["select", "--budget", "0", "--out", "sel"], expect="'0'",
         why="a compute budget of zero steps"),
    Case("cads", ["select", "--budget", "100", "--out", "f"], files={"f": "x"}, expect="f",
         why="the selection folder is a file"),
    Case("cads", ["compare", "--methods", "cads-e,oracle"], expect="oracle",
         why="an unknown selection method"),
    Case("cads", ["select", "--budget", "100", "--samples", "1", "--out", "sel"],
         expect="samples >= 2", why="one draw per step cannot take a leave-one-out baseline"),
    Case("cads", ["compare", "--budgets", "100,-3"], expect="100,-3", why="a negative budget"),
    # lookwhere
    Case("lookwhere", ["pretrain", "--out", "o", "--k-range", "9,3"], expect="9,3",
         why="a k range whose low end is above its high end"),
    Case("lookwhere", ["pretrain", "--out", "f"], files={"f": "x"}, expect="f",
         why="the checkpoint folder is a file"),
    Case("lookwhere", ["evaluate", "--checkpoint", "ck"],
         files={"ck/lookwhere.json": '{"format_version": 1, "mod', "ck/model.safetensors": b"\0"},
         expect="ck/lookwhere.json", why="a truncated model description"),
    Case("lookwhere", ["finetune", "--checkpoint", "missing", "--out", "o"], expect="missing",
         why="no such checkpoint folder"),
    # spikesr
    Case("spikesr", ["upscale", "in.png", "out.png", "--scale", "3"], files={"in.png": b"x"},
         expect="3", why="a scale the networks do not have"),
    Case("spikesr", ["upscale", "in.png", "out.png"], files={"in.png": b"not an image"},
         expect="in.png", why="a file that is no image"),
    Case("spikesr", ["upscale", "in.png", "out.png", "--weights", "w.safetensors"],
         files={"in.png": b"x", "w.safetensors": b"\0" * 8}, expect="w.safetensors",
         why="truncated weights"),
    Case("spikesr", ["train", "--out", "w.safetensors", "--lr-patch", "8"], expect="--lr-patch 8",
         why="training patches smaller than the attention patches"),
    # qcs
    Case("qcs", ["select", "--budget", "1.5", "--out", "s.json"], expect="1.5",
         why="a budget above the whole pool"),
    Case("qcs", ["select", "--epsilon", "0.5", "--out", "s.json"], expect="0.5",
         why="elastic weights that no longer tell kept tokens from the rest"),
    Case("qcs", ["compare", "--methods", "qcs,oracle"], expect="oracle", why="an unknown method"),
    Case("qcs", ["finetune", "--selection", "sel.json", "--out", "a"],
         files={"sel.json": '{"format_version": 1, "meth'}, expect="sel.json",
         why="a truncated selection file"),
    # freeze-thaw-bo
    Case("freeze-thaw-bo", ["run", "--alpha", "-1"], expect="-1", why="a negative cost weight"),
    Case("freeze-thaw-bo", ["compare", "--methods", "cfbo,bohb"], expect="bohb",
         why="an unknown method"),
    Case("freeze-thaw-bo", ["run", "--benchmark", "lcbench:segment", "--out", "r.json"],
         expect="--data PATH", why="a user table without its path"),
    Case("freeze-thaw-bo", ["fit-utility", "p.json", "--budget", "10"], files={"p.json": "[[[1, 0"},
         expect="p.json", why="a truncated preference file"),
    # gc4nc
    Case("gc4nc", ["condense", "--rate", "1.5"], expect="1.5", why="a rate outside (0, 1)"),
    Case("gc4nc", ["condense", "--method", "gcond2"], expect="gcond2", why="an unknown method"),
    Case("gc4nc", ["benchmark", "--datasets", "cora"], expect="cora",
         why="a dataset that needs a user path (planetoid:ROOT:NAME)"),
    Case("gc4nc", ["evaluate", "c"],
         files={"c/meta.json": '{"format": 1, "sha', "c/graph.safetensors": b"x"},
         expect="meta.json", why="a truncated condensed-graph record"),
    # jet-nemotron
    Case("jet-nemotron", ["convert", "--layer-types", "attn", "mamba", "--out", "h"],
         expect="mamba", why="an unknown layer type"),
    Case("jet-nemotron", ["convert", "--attention-layers", "-1", "--out", "h"], expect="-1",
         why="a negative layer index"),
    Case("jet-nemotron", ["distill", "--model", "missing", "--out", "d"], expect="missing",
         why="a hybrid folder that does not exist"),
    Case("jet-nemotron", ["bench", "kernels", "--device", "tpu"], expect="tpu",
         why="an unknown device"),
    Case("jet-nemotron", ["postnas", "train-supernet", "--block", "lstm", "--out", "s"],
         expect="lstm", why="an unknown linear block"),
    Case("jet-nemotron", ["postnas", "search-placement", "--supernet", "s", "--budget", "2",
                          "--out", "p"],
         files={"s/supernet.pt": b"x", "s/run.json": '{"model": null, "sou'}, expect="run.json",
         why="a truncated run settings file"),
    Case("jet-nemotron", ["postnas", "search-hw", "--placement", "3", "--state-size", "0",
                          "--out", "h"], expect="0", why="a state size that is not positive"),
]  # fmt: skip


def _module(target: str) -> str:
    """The module ``python -m`` runs for a console script's ``pkg.__main__:main``."""
    assert target.endswith(".__main__:main"), target
    return target.removesuffix(".__main__:main")


def test_every_command_line_has_cases(console_scripts):
    counts = {program: sum(c.program == program for c in CASES) for program in console_scripts}
    assert all(n >= 3 for n in counts.values()), counts
    assert {c.program for c in CASES} <= set(counts)  # no case for a program that is gone


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(folder)): path.read_bytes() if path.is_file() else b"<dir>"
        for path in sorted(folder.rglob("*"))
    }


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.program}: {c.why}")
def test_bad_invocation_is_refused_in_one_line(case: Case, tmp_path: Path, console_scripts):
    for name, content in case.files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
    before = _snapshot(tmp_path)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **case.env}
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", _module(console_scripts[case.program]), *case.argv],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"{case.program}"), lines
    assert ": error: " in lines[0], lines
    assert case.expect in lines[0], lines
    assert _snapshot(tmp_path) == before, "a refused command wrote files"
    assert seconds < SECONDS_PER_CASE, f"refused only after {seconds:.1f} s"
