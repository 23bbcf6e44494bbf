"""The --quantization flag of every entry point that builds an engine (the target's linear weights)."""

import argparse

from ssd.config import QUANTIZATION_CHOICES, QUANTIZATION_PATTERN


def _quantization(value: str) -> str:
    if not QUANTIZATION_PATTERN.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not one of {', '.join(QUANTIZATION_CHOICES)}, int4:32, int4:64, int4:128, int4:256")
    return value


def add_quantization_flag(p: argparse.ArgumentParser, default: str = "none", whose: str = "the target's") -> None:
    """--quantization {none,auto,int8,int4,int4:G}: an EngineConfig.quantization value."""
    p.add_argument("--quantization", default=default, type=_quantization, metavar="{none,auto,int8,int4,int4:G}",
                   help=f"{whose} linear weights: none (float); auto (the checkpoint's own quantization, e.g. the "
                        f"default model's Q4_1 GGUF weights, else none); int8 (per channel, quantized at load); "
                        f"int4 (the checkpoint's own 4-bit weights, else quantized at load in groups of 32); "
                        f"int4:G (quantized at load in groups of G = 32, 64, 128 or 256, unless the checkpoint's "
                        f"own groups are G) (default {default})")
