"""Independent numpy reference of the engine's forward pass (see forward.py and docs/model-math.md),
and the reference outputs the REF gate compares devices against (outputs.py)."""

from .agree import QUANT_FLIP, QUANT_FLIP_LLAMA_CPP, Agreement, agreement
from .forward import Generation, HParams, Model, ModelError, Route, shard_paths
from .outputs import GATE_REQUEST, ReferenceOutput, ReferenceRequest, code_hash, compute, relative_error

__all__ = [
    "GATE_REQUEST",
    "QUANT_FLIP",
    "QUANT_FLIP_LLAMA_CPP",
    "Agreement",
    "Generation",
    "HParams",
    "Model",
    "ModelError",
    "ReferenceOutput",
    "ReferenceRequest",
    "Route",
    "agreement",
    "code_hash",
    "compute",
    "relative_error",
    "shard_paths",
]
