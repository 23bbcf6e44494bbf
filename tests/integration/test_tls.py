"""Mutual TLS on every gRPC hop: the stack serves (gateway -> target -> draft over mTLS, speculation on), and a
client without a certificate signed by the stack's CA is refused by each model service."""

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from deploy.local import stop_stack
from protos.ssd.v1 import common_pb2, target_pb2_grpc
from rpc.tls import sync_channel
from rpc.tls_files import TlsFiles
from tests.certificates import write_certificates
from tests.integration.conftest import API_KEY, launch
from tests.integration.helpers import openai_client, stream_chat, wait_for

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def tls_stack(tmp_path_factory, default_model_path):
    folder = tmp_path_factory.mktemp("certs")
    certs = write_certificates(folder)
    strangers = write_certificates(folder / "strangers", ca_name="another-ca")
    tls = TlsFiles(cert=certs["cert"], key=certs["key"], ca=certs["ca"])
    stack = launch(tmp_path_factory, "tls", draft="ngram", k=3, tls=tls)
    yield stack, tls, certs, strangers
    stop_stack(stack)


def _check(address: str, tls: TlsFiles | None) -> int:
    with sync_channel(address, tls) as ch:
        return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5).status


def test_the_stack_serves_over_mutual_tls_and_refuses_clients_without_a_certificate(tls_stack):
    stack, tls, certs, strangers = tls_stack
    target = stack.target_addresses[0]

    def draft_connected() -> bool:
        with sync_channel(target, tls) as ch:
            return target_pb2_grpc.VerifierStub(ch).GetLoad(common_pb2.LoadRequest(), timeout=5).is_draft_connected

    assert wait_for(draft_connected, timeout_s=30)  # target -> draft over mTLS
    text, usage = stream_chat(openai_client(stack.url, API_KEY), "Count from one to twenty in words.", 32, "sd")
    assert text and usage["completion_tokens"] > 0  # gateway -> target over mTLS
    for address in (target, stack.draft_address):
        assert _check(address, tls) == health_pb2.HealthCheckResponse.SERVING
        for client in (TlsFiles(ca=certs["ca"]),  # TLS, but no client certificate
                       TlsFiles(cert=strangers["cert"], key=strangers["key"], ca=certs["ca"]),  # another CA's
                       None):  # plaintext
            with pytest.raises(grpc.RpcError) as e:
                _check(address, client)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE, (address, client)
