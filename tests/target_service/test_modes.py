"""The target maps a request's SpeculationMode to the engine's DecodeMode in one place, its default for none."""

import pytest

from protos.ssd.v1 import common_pb2
from ssd.config import DecodeMode
from ssd.errors import InvalidRequestError
from ssd.sampling.params import SamplingParams
from target_service.config import TargetServiceConfig
from target_service.servicer import MODES, request_mode, sampling_params


def test_every_mode_maps_and_unspecified_is_the_default():
    assert set(MODES.values()) == set(DecodeMode)
    assert set(MODES) == set(common_pb2.SpeculationMode.values()) - {common_pb2.SPECULATION_MODE_UNSPECIFIED}
    for default in DecodeMode:
        assert request_mode(common_pb2.SPECULATION_MODE_UNSPECIFIED, default) is default
    assert request_mode(common_pb2.SPECULATION_MODE_SSD, DecodeMode.AR) is DecodeMode.SSD


def test_an_unknown_mode_is_an_invalid_request():
    with pytest.raises(InvalidRequestError, match="SpeculationMode"):
        request_mode(7, DecodeMode.SD)


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
