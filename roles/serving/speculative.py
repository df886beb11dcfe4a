"""Speculative decoding (EAGLE-3) settings, checked per SGLang release while the inventory is
validated, and rendered into the server's flags and environment.

What each check stands on (read in the releases' own source):
- the algorithm must be one of `--speculative-algorithm`'s choices of the release (captured CLI);
- EAGLE3 reads the target's hidden states through the model's `set_eagle3_layers_to_capture`:
  srt/models/kimi_k25.py has it from 0.5.10 on, not in 0.5.9 (captured per release by
  roles.serving.cli_capture as `eagle3_capture_architectures`);
- server_args.py (0.5.9, 0.5.10): with `--speculative-eagle-topk 1` SGLang silently sets the
  draft tokens to steps + 1, so another value is refused here rather than changed there;
  `SGLANG_ENABLE_SPEC_V2` (srt/environ.py, default False) keeps the overlap scheduler on for
  EAGLE/EAGLE3 and raises at start with topk > 1; off, EAGLE turns the overlap scheduler off
  ("Overlap scheduler is disabled when spec v2 is off"). Releases without the switch (0.5.23)
  refuse spec_v2 = True here;
- the drafter's config.json against the target's (roles/shared/eagle3.py): hidden size, vocabulary,
  `eagle_aux_hidden_state_layer_ids` in SGLang's convention. Both files are read on the
  control machine (paths relative to the inventory file: a copy of each model's config.json),
  so a drafter that cannot work never reaches the host.

Without --max-running-requests SGLang caps speculative serving at 48 running requests
(server_args.py _handle_speculative_decoding, 0.5.9 and 0.5.10, for EAGLE/EAGLE3/STANDALONE:
"Max running requests is reset to 48 for speculative decoding"): the command line says the
number either way. With both config.json copies, the KV cache left per GPU is estimated per
release (roles/shared/kv_cache.py) and (context_length + 4 + num_draft_tokens) * max_running_requests
must fit in it (roles/serving/memory.py, which runs on every gpu node); the deploy prints the
estimate (kv_estimate_note) and the health check SGLang's own figure from the journal.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

from roles.serving.cli_capture import data_file
from roles.shared import eagle3, kv_cache
from roles.site import EngineStack, HostSettings, SpeculativeSettings, Stack

ALGORITHMS = ("EAGLE", "EAGLE3")
SAFE_PATH_RE = re.compile(r"^/[A-Za-z0-9._/@+-]+$")


SPECULATIVE_MAX_RUNNING_REQUESTS = 48  # SGLang's own with a drafter (server_args.py)


def effective_max_running_requests(configured: int | None, speculative: dict | None) -> int | None:
    """What SGLang will run at most: the setting, else 48 with a drafter, else None (SGLang
    derives it from the KV pool)."""
    if configured is not None:
        return configured
    return SPECULATIVE_MAX_RUNNING_REQUESTS if speculative else None


def speculative_arguments(spec: SpeculativeSettings) -> list[str]:
    return [
        "--speculative-algorithm",
        spec.algorithm,
        "--speculative-draft-model-path",
        spec.draft_model_path,
        "--speculative-num-steps",
        str(spec.num_steps),
        "--speculative-eagle-topk",
        str(spec.eagle_topk),
        "--speculative-num-draft-tokens",
        str(spec.num_draft_tokens),
    ]


def speculative_environment(spec: SpeculativeSettings | None, cli: dict) -> dict[str, str]:
    """SGLANG_ENABLE_SPEC_V2 stated explicitly whenever the release has the switch."""
    if spec is None or cli.get("spec_v2_default") is None:
        return {}
    return {"SGLANG_ENABLE_SPEC_V2": "1" if spec.spec_v2 else "0"}


def speculative_problems(host: HostSettings, stack: Stack, inventory_dir: Path) -> list[str]:
    """Registered with the site model's rules by validation.py."""
    spec, active = host.speculative, stack.active
    cli = release_cli(active.sglang)
    if spec is None or cli is None:
        return []  # no CLI captured: the command-line check already says so
    version = active.sglang
    label = f"serving_speculative ({spec.algorithm} on sglang {version})"
    problems = _shape_problems(spec, cli, version)
    if spec.algorithm == "EAGLE3" or spec.draft_config or spec.target_config:
        problems += _config_problems(host, spec, stack, active, cli, inventory_dir)
    return [f"{label}: {p}" for p in problems]


