"""SSD across the services: target and draft as real processes on localhost (the `ssd serve` launcher).

Greedy output in ssd mode equals in-process AR token for token, one request at a time and four at once,
for a tiny draft model, the target itself as its draft (a perfect draft: every round after the first hits)
and a tiny EAGLE-3 head; per-request stats carry cache hits and misses; sampling ships q; bad SSD options
are a sequence error; a draft killed mid-run leaves the output unchanged.
"""

import queue
import signal
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from deploy.local import Stack, free_port, start_draft, start_stack, stop_stack, wait_healthy
from protos.ssd.v1 import common_pb2, draft_pb2, draft_pb2_grpc, target_pb2, target_pb2_grpc
from tests.integration.helpers import draft_load, stack_config, target_load, wait_for
from tests.speculation.test_eagle3_sd import write_tiny_head
from tests.speculation.test_ssd_inprocess import PROMPTS
from tests.tiny_models import write_tiny_checkpoint

K = 3
MAX_TOKENS = 24
LONG_TOKENS = 300  # the draft-killed run: long enough that the kill lands mid-run
SSD = common_pb2.SPECULATION_MODE_SSD


@pytest.fixture(scope="module")
def drafts(tmp_path_factory) -> dict:
    target, other, head = (tmp_path_factory.mktemp(n) for n in ("target", "draft", "eagle3"))
    write_tiny_checkpoint(target, "llama", seed=0)
    write_tiny_checkpoint(other, "llama", seed=1, num_hidden_layers=1)
    write_tiny_head(head, target)
    return {"self": target, "other": other, "eagle3": head}


@pytest.fixture(scope="module")
def ar(drafts):
    """In-process AR greedy tokens of (prompt, max_tokens)."""
    from ssd.llm import LLM
    from ssd.sampling.params import SamplingParams

    llm = LLM(str(drafts["self"]), dtype="float32", block_size=4, kv_cache_memory_mb=8)
    cache: dict[tuple[tuple[int, ...], int], list[int]] = {}

    def tokens(prompt: list[int], max_tokens: int = MAX_TOKENS) -> list[int]:
        key = (tuple(prompt), max_tokens)
        if key not in cache:
            cache[key] = llm.generate([prompt], SamplingParams(max_tokens=max_tokens, ignore_eos=True))[0].token_ids
        return cache[key]

    return tokens


@pytest.fixture(scope="module")
def stacks(drafts, tmp_path_factory):
    """Stack per draft kind, started on first use: draft + target (default mode ssd) + gateway."""
    started: dict[str, Stack] = {}

    def get(which: str) -> Stack:
        if which not in started:
            config = stack_config(model=str(drafts["self"]), draft=str(drafts[which]), dtype="float32", k=K,
                                 default_mode="ssd", http_port=free_port(), grpc_port=free_port(),
                                 log_dir=tmp_path_factory.mktemp(f"logs-ssd-{which}"))
            with pytest.MonkeyPatch.context() as env:  # these tests follow q and acceptance through neural backups
                env.setenv("SSD_DRAFT_BACKUP", "neural")
                env.setenv("SSD_DRAFT_FIT_FAN_OUT", "0")  # and count a perfect draft's hits: at the budget as set
                started[which] = stack = start_stack(config, timeout_s=180)
            assert wait_for(lambda: target_load(stack.target_addresses[0]).is_draft_connected, timeout_s=60)
        return started[which]

    yield get
    for stack in started.values():
        stop_stack(stack)


def generate(address: str, prompt: list[int], mode: int = SSD, max_tokens: int = MAX_TOKENS,
             temperature: float = 0.0, seed: int | None = None, on_message=None):  # noqa: ANN001, ANN201
    """All tokens of one request and its last message (finish reason, speculation stats)."""
    params = common_pb2.SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=True)
    if seed is not None:
        params.seed = seed
    request = target_pb2.VerifierGenerateRequest(prompt_token_ids=prompt, params=params, mode=mode)
    tokens, last = [], None
    with grpc.insecure_channel(address) as channel:
        for i, last in enumerate(target_pb2_grpc.VerifierStub(channel).Generate(request, timeout=120)):
            tokens.extend(last.token_ids)
            if on_message is not None:
                on_message(i)
    return tokens, last


def is_all_ssd(stats: common_pb2.SpeculationStats) -> bool:
    """Every verify round of the request was answered from the draft's SSD cache or its backup."""
    return stats.num_drafts > 0 and stats.num_cache_hits + stats.num_cache_misses == stats.num_drafts


