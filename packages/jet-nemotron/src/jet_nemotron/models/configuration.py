"""Configuration of the hybrid causal LM: a Llama decoder whose token mixer is chosen per layer.

Each of the ``num_hidden_layers`` decoder layers mixes tokens with one of

* ``"attn"``: full causal softmax attention (Llama's, with RoPE and grouped key/value heads);
* ``"swa"``: the same attention restricted to the last ``sliding_window`` positions (the query's
  own included), with a key/value cache bounded by the window;
* ``"jet"``: a :class:`~jet_nemotron.modules.jet_block.JetBlock` shaped by ``jet_block``.

Every other field is Llama's, so that a Llama or Qwen2 checkpoint converts field by field
(:func:`jet_nemotron.models.convert.from_pretrained_llama`).
"""

from __future__ import annotations

import copy
from typing import Any

from transformers import PretrainedConfig
from transformers.activations import ACT2FN

from jet_nemotron.modules.jet_block import JetBlockConfig

LAYER_TYPES = ("attn", "swa", "jet")

# transformers >= 5 keeps RoPE settings in one `rope_parameters` dict (rope_type, rope_theta, ...);
# 4.x keeps `rope_theta` and a `rope_scaling` dict. Llama's rotary embedding reads whichever the
# installed version uses, so the config stores that form.
_ROPE_PARAMETERS = hasattr(PretrainedConfig, "convert_rope_params_to_dict")


def _check_positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"HybridConfig.{name} must be a positive integer, got {value!r}")


def check_layer_types(layer_types: Any, num_hidden_layers: int) -> list[str]:
    """``layer_types`` as a list after checking it names one known mixer per layer.

    Raises:
        ValueError: not a list of strings, an unknown type, or a length other than
            ``num_hidden_layers``.
    """
    if isinstance(layer_types, str) or not isinstance(layer_types, list | tuple):
        raise ValueError(f"layer_types must be a list of strings, got {layer_types!r}")
    unknown = sorted({str(t) for t in layer_types if t not in LAYER_TYPES})
    if unknown:
        raise ValueError(f"unknown layer types {unknown} in layer_types; allowed: {LAYER_TYPES}")
    if len(layer_types) != num_hidden_layers:
        raise ValueError(
            f"layer_types has {len(layer_types)} entries but num_hidden_layers is "
            f"{num_hidden_layers}: give one type per layer"
        )
    return list(layer_types)


