"""A fast fake target replica for the gateway's reliability tests: the real gRPC Verifier API and health, the real
tokenizer files of a checkpoint folder, no model. `python -m tests.integration.fake_target --address ... --model-dir ...`

Generate streams `--num-tokens` tokens, one every `--token-delay-s`, after checking what the gateway forwarded:
a request the gateway should have refused (token ids out of the vocabulary, counts out of range, longer than
the context) raises here, which the gateway sees as INTERNAL, so a fuzz test counts it as a server error.
"""

import argparse
import asyncio
import math
from pathlib import Path

from protos.ssd.v1 import common_pb2, target_pb2, target_pb2_grpc
from rpc.logging import configure_service_logging
from rpc.server import GrpcServer, HostedService
from target_service.tokenizer_files import read_tokenizer_files

VOCAB_SIZE = 49152  # the default model's
MAX_MODEL_LEN = 2048
TOKEN_ID = 1000  # what every generated token is


def check_forwarded(req: target_pb2.VerifierGenerateRequest) -> None:
    """What the gateway promises the target: raises on a request it should have refused."""
    p = req.params
    ids = [*req.prompt_token_ids, *p.stop_token_ids, *p.logit_bias.keys()]
    if not req.prompt_token_ids or any(not 0 <= t < VOCAB_SIZE for t in ids):
        raise RuntimeError("the gateway forwarded token ids outside the vocabulary")
    if not 1 <= p.max_tokens or len(req.prompt_token_ids) + p.max_tokens > MAX_MODEL_LEN:
        raise RuntimeError(f"the gateway forwarded max_tokens={p.max_tokens} for {len(req.prompt_token_ids)} tokens")
    floats = [p.temperature, p.top_p, p.min_p, p.presence_penalty, p.frequency_penalty, p.repetition_penalty,
              *p.logit_bias.values()]
    if not all(math.isfinite(x) for x in floats) or p.top_k < 0 or p.min_tokens < 0:
        raise RuntimeError("the gateway forwarded a sampling parameter out of range")
    if req.mode not in common_pb2.SpeculationMode.values():  # every mode the proto defines, auto included
        raise RuntimeError(f"the gateway forwarded mode {req.mode}")


class FakeVerifier(target_pb2_grpc.VerifierServicer):
    def __init__(self, model_dir: Path, num_tokens: int, token_delay_s: float) -> None:
        self.info = target_pb2.TargetInfo(model_name="fake-model", max_model_len=MAX_MODEL_LEN, vocab_size=VOCAB_SIZE,
                                          eos_token_ids=[2], tokenizer=read_tokenizer_files(model_dir),
                                          modes=[common_pb2.SPECULATION_MODE_AR], num_kv_blocks=1024, block_size=16,
                                          dtype="float32")
        self.num_tokens, self.token_delay_s = num_tokens, token_delay_s

    async def Generate(self, request, context):  # noqa: ANN001, ANN201
        check_forwarded(request)
        n = min(self.num_tokens, request.params.max_tokens)
        for i in range(n):
            await asyncio.sleep(self.token_delay_s)
            last = i == n - 1
            yield target_pb2.VerifierGenerateResponse(
                token_ids=[TOKEN_ID], finish_reason=common_pb2.FINISH_REASON_LENGTH if last else 0)

    async def Abort(self, request, context):  # noqa: ANN001, ANN201
        return target_pb2.AbortResponse(was_running=False)

    async def GetInfo(self, request, context):  # noqa: ANN001, ANN201
        return self.info

    async def GetLoad(self, request, context):  # noqa: ANN001, ANN201
        return common_pb2.Load(num_kv_blocks=1024)


def main() -> None:
    p = argparse.ArgumentParser(prog="fake_target")
    p.add_argument("--address", required=True)
    p.add_argument("--model-dir", required=True, type=Path)
    p.add_argument("--num-tokens", type=int, default=4)
    p.add_argument("--token-delay-s", type=float, default=0.01)
    a = p.parse_args()
    configure_service_logging("fake_target", "warning")
    asyncio.run(serve(a.address, FakeVerifier(a.model_dir, a.num_tokens, a.token_delay_s)))


async def serve(address: str, verifier: FakeVerifier) -> None:
    service = HostedService("ssd.v1.Verifier", verifier, target_pb2_grpc.add_VerifierServicer_to_server)
    await GrpcServer([service], address, {}).run()


if __name__ == "__main__":
    main()
