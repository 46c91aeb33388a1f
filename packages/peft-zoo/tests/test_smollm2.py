"""The methods on the real SmolLM2-135M (``benchdata[smollm2]``, part of the ``test`` extra)."""

from __future__ import annotations

import torch

import benchdata
import peft_zoo as pz


def test_smollm2_ptmoe_svd_init_and_capt_left_padded_generate():
    lm = benchdata.smollm2_135m()
    model, tok = lm.model.eval(), lm.tokenizer
    ptmoe = pz.get_peft_model(
        model, pz.PTMoEConfig(init_text="Solve the math word problem."), tokenizer=tok
    )
    assert ptmoe.get_nb_trainable_parameters()[0] == 2 * 40 * 36 + 36 * 576 + 2 * 576 + 2
    ids = tok("The capital of France is", return_tensors="pt")["input_ids"]
    assert torch.isfinite(ptmoe(input_ids=ids).logits).all()
    lm = benchdata.smollm2_135m()
    capt = pz.get_peft_model(lm.model.eval(), pz.CaPTConfig())
    rows = [tok(t)["input_ids"] for t in ("The capital of France is", "Two plus two is")]
    length = max(len(r) for r in rows)
    pad = tok.pad_token_id
    ids = torch.tensor([[pad] * (length - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (length - len(r)) + [1] * len(r) for r in rows])
    out = capt.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False)
    for i, row in enumerate(rows):
        alone = capt.generate(torch.tensor([row]), max_new_tokens=5, do_sample=False)
        assert out[i, length:].tolist() == alone[0, len(row) :].tolist()
