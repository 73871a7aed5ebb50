#!/usr/bin/env python3
"""An independent NumPy implementation of the Llama architecture, the oracle of crescent's forward pass.

Written from the architecture (Hugging Face transformers' LlamaForCausalLM), not from crescent's code: it
reads the model directory itself (config.json and the safetensors header and bytes), runs each prompt as one
dense causal pass in float64 with no KV paging, and writes every position's logits.

    reference_llama.py MODEL_DIR PROMPTS_JSON OUT_BIN [--log-softmax]

PROMPTS_JSON is a list of token-id lists; OUT_BIN gets, prompt after prompt, len(prompt) x vocab_size
little-endian float32 logits, or with --log-softmax their log-softmax over the vocabulary (the logprobs of
the next token at each position, OpenAI's `logprobs`), computed in float64 by reference_logprobs.py. The KV cache's precision is part of the architecture as served: with bfloat16
weights, keys and values are rounded to bfloat16 (after the rotary embedding) before attention reads them.
"""
import json
import struct
import sys

import numpy as np

from reference_logprobs import log_softmax  # beside this file


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_len])
    base = 8 + header_len
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        raw = data[base + begin : base + end]
        if entry["dtype"] == "F32":
            values = np.frombuffer(raw, dtype="<f4")
        elif entry["dtype"] == "BF16":
            values = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise ValueError(f"{path}: {name}: dtype {entry['dtype']}")
        tensors[name] = values.reshape(entry["shape"]).astype(np.float64)
    return tensors


def round_bf16(x):
    """float64 -> float32 -> bfloat16 (round to nearest even) -> float64."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def rms_norm(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rotary(x, positions, theta):
    """x: [tokens, heads, head_dim]; rotate-half convention."""
    head_dim = x.shape[-1]
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.outer(positions, inv_freq)  # [tokens, head_dim / 2]
    cos = np.concatenate([np.cos(angles)] * 2, axis=-1)[:, None, :]
    sin = np.concatenate([np.sin(angles)] * 2, axis=-1)[:, None, :]
    half = head_dim // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def logits(config, w, tokens):
    d = config["hidden_size"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    head_dim = d // heads
    eps = config.get("rms_norm_eps", 1e-6)
    theta = config.get("rope_theta", 10000.0)
    bf16_kv = config.get("torch_dtype") == "bfloat16"
    n = len(tokens)
    positions = np.arange(n, dtype=np.float64)
    x = w["model.embed_tokens.weight"][tokens]
    causal = np.tril(np.ones((n, n), dtype=bool))
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(n, heads, head_dim)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(n, kv_heads, head_dim)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(n, kv_heads, head_dim)
        q = rotary(q, positions, theta)
        k = rotary(k, positions, theta)
        if bf16_kv:
            k, v = round_bf16(k), round_bf16(v)
        out = np.empty((n, heads, head_dim))
        for head in range(heads):
            kv = head // (heads // kv_heads)
            scores = q[:, head, :] @ k[:, kv, :].T / np.sqrt(head_dim)
            scores = np.where(causal, scores, -np.inf)
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            scores /= scores.sum(axis=-1, keepdims=True)
            out[:, head, :] = scores @ v[:, kv, :]
        x = x + out.reshape(n, d) @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        up = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if config.get("tie_word_embeddings") else w["lm_head.weight"]
    return x @ head.T


def main():
    model_dir, prompts_path, out_path = sys.argv[1:4]
    as_log_softmax = "--log-softmax" in sys.argv[4:]
    with open(f"{model_dir}/config.json") as f:
        config = json.load(f)
    weights = read_safetensors(f"{model_dir}/model.safetensors")
    with open(prompts_path) as f:
        prompts = json.load(f)
    with open(out_path, "wb") as out:
        for tokens in prompts:
            rows = logits(config, weights, np.asarray(tokens))
            if as_log_softmax:
                rows = log_softmax(rows)
            out.write(rows.astype("<f4").tobytes())


if __name__ == "__main__":
    main()
