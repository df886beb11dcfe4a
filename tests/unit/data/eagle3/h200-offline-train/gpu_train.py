# ruff: noqa  -- the program sent to the H200 as it ran (imports ordered around its module shims)
"""The training job's step 3 on a real NVIDIA GPU, on a tiny drafter with synthetic hidden states:
SpecForge 82951a9's own drafter (specforge/modeling/draft/llama3_eagle.py LlamaForCausalLMEagle3)
and its offline TTT trainer (specforge/core/eagle3.py OnlineEagle3Model, fed hidden states and
target logits as train_eagle3.py's offline path does), bf16, AdamW; plus the disk formula checked
on real torch.save files shaped as prepare_hidden_states.py writes them.

specforge/__init__.py and its core/modeling package inits import the SGLang target backend (not
needed offline, not installed here): the submodules are loaded under bare package entries.
yunchang (sequence parallelism) is stubbed only when absent: the run uses SP = 1."""

import io
import json
import math
import os
import sys
import time
import types
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
SF = HERE / "sf"
OUT = Path(os.environ.get("OUT", HERE / "out"))
OUT.mkdir(parents=True, exist_ok=True)
sys.path.insert(0, str(SF))
sys.path.insert(0, str(HERE))
for name in ("specforge", "specforge.core", "specforge.modeling", "specforge.modeling.draft"):
    module = types.ModuleType(name)
    module.__path__ = [str(SF / name.replace(".", "/"))]
    sys.modules[name] = module
try:
    import yunchang  # noqa: F401
    STUBBED = []
except ImportError:
    yc, glob_, comm = (types.ModuleType(n) for n in ("yunchang", "yunchang.globals", "yunchang.comm"))

    class _PG:
        ULYSSES_PG = None
        RING_PG = None

    glob_.PROCESS_GROUP = _PG
    glob_.set_seq_parallel_pg = lambda *a, **k: None
    comm.SeqAllToAll4D = object
    yc.globals, yc.comm = glob_, comm
    sys.modules.update({"yunchang": yc, "yunchang.globals": glob_, "yunchang.comm": comm})
    STUBBED = ["yunchang"]

import transformers  # noqa: E402
from transformers import LlamaConfig  # noqa: E402

from specforge.modeling.draft.base import Eagle3DraftModel  # noqa: E402

sys.modules["specforge.modeling.draft"].Eagle3DraftModel = Eagle3DraftModel  # what its __init__ exports
from specforge.core.eagle3 import OnlineEagle3Model  # noqa: E402
from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
report = {"device": torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu", "torch": torch.__version__,
          "transformers": transformers.__version__, "stubbed": STUBBED}
if DEVICE == "cpu":  # rehearsal only: SpecForge's loss is a Triton kernel
    import specforge.core.loss as sf_loss

    def _ref_apply(logits, target_p, position_mask, *a, **k):
        logp = torch.log_softmax(logits.float(), -1)
        return -(target_p * logp * position_mask).sum(-1).mean()

    sf_loss.LogSoftmaxLoss.apply = staticmethod(_ref_apply)
    report["loss"] = "torch reference (CPU rehearsal)"
else:
    report["loss"] = "SpecForge's Triton LogSoftmaxLoss"

torch.manual_seed(0)
H, V, DV, LAYERS_TARGET = 256, 2048, 512, 8
config = LlamaConfig(hidden_size=H, intermediate_size=4 * H, num_attention_heads=4, num_key_value_heads=4,
                     num_hidden_layers=1, vocab_size=V, max_position_embeddings=4096, rms_norm_eps=1e-5,
                     pad_token_id=0, tie_word_embeddings=False, torch_dtype="bfloat16")
