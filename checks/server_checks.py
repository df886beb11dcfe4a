"""Talking to the engine's server (SGLang or vLLM) from the host itself, and judging its answers.

The requests run on the checked host with curl (the server binds 127.0.0.1 by default, so the
controller may not reach it). The API key never leaves the host: curl reads the header from a
process substitution filled from the unit's EnvironmentFile, so it appears on no command line
and in no log. The judge_* functions are pure, unit-tested on recorded responses
(tests/unit/data/sglang/).

Endpoints and shapes: python/sglang/srt/entrypoints/http_server.py and
python/sglang/srt/utils (add_api_key_middleware: 401 {"error": "Unauthorized"}; /health* and
/metrics pass without the key). vLLM 0.16.0 (vllm/entrypoints/openai/api_server.py,
AuthenticationMiddleware) guards only /v1/* with the key: /health and /metrics answer without
it; metric names are vllm:* (vllm/v1/metrics/loggers.py) where SGLang's are sglang:*.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from checks import answer_parsers, bounded, service_parsers
from checks.probes import explain
from roles.shared.shell import Shell, argv, sh
from roles.shared.tls import curl_tls_options

STATUS_MARKER = "IH-HTTP "
# A short deterministic prompt whose answer is plain language: degenerate output (one token
# repeated, reported for Kimi-K2.5 on some Blackwell setups, sglang #23264) shows at once.
CHAT_PROMPT = "Name the four seasons of the year in one short sentence."
CHAT_MAX_TOKENS = 48


@dataclass(frozen=True)
class HttpAnswer:
    status: int  # 0: no answer at all (refused, timed out)
    seconds: float
    body: str
    error: str = ""

    def json(self) -> dict:
        return json.loads(self.body)


def _address(expect) -> str:
    """Where the engine answers on its own host: loopback for a wildcard bind."""
    address = "127.0.0.1" if expect.serving_host in ("0.0.0.0", "127.0.0.1") else expect.serving_host
    return "[::1]" if address in ("::", "::1") else address


def base_url(expect) -> str:
    """http://<address>:<port>; with serving_tls_*, https://<the name the certificate covers>:<port>
    (the node's ssh_hostname, else its inventory name), which tls_options connects to the engine's
    own address."""
    if expect.serving_tls:
        name = expect.tls_server_name
        return f"https://{f'[{name}]' if ':' in name else name}:{expect.serving_port}"
    return f"http://{_address(expect)}:{expect.serving_port}"


def tls_options(expect) -> list[str]:
    """curl's options for an engine that serves TLS: verify its certificate with the CA the deploy
    installed (--cacert; never -k), for the name base_url asks, while connecting to the engine's
    own address (--connect-to: no DNS lookup of that name on the host)."""
    return curl_tls_options(expect.tls_ca_file, _address(expect)) if expect.serving_tls else []


def environment_file(host, unit: str) -> str | None:
    shown = service_parsers.parse_systemctl_show(
        host.run(sh("systemctl show -p EnvironmentFiles -- {unit}", unit=unit)).stdout
    )
    value = shown.get("EnvironmentFiles", "")
    return value.split()[0] if value else None


def api_key_assignment(expect, variable: str) -> Shell:
    """Shell that reads the API key from roles/serving's 0600 --config file into a variable,
    on the host itself: the key never reaches the controller or a command line."""
    if variable not in ("KEY", "OPENAI_API_KEY"):
        raise ValueError(f"{variable!r}: the key goes into KEY (curl) or OPENAI_API_KEY (the benchmark)")
    return sh(
        "KEY=$(jq -r '[.\"api-key\"] | flatten | .[0] // empty' {file}); "
        if variable == "KEY"
        else "OPENAI_API_KEY=$(jq -r '[.\"api-key\"] | flatten | .[0] // empty' {file}); ",
        file=expect.api_key_file,
    )


def request(
    host, expect, path: str, body: dict | None = None, with_key: bool = True, timeout_s: float | None = None
) -> HttpAnswer:
    """One request on the host (marked_request: an endpoint that did not answer once is not
    asked again in this run)."""
    timeout_s = timeout_s or expect.server_timeout_s
    # curl reads `\n` in -w as a newline: the marker line follows the body on a line of its own.
    curl = argv(
        "curl",
        "-sS",
        "-m",
        str(timeout_s),
        *tls_options(expect),
        "-w",
        "\\n" + STATUS_MARKER + "%{http_code} %{time_total}",
    )
    data = key_setup = sh("")
    if body is not None:
        curl = sh("{curl} -H {header} --data-binary @-", curl=curl, header="Content-Type: application/json")
        data = sh("printf %s {body} | ", body=json.dumps(body))
    if with_key and expect.api_key_configured:
        key_setup = api_key_assignment(expect, "KEY")
        curl = sh('{curl} -K <(printf \'header = "Authorization: Bearer %s"\\n\' "$KEY")', curl=curl)
    script = sh("{key_setup}{data}{curl} {url}", key_setup=key_setup, data=data, curl=curl, url=base_url(expect) + path)
    # curl's -m bounds the request (a server that accepts and never answers: curl exit 28); the
    # outer bound is for the rest (jq, a shell that does not start).
    command = sh("bash -c {script}", script=str(script))
    return marked_request(host, base_url(expect), path, command, float(timeout_s))


def marked_request(host, endpoint: str, path: str, command: Shell, timeout_s: float) -> HttpAnswer:
    """Runs one curl request on the bounded host: `command` asks `endpoint` for `path` with curl's
    -m timeout_s and prints STATUS_MARKER. An endpoint that let one request run into curl's -m
    (exit 28: it accepted and never answered, or stalled mid-answer) is not asked again in this
    run: each later request fails at once naming the first (a wedged engine cost every check its
    whole timeout, 185 s for the server suite). The engine's checks and the gateway's use it."""
    earlier = bounded.unanswered(host, endpoint)
    if earlier:
        kind = bounded.KINDS["engine HTTP"]
        raise bounded.CommandOverrun(
            f"expected {path} to answer on {endpoint}; found it not asked: {earlier} earlier in this run "
            f"(its FAIL line says more); likely cause: {kind.cause}; what to do: {kind.next_step}"
        )
    result = bounded.run(host, command, what="engine HTTP", bound_s=timeout_s + 15)
    answer = parse_curl_output(result.stdout, result.stderr)
    if answer.status == 0 and CURL_TIMED_OUT in answer.error:
        bounded.mark_unanswered(
            host, endpoint, f"{endpoint} did not answer {path} within {timeout_s:g} s (curl exit 28)"
        )
    return answer


# curl's own message for its -m limit (exit 28, CURLE_OPERATION_TIMEDOUT), which -sS prints.
CURL_TIMED_OUT = "curl: (28)"


def parse_curl_output(stdout: str, stderr: str = "") -> HttpAnswer:
    body, _, tail = stdout.rpartition(STATUS_MARKER)
    if not tail:
        return HttpAnswer(0, 0.0, "", stderr.strip() or "curl printed nothing")
    code, seconds = tail.split()[:2]
    failed = [line for line in stderr.splitlines() if line.startswith("curl: (")]  # -sS: curl's own error
    if failed and code != "000":
        # headers came, the body did not end (a server that stalls mid-body, or streams past -m):
        # no answer, whatever the status line said; the partial body is not read as an answer
        return HttpAnswer(0, float(seconds), "", f"HTTP {code}, then {failed[-1].strip()}")
    return HttpAnswer(int(code), float(seconds), body.removesuffix("\n"), stderr.strip() if code == "000" else "")


# -- judges: pure, unit-tested --------------------------------------------------------------------


def judge_health(answer: HttpAnswer, bound_s: float) -> str | None:
    if answer.status == 200 and answer.seconds <= bound_s:
        return None
    found = f"HTTP {answer.status} after {answer.seconds:.1f} s" if answer.status else f"no answer ({answer.error})"
    return explain(
        f"/health to answer 200 within {bound_s} s",
        found,
        "503 while the model loads is normal for ~10 minutes; otherwise read "
        "`journalctl -u <unit>` (a 1-token generate timed out: GPU hang, NCCL deadlock)",
    )


def judge_models(answer: HttpAnswer, served_name: str) -> str | None:
    if answer.status != 200:
        return explain(
            "/v1/models to answer 200",
            f"HTTP {answer.status} {answer.body[:200] or answer.error}",
            "see the check 'health'; a 401 means the checks could not read the API key",
        )
    ids = answer_parsers.model_ids(answer.json())
    if served_name in ids:
        return None
    return explain(
        f"served model name {served_name!r}",
        f"{ids}",
        "serving_served_model_name and the server's --served-model-name must agree; re-run the deploy",
    )


def judge_chat(answer: HttpAnswer) -> tuple[str | None, str]:
    """Returns (problem, generated text)."""
    if answer.status != 200:
        return explain(
            "a chat completion (HTTP 200)",
            f"HTTP {answer.status} {answer.body[:300] or answer.error}",
            "read the server log; check the model path and GPU memory",
        ), ""
    text = answer_parsers.completion_text(answer.json())
    reason = answer_parsers.degenerate_reason(text)
    if reason:
        return explain(
            "ordinary text from a deterministic prompt",
            f"degenerate output: {reason}: {text[:120]!r}",
            "a known failure of some attention backends / kernels on SM120 "
            "(sglang #23264): try serving_attention_backend = 'triton', check the engine stack",
        ), text
    return None, text


def judge_refused_without_key(answer: HttpAnswer) -> str | None:
    if answer.status in (401, 403):
        return None
    return explain(
        "HTTP 401 for /v1/models without the API key",
        f"HTTP {answer.status}",
        "the server runs without --api-key (or its env-file equivalent): anyone who reaches the "
        "port can use it; re-run the deploy and check the unit's environment",
    )


def judge_metrics(answer: HttpAnswer, engine: str = "sglang") -> tuple[str | None, int]:
    if answer.status != 200:
        hint = (
            "serving_enable_metrics is set: the server needs --enable-metrics"
            if engine == "sglang"
            else "vLLM serves /metrics by itself: read the server log"
        )
        return explain("/metrics to answer 200", f"HTTP {answer.status}", hint), 0
    names = [name for name in answer_parsers.parse_prometheus(answer.body) if name.startswith(f"{engine}:")]
    if not names:
        return explain(
            f"Prometheus metrics named {engine}:*",
            "none",
            "check the server version's metrics (is the unit running the other engine?)",
        ), 0
    return None, len(names)
