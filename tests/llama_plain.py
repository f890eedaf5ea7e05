"""llama.cpp (llama-cpp-python) as the project's tests drive it: without its CPU weight repacking.

llama.cpp's CPU backend repacks Q4_0/Q8_0 weights into interleaved layouts, and on a CPU with AMX uses its
AMX kernels, through "extra buffer types", by default. In 0.3.36 those paths segfault in decode here
(the MoE Q8_0 fixture and Gemma 3 270M on an x86_64 CPU with AMX, seen 2026-12-02), so the tests ask
llama.cpp for its plain layout: the same block products, in its regular kernels.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def without_weight_repacking() -> Iterator[None]:
    """Models constructed inside load without extra buffer types. llama-cpp-python has no argument for
    it; its constructor reads the default parameters from this module attribute, swapped for the
    duration of the block."""
    import llama_cpp

    low = llama_cpp.llama_cpp
    original = low.llama_model_default_params

    def plain() -> Any:
        params = original()
        params.use_extra_bufts = False
        return params

    low.llama_model_default_params = plain
    try:
        yield
    finally:
        low.llama_model_default_params = original
