"""Frozen, validated configuration dataclasses, one per adapter method (``peft``'s convention).

Each config knows its ``method`` name, turns into a JSON-ready dict and back, and rejects bad
values with a message that says what was wrong and what is allowed.

Example:
    >>> cfg = PTMoEConfig(num_virtual_tokens=8, num_experts=2, rank=4)
    >>> config_from_dict(cfg.to_dict()) == cfg
    True
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar


def _positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _non_negative(name: str, value: object) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not value >= 0:
        raise ValueError(f"{name} must be a non-negative number, got {value!r}")


@dataclass(frozen=True)
class AdapterConfig:
    """Common base: the method name and the JSON round trip."""

    method: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for key, value in data.items():
            if isinstance(value, tuple):
                data[key] = list(value)
        return {"method": self.method, **data}


@dataclass(frozen=True)
class PTMoEConfig(AdapterConfig):
    """PT-MoE: a soft prompt ``P = Σ_i w_i A_i B`` with a top-1 router.

    Attributes:
        num_virtual_tokens: prompt length ``T`` (paper: 40).
        num_experts: ``N`` experts ``A_i ∈ ℝ^{T×R}`` (paper: 2).
        rank: ``R`` of the shared ``B ∈ ℝ^{R×H}`` (paper: 36); at most ``min(T, H)``.
        init_text: text whose token embeddings (repeated to ``T`` tokens) initialise ``A_i`` and
            ``B`` by SVD; ``None`` draws them at random.
        router_noise_std: std of the multiplicative noise ``ε`` on the router logits in training
            (paper: 0.01).
    """

    method: ClassVar[str] = "ptmoe"
    num_virtual_tokens: int = 40
    num_experts: int = 2
    rank: int = 36
    init_text: str | None = None
    router_noise_std: float = 0.01

    def __post_init__(self) -> None:
        _positive_int("num_virtual_tokens", self.num_virtual_tokens)
        _positive_int("num_experts", self.num_experts)
        _positive_int("rank", self.rank)
        _non_negative("router_noise_std", self.router_noise_std)
        if self.rank > self.num_virtual_tokens:
            raise ValueError(
                f"rank ({self.rank}) must be at most num_virtual_tokens ({self.num_virtual_tokens})"
            )
        if self.init_text is not None and not (
            isinstance(self.init_text, str) and self.init_text.strip()
        ):
            raise ValueError(
                f"init_text must be a non-empty string or None, got {self.init_text!r}"
            )


@dataclass(frozen=True)
class CaPTConfig(AdapterConfig):
    """CaPT: one capsule token at position 0, ``S_1 = p_1 + Mean(E)``.

    Attributes:
        deep: if true, every layer ``i > 1`` replaces the capsule's hidden state by
            ``p_i + Mean(S_{i-1} ⊕ H_{i-1})`` with its own learnable ``p_i``.
        init_std: std of the normal initialisation of the task vectors; 0 (default) starts from
            the pure instance-aware capsule.
    """

    method: ClassVar[str] = "capt"
    deep: bool = False
    init_std: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.deep, bool):
            raise TypeError(f"deep must be a bool, got {type(self.deep).__name__}")
        _non_negative("init_std", self.init_std)


@dataclass(frozen=True)
class LoPEConfig(AdapterConfig):
    """LoPE: asymmetric LoRA (shared ``A``, experts ``B_i``, router) + poisoning expert ``B_D``.

    Attributes:
        r: LoRA rank (paper: 4).
        num_experts: normal up-projection experts ``B_i`` (paper: 3); the poisoning expert is extra.
        lora_alpha: the update is scaled by ``lora_alpha / r``.
        target_modules: leaf names of the linear layers to adapt; ``None`` uses the architecture's
            default (``q_proj``/``v_proj`` for Llama and Qwen2, ``c_attn`` for GPT-2,
            ``query``/``value`` for BERT).
        lora_dropout: dropout on the adapter's input in training.
    """

    method: ClassVar[str] = "lope"
    r: int = 4
    num_experts: int = 3
    lora_alpha: float = 8.0
    target_modules: tuple[str, ...] | None = None
    lora_dropout: float = 0.0

    def __post_init__(self) -> None:
        _positive_int("r", self.r)
        _positive_int("num_experts", self.num_experts)
        _non_negative("lora_alpha", self.lora_alpha)
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"lora_dropout must be in [0, 1), got {self.lora_dropout!r}")
        if self.target_modules is not None:
            targets = self.target_modules
            if isinstance(targets, str) or not all(isinstance(t, str) and t for t in targets):
                raise TypeError(f"target_modules must be a list of module names, got {targets!r}")
            if not targets:
                raise ValueError("target_modules must not be empty (use None for the default)")
            object.__setattr__(self, "target_modules", tuple(targets))

    @property
    def scaling(self) -> float:
        return self.lora_alpha / self.r


CONFIG_CLASSES: dict[str, type[AdapterConfig]] = {
    cls.method: cls for cls in (PTMoEConfig, CaPTConfig, LoPEConfig)
}


def config_from_dict(data: dict[str, Any]) -> AdapterConfig:
    """Rebuild a config from :meth:`AdapterConfig.to_dict` output."""
    data = dict(data)
    method = data.pop("method", None)
    if method not in CONFIG_CLASSES:
        raise ValueError(f"unknown adapter method {method!r}; known: {sorted(CONFIG_CLASSES)}")
    cls = CONFIG_CLASSES[method]
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} fields {unknown}; known: {sorted(known)}")
    return cls(**data)
