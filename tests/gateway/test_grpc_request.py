"""The public gRPC GenerateRequest -> the gateway's TextRequest: options carried, bad values refused."""

import pytest

from gateway.errors import InvalidRequest
from gateway.servicer import _text_request
from protos.ssd.v1 import common_pb2, gateway_pb2


def test_options_reach_the_text_request():
    req = _text_request(gateway_pb2.GenerateRequest(
        prompt="hi", max_tokens=4, stop=["."], include_stop_str_in_output=True, truncate_prompt_tokens=5,
        grammar=common_pb2.Grammar(lark='start: "a"'), mode=common_pb2.SPECULATION_MODE_SSD))
    assert req.stop == (".",) and req.include_stop and req.truncate_prompt_tokens == 5 and req.mode == "ssd"
    assert req.params.grammar.lark == 'start: "a"'
    plain = _text_request(gateway_pb2.GenerateRequest(prompt="hi"))
    assert not plain.include_stop and plain.truncate_prompt_tokens is None


@pytest.mark.parametrize("request_fields", [{}, {"prompt": "hi", "max_tokens": -1},
                                            {"prompt": "hi", "truncate_prompt_tokens": 0}])
def test_bad_requests_are_invalid(request_fields):
    with pytest.raises(InvalidRequest):
        _text_request(gateway_pb2.GenerateRequest(**request_fields))
