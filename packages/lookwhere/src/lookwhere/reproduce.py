"""``lookwhere reproduce``: the paper's claims in direction, at small scale on real data, on a CPU.

Two tasks from real images (:mod:`lookwhere.data`): **sparse** -- one Fashion-MNIST object at a
random place and scale on a large canvas cut from a photograph, among MNIST digits (the Traffic
Signs analogue) -- and **global** -- the object upscaled to fill the image. A small supervised ViT
teacher is trained per task (:mod:`lookwhere.teacher`; its crop stage is shared); LookWhere
distils it without labels and fine-tunes; the full high-resolution ViT, low-resolution ViTs,
random token selection, EViT and ToMe start from the same teacher and get the same fine-tuning
steps (:mod:`lookwhere.experiment`). Every operating point is judged by test accuracy, counted
FLOPs and measured time per image.

Claims checked (paper: 17x fewer FLOPs and 4x less time at equal accuracy on Traffic Signs;
ImageNet accuracy up while 1.36x faster): on the sparse task LookWhere keeps the dense ViT's
accuracy at a fraction of its FLOPs and time, and no baseline point is both cheaper and more
accurate; on the global task it matches the dense ViT while faster.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from kernels_common.results import Claim, ReproduceResults
from lookwhere.data import global_images, sparse_canvases
from lookwhere.evaluate import OperatingPoint
from lookwhere.experiment import MethodSettings, TaskResult, run_task
from lookwhere.teacher import train_teacher
from lookwhere.train import TrainConfig, device_of
from lookwhere.vit import ViTConfig

logger = logging.getLogger(__name__)

PAPER_FLOPS_RATIO = 17.0  # Traffic Signs, at equal accuracy
PAPER_TIME_RATIO = 4.0
PAPER_GLOBAL_SPEEDUP = 1.36  # ImageNet
EQUAL_ACCURACY = 0.01  # "keeps accuracy": within 1 point of the dense ViT


@dataclass(frozen=True)
class ReproduceSettings:
    """Sizes, steps and seeds of one run (see `QUICK` and `FULL`)."""

    sparse_size: int = 96
    global_size: int = 64
    train_images: int = 8000
    test_images: int = 1000
    vit: ViTConfig = field(
        default_factory=lambda: ViTConfig(dim=64, depth=4, heads=4, patch_size=8)
    )
    crop_steps: int = 500
    sparse_stages: tuple[tuple[int, int], ...] = ((64, 300), (96, 300))  # (canvas px, steps)
    global_steps: int = 300
    teacher: TrainConfig = field(default_factory=lambda: TrainConfig(lr=1.5e-3))
    sparse: MethodSettings = field(default_factory=MethodSettings)
    global_: MethodSettings = field(
        default_factory=lambda: MethodSettings(
            selector_size=32, k_range=(4, 32), ks=(8, 16, 24, 32), low_sizes=(32, 48),
            tome_rs=(4, 8, 12),
        )
    )  # fmt: skip
    distractors: int = 2
    object_size: tuple[int, int] = (24, 36)
    threads: int = 2
    seed: int = 0


QUICK = ReproduceSettings()
FULL = ReproduceSettings(
    train_images=20000, test_images=2000, crop_steps=1500,
    sparse_stages=((64, 1000), (96, 1500)), global_steps=1000,
    sparse=MethodSettings(
        pretrain=TrainConfig(steps=1000, lr=5e-4), finetune=TrainConfig(steps=600, lr=3e-4)
    ),
    global_=MethodSettings(
        selector_size=32, k_range=(4, 32), ks=(8, 16, 24, 32), low_sizes=(32, 48),
        tome_rs=(4, 8, 12), pretrain=TrainConfig(steps=1000, lr=5e-4),
        finetune=TrainConfig(steps=600, lr=3e-4),
    ),
)  # fmt: skip


def reproduce(
    out: str | Path,
    *,
    quick: bool = True,
    settings: ReproduceSettings | None = None,
    device: str = "cpu",
    progress: bool = False,
) -> ReproduceResults:
    """Run both tasks on `device`; write ``results.json``, ``summary.md``, ``points.json`` and
    the plots."""
    settings = settings if settings is not None else (QUICK if quick else FULL)
    previous = torch.get_num_threads()
    torch.set_num_threads(settings.threads)
    try:
        torch.manual_seed(settings.seed)
        return _run(Path(out), quick, settings, device, progress)
    finally:
        torch.set_num_threads(previous)


def _data(settings: ReproduceSettings):
    n, m, seed = settings.train_images, settings.test_images, settings.seed
    kw = {"distractors": settings.distractors, "object_size": settings.object_size, "seed": seed}
    crops = global_images("train", n, size=settings.vit.patch_size * 4, seed=seed)
    sparse_stages = [(sparse_canvases("train", n, size=size, **kw), steps)
                     for size, steps in settings.sparse_stages]  # fmt: skip
    sparse_test = sparse_canvases("test", m, size=settings.sparse_size, **kw)
    global_train = global_images("train", n, size=settings.global_size, seed=seed + 1)
    global_test = global_images("test", m, size=settings.global_size, seed=seed)
    return crops, sparse_stages, sparse_test, global_train, global_test


def _run(
    out: Path, quick: bool, settings: ReproduceSettings, device: str, progress: bool
) -> ReproduceResults:
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    crops, sparse_stages, sparse_test, global_train, global_test = _data(settings)
    if sparse_stages[-1][0].size != settings.sparse_size:
        raise ValueError("the last sparse teacher stage must be at sparse_size")
    classes = len(crops.classes)
    teacher_train = settings.teacher.replace(seed=settings.seed)
    timings = {}
    t0 = time.perf_counter()
    crop_stage = train_teacher(  # shared by both teachers
        settings.vit, [(crops, settings.crop_steps)], teacher_train, num_classes=classes,
        device=device, progress=progress,
    )  # fmt: skip
    later = teacher_train.replace(seed=settings.seed + 1)
    sparse_teacher = train_teacher(
        settings.vit, sparse_stages, later, num_classes=classes, init=crop_stage, device=device,
        progress=progress,
    )  # fmt: skip
    global_teacher = train_teacher(
        settings.vit, [(global_train, settings.global_steps)], later, num_classes=classes,
        init=crop_stage, device=device, progress=progress,
    )  # fmt: skip
    timings["teachers_s"] = time.perf_counter() - t0
    results: dict[str, TaskResult] = {}
    for name, teacher, train, test, methods in (
        ("sparse", sparse_teacher, sparse_stages[-1][0], sparse_test, settings.sparse),
        ("global", global_teacher, global_train, global_test, settings.global_),
    ):
        t0 = time.perf_counter()
        results[name] = run_task(teacher, train, test, methods, progress=progress)
        timings[f"{name}_s"] = time.perf_counter() - t0
    from kernels_common.bench import hardware_description

    hardware = hardware_description(device)
    claims = _claims(results)
    figures = _plots(results, sparse_test, out, device)
    summary = _summary(results, settings, timings)
    run = ReproduceResults(
        package="lookwhere",
        title="LookWhere vs dense, low-res, random, EViT and ToMe ViTs on sparse and global tasks",
        claims=claims, figures=figures, summary=summary, quick=quick,
        settings=_settings_json(settings) | {"timings_s": timings, "device": hardware},
        elapsed_s=time.perf_counter() - started,
    )  # fmt: skip
    run.save(out)
    from kernels_common.report import write_summary

    write_summary(run, out, _markdown(results))
    points = {name: [p.to_dict() for p in result.points] for name, result in results.items()}
    (out / "points.json").write_text(json.dumps(points, indent=1) + "\n")
    return run


def _settings_json(settings: ReproduceSettings) -> dict:
    data = asdict(settings)
    return json.loads(json.dumps(data))


def _dense(points: list[OperatingPoint]) -> OperatingPoint:
    return next(p for p in points if p.method == "dense")


def _lookwhere(points: list[OperatingPoint]) -> list[OperatingPoint]:
    return [p for p in points if p.method == "lookwhere"]


def _cheapest_equal(points: list[OperatingPoint], key: str) -> OperatingPoint | None:
    """The LookWhere point with the least `key` ("gflops" or "ms_per_image") whose accuracy is
    within 1 point of the dense ViT's (None if there is none: the claim then measures 0)."""
    dense = _dense(points)
    # accuracies are counts over the test set: compare them exactly, not in floating point
    floor = dense.accuracy - EQUAL_ACCURACY - 1e-12
    good = [p for p in _lookwhere(points) if p.accuracy >= floor]
    return min(good, key=lambda p: getattr(p, key)) if good else None


