"""Writes the Hugging Face side files of a model folder: tokenizer.json (byte-level
BPE), tokenizer_config.json, special_tokens_map.json, config.json and
generation_config.json. Shared by make_tiny_model.py and convert_gguf.py."""

from __future__ import annotations

import json
import os

# SmolLM2's ChatML template (as stored in its GGUF metadata): inserts a default
# system message when the conversation does not start with one.
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def bytes_to_unicode() -> dict:
    """GPT-2's reversible byte -> printable unicode character map (ByteLevel)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def render_chatml(messages: list, add_generation_prompt: bool = True) -> str:
    """Plain-Python rendering of CHATML_TEMPLATE (used when jinja2 is missing)."""
    out = []
    for i, m in enumerate(messages):
        if i == 0 and messages[0]["role"] != "system":
            out.append(f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n")
        out.append(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
    return "".join(out)


def _write_json(path: str, obj) -> None:
    tmp = path + ".partial"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def tokenizer_json(tokens: list, merges: list, special_ids: list) -> dict:
    """Byte-level BPE in the `tokenizers` JSON format.

    Digits(individual_digits) before ByteLevel matches llama.cpp's "smollm"
    pre-tokenizer, so ids agree with the GGUF's own tokenization. Merges are
    written as "a b" strings, which every `tokenizers` release can read.
    """
    added = [
        {"id": i, "content": tokens[i], "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i in special_ids
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Digits", "individual_digits": True},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            ],
        },
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "vocab": {t: i for i, t in enumerate(tokens)},
            "merges": list(merges),
        },
    }


def write_tokenizer_files(out_dir: str, tokens: list, merges: list, special_ids: list, *,
                          bos_id: int, eos_id: int, pad_id: int, unk_id: int,
                          chat_template: str, max_len: int) -> None:
    _write_json(os.path.join(out_dir, "tokenizer.json"), tokenizer_json(tokens, merges, special_ids))
    extra = [tokens[i] for i in special_ids]
    _write_json(os.path.join(out_dir, "tokenizer_config.json"), {
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(i): {"content": tokens[i], "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": True}
            for i in special_ids
        },
        "additional_special_tokens": [t for t in extra if t not in (tokens[bos_id], tokens[eos_id], tokens[unk_id])],
        "bos_token": tokens[bos_id],
        "chat_template": chat_template,
        "clean_up_tokenization_spaces": False,
        "eos_token": tokens[eos_id],
        "model_max_length": max_len,
        "pad_token": tokens[pad_id],
        "tokenizer_class": "GPT2Tokenizer",
        "unk_token": tokens[unk_id],
        "vocab_size": len(tokens),
    })
    _write_json(os.path.join(out_dir, "special_tokens_map.json"), {
        "additional_special_tokens": [t for t in extra if t not in (tokens[bos_id], tokens[eos_id], tokens[unk_id])],
        "bos_token": tokens[bos_id],
        "eos_token": tokens[eos_id],
        "pad_token": tokens[pad_id],
        "unk_token": tokens[unk_id],
    })


def write_config_files(out_dir: str, cfg, *, bos_id: int, eos_id: int, pad_id: int) -> None:
    """config.json / generation_config.json in the transformers LlamaForCausalLM shape."""
    _write_json(os.path.join(out_dir, "config.json"), {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "hidden_size": cfg.hidden,
        "intermediate_size": cfg.ffn,
        "max_position_embeddings": cfg.max_pos,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": cfg.n_heads,
        "num_hidden_layers": cfg.n_layers,
        "num_key_value_heads": cfg.n_kv_heads,
        "rms_norm_eps": cfg.rms_eps,
        "rope_scaling": None,
        "rope_theta": cfg.rope_theta,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "use_cache": True,
        "vocab_size": cfg.vocab,
    })
    _write_json(os.path.join(out_dir, "generation_config.json"), {
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "do_sample": False,
    })