@pytest.mark.parametrize("which", ["self", "other", "eagle3"])
def test_greedy_ssd_through_the_services_equals_ar(stacks, ar, which):
    stack = stacks(which)
    target = stack.target_addresses[0]
    with grpc.insecure_channel(target) as channel:
        info = target_pb2_grpc.VerifierStub(channel).GetInfo(target_pb2.TargetInfoRequest(), timeout=10)
    assert SSD in info.modes
    expected = [ar(p) for p in PROMPTS]
    one_by_one = [generate(target, p) for p in PROMPTS]  # batch 1, mode named
    with ThreadPoolExecutor(len(PROMPTS)) as pool:  # batch 4, the target's default mode (ssd)
        at_once = list(pool.map(lambda p: generate(target, p, mode=common_pb2.SPECULATION_MODE_UNSPECIFIED),
                                PROMPTS))
    assert [tokens for tokens, _ in one_by_one] == expected
    assert [tokens for tokens, _ in at_once] == expected
    stats = [last.spec for _, last in one_by_one + at_once]
    assert all(is_all_ssd(s) and s.num_cache_misses >= 1 for s in stats)  # a sequence's first round misses
    if which == "self":  # a perfect draft: everything accepted, and its own top guess is the bonus token
        assert all(s.num_accepted_tokens == s.num_draft_tokens for s in stats)
        assert all(s.num_cache_hits >= s.num_drafts - 2 for s in stats[: len(PROMPTS)])
        assert target_load(target).num_cache_hits > 0 and draft_load(stack.draft_address).num_cache_hits > 0


def test_sampled_ssd_request_ships_q(stacks):
    """T = 0.8 with the target as its own draft: q equals p, so every draft token passes the ratio test,
    which holds only if q (of cache hits and backups alike) crossed the wire."""
    target = stacks("self").target_addresses[0]
    tokens, last = generate(target, PROMPTS[0], temperature=0.8, seed=7)
    assert len(tokens) == MAX_TOKENS and is_all_ssd(last.spec)
    assert last.spec.num_accepted_tokens == last.spec.num_draft_tokens > 0
    again, _ = generate(target, PROMPTS[0], temperature=0.8, seed=7)
    assert len(again) == MAX_TOKENS


def test_bad_ssd_options_are_a_sequence_error_on_a_live_session(stacks):
    pending: queue.SimpleQueue = queue.SimpleQueue()
    with grpc.insecure_channel(stacks("self").draft_address) as channel:
        answers = draft_pb2_grpc.SpeculatorStub(channel).Session(iter(pending.get, None), timeout=60)

        def ask(round_id: int, **kind) -> draft_pb2.SessionResponse:  # noqa: ANN003
            pending.put(draft_pb2.SessionRequest(round_id=round_id, **kind))
            return next(answers)

        assert ask(1, hello=draft_pb2.Hello(target_id="raw", vocab_size=96)).HasField("ready")
        prefill = draft_pb2.Prefill(seq_id=9, token_ids=PROMPTS[0], ssd=True)
        bad = ask(2, round=draft_pb2.Round(num_speculative_tokens=K, prefills=[prefill],
                                           ssd=draft_pb2.SsdOptions(saguaro_c=2.0)))
        assert [(e.seq_id, e.code) for e in bad.speculations.errors] == [(9, "INVALID_ARGUMENT")]
        good = ask(3, round=draft_pb2.Round(num_speculative_tokens=K, prefills=[prefill],
                                            ssd=draft_pb2.SsdOptions(fan_out_budget=4)))
        assert len(good.speculations.items[0].token_ids) == K and good.speculations.HasField("timings")
        pending.put(None)


def test_draft_killed_mid_ssd_run_leaves_the_output_unchanged(stacks, ar):
    """Runs last on its stack: the draft dies after a few streamed messages, the target finishes in AR and
    reconnects once the draft is back, answering from the SSD cache again."""
    stack = stacks("other")
    target = stack.target_addresses[0]
    draft = stack.child("draft")

    def kill(i: int) -> None:
        if i == 2:
            draft.proc.send_signal(signal.SIGKILL)

    tokens, last = generate(target, PROMPTS[1], max_tokens=LONG_TOKENS, on_message=kill)
    draft.proc.wait()
    assert tokens == ar(PROMPTS[1], LONG_TOKENS)
    assert 0 < last.spec.num_cache_hits + last.spec.num_cache_misses < last.spec.num_drafts  # some rounds lost it
    assert wait_for(lambda: not target_load(target).is_draft_connected)
    stack.children.remove(draft)
    wait_healthy([start_draft(stack, core=None)], 120)  # same address
    assert wait_for(lambda: target_load(target).is_draft_connected, timeout_s=30)
    tokens, last = generate(target, PROMPTS[1])
    assert tokens == ar(PROMPTS[1]) and is_all_ssd(last.spec)
