"""EAGLE-3 proposer: a one-layer head drafting from the target's own features.

Per sequence it keeps the head's dense KV and the fused target features g_j (SSD.md; alignment in
ssd/models/eagle3.py: head position j takes (embedding of x_{j+1}, g_j) and predicts x_{j+2}).
Each round it first runs the head over committed positions whose real target features arrived
(the verify forward's accepted path; one forward for all sequences), then drafts: a chain self-conditions step by step; a tree
(ssd/speculation/eagle3_tree.py) expands the best top-k children by cumulative log-probability, every frontier
node of every tree in one tree-masked head forward per depth. Drafted positions are scratch: the next
round truncates back to the real ones.
Prefix caching: complete head blocks go to a HeadPrefixCache (ssd/speculation/head_prefix_cache.py) keyed by
the target's block hashes; a new sequence starts from the blocks it finds there and computes only the rest
(in one process on its own; over the Session when the target says how many prompt tokens its cache served).
Devices: the head, its KV, hidden states and fused features live on the head's device; the draft log-probs
the token logic reads are moved to CPU, where sampling uses the sequences' CPU generators.
"""

from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import torch

from ssd.device import resolve_device
from ssd.dtypes import parse_dtype
from ssd.errors import InvalidRequestError
from ssd.layers.linear import pack_linear_weights
from ssd.loader.eagle3_checkpoint import load_eagle3_head
from ssd.model_config import ModelConfig
from ssd.models.eagle3 import HeadKVCache
from ssd.sampling.grammar import AnswerGrammar
from ssd.sampling.greedy import argmax_rows
from ssd.sampling.sampler import sample_from
from ssd.speculation.eagle3_tree import TokenTree
from ssd.speculation.head_prefix_cache import HeadPrefixCache
from ssd.speculation.proposer import ProposeRequest
from ssd.speculation.round_outcome import RoundOutcome
from ssd.speculation.speculation import Speculation


@dataclass
class _HeadSeq:
    cache: HeadKVCache
    fused: torch.Tensor  # [m, d] fused features g_0..g_{m-1}, on the head's device
    num_real: int = 0  # head positions computed from real target features
    rows: list[torch.Tensor] = field(default_factory=list)  # [(out_hidden [d], draft logits [Vd])] (device)
    # the last chain's steps past the real positions, in its KV right after them: (token fed, out_hidden [d], draft
    # logits [Vd]) each; SSD's glue reuses them instead of running the same steps again (`drafted_steps`)
    drafted: list[tuple[int, torch.Tensor, torch.Tensor]] = field(default_factory=list)


