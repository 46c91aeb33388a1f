"""lpc-cache: learned prefix-cache eviction (LPC, NeurIPS 2025) with a token-block radix cache
simulator, the classic policies (LRU, LFU, FIFO), offline bounds (Belady, Oracle) and real
ShareGPT traces."""

from importlib import metadata as _metadata

from lpc_cache.cache import Lease, Node, PrefixCache, block_hashes
from lpc_cache.encoders import E5Encoder, HashingEncoder, SentenceEncoder, TextEncoder
from lpc_cache.policies import (
    POLICIES,
    Access,
    BeladyPolicy,
    EvictionPolicy,
    FIFOPolicy,
    LFUPolicy,
    LPCPolicy,
    LRUPolicy,
    OraclePolicy,
    UntouchedFirst,
    make_policy,
)
from lpc_cache.predictor import (
    ContinuationPredictor,
    PredictorConfig,
    combined_text,
    mcc,
    mcc_threshold,
    roc_auc,
    split_conversations,
    trace_features,
    train_rows,
)
from lpc_cache.simulator import (
    PreparedTrace,
    ServingModel,
    SimulationResult,
    capacity_at_hit_ratio,
    capacity_for_hit_ratio,
    prepare,
    simulate,
    sweep,
)
from lpc_cache.trace import (
    Request,
    Trace,
    TraceConfig,
    build_trace,
    load_trace,
    save_trace,
    sharegpt_trace,
)

try:
    __version__ = _metadata.version("lpc-cache")
except _metadata.PackageNotFoundError:  # imported from a source tree (PYTHONPATH), not installed
    __version__ = "0.0.0+source"

__all__ = [
    "POLICIES",
    "Access",
    "BeladyPolicy",
    "ContinuationPredictor",
    "E5Encoder",
    "EvictionPolicy",
    "FIFOPolicy",
    "HashingEncoder",
    "LFUPolicy",
    "LPCPolicy",
    "LRUPolicy",
    "Lease",
    "Node",
    "OraclePolicy",
    "PredictorConfig",
    "PrefixCache",
    "PreparedTrace",
    "Request",
    "SentenceEncoder",
    "ServingModel",
    "SimulationResult",
    "TextEncoder",
    "Trace",
    "TraceConfig",
    "UntouchedFirst",
    "__version__",
    "block_hashes",
    "build_trace",
    "capacity_at_hit_ratio",
    "capacity_for_hit_ratio",
    "combined_text",
    "load_trace",
    "make_policy",
    "mcc",
    "mcc_threshold",
    "prepare",
    "roc_auc",
    "save_trace",
    "sharegpt_trace",
    "simulate",
    "split_conversations",
    "sweep",
    "trace_features",
    "train_rows",
]
