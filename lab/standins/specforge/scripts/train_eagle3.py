"""STAND-IN for SpecForge scripts/train_eagle3.py (lab only; see ../README.md)."""

import argparse
import glob
import json
import os
import struct


def main():
    parser = argparse.ArgumentParser()
    for flag in (
        "--target-model-path",
        "--draft-model-config",
        "--train-data-path",
        "--train-hidden-states-path",
        "--output-dir",
        "--chat-template",
        "--sglang-attention-backend",
        "--learning-rate",
    ):
        parser.add_argument(flag)
    for flag in ("--max-length", "--num-epochs", "--batch-size", "--tp-size", "--save-interval"):
        parser.add_argument(flag, type=int)
    for flag in ("--trust-remote-code", "--resume"):
        parser.add_argument(flag, action="store_true")
    args = parser.parse_args()
    samples = len(glob.glob(os.path.join(args.train_hidden_states_path, "rows_*", "data_*.ckpt")))
    draft = json.load(open(args.draft_model_config))
    done = [d for d in glob.glob(os.path.join(args.output_dir, "epoch_*_step_*"))] if args.resume else []
    start = max((int(os.path.basename(d).split("_")[3]) for d in done), default=0)
    print(f"training on {samples} samples from step {start}", flush=True)
    step = start
    for epoch in range(args.num_epochs):
        step += samples
        folder = os.path.join(args.output_dir, f"epoch_{epoch}_step_{step}")
        os.makedirs(folder, exist_ok=True)
        json.dump(draft, open(os.path.join(folder, "config.json"), "w"), indent=2)
        header = json.dumps({"__metadata__": {"format": "pt"}}).encode()
        with open(os.path.join(folder, "model.safetensors"), "wb") as out:
            out.write(struct.pack("<Q", len(header)) + header)
        print(f"Saved model configuration to {folder}", flush=True)


if __name__ == "__main__":
    main()
