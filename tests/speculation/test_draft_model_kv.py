"""The draft model's KV follows the committed tokens, not its own drafts: when the target commits a token the draft
did not draft at a position it holds KV for (a grammar's forced token spliced into the speculation), the next
proposal equals a fresh proposer's."""

import torch

from ssd.model_config import load_model_config
from ssd.speculation.draft_model import DraftModelProposer
from ssd.speculation.proposer import ProposeRequest
from ssd.speculation.round_outcome import RoundOutcome


def test_a_committed_token_the_draft_did_not_draft_is_recomputed(models):
    vocab = load_model_config(models[0]).vocab_size

    def proposer() -> DraftModelProposer:
        return DraftModelProposer(models[1], "float32", vocab, block_size=4, kv_cache_memory_mb=8)

    def chain(p: DraftModelProposer, tokens: list[int]) -> torch.Tensor:  # [3, V]: the q rows
        return p.propose([ProposeRequest(1, tokens, 3, 1.0, torch.Generator().manual_seed(0))])[0].q

    used, prompt = proposer(), [5, 6, 7, 8, 9, 10]
    drafted = used.propose([ProposeRequest(1, prompt, 3, 0.0, torch.Generator())])[0].tokens
    spliced = (drafted[0] + 1) % vocab  # committed where the draft's first token was: KV holds drafted[0] there
    committed = [*prompt, spliced, drafted[1]]  # the spliced token, then the bonus
    used.observe(1, RoundOutcome(1, len(prompt), committed[len(prompt):], num_accepted=1, num_own_accepted=0))
    torch.testing.assert_close(chain(used, committed), chain(proposer(), committed))


def test_accepted_drafted_tokens_keep_their_kv_and_the_rest_is_rolled_back(models):
    vocab = load_model_config(models[0]).vocab_size
    used, prompt = DraftModelProposer(models[1], "float32", vocab, block_size=4, kv_cache_memory_mb=8), [5, 6, 7, 8]
    drafted = used.propose([ProposeRequest(1, prompt, 3, 0.0, torch.Generator())])[0].tokens
    assert used.seqs[1].num_cached_tokens == len(prompt) + 2  # the committed tokens, then s_1, s_2
    bonus = (drafted[2] + 1) % vocab
    used.observe(1, RoundOutcome(1, len(prompt), [*drafted[:2], bonus], num_accepted=2))
    assert used.seqs[1].num_cached_tokens == len(prompt) + 2  # s_1, s_2 accepted: their KV stays
    used.observe(1, RoundOutcome.plain(1, len(prompt) + 1, [bonus]))  # (as if) s_2 dropped after all
    assert used.seqs[1].num_cached_tokens == len(prompt) + 1
