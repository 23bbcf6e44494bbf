"""Where the project keeps downloaded and derived files (models, dataset wheels)."""

import os
from pathlib import Path


def cache_root() -> Path:
    """The cache folder: `$SSD_CACHE`, else `~/.cache/ssd-serve`. Read at call time, never at import."""
    env = os.environ.get("SSD_CACHE")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "ssd-serve"
    return root


def models_dir() -> Path:
    return cache_root() / "models"


def wheels_dir() -> Path:
    return cache_root() / "wheels"
