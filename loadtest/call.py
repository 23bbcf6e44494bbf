"""Resolve ghz's `--call package.Service.Method` to a callable gRPC method.

With `--protoset` (a compiled FileDescriptorSet) or `--proto` (compiled here with grpc_tools' protoc,
`-i` import paths plus the working directory and the file's own folder, as ghz does) the method comes from
those files. Otherwise our own services resolve from the generated stubs (works even when the server is
down, so a stopped service shows up as UNAVAILABLE results, not a start-up failure), and any other service
is looked up through the server's reflection API, as ghz does without --proto.
"""

import tempfile
from dataclasses import dataclass
from pathlib import Path

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import DecodeError, Message

from loadtest.errors import LoadTestError
from loadtest.options import LoadOptions


@dataclass(frozen=True)
class CallTarget:
    path: str  # "/ssd.v1.Verifier/GetInfo": the HTTP/2 path of the method
    request_cls: type[Message]
    response_cls: type[Message]
    is_server_streaming: bool
    is_client_streaming: bool = False

    @property
    def kind(self) -> str:
        """unary | server_streaming | client_streaming | bidi."""
        kinds = {(False, False): "unary", (False, True): "server_streaming", (True, False): "client_streaming",
                 (True, True): "bidi"}
        return kinds[(self.is_client_streaming, self.is_server_streaming)]


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


def pool_from_protoset(path: Path) -> descriptor_pool.DescriptorPool:
    """A pool of the files in a FileDescriptorSet (`protoc --include_imports --descriptor_set_out`)."""
    try:
        files = descriptor_pb2.FileDescriptorSet.FromString(path.read_bytes()).file
    except (OSError, DecodeError) as e:
        raise LoadTestError(f"--protoset {path}: not a readable FileDescriptorSet ({e})") from None
    pool = descriptor_pool.DescriptorPool()
    for file in files:  # protoc writes them dependencies first
        try:
            pool.Add(file)
        except (TypeError, ValueError) as e:
            raise LoadTestError(f"--protoset {path}: {file.name} does not load ({e}); was it built with "
                                "--include_imports?") from None
    return pool


def compile_proto(proto: Path, import_paths: tuple[Path, ...]) -> descriptor_pool.DescriptorPool:
    """Compile `proto` with grpc_tools' protoc into a pool; the file and its imports resolve from `import_paths`,
    the working directory and the file's folder, in that order (as ghz's `--proto` with `-i`)."""
    import grpc_tools
    from grpc_tools import protoc

    includes = [p.resolve() for p in (*import_paths, Path.cwd(), proto.parent)]
    absolute = next((p / proto for p in includes if (p / proto).is_file()), proto.resolve())
    root = next((p for p in includes if absolute.is_relative_to(p)), absolute.parent)
    with tempfile.TemporaryDirectory(prefix="loadtest-proto-") as tmp:
        out = Path(tmp) / "set.pb"
        args = ["grpc_tools.protoc", *(f"-I{p}" for p in includes),
                f"-I{Path(grpc_tools.__file__).parent / '_proto'}", "--include_imports",
                f"--descriptor_set_out={out}", str(absolute.relative_to(root))]
        if not absolute.is_file() or protoc.main(args) != 0:
            raise LoadTestError(f"--proto {proto}: protoc could not compile it (import paths: "
                                f"{', '.join(map(str, includes))}; see protoc's message above)")
        return pool_from_protoset(out)


def _method(opts: LoadOptions, credentials: grpc.ChannelCredentials | None) -> MethodDescriptor:
    service, method = _split(opts.call)
    if opts.protoset is not None or opts.proto is not None:
        pool = pool_from_protoset(opts.protoset) if opts.protoset else compile_proto(opts.proto, opts.import_paths)
        try:
            return _find(pool, service, method)
        except KeyError:
            source = opts.protoset or opts.proto
            raise LoadTestError(f"{source} defines no service {service}") from None
    _load_local_stubs()
    try:
        return _find(descriptor_pool.Default(), service, method)
    except KeyError:
        return _from_reflection(opts.host, credentials, service, method)


def resolve_call(opts: LoadOptions, credentials: grpc.ChannelCredentials | None) -> CallTarget:
    found = _method(opts, credentials)
    service, method = _split(opts.call)
    return CallTarget(path=f"/{service}/{method}",
                      request_cls=message_factory.GetMessageClass(found.input_type),
                      response_cls=message_factory.GetMessageClass(found.output_type),
                      is_server_streaming=found.server_streaming, is_client_streaming=found.client_streaming)


def parse_message(target: CallTarget, data: object, where: str = "-d") -> Message:
    """One request message from its JSON value (a dict; proto field names or lowerCamelCase)."""
    try:
        return json_format.ParseDict(data, target.request_cls())
    except json_format.ParseError as e:
        raise LoadTestError(f"{where} is not a valid {target.request_cls.DESCRIPTOR.full_name}: {e}") from None
