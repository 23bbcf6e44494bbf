"""EAGLE-3 draft head: `fc` fuses three target feature layers, one decoder layer drafts over a trimmed vocabulary.

Alignment. The target's fused feature g_j comes from its aux hidden states at position j (when it processed
token x_j). The head's input at its position j is the pair (embedding of x_{j+1}, g_j), and its output predicts
x_{j+2}; so head position j (RoPE position j, cache index j) lags the target's sequence by one. Later draft steps
self-condition: their input is (embedding of the token just drafted, the head's own `out_hidden` of the step
before). The midlayer's residual stream is the feature stream: `out_hidden` is pre-norm, `norm` feeds `lm_head`.
Draft ids map to target ids by `target_id = draft_id + d2t[draft_id]`; `t2d[target_id]` says whether a target
token is in the draft vocabulary.
Devices. The inference methods take index inputs (token ids, positions, masks) on any device, CPU included,
and move them to the head's; hidden states, KV and returned logits stay on the head's device.
"""

from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ssd.errors import CheckpointError
from ssd.layers import cpu_kernels
from ssd.layers.linear import pack_float, packed_linear
from ssd.layers.norm import RMSNorm
from ssd.layers.padded_attention import MAX_MATMUL_QUERIES, bucketed, head_major_attention
from ssd.layers.rotary import get_rope
from ssd.model_config import ModelConfig, RopeConfig, _rope_from


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """The three target layers whose entering residual stream feeds the head: (2, L/2, L-3) as in EAGLE-3 / vLLM
    wherever those are three increasing layers (L >= 7); shallower targets (test models) get (0, L/2, L-1)."""
    if num_layers < 3:
        raise CheckpointError(f"an EAGLE-3 head reads three target layers; this target has {num_layers}")
    if num_layers >= 7:
        return (2, num_layers // 2, num_layers - 3)
    return (0, num_layers // 2, num_layers - 1)


@dataclass(frozen=True)
class Eagle3Config:
    hidden_size: int  # d: the head's width
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    vocab_size: int  # the target's vocabulary
    draft_vocab_size: int  # rows of the head's lm_head
    target_hidden_size: int  # width of each target feature layer
    aux_layers: tuple[int, int, int]  # target layers whose entering residual stream is used
    rope: RopeConfig = field(default_factory=RopeConfig)
    # Ours, not in public EAGLE-3: RMS-normalize each aux layer (no weight) before `fc`. Small targets carry
    # massive activations in their residual stream (SmolLM2: |x| up to ~25000 in a few dims), which swamp fc.
    feature_norm: bool = False

    @classmethod
    def from_target(cls, target: ModelConfig, draft_vocab_size: int,
                    aux_layers: tuple[int, int, int] | None = None, feature_norm: bool = True) -> "Eagle3Config":
        """A head as wide as the target, with the target's attention shape, RoPE and MLP width."""
        return cls(
            hidden_size=target.hidden_size,
            num_attention_heads=target.num_attention_heads,
            num_key_value_heads=target.num_key_value_heads,
            head_dim=target.head_dim,
            intermediate_size=target.intermediate_size,
            rms_norm_eps=target.rms_norm_eps,
            max_position_embeddings=target.max_position_embeddings,
            vocab_size=target.vocab_size,
            draft_vocab_size=draft_vocab_size,
            target_hidden_size=target.hidden_size,
            aux_layers=tuple(aux_layers or default_aux_layers(target.num_hidden_layers)),  # type: ignore[arg-type]
            rope=target.rope,
            feature_norm=feature_norm,
        )

    def to_dict(self) -> dict[str, Any]:
        """config.json contents in the public EAGLE-3 (Llama-style) layout, plus `aux_layers`."""
        raw = {k: v for k, v in asdict(self).items() if k != "rope"}
        raw["aux_layers"] = list(self.aux_layers)
        rope = {"rope_theta": self.rope.theta, "rope_type": self.rope.rope_type}
        if self.rope.rope_type == "llama3":
            rope.update(factor=self.rope.factor, low_freq_factor=self.rope.low_freq_factor,
                        high_freq_factor=self.rope.high_freq_factor,
                        original_max_position_embeddings=self.rope.original_max_position_embeddings)
        return {
            "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
            "tie_word_embeddings": False, "hidden_act": "silu", **raw,
            "rope_theta": self.rope.theta, "rope_parameters": rope,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(self.aux_layers)},
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any], target_num_layers: int | None = None) -> "Eagle3Config":
        """Parse config.json; `aux_layers` falls back to `eagle_config`, then to the default for the target."""
        try:
            hidden = int(raw["hidden_size"])
            heads = int(raw["num_attention_heads"])
            aux = raw.get("aux_layers") or (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
            if aux is None:
                if target_num_layers is None:
                    raise CheckpointError("EAGLE-3 config has no aux_layers and no target layer count was given")
                aux = default_aux_layers(target_num_layers)
            if len(aux) != 3:
                raise CheckpointError(f"EAGLE-3 aux_layers must name 3 layers, got {aux}")
            if target_num_layers is not None and max(aux) >= target_num_layers:
                raise CheckpointError(f"EAGLE-3 aux_layers {list(aux)} need a target deeper than its "
                                      f"{target_num_layers} layers: this head was trained for another target")
            return cls(
                hidden_size=hidden,
                num_attention_heads=heads,
                num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
                head_dim=int(raw.get("head_dim") or hidden // heads),
                intermediate_size=int(raw["intermediate_size"]),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
                vocab_size=int(raw["vocab_size"]),
                draft_vocab_size=int(raw.get("draft_vocab_size") or raw["vocab_size"]),
                target_hidden_size=int(raw.get("target_hidden_size") or hidden),
                aux_layers=tuple(int(a) for a in aux),  # type: ignore[arg-type]
                rope=_rope_from(raw),
                feature_norm=bool(raw.get("feature_norm", False)),
            )
        except KeyError as e:
            raise CheckpointError(f"EAGLE-3 config lacks required field {e.args[0]!r}") from e


class HeadKVCache:
    """Dense KV of one sequence for the head's one layer, in the layout of the engine's KV blocks ([2, KVH, slots,
    D]: one slot per position), so the CPU layer op `rope_attention` reads and writes it in place. Rollback is
    `truncate(n)`: set the length, copy nothing. Capacity stays a multiple of KEY_BUCKET, so the torch attention
    can read a whole bucket of keys (`bucket_kv`)."""

    def __init__(self, num_kv_heads: int, head_dim: int, dtype: torch.dtype = torch.float32,
                 capacity: int = 256, device: torch.device | None = None) -> None:
        capacity = bucketed(max(capacity, 1))
        self.kv = torch.zeros(2, num_kv_heads, capacity, head_dim, dtype=dtype, device=device)  # [2, KVH, max_len, D]
        self.length = 0

    @property
    def k(self) -> torch.Tensor:  # [max_len, KVH, D] view
        return self.kv[0].transpose(0, 1)

    @property
    def v(self) -> torch.Tensor:  # [max_len, KVH, D] view
        return self.kv[1].transpose(0, 1)

    def reserve(self, end: int) -> None:
        """Grow the capacity to hold `end` positions (doubling, whole buckets)."""
        if end > self.kv.shape[2]:
            grown = self.kv.new_zeros(*self.kv.shape[:2], bucketed(max(end, 2 * self.kv.shape[2])), self.kv.shape[3])
            grown[:, :, : self.kv.shape[2]] = self.kv
            self.kv = grown

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:  # [n, KVH, D] each
        end = self.length + k.shape[0]
        self.reserve(end)
        self.k[self.length : end] = k
        self.v[self.length : end] = v
        self.length = end

    def bucket_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v [S, KVH, D] (views) over the first S = bucketed(length) rows: rows past `length` are zeros or stale
        scratch that the caller's attention mask must hide."""
        n = bucketed(self.length)
        return self.k[:n], self.v[:n]

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of length {self.length} to {length}")
        self.length = length


def visible_slots(mask: torch.Tensor) -> torch.Tensor:
    """mask [n, S] bool (True = may attend; every row shows at least one key) -> [n, max shown] int64: each row's
    shown key slots in increasing order, padded with hidden ones (a row reads only its first mask.sum() entries)."""
    order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)  # shown slots first, each part in order
    return order[:, : int(mask.sum(1).max())].contiguous()


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """q [B, T, H, D], k/v [B, S, KVH, D], mask [B|1, 1, T, S] bool (True = may attend) -> [B, T, H*D]."""
    if q.shape[1] <= MAX_MATMUL_QUERIES and not torch.is_grad_enabled():  # drafting: matmuls beat CPU SDPA
        k_heads, v_heads = k.permute(2, 0, 1, 3), v.permute(2, 0, 1, 3)  # [KVH, B, S, D]
        return head_major_attention(q, k_heads, v_heads, mask, q.shape[-1] ** -0.5).flatten(2)
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
        scale=q.shape[-1] ** -0.5, enable_gqa=q.shape[2] != k.shape[2],
    )  # [B, H, T, D]
    return out.transpose(1, 2).flatten(2)


