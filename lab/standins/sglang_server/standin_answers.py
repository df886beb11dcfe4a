"""The SGLang stand-in's answers, route by route: the JSON bodies SGLang 0.5.9 sends (its
entrypoints/http_server.py and entrypoints/openai/serving_chat.py, protocol.py), built here so that
server.py keeps only the serving (authorization, health, the scheduler's pacing). A lab stand-in,
beside server.py on the lab's gpu node."""

from __future__ import annotations

import hashlib
import json
import time


def models(args, started: float) -> dict:
    """GET /v1/models: the one served model."""
    return {
        "object": "list",
        "data": [
            {
                "id": args.served_model_name or args.model_path,
                "object": "model",
                "created": int(started),
                "owned_by": "sglang",
                "root": args.model_path,
            }
        ],
    }


def model_info(args) -> dict:
    """GET /model_info (/get_model_info)."""
    return {
        "model_path": args.model_path,
        "tokenizer_path": args.model_path,
        "is_generation": True,
        "served_model_name": args.served_model_name,
    }


def server_info(args, version: str, accept_length: float | None) -> dict:
    """GET /server_info (/get_server_info). Not as 0.5.9 does: its /server_info is
    dataclasses.asdict(server_args), keys included (docs/security.md#keys-and-their-roles says
    what follows); the stand-in leaves the keys out."""
    internal: dict = {"last_gen_throughput": 0.0}
    if accept_length is not None:
        internal["avg_spec_accept_length"] = accept_length
    return {
        **{k: v for k, v in vars(args).items() if k not in ("api_key", "admin_api_key")},
        "internal_states": [internal],
        "version": version,
    }


def generated(body: dict, tokens: list[str]) -> dict:
    """POST /generate's answer."""
    return {
        "text": " ".join(tokens),
        "meta_info": {
            "id": hashlib.md5(json.dumps(body).encode()).hexdigest(),
            "prompt_tokens": len(str(body.get("text", "")).split()),
            "completion_tokens": len(tokens),
            "finish_reason": {"type": "length", "length": len(tokens)},
        },
    }


def chat_completion(body: dict, prompt: str, tokens: list[str], served_model_name: str | None) -> dict:
    """POST /v1/chat/completions without streaming."""
    return {
        "id": "chatcmpl-" + hashlib.md5(prompt.encode()).hexdigest()[:16],
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model") or served_model_name,
        "choices": [
            {
                "index": 0,
                "finish_reason": "length",
                "message": {"role": "assistant", "content": " ".join(tokens)},
            }
        ],
        "usage": {
            "prompt_tokens": len(prompt.split()),
            "completion_tokens": len(tokens),
            "total_tokens": len(prompt.split()) + len(tokens),
        },
    }


def chat_chunk(request_id: str, model: str | None, choices: list, usage: dict | None = None) -> bytes:
    """One server-sent event of a streamed chat (serving_chat.py _generate_chat_stream)."""
    chunk = {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage,
    }
    return f"data: {json.dumps(chunk)}\n\n".encode()


def chat_choice(delta: dict, finish_reason: str | None = None) -> dict:
    return {
        "index": 0,
        "delta": {"role": None, "content": None, "reasoning_content": None, "tool_calls": None, **delta},
        "logprobs": None,
        "finish_reason": finish_reason,
        "matched_stop": None,
    }


def stream_usage(prompt_tokens: int, completion_tokens: int) -> dict:
    """The last event's usage, with stream_options.include_usage."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
    }
