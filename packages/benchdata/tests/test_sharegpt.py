import json
import logging

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchdata import DataNotFoundError, sharegpt_conversations
from benchdata.sharegpt import iter_json_array


def test_real_sharegpt_conversations():
    conversations = sharegpt_conversations()
    assert len(conversations) >= 17_000
    turns = np.array([len(c) for c in conversations])
    assert 6.5 <= turns.mean() <= 7.5
    roles = {turn["role"] for c in conversations for turn in c}
    assert roles == {"user", "assistant", "system"}
    first = conversations[0][0]
    assert first["role"] == "user"
    assert first["text"].startswith("Summarize the main ideas of Jeff Walker's Product Launch")
    assert sharegpt_conversations(limit=10) == conversations[:10]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet=st.characters(), max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=8,
)


@settings(max_examples=60, deadline=None)
@given(items=st.lists(json_values, max_size=5), indent=st.sampled_from([None, 2]))
def test_every_complete_item_before_a_cut_is_recovered(items, indent):
    text = json.dumps(items, indent=indent)
    assert list(iter_json_array(text)) == items
    # the oracle: item i is complete once the `,` or `]` that follows it is inside the cut
    # (the encoding of items[:i+1] ends where the full text has that `,`: "]" or "\n]" later)
    closing = 1 if indent is None else 2
    delimiters = [
        len(json.dumps(items[: i + 1], indent=indent)) - closing for i in range(len(items))
    ]
    if items:
        delimiters[-1] = len(text) - 1
    for cut in range(len(text)):
        complete = sum(d < cut for d in delimiters)
        if cut <= text.index("["):
            continue
        assert list(iter_json_array(text[:cut])) == items[:complete], text[:cut]


def test_truncated_file_is_recovered_and_logged(tmp_path, caplog):
    conversation = {"id": "a", "conversations": [{"from": "human", "value": "hi"}]}
    text = json.dumps([conversation, conversation, conversation])
    path = tmp_path / "cut.json"
    path.write_text(text[: len(text) - 20])
    with caplog.at_level(logging.WARNING, logger="benchdata.sharegpt"):
        recovered = sharegpt_conversations(path=path)
    assert recovered == [[{"role": "user", "text": "hi"}]] * 2
    assert "truncated" in caplog.text


def test_corruption_before_the_end_is_an_error():
    with pytest.raises(ValueError, match="corrupt"):
        list(iter_json_array('[{"a": 1}, {"a": tru}, {"a": 2}]'))
    with pytest.raises(ValueError, match="expected ','"):
        list(iter_json_array('[{"a": 1} {"a": 2}]'))
    with pytest.raises(ValueError, match="does not start"):
        list(iter_json_array('{"a": 1}'))


def test_unknown_speaker_and_missing_file(tmp_path, empty_dir):
    path = tmp_path / "odd.json"
    path.write_text(json.dumps([{"id": "x", "conversations": [{"from": "robot", "value": "."}]}]))
    with pytest.raises(ValueError, match="speaker 'robot'"):
        sharegpt_conversations(path=path)
    with pytest.raises(DataNotFoundError, match=r"benchdata\[sharegpt\]"):
        sharegpt_conversations(path=empty_dir / "sharegpt.json")
