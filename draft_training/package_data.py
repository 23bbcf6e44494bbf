"""Read the JSON tables in draft_training/data/: package data, so they load from an installed wheel as well."""

import json
from importlib import resources
from typing import Any


def read_json(name: str) -> Any:
    """The parsed contents of draft_training/data/`name`."""
    path = resources.files("draft_training") / "data" / name
    return json.loads(path.read_text(encoding="utf-8"))
