"""``multibit-quant reproduce``: the paper's comparison at small scale on real Fashion-MNIST.

Every training scheme of :mod:`multibit_quant.experiment` (dedicated per-bit QAT, Any-Precision,
shared BatchNorm without correction, ours, and ours with bit-wise coresets at 80% and at 50%
pruning) trains a pre-activation ResNet-20 at bits {2, 4, 8} on the same images for the same
epochs; each is evaluated at 2-8 bits, 3, 5 and 6 never trained. Reported: accuracy per
bit-width, training time, the cross-bit gradient angles, and 8-bit integer inference of the
trained network against its fake-quantized self (float64: the same function; float32: the
predictions a deployment gets).

The quick run average-pools the images to 14×14: it quarters the convolutions' cost, so the
schemes train for 8 epochs in the CPU budget, enough for the full-data schemes to level off
(the coreset schemes see a fraction of each epoch, which is what is being measured).
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from kernels_common import measure
from kernels_common.results import Claim, ReproduceResults
from multibit_quant.alignment import gradient_alignment
from multibit_quant.data import fashion_mnist
from multibit_quant.experiment import run_scheme
from multibit_quant.export import export_sizes, to_integer
from multibit_quant.model import quantize
from multibit_quant.models import preact_resnet20
from multibit_quant.train import TrainConfig

PAPER_SPEEDUP = 7.88  # training time, CIFAR-10 at 80% pruning
PAPER_ANGLE = 28.0  # degrees: the cross-bit gradient angles stay below it
TRAINED, UNTRAINED = (2, 4, 8), (3, 5, 6)
LABELS = {
    "dedicated": "dedicated per-bit QAT",
    "any_precision": "Any-Precision (per-bit BN)",
    "shared_bn": "shared BN, no correction",
    "ours": "ours (bias correction)",
    "ours_coreset_80": "ours + coresets, 80% pruned",
    "ours_coreset_50": "ours + coresets, 50% pruned",
}
CORESETS = {"ours_coreset_80": 0.2, "ours_coreset_50": 0.5}


@dataclass(frozen=True)
class ReproduceSettings:
    train_images: int
    test_images: int
    width: int
    epochs: int
    downsample: int = 1  # average-pool the 28×28 images by this factor
    batch_size: int = 128
    lr: float = 3e-3
    resample_every: int = 2  # epochs between coreset re-selections
    alignment_batch: int = 1024  # large: angles between expected gradients, not minibatch noise
    threads: int = 2
    seed: int = 0


QUICK = ReproduceSettings(train_images=6000, test_images=2000, width=8, epochs=8, downsample=2)
FULL = ReproduceSettings(train_images=60000, test_images=10000, width=16, epochs=30)


def run(
    out: str | Path, *, quick: bool = True, settings: ReproduceSettings | None = None
) -> ReproduceResults:
    """Train every scheme, write ``results.json``, ``summary.md`` and the plots into ``out``."""
    settings = settings if settings is not None else (QUICK if quick else FULL)
    previous = torch.get_num_threads()
    torch.set_num_threads(settings.threads)
    try:
        return _run(Path(out), quick, settings)
    finally:
        torch.set_num_threads(previous)


def _mean(accuracy: dict, bits) -> float:
    return statistics.fmean(accuracy[b] for b in bits)


def _interpolated(accuracy: dict, bits: int) -> float:
    """The accuracy at an untrained bit-width read off the line between its trained
    neighbours: what it would be if it behaved like them."""
    low = max(b for b in TRAINED if b < bits)
    high = min(b for b in TRAINED if b > bits)
    share = (bits - low) / (high - low)
    return accuracy[low] + share * (accuracy[high] - accuracy[low])


def _run(out: Path, quick: bool, settings: ReproduceSettings) -> ReproduceResults:
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    train, test = fashion_mnist(settings.train_images, settings.test_images, seed=settings.seed)
    train, test = train.downsample(settings.downsample), test.downsample(settings.downsample)
    config = TrainConfig(
        epochs=settings.epochs, batch_size=settings.batch_size, lr=settings.lr,
        resample_every=settings.resample_every, seed=settings.seed,
    )  # fmt: skip
    evaluate_bits = tuple(sorted(TRAINED + UNTRAINED))

    def factory():
        return preact_resnet20(num_classes=len(train.classes), width=settings.width)

    schemes, models = {}, {}
    for name in LABELS:
        scheme = "ours_coreset" if name in CORESETS else name
        result, model = run_scheme(
            scheme, factory, train, test, TRAINED, evaluate_bits, config,
            coreset=CORESETS.get(name, 1.0), progress=False,
        )  # fmt: skip
        result.scheme = name
        schemes[name], models[name] = result, model
    ours = models["ours"]
    # after training, and at initialisation (the same seed's untrained network)
    batch = settings.alignment_batch
    angles = gradient_alignment(ours, train, TRAINED, batches=4, batch_size=batch)
    torch.manual_seed(settings.seed)
    untrained = quantize(factory(), TRAINED)
    angles_init = gradient_alignment(untrained, train, TRAINED, batches=4, batch_size=batch)
    integer = _integer_check(ours, test)
    sizes = export_sizes(ours, evaluate_bits)

    acc = {name: r.accuracy for name, r in schemes.items()}
    trained_mean = {n: _mean(a, TRAINED) for n, a in acc.items()}
    untrained_mean = {n: _mean(a, UNTRAINED) for n, a in acc.items() if a[3] is not None}
    neighbours = {n: statistics.fmean(_interpolated(acc[n], b) for b in UNTRAINED)
                  for n in untrained_mean}  # fmt: skip
    seconds = {n: r.seconds for n, r in schemes.items()}
    claims = (
        Claim(
            "untrained bit-widths with one shared BN",
            "weight bias correction lets one BatchNorm serve every bit-width, untrained ones "
            "(3, 5, 6) included, without fine-tuning or recalibration",
            100 * (untrained_mean["ours"] - neighbours["ours"]),
            "points vs the trained neighbours' line",
            "at_least",
            -1.0,
        ),
        Claim(
            "bias correction vs shared BN alone",
            "without the correction a shared BatchNorm fails at (untrained) bit-widths",
            100 * (untrained_mean["ours"] - untrained_mean["shared_bn"]),
            "points (3/5/6-bit mean)",
            "at_least",
            1.0,
        ),
        Claim(
            "accuracy vs Any-Precision",
            "competitive or better accuracy than Any-Precision at the trained bit-widths",
            100 * (trained_mean["ours"] - trained_mean["any_precision"]),
            "points (2/4/8-bit mean)",
            "at_least",
            -1.0,
        ),
        Claim(
            "coreset speed-up, 80% pruned",
            "bit-wise coresets cut training time severalfold, up to 7.88x (CIFAR-10, 80% pruning)",
            seconds["any_precision"] / seconds["ours_coreset_80"],
            "x vs Any-Precision",
            "at_least",
            3.0,
            paper_value=PAPER_SPEEDUP,
        ),
        Claim(
            "coreset accuracy, 80% pruned",
            "at competitive accuracy",
            100 * (trained_mean["ours_coreset_80"] - trained_mean["any_precision"]),
            "points (2/4/8-bit mean)",
            "at_least",
            -1.0,
        ),
        Claim(
            "coreset accuracy, 50% pruned",
            "at competitive accuracy (a milder pruning rate)",
            100 * (trained_mean["ours_coreset_50"] - trained_mean["any_precision"]),
            "points (2/4/8-bit mean)",
            "at_least",
            -1.0,
        ),
        Claim(
            "cross-bit gradient angle",
            "gradients of the bit-widths' child models are aligned (angles below 28°)",
            max(angles.values()),
            "degrees (largest pair)",
            "at_most",
            PAPER_ANGLE,
            paper_value=PAPER_ANGLE,
        ),
        Claim(
            "integer inference, float64",
            "8-bit export with integer matrix products computes the fake-quantized model "
            "(beyond the paper; float64, so that float rounding moves no activation code)",
            integer["agreement_float64"],
            "fraction of test predictions",
            "at_least",
            1.0,
        ),
        Claim(
            "integer inference, float32",
            "the deployed 8-bit integer model predicts what the fake-quantized model predicts "
            "(beyond the paper)",
            integer["agreement_float32"],
            "fraction of test predictions",
            "at_least",
            1.0,
        ),
    )
    figures = [_plot_accuracy(acc, out), _plot_cost(trained_mean, seconds, out)]
    rows = {name: r.to_dict() for name, r in schemes.items()}
    summary = _summary(settings, train, test, acc, seconds, angles, angles_init, integer, sizes)
    results = ReproduceResults(
        package="multibit-quant",
        title="Multi-bit QAT on Fashion-MNIST: bias correction, shared BN, bit-wise coresets",
        claims=claims,
        figures=tuple(figures),
        summary=summary,
        quick=quick,
        settings={
            **asdict(settings),
            "trained_bits": list(TRAINED),
            "untrained_bits": list(UNTRAINED),
            "schemes": rows,
            "alignment_degrees": {f"{a}-{b}": v for (a, b), v in angles.items()},
            "alignment_degrees_at_init": {f"{a}-{b}": v for (a, b), v in angles_init.items()},
            "integer": integer,
            "sizes": {str(b): s for b, s in sizes.items()},
        },
        elapsed_s=time.perf_counter() - started,
    )
    results.save(out)
    (out / "summary.md").write_text(_markdown(results, acc, seconds))
    return results


def _integer_check(model, test) -> dict:
    """8-bit integer inference against fake quantization, in float32 (deployment: an activation
    within float rounding of a code boundary may land one level over) and in float64; times are
    medians of 3 calls after a warm-up."""
    report = {"images": len(test)}
    with torch.no_grad(), model.bits_as(8):
        integer = to_integer(model, 8)
        fake, real = model(test.images), integer(test.images)
        times = [
            measure(lambda f=f: f(test.images), warmup=1, repeat=3, memory=False).median_s
            for f in (integer, model)
        ]
        report["integer_vs_fake_quant_time"] = times[0] / times[1]
        report["agreement_float32"] = (fake.argmax(1) == real.argmax(1)).double().mean().item()
        report["max_logit_difference_float32"] = float((fake - real).abs().max())
        report["accuracy"] = float((real.argmax(1) == test.labels).double().mean())
        exact = copy.deepcopy(model).double()
        fake64 = exact(test.images.double())
        real64 = to_integer(exact, 8)(test.images.double())
        report["agreement_float64"] = (fake64.argmax(1) == real64.argmax(1)).double().mean().item()
        report["max_logit_difference_float64"] = float((fake64 - real64).abs().max())
    return report


def _plot_accuracy(acc: dict, out: Path) -> str:
    from kernels_common.plotting import new_figure, save_figure

    figure = new_figure(6.5, 4.0)
    axes = figure.add_subplot()
    for name, accuracy in acc.items():
        bits = [b for b in sorted(accuracy) if accuracy[b] is not None]
        axes.plot(bits, [100 * accuracy[b] for b in bits], marker="o", label=LABELS[name])
    for b in UNTRAINED:
        axes.axvline(b, color="grey", alpha=0.15, linewidth=8)
    axes.set(title="Fashion-MNIST test accuracy (grey: never trained)", xlabel="bit-width",
             ylabel="accuracy (%)")  # fmt: skip
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    return save_figure(figure, out / "accuracy_per_bit.png").name


def _plot_cost(trained_mean: dict, seconds: dict, out: Path) -> str:
    from kernels_common.plotting import new_figure, save_figure

    figure = new_figure(6.0, 4.0)
    axes = figure.add_subplot()
    for name in trained_mean:
        axes.scatter(seconds[name], 100 * trained_mean[name], s=40)
        axes.annotate(LABELS[name], (seconds[name], 100 * trained_mean[name]), fontsize=8,
                      textcoords="offset points", xytext=(4, 4))  # fmt: skip
    axes.set(title="Accuracy (2/4/8-bit mean) vs training time", xlabel="training time (s)",
             ylabel="accuracy (%)")  # fmt: skip
    axes.grid(alpha=0.3)
    return save_figure(figure, out / "accuracy_vs_time.png").name


def _summary(settings, train, test, acc, seconds, angles, angles_init, integer, sizes) -> str:
    def fmt(name):
        return ", ".join(
            f"{b}: {'-' if acc[name][b] is None else f'{100 * acc[name][b]:.1f}'}"
            for b in sorted(acc[name])
        )

    parts = [
        f"Fashion-MNIST ({len(train)} train / {len(test)} test images), pre-activation ResNet-20 "
        f"width {settings.width}, bits {{2, 4, 8}} trained, {settings.epochs} epochs, Adam "
        f"{settings.lr:g}, batch {settings.batch_size}, DoReFa weights and [0, 1] clamped "
        f"activations, images {train.images.shape[-1]}×{train.images.shape[-1]}; coresets keep "
        "20% or 50% of the images per bit-width (EL2N, sampled in proportion, re-selected every "
        f"{settings.resample_every} epochs)."
    ]
    for name in acc:
        parts.append(f"{LABELS[name]}: {seconds[name]:.0f} s; accuracy % by bits {fmt(name)}.")
    parts.append(
        f"Cross-bit gradient angles (batches of {settings.alignment_batch}), trained: "
        + ", ".join(f"{a}/{b}-bit {v:.1f}°" for (a, b), v in angles.items())
        + "; at initialisation: "
        + ", ".join(f"{a}/{b}-bit {v:.1f}°" for (a, b), v in angles_init.items())
        + "."
    )
    parts.append(
        f"8-bit integer inference: in float64 {integer['agreement_float64']:.2%} of "
        f"{integer['images']} predictions equal (logits within "
        f"{integer['max_logit_difference_float64']:.1e}); in float32 "
        f"{integer['agreement_float32']:.2%} (logits within "
        f"{integer['max_logit_difference_float32']:.1e}), "
        f"{integer['integer_vs_fake_quant_time']:.2f}x the fake-quant time on this CPU; "
        f"quantized weights {sizes[8]['packed_bytes']:,} bytes at 8 bits, "
        f"{sizes[2]['packed_bytes']:,} at 2 bits ({sizes[8]['float32_bytes']:,} in float32)."
    )
    return " ".join(parts)


def _markdown(results: ReproduceResults, acc: dict, seconds: dict) -> str:
    lines = [f"## multibit-quant: {results.title}", "", results.summary, ""]
    lines += ["| claim | paper | measured | expected | agrees |", "|---|---|---:|---|:---:|"]
    for c in results.claims:
        lines.append(
            f"| {c.name} | {c.paper} | {c.measured:.3g} {c.unit} | {c.expectation} | "
            f"{'yes' if c.passed else '**no**'} |"
        )
    bits = sorted(next(iter(acc.values())))
    lines += ["", "| scheme | time (s) | " + " | ".join(f"{b}-bit" for b in bits) + " |"]
    lines.append("|---|---:|" + "---:|" * len(bits))
    for name, accuracy in acc.items():
        cells = ["-" if accuracy[b] is None else f"{100 * accuracy[b]:.1f}" for b in bits]
        lines.append(f"| {LABELS[name]} | {seconds[name]:.0f} | " + " | ".join(cells) + " |")
    lines += ["", *(f"![{f}]({f})" for f in results.figures), ""]
    return "\n".join(lines)
