"""EAGLE-3 facts shared by the inventory check, the health checks, the benchmark and the
drafter training job. Standard library only: it also runs on the gpu node inside the training
job (roles/eagle3_training installs it beside the job's driver), and it reads only config.json
files, never weights.

Layer convention. A drafter conditions on three hidden states of the target ("auxiliary
layers"). Which ones is written in the drafter's config.json, `eagle_config.
eagle_aux_hidden_state_layer_ids`, and engines read those ids differently:

- SGLang 0.5.9 and 0.5.10, srt/models/deepseek_v2.py `set_eagle3_layers_to_capture` (the
  DeepSeek-V3 family, Kimi-K2.5's language model included): the model records the hidden state
  that ENTERS layer i for each i in `layers_to_capture`. Without ids it uses [2, N//2, N-3];
  with ids from the drafter config it uses `[val + 1 for val in layer_ids]` ("for the ith
  layer, it takes the output of the (i-1)th layer"). So config id k means "the output of layer
  k", captured as point k+1. For Kimi-K2.5 (61 layers) the default points [2, 30, 58] are the
  config ids [1, 29, 57]. srt/model_executor/model_runner.py reads the ids from the drafter's
  `eagle_config` and passes None when there is none.
- SpecForge (commit 82951a9, specforge/modeling/target/eagle3_target_model.py) uses the same
  ids: its default is [1, N//2 - 1, N - 4] (= [1, 29, 57]); its SGLang backend hands them to the
  same `set_eagle3_layers_to_capture` (+1), its HF backend hooks the output of layer id.
- vLLM passes config ids through as capture points unchanged: a drafter trained on SGLang
  states and served by vLLM (or the reverse) is off by one layer, which collapses acceptance.

Hidden states on disk (SpecForge scripts/prepare_hidden_states.py, offline training): one
torch.save file per sample holding input_ids and loss_mask (int64 each) and, per token, the
last hidden state plus the three auxiliary ones concatenated, in the model's dtype. Per token:
    (1 + aux_layers) x hidden_size x dtype_bytes + 2 x 8
= (1 + 3) x 7168 x 2 + 16 = 57,360 bytes for Kimi-K2.5 in bf16 (about 57 KB).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

AUX_LAYERS = 3  # EAGLE-3 takes three auxiliary hidden states (SpecForge asserts 3)
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
ID_BYTES_PER_TOKEN = 16  # input_ids + loss_mask, int64 each
DISK_MARGIN = 1.10  # torch.save framing, partial files, filesystem slack
# Drafter architectures SGLang loads for EAGLE3 (srt/models/llama_eagle3.py EntryClass in 0.5.9
# and 0.5.10); an EAGLE3 drafter served with EAGLE silently gives accept length 1.0.
EAGLE3_DRAFTER_ARCHITECTURES = ("LlamaForCausalLMEagle3",)


class ConfigError(Exception):
    pass


def read_config(path: str | Path) -> dict:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object (a model's config.json)")
    return data


@dataclass(frozen=True)
class Target:
    architecture: str
    hidden_size: int
    num_layers: int
    vocab_size: int
    bos_token_id: int | None
    eos_token_id: int | None
    dtype: str

    @classmethod
    def from_config(cls, config: dict) -> Target:
        """A multimodal wrapper (Kimi-K2.5: KimiK25ForConditionalGeneration) keeps the language
        model's shape under text_config; SGLang captures that model's layers."""
        text = config.get("text_config") or config
        try:
            return cls(
                architecture=(config.get("architectures") or ["?"])[0],
                hidden_size=int(text["hidden_size"]),
                num_layers=int(text["num_hidden_layers"]),
                vocab_size=int(text["vocab_size"]),
                bos_token_id=text.get("bos_token_id", config.get("bos_token_id")),
                eos_token_id=text.get("eos_token_id", config.get("eos_token_id")),
                dtype=str(text.get("dtype") or text.get("torch_dtype") or config.get("dtype") or "bfloat16"),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ConfigError(f"not a target model config (missing or bad {error})") from None


@dataclass(frozen=True)
class Drafter:
    architecture: str
    hidden_size: int
    target_hidden_size: int  # what its fc layer expects per auxiliary state
    vocab_size: int
    draft_vocab_size: int
    layer_ids: tuple[int, ...] | None  # eagle_config ids (None: the engine's default)
    use_aux_hidden_state: bool

    @classmethod
    def from_config(cls, config: dict) -> Drafter:
        try:
            eagle = config.get("eagle_config") or {}
            ids = eagle.get("eagle_aux_hidden_state_layer_ids")
            return cls(
                architecture=(config.get("architectures") or ["?"])[0],
                hidden_size=int(config["hidden_size"]),
                # srt/models/llama_eagle3.py: target_hidden_size if present, else hidden_size.
                target_hidden_size=int(config.get("target_hidden_size") or config["hidden_size"]),
                vocab_size=int(config["vocab_size"]),
                # llama_eagle3.py: draft_vocab_size None -> vocab_size (lm_head from the target).
                draft_vocab_size=int(config.get("draft_vocab_size") or config["vocab_size"]),
                layer_ids=tuple(int(i) for i in ids) if ids is not None else None,
                use_aux_hidden_state=bool(eagle.get("use_aux_hidden_state", True)),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ConfigError(f"not a drafter config (missing or bad {error})") from None


# -- the layer mapping ------------------------------------------------------------------------------


def sglang_default_capture_points(num_layers: int) -> list[int]:
    """deepseek_v2.py set_eagle3_layers_to_capture(None)."""
    return [2, num_layers // 2, num_layers - 3]


def sglang_capture_points(layer_ids, num_layers: int) -> list[int]:
    """The layers whose input SGLang records for a drafter's config ids (None: its default)."""
    if layer_ids is None:
        return sglang_default_capture_points(num_layers)
    return [int(i) + 1 for i in layer_ids]