def _shape_problems(spec: SpeculativeSettings, cli: dict, version: str | None) -> list[str]:
    problems = []
    choices = (cli["options"].get("--speculative-algorithm") or {}).get("choices") or ALGORITHMS
    if spec.algorithm not in ALGORITHMS or spec.algorithm not in choices:
        problems.append(
            f"algorithm {spec.algorithm!r} is not a drafter algorithm of sglang {version};"
            f" expected one of {', '.join(a for a in ALGORITHMS if a in choices)}"
        )
    if not SAFE_PATH_RE.match(spec.draft_model_path) or ".." in spec.draft_model_path.split("/"):
        problems.append(
            f"draft_model_path {spec.draft_model_path!r} is not an absolute path of letters, digits and ._/@+-"
        )
    for name, low in (("num_steps", 1), ("eagle_topk", 1), ("num_draft_tokens", 2)):
        value = getattr(spec, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            problems.append(f"{name} = {value!r}; expected an integer >= {low}")
    if problems:
        return problems
    if spec.eagle_topk == 1 and spec.num_draft_tokens != spec.num_steps + 1:
        problems.append(
            f"num_draft_tokens = {spec.num_draft_tokens} with eagle_topk = 1; sglang {version} replaces it"
            f" with num_steps + 1 = {spec.num_steps + 1} (server_args.py); expected {spec.num_steps + 1}"
        )
    if not isinstance(spec.spec_v2, bool):
        problems.append(f"spec_v2 = {spec.spec_v2!r}; expected True or False")
    elif spec.spec_v2 and cli.get("spec_v2_default") is None:
        problems.append(
            f"spec_v2 = True but sglang {version} has no SGLANG_ENABLE_SPEC_V2 switch"
            " (srt/environ.py); expected spec_v2 = False"
        )
    elif spec.spec_v2 and spec.eagle_topk > 1:
        problems.append(
            f"spec_v2 = True with eagle_topk = {spec.eagle_topk}: sglang {version} refuses"
            " to start (spec v2 supports topk 1 only); expected eagle_topk = 1"
        )
    return problems


def _config_problems(
    host: HostSettings, spec: SpeculativeSettings, stack: Stack, active: EngineStack, cli: dict, inventory_dir: Path
) -> list[str]:
    missing = [k for k in ("draft_config", "target_config") if not getattr(spec, k)]
    if missing:
        return [
            f"{' and '.join(missing)} missing; expected the path (relative to the inventory) of a"
            f" copy of the {'drafter' if missing[0] == 'draft_config' else 'target'} model's"
            " config.json, so the drafter is checked against the target before any host is touched"
        ]
    assert spec.draft_config and spec.target_config  # none is missing (above)
    try:
        drafter_file = inventory_dir / spec.draft_config
        target_file = inventory_dir / spec.target_config
        drafter = eagle3.Drafter.from_config(eagle3.read_config(drafter_file))
        target = eagle3.Target.from_config(eagle3.read_config(target_file))
    except eagle3.ConfigError as error:
        return [f"{error}"]
    problems = [
        f"drafter {spec.draft_config} against target {spec.target_config}: {p}"
        for p in eagle3.drafter_problems(drafter, target, spec.algorithm)
    ]
    if spec.algorithm == "EAGLE3" and target.architecture not in cli.get("eagle3_capture_architectures", []):
        able = [s.id for s in stack.stacks.values() if _captures(s.sglang, target.architecture)]
        problems.append(
            f"the target {target.architecture} has no set_eagle3_layers_to_capture in sglang"
            f" {active.sglang} (srt/models/): EAGLE-3 cannot read its hidden states; expected a stack"
            f" whose sglang has it: {', '.join(able) or '(none in ' + stack.file + ')'}"
        )
    return problems


def kv_estimate_note(host: HostSettings, version: str | None, inventory_dir: Path) -> str | None:
    """The estimate in one line, for the deploy's output beside SGLang's own figure (the health
    check "kv cache allocated" reads it from the journal); None without both config.json copies
    or for a target the estimate does not know (the inventory's checks already ran)."""
    estimate = kv_cache.site_estimate(host, inventory_dir, version)
    if estimate is None:
        return None
    return (
        f"KV cache estimate for sglang {version}: {estimate.kv_tokens} tokens, {kv_cache.gib(estimate.kv_bytes)}"
        f" per GPU ({host.serving.mem_fraction_static:g} x {kv_cache.gib(estimate.before_load_bytes)} free before"
        f" loading - {kv_cache.gib(estimate.loaded_before_pool_bytes)} of weights); SGLang's own figure: the health"
        " check 'kv cache allocated' (docs/serving-memory.md)"
    )


def _captures(version: str | None, architecture: str) -> bool:
    cli = release_cli(version)
    return cli is not None and architecture in cli.get("eagle3_capture_architectures", [])


@cache
def release_cli(version: str | None) -> dict | None:
    """The release's captured CLI (roles/serving/cli/<version>.json), None when not captured (or
    no SGLang release: a vLLM stack)."""
    if version is None:
        return None
    path = data_file(version)
    return json.loads(path.read_text()) if path.is_file() else None
