"""Training-time test (EAGLE-3): unroll the head a few draft steps on its own outputs, in one batched pass.

Step s at head position j is what drafting step s+1 sees at inference when the round starts right after
position j: its query sits at RoPE position j+s, reads (x_{j+1+s}, out_hidden of step s-1 at j), and attends to
the step-0 keys of positions <= j (true target features) plus its own earlier steps' keys at j (the diagonal).
Step 0 alone is exactly `Eagle3Head.forward_train`.
"""

import torch

from ssd.models.eagle3 import Eagle3Head


def _shift_left(x: torch.Tensor, s: int) -> torch.Tensor:  # [B, L, ...] -> [B, L, ...], zero-filled at the end
    if s == 0:
        return x
    return torch.cat([x[:, s:], torch.zeros_like(x[:, :s])], dim=1)


def unrolled_attention(
    q: torch.Tensor,  # [B, L, H, D] queries of step s
    keys: list[torch.Tensor],  # s + 1 tensors [B, L, KVH, D]: step 0's keys, then each later step's
    values: list[torch.Tensor],  # like keys
    causal: torch.Tensor,  # [B, 1, L, L] bool, True = may attend (step 0's keys)
) -> torch.Tensor:  # [B, L, H*D]
    """Attention of step s: causal over step 0's keys plus, for each later step, only the key at the same
    position (the diagonal). The diagonals are per-position dot products instead of masked L x L blocks,
    which makes the unroll's attention cost that of step 0 (torch's CPU SDPA backward over the masked
    [L, (s+1)L] scores was a quarter of a training step)."""
    b, length, h, d = q.shape
    kvh = keys[0].shape[2]
    g = h // kvh  # query heads per KV head
    scale = d**-0.5
    qg = q.view(b, length, kvh, g, d)  # [B, L, KVH, G, D]
    qh = qg.permute(0, 2, 3, 1, 4).reshape(b, kvh, g * length, d)  # [B, KVH, G*L, D]
    k0 = keys[0].permute(0, 2, 3, 1)  # [B, KVH, D, L]
    scores = (qh @ k0).float().view(b, kvh, g, length, length) * scale  # [B, KVH, G, L, L]
    scores = scores.masked_fill(~causal[:, :, None], float("-inf"))  # causal [B, 1, 1, L, L]
    diagonal = [(qg * k[:, :, :, None]).sum(-1).float().permute(0, 2, 3, 1)[..., None] * scale
                for k in keys[1:]]  # s x [B, KVH, G, L, 1]
    probs = torch.softmax(torch.cat([scores, *diagonal], dim=-1), dim=-1).to(q.dtype)  # [B, KVH, G, L, L+s]
    v0 = values[0].permute(0, 2, 1, 3)  # [B, KVH, L, D]
    out = (probs[..., :length].reshape(b, kvh, g * length, length) @ v0).view(b, kvh, g, length, d)
    for i, v in enumerate(values[1:]):
        out = out + probs[..., length + i, None] * v.permute(0, 2, 1, 3)[:, :, None]  # v [B, KVH, 1, L, D]
    return out.permute(0, 3, 1, 2, 4).reshape(b, length, h * d)  # [B, L, H*D]


def unrolled_logits(head: Eagle3Head, input_ids: torch.Tensor, hidden: torch.Tensor,
                    attention_mask: torch.Tensor, num_steps: int) -> list[torch.Tensor]:
    """input_ids [B, L], fused features hidden [B, L, d], attention_mask [B, L] (right padding)
    -> per step s: logits [B, L, draft_vocab] float32 (step s at position j predicts label row j+s)."""
    length = input_ids.shape[1]
    device = input_ids.device
    eye = torch.eye(length, dtype=torch.bool, device=device)
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()[None, None]  # [1, 1, L, L]
    causal = (causal & attention_mask.bool()[:, None, None, :]) | eye  # [B, 1, L, L]; padded rows stay finite
    keys, values, outputs = [], [], []
    for s in range(num_steps):
        positions = torch.arange(s, s + length, device=device)  # [L]
        emb = head.embed_tokens(_shift_left(input_ids, s)).to(hidden.dtype)  # [B, L, d]
        q, k, v = head.midlayer.qkv(emb, hidden, positions)
        keys.append(k)
        values.append(v)
        attn = unrolled_attention(q, keys, values, causal)  # [B, L, H*D]
        hidden = head.midlayer.finish(attn, hidden)  # [B, L, d]: the next step self-conditions on it
        outputs.append(head.logits(hidden))
    return outputs
