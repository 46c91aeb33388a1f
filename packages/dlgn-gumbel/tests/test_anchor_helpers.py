"""The difflogic anchor's CUDA backward index, rebuilt for copied connections."""

from __future__ import annotations

import pytest
import torch

from dlgn_gumbel.bench import _readers_of_inputs, copy_into_difflogic


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_readers_of_inputs_match_the_per_neuron_loop(seed):
    g = torch.Generator().manual_seed(seed)
    in_dim, out_dim = 37, 50
    a = torch.randint(0, in_dim, (out_dim,), generator=g)
    b = torch.randint(0, in_dim, (out_dim,), generator=g)
    b[:5] = a[:5]  # a neuron reading one input twice appears twice in its list
    lists: list[list[int]] = [[] for _ in range(in_dim)]
    for y in range(out_dim):  # the order difflogic's constructor builds
        lists[int(a[y])].append(y)
        lists[int(b[y])].append(y)
    start, readers = _readers_of_inputs(a, b, in_dim)
    assert start.tolist() == [0, *torch.tensor([len(v) for v in lists]).cumsum(0).tolist()]
    assert readers.tolist() == [y for v in lists for y in v]


def test_copy_into_difflogic_refuses_an_unknown_implementation():
    with pytest.raises(ValueError, match="'python' or 'cuda'"):
        copy_into_difflogic(None, None, implementation="triton")
