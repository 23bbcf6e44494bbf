"""An EAGLE-3 head served by the draft service: target features cross the session, greedy output equals AR.

Real processes on localhost, started by the `ssd serve` launcher: a tiny float32 target, a draft service
with a tiny EAGLE-3 head over it, a gateway (tiny random models written to tmp; token-id prompts straight
to the target).
"""

from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from deploy.local import free_port, spawn, start_stack, stop_child, stop_stack
from protos.ssd.v1 import common_pb2, draft_pb2, draft_pb2_grpc, target_pb2, target_pb2_grpc
from rpc.shared_memory import SHM_DIR, live_segments
from tests.integration.helpers import draft_load, stack_config, wait_for
from tests.speculation.test_eagle3_sd import PROMPTS, tiny_target_and_head

MAX_TOKENS = 24


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return tiny_target_and_head(tmp_path_factory)


@pytest.fixture(scope="module")
def services(folders, tmp_path_factory):
    """`ssd serve --draft <head>`: the launcher hands the target model to the draft service."""
    target, head = folders
    config = stack_config(model=str(target), draft=str(head), dtype="float32", k=3, http_port=free_port(),
                         grpc_port=free_port(), log_dir=tmp_path_factory.mktemp("logs-eagle"))
    before = live_segments()
    stack = start_stack(config, timeout_s=180)
    try:
        yield stack.target_addresses[0], stack.draft_address
    finally:
        stop_stack(stack)
    assert (config.log_dir / "draft.log").read_text().count("TENSOR_TRANSPORT_SHARED_MEMORY") >= int(SHM_DIR.is_dir())
    assert wait_for(lambda: not live_segments() - before, timeout_s=10)  # stopped services unlinked their segments


def generate(address: str, prompt: list[int], mode: int = common_pb2.SPECULATION_MODE_SD,
             max_tokens: int = MAX_TOKENS) -> tuple[list[int], target_pb2.VerifierGenerateResponse]:
    """All tokens of one greedy request, and its last message (finish reason, speculation stats)."""
    params = common_pb2.SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    request = target_pb2.VerifierGenerateRequest(prompt_token_ids=prompt, params=params, mode=mode)
    tokens, last = [], None
    with grpc.insecure_channel(address) as channel:
        for last in target_pb2_grpc.VerifierStub(channel).Generate(request, timeout=120):
            tokens.extend(last.token_ids)
    return tokens, last


