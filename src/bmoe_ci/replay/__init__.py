"""A reference model of the expert cache and the routing policies, written from docs/streaming.md and
docs/policies.md (not from the engine's C): given a run's route trace (v3) and its configuration, it
replays the LRU, the pins, prefetch, the drop rule and the substitution rule, and predicts every
decision and counter the engine reports."""

from bmoe_ci.replay.config import RunConfig
from bmoe_ci.replay.diff import Mismatch, mismatches
from bmoe_ci.replay.model import Prediction, replay
from bmoe_ci.replay.trace import Trace, TraceError, TraceRow, parse_trace

__all__ = [
    "Mismatch",
    "Prediction",
    "RunConfig",
    "Trace",
    "TraceError",
    "TraceRow",
    "mismatches",
    "parse_trace",
    "replay",
]
