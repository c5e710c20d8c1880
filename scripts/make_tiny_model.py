#!/usr/bin/env python3
"""Makes a tiny random-weight Llama-style (or Qwen2) model folder for fast tests.

    python scripts/make_tiny_model.py OUT_DIR [--check] [--no-gqa]
    python scripts/make_tiny_model.py OUT_DIR --arch qwen2 [--check]

The folder has the same shape as the converted default model (config.json,
generation_config.json, tokenizer.json, tokenizer_config.json,
special_tokens_map.json, onnx/model.onnx) so the runtime's loading, tokenizing,
chat templating and KV-cache code paths can be tested without a download.
Weights come from a fixed seed, so the output is the same on every machine.

onnx/model.onnx uses standard ONNX ops only. onnx/model_gqa.onnx is the same
network with com.microsoft GroupQueryAttention and SimplifiedLayerNormalization.
--check runs both with onnxruntime and verifies that chunked prefill with a KV
cache gives the same logits as one-shot prefill, and that the two graphs agree.

--arch qwen2 goes through the converter instead: it writes a tiny Qwen2 GGUF
(model.gguf: q/k/v bias, untied LM head, Qwen2's pre-tokenizer name and chat
template, the tensor types of a Q4_K_M file: Q5_0, Q8_0, Q4_K, Q6_K, F32) and
runs scripts/convert_gguf.py on it, so the folder holds exactly what the
converter makes of such a file:
  onnx/model_q4.onnx     converter, q4 variant (4-bit requantized, 8-bit head)
  onnx/model.onnx        converter, fp32 variant (GroupQueryAttention)
  onnx/model_plain.onnx  float32 standard-ops reference of the same GGUF,
                         every position's logits
  onnx/model_q4_ref.onnx float32 standard-ops graph of model_q4's weights as
                         it computes them (4-bit and 8-bit blocks dequantized):
                         the reference for model_q4's arithmetic, which only
                         its int8 activations separate from it
--check then compares the converted graphs with the references, chunked and
one-shot (see check_qwen2). The 4-bit graph is not compared with model_plain
by a tolerance: random weights with the residual gains of make_weights make
the tiny network chaotic, so 4-bit rounding moves its logits by several
units (top-1 agreement about 70%); the real model's quality is measured by
convert_gguf.py --check instead.
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


def learn_merges(text: str, n_merges: int, specials=SPECIALS):
    """Minimal deterministic byte-level BPE training (most frequent pair, ties by text)."""
    for s in specials:
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


def make_tokenizer(specials=SPECIALS, n_merges=N_MERGES):
    b2u = hf_files.bytes_to_unicode()
    tokens = list(specials) + [b2u[b] for b in range(256)]
    merges = learn_merges(CORPUS, n_merges, specials)
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
    # Every position's logits ([batch, sequence, vocab]), as exports from other
    # tools have them: the runtime's tests keep covering that output shape,
    # while the converter's graphs (and tiny-random-qwen2's) give the last row.
    lo.save_model(lo.build_model(CFG, w, "plain", last_logits=False), os.path.join(out_dir, "onnx", "model.onnx"))
    if gqa:
        lo.save_model(lo.build_model(CFG, w, "gqa", last_logits=False),
                      os.path.join(out_dir, "onnx", "model_gqa.onnx"))


# ---------------------------------------------------------------- tiny Qwen2

# Qwen2 keeps its added tokens after the BPE vocabulary; the last rows of its
# embedding are unused padding (GGUF token type 5).
QWEN2_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
QWEN2_UNUSED = 3
QWEN2_MERGES = 56  # 256 bytes + 56 merges + 5 added + 3 unused = 320

QWEN2_CFG = lo.LlamaConfig(
    n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, head_dim=16, ffn=256,
    vocab=256 + QWEN2_MERGES + len(QWEN2_SPECIALS) + QWEN2_UNUSED, rope_theta=1000000.0, rms_eps=1e-6,
    max_pos=512, arch="qwen2", tied=False, qkv_bias=True,
)


def _random_kquant(rng, qtype, n: int, k: int, d: float) -> np.ndarray:
    """Random but well-formed k-quant rows [n, k/256 * block bytes]: random codes
    and sub-block scales under a fixed super-block scale d (f16), so the
    dequantized weights have a chosen size (std about 256*d for Q4_K, 680*d
    for Q6_K)."""
    from gguf import GGMLQuantizationType as T

    nb = k // 256
    if qtype == T.Q4_K:
        blocks = rng.integers(0, 256, size=(n, nb, 144), dtype=np.uint8)
        blocks[..., 0:2] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
        # dmin ~ 7.5 d centres the codes (0..15) around zero.
        blocks[..., 2:4] = np.frombuffer(np.float16(7.5 * d).tobytes(), np.uint8)
    elif qtype == T.Q6_K:
        blocks = rng.integers(0, 256, size=(n, nb, 210), dtype=np.uint8)
        blocks[..., 192:208] = rng.integers(1, 64, size=(n, nb, 16)).astype(np.int8).view(np.uint8)
        blocks[..., 208:210] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
    else:
        raise ValueError(qtype)
    return blocks.reshape(n, -1)


def write_qwen2_gguf(path: str) -> None:
    """A tiny Qwen2 GGUF with random weights in a Q4_K_M file's tensor types."""
    import gguf
    from gguf import GGMLQuantizationType as T

    cfg = QWEN2_CFG
    rng = np.random.default_rng(SEED + 1)
    bpe, merges = make_tokenizer(specials=[], n_merges=QWEN2_MERGES)
    tokens = bpe + QWEN2_SPECIALS + [f"[PAD{len(bpe) + len(QWEN2_SPECIALS) + i}]" for i in range(QWEN2_UNUSED)]
    types = [1] * len(bpe) + [3, 3, 3, 4, 4] + [5] * QWEN2_UNUSED
    assert len(tokens) == cfg.vocab, (len(tokens), cfg.vocab)

    w = gguf.GGUFWriter(path, "qwen2")
    w.add_name("tiny-random-qwen2")
    w.add_block_count(cfg.n_layers)
    w.add_context_length(cfg.max_pos)
    w.add_embedding_length(cfg.hidden)
    w.add_feed_forward_length(cfg.ffn)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.n_kv_heads)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_eps)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(hf_files.QWEN2_TEMPLATE)

    def lin(out_f, in_f, gain=1.0):
        return (rng.standard_normal((out_f, in_f)) * gain / np.sqrt(in_f)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    def put(name, arr, qtype=T.F32):
        if qtype == T.F32:
            w.add_tensor(name, arr.astype(np.float32))
        else:
            w.add_tensor(name, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)

    H, D = cfg.hidden, cfg.head_dim
    # Sizes as in the tiny Llama (see make_weights): clear argmax, context that matters.
    put("token_embd.weight", (0.5 * rng.standard_normal((cfg.vocab, H))).astype(np.float32), T.Q5_0)
    put("output.weight", (0.5 * rng.standard_normal((cfg.vocab, H))).astype(np.float32), T.Q8_0)
    put("output_norm.weight", norm(H))
    for i in range(cfg.n_layers):
        b = f"blk.{i}."
        qkv_type = T.Q5_0 if i == 0 else T.Q8_0
        put(b + "attn_norm.weight", norm(H))
        put(b + "attn_q.weight", lin(cfg.n_heads * D, H, 2.0), qkv_type)
        put(b + "attn_k.weight", lin(cfg.n_kv_heads * D, H, 2.0), qkv_type)
        put(b + "attn_v.weight", lin(cfg.n_kv_heads * D, H), qkv_type)
        put(b + "attn_q.bias", (0.3 * rng.standard_normal(cfg.n_heads * D)).astype(np.float32))
        put(b + "attn_k.bias", (0.3 * rng.standard_normal(cfg.n_kv_heads * D)).astype(np.float32))
        put(b + "attn_v.bias", (0.3 * rng.standard_normal(cfg.n_kv_heads * D)).astype(np.float32))
        put(b + "attn_output.weight", lin(H, cfg.n_heads * D, 8.0), T.Q5_0)
        put(b + "ffn_norm.weight", norm(H))
        put(b + "ffn_gate.weight", lin(cfg.ffn, H), T.Q5_0)
        put(b + "ffn_up.weight", lin(cfg.ffn, H), T.Q5_0)
        # ffn_down's rows are 256 long, so it can take the k-quants of a Q4_K_M file.
        target = 8.0 / np.sqrt(cfg.ffn)
        if i == 0:
            raw = _random_kquant(rng, T.Q4_K, H, cfg.ffn, target / 256)
            w.add_tensor(b + "ffn_down.weight", raw, raw_dtype=T.Q4_K)
        else:
            raw = _random_kquant(rng, T.Q6_K, H, cfg.ffn, target / 680)
            w.add_tensor(b + "ffn_down.weight", raw, raw_dtype=T.Q6_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_qwen2_folder(out_dir: str) -> None:
    import gguf

    import convert_gguf

    os.makedirs(os.path.join(out_dir, "onnx"), exist_ok=True)
    gguf_path = os.path.join(out_dir, "model.gguf")
    write_qwen2_gguf(gguf_path)
    keep = {}
    convert_gguf.convert(gguf_path, out_dir, "q4", keep)
    convert_gguf.convert(gguf_path, out_dir, "fp32")
    reader = gguf.GGUFReader(gguf_path)
    cfg = convert_gguf.read_config(reader)
    ref = lo.build_model(cfg, convert_gguf.load_weights(reader, cfg, "fp32"), "plain", last_logits=False)
    lo.save_model(ref, os.path.join(out_dir, "onnx", "model_plain.onnx"))
    q4_ref = lo.build_model(cfg, lo.dequantized(keep["weights"]), "plain", last_logits=False)
    lo.save_model(q4_ref, os.path.join(out_dir, "onnx", "model_q4_ref.onnx"))


def check_qwen2(out_dir: str) -> None:
    """The converted graphs against the float32 reference, fed whole and in chunks."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    cfg = QWEN2_CFG
    rng = np.random.default_rng(7)
    ids = rng.integers(0, 256 + QWEN2_MERGES, size=(1, 24)).astype(np.int64)

    def sess(name):
        return ort.InferenceSession(os.path.join(out_dir, "onnx", name), so, providers=["CPUExecutionProvider"])

    refs = {name: run_chunks(sess(name), cfg, ids, [24])[0][0] for name in ("model_plain.onnx", "model_q4_ref.onnx")}
    # (graph, its reference, max |logit diff| allowed): int8 activations move
    # the 4-bit graph's logits by up to about 0.5 here.
    for name, ref_name, tol in (("model.onnx", "model_plain.onnx", 1e-4),
                                ("model_q4.onnx", "model_q4_ref.onnx", 1.0),
                                ("model_q4.onnx", "model_plain.onnx", None)):
        s = sess(name)
        ref = refs[ref_name]
        for chunks in ([24], [10, 14], [13, 1, 1, 9], [1] * 24):
            got, _ = run_chunks(s, cfg, ids, chunks)
            if got.shape[1] != len(chunks):
                raise SystemExit(f"[check] FAILED: {name} returns {got.shape[1]} rows for {len(chunks)} chunks")
            ends = np.cumsum(chunks) - 1
            err = np.abs(got[0] - ref[ends])
            agree = float((got[0].argmax(-1) == ref[ends].argmax(-1)).mean())
            print(f"[check] {name} vs {ref_name}: chunks {chunks}: max |logit diff| {float(err.max()):.2e}, "
                  f"mean {float(err.mean()):.2e}, top-1 agreement {agree * 100:.0f}%")
            if tol is not None and float(err.max()) > tol:
                raise SystemExit(f"[check] FAILED: {name} differs from {ref_name}")
    print(f"[check] reference logit std {refs['model_plain.onnx'].std():.2f}")
    import tokenizers

    tok = tokenizers.Tokenizer.from_file(os.path.join(out_dir, "tokenizer.json"))
    text = hf_files.render_chatml([{"role": "system", "content": hf_files.QWEN2_DEFAULT_SYSTEM},
                                   {"role": "user", "content": "What's 2024? <tool_call> ünï"}])
    enc = tok.encode(text, add_special_tokens=False)
    back = tok.decode(enc.ids, skip_special_tokens=False)
    start = tok.token_to_id("<|im_start|>")
    print(f"[check] tokenizer: {len(text)} chars -> {len(enc.ids)} tokens, starts {enc.ids[:8]}")
    if back != text or enc.ids[0] != start or tok.token_to_id("<tool_call>") not in enc.ids:
        raise SystemExit("[check] FAILED: tokenizer round trip")
    print("[check] OK")


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
    ap.add_argument("--no-gqa", action="store_true", help="skip onnx/model_gqa.onnx (llama)")
    ap.add_argument("--arch", choices=["llama", "qwen2"], default="llama",
                    help="llama: tiny-random-llama; qwen2: a tiny Qwen2 GGUF through the converter")
    args = ap.parse_args()
    if args.arch == "qwen2":
        write_qwen2_folder(args.out_dir)
    else:
        write_folder(args.out_dir, gqa=not args.no_gqa)
    print(f"wrote {args.out_dir}")
    if args.check:
        check_qwen2(args.out_dir) if args.arch == "qwen2" else check(args.out_dir)


if __name__ == "__main__":
    main()
