"""One synchronous speculative-decoding round (SD) for a decode batch.

Propose (draft), verify every sequence's chain or tree in ONE target forward, accept a prefix and
sample the bonus token exactly (ssd/speculation/verification.py), keep only the accepted path's KV, and
return each sequence's RoundOutcome, which the engine hands the proposer once committed (`observe`).
"""

import dataclasses
import time

import torch

from ssd.config import DecodeMode, SpeculationConfig
from ssd.context import ForwardMode
from ssd.engine.sequence import Sequence
from ssd.kv.block_manager import BlockManager
from ssd.kv.feature_cache import FeatureCache
from ssd.runtime.model_runner import ForwardItem, ModelRunner
from ssd.sampling.grammar import AnswerGrammar
from ssd.sampling.greedy import argmax_rows
from ssd.sampling.logit_adjust import adjust_logits, has_adjustments
from ssd.sampling.logprobs import TokenLogprob, token_logprobs
from ssd.sampling.sampler import target_probs
from ssd.speculation.proposer import Proposer, ProposeRequest
from ssd.speculation.round_outcome import NO_SPECULATION, RoundOutcome
from ssd.speculation.speculation import Outcome, Speculation
from ssd.speculation.speculation_stats import SpecStats
from ssd.speculation.verification import verify_greedy, verify_sampled


