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

# The system turn Qwen2.5's template inserts when a conversation has none.
QWEN2_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

# Qwen2's pre-tokenizer split (llama.cpp's "qwen2" pre-tokenizer, and the
# Split regex of Qwen2's own tokenizer.json): case-insensitive contractions,
# letters with at most one leading non-letter, digits one at a time,
# punctuation runs with their trailing newlines, newline runs, spaces.
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# The pre-tokenizers these files can write, by llama.cpp's name for them
# (GGUF tokenizer.ggml.pre).
PRE_TOKENIZERS = ("smollm", "qwen2")

# Qwen2.5's chat template, as its GGUF stores it (tokenizer.chat_template): a
# `tools` branch that lists the tools in the system turn and asks for
# <tool_call>{"name": ..., "arguments": ...}</tool_call> replies, tool results
# as <tool_response> in a user turn. The tiny Qwen2 test model carries it, so
# fast tests render prompts exactly as the real model's folder does.
QWEN2_TEMPLATE = (
    '{%- if tools %}\n'
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    '    {%- else %}\n'
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    '    {%- endif %}\n'
    '    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}\n'
    '    {%- for tool in tools %}\n'
    '        {{- "\\n" }}\n'
    '        {{- tool | tojson }}\n'
    '    {%- endfor %}\n'
    '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}\n'
    '{%- else %}\n'
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    '    {%- else %}\n'
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}\n"
    '    {%- endif %}\n'
    '{%- endif %}\n'
    '{%- for message in messages %}\n'
    '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    '    {%- elif message.role == "assistant" %}\n'
    "        {{- '<|im_start|>' + message.role }}\n"
    '        {%- if message.content %}\n'
    "            {{- '\\n' + message.content }}\n"
    '        {%- endif %}\n'
    '        {%- for tool_call in message.tool_calls %}\n'
    '            {%- if tool_call.function is defined %}\n'
    '                {%- set tool_call = tool_call.function %}\n'
    '            {%- endif %}\n'
    '            {{- \'\\n<tool_call>\\n{"name": "\' }}\n'
    '            {{- tool_call.name }}\n'
    '            {{- \'", "arguments": \' }}\n'
    '            {{- tool_call.arguments | tojson }}\n'
    "            {{- '}\\n</tool_call>' }}\n"
    '        {%- endfor %}\n'
    "        {{- '<|im_end|>\\n' }}\n"
    '    {%- elif message.role == "tool" %}\n'
    '        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}\n'
    "            {{- '<|im_start|>user' }}\n"
    '        {%- endif %}\n'
    "        {{- '\\n<tool_response>\\n' }}\n"
    '        {{- message.content }}\n'
    "        {{- '\\n</tool_response>' }}\n"
    '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n'
    "            {{- '<|im_end|>\\n' }}\n"
    '        {%- endif %}\n'
    '    {%- endif %}\n'
    '{%- endfor %}\n'
    '{%- if add_generation_prompt %}\n'
    "    {{- '<|im_start|>assistant\\n' }}\n"
    '{%- endif %}\n'
)


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


