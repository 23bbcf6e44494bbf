"""The SSD tree-decode attention mask (SSD.md section 4): every fork branch of one sequence in one forward.

Key layout of one sequence: `prefix` committed positions every branch sees, then `glue` positions (the
speculation just returned, run once), then one block of M positions per earlier tree depth (branch r of
depth d at prefix + glue + d*M + r). Branch r sees the first `glue_visible[r]` glue positions (those
before its fork point) and, at each depth up to the current one, only its own token.
Masks are built on CPU; the forward that consumes them moves them to the model's device.
"""

import numpy as np
import torch


def branch_mask(prefix: int, glue: int, glue_visible: list[int], depth: int) -> torch.Tensor:
    """-> [M, prefix + glue + (depth + 1) * M] bool (True = may attend) for the M branch queries of `depth`."""
    m = len(glue_visible)
    mask = np.zeros((m, prefix + glue + (depth + 1) * m), dtype=bool)
    mask[:, :prefix] = True
    mask[:, prefix : prefix + glue] = np.arange(glue)[None, :] < np.array(glue_visible, dtype=np.int64)[:, None]
    own = np.arange(m)  # branch r sees its own token at every depth
    for d in range(depth + 1):
        mask[own, prefix + glue + d * m + own] = True
    return torch.from_numpy(mask)
