"""STAND-IN for SpecForge scripts/prepare_hidden_states.py (lab only; see ../README.md)."""

import argparse
import json
import os


def main():
    parser = argparse.ArgumentParser()
    for flag in (
        "--target-model-path",
        "--aux-hidden-states-layers",
        "--data-path",
        "--chat-template",
        "--output-path",
        "--sglang-attention-backend",
    ):
        parser.add_argument(flag)
    for flag in ("--max-length", "--tp-size", "--batch-size", "--num-samples"):
        parser.add_argument(flag, type=int)
    for flag in ("--trust-remote-code", "--enable-aux-hidden-states"):
        parser.add_argument(flag, action="store_true")
    args = parser.parse_args()
    config = json.load(open(os.path.join(args.target_model_path, "config.json")))
    text = config.get("text_config") or config
    layers = [int(i) for i in args.aux_hidden_states_layers.split(",")]
    assert len(layers) == 3, "aux_hidden_states_layers is expected to be 3 layers for EAGLE3"
    # SGLang's set_eagle3_layers_to_capture: capture point = id + 1, inside the model.
    assert all(0 <= i and i + 1 < text["num_hidden_layers"] for i in layers), layers
    per_token = 4 * text["hidden_size"] * 2 + 16
    written = skipped = 0
    with open(args.data_path) as source:
        for index, line in enumerate(source):
            if args.num_samples is not None and index >= args.num_samples:
                break
            row = json.loads(line)
            words = sum(len(str(m.get("content", "")).split()) for m in row["conversations"])
            folder = os.path.join(args.output_path, f"rows_{index // 5000 * 5000}-{index // 5000 * 5000 + 5000}")
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, f"data_{index}.ckpt")
            if os.path.exists(path):  # the real script skips finished files
                skipped += 1
                continue
            with open(path, "wb") as out:
                out.truncate(min(words, args.max_length) * per_token)
            written += 1
    print(f"hidden states: {written} files written, {skipped} skipped (capture ids {layers}, {per_token} B/token)")


if __name__ == "__main__":
    main()
