"""The SSD tree-decode attention mask (SSD.md section 4): every fork branch of one sequence in one forward.

Key layout of one sequence: `prefix` committed positions every branch sees, then `glue` positions (the
speculation just returned, run once), then one block of M positions per earlier tree depth (branch r of
depth d at prefix + glue + d*M + r). Branch r sees the first `glue_visible[r]` glue positions (those
before its fork point) and, at each depth up to the current one, only its own token.
Masks are built on CPU; the forward that consumes them moves them to the model's device.
"""

import torch


def branch_mask(prefix: int, glue: int, glue_visible: list[int], depth: int) -> torch.Tensor:
    """-> [M, prefix + glue + (depth + 1) * M] bool (True = may attend) for the M branch queries of `depth`."""
    m = len(glue_visible)
    mask = torch.zeros(m, prefix + glue + (depth + 1) * m, dtype=torch.bool)
    mask[:, :prefix] = True
    visible = torch.tensor(glue_visible)[:, None]  # [M, 1]
    mask[:, prefix : prefix + glue] = torch.arange(glue)[None, :] < visible
    eye = torch.eye(m, dtype=torch.bool)
    for d in range(depth + 1):
        start = prefix + glue + d * m
        mask[:, start : start + m] = eye
    return mask