def dominance_gap(points: list[OperatingPoint]) -> float:
    """Largest accuracy by which a baseline point at no more FLOPs beats a LookWhere point (<= 0:
    LookWhere is on the accuracy-FLOPs front); NaN when no baseline point is that cheap (nothing
    was compared, and the claim fails)."""
    baselines = [p for p in points if p.method != "lookwhere"]
    gaps = []
    for ours in _lookwhere(points):
        cheaper = [p.accuracy for p in baselines if p.gflops <= ours.gflops]
        if cheaper:
            gaps.append(max(cheaper) - ours.accuracy)
    return max(gaps) if gaps else float("nan")


def _claims(results: dict[str, TaskResult]) -> list[Claim]:
    sparse, global_ = results["sparse"].points, results["global"].points
    dense = _dense(sparse)
    flops_point = _cheapest_equal(sparse, "gflops")
    time_point = _cheapest_equal(sparse, "ms_per_image")
    flops_ratio = dense.gflops / flops_point.gflops if flops_point else 0.0
    time_ratio = dense.ms_per_image / time_point.ms_per_image if time_point else 0.0
    g_dense = _dense(global_)
    g_best = max(p.accuracy for p in _lookwhere(global_)) - g_dense.accuracy
    g_point = _cheapest_equal(global_, "ms_per_image")
    g_speed = g_dense.ms_per_image / g_point.ms_per_image if g_point else 0.0
    return [
        Claim(
            name="sparse: FLOPs saved at equal accuracy",
            paper="Traffic Signs: accuracy kept while reducing FLOPs by 17x",
            measured=flops_ratio, unit="x", direction="at_least", threshold=2.0,
            paper_value=PAPER_FLOPS_RATIO,
        ),
        Claim(
            name="sparse: time saved at equal accuracy",
            paper="Traffic Signs: accuracy kept while reducing time by 4x",
            measured=time_ratio, unit="x", direction="at_least", threshold=1.0,
            paper_value=PAPER_TIME_RATIO,
        ),
        Claim(
            name="sparse: no cheaper baseline is more accurate",
            paper="LookWhere beats token reduction and selection baselines at matched cost",
            measured=round(100 * dominance_gap(sparse), 9), unit="points", direction="at_most",
            threshold=0.0,
        ),
        Claim(
            name="global: best accuracy vs dense",
            paper="ImageNet: accuracy up over the dense ViT",
            measured=round(100 * g_best, 9), unit="points", direction="at_least",
            threshold=-100 * EQUAL_ACCURACY,
        ),
        Claim(
            name="global: time saved at equal accuracy",
            paper="ImageNet: 1.36x faster than the dense ViT",
            measured=g_speed, unit="x", direction="at_least", threshold=1.0,
            paper_value=PAPER_GLOBAL_SPEEDUP,
        ),
    ]  # fmt: skip