def config_ids_for_points(points) -> list[int]:
    """The config ids that make SGLang capture these points (the inverse of the +1)."""
    return [int(p) - 1 for p in points]


def default_config_ids(num_layers: int) -> list[int]:
    """The ids to train with: SGLang's default points in config terms (SpecForge's default)."""
    return config_ids_for_points(sglang_default_capture_points(num_layers))


# -- drafter against target -------------------------------------------------------------------------


def drafter_problems(drafter: Drafter, target: Target, algorithm: str = "EAGLE3") -> list[str]:
    """What stops this drafter from working on this target under SGLang; [] when it fits."""
    problems = []
    if algorithm == "EAGLE3" and drafter.architecture not in EAGLE3_DRAFTER_ARCHITECTURES:
        problems.append(
            f"architecture {drafter.architecture!r} is not an EAGLE-3 drafter;"
            f" expected one of {', '.join(EAGLE3_DRAFTER_ARCHITECTURES)}"
        )
    if algorithm == "EAGLE" and drafter.architecture in EAGLE3_DRAFTER_ARCHITECTURES:
        problems.append(
            "an EAGLE-3 drafter served with algorithm 'EAGLE' gives accept length 1.0; expected algorithm 'EAGLE3'"
        )
    if drafter.target_hidden_size != target.hidden_size:
        problems.append(
            f"hidden size {drafter.target_hidden_size} (target_hidden_size or hidden_size)"
            f" differs from the target's {target.hidden_size}; expected a drafter"
            f" trained on this target"
        )
    if drafter.vocab_size != target.vocab_size:
        problems.append(
            f"vocab_size {drafter.vocab_size} differs from the target's"
            f" {target.vocab_size}; expected the target's vocabulary"
        )
    if drafter.draft_vocab_size > drafter.vocab_size:
        problems.append(f"draft_vocab_size {drafter.draft_vocab_size} exceeds vocab_size {drafter.vocab_size}")
    if not drafter.use_aux_hidden_state:
        problems.append("eagle_config.use_aux_hidden_state is false; EAGLE-3 needs the auxiliary states")
    problems += layer_id_problems(drafter.layer_ids, target.num_layers)
    return problems


