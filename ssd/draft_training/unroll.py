"""Training-time test (EAGLE-3): unroll the head a few draft steps on its own outputs, in one batched pass.

Step s at head position j is what drafting step s+1 sees at inference when the round starts right after
position j: its query sits at RoPE position j+s, reads (x_{j+1+s}, out_hidden of step s-1 at j), and attends to
the step-0 keys of positions <= j (true target features) plus its own earlier steps' keys at j (the diagonal).
Step 0 alone is exactly `Eagle3Head.forward_train`.
"""

import torch

from ssd.models.eagle3 import Eagle3Head, attend


def _shift_left(x: torch.Tensor, s: int) -> torch.Tensor:  # [B, L, ...] -> [B, L, ...], zero-filled at the end
    if s == 0:
        return x
    return torch.cat([x[:, s:], torch.zeros_like(x[:, :s])], dim=1)


def unrolled_logits(head: Eagle3Head, input_ids: torch.Tensor, hidden: torch.Tensor,
                    attention_mask: torch.Tensor, num_steps: int) -> list[torch.Tensor]:
    """input_ids [B, L], fused features hidden [B, L, d], attention_mask [B, L] (right padding)
    -> per step s: logits [B, L, draft_vocab] float32 (step s at position j predicts label row j+s)."""
    b, length = input_ids.shape
    device = input_ids.device
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()[None, None]  # [1, 1, L, L]
    causal = (causal & attention_mask.bool()[:, None, None, :]) | torch.eye(length, dtype=torch.bool, device=device)
    diagonal = torch.eye(length, dtype=torch.bool, device=device).expand(b, 1, length, length)  # [B, 1, L, L]
    keys, values, outputs = [], [], []
    for s in range(num_steps):
        positions = torch.arange(s, s + length, device=device)  # [L]
        emb = head.embed_tokens(_shift_left(input_ids, s)).to(hidden.dtype)  # [B, L, d]
        q, k, v = head.midlayer.qkv(emb, hidden, positions)
        keys.append(k)
        values.append(v)
        mask = torch.cat([causal.expand(b, 1, length, length), *([diagonal] * s)], dim=-1)  # [B, 1, L, (s+1)L]
        attn = attend(q, torch.cat(keys, dim=1), torch.cat(values, dim=1), mask)  # [B, L, H*D]
        hidden = head.midlayer.finish(attn, hidden)  # [B, L, d]: the next step self-conditions on it
        outputs.append(head.logits(hidden))
    return outputs