def test_greedy_output_through_the_services_equals_ar(folders, services):
    from ssd.llm import LLM
    from ssd.sampling.params import SamplingParams

    target_address, draft_address = services
    with grpc.insecure_channel(draft_address) as channel:
        info = draft_pb2_grpc.SpeculatorStub(channel).GetInfo(draft_pb2.DraftInfoRequest(), timeout=5)
    assert list(info.feature_layers) == [0, 1, 2]
    ar = LLM(str(folders[0]), dtype="float32", block_size=4, kv_cache_memory_mb=8)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    expected = [ar.generate([p], params)[0].token_ids for p in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:  # concurrent: rounds carry several sequences
        results = list(pool.map(lambda p: generate(target_address, p), PROMPTS))
    assert [tokens for tokens, _ in results] == expected
    assert sum(last.spec.num_draft_tokens for _, last in results) > 0
    assert draft_load(draft_address).num_draft_tokens > 0


@pytest.mark.parametrize("mode", [common_pb2.SPECULATION_MODE_SD, common_pb2.SPECULATION_MODE_SSD], ids=["sd", "ssd"])
def test_a_prompt_chunked_while_another_decodes_keeps_greedy_output(folders, services, mode):
    """A 300-token prompt arrives while a long answer streams: the target feeds it in chunks (256 tokens while
    others decode), its features reach the head in pieces; both answers are AR's."""
    import time

    from ssd.llm import LLM
    from ssd.sampling.params import SamplingParams

    long = [(7 * i) % 90 + 3 for i in range(300)]
    ar = LLM(str(folders[0]), dtype="float32", block_size=4, kv_cache_memory_mb=8)
    expected = [ar.generate([p], SamplingParams(max_tokens=n, ignore_eos=True))[0].token_ids
                for p, n in ((PROMPTS[0], 160), (long, MAX_TOKENS))]
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(generate, services[0], PROMPTS[0], mode, 160)
        time.sleep(0.3)  # the first is decoding by now
        second = pool.submit(generate, services[0], long, mode)
        assert [first.result()[0], second.result()[0]] == expected


def test_eagle_draft_without_target_model_fails_clearly(folders, tmp_path):
    _, head = folders
    address = f"127.0.0.1:{free_port()}"
    child = spawn("draft-no-target", ["draft_service", "--draft", str(head), "--address", address,
                                      "--threads", "1"], address, None, tmp_path)
    try:
        assert child.proc.wait(timeout=120) != 0
    finally:
        stop_child(child)
    log = (tmp_path / "draft-no-target.log").read_text()
    assert "EAGLE-3 head" in log and "--target-model" in log


def test_per_request_speculation_stats_equal_in_process_eagle(folders, services):
    """Same features, same head: the remote drafts are the in-process drafts, so accepted counts match."""
    from ssd.config import ProposerChoice, SpeculationConfig
    from ssd.llm import LLM
    from ssd.sampling.params import SamplingParams

    target, head = folders
    spec = SpeculationConfig(ProposerChoice(str(head)), num_speculative_tokens=3)
    llm = LLM(str(target), dtype="float32", block_size=4, kv_cache_memory_mb=8, speculation=spec)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    for prompt in PROMPTS:  # one at a time: the same batch shapes on both sides
        local = llm.generate([prompt], params)[0].spec
        _, last = generate(services[0], prompt)
        assert (last.spec.num_draft_tokens, last.spec.num_accepted_tokens) == (
            local.num_draft_tokens, local.num_accepted_tokens)


def sd_and_ssd_on_a_stack(folders, log_dir, **stack_options):  # noqa: ANN001, ANN003, ANN201
    """Start `ssd serve` over the tiny target and head with `stack_options`, send every prompt in sd and in ssd
    at once, stop it; returns (sd results, ssd results, AR's tokens per prompt)."""
    from ssd.llm import LLM
    from ssd.sampling.params import SamplingParams

    target, head = folders
    config = stack_config(model=str(target), draft=str(head), dtype="float32", k=3, http_port=free_port(),
                         grpc_port=free_port(), log_dir=log_dir, **stack_options)
    stack = start_stack(config, timeout_s=180)
    modes = [common_pb2.SPECULATION_MODE_SD, common_pb2.SPECULATION_MODE_SSD]
    try:
        with ThreadPoolExecutor(2 * len(PROMPTS)) as pool:
            sd, ssd = ([pool.submit(generate, stack.target_addresses[0], p, mode) for p in PROMPTS] for mode in modes)
            sd, ssd = [f.result() for f in sd], [f.result() for f in ssd]
    finally:
        stop_stack(stack)
    ar = LLM(str(target), dtype="float32", block_size=4, kv_cache_memory_mb=8)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    return sd, ssd, [ar.generate([p], params)[0].token_ids for p in PROMPTS]


def test_target_service_speculates_token_trees(folders, tmp_path):
    """`ssd serve --tree-budget 8`: sd requests verify 8-node trees drafted by the remote head, ssd requests in the
    same batches keep chains; both give AR's output."""
    sd, ssd, expected = sd_and_ssd_on_a_stack(folders, tmp_path, tree_budget=8)
    assert [tokens for tokens, _ in sd] == expected
    assert [tokens for tokens, _ in ssd] == expected
    rounds = sum(last.spec.num_drafts for _, last in sd)
    assert sum(last.spec.num_draft_tokens for _, last in sd) > 3 * rounds  # more nodes than a K=3 chain
    assert sum(last.spec.num_draft_tokens for _, last in ssd) <= 3 * sum(last.spec.num_drafts for _, last in ssd)
    assert sum(last.spec.num_cache_hits + last.spec.num_cache_misses for _, last in ssd) > 0


def test_tensor_parallel_target_with_a_remote_head(folders, tmp_path):
    """The target sharded over 2 ranks, the EAGLE-3 head in the draft service: rank 0's features (whole after each
    all-reduce) cross the session; sd and ssd give AR's output."""
    sd, ssd, expected = sd_and_ssd_on_a_stack(folders, tmp_path, tensor_parallel_size=2)
    assert [tokens for tokens, _ in sd] == expected and [tokens for tokens, _ in ssd] == expected
    assert sum(last.spec.num_accepted_tokens for _, last in sd + ssd) > 0
    assert "tensor-parallel target ready" in (tmp_path / "target-0.log").read_text()


def test_target_tree_flags_are_checked():
    from ssd.config import TreeShape
    from ssd.errors import InvalidRequestError
    from target_service.config import parse_args

    assert parse_args(["--tree-budget", "16", "--tree-topk", "3"]).speculation.tree == TreeShape(16, 4, 3)
    assert parse_args([]).speculation.tree is None  # chains
    with pytest.raises(InvalidRequestError, match="tree budget"):
        parse_args(["--tree-budget", "-1"])
