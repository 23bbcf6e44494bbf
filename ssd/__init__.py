"""ssd-serve engine: models, paged KV cache, scheduler, sampling, speculation.

`from ssd import LLM, SamplingParams` is resolved lazily, so `import ssd` itself loads no torch.
"""

from typing import Any

__all__ = ["LLM", "SamplingParams"]


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from ssd.llm import LLM

        return LLM
    if name == "SamplingParams":
        from ssd.sampling.params import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'ssd' has no attribute {name!r}")
