"""The inference cache of a hybrid model: what each layer keeps between forward calls.

* ``"attn"`` layers keep every key and value, ``(B, num_key_value_heads, seen, head_dim)``;
* ``"swa"`` layers keep only the last ``sliding_window - 1`` of them: with the new token that is
  all a query can see, so memory stays bounded however long the sequence grows;
* ``"jet"`` layers keep their :class:`~jet_nemotron.modules.jet_block.JetBlockState`
  (recurrent state and the convolution's last inputs), whose size does not grow at all.

Every layer also counts the positions it has seen (padding included), which is the sequence
length ``generate`` asks for. The class is a ``transformers`` ``Cache`` so that ``generate``
carries it between steps and reorders it for beam search; it cannot be cropped (a JetBlock state
cannot be rolled back), so assisted decoding is not supported.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers.cache_utils import Cache

from jet_nemotron.models.configuration import HybridConfig
from jet_nemotron.modules.jet_block import JetBlockState


class HybridCache(Cache):
    """Keys/values, sliding windows and JetBlock states of one batch of sequences.

    Args:
        config: the model's configuration (its ``layer_types`` and ``sliding_window``).

    Example:
        >>> import torch
        >>> config = HybridConfig(
        ...     vocab_size=32,
        ...     hidden_size=16,
        ...     intermediate_size=32,
        ...     num_hidden_layers=2,
        ...     num_attention_heads=2,
        ...     layer_types=["attn", "swa"],
        ...     sliding_window=3,
        ... )
        >>> cache = HybridCache(config)
        >>> k = v = torch.zeros(1, 2, 5, 8)
        >>> keys, _ = cache.update(k, v, layer_idx=1)  # all 5 come back for this call
        >>> keys.shape[-2], cache.get_seq_length(1), cache.cache_bytes()
        (5, 5, 256)
    """

    is_compileable = False
    is_croppable = False

    def __init__(self, config: HybridConfig) -> None:
        super().__init__(layers=[])
        self.layer_types = list(config.layer_types)
        self.sliding_window = config.sliding_window
        n = len(self.layer_types)
        self.key_cache: list[torch.Tensor | None] = [None] * n
        self.value_cache: list[torch.Tensor | None] = [None] * n
        self.jet_states: list[JetBlockState | None] = [None] * n
        self.seen_tokens = [0] * n

    def __len__(self) -> int:
        return len(self.layer_types)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(layer_types={self.layer_types}, "
            f"seen_tokens={self.get_seq_length()}, bytes={self.cache_bytes()})"
        )

    def _check_layer(self, layer_idx: int, allowed: tuple[str, ...]) -> str:
        if not 0 <= layer_idx < len(self):
            raise ValueError(f"layer_idx {layer_idx} is out of range for {len(self)} layers")
        layer_type = self.layer_types[layer_idx]
        if layer_type not in allowed:
            raise ValueError(f"layer {layer_idx} is a {layer_type!r} layer, not one of {allowed}")
        return layer_type

    def update(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        layer_idx: int,
        cache_kwargs: dict | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the new keys/values of an attention layer; return all the call attends to.

        Args:
            key_states, value_states: ``(B, num_key_value_heads, T, head_dim)`` of the new
                positions (keys already rotated).
            layer_idx: an ``"attn"`` or ``"swa"`` layer.
            cache_kwargs: unused (``transformers``' signature).

        Returns:
            ``(keys, values)`` of shape ``(B, num_key_value_heads, kept + T, head_dim)``, where
            ``kept`` is everything seen before (``"attn"``) or at most ``sliding_window - 1``
            of it (``"swa"``). A ``"swa"`` layer then keeps only the last
            ``sliding_window - 1`` positions.
        """
        layer_type = self._check_layer(layer_idx, ("attn", "swa"))
        self.seen_tokens[layer_idx] += key_states.shape[-2]
        past_keys, past_values = self.key_cache[layer_idx], self.value_cache[layer_idx]
        if past_keys is not None and past_values is not None:
            key_states = torch.cat([past_keys, key_states], dim=-2)
            value_states = torch.cat([past_values, value_states], dim=-2)
        if layer_type == "swa":
            assert self.sliding_window is not None
            start = max(key_states.shape[-2] - (self.sliding_window - 1), 0)
            self.key_cache[layer_idx] = key_states[..., start:, :]
            self.value_cache[layer_idx] = value_states[..., start:, :]
        else:
            self.key_cache[layer_idx] = key_states
            self.value_cache[layer_idx] = value_states
        return key_states, value_states

    def kept_length(self, layer_idx: int) -> int:
        """How many past positions an ``"attn"``/``"swa"`` layer holds (and will attend to)."""
        self._check_layer(layer_idx, ("attn", "swa"))
        keys = self.key_cache[layer_idx]
        return 0 if keys is None else keys.shape[-2]

    def jet_state(self, layer_idx: int) -> JetBlockState | None:
        """The state a ``"jet"`` layer left after the previous call (``None`` before the first)."""
        self._check_layer(layer_idx, ("jet",))
        return self.jet_states[layer_idx]

    def update_jet_state(self, layer_idx: int, state: JetBlockState, num_tokens: int) -> None:
        """Store the state of a ``"jet"`` layer after a call on ``num_tokens`` new positions."""
        self._check_layer(layer_idx, ("jet",))
        self.jet_states[layer_idx] = state
        self.seen_tokens[layer_idx] += num_tokens

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Positions seen so far by ``layer_idx`` (padding included); 0 for an empty cache."""
        return self.seen_tokens[layer_idx] if len(self) else 0

    def get_max_length(self, layer_idx: int | None = None) -> int:
        """``-1``: the cache has no maximum length (transformers >= 5 name)."""
        return -1

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:
        """``-1``: the cache has no maximum length (transformers 4.x name)."""
        return -1

    def _tensors(self) -> list[torch.Tensor]:
        found = [t for t in self.key_cache + self.value_cache if t is not None]
        for state in self.jet_states:
            if state is not None:
                found.extend(state)
        return found

    def cache_bytes(self) -> int:
        """Total bytes of every tensor the cache holds."""
        return sum(t.numel() * t.element_size() for t in self._tensors())

    @property
    def batch_size(self) -> int:
        """The cached batch size, or ``-1`` while the cache is empty."""
        tensors = self._tensors()
        return tensors[0].shape[0] if tensors else -1

    @property
    def is_initialized(self) -> bool:
        return bool(self._tensors())

    @property
    def is_sliding(self) -> list[bool]:
        return [t == "swa" for t in self.layer_types]

    @property
    def is_linear(self) -> list[bool]:
        # transformers reads "linear" as "keeps no sequence length"; every layer here counts its
        # positions, so generation may ask any layer for the length.
        return [False] * len(self)

    @property
    def is_dummy(self) -> list[bool]:
        return [False] * len(self)

    def _map_batch(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.key_cache = [None if t is None else fn(t) for t in self.key_cache]
        self.value_cache = [None if t is None else fn(t) for t in self.value_cache]
        self.jet_states = [
            None if s is None else JetBlockState(*(fn(t) for t in s)) for s in self.jet_states
        ]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Keep the batch rows ``beam_idx`` (in that order): beam search's reordering."""
        self._map_batch(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only the batch rows ``indices``."""
        self._map_batch(lambda t: t[indices.to(t.device)])

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat every batch row ``repeats`` times in place (row ``i`` becomes rows
        ``i·repeats … i·repeats + repeats - 1``)."""
        self._map_batch(lambda t: t.repeat_interleave(repeats, dim=0))

    def reset(self) -> None:
        """Forget everything (the cache then behaves like a new one)."""
        n = len(self)
        self.key_cache, self.value_cache = [None] * n, [None] * n
        self.jet_states = [None] * n
        self.seen_tokens = [0] * n

    def crop(self, tokens_to_remove: int) -> None:
        """Not supported: a JetBlock or sliding-window state cannot be rolled back."""
        raise NotImplementedError(
            "HybridCache cannot be cropped (JetBlock states and sliding windows cannot be rolled "
            "back), so assisted or speculative decoding is not supported"
        )

    def activate_past_recording(self) -> None:
        """Not supported: see :meth:`crop`."""
        self.crop(0)
