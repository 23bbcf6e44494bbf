"""Chunked prefill: a long prompt that arrives while others decode is fed in chunks, the decoding sequences
step between two chunks, and nothing changes in what anyone generates (float32 greedy, AR / SD / EAGLE-3 / SSD)."""

import pytest

from ssd.config import DecodeMode, ProposerChoice, SpeculationConfig, SsdConfig
from ssd.engine.llm_engine import LLMEngine
from ssd.errors import InvalidRequestError
from ssd.llm import LLM
from ssd.sampling.params import SamplingParams
from tests.speculation.test_eagle3_sd import write_tiny_head
from tests.tiny_models import write_tiny_checkpoint

SHORT = [5, 6, 7, 8, 9]
LONG = [(11 * i) % 90 + 3 for i in range(100)]
OPTS = dict(dtype="float32", block_size=4, kv_cache_memory_mb=8, num_threads=1)
GREEDY = SamplingParams(max_tokens=20, ignore_eos=True)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    target, draft, head = (tmp_path_factory.mktemp(n) for n in ("target", "draft", "eagle3"))
    write_tiny_checkpoint(target, "llama", seed=0)
    write_tiny_checkpoint(draft, "llama", seed=1, num_hidden_layers=1)
    write_tiny_head(head, target)
    return target, draft, head


@pytest.fixture(scope="module")
def alone(folders):
    """Each prompt's greedy tokens, generated on its own (no chunking, nobody else in the batch)."""
    llm = LLM(str(folders[0]), prefill_chunk_tokens=0, **OPTS)
    return {name: llm.generate([p], GREEDY)[0].token_ids for name, p in (("short", SHORT), ("long", LONG))}


def run_staggered(engine: LLMEngine, params: SamplingParams, batches: list | None = None) -> dict[str, list[int]]:
    """SHORT first; LONG once SHORT is decoding. `batches` gets each step's {name: tokens fed} (the scheduled
    batch)."""
    ids = {engine.add_request(SHORT, params): "short"}
    schedule = engine.scheduler.schedule

    def recording(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        batch = schedule(*args, **kwargs)
        if batches is not None and batch is not None:
            batches.append({ids[s.seq_id]: n for s, n in zip(batch.seqs, batch.num_new_tokens, strict=True)})
        return batch

    engine.scheduler.schedule = recording
    out: dict[str, list[int]] = {"short": [], "long": []}
    while engine.has_unfinished():
        if len(ids) == 1 and len(out["short"]) >= 2:
            ids[engine.add_request(LONG, params)] = "long"
        for o in engine.step():
            out[ids[o.seq_id]].extend(o.new_token_ids)
    return out


def test_a_long_prompt_is_fed_in_chunks_while_others_decode(folders, alone):
    llm = LLM(str(folders[0]), prefill_chunk_tokens=16, **OPTS)
    batches: list = []
    assert run_staggered(llm.engine, GREEDY, batches) == alone
    chunks = [i for i, b in enumerate(batches) if b.get("long", 1) > 1]  # the steps that fed LONG's prompt
    assert len(chunks) == 7 and sum(batches[i]["long"] for i in chunks) == len(LONG)
    assert all(batches[i]["long"] <= 16 and "short" not in batches[i] for i in chunks)
    for a, b in zip(chunks, chunks[1:], strict=False):
        assert b == a + 2 and batches[a + 1] == {"short": 1}  # the short sequence steps between two chunks


def test_without_chunking_the_long_prompt_goes_whole(folders, alone):
    llm = LLM(str(folders[0]), prefill_chunk_tokens=0, **OPTS)
    batches: list = []
    assert run_staggered(llm.engine, GREEDY, batches) == alone
    assert [b["long"] for b in batches if b.get("long", 1) > 1] == [len(LONG)]


@pytest.mark.parametrize("draft", ["model", "eagle3", "ssd"])
def test_speculation_with_chunked_prefill_equals_ar(folders, alone, draft):
    target, draft_model, head = folders
    spec = SpeculationConfig(ProposerChoice(str(head if draft == "eagle3" else draft_model)), num_speculative_tokens=3,
                             ssd=SsdConfig(fan_out_budget=4) if draft == "ssd" else None)
    llm = LLM(str(target), prefill_chunk_tokens=16, speculation=spec, **OPTS)
    params = SamplingParams(max_tokens=20, ignore_eos=True, mode=DecodeMode.SSD if draft == "ssd" else None)
    batches: list = []
    assert run_staggered(llm.engine, params, batches) == alone
    assert sum(1 for b in batches if b.get("long", 1) > 1) == 7


def test_chunks_fill_the_prefix_cache(folders):
    llm = LLM(str(folders[0]), prefill_chunk_tokens=16, **OPTS)
    run_staggered(llm.engine, GREEDY)
    again = llm.generate([LONG], GREEDY)[0]
    assert again.num_cached_prompt_tokens >= len(LONG) - 4  # every full block but the last token's


def test_a_scored_prompt_is_never_chunked(folders):
    llm = LLM(str(folders[0]), prefill_chunk_tokens=16, **OPTS)
    whole = LLM(str(folders[0]), prefill_chunk_tokens=0, **OPTS)
    params = SamplingParams(max_tokens=4, ignore_eos=True, prompt_logprobs=1)
    ref = whole.generate([LONG], params)[0].prompt_logprobs
    engine = llm.engine
    ids = {engine.add_request(SHORT, GREEDY): "short"}
    got = None
    while engine.has_unfinished():
        if len(ids) == 1 and engine.seqs and all(s.num_output_tokens >= 2 for s in engine.seqs.values()):
            ids[engine.add_request(LONG, params)] = "long"
        for o in engine.step():
            if ids[o.seq_id] == "long" and o.prompt_logprobs is not None:
                got = o.prompt_logprobs
    assert got is not None and [(lp.token_id, round(lp.logprob, 4)) for lp in got] == [
        (lp.token_id, round(lp.logprob, 4)) for lp in ref]


def test_prefill_chunk_of_one_token_is_refused(folders):
    with pytest.raises(InvalidRequestError, match="prefill_chunk_tokens"):
        LLM(str(folders[0]), prefill_chunk_tokens=1, **OPTS)