def _plots(results: dict[str, TaskResult], sparse_test, out: Path, device: str) -> list[str]:
    from kernels_common.plotting import plot_curves

    figures = []
    for name, result in results.items():
        by = result.by_method()
        timing = f"ms per image ({device})"
        for key, label in (("gflops", "GFLOPs per image"), ("ms_per_image", timing)):
            curves = {
                method: ([getattr(p, key) for p in pts], [100 * p.accuracy for p in pts])
                for method, pts in by.items()
            }
            suffix = "flops" if key == "gflops" else "time"
            path = plot_curves(
                curves, out / f"{name}_accuracy_vs_{suffix}.png", logx=True, markers=True,
                title=f"{name}: test accuracy vs {label}", xlabel=label, ylabel="accuracy (%)",
            )  # fmt: skip
            figures.append(path.name)
    figures.append(_selector_maps(results["sparse"], sparse_test, out / "sparse_selector_maps.png"))
    return figures


def _selector_maps(result: TaskResult, test, path: Path, count: int = 6) -> str:
    """Test canvases with the selector's map over them and the kept patches outlined."""
    from kernels_common.plotting import new_figure, save_figure

    model = result.lookwhere
    k = model.k
    images = test.floats(slice(0, count))
    with torch.no_grad():
        saliency = model.selector(images.to(device_of(model))).saliency.cpu()
    grid, patch = model.extractor.grid, model.extractor.vit.config.patch_size
    kept = torch.topk(saliency, k, dim=-1).indices
    figure = new_figure(2.2 * count, 4.6)
    for i in range(count):
        top = figure.add_subplot(2, count, i + 1)
        top.imshow(images[i].permute(1, 2, 0).numpy())
        for index in kept[i].tolist():
            r, c = divmod(index, grid)
            top.add_patch(_rectangle(c * patch, r * patch, patch))
        t, left, h, _ = test.boxes[i].tolist()
        top.add_patch(_rectangle(left, t, h, color="yellow"))
        top.set_title(test.classes[int(test.labels[i])], fontsize=8)
        top.axis("off")
        bottom = figure.add_subplot(2, count, count + i + 1)
        bottom.imshow(saliency[i].reshape(grid, grid).numpy(), cmap="magma")
        bottom.axis("off")
    figure.suptitle(f"selector maps (bottom) and the top-{k} kept patches (red); target box yellow")
    return save_figure(figure, path).name