def layer_id_problems(layer_ids, num_layers: int) -> list[str]:
    if layer_ids is None:
        return []  # SGLang captures its default points, which SpecForge's default ids match
    ids = list(layer_ids)
    points = sglang_capture_points(ids, num_layers)
    problems = []
    if len(ids) != AUX_LAYERS:
        problems.append(f"eagle_aux_hidden_state_layer_ids {ids} has {len(ids)} ids; expected {AUX_LAYERS}")
    if any(i < 0 or p >= num_layers for i, p in zip(ids, points, strict=False)):
        problems.append(
            f"eagle_aux_hidden_state_layer_ids {ids} are capture points {points} in"
            f" SGLang; expected ids from 0 to {num_layers - 2} for {num_layers} layers"
        )
    default_points = sglang_default_capture_points(num_layers)
    if ids == default_points:
        problems.append(
            f"eagle_aux_hidden_state_layer_ids {ids} are SGLang's capture points, not config ids:"
            f" SGLang adds 1 and captures {points}, one layer after the states a drafter trained"
            f" with SGLang or SpecForge saw (a vLLM-style off-by-one that collapses acceptance);"
            f" expected {default_config_ids(num_layers)} (captured as {default_points})"
        )
    return problems


def drafter_config_for(target_config: dict, template: dict) -> dict:
    """The draft model config the training job trains: SpecForge's DeepSeek-V3 template
    (configs/deepseek-v3-671b-eagle3.json) with the target's vocabulary, special tokens and
    hidden size, and the aux layer ids in SGLang's config convention."""
    target = Target.from_config(target_config)
    config = dict(template)
    config.update(
        {
            "hidden_size": target.hidden_size,
            "vocab_size": target.vocab_size,
            "bos_token_id": target.bos_token_id,
            "eos_token_id": target.eos_token_id,
            "torch_dtype": target.dtype,
            "eagle_config": {
                "eagle_aux_hidden_state_layer_ids": default_config_ids(target.num_layers),
                "use_aux_hidden_state": True,
            },
        }
    )
    config["draft_vocab_size"] = min(int(template.get("draft_vocab_size") or target.vocab_size), target.vocab_size)
    return config


# -- the disk budget of offline training ------------------------------------------------------------


def bytes_per_token(hidden_size: int, dtype: str = "bfloat16", aux_layers: int = AUX_LAYERS) -> int:
    """(1 + aux) hidden states of hidden_size in dtype, plus input_ids and loss_mask."""
    return (1 + aux_layers) * hidden_size * DTYPE_BYTES.get(dtype, 2) + ID_BYTES_PER_TOKEN