class Eagle3Proposer:
    feeds_in_background = False  # `catch_up` runs the head now, on the caller's thread
    catching_up = False  # nothing runs behind the caller's back

    def __init__(self, path: Path, target_embedding: torch.Tensor, target_config: ModelConfig, dtype: str,
                 device: str | torch.device | None = None, prefix_block_size: int = 16,
                 prefix_cache_blocks: int = 1024) -> None:
        """`target_embedding` [vocab, d]: the target's input embedding (used when the head ships none).
        `device`: where the head runs; None = the target embedding's device. `prefix_block_size`: the target's
        KV block size (its prefix-cache blocks); `prefix_cache_blocks`: head blocks kept (0 = no prefix cache)."""
        tc = target_config
        device = resolve_device(target_embedding.device if device is None else device)
        self.head = load_eagle3_head(path, target_embedding, parse_dtype(dtype, device), tc.num_hidden_layers,
                                      device)
        if device.type == "cpu":
            pack_linear_weights(self.head)  # inference only from here on: oneDNN-packed matmuls
        hc = self.head.config
        if hc.vocab_size != tc.vocab_size or hc.target_hidden_size != tc.hidden_size:
            raise InvalidRequestError(
                f"EAGLE-3 head {path} was built for vocab {hc.vocab_size} / width {hc.target_hidden_size}; "
                f"the target has vocab {tc.vocab_size} / width {tc.hidden_size}"
            )
        self.feature_layers = tuple(hc.aux_layers)
        self.seqs: dict[int, _HeadSeq] = {}
        self.prefix_cache = HeadPrefixCache(prefix_block_size, prefix_cache_blocks) if prefix_cache_blocks else None
        self.num_head_positions = 0  # head positions computed from real features, ever (prefix hits skip them)
        self._target_ids = self.head.to_target_ids(torch.arange(hc.draft_vocab_size))  # [Vd] on CPU

    def _allowed(self, grammar: AnswerGrammar, paths: list[list[int]]) -> torch.Tensor:  # [n, Vd] bool
        """The draft tokens the grammar allows after each path."""
        return grammar.allowed(paths)[:, self._target_ids]

    def catch_up(self, requests: list[ProposeRequest]) -> None:
        """Run the head over the real positions whose target features arrived, in one forward; nothing proposed."""
        self._catch_up_many(requests)

    def observe(self, seq_id: int, outcome: RoundOutcome) -> None:
        pass  # the head rolls back by feature position: real features arrive with the next propose

    def release(self, seq_id: int) -> None:
        self.seqs.pop(seq_id, None)

    def _new_state(self, seq_id: int, token_ids: list[int], max_positions: int) -> tuple[_HeadSeq, int]:
        """A fresh state starting from the cached head blocks of at most `max_positions` leading positions;
        -> (state, positions restored)."""
        head = self.head
        fused = torch.empty(0, head.config.hidden_size, dtype=head.fc.weight.dtype, device=head.device)
        state = self.seqs[seq_id] = _HeadSeq(head.new_cache(), fused)
        blocks = self.prefix_cache.lookup(token_ids, max_positions) if self.prefix_cache is not None else []
        if blocks:
            state.fused = self.prefix_cache.restore(blocks, state.cache)  # [n, d]
            state.num_real = len(state.fused)
        return state, state.num_real

    def restore_prefix(self, seq_id: int, token_ids: list[int], num_positions: int) -> int:
        """Start sequence `seq_id` from its cached head blocks of positions 0..num_positions-1 (its target
        features then start at `num_positions`); -> positions found. Fewer than asked: nothing is kept."""
        self.release(seq_id)
        _, found = self._new_state(seq_id, token_ids, num_positions)
        if found < num_positions:
            self.release(seq_id)
        return found

    def _prepare(self, r: ProposeRequest) -> tuple[_HeadSeq, int, ProposeRequest]:
        """Restore a new sequence's cached head blocks, merge the request's real features and truncate to the real
        positions; -> (state, m real positions, the request with the restored positions' features dropped)."""
        head = self.head
        state = self.seqs.get(r.seq_id)
        if state is None:  # restore at most all but the last position that has inputs: that one gives the logits
            usable = r.features_start + len(r.features) if r.features is not None else 0
            state, found = self._new_state(r.seq_id, r.token_ids, min(usable, len(r.token_ids) - 1) - 1)
            if found > r.features_start:  # the restored positions need no features
                r = replace(r, features=r.features[found - r.features_start :], features_start=found)
        if r.features is not None:  # [n, F], on CPU or on a device: the head's device from here
            if r.features_start > len(state.fused):  # fused row i must be position i's: a gap would shift them all
                raise InvalidRequestError(
                    f"sequence {r.seq_id}: target features start at position {r.features_start}, but the head holds "
                    f"features of positions 0..{len(state.fused) - 1} only; positions in between are missing")
            start, feats = r.features_start, head.fuse(r.features.to(head.device, head.fc.weight.dtype))
            state.fused = torch.cat([state.fused[:start], feats])
            state.num_real = min(state.num_real, start)
        state.cache.truncate(state.num_real)
        state.drafted = []
        return state, min(len(state.fused), len(r.token_ids) - 1), r  # m: head positions with real inputs

    def drafted_steps(self, seq_id: int, speculation: list[int]) -> _HeadSeq | None:
        """The sequence's state if its last chain drafted `speculation` from its real positions and nothing has
        touched its KV since: then its `drafted` steps are the first glue steps of that speculation (SSD's glue
        after a backup runs only the rest). None otherwise."""
        state = self.seqs.get(seq_id)
        if state is None or not state.rows or state.cache.length != state.num_real + len(state.drafted):
            return None
        if [token for token, _, _ in state.drafted] != speculation[: len(state.drafted)]:
            return None
        return state

    @torch.inference_mode()
    def _catch_up_many(self, requests: list[ProposeRequest]) -> list[_HeadSeq]:
        """Run the head over every sequence's new real positions in one forward (causal per sequence); after it
        each state's rows[-1] is (last out_hidden [d], last draft logits [Vd]), on the head's device."""
        states, ids, hidden, positions, masks, todo = [], [], [], [], [], []
        for r in requests:
            state, m, r = self._prepare(r)
            states.append(state)
            if m <= state.num_real and state.rows:
                continue
            start = state.num_real
            ids.append(torch.tensor(r.token_ids[start + 1 : m + 1]))  # [n]
            hidden.append(state.fused[start:m])  # [n, d]
            positions.append(torch.arange(start, m))  # [n]
            masks.append(None)  # causal
            todo.append((state, m, r))
        if todo:
            outs, logits = self.head.forward_many(ids, hidden, positions, masks, [s.cache for s, _, _ in todo])
            for (state, m, r), out, rows in zip(todo, outs, logits, strict=True):
                self.num_head_positions += m - state.num_real
                state.num_real = m
                if self.prefix_cache is not None:
                    self.prefix_cache.insert(r.token_ids, m, state.cache, state.fused)
                state.rows = [(out[-1], rows[-1])]
        return states

    def propose(self, requests: list[ProposeRequest]) -> list[Speculation]:
        chains = iter(self._chains([r for r in requests if r.tree is None]))
        trees = iter(self._trees([r for r in requests if r.tree is not None]))
        return [next(trees) if r.tree is not None else next(chains) for r in requests]

    def _to_target_q(self, probs: torch.Tensor) -> torch.Tensor:  # [draft_vocab] -> [vocab]
        return self.head.to_target_vocab(probs[None], 0.0)[0]

    def _pick(self, r: ProposeRequest, step: int, logprobs: torch.Tensor) -> tuple[int, torch.Tensor | None]:
        """The next draft token (target id) from draft log-probs [Vd], and its q [V] when sampling."""
        if r.temperature <= 0:
            return int(self.head.to_target_ids(argmax_rows(logprobs[None])[0])), None
        probs = torch.softmax(logprobs / r.temperature, dim=-1)  # log-probs are logits up to a shift
        if r.saguaro is not None:
            probs = r.saguaro.apply(probs, step)
        draft_id = sample_from(probs[None], r.generator)[0]
        return int(self.head.to_target_ids(draft_id)), self._to_target_q(probs)

    @torch.inference_mode()
    def _chains(self, requests: list[ProposeRequest]) -> list[Speculation]:
        """Chain drafts: catch-up per sequence, then one head forward per step for every sequence still drafting.
        A chain under a grammar ends early where no draft-vocabulary token is allowed (the target splices a
        forced token there itself)."""
        states = self._catch_up_many(requests)
        caches = [s.cache for s in states]
        hidden = [s.rows[-1][0] for s in states]  # [d] each
        logprobs = [torch.log_softmax(s.rows[-1][1].float(), dim=-1).cpu() for s in states]  # [Vd] each
        limits = [r.num_tokens for r in requests]
        tokens: list[list[int]] = [[] for _ in requests]
        qs: list[list[torch.Tensor]] = [[] for _ in requests]
        for step in range(max(limits, default=0)):
            active = [i for i in range(len(requests)) if step < limits[i]]
            for i in list(active):
                r = requests[i]
                if r.grammar is not None:
                    allowed = self._allowed(r.grammar, [tokens[i]])[0]  # [Vd]
                    if not allowed.any():
                        limits[i] = step
                        active.remove(i)
                        continue
                    logprobs[i] = logprobs[i].masked_fill(~allowed, float("-inf"))
                token, q = self._pick(r, step, logprobs[i])
                tokens[i].append(token)
                if q is not None:
                    qs[i].append(q)
            active = [i for i in active if step < limits[i] - 1]  # the last token needs no forward
            if not active:
                break
            outs, logits = self.head.decode_step([tokens[i][-1] for i in active], [hidden[i] for i in active],
                                                 [caches[i] for i in active])
            for i, out, row in zip(active, outs, logits, strict=True):
                hidden[i], logprobs[i] = out, torch.log_softmax(row.float(), dim=-1).cpu()
                states[i].drafted.append((tokens[i][-1], out, row))
        return [Speculation(t, None, torch.stack(q) if q else None) for t, q in zip(tokens, qs, strict=True)]

    @torch.inference_mode()
    def _trees(self, requests: list[ProposeRequest]) -> list[Speculation]:
        """Token trees: catch-up per sequence, then one head forward per depth for every tree's frontier."""
        trees, caches = [], []
        for r, state in zip(requests, self._catch_up_many(requests), strict=True):
            hidden, logprobs = state.rows[-1][0], torch.log_softmax(state.rows[-1][1].float(), dim=-1).cpu()
            depth_limit = min(r.num_tokens, r.tree.depth) if r.tree is not None else 0
            allowed = partial(self._allowed, r.grammar) if r.grammar is not None else None
            trees.append(TokenTree(r.tree, depth_limit, state.cache.length, hidden, logprobs, allowed))
            caches.append(state.cache)
        growing = list(range(len(trees)))
        while growing := [i for i in growing if trees[i].grow(self.head.to_target_ids)]:
            ids, hidden, positions, masks = (list(x) for x in zip(*(trees[i].inputs() for i in growing), strict=True))
            outs, logits = self.head.forward_many(ids, hidden, positions, masks, [caches[i] for i in growing])
            for i, out, rows in zip(growing, outs, logits, strict=True):
                trees[i].expanded(out, torch.log_softmax(rows.float(), dim=-1).cpu())
        return [t.speculation() for t in trees]
