"""The compiled bit-parallel network equals the torch eval-mode network exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dlgn_gumbel import CompiledLogicNet, LogicNet, ThermometerEncoder, compile_logic_net
from dlgn_gumbel.cbuild import find_compiler

ENGINES = [
    "numpy",
    pytest.param(
        "c", marks=pytest.mark.skipif(find_compiler() is None, reason="no C compiler on PATH")
    ),
]


def _net(in_dim=40, sizes=(120, 90, 60), classes=6, tau=3.0, seed=0):
    return LogicNet(in_dim, sizes, classes, tau, seed=seed, backend="reference").eval()


@pytest.fixture(scope="module")
def digits_net():
    """A net trained for 60 steps on thermometer-encoded digits, and the test-split bits."""
    from dlgn_gumbel.data import load_images

    data = load_images("digits")
    encoder = ThermometerEncoder.uniform(3)
    x, y = encoder(data.x_train), data.y_train
    net = LogicNet(x.shape[1], (400, 400, 300), 10, tau=5.0, seed=0, backend="reference")
    optim = torch.optim.Adam(net.parameters(), lr=0.01)
    torch.manual_seed(0)
    for step in range(60):
        idx = torch.arange(step * 64, step * 64 + 64) % x.shape[0]
        loss = torch.nn.functional.cross_entropy(net(x[idx]), y[idx])
        optim.zero_grad()
        loss.backward()
        optim.step()
    return net.eval(), encoder(data.x_test)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    ("batch", "in_dim"), [(1, 40), (63, 40), (64, 43), (65, 40), (200, 43), (1031, 45)]
)
def test_random_inputs_exact(engine, batch, in_dim):
    """in_dim 43 and 45 exercise the C packer's tail of features beyond a multiple of 8."""
    net = _net(in_dim=in_dim)
    x = torch.rand(batch, in_dim, generator=torch.Generator().manual_seed(batch)) > 0.5
    compiled = compile_logic_net(net, engine=engine)
    expected = net(x.float())
    assert torch.equal(compiled.scores(x), expected)
    assert torch.equal(compiled.predict(x), expected.argmax(1))


@pytest.mark.parametrize("engine", ENGINES)
def test_real_inputs_trained_net_exact(engine, digits_net):
    net, x_test = digits_net
    compiled = compile_logic_net(net, engine=engine)
    expected = net(x_test)
    assert torch.equal(compiled.scores(x_test), expected)
    assert x_test.shape[0] % 64 != 0
    # training made a difference (the comparison is not between two constant networks)
    assert expected.std(0).mean() > 0


def test_pruning_removes_gates_without_changing_outputs(digits_net):
    net, x_test = digits_net
    full = compile_logic_net(net, engine="numpy", prune=False)
    pruned = compile_logic_net(net, engine="numpy")
    assert pruned.num_gates < full.num_gates
    assert torch.equal(pruned.scores(x_test), full.scores(x_test))


def test_engines_agree_and_save_load_roundtrip(tmp_path, digits_net):
    net, x_test = digits_net
    compiled = compile_logic_net(net, engine="numpy")
    compiled.save(tmp_path / "net")
    loaded = CompiledLogicNet.load(tmp_path / "net", engine="numpy")
    assert loaded.num_gates == compiled.num_gates
    assert torch.equal(loaded.scores(x_test), net(x_test))
    if find_compiler() is not None:
        assert np.array_equal(loaded.with_engine("c").counts(x_test), compiled.counts(x_test))


def test_constant_layer_still_compiles():
    """A layer whose every neuron is the constant 1 makes all earlier neurons dead."""
    net = _net(sizes=(30, 12), classes=3)
    with torch.no_grad():
        net.layers[1].weights.zero_()
        net.layers[1].weights[:, 15] = 1.0
    x = torch.rand(70, 40, generator=torch.Generator().manual_seed(0)) > 0.5
    compiled = compile_logic_net(net, engine="numpy")
    assert torch.equal(compiled.scores(x), net(x.float()))
    assert torch.equal(compiled.scores(x), torch.full((70, 3), 4 / 3.0))


