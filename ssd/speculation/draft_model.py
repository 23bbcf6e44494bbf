"""A draft model proposer: any checkpoint the engine loads, with its own paged KV, rolled back by length.

Chains: one catch-up forward over the committed tokens the draft has not seen, then K-1 single
steps. Trees: EAGLE-2-style expansion: at each depth the best `top_k` children of every frontier
node (by cumulative draft log-probability) are kept under the node budget, and one tree forward
per depth (tree mask over the draft's own KV) scores the new frontier. Tree KV is scratch: after
the round only the committed prefix counts.

The draft reads target ids; its LM head may cover a trimmed vocabulary (ssd/loader/draft_checkpoint.py). Greedy
chains pick in that vocabulary and map the token; sampled chains, grammars and trees widen the logits to the
target's first (-inf outside; q must be in the target's vocabulary: ~0.1-0.25 ms a row). SSD's branch logic
(paged_branches.py) keeps them trimmed.
"""

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ssd.config import TreeShape
from ssd.context import ForwardMode
from ssd.errors import InvalidRequestError
from ssd.loader.draft_checkpoint import output_token_ids
from ssd.runtime.model_runner import ForwardItem
from ssd.runtime.model_worker import ModelWorker
from ssd.speculation.draft_sampling import constrain_rows, pick_tokens
from ssd.speculation.draft_vocab import DraftVocab, target_vocab
from ssd.speculation.proposer import ProposeRequest
from ssd.speculation.round_outcome import RoundOutcome
from ssd.speculation.speculation import Speculation


@dataclass
class _DraftSeq:
    """The draft model's state for one sequence: its paged KV only (rolled back by length on `observe`)."""

    block_table: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0  # leading positions whose draft KV is written (committed, then drafted ones)
    num_hashed_blocks: int = 0
    token_ids: list[int] = field(default_factory=list)


