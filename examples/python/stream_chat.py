"""Streams a chat completion from the ssd-serve gateway's ssd.v1.Generation API (gRPC): the Python twin of
examples/node/stream_chat.js, with the same flags and output (the text on stdout, a JSON summary on stderr).

    .venv/bin/python examples/python/stream_chat.py --address 127.0.0.1:50050 --api-key KEY "Say hello."
"""

import argparse
import json
import os
import sys

import grpc
from google.protobuf.json_format import MessageToDict

from protos.ssd.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prompt")
    parser.add_argument("--address", default=os.environ.get("SSD_GRPC_ADDRESS", "127.0.0.1:50050"))
    parser.add_argument("--api-key", default=os.environ.get("SSD_API_KEY", ""))
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--mode", choices=["ar", "sd", "ssd", "auto"])
    parser.add_argument("--system")
    return parser.parse_args(argv)


def request(args: argparse.Namespace) -> gateway_pb2.GenerateRequest:
    messages = [gateway_pb2.ChatMessage(role="system", content=args.system)] if args.system else []
    messages.append(gateway_pb2.ChatMessage(role="user", content=args.prompt))
    mode = common_pb2.SpeculationMode.Value(f"SPECULATION_MODE_{args.mode.upper()}") if args.mode else 0
    return gateway_pb2.GenerateRequest(chat=gateway_pb2.ChatMessages(messages=messages),
                                       max_tokens=args.max_tokens, temperature=args.temperature, mode=mode)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    metadata = (("authorization", f"Bearer {args.api_key}"),) if args.api_key else ()
    num_deltas, last = 0, None
    with grpc.insecure_channel(args.address) as channel:
        stub = gateway_pb2_grpc.GenerationStub(channel)
        try:
            for delta in stub.GenerateStream(request(args), metadata=metadata):
                num_deltas, last = num_deltas + 1, delta
                sys.stdout.write(delta.text)
                sys.stdout.flush()
        except grpc.RpcError as err:
            sys.stderr.write(json.dumps({"error": err.code().name, "details": err.details()}) + "\n")
            return 1
    summary = {"num_deltas": num_deltas, "finish_reason": None, "usage": None}
    if last is not None:
        summary["finish_reason"] = common_pb2.FinishReason.Name(last.finish_reason)
        summary["usage"] = MessageToDict(last.usage, preserving_proto_field_name=True)
    sys.stderr.write(json.dumps(summary) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
