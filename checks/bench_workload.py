"""The benchmark's workload: the engine's own client (SGLang's bench_serving, `vllm bench serve`)
run on the host, and its output parsed (python -m checks.bench, checks/bench.py)."""

from __future__ import annotations

from checks import answer_parsers
from roles.shared.shell import Shell, argv, sh

# -- the workload --------------------------------------------------------------------------------


def bench_command(
    python: str,
    url: str,
    model: str,
    tokenizer: str,
    input_len: int,
    output_len: int,
    prompts: int,
    concurrency: int,
    output_file: str,
    engine: str = "sglang",
) -> list[str]:
    """One benchmark run. SGLang: sglang.bench_serving's flags. vLLM 0.16.0: `vllm bench serve`
    (vllm/benchmarks/serve.py; run as its CLI module, which also works for the CPU build whose
    `vllm` script is missing), dataset `random` (token ids, fixed lengths at range ratio 0),
    the chat endpoint, and --save-result writing one JSON line with the same metric names
    (output_throughput, mean_ttft_ms, mean_itl_ms, max_concurrency, ...)."""
    if engine == "vllm":
        folder, _, name = output_file.rpartition("/")
        return [
            python,
            "-m",
            "vllm.entrypoints.cli.main",
            "bench",
            "serve",
            "--backend",
            "openai-chat",
            "--endpoint",
            "/v1/chat/completions",
            "--base-url",
            url,
            "--model",
            model,
            "--tokenizer",
            tokenizer,
            "--dataset-name",
            "random",
            "--random-input-len",
            str(input_len),
            "--random-output-len",
            str(output_len),
            "--num-prompts",
            str(prompts),
            "--max-concurrency",
            str(concurrency),
            # Greedy, as the history's earlier runs: vllm 0.16.0's client no longer sends
            # temperature 0 by itself (it warns), leaving sampling to the server's default.
            "--temperature",
            "0",
            "--save-result",
            "--result-dir",
            folder,
            "--result-filename",
            name,
        ]
    return [
        python,
        "-m",
        "sglang.bench_serving",
        "--backend",
        "sglang-oai-chat",
        "--base-url",
        url,
        "--model",
        model,
        "--tokenizer",
        tokenizer,
        "--dataset-name",
        "random-ids",
        "--random-input-len",
        str(input_len),
        "--random-output-len",
        str(output_len),
        "--random-range-ratio",
        "1",
        "--num-prompts",
        str(prompts),
        "--max-concurrency",
        str(concurrency),
        "--output-file",
        output_file,
    ]


def _in_temporary_folder(words: list[str]) -> Shell:
    """The benchmark's argv, each word quoted, but "$d" (the host's temporary folder, made by
    the script) left for the shell to expand, alone or as a path's first part."""
    pieces = [
        sh('"$d"') if w == "$d" else sh('"$d"/{rest}', rest=w[3:]) if w.startswith("$d/") else argv(w) for w in words
    ]
    command = sh("{first}", first=pieces[0])
    for piece in pieces[1:]:
        command = sh("{command} {piece}", command=command, piece=piece)
    return command


def run_workload(host, target, args) -> list[answer_parsers.BenchResult]:
    from checks import bounded, server_checks

    expect = target["expect"]
    key_setup = sh("")
    if expect.api_key_configured:  # bench_serving reads OPENAI_API_KEY; the key stays on the host
        key = server_checks.api_key_assignment(expect, "OPENAI_API_KEY")
        key_setup = sh("{key}export OPENAI_API_KEY; ", key=key)
    # The benchmark's HTTP client verifies the engine (or the gateway it goes through) with the deploy's CA.
    ca = target.get("tls_ca_file") if "base_url" in target else expect.tls_ca_file if expect.serving_tls else None
    if ca:
        key_setup = sh("{key_setup}export SSL_CERT_FILE={ca} REQUESTS_CA_BUNDLE={ca}; ", key_setup=key_setup, ca=ca)
    results = []
    for concurrency in args.concurrency:
        prompts = max(args.min_prompts, concurrency * args.prompts_per_stream)
        command = bench_command(
            expect.engine_python,
            target.get("base_url") or server_checks.base_url(expect),
            expect.served_model_name,
            target["model_path"],
            args.input_len,
            args.output_len,
            prompts,
            concurrency,
            "$d/out.jsonl",
            expect.engine,
        )
        script = sh(
            '{key_setup}d=$(mktemp -d); {command} >&2 && cat "$d"/out.jsonl; rc=$?; rm -rf "$d"; exit $rc',
            key_setup=key_setup,
            command=_in_temporary_folder(command),
        )
        print(
            f"  {expect.engine} benchmark: concurrency {concurrency}, {prompts} prompts, "
            f"{args.input_len} in / {args.output_len} out",
            flush=True,
        )
        result = bounded.run(host, sh("bash -c {script}", script=str(script)), what="benchmark")
        if result.rc != 0:
            raise RuntimeError(
                f"the {expect.engine} benchmark failed (rc {result.rc}): {result.stderr.strip()[-1500:]}"
            )
        results.extend(answer_parsers.parse_bench_serving_jsonl(result.stdout))
    return results
