"""The lab's command-line sampler (tests/lab/cmdline_sampler.py, issue 53): its matcher on
planted command lines, and one pass over this machine's /proc that catches a planted process
holding a value in its argv (the fault the lab test guards against), without printing it."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.lab.cmdline_sampler import CmdlineSampler, leaked, redacted

SECRETS = {"engine_api_key": "labQ3x9-abcdefghijklmnop", "hf_token": "hf_lab_0123456789abcdef"}


@pytest.mark.parametrize(
    "argv, names",
    [
        ([b"curl", b"-H", b"Authorization: Bearer labQ3x9-abcdefghijklmnop", b"http://x"], ["engine_api_key"]),
        ([b"jq", b"--arg", b"k", b"labQ3x9-abcdefghijklmnop"], ["engine_api_key"]),
        ([b"env", b"HF_TOKEN=hf_lab_0123456789abcdef", b"python"], ["hf_token"]),
        ([b"curl", b"-K", b"-", b"http://x"], []),
        ([b"jq", b"-r", b".key", b"/etc/inference-host/engine/api-key.json"], []),
    ],
)
def test_the_matcher_finds_a_value_anywhere_in_the_argv(argv, names):
    assert leaked(b"\0".join(argv) + b"\0", SECRETS) == names


def test_a_value_split_across_two_arguments_is_found():
    assert leaked(b"echo\0two words\0", {"phrase": "two words"}) == ["phrase"]
    assert leaked(b"echo\0two\0words\0", {"phrase": "two words"}) == ["phrase"]


def test_the_report_never_holds_the_value():
    line = redacted(b"curl\0-H\0Bearer labQ3x9-abcdefghijklmnop\0", SECRETS)
    assert line == "curl -H Bearer <engine_api_key>"


def test_a_value_too_short_to_match_reliably_is_refused():
    with pytest.raises(AssertionError, match="too short"):
        CmdlineSampler({"pin": "1234"}, "nothing")


def test_a_planted_process_is_caught_on_this_machine():
    """A child of this test whose argv holds a value: one pass over /proc names it (the control
    side: a descendant of the test process), by the value's name, never the value."""
    sampler = CmdlineSampler(dict(SECRETS), "ih-no-such-lab")
    assert sampler.sample_once() == []
    planted = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", SECRETS["hf_token"]])
    try:
        deadline, caught = time.monotonic() + 10, []
        while not caught and time.monotonic() < deadline:
            caught = sampler.sample_once()
    finally:
        planted.kill()
        planted.wait()
    (line,) = caught
    assert line.startswith(f"hf_token on the command line of pid {planted.pid} (control): "), line
    assert SECRETS["hf_token"] not in line and "<hf_token>" in line, line


def test_the_sampling_child_catches_a_planted_process_and_stops():
    """start() samples in a child process (the values on its stdin); stop() reads what it saw."""
    sampler = CmdlineSampler(dict(SECRETS), "ih-no-such-lab").start()
    planted = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", SECRETS["engine_api_key"]])
    try:
        time.sleep(3)
    finally:
        planted.kill()
        planted.wait()
    sampler.stop()
    assert sampler.passes > 0 and sampler.processes > 0
    assert [line.split(": ")[0] for line in sampler.found] == [
        f"engine_api_key on the command line of pid {planted.pid} (control)"
    ], sampler.found