def drafter_parameters(draft: dict) -> int:
    """Parameters of a one-layer Llama EAGLE-3 drafter (llama_eagle3.py): embeddings, fc over
    three target states, the decoder layer (attention input is 2 x hidden), norms, lm_head."""
    hidden = int(draft["hidden_size"])
    target_hidden = int(draft.get("target_hidden_size") or hidden)
    heads = int(draft["num_attention_heads"])
    kv_heads = int(draft.get("num_key_value_heads") or heads)
    head_dim = int(draft.get("head_dim") or hidden // heads)
    inter = int(draft["intermediate_size"])
    vocab = int(draft["vocab_size"])
    draft_vocab = int(draft.get("draft_vocab_size") or vocab)
    attention = 2 * hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden
    mlp = 3 * hidden * inter
    return vocab * hidden + 3 * target_hidden * hidden + attention + mlp + 4 * hidden + draft_vocab * hidden


def trainable_parameters(draft: dict) -> int:
    """SpecForge freezes the drafter's embeddings (train_eagle3.py draft_model.freeze_embedding)."""
    return drafter_parameters(draft) - int(draft["vocab_size"]) * int(draft["hidden_size"])


def checkpoint_count(samples: int, epochs: int, save_interval: int, data_parallel: int = 1) -> int:
    """SpecForge (train_eagle3.py) saves epoch_<e>_step_<s>/ every save_interval steps and at the
    end of each epoch, and deletes none; one step is one sample per data-parallel rank."""
    steps = -(-samples // data_parallel) * epochs
    return steps // save_interval + epochs


@dataclass(frozen=True)
class DiskBudget:
    samples: int
    max_length: int
    bytes_per_token: int
    hidden_states_bytes: int
    checkpoint_bytes: int
    checkpoints_kept: int
    total_bytes: int

    def lines(self) -> list[str]:
        gib = 1024**3
        return [
            f"hidden states: {self.samples} samples x {self.max_length} tokens (upper bound) x"
            f" {self.bytes_per_token:,} B/token = {self.hidden_states_bytes / gib:,.1f} GiB",
            f"checkpoints: {self.checkpoints_kept} x {self.checkpoint_bytes / gib:,.1f} GiB"
            f" (model.safetensors in bf16 + training_state.pt: Adam state and fp32 copy of the"
            f" trainable weights; SpecForge keeps every checkpoint)",
            f"total with {round((DISK_MARGIN - 1) * 100)}% margin: {self.total_bytes / gib:,.1f} GiB",
        ]


def disk_budget(target: Target, draft: dict, samples: int, max_length: int, checkpoints_kept: int = 2) -> DiskBudget:
    per_token = bytes_per_token(target.hidden_size, target.dtype)
    hidden_states = samples * max_length * per_token
    # model.safetensors: every weight in bf16 (2 B); training_state.pt: Adam's two moments and an
    # fp32 copy of each trainable weight (12 B). An estimate: the real files differ by framing.
    checkpoint = drafter_parameters(draft) * 2 + trainable_parameters(draft) * 12
    total = int((hidden_states + checkpoints_kept * checkpoint) * DISK_MARGIN)
    return DiskBudget(samples, max_length, per_token, hidden_states, checkpoint, checkpoints_kept, total)


def disk_problem(budget: DiskBudget, free_bytes: int, where: str) -> str | None:
    if budget.total_bytes <= free_bytes:
        return None
    gib = 1024**3
    return (
        f"{where} has {free_bytes / gib:,.1f} GiB free but offline training needs"
        f" {budget.total_bytes / gib:,.1f} GiB; expected fewer samples, a shorter max length,"
        f" or a work directory on a larger disk"
    )


# -- speculative decoding on/off or another drafter, for A/B runs -----------------------------------


SPECULATIVE_PREFIX = "--speculative-"


def launcher_argv(launcher_text: str) -> list[str]:
    """The argv of the `exec ...` line of roles/serving's launcher script."""
    for line in reversed(launcher_text.splitlines()):
        if line.startswith("exec "):
            return shlex.split(line[len("exec ") :])
    raise ConfigError("the launcher has no `exec` line")


def speculative_variant(argv: list[str], speculative: bool, draft_model_path: str | None = None) -> list[str]:
    """The same server command without speculative decoding, or with another drafter."""
    out, index = [], 0
    while index < len(argv):
        part = argv[index]
        takes_value = index + 1 < len(argv) and not argv[index + 1].startswith("--")
        if part.startswith(SPECULATIVE_PREFIX):
            if speculative:
                value = argv[index + 1] if takes_value else None
                if part == "--speculative-draft-model-path" and draft_model_path:
                    value = draft_model_path
                out += [part] + ([value] if value is not None else [])
            index += 2 if takes_value else 1
            continue
        out.append(part)
        index += 1
    if speculative and "--speculative-algorithm" not in out:
        raise ConfigError(
            "the deployed command has no --speculative-algorithm: speculative"
            " decoding is not configured (serving_speculative)"
        )
    return out


def accept_length_from_metrics(metrics: dict[str, float]) -> float | None:
    """sglang:spec_accept_length (srt/metrics/collector.py in 0.5.9, srt/observability/
    metrics_collector.py in 0.5.10): a gauge per tp rank; the most recent value, 0 before any
    speculative decode."""
    values = [v for k, v in metrics.items() if k.split("{")[0] == "sglang:spec_accept_length"]
    return max(values) if values else None
