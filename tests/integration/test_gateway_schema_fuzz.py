"""schemathesis over the gateway's own OpenAPI schema, against a real gateway process (fake fast target): every
answer is documented (status, content type, body schema), schema-valid bodies are accepted, and no input makes
a server error. The fake target raises on anything the gateway should have refused, so a validation miss
shows as a 500 here. Bounded example counts by default; `make test-slow` runs the long profile."""

from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from tests.gateway.test_http_asgi import StubGenerator, make_app
from tests.integration.gateway_stack import AUTH, fake_stack

NUM_EXAMPLES, NUM_EXAMPLES_SLOW = 10, 400  # per operation and generation mode (valid, invalid)


STATUSES: Counter[int] = Counter()  # every answer's status, reported at the end (run with -s to see it)


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory, default_model_path):  # noqa: ANN001, ANN201
    with fake_stack(tmp_path_factory.mktemp("fake-fuzz"), default_model_path, num_tokens=2,
                    token_delay_s=0.001) as s:
        yield s
    print(f"\nschemathesis: {sum(STATUSES.values())} requests, statuses {dict(sorted(STATUSES.items()))}")


# the document the gateway serves at /openapi.json (it does not depend on the backend)
schema = schemathesis.openapi.from_dict(make_app(StubGenerator()).openapi())
# Cross-field rules (best_of >= n, top_logprobs needs logprobs, one structured-output field at most, token ids
# below the served vocabulary, the served model's name, ...) are not in the JSON schema: a schema-valid body may
# still get a documented 400. Every other check runs (no server errors, documented statuses, content types,
# headers and bodies; schema-invalid bodies refused).
EXCLUDED = [positive_data_acceptance]
_SETTINGS = {"deadline": None, "suppress_health_check": list(HealthCheck), "derandomize": True}


def with_time_to_finish(case) -> None:  # noqa: ANN001
    """A valid `timeout` of a few microseconds rightly ends in 504 (tests/integration/test_gateway_limits.py):
    fuzzed timeouts get a minute, so a 5xx here is a server error."""
    timeout = case.body.get("timeout") if isinstance(case.body, dict) else None
    if isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout > 0:
        case.body["timeout"] = max(timeout, 60)


@schema.parametrize()
@settings(max_examples=NUM_EXAMPLES, **_SETTINGS)
def test_the_gateway_answers_as_documented(fuzzed, case):
    with_time_to_finish(case)
    STATUSES[case.call_and_validate(base_url=fuzzed.url, headers=AUTH, timeout=60,
                                    excluded_checks=EXCLUDED).status_code] += 1


@pytest.mark.slow
@schema.parametrize()
@settings(max_examples=NUM_EXAMPLES_SLOW, **_SETTINGS)
def test_the_gateway_answers_as_documented_long(fuzzed, case):
    with_time_to_finish(case)
    STATUSES[case.call_and_validate(base_url=fuzzed.url, headers=AUTH, timeout=60,
                                    excluded_checks=EXCLUDED).status_code] += 1
