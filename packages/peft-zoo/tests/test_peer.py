"""Peer-library check: PT-MoE with one expert and ``A = I`` is prompt tuning with prompt ``B``,
so its logits must equal ``peft``'s prompt tuning given the same prompt matrix."""

from __future__ import annotations

import copy
import warnings

import peft
import pytest
import torch
from helpers import CAUSAL, batch, tiny_model

import peft_zoo as pz


@pytest.mark.parametrize("kind", CAUSAL)
def test_single_expert_identity_ptmoe_equals_peft_prompt_tuning(kind):
    t = 5
    base = tiny_model(kind)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing`", FutureWarning)
        theirs = peft.get_peft_model(
            copy.deepcopy(base),
            peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=t),
        ).eval()
    prompt = theirs.prompt_encoder["default"].embedding.weight.detach()
    ours = pz.get_peft_model(base, pz.PTMoEConfig(t, 1, t)).eval()
    with torch.no_grad():
        ours.adapter.A.copy_(torch.eye(t)[None])
        ours.adapter.B.copy_(prompt)
    ids = batch()
    with torch.no_grad():
        want = theirs(input_ids=ids).logits[:, t:]
        got = ours(input_ids=ids).logits
    # same model, same inputs; float32 matmul order differs: 1e-5 on logits of size ~1
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