class SpeculativeDecoder:
    def __init__(self, config: SpeculationConfig, proposer: Proposer, runner: ModelRunner,
                 block_manager: BlockManager) -> None:
        self.config = config
        self.proposer = proposer
        self.runner = runner
        self.block_manager = block_manager
        self.counters = SpecStats()
        # With prefix caching, the target features of every committed position, kept beside its KV block: a prompt
        # whose first blocks the prefix cache serves gets their features from here (the proposer needs them all).
        self.feature_cache = (FeatureCache(block_manager.num_blocks, block_manager.block_size)
                              if proposer.feature_layers and block_manager.enable_prefix_caching else None)

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return self.proposer.feature_layers

    @property
    def lookahead_slots(self) -> int:
        """KV slots to reserve per sequence beyond its tokens for one round."""
        k = self.config.num_speculative_tokens
        return max(k, self.config.tree.budget) if self.config.tree is not None else k

    def add_features(self, seq: Sequence, start: int, features: torch.Tensor) -> None:
        """Queue target features [n, F] of positions start.. for the proposer (later ones overwrite earlier), first
        restoring those of positions the prefix cache served before `start`, and keep them beside the KV."""
        log = seq.features
        if self.feature_cache is not None and start > log.end:  # a prefix-cache hit: those positions were not run
            log.add(log.end, self.feature_cache.read(seq.block_table, log.end, start))
        if self.feature_cache is not None:
            self.feature_cache.write(seq.block_table, start, features)
        log.add(start, features)

    def release(self, seq_id: int) -> None:
        self.proposer.release(seq_id)

    def catch_up(self, seqs: list[Sequence]) -> None:
        """After a plain step: where the draft works beside the target, hand it what the sequences committed (and
        their features), so it catches up meanwhile; their drafts have then seen every token."""
        if seqs and self.proposer.feeds_in_background:
            self.proposer.catch_up([self._request(s, 0) for s in seqs])
            for seq in seqs:
                seq.num_draft_seen = seq.num_tokens

    @property
    def catching_up(self) -> bool:
        """Whether a draft that works beside the target is still prefilling prompts that `catch_up` handed it."""
        return self.proposer.feeds_in_background and self.proposer.catching_up

    def overlaps(self, seq: Sequence) -> bool:
        """Whether the sequence speculates SSD-style: its draft builds the next answer while the target verifies (in
        one process: the engine's SSD config; with a remote draft: the request's mode)."""
        return seq.params.is_speculative and (self.config.ssd is not None or seq.params.mode is DecodeMode.SSD)

    def _request(self, seq: Sequence, k: int, sd_round: bool = False) -> ProposeRequest:
        p = seq.params
        dtemp = 0.0 if p.is_greedy else (p.draft_temperature if p.draft_temperature is not None else p.temperature)
        start, features = seq.features.take()
        grammar = AnswerGrammar(seq.grammar, seq.output_token_ids) if seq.grammar is not None else None
        return ProposeRequest(seq.seq_id, seq.token_ids, k, dtemp, seq.generator, self.config.tree,
                              features, start, mode=p.mode or DecodeMode.SD, grammar=grammar,
                              num_cached_tokens=seq.num_prefix_cached_tokens, sd_round=sd_round)

    def _item(self, seq: Sequence, speculation: Speculation) -> ForwardItem:
        start = seq.num_cached_tokens  # the last committed token's position: the root
        tokens = [seq.token_ids[-1], *speculation.tokens]
        self.block_manager.ensure_capacity(seq, start + len(tokens))
        if not speculation.is_tree:
            return ForwardItem(tokens, start, seq.block_table, num_logits=len(tokens))
        mask = torch.ones(len(tokens), start + len(tokens), dtype=torch.bool)
        mask[:, start:] = speculation.ancestor_mask()
        positions = [start, *(start + d for d in speculation.depths())]
        return ForwardItem(tokens, start, seq.block_table, len(tokens), positions, mask)

    def run_round(self, seqs: list[Sequence], k: int, plain: frozenset[int] = frozenset(),
                  sd_round: frozenset[int] = frozenset()) -> tuple[list[RoundOutcome], list[list[TokenLogprob] | None]]:
        """Per sequence, the round's outcome (accepted tokens + bonus token, before stop / length truncation), and
        the logprobs of those tokens for the sequences that asked (None for the others). Sequences in `plain`
        (and those that never speculate) take a plain decode step in the same forward; SSD sequences in `sd_round`
        speculate as plain SD this round (drafted now, no cache built during the verify)."""
        started = time.perf_counter()
        asking = [s for s in seqs if s.params.is_speculative and s.seq_id not in plain]
        requests = [self._request(s, k, s.seq_id in sd_round) for s in asking]
        proposed = dict(zip((s.seq_id for s in asking), self.proposer.propose(requests),
                            strict=True)) if asking else {}
        speculations = [self._with_forced_tokens(s, proposed[s.seq_id], k) if s.seq_id in proposed else Speculation([])
                 for s in seqs]
        items = [self._item(s, speculation) for s, speculation in zip(seqs, speculations, strict=True)]
        mode = ForwardMode.TREE if self.config.tree is not None else ForwardMode.VERIFY
        proposed_at = time.perf_counter()
        out = self.runner.forward(items, mode, self.feature_layers)
        self.counters.record_round_time(proposed_at - started, time.perf_counter() - proposed_at)
        results, logprobs, offset = [], [], 0
        for seq, speculation, item in zip(seqs, speculations, items, strict=True):
            n = len(item.token_ids)
            logits = out.logits[offset : offset + n]  # [n, V]: root, then each node
            outcome = self._verify(seq, speculation, logits)
            self._keep_path(seq, item, outcome)
            if out.aux_hidden is not None:  # features of the committed positions: root + accepted path
                rows = torch.tensor([offset, *(offset + a for a in outcome.accepted_nodes)],
                                    device=out.aux_hidden.device)
                self.add_features(seq, item.start_position, out.aux_hidden[rows])
            if seq.seq_id in proposed:
                for counters in (self.counters, seq.spec_counters):
                    counters.record(speculation.num_tokens, outcome.num_accepted, len(outcome.tokens),
                                    speculation.cache_hit, speculation.predicted_hit)
            k_seen = outcome.num_accepted if seq.seq_id in proposed else NO_SPECULATION  # splices included
            results.append(RoundOutcome(seq.seq_id, seq.num_tokens, outcome.tokens, k_seen, speculation.num_own))
            if seq.params.logprobs is None:
                logprobs.append(None)
            else:  # token i was drawn at its parent: the root, then each accepted node
                parents = logits[[0, *outcome.accepted_nodes]]  # [k + 1, V]
                logprobs.append(token_logprobs(parents, outcome.tokens, seq.params.logprobs))
            offset += n
        return results, logprobs

    def _with_forced_tokens(self, seq: Sequence, speculation: Speculation, k: int) -> Speculation:
        """Structured output: splice the grammar's forced tokens into the speculation, wherever they fall (a
        spliced token is always accepted; in a chain its q row is one-hot). `num_own` marks where the proposer's own
        tokens end (SSD: an outcome past it is a miss on the draft)."""
        if seq.grammar is None:
            return speculation
        if speculation.is_tree:
            drafted = (speculation.tokens, speculation.parent_list())
            tokens, parents = seq.grammar.forced_tree(seq.output_token_ids, *drafted,
                                                      self.lookahead_slots)  # the KV slots reserved for the round
            own = None if (tokens, parents) == drafted else 0  # nodes renumbered
            return dataclasses.replace(speculation, tokens=tokens, parents=parents, q=None, num_own=own)
        chain = seq.grammar.forced_chain(seq.output_token_ids, speculation.tokens, k)
        if [t for t, _ in chain] == speculation.tokens:
            return speculation
        num_own = next((i for i, (_, own) in enumerate(chain) if not own), len(chain))
        q = None
        if speculation.q is not None:  # [n, V]: the draft's own rows, one-hot rows for spliced tokens
            q = torch.zeros(len(chain), speculation.q.shape[1], dtype=speculation.q.dtype)
            for i, (token, own) in enumerate(chain):
                if own:
                    q[i] = speculation.q[i]
                else:
                    q[i, token] = 1.0
        return dataclasses.replace(speculation, tokens=[t for t, _ in chain], q=q, num_own=num_own)  # a hit stays one

    def _verify(self, seq: Sequence, speculation: Speculation, logits: torch.Tensor) -> Outcome:
        """logits [n, V] and q on CPU (proposers and the remote draft hand q over there): CPU generator draws."""
        if has_adjustments(seq.params):  # each row as the answer would stand at that node
            logits = adjust_logits(logits, seq.output_token_ids, speculation.paths(), seq.params, seq.prompt_token_ids,
                                   seq.ending_ids, seq.grammar)
        if seq.params.is_greedy:
            return verify_greedy(speculation, argmax_rows(logits).tolist())
        return verify_sampled(speculation, target_probs(logits, seq.params), seq.generator)

    def _keep_path(self, seq: Sequence, item: ForwardItem, outcome: Outcome) -> None:
        """Move the accepted tree path's KV to consecutive positions after the root."""
        if item.positions is None or not outcome.accepted_nodes:
            return
        start = item.start_position
        src = [start + a for a in outcome.accepted_nodes]
        dst = [start + j for j in range(1, outcome.num_accepted + 1)]
        self.runner.move_kv(seq.block_table, src, dst)
