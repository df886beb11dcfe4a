"""STAND-IN for SpecForge scripts/regenerate_train_data.py (lab only; see ../README.md)."""

import argparse
import json
import os

from openai import OpenAI


def call_sglang(args, server_address, data, max_tokens=None):
    client = OpenAI(base_url=f"http://{server_address}/v1", api_key=os.environ.get("OPENAI_API_KEY", "None"))
    regenerated = []
    for message in data["conversations"]:
        if message["role"] == "assistant":
            continue
        regenerated.append(message)
        if message["role"] == "user":
            try:
                resp = client.chat.completions.create(
                    model=args.model, messages=regenerated, max_tokens=max_tokens, temperature=args.temperature
                )
            except Exception as error:  # as the real script: recorded, not raised
                data["status"], data["error"] = "error", str(error)
                return data
            regenerated.append({"role": "assistant", "content": resp.choices[0].message.content})
    data["conversations"], data["status"] = regenerated, "success"
    return data


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--server-address", nargs="+", required=True)
    parser.add_argument("--input-file-path", required=True)
    parser.add_argument("--output-file-path", required=True)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--num-samples", type=int, default=None)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    done = 0
    if args.resume and os.path.exists(args.output_file_path):
        with open(args.output_file_path) as existing:
            done = sum(1 for _ in existing)
    print(f"  Resume mode: {args.resume}, skipping {done} lines", flush=True)
    with open(args.input_file_path) as source, open(args.output_file_path, "a" if done else "w") as out:
        for index, line in enumerate(source):
            if args.num_samples is not None and index >= args.num_samples:
                break
            if index < done:
                continue
            out.write(json.dumps(call_sglang(args, args.server_address[0], json.loads(line), args.max_tokens)) + "\n")
            out.flush()
    print(f"regenerated into {args.output_file_path}", flush=True)


if __name__ == "__main__":
    main()