def test_bad_input():
    compiled = compile_logic_net(_net(), engine="numpy")
    with pytest.raises(ValueError, match="binary"):
        compiled.scores(np.full((3, 40), 0.5))
    with pytest.raises(ValueError, match=r"\(batch, 40\)"):
        compiled.scores(np.zeros((3, 41), dtype=bool))
    with pytest.raises(TypeError, match="LogicNet"):
        compile_logic_net(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="engine"):
        compile_logic_net(_net(), engine="fortran")


def test_load_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        CompiledLogicNet.load(tmp_path)


def _tamper(directory, name, value):
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(directory / "compiled.safetensors"))
    tensors[name] = value
    save_file(tensors, str(directory / "compiled.safetensors"))


@pytest.mark.parametrize(
    ("name", "value", "match"),
    [
        ("layers.1.idx_a", np.full(90, 120, dtype=np.int64), r"idx_a must be integers in \[0, "),
        ("layers.0.idx_b", np.full(120, -1, dtype=np.int64), r"idx_b must be integers in \[0, 40"),
        ("layers.2.gates", np.full(60, 16, dtype=np.uint8), "gates must be integers in 0..15"),
        ("layers.2.gates", np.zeros(59, dtype=np.uint8), "one non-zero length"),
    ],
)
def test_load_refuses_corrupt_tables(tmp_path, name, value, match):
    """A saved network whose tables would make the C engine read outside its buffers is refused
    on load (the unpruned net keeps the widths 120, 90, 60 that the values above assume)."""
    compile_logic_net(_net(), engine="numpy", prune=False).save(tmp_path)
    _tamper(tmp_path, name, value)
    with pytest.raises(ValueError, match=match):
        CompiledLogicNet.load(tmp_path, engine="numpy")


def test_load_refuses_missing_layer(tmp_path):
    compile_logic_net(_net(), engine="numpy").save(tmp_path)
    config = tmp_path / "config.json"
    config.write_text(config.read_text().replace('"num_layers": 3', '"num_layers": 4'))
    with pytest.raises(ValueError, match="missing"):
        CompiledLogicNet.load(tmp_path, engine="numpy")


@pytest.mark.parametrize("engine", ENGINES)
def test_hand_built_tables_of_other_int_dtypes(engine):
    """int32 indices and int64 gates are converted, not reinterpreted by the C engine."""
    ref = compile_logic_net(_net(), engine="numpy")
    layers = tuple(
        type(layer)(layer.idx_a.astype(np.int32), layer.idx_b.astype(np.int32),
                    layer.gates.astype(np.int64))
        for layer in ref.layers
    )  # fmt: skip
    hand = CompiledLogicNet(ref.in_dim, layers, ref.num_classes, ref.tau, engine)
    x = torch.rand(130, 40, generator=torch.Generator().manual_seed(5)) > 0.5
    assert np.array_equal(hand.counts(x), ref.counts(x))


def test_auto_engine_falls_back_when_the_compiler_fails(tmp_path, monkeypatch):
    from dlgn_gumbel import cbuild

    monkeypatch.setenv("CC", "false")  # found on PATH, but every build fails
    monkeypatch.setenv("DLGN_GUMBEL_CACHE", str(tmp_path))
    cbuild.load_evaluator.cache_clear()
    try:
        assert cbuild.find_compiler() is not None
        compiled = compile_logic_net(_net(), engine="auto")
        assert compiled.engine == "numpy"
        with pytest.raises(cbuild.CompilerUnavailableError, match="failed"):
            compile_logic_net(_net(), engine="c").counts(np.zeros((2, 40), dtype=bool))
        assert not list(tmp_path.glob("dlgn_eval_*"))  # no half-built files left behind
    finally:
        cbuild.load_evaluator.cache_clear()


def test_library_key_depends_on_the_host_cpu():
    """The evaluator is built with -march=native: a cache shared by two CPUs keeps two builds."""
    from dlgn_gumbel.cbuild import library_key

    base = library_key("src", "/usr/bin/gcc", "x86_64|avx2")
    assert library_key("src", "/usr/bin/gcc", "x86_64|avx512f") != base
    assert library_key("src", "/usr/bin/clang", "x86_64|avx2") != base
    assert library_key("src", "/usr/bin/gcc", "x86_64|avx2") == base