class HybridConfig(PretrainedConfig):
    """Configuration of :class:`~jet_nemotron.models.modeling.HybridForCausalLM`.

    The Llama fields keep Llama's meaning and defaults (``num_key_value_heads`` defaults to
    ``num_attention_heads``, ``head_dim`` to ``hidden_size // num_attention_heads``); RoPE is given
    as ``rope_parameters`` (transformers 5) or ``rope_theta`` + ``rope_scaling`` (4.x), either
    accepted on any version. ``attention_bias`` puts biases on the q/k/v projections and, unless
    ``attention_output_bias`` says otherwise, on the output projection (Llama); Qwen2 is
    ``attention_bias=True, attention_output_bias=False``.

    Args:
        layer_types: one of ``"attn"``, ``"swa"``, ``"jet"`` per layer; default all ``"attn"``.
        sliding_window: how many positions a ``"swa"`` query sees, itself included; required
            when a ``"swa"`` layer exists.
        jet_block: the :class:`JetBlockConfig` fields of every ``"jet"`` layer, as a dict (a
            ``JetBlockConfig`` is accepted too). Default: ``num_heads = num_attention_heads``,
            ``head_dim = head_dim``, ``expand_v = 1.0`` (the attention's shape, so a converted
            block can start from the attention's projections), the other fields at their
            defaults.

    Raises:
        ValueError: a size that is not a positive integer, ``num_attention_heads`` not a multiple
            of ``num_key_value_heads``, an odd ``head_dim``, an unknown activation, bad
            ``layer_types``, a missing or bad ``sliding_window``, or bad ``jet_block`` fields.

    Example:
        >>> config = HybridConfig(
        ...     vocab_size=128,
        ...     hidden_size=64,
        ...     intermediate_size=128,
        ...     num_hidden_layers=3,
        ...     num_attention_heads=4,
        ...     num_key_value_heads=2,
        ...     layer_types=["attn", "swa", "jet"],
        ...     sliding_window=16,
        ... )
        >>> config.jet_block_config.num_heads, config.jet_block_config.head_dim
        (4, 16)
    """

    model_type = "jet_hybrid"

    def __init__(
        self,
        vocab_size: int = 32000,
        hidden_size: int = 4096,
        intermediate_size: int = 11008,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = None,
        head_dim: int | None = None,
        hidden_act: str = "silu",
        max_position_embeddings: int = 2048,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        use_cache: bool = True,
        pad_token_id: int | None = None,
        bos_token_id: int | None = 1,
        eos_token_id: int | list[int] | None = 2,
        tie_word_embeddings: bool = False,
        rope_theta: float = 10000.0,
        rope_scaling: dict[str, Any] | None = None,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_output_bias: bool | None = None,
        attention_dropout: float = 0.0,
        mlp_bias: bool = False,
        layer_types: list[str] | None = None,
        sliding_window: int | None = None,
        jet_block: dict[str, Any] | JetBlockConfig | None = None,
        **kwargs: Any,
    ) -> None:
        for name, value in (
            ("vocab_size", vocab_size),
            ("hidden_size", hidden_size),
            ("intermediate_size", intermediate_size),
            ("num_hidden_layers", num_hidden_layers),
            ("num_attention_heads", num_attention_heads),
            ("max_position_embeddings", max_position_embeddings),
        ):
            _check_positive_int(name, value)
        num_key_value_heads = (
            num_attention_heads if num_key_value_heads is None else num_key_value_heads
        )
        _check_positive_int("num_key_value_heads", num_key_value_heads)
        if num_attention_heads % num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({num_key_value_heads})"
            )
        if head_dim is None:
            if hidden_size % num_attention_heads:
                raise ValueError(
                    f"hidden_size ({hidden_size}) is not a multiple of num_attention_heads "
                    f"({num_attention_heads}); give head_dim explicitly"
                )
            head_dim = hidden_size // num_attention_heads
        _check_positive_int("head_dim", head_dim)
        if head_dim % 2:
            raise ValueError(f"head_dim must be even (RoPE rotates pairs), got {head_dim}")
        if hidden_act not in ACT2FN:
            raise ValueError(f"unknown hidden_act {hidden_act!r}; allowed: {sorted(ACT2FN)}")
        if not 0.0 <= attention_dropout < 1.0:
            raise ValueError(f"attention_dropout must be in [0, 1), got {attention_dropout}")
        if rms_norm_eps <= 0:
            raise ValueError(f"rms_norm_eps must be positive, got {rms_norm_eps}")
        if layer_types is None:
            layer_types = ["attn"] * num_hidden_layers
        layer_types = check_layer_types(layer_types, num_hidden_layers)
        if sliding_window is not None:
            _check_positive_int("sliding_window", sliding_window)
        elif "swa" in layer_types:
            raise ValueError("layer_types contains 'swa' layers: give sliding_window")
        if isinstance(jet_block, JetBlockConfig):
            jet_block = jet_block.to_dict()
        elif jet_block is None:
            jet_block = {"num_heads": num_attention_heads, "head_dim": head_dim, "expand_v": 1.0}
        elif not isinstance(jet_block, dict):
            raise ValueError(
                f"jet_block must be a dict of JetBlockConfig fields, got {jet_block!r}"
            )

        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.use_cache = use_cache
        self.attention_bias = attention_bias
        self.attention_output_bias = (
            attention_bias if attention_output_bias is None else attention_output_bias
        )
        self.attention_dropout = attention_dropout
        self.mlp_bias = mlp_bias
        self.sliding_window = sliding_window
        self.jet_block = JetBlockConfig.from_dict(jet_block).to_dict()
        kwargs.update(self._rope_fields(rope_theta, rope_scaling, rope_parameters))
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )
        # Set after the base class's checks, which on transformers >= 5 accept only its own
        # layer-type names ("full_attention", ...); `validate` checks ours.
        self.layer_types = layer_types

    def _rope_fields(
        self,
        rope_theta: float,
        rope_scaling: dict[str, Any] | None,
        rope_parameters: dict[str, Any] | None,
    ) -> dict[str, Any]:
        """Store RoPE in the installed transformers' form; return what the base class takes."""
        if _ROPE_PARAMETERS:
            # The base class merges rope_theta / rope_scaling into rope_parameters and checks it.
            self.rope_parameters = copy.deepcopy(rope_parameters)
            return {"rope_theta": rope_theta, "rope_scaling": copy.deepcopy(rope_scaling)}
        parameters = copy.deepcopy(rope_parameters or rope_scaling or {})
        self.rope_theta = parameters.pop("rope_theta", rope_theta)
        rope_type = parameters.get("rope_type", parameters.get("type", "default"))
        self.rope_scaling = parameters if rope_type != "default" else None
        return {}

    @property
    def jet_block_config(self) -> JetBlockConfig:
        """The ``jet_block`` dict as a validated :class:`JetBlockConfig`."""
        return JetBlockConfig.from_dict(self.jet_block)

    def validate(self) -> None:
        """Run transformers' checks (>= 5) except its layer-type one, then the hybrid's own.

        transformers calls this before saving; its layer-type check only knows its own names.
        """
        for validator in getattr(PretrainedConfig, "__class_validators__", ()):
            if validator.__name__ != "validate_layer_type":
                validator(self)
        check_layer_types(self.layer_types, self.num_hidden_layers)
        if "swa" in self.layer_types and self.sliding_window is None:
            raise ValueError("layer_types contains 'swa' layers: give sliding_window")
        JetBlockConfig.from_dict(self.jet_block)