class HeadLinear(nn.Linear):
    """A trainable linear layer that, once `pack`ed for inference, multiplies through the own float kernel or
    oneDNN's packed weight (faster than `F.linear` for the few rows a draft step has). Training never packs."""

    packed: torch.Tensor | None = None
    own: cpu_kernels.OwnMatmul | None = None  # the own float kernel (set by `pack`)

    def pack(self) -> None:
        self.packed, self.own = pack_float(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        if torch.is_grad_enabled():  # training: the packed forms are inference copies
            return F.linear(x, self.weight, self.bias)
        y = packed_linear(x.reshape(-1, x.shape[-1]), self.packed, self.weight, self.bias, self.own)  # [N, out]
        return y.view(*x.shape[:-1], y.shape[-1])


@dataclass(frozen=True)
class _FusedLinear:
    """Inference linears that read the same input, as one packed matmul: their outputs side by side."""

    weight: torch.Tensor  # [sum of outs, in]
    packed: torch.Tensor | None
    own: cpu_kernels.OwnMatmul | None

    @classmethod
    def of(cls, *linears: nn.Linear) -> "_FusedLinear":
        weight = torch.cat([layer.weight.detach() for layer in linears])
        return cls(weight, *pack_float(weight))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [N, in] -> [N, sum of outs]
        return packed_linear(x, self.packed, self.weight, None, self.own)


class Eagle3Attention(nn.Module):
    """q/k/v read the concatenation [embedding, feature] (width 2d); o writes back to d."""

    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        d, hd = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, hd
        self.q_proj = HeadLinear(2 * d, self.num_heads * hd, bias=False)
        self.k_proj = HeadLinear(2 * d, self.num_kv_heads * hd, bias=False)
        self.v_proj = HeadLinear(2 * d, self.num_kv_heads * hd, bias=False)
        self.o_proj = HeadLinear(self.num_heads * hd, d, bias=False)
        self.rotary_emb = get_rope(hd, config.max_position_embeddings, config.rope)
        self.fused: _FusedLinear | None = None  # inference: q, k and v as one matmul (`pack`)

    def pack(self) -> None:
        """For inference: q, k and v projected by one packed matmul (`rows`)."""
        self.fused = _FusedLinear.of(self.q_proj, self.k_proj, self.v_proj)

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, 2d] -> the fused projection [N, (H + 2 KVH) D], before RoPE (inference, after `pack`)."""
        if self.fused is None:
            raise RuntimeError("Eagle3Attention.rows needs pack() first")
        return self.fused(x)

    def project(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, 2d], positions [T] -> q [B, T, H, D], k [B, T, KVH, D], v [B, T, KVH, D] (RoPE applied)."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim)
        return self.rotary_emb(positions, q), self.rotary_emb(positions, k), v


class Eagle3MLP(nn.Module):
    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        d, m = config.hidden_size, config.intermediate_size
        self.gate_proj = HeadLinear(d, m, bias=False)
        self.up_proj = HeadLinear(d, m, bias=False)
        self.down_proj = HeadLinear(m, d, bias=False)
        self.gate_up: _FusedLinear | None = None  # inference: gate and up as one matmul (`pack`)

    def pack(self) -> None:
        self.gate_up = _FusedLinear.of(self.gate_proj, self.up_proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., d] -> [..., d]
        ops = cpu_kernels.layer_ops_for(x) if self.gate_up is not None and x.dim() == 2 else None
        if ops is not None:
            return self.down_proj(ops.silu_mul(self.gate_up(x)))  # [N, 2m] -> [N, m] -> [N, d]
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Eagle3MidLayer(nn.Module):
    """The one decoder layer; split in two halves so cached, batched and unrolled forwards share it."""

    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        d, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = RMSNorm(d, eps)
        self.hidden_norm = RMSNorm(d, eps)
        self.self_attn = Eagle3Attention(config)
        self.post_attention_layernorm = RMSNorm(d, eps)
        self.mlp = Eagle3MLP(config)

    def qkv_rows(self, emb: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """emb, hidden [N, d] -> the fused q, k, v projection [N, (H + 2 KVH) D] of concat[norm(emb), norm(hidden)]."""
        return self.self_attn.rows(torch.cat([self.input_layernorm(emb), self.hidden_norm(hidden)], dim=-1))

    def qkv(self, emb: torch.Tensor, hidden: torch.Tensor,
            positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """emb, hidden [B, T, d] -> q, k, v of the attention input concat[norm(emb), norm(hidden)]."""
        x = torch.cat([self.input_layernorm(emb), self.hidden_norm(hidden)], dim=-1)  # [B, T, 2d]
        return self.self_attn.project(x, positions)

    def finish(self, attn: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """attn [..., H*D], residual hidden [..., d] -> out_hidden [..., d] (pre-norm)."""
        normed, h = self.post_attention_layernorm(self.self_attn.o_proj(attn), hidden)  # h = hidden + o(attn)
        return h + self.mlp(normed)


class Eagle3Head(nn.Module):
    def __init__(self, config: Eagle3Config, target_embedding: torch.Tensor | None = None) -> None:
        super().__init__()
        self.config = config
        d = config.hidden_size
        self.fc = HeadLinear(3 * config.target_hidden_size, d, bias=False)
        self.midlayer = Eagle3MidLayer(config)
        self.norm = RMSNorm(d, config.rms_norm_eps)
        self.lm_head = HeadLinear(d, config.draft_vocab_size, bias=False)
        emb = torch.zeros(config.vocab_size, d) if target_embedding is None else target_embedding.detach()
        self.embed_tokens = nn.Embedding.from_pretrained(emb, freeze=True)  # the target's, frozen
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))  # [draft_vocab]
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))  # [vocab]
        for norm in (self.norm, self.midlayer.input_layernorm, self.midlayer.hidden_norm,
                     self.midlayer.post_attention_layernorm):
            norm.weight.requires_grad_(True)  # the engine's RMSNorm is frozen by default; the head trains it

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    def new_cache(self, capacity: int = 256) -> HeadKVCache:
        c = self.config
        return HeadKVCache(c.num_key_value_heads, c.head_dim, self.fc.weight.dtype, capacity, self.device)

    def fuse(self, features: torch.Tensor) -> torch.Tensor:  # [..., 3*d_target] -> [..., d]
        if self.config.feature_norm:
            parts = features.float().unflatten(-1, (3, self.config.target_hidden_size))  # [..., 3, d_target]
            parts = parts * torch.rsqrt(parts.pow(2).mean(-1, keepdim=True) + self.config.rms_norm_eps)
            features = parts.flatten(-2)
        return self.fc(features.to(self.fc.weight.dtype))

    def logits(self, out_hidden: torch.Tensor) -> torch.Tensor:  # [..., d] -> [..., draft_vocab] float32
        return self.lm_head(self.norm(out_hidden)).float()

    def forward(self, input_ids: torch.Tensor, hidden: torch.Tensor,
                cache: HeadKVCache) -> tuple[torch.Tensor, torch.Tensor]:
        """n new positions of one sequence at cache.length..: input_ids [n] (target ids), hidden [n, d]
        -> (out_hidden [n, d], draft logits [n, draft_vocab] float32); appends the new K/V to `cache`."""
        positions = torch.arange(cache.length, cache.length + len(input_ids))  # [n]
        outs, logits = self.forward_many([input_ids], [hidden], [positions], [None], [cache])
        return outs[0], logits[0]

    def forward_masked(self, input_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                       mask: torch.Tensor, cache: HeadKVCache) -> tuple[torch.Tensor, torch.Tensor]:
        """Like `forward` for n new positions of one sequence, but with explicit RoPE `positions` [n] and an
        attention `mask` [n, cache.length + n] (True = may attend), e.g. all SSD tree branches of one depth."""
        outs, logits = self.forward_many([input_ids], [hidden], [positions], [mask], [cache])
        return outs[0], logits[0]

    def forward_many(self, input_ids: list[torch.Tensor], hidden: list[torch.Tensor], positions: list[torch.Tensor],
                     masks: list[torch.Tensor | None],
                     caches: list[HeadKVCache]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """`forward_masked` for several sequences at once: segment i has n_i new positions (input_ids [n_i],
        hidden [n_i, d], positions [n_i], mask [n_i, len(cache_i) + n_i] or None for causal rows). The linear
        layers (most of the work) run once over all rows; attention runs per sequence over its own cache.
        -> per segment (out_hidden [n_i, d], draft logits [n_i, draft_vocab] float32)."""
        sizes = [len(ids) for ids in input_ids]
        all_hidden = torch.cat(hidden)  # [N, d]
        emb = self.embed_tokens(torch.cat(input_ids).to(self.device)).to(all_hidden.dtype)  # [N, d]
        all_positions = torch.cat(positions).to(self.device)  # [N]
        fast = self.midlayer.self_attn.fused is not None and self.config.head_dim % 8 == 0
        ops = cpu_kernels.layer_ops_for(all_hidden) if fast else None
        if ops is not None:
            attn = self._attention_op(ops, self.midlayer.qkv_rows(emb, all_hidden), all_positions, sizes, masks, caches)
        else:
            attn = self._attention_torch(emb, all_hidden, all_positions, sizes, masks, caches)
        out = self.midlayer.finish(attn, all_hidden)  # [N, d]
        return list(out.split(sizes)), list(self.logits(out).split(sizes))

    def _attention_op(self, ops: Any, rows: torch.Tensor, positions: torch.Tensor, sizes: list[int],
                      masks: list[torch.Tensor | None], caches: list[HeadKVCache]) -> torch.Tensor:
        """The CPU layer op per sequence: RoPE, K/V into the cache's slots and attention, from the fused projection
        rows [N, (H + 2 KVH) D] -> [N, H*D]."""
        attn, c = [], self.config
        rope = self.midlayer.self_attn.rotary_emb
        for r, p, mask, cache in zip(rows.split(sizes), positions.split(sizes), masks, caches, strict=True):
            start, n = cache.length, len(r)
            cache.reserve(start + n)
            slots = torch.arange(start, start + n)  # [n]
            if mask is None:  # causal: the last n keys are the new rows
                kv_slots, lens, queries = torch.arange(start + n)[None], torch.tensor([start + n]), n
            else:  # each row its own one-query "sequence" over the keys its mask shows
                kv_slots, lens, queries = visible_slots(mask.to(r.device)), mask.sum(1).to(r.device), 1
            attn.append(ops.rope_attention(r, p, rope.cos, rope.sin, cache.kv, slots, kv_slots, lens, queries,
                                           c.num_attention_heads, c.num_key_value_heads, c.head_dim ** -0.5,
                                           cpu_kernels.attention_path(r.dtype, c.head_dim)))
            cache.length = start + n
        return torch.cat(attn)

    def _attention_torch(self, emb: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, sizes: list[int],
                         masks: list[torch.Tensor | None], caches: list[HeadKVCache]) -> torch.Tensor:
        """Torch ops (training, other devices, no CPU kernels): emb, hidden [N, d] -> [N, H*D]."""
        q, k, v = self.midlayer.qkv(emb[None], hidden[None], positions)  # [1, N, H|KVH, D]
        attn = []
        for qi, ki, vi, mask, cache in zip(q[0].split(sizes), k[0].split(sizes), v[0].split(sizes), masks, caches,
                                           strict=True):
            start = cache.length
            cache.append(ki, vi)
            keys, values = cache.bucket_kv()  # [S, KVH, D] each, S >= cache.length
            if mask is None:
                mask = torch.arange(cache.length)[None, :] <= torch.arange(start, cache.length)[:, None]
            padded = torch.zeros(len(qi), len(keys), dtype=torch.bool, device=self.device)  # [n_i, S]
            padded[:, : mask.shape[1]] = mask.to(self.device)
            attn.append(attend(qi[None], keys[None], values[None], padded[None, None])[0])  # [n_i, H*D]
        return torch.cat(attn)

    def decode_step(self, token_ids: list[int], hidden: list[torch.Tensor],
                    caches: list[HeadKVCache]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """One causal drafting step for each sequence: token_ids[i] with hidden[i] [d], appended to caches[i]
        -> (out_hidden [d], draft logits [draft_vocab] float32) per sequence."""
        outs, logits = self.forward_many([torch.tensor([t]) for t in token_ids], [h[None] for h in hidden],
                                         [torch.tensor([c.length]) for c in caches], [None] * len(caches), caches)
        return [o[0] for o in outs], [row[0] for row in logits]

    def forward_train(self, input_ids: torch.Tensor, hidden: torch.Tensor,
                      attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Batched full-sequence causal forward: input_ids [B, L], hidden [B, L, d], attention_mask [B, L]
        (1 = real token, right padding) -> (out_hidden [B, L, d], logits [B, L, draft_vocab] float32)."""
        b, length = input_ids.shape
        positions = torch.arange(length, device=input_ids.device)  # [L]
        emb = self.embed_tokens(input_ids).to(hidden.dtype)  # [B, L, d]
        q, k, v = self.midlayer.qkv(emb, hidden, positions)
        mask = torch.ones(length, length, dtype=torch.bool, device=input_ids.device).tril()[None, None]  # [1, 1, L, L]
        if attention_mask is not None:
            mask = mask & attention_mask.bool()[:, None, None, :]  # [B, 1, L, L]
            mask = mask | torch.eye(length, dtype=torch.bool, device=input_ids.device)  # padded rows stay finite
        out = self.midlayer.finish(attend(q, k, v, mask), hidden)  # [B, L, d]
        return out, self.logits(out)

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:  # [...] draft ids -> [...] target ids
        """On the device of `draft_ids`, whatever the head's."""
        return draft_ids + self.d2t.to(draft_ids.device)[draft_ids]  # no copy when on the same device

    def to_target_vocab(self, rows: torch.Tensor, fill: float) -> torch.Tensor:
        """rows [n, draft_vocab] -> [n, vocab] float32 on the rows' device, `fill` where the draft cannot go
        (-inf for logits, 0 for q)."""
        full = torch.full((rows.shape[0], self.config.vocab_size), fill, device=rows.device)
        draft_ids = torch.arange(self.config.draft_vocab_size, device=rows.device)  # [draft_vocab]
        full[:, self.to_target_ids(draft_ids)] = rows.float()
        return full
