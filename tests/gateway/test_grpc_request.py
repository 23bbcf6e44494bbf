"""The public gRPC GenerateRequest -> the gateway's TextRequest: options carried, bad values refused."""

import pytest

from gateway.errors import InvalidRequest
from gateway.request_checks import check_params
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


@pytest.mark.parametrize("request_fields", [
    {"prompt": "hi", "mode": 99},
    {"chat": gateway_pb2.ChatMessages()},
    {"chat": gateway_pb2.ChatMessages(messages=[gateway_pb2.ChatMessage(role="wizard", content="hi")])},
    {"chat": gateway_pb2.ChatMessages(messages=[gateway_pb2.ChatMessage(role="tool", content="hi")])},
])
def test_modes_roles_and_empty_chats_are_refused_as_on_http(request_fields):
    with pytest.raises(InvalidRequest):
        _text_request(gateway_pb2.GenerateRequest(**request_fields))


@pytest.mark.parametrize(("fields", "param"), [
    ({"stop_token_ids": [-1]}, "stop_token_ids"), ({"stop_token_ids": [16]}, "stop_token_ids"),
    ({"logit_bias": {99: 1.0}}, "logit_bias"), ({"logit_bias": {1: float("inf")}}, "logit_bias"),
    ({"temperature": float("nan")}, "temperature"), ({"top_p": 1.5}, "top_p"), ({"min_tokens": -1}, "min_tokens"),
    ({"logprobs": 21}, "logprobs"), ({"repetition_penalty": -1.0}, "repetition_penalty"),
])
def test_sampling_params_out_of_range_are_refused(fields, param):
    with pytest.raises(InvalidRequest) as e:
        check_params(common_pb2.SamplingParams(max_tokens=1, **fields), vocab_size=16)
    assert e.value.param == param
    check_params(common_pb2.SamplingParams(max_tokens=1, stop_token_ids=[15], logit_bias={0: -100.0}), 16)