def tokenizer_json(tokens: list, merges: list, special_ids: list, pre: str = "smollm") -> dict:
    """Byte-level BPE in the `tokenizers` JSON format.

    pre "smollm": Digits(individual_digits) before ByteLevel matches
    llama.cpp's "smollm" pre-tokenizer, so ids agree with the GGUF's own
    tokenization. pre "qwen2": NFC, then Qwen2's Split regex (QWEN2_SPLIT),
    then ByteLevel without its own regex, as in Qwen2's tokenizer.json.
    Merges are written as "a b" strings, which every `tokenizers` release can
    read. A None in `tokens` is an id with no text (GGUF "unused" padding
    rows of the embedding): it is left out of the vocabulary, as Hugging
    Face's tokenizer leaves it out.

    Every added token is written special, including ones a GGUF calls
    user-defined (Qwen2's <tool_call>): the runtime reads special tokens only
    where the chat template wrote them, and a tool result holding
    "<tool_call>" must not become the model's own call token.
    """
    if pre not in PRE_TOKENIZERS:
        raise ValueError(f"unknown pre-tokenizer {pre!r} (known: {', '.join(PRE_TOKENIZERS)})")
    added = [
        {"id": i, "content": tokens[i], "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i in special_ids
    ]
    if pre == "qwen2":
        normalizer = {"type": "NFC"}
        pre_tokenizer = {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            ],
        }
        post_processor = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
        decoder = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    else:
        normalizer = None
        pre_tokenizer = {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Digits", "individual_digits": True},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            ],
        }
        post_processor = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
        decoder = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": decoder,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "vocab": {t: i for i, t in enumerate(tokens) if t is not None},
            "merges": list(merges),
        },
    }


def write_tokenizer_files(out_dir: str, tokens: list, merges: list, special_ids: list, *,
                          bos_id: int, eos_id: int, pad_id: int, unk_id: int,
                          chat_template: str, max_len: int, pre: str = "smollm") -> None:
    _write_json(os.path.join(out_dir, "tokenizer.json"), tokenizer_json(tokens, merges, special_ids, pre))
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
        "tokenizer_class": "Qwen2Tokenizer" if pre == "qwen2" else "GPT2Tokenizer",
        "unk_token": tokens[unk_id],
        "vocab_size": sum(t is not None for t in tokens),
    })
    _write_json(os.path.join(out_dir, "special_tokens_map.json"), {
        "additional_special_tokens": [t for t in extra if t not in (tokens[bos_id], tokens[eos_id], tokens[unk_id])],
        "bos_token": tokens[bos_id],
        "eos_token": tokens[eos_id],
        "pad_token": tokens[pad_id],
        "unk_token": tokens[unk_id],
    })


def write_config_files(out_dir: str, cfg, *, bos_id: int, eos_id: int, pad_id: int,
                       generation_eos: list | None = None) -> None:
    """config.json / generation_config.json in the transformers LlamaForCausalLM
    or Qwen2ForCausalLM shape (cfg.arch). generation_eos: every id that ends a
    generation (generation_config.json), when more than eos_id."""
    eos_list = generation_eos or [eos_id]
    gen_eos = eos_list if len(eos_list) > 1 else eos_list[0]
    if getattr(cfg, "arch", "llama") == "qwen2":
        _write_json(os.path.join(out_dir, "config.json"), {
            "architectures": ["Qwen2ForCausalLM"],
            "attention_dropout": 0.0,
            "bos_token_id": bos_id,
            "eos_token_id": eos_id,
            "pad_token_id": pad_id,
            "head_dim": cfg.head_dim,
            "hidden_act": "silu",
            "hidden_size": cfg.hidden,
            "intermediate_size": cfg.ffn,
            "max_position_embeddings": cfg.max_pos,
            "max_window_layers": cfg.n_layers,
            "model_type": "qwen2",
            "num_attention_heads": cfg.n_heads,
            "num_hidden_layers": cfg.n_layers,
            "num_key_value_heads": cfg.n_kv_heads,
            "rms_norm_eps": cfg.rms_eps,
            "rope_scaling": None,
            "rope_theta": cfg.rope_theta,
            "sliding_window": cfg.max_pos,
            "tie_word_embeddings": cfg.tied,
            "torch_dtype": "float32",
            "use_cache": True,
            "use_sliding_window": False,
            "vocab_size": cfg.vocab,
        })
        _write_json(os.path.join(out_dir, "generation_config.json"), {
            "bos_token_id": bos_id,
            "eos_token_id": gen_eos,
            "pad_token_id": pad_id,
            "do_sample": False,
        })
        return
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
        "eos_token_id": gen_eos,
        "pad_token_id": pad_id,
        "do_sample": False,
    })
