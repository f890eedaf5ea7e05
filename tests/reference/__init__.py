"""Independent numpy reference of the engine's forward pass (see forward.py and docs/model-math.md)."""

from .forward import Generation, HParams, Model, ModelError, Route, shard_paths

__all__ = ["Generation", "HParams", "Model", "ModelError", "Route", "shard_paths"]