config.draft_vocab_size = DV
config.target_hidden_size = H
config.eagle_config = {"eagle_aux_hidden_state_layer_ids": [1, LAYERS_TARGET // 2 - 1, LAYERS_TARGET - 4],
                       "use_aux_hidden_state": True}
draft = LlamaForCausalLMEagle3(config, attention_backend="sdpa").to(DEVICE)
with torch.no_grad():  # draft vocab = the first DV target tokens (train_eagle3.py's vocab mapping)
    draft.t2d.zero_()
    draft.t2d[:DV] = True
    draft.d2t.zero_()
draft.freeze_embedding()
draft = draft.to(torch.bfloat16)
model = OnlineEagle3Model(draft_model=draft, length=7, attention_backend="sdpa")
params = [p for p in model.parameters() if p.requires_grad]
optimizer = torch.optim.AdamW(params, lr=3e-3)
report["trainable_parameters"] = sum(p.numel() for p in params)
report["parameters"] = sum(p.numel() for p in draft.parameters())

B, S, STEPS = 4, 256, int(os.environ.get("STEPS", "300"))
generator = torch.Generator(device="cpu").manual_seed(1)
mix = torch.randn(3 * H, H, generator=generator) / math.sqrt(3 * H)


def batch():
    """Synthetic offline data: aux hidden states (3 x H) and target logits whose next token is a
    fixed function of the current one and of the hidden states, so there is something to learn."""
    ids = torch.randint(1, DV, (B, S), generator=generator)
    hidden = torch.randn(B, S, 3 * H, generator=generator)
    nxt = (ids * 7 + 3 + (hidden @ mix)[..., 0].gt(0).long()) % DV
    target = torch.full((B, S, V), -4.0)
    target.scatter_(-1, nxt.unsqueeze(-1), 8.0)
    loss_mask = torch.ones(B, S, 1)
    return [t.to(DEVICE) for t in (ids, torch.ones(B, S, dtype=torch.long), target, loss_mask,
                                   hidden.to(torch.bfloat16))]


history = []
if DEVICE == "cuda":
    torch.cuda.reset_peak_memory_stats()
start = time.time()
for step in range(STEPS):
    ids, attention, target, loss_mask, hidden = batch()
    plosses, _, acces, *_ = model(input_ids=ids, attention_mask=attention, target=target,
                                  loss_mask=loss_mask, hidden_states=hidden)
    weights = [0.8 ** i for i in range(len(plosses))]
    loss = sum(w * p for w, p in zip(weights, plosses))
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 0.5)
    optimizer.step()
    if step % 25 == 0 or step == STEPS - 1:
        row = {"step": step, "loss": round(float(loss), 4), "acc0": round(float(acces[0]), 4),
               "acc_last": round(float(acces[-1]), 4), "seconds": round(time.time() - start, 2)}
        history.append(row)
        print(json.dumps(row), flush=True)
if DEVICE == "cuda":
    torch.cuda.synchronize()
elapsed = time.time() - start
report.update(steps=STEPS, batch=B, seq=S, seconds=round(elapsed, 2),
              tokens_per_s=round(STEPS * B * S / elapsed), first=history[0], last=history[-1])
if DEVICE == "cuda":
    report["peak_gib"] = round(torch.cuda.max_memory_allocated() / 1024 ** 3, 3)

# Export as the job does (config.json + model.safetensors), then the project's drafter check.
ckpt = OUT / f"epoch_0_step_{STEPS}"
draft.save_pretrained(str(ckpt))
import eagle3  # noqa: E402  (roles/shared/eagle3.py, copied beside this file)

saved = json.loads((ckpt / "config.json").read_text())
target_cfg = {"architectures": ["KimiK25ForConditionalGeneration"],
              "text_config": {"hidden_size": H, "num_hidden_layers": LAYERS_TARGET, "vocab_size": V}}
report["export_files"] = sorted(p.name for p in ckpt.iterdir())
report["export_check"] = eagle3.drafter_problems(eagle3.Drafter.from_config(saved), eagle3.Target.from_config(target_cfg))


# The disk formula on real files: prepare_hidden_states.py's DataPoint, torch.save'd.
@dataclass
class DataPoint:
    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    hidden_state: torch.Tensor
    aux_hidden_state: torch.Tensor


sizes = {}
for tokens in (512, 2048):
    point = DataPoint(torch.zeros(1, tokens, dtype=torch.long), torch.zeros(1, tokens, dtype=torch.long),
                      torch.zeros(1, tokens, 7168, dtype=torch.bfloat16),
                      torch.zeros(1, tokens, 3 * 7168, dtype=torch.bfloat16))
    buffer = io.BytesIO()
    torch.save(asdict(point), buffer)
    sizes[tokens] = buffer.tell()
report["disk_bytes_per_token_measured"] = round((sizes[2048] - sizes[512]) / (2048 - 512), 1)
report["disk_file_bytes"] = sizes
report["disk_bytes_per_token_formula"] = eagle3.bytes_per_token(7168)
(OUT / "report.json").write_text(json.dumps(report, indent=2) + "\n")
print(json.dumps(report, indent=2))
