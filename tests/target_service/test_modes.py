"""The target maps a request's SpeculationMode to the engine's DecodeMode in one place, its default for none."""

import pytest

from protos.ssd.v1 import common_pb2
from ssd.config import DecodeMode
from ssd.errors import InvalidRequestError
from ssd.sampling.params import SamplingParams
from target_service.config import TargetServiceConfig
from target_service.servicer import MODES, RequestMode, request_mode, sampling_params

AUTO, UNSPECIFIED = common_pb2.SPECULATION_MODE_AUTO, common_pb2.SPECULATION_MODE_UNSPECIFIED


def test_every_mode_maps_and_unspecified_is_the_default():
    assert set(MODES.values()) == set(DecodeMode)
    assert set(MODES) | {AUTO} == set(common_pb2.SpeculationMode.values()) - {UNSPECIFIED}
    for default in DecodeMode:
        assert request_mode(UNSPECIFIED, default) == RequestMode(default)
    assert request_mode(common_pb2.SPECULATION_MODE_SSD, DecodeMode.AR) == RequestMode(DecodeMode.SSD)


def test_auto_speculates_in_the_default_mode_adaptively_and_a_named_mode_is_never_adaptive():
    assert request_mode(AUTO, DecodeMode.SSD) == RequestMode(DecodeMode.SSD, adaptive=True)
    assert request_mode(AUTO, DecodeMode.AR) == RequestMode(DecodeMode.SD, adaptive=True)  # auto still speculates
    assert request_mode(UNSPECIFIED, DecodeMode.SD, adaptive_default=True) == RequestMode(DecodeMode.SD, True)
    assert request_mode(UNSPECIFIED, DecodeMode.AR, adaptive_default=True) == RequestMode(DecodeMode.AR)
    assert request_mode(common_pb2.SPECULATION_MODE_SD, DecodeMode.SD, adaptive_default=True) == RequestMode(
        DecodeMode.SD)
    params = sampling_params(common_pb2.SamplingParams(max_tokens=4), DecodeMode.SD, adaptive=True)
    assert params.adaptive and params.mode is DecodeMode.SD


def test_an_unknown_mode_is_an_invalid_request():
    with pytest.raises(InvalidRequestError, match="SpeculationMode"):
        request_mode(9, DecodeMode.SD)


@pytest.mark.parametrize(("mode", "speculative"), [(DecodeMode.AR, False), (DecodeMode.SD, True),
                                                    (DecodeMode.SSD, True)])
def test_the_engine_params_carry_the_mode(mode, speculative):
    params = sampling_params(common_pb2.SamplingParams(max_tokens=4), mode)
    assert params.mode is mode and params.is_speculative is speculative
    assert SamplingParams().is_speculative and SamplingParams(mode="ar").mode is DecodeMode.AR


def test_the_default_mode_setting_takes_a_name_and_refuses_others():
    assert TargetServiceConfig(default_mode="ssd").default_mode is DecodeMode.SSD
    with pytest.raises(InvalidRequestError, match="default mode must be one of ar, sd, ssd"):
        TargetServiceConfig(default_mode="fast")
