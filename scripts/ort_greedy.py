#!/usr/bin/env python3
"""Reference greedy decoding with the onnxruntime Python API and a KV cache.

    python scripts/ort_greedy.py MODEL_DIR --prompt-ids 1,2,3 [--max-new 20]
    python scripts/ort_greedy.py MODEL_DIR --text "What is the capital of France?"

Prints the generated token ids as one JSON list on stdout (the eos token is
included when generation stops on it), so the Rust runtime's output can be
compared against an independent loop. The prompt is fed in one go, then one
token at a time with the cache, which is how the runtime decodes too.

--text renders a single user message through the chat template in
tokenizer_config.json (jinja2 if installed, else the built-in ChatML
rendering) and tokenizes it with the `tokenizers` package.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

DEFAULT_FILES = ("onnx/model_q4.onnx", "onnx/model.onnx")


def load_session(path: str, threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = threads
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def render_prompt(model_dir: str, text: str, system: str | None) -> str:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    cfg_path = os.path.join(model_dir, "tokenizer_config.json")
    template = None
    if os.path.exists(cfg_path):
        with open(cfg_path, encoding="utf-8") as f:
            template = json.load(f).get("chat_template")
    if template:
        try:
            import jinja2

            env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
            return env.from_string(template).render(messages=messages, add_generation_prompt=True)
        except ImportError:
            pass
    import hf_files

    return hf_files.render_chatml(messages)


def tokenize(model_dir: str, prompt: str) -> list:
    try:
        import tokenizers
    except ImportError:
        raise SystemExit("--text needs the `tokenizers` Python package; pass --prompt-ids instead")
    tok = tokenizers.Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    return tok.encode(prompt, add_special_tokens=False).ids


class Decoder:
    def __init__(self, sess, cfg: dict):
        self.sess = sess
        self.inputs = {i.name for i in sess.get_inputs()}
        self.outputs = [o.name for o in sess.get_outputs()]
        self.n_layers = cfg["num_hidden_layers"]
        self.kv_heads = cfg.get("num_key_value_heads", cfg["num_attention_heads"])
        self.head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        self.reset()

    def reset(self):
        self.past = {
            f"past_key_values.{i}.{kv}": np.zeros((1, self.kv_heads, 0, self.head_dim), np.float32)
            for i in range(self.n_layers) for kv in ("key", "value")
        }
        self.pos = 0

    def step(self, ids: list) -> np.ndarray:
        """Feeds ids after the cached positions; returns the last position's logits."""
        n = len(ids)
        feed = {
            "input_ids": np.array([ids], np.int64),
            "attention_mask": np.ones((1, self.pos + n), np.int64),
            "position_ids": np.arange(self.pos, self.pos + n, dtype=np.int64)[None],
            **self.past,
        }
        feed = {k: v for k, v in feed.items() if k in self.inputs}
        res = dict(zip(self.outputs, self.sess.run(self.outputs, feed)))
        self.past = {k.replace("present.", "past_key_values."): v for k, v in res.items() if k.startswith("present.")}
        self.pos += n
        return res["logits"][0, -1]


def eos_ids(model_dir: str, cfg: dict) -> set:
    ids = set()
    for path in ("generation_config.json",):
        p = os.path.join(model_dir, path)
        if os.path.exists(p):
            with open(p) as f:
                v = json.load(f).get("eos_token_id")
            ids.update(v if isinstance(v, list) else [v] if v is not None else [])
    v = cfg.get("eos_token_id")
    ids.update(v if isinstance(v, list) else [v] if v is not None else [])
    return ids


def generate(dec: Decoder, prompt_ids: list, max_new: int, eos: set) -> list:
    dec.reset()
    logits = dec.step(prompt_ids)
    out = []
    for i in range(max_new):
        nxt = int(np.argmax(logits))
        out.append(nxt)
        if nxt in eos or i + 1 == max_new:
            break
        logits = dec.step([nxt])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt-ids", help="comma-separated prompt token ids")
    src.add_argument("--text", help="user message, rendered with the chat template")
    ap.add_argument("--system", help="system message for --text (default: the template's own)")
    ap.add_argument("--max-new", type=int, default=20)
    ap.add_argument("--model-file", help=f"graph inside MODEL_DIR (default: first of {', '.join(DEFAULT_FILES)})")
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0: onnxruntime default)")
    ap.add_argument("--decode", action="store_true", help="also print the decoded text on stderr")
    args = ap.parse_args()

    with open(os.path.join(args.model_dir, "config.json")) as f:
        cfg = json.load(f)
    model_file = args.model_file or next(
        (p for p in DEFAULT_FILES if os.path.exists(os.path.join(args.model_dir, p))), DEFAULT_FILES[0])
    if args.prompt_ids is not None:
        prompt_ids = [int(x) for x in args.prompt_ids.replace(" ", "").split(",") if x]
    else:
        prompt_ids = tokenize(args.model_dir, render_prompt(args.model_dir, args.text, args.system))
    if not prompt_ids:
        raise SystemExit("empty prompt")

    dec = Decoder(load_session(os.path.join(args.model_dir, model_file), args.threads), cfg)
    t0 = time.time()
    out = generate(dec, prompt_ids, args.max_new, eos_ids(args.model_dir, cfg))
    dt = time.time() - t0
    print(json.dumps(out))
    if args.decode:
        import tokenizers

        tok = tokenizers.Tokenizer.from_file(os.path.join(args.model_dir, "tokenizer.json"))
        print(f"{model_file}: {len(prompt_ids)} prompt + {len(out)} new tokens in {dt:.2f} s", file=sys.stderr)
        print(tok.decode(out, skip_special_tokens=True), file=sys.stderr)


if __name__ == "__main__":
    main()