class DraftModelProposer:
    feature_layers: tuple[int, ...] = ()
    feeds_in_background = False  # `catch_up` runs the draft now, on the caller's thread
    catching_up = False  # nothing runs behind the caller's back

    def __init__(self, path: Path, dtype: str, target_vocab_size: int, block_size: int = 16,
                 kv_cache_memory_mb: int = 256, linear_backend: str = "onednn",
                 device: str | torch.device = "cpu", *, compile: str = "auto", enforce_eager: bool = False,
                 attention_backend: str = "auto") -> None:
        """The draft model and its KV live on `device`; its logits come back on CPU (ssd/device.py)."""
        self.worker = ModelWorker(path, dtype, block_size, kv_cache_memory_mb, linear_backend,
                                  enable_prefix_caching=False, device=device, compile=compile,
                                  enforce_eager=enforce_eager, attention_backend=attention_backend)
        mc = self.worker.model_config
        if mc.vocab_size != target_vocab_size:
            raise InvalidRequestError(
                f"draft {path} has a vocabulary of {mc.vocab_size} tokens, the target {target_vocab_size}; "
                "a draft must share the target's tokenizer"
            )
        target_ids = output_token_ids(path)  # [Vd] or None: the LM head covers the whole vocabulary
        if (target_ids is None) != (mc.output_vocab_size is None) or (
                target_ids is not None and target_ids.numel() != mc.output_vocab_size):
            raise InvalidRequestError(f"draft {path}: its d2t map does not match output_vocab_size "
                                      f"{mc.output_vocab_size} of its config.json")
        self.vocab = DraftVocab(target_vocab_size, target_ids)  # the vocabulary of the draft's logits
        self.seqs: dict[int, _DraftSeq] = {}

    # -- state ------------------------------------------------------------------------------
    def _catch_up_item(self, r: ProposeRequest, room: int) -> ForwardItem:
        state = self.seqs.setdefault(r.seq_id, _DraftSeq())
        state.token_ids = r.token_ids
        start = min(state.num_cached_tokens, len(r.token_ids) - 1)
        self.worker.block_manager.ensure_capacity(state, len(r.token_ids) + room)
        return ForwardItem(r.token_ids[start:], start, state.block_table)

    def catch_up(self, requests: list[ProposeRequest]) -> None:
        """Write the draft KV of every committed token but the last (what the next proposal feeds) in one forward
        for all sequences; no logits, nothing proposed."""
        items, caught = [], []
        for r in requests:
            state = self.seqs.setdefault(r.seq_id, _DraftSeq())
            start, end = min(state.num_cached_tokens, len(r.token_ids) - 1), len(r.token_ids) - 1
            if end > start:
                self.worker.block_manager.ensure_capacity(state, end)
                items.append(ForwardItem(r.token_ids[start:end], start, state.block_table, num_logits=0))
                caught.append((state, r))
        if items:
            self.worker.runner.forward(items, ForwardMode.VERIFY)
        for state, r in caught:
            state.num_cached_tokens, state.token_ids = len(r.token_ids) - 1, r.token_ids

    def observe(self, seq_id: int, outcome: RoundOutcome) -> None:
        """Roll the KV back to the committed tokens it holds right: those before the round, then the accepted
        tokens this draft drafted (a token the grammar spliced in, the bonus and anything rejected are not)."""
        state = self.seqs.get(seq_id)
        if state is not None:
            state.num_cached_tokens = min(state.num_cached_tokens, outcome.valid_length)

    def release(self, seq_id: int) -> None:
        state = self.seqs.pop(seq_id, None)
        if state is not None:
            self.worker.block_manager.free(state)

    def _target_logits(self, logits: torch.Tensor) -> torch.Tensor:  # [N, Vd] -> [N, V] float32
        return self.vocab.widen(logits, float("-inf"))

    # -- proposing --------------------------------------------------------------------------
    def propose(self, requests: list[ProposeRequest]) -> list[Speculation]:
        chains = [r for r in requests if r.tree is None]
        out = dict(zip((r.seq_id for r in chains), self._propose_chains(chains), strict=True)) if chains else {}
        for r in requests:
            if r.tree is not None:
                out[r.seq_id] = self._propose_tree(r, r.tree)
        return [out[r.seq_id] for r in requests]

    def _propose_chains(self, requests: list[ProposeRequest]) -> list[Speculation]:
        k = max(r.num_tokens for r in requests)
        runner = self.worker.runner
        items = [self._catch_up_item(r, k) for r in requests]
        # Greedy without grammars needs no q and no masking: argmax in the draft's vocabulary, then its target id
        is_greedy = all(r.temperature <= 0 and r.grammar is None for r in requests)
        vocab = self.vocab if is_greedy else target_vocab(self.vocab.target_size)  # the picked ids' vocabulary
        widen = (lambda x: x) if is_greedy else self._target_logits  # noqa: E731
        logits = widen(runner.forward(items, ForwardMode.VERIFY).logits)  # [B, Vd] greedy, else [B, V]
        tokens: list[list[int]] = [[] for _ in requests]
        qs: list[list[torch.Tensor | None]] = [[] for _ in requests]
        temps, gens = [r.temperature for r in requests], [r.generator for r in requests]
        scales, grammars = [r.saguaro for r in requests], [r.grammar for r in requests]
        for step in range(k):
            logits = constrain_rows(logits, grammars, tokens)
            picked, q_rows = pick_tokens(logits, temps, gens, scales, step)
            picked = vocab.to_target(picked)
            for i, (t, q) in enumerate(zip(picked, q_rows, strict=True)):
                tokens[i].append(t)
                qs[i].append(q)
            if step == k - 1:
                break
            step_items = [
                ForwardItem([t], len(r.token_ids) + step, self.seqs[r.seq_id].block_table)
                for r, t in zip(requests, picked, strict=True)
            ]
            logits = widen(runner.forward(step_items, ForwardMode.DECODE).logits)
        for r in requests:  # KV now holds the committed tokens and s_1..s_{K-1}
            self.seqs[r.seq_id].num_cached_tokens = len(r.token_ids) + k - 1
        return [
            Speculation(tok[: r.num_tokens], None, torch.stack(q[: r.num_tokens]) if q[0] is not None else None)
            for r, tok, q in zip(requests, tokens, qs, strict=True)
        ]

    def _propose_tree(self, r: ProposeRequest, shape: TreeShape) -> Speculation:
        runner = self.worker.runner
        base = len(r.token_ids)  # physical position of node 1
        depth_limit = min(r.num_tokens, shape.depth)
        item = self._catch_up_item(r, shape.budget)
        logits = self._target_logits(runner.forward([item], ForwardMode.VERIFY).logits)  # [1, V]
        logprobs = torch.log_softmax(logits, dim=-1)
        tokens: list[int] = []
        parents: list[int] = []
        scores: list[float] = [0.0]  # cumulative log-probability per node, root first
        paths: list[list[int]] = [[]]  # per node, root first: its tokens from the root
        frontier = [0]
        for depth in range(1, depth_limit + 1):
            if r.grammar is not None:
                logprobs = r.grammar.constrain(logprobs, [paths[node] for node in frontier])
            cand = []
            for row, node in enumerate(frontier):
                top = torch.topk(logprobs[row], shape.top_k)
                cand.extend((scores[node] + float(v), node, int(t))
                            for v, t in zip(top.values, top.indices, strict=True) if v > float("-inf"))
            cand.sort(key=lambda c: -c[0])
            cand = cand[: shape.budget - len(tokens)]
            if not cand:
                break
            first_new = len(tokens) + 1
            for score, parent, token in cand:
                tokens.append(token)
                parents.append(parent)
                scores.append(score)
                paths.append([*paths[parent], token])
            frontier = list(range(first_new, len(tokens) + 1))
            if depth == depth_limit or len(tokens) >= shape.budget:
                break
            logprobs = self._tree_step(r, base, tokens, parents, frontier)
        self.seqs[r.seq_id].num_cached_tokens = len(r.token_ids)  # tree KV is scratch
        return Speculation(tokens, parents)

    def _tree_step(self, r: ProposeRequest, base: int, tokens: list[int], parents: list[int],
                   frontier: list[int]) -> torch.Tensor:
        """Feed the frontier nodes, stored after the earlier nodes; [len(frontier), V] log-probs.

        Node i sits at physical position base + i - 1 and RoPE position base - 1 + depth(i).
        """
        spec = Speculation(tokens, parents)
        anc = spec.ancestor_mask()  # [n+1, n+1] over root + nodes
        depths = [0, *spec.depths()]
        first, last = frontier[0], frontier[-1]
        mask = torch.ones(len(frontier), base + last, dtype=torch.bool)  # committed prefix (root included)
        mask[:, base:] = anc[first : last + 1, 1 : last + 1]  # ancestors and self among the nodes
        item = ForwardItem(
            [tokens[i - 1] for i in frontier], base + first - 1, self.seqs[r.seq_id].block_table,
            num_logits=len(frontier), positions=[base - 1 + depths[i] for i in frontier], attn_mask=mask,
        )
        logits = self._target_logits(self.worker.runner.forward([item], ForwardMode.TREE).logits)  # [n, V]
        return torch.log_softmax(logits, dim=-1)
