"""torch.compile of a model's forward: one dynamic graph for every token count, cached on disk, warmed up once.

On CPU the graph is compiled by inductor (C++) with freezing, so inductor packs the linear weights for oneDNN
itself (the eager path's packed weights would be opaque to it: the compiled model's linears stay unpacked).
Attention is the opaque custom op `ssd::paged_attention` (ssd/layers/attention.py), so one graph serves
prefill, decode, verify and tree forwards. Token counts 1 and >= 2 are two graphs (torch specializes size 1).
Compiled artefacts go to `<ssd cache>/inductor` (TORCHINDUCTOR_CACHE_DIR, unless already set): a second start
loads them instead of compiling.
"""

import os
import time
from collections.abc import Callable

import structlog
import torch
from torch import nn

from ssd.config import COMPILE_MODES
from ssd.errors import InvalidRequestError
from ssd.paths import cache_root

log = structlog.get_logger(__name__)


def resolve_compile(mode: str, device: torch.device, enforce_eager: bool, tensor_parallel_size: int = 1) -> bool:
    """Whether to compile. `auto` = off everywhere so far: on the 2-core Zen 4 machine (shared, loaded) the
    compiled bf16 decode step measured slower than eager (208 vs 168 ms at batch 1, one thread, interleaved
    in one process) and its first start compiles for minutes; turn `auto` on where a measurement says so."""
    if mode not in COMPILE_MODES:
        raise InvalidRequestError(f"compile must be one of {COMPILE_MODES}, got {mode!r}")
    if enforce_eager or mode == "off":
        return False
    if tensor_parallel_size > 1:  # the collectives would break the graph at every layer
        if mode == "on":
            raise InvalidRequestError("compile runs one rank's model; use --compile off with tensor parallelism")
        return False
    return mode == "on"


def use_compile_cache() -> str:
    """Point inductor's on-disk caches at the project's cache folder (unless the caller chose one)."""
    folder = os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_root() / "inductor"))
    torch._inductor.config.fx_graph_cache = True
    return folder


class CompiledModel:
    """A model's forward compiled for every token count; `rows_for` says how many rows a forward runs on."""

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.device = device
        self.cache_dir = use_compile_cache()
        options = {"freezing": True} if device.type == "cpu" else {}
        self.forward: Callable = torch.compile(model, dynamic=True, options=options)

    def rows_for(self, num_tokens: int) -> int:
        """Rows the compiled graph runs on (dynamic shapes on CPU: exactly the tokens, no padding)."""
        return num_tokens

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor,
                 aux_layers: tuple[int, ...]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        return self.forward(input_ids, positions, aux_layers)


def warm_up(run: Callable[[int], None], token_counts: tuple[int, ...] = (1, 2)) -> float:
    """Run `run(n)` once per token count (the compiles happen there); logs each, a progress bar if slow."""
    from tqdm import tqdm

    started = time.perf_counter()
    bar = tqdm(token_counts, desc="compiling the model forward", unit="graph", delay=3.0, leave=False)
    for n in bar:
        t = time.perf_counter()
        run(n)
        log.info("compiled forward", num_tokens=n if n == 1 else f">= {n} (dynamic)",
                 seconds=round(time.perf_counter() - t, 1))
    bar.close()
    return time.perf_counter() - started
