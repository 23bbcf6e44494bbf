"""`ssd chat` (deploy/chat.py) driven in a pseudo-terminal against the running stack: two turns with
metrics, and Ctrl-C mid-answer cancels that answer but keeps the session."""

import sys

import pexpect
import pytest

from tests.integration.conftest import API_KEY

pytestmark = pytest.mark.model

METRICS = r"\[\d+ tokens, [\d.]+ tok/s, TTFT \d+ ms, mean accepted length [\d.]+"


def test_two_turns_metrics_and_ctrl_c(stack) -> None:  # noqa: ANN001
    child = pexpect.spawn(sys.executable, ["-m", "deploy.chat", "--url", stack.url, "--api-key", API_KEY,
                                           "--metrics", "--mode", "sd", "--max-tokens", "300"],
                          encoding="utf-8", timeout=60, env={"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    try:
        child.expect("you> ")
        child.sendline("What is 12 times 7? Answer briefly.")
        child.expect(METRICS)
        child.expect("you> ")

        cancelled = False
        for topic in ("a dragon who learns to cook", "a robot who learns to paint", "a whale who learns to sing"):
            child.sendline(f"Write a long story about {topic}.")
            child.expect(topic + "\\.\r\n")  # the echoed line
            child.expect(r"\w+\W+\w+\W+\w+")  # a few words in: the answer is streaming
            child.send("\x03")  # Ctrl-C
            # on a loaded machine the answer can end before the interrupt lands: then try another one
            cancelled = child.expect([r"\[cancelled\]", METRICS]) == 0
            child.expect("you> ")
            if cancelled:
                break
        assert cancelled

        child.sendline("And what is 12 times 8?")
        child.expect(METRICS)
        child.expect("you> ")
        child.sendline("/exit")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
