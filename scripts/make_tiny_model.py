#!/usr/bin/env python3
"""Makes a tiny random-weight Llama-style model folder for fast tests.

    python scripts/make_tiny_model.py OUT_DIR [--check] [--no-gqa]

The folder has the same shape as the converted default model (config.json,
generation_config.json, tokenizer.json, tokenizer_config.json,
special_tokens_map.json, onnx/model.onnx) so the runtime's loading, tokenizing,
chat templating and KV-cache code paths can be tested without a download.
Weights come from a fixed seed, so the output is the same on every machine.

onnx/model.onnx uses standard ONNX ops only. onnx/model_gqa.onnx is the same
network with com.microsoft GroupQueryAttention and SimplifiedLayerNormalization.
--check runs both with onnxruntime and verifies that chunked prefill with a KV
cache gives the same logits as one-shot prefill, and that the two graphs agree.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_files  # noqa: E402
import llama_onnx as lo  # noqa: E402

SEED = 1234
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
N_MERGES = 61  # vocab = 3 specials + 256 bytes + 61 merges = 320

# Training text for the handful of merges: enough to give common English and
# JSON fragments their own tokens, so test prompts do not tokenize to bytes only.
CORPUS = """\
<|im_start|>system
You are a helpful assistant. You have access to the following tools.
To call a tool, reply with only one JSON object: {"name": "<tool name>", "arguments": {}}.
<|im_end|>
<|im_start|>user
What is the capital of France? The capital of France is Paris.
Please find the product and add it to the cart, then show the cart.
{"name":"search_products","arguments":{"query":"backpack","max_price":120}}
{"name":"add_to_cart","arguments":{"product_id":"p-1","quantity":1}}
the the the and and to to of of in in is is it it that that with with for for
<|im_end|>
"""

CFG = lo.LlamaConfig(
    n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, head_dim=16, ffn=128,
    vocab=len(SPECIALS) + 256 + N_MERGES, rope_theta=10000.0, rms_eps=1e-5, max_pos=512,
)


def learn_merges(text: str, n_merges: int):
    """Minimal deterministic byte-level BPE training (most frequent pair, ties by text)."""
    for s in SPECIALS:
        text = text.replace(s, " ")
    b2u = hf_files.bytes_to_unicode()
    words = re.findall(r" ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+", text)
    freq = collections.Counter(tuple(b2u[b] for b in w.encode("utf-8")) for w in words)
    merges = []
    for _ in range(n_merges):
        pairs = collections.Counter()
        for w, c in freq.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0][0] + kv[0][1], kv[0]))[0]
        merges.append(best)
        new = collections.Counter()
        for w, c in freq.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new[tuple(out)] += c
        freq = new
    if len(merges) != n_merges:
        raise SystemExit(f"corpus too small: learned {len(merges)} merges, wanted {n_merges}")
    return merges


def make_tokenizer():
    b2u = hf_files.bytes_to_unicode()
    tokens = list(SPECIALS) + [b2u[b] for b in range(256)]
    merges = learn_merges(CORPUS, N_MERGES)
    seen = set(tokens)
    for a, b in merges:
        t = a + b
        if t in seen:
            raise SystemExit(f"duplicate merged token {t!r}")
        seen.add(t)
        tokens.append(t)
    return tokens, [f"{a} {b}" for a, b in merges]


def make_weights(cfg: lo.LlamaConfig) -> lo.ModelWeights:
    rng = np.random.default_rng(SEED)

    def lin(out_f, in_f, gain=1.0):
        return (rng.standard_normal((out_f, in_f)) * gain / np.sqrt(in_f)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    H, D = cfg.hidden, cfg.head_dim
    # Embedding std 0.5 gives logits with a std of about 4 after the final norm:
    # a clear argmax at every step, so greedy outputs are stable across runtimes.
    # The large gain on the residual branches (o_proj, down_proj) lets context
    # outweigh the current token's own embedding; with unit gain the tied head
    # just echoes the last token, which would hide KV-cache and position bugs.
    embed = (0.5 * rng.standard_normal((cfg.vocab, H))).astype(np.float32)
    layers = []
    for _ in range(cfg.n_layers):
        layers.append(lo.LayerWeights(
            attn_norm=norm(H),
            q=lin(cfg.n_heads * D, H, 2.0),
            k=lin(cfg.n_kv_heads * D, H, 2.0),
            v=lin(cfg.n_kv_heads * D, H),
            o=lin(H, cfg.n_heads * D, 8.0),
            ffn_norm=norm(H),
            gate=lin(cfg.ffn, H),
            up=lin(cfg.ffn, H),
            down=lin(H, cfg.ffn, 8.0),
        ))
    return lo.ModelWeights(embed=embed, layers=layers, final_norm=norm(H))


def write_folder(out_dir: str, gqa: bool = True) -> None:
    os.makedirs(os.path.join(out_dir, "onnx"), exist_ok=True)
    tokens, merges = make_tokenizer()
    assert len(tokens) == CFG.vocab, (len(tokens), CFG.vocab)
    hf_files.write_tokenizer_files(
        out_dir, tokens, merges, special_ids=[0, 1, 2], bos_id=1, eos_id=2, pad_id=2, unk_id=0,
        chat_template=hf_files.CHATML_TEMPLATE, max_len=CFG.max_pos,
    )
    hf_files.write_config_files(out_dir, CFG, bos_id=1, eos_id=2, pad_id=2)
    w = make_weights(CFG)
    lo.save_model(lo.build_model(CFG, w, "plain"), os.path.join(out_dir, "onnx", "model.onnx"))
    if gqa:
        lo.save_model(lo.build_model(CFG, w, "gqa"), os.path.join(out_dir, "onnx", "model_gqa.onnx"))


# ---------------------------------------------------------------- checking

def run_chunks(sess, cfg, ids: np.ndarray, chunks: list):
    """Feeds ids [1, n] in the given chunk sizes through the KV cache; returns all logits."""
    past = {f"past_key_values.{i}.{kv}": np.zeros((ids.shape[0], cfg.n_kv_heads, 0, cfg.head_dim), np.float32)
            for i in range(cfg.n_layers) for kv in ("key", "value")}
    out_names = [o.name for o in sess.get_outputs()]
    logits, pos = [], 0
    for n in chunks:
        chunk = ids[:, pos:pos + n]
        feed = {
            "input_ids": chunk,
            "attention_mask": np.ones((ids.shape[0], pos + n), np.int64),
            "position_ids": np.arange(pos, pos + n, dtype=np.int64)[None, :].repeat(ids.shape[0], 0),
            **past,
        }
        res = dict(zip(out_names, sess.run(out_names, feed)))
        logits.append(res["logits"])
        past = {k.replace("present.", "past_key_values."): v for k, v in res.items() if k.startswith("present.")}
        pos += n
    return np.concatenate(logits, axis=1), past


def check(out_dir: str) -> None:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    rng = np.random.default_rng(7)
    ids = rng.integers(3, CFG.vocab, size=(1, 24)).astype(np.int64)
    results = {}
    for fname in ("model.onnx", "model_gqa.onnx"):
        path = os.path.join(out_dir, "onnx", fname)
        if not os.path.exists(path):
            continue
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        full, past_full = run_chunks(sess, CFG, ids, [24])
        for chunks in ([10, 14], [13, 1, 1, 9], [1] * 24):
            got, past_got = run_chunks(sess, CFG, ids, chunks)
            err = float(np.abs(got - full).max())
            kv_err = max(float(np.abs(past_got[k] - past_full[k]).max()) for k in past_full)
            print(f"[check] {fname}: chunks {chunks}: max |logit diff| {err:.2e}, kv {kv_err:.2e}")
            if err > 1e-4 or kv_err > 1e-4:
                raise SystemExit(f"[check] FAILED: {fname} chunked prefill differs from one-shot prefill")
        results[fname] = full
        print(f"[check] {fname}: logit std {full.std():.2f}, greedy next id {int(full[0, -1].argmax())}")
    if len(results) == 2:
        err = float(np.abs(results["model.onnx"] - results["model_gqa.onnx"]).max())
        print(f"[check] plain vs GQA graph: max |logit diff| {err:.2e}")
        if err > 1e-4:
            raise SystemExit("[check] FAILED: plain and GQA graphs disagree")
    try:
        import tokenizers

        tok = tokenizers.Tokenizer.from_file(os.path.join(out_dir, "tokenizer.json"))
        text = hf_files.render_chatml([{"role": "user", "content": "What is the capital of France? 2024 ünï"}])
        enc = tok.encode(text, add_special_tokens=False)
        back = tok.decode(enc.ids, skip_special_tokens=False)
        print(f"[check] tokenizer: {len(text)} chars -> {len(enc.ids)} tokens, starts {enc.ids[:8]}")
        if back != text or enc.ids[0] != 1:
            raise SystemExit("[check] FAILED: tokenizer round trip")
    except ImportError:
        print("[check] tokenizers package not installed; tokenizer round trip skipped")
    print("[check] OK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--check", action="store_true", help="verify the written folder with onnxruntime")
    ap.add_argument("--no-gqa", action="store_true", help="skip onnx/model_gqa.onnx")
    args = ap.parse_args()
    write_folder(args.out_dir, gqa=not args.no_gqa)
    print(f"wrote {args.out_dir}")
    if args.check:
        check(args.out_dir)


if __name__ == "__main__":
    main()
