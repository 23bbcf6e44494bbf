"""Resolve ghz's `--call package.Service.Method` to a callable gRPC method.

Our own services resolve from the generated stubs (works even when the server is down, so a
stopped service shows up as UNAVAILABLE results, not a start-up failure); any other service is
looked up through the server's reflection API, as ghz does without --proto.
"""

from dataclasses import dataclass

import grpc
from google.protobuf import descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import Message

from loadtest.errors import LoadTestError


@dataclass(frozen=True)
class CallTarget:
    path: str  # "/ssd.v1.Verifier/GetInfo": the HTTP/2 path of the method
    request_cls: type[Message]
    response_cls: type[Message]
    is_server_streaming: bool


def _split(call: str) -> tuple[str, str]:
    """'ssd.v1.Verifier.GetInfo' or 'ssd.v1.Verifier/GetInfo' -> ('ssd.v1.Verifier', 'GetInfo')."""
    service, sep, method = call.replace("/", ".").rpartition(".")
    if not sep or not service or not method:
        raise LoadTestError(f"--call must be package.Service.Method, got {call!r}")
    return service, method


def _load_local_stubs() -> None:
    # Importing the generated modules registers their descriptors in the default pool.
    from grpc_health.v1 import health_pb2  # noqa: F401

    from protos.ssd.v1 import draft_pb2, gateway_pb2, target_pb2  # noqa: F401


def _find(pool: descriptor_pool.DescriptorPool, service: str, method: str) -> MethodDescriptor:
    svc = pool.FindServiceByName(service)
    found = svc.methods_by_name.get(method)
    if found is None:
        raise LoadTestError(f"{service} has no method {method}; it has {sorted(svc.methods_by_name)}")
    return found


def _from_reflection(address: str, credentials: grpc.ChannelCredentials | None,
                     service: str, method: str) -> MethodDescriptor:
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    channel = grpc.secure_channel(address, credentials) if credentials else grpc.insecure_channel(address)
    with channel:
        try:
            return _find(descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(channel)), service, method)
        except (KeyError, grpc.RpcError) as e:
            raise LoadTestError(f"cannot resolve {service}.{method} from the stubs or by server reflection "
                                f"at {address}: {e}") from None


def resolve_call(call: str, address: str, credentials: grpc.ChannelCredentials | None) -> CallTarget:
    service, method = _split(call)
    _load_local_stubs()
    try:
        found = _find(descriptor_pool.Default(), service, method)
    except KeyError:
        found = _from_reflection(address, credentials, service, method)
    if found.client_streaming:
        raise LoadTestError(f"{call} is a client- or bidi-streaming method; only unary and server-streaming "
                            "calls are supported")
    return CallTarget(path=f"/{service}/{method}",
                      request_cls=message_factory.GetMessageClass(found.input_type),
                      response_cls=message_factory.GetMessageClass(found.output_type),
                      is_server_streaming=found.server_streaming)


def parse_request(target: CallTarget, data: str) -> Message:
    """ghz's -d: the request message as JSON (proto field names or lowerCamelCase)."""
    try:
        return json_format.Parse(data or "{}", target.request_cls())
    except json_format.ParseError as e:
        raise LoadTestError(f"-d is not a valid {target.request_cls.DESCRIPTOR.full_name}: {e}") from None
