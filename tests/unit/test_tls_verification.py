"""No client of the project turns certificate verification off (docs/security.md#tls).

The checks, the benchmark, `inference-host status` and the deploy's own requests verify a
server's certificate against a CA; skipping it would let anyone on the path pose as the endpoint
and collect the bearer key. This reads every source, template and script under checks/,
inference_host/ and roles/ for the ways curl, Python's ssl, requests/httpx and aiohttp skip it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.unit.conftest import PROJECT_ROOT

SCANNED = ("checks", "inference_host", "roles")
SUFFIXES = {".py", ".j2", ".sh", ""}  # "" : scripts without an extension (roles/*/files)

# Python and shell spellings that turn verification off, anywhere on a line.
UNVERIFIED = re.compile(
    r"--insecure\b"
    r"|\bverify\s*=\s*False\b"
    r"|\bCERT_NONE\b"
    r"|\bcheck_hostname\s*=\s*False\b"
    r"|_create_unverified_context"
    r"|\bssl\s*=\s*False\b"  # aiohttp
    r"|PYTHONHTTPSVERIFY\s*=\s*['\"]?0"
    r"|CURL_CA_BUNDLE\s*=\s*['\"]{2}"  # an empty bundle: requests skips verification
)
# curl's -k: a short-option cluster holding a lower-case k on a line that runs curl
# (not -K, its config file; not `timeout -k` or `journalctl -k`, which are not curl's).
CURL_K = re.compile(r"(?<![\w-])-[a-zA-Z]*k[a-zA-Z]*(?![\w-])")


def problems_in(text: str) -> list[tuple[int, str]]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        code = line.split("#", 1)[0] if line.lstrip().startswith("#") else line
        if UNVERIFIED.search(code):
            found.append((number, line.strip()))
            continue
        after = code.split("curl", 1)[1] if re.search(r"\bcurl\b", code) else ""
        if CURL_K.search(after):
            found.append((number, line.strip()))
    return found


def sources() -> list[Path]:
    return [
        path
        for folder in SCANNED
        for path in sorted((PROJECT_ROOT / folder).rglob("*"))
        if path.is_file() and path.suffix in SUFFIXES and "__pycache__" not in path.parts
    ]


def test_the_sources_are_found():
    names = {str(p.relative_to(PROJECT_ROOT)) for p in sources()}
    assert {"checks/server_checks.py", "checks/gateway.py", "inference_host/operations.py"} <= names
    assert "roles/serving/templates/inference-engine-rolling.j2" in names


def test_no_client_skips_certificate_verification():
    found = [
        f"{path.relative_to(PROJECT_ROOT)}:{number}: {line}"
        for path in sources()
        for number, line in problems_in(path.read_text(errors="replace"))
    ]
    assert not found, "verify the certificate with a CA file instead (curl --cacert):\n" + "\n".join(found)


@pytest.mark.parametrize(
    "line",
    [
        'curl -k "https://gw:8000/health"',
        "curl -fsSk -- https://gw:8000/health",
        'argv("curl", "-sS", "-k", url)',
        "curl --insecure https://gw:8000/",
        "httpx.Client(verify=False)",
        "requests.get(url, verify = False)",
        "context.verify_mode = ssl.CERT_NONE",
        "context.check_hostname = False",
        "ssl._create_unverified_context()",
        "aiohttp.TCPConnector(ssl=False)",
        "Environment=PYTHONHTTPSVERIFY=0",
    ],
)
def test_a_planted_skip_is_caught(line):
    assert problems_in(f"x = 1\n{line}\n") == [(2, line)]


@pytest.mark.parametrize(
    "line",
    [
        "curl -sS -K <(printf 'header = ...') https://gw:8000/",
        "curl -fsS --max-time 10 -K - -X GET url",
        "timeout -k 5 30 sh -c 'curl -sS https://gw/'",
        "journalctl -k -b --no-pager",
        "curl --cacert /etc/ssl/certs/site-ca.pem https://gw:8000/",
        "# a comment about curl -k is no code",
    ],
)
def test_verifying_clients_and_other_programs_pass(line):
    assert problems_in(line) == []