def _rectangle(x: float, y: float, side: float, color: str = "red"):
    from matplotlib.patches import Rectangle

    return Rectangle((x - 0.5, y - 0.5), side, side, fill=False, edgecolor=color, linewidth=0.8)


def standard_error_points(accuracy: float, count: int) -> float:
    """The binomial standard error of an accuracy measured on `count` images, in points:
    `100 sqrt(p (1 - p) / n)`."""
    return 100 * math.sqrt(accuracy * (1 - accuracy) / count)


def _summary(results: dict[str, TaskResult], settings: ReproduceSettings, timings: dict) -> str:
    sparse = results["sparse"].points
    dense = _dense(sparse)
    best = max(_lookwhere(sparse), key=lambda p: p.accuracy)
    patch = settings.vit.patch_size
    return (
        f"Sparse task: {settings.sparse_size}px canvases "
        f"({(settings.sparse_size // patch) ** 2} patches of {patch}px) with one Fashion-MNIST "
        f"object of {settings.object_size[0]}-"
        f"{settings.object_size[1]}px and {settings.distractors} MNIST digits over photographs; "
        f"global task: the object filling {settings.global_size}px images. "
        f"{settings.train_images} training and {settings.test_images} test images per task, "
        f"disjoint objects, digits and photographs. ViT {settings.vit.dim} wide, "
        f"{settings.vit.depth} blocks, {settings.vit.num_registers} registers; the selector keeps "
        f"{settings.sparse.selector_depth} teacher blocks at {settings.sparse.selector_size}px. "
        f"Sparse: the dense ViT {100 * dense.accuracy:.1f}% at {dense.gflops:.3f} GFLOPs; "
        f"LookWhere's best {100 * best.accuracy:.1f}% ({best.setting}, {best.gflops:.3f} GFLOPs). "
        f"One seed ({settings.test_images} test images: a standard error of "
        f"{standard_error_points(dense.accuracy, settings.test_images):.1f} points at the dense "
        f"ViT's accuracy); times are medians at batch {settings.sparse.time_batch}. Teachers "
        f"{timings['teachers_s']:.0f} s, sparse methods {timings['sparse_s']:.0f} s, global "
        f"{timings['global_s']:.0f} s."
    )


def _markdown(results: dict[str, TaskResult]) -> str:
    lines = []
    for name, result in results.items():
        lines += [
            f"### {name}: every operating point", "",
            "| method | setting | tokens | accuracy (%) | GFLOPs | ms / image | target recall |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]  # fmt: skip
        for p in result.points:
            recall = "" if p.target_recall is None else f"{100 * p.target_recall:.0f}%"
            lines.append(
                f"| {p.method} | {p.setting} | {p.tokens} | {100 * p.accuracy:.1f} | "
                f"{p.gflops:.4f} | {p.ms_per_image:.3f} | {recall} |"
            )
        log = result.pretrain_log
        first, last = log[0], log[-1]
        lines += [
            "",
            f"Pre-training loss (cls / patch / map): first step {first['cls']:.3f} / "
            f"{first['patch']:.3f} / {first['map']:.3f}, last {last['cls']:.3f} / "
            f"{last['patch']:.3f} / {last['map']:.3f}.",
            "",
        ]
    return "\n".join(lines)
