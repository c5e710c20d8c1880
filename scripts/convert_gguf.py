#!/usr/bin/env python3
"""Converts a Llama- or Qwen2-architecture GGUF (e.g. SmolLM2-135M-Instruct.Q4_1.gguf,
Qwen2.5-Coder-0.5B-Instruct Q4_K_M) into an ONNX model folder the runtime
loads. numpy + gguf + onnx only, no torch.

    python scripts/convert_gguf.py GGUF OUT_DIR [--variant q4|fp32] [--check]

Writes config.json, generation_config.json, tokenizer.json,
tokenizer_config.json, special_tokens_map.json and
  --variant q4   (default) onnx/model_q4.onnx: GroupQueryAttention +
                 SimplifiedLayerNormalization, MatMulNBits 4-bit linears
                 (blocks of 32), 8-bit embedding and LM head. Q4_1 tensors
                 keep their own blocks plus an exact per-block correction;
                 every other type (Q4_K, Q5_0, Q6_K, Q8_0, F32...) is
                 dequantized and requantized to 4 bits with zero points. The
                 embedding and the LM head keep 8 bits: Q8_0 as it is, Q5_0
                 exactly (its values are 8-bit integers times the block scale).
  --variant fp32 onnx/model.onnx: same graph with dequantized float32 weights.

The LM head runs on the last position only (logits [batch, 1, vocab]).

Architectures: "llama" (Q/K rows un-permuted from llama.cpp's interleaved RoPE
layout, tied LM head) and "qwen2" (rotate-half RoPE as stored, q/k/v bias,
untied LM head when the GGUF has output.weight). The tokenizer is the GGUF's
own byte-level BPE with the pre-tokenizer it names (tokenizer.ggml.pre:
"smollm" or "qwen2"); the chat template is the GGUF's tokenizer.chat_template.

--smoke only runs the quick capital-of-France test on an existing folder
(GGUF argument ignored).

--check additionally builds a standard-ops float32 graph in a temporary folder
and reports: plain vs GQA float32 logit difference (RoPE / un-permute check),
top-1 agreement and max/mean |logit difference| of the written variant
against float32 on a short text, and the greedy answer to "What is the
capital of France?" through the chat template.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_files  # noqa: E402
import llama_onnx as lo  # noqa: E402

MODEL_FILES = {"q4": "model_q4.onnx", "fp32": "model.onnx"}

CHECK_TEXT = (
    "The history of the bicycle begins in the early nineteenth century. In 1817 Karl Drais, a German "
    "inventor, built a two-wheeled running machine that riders pushed along with their feet. Pedals "
    "attached to the front wheel appeared in France in the 1860s, and by the 1880s the safety bicycle, "
    "with a chain driving the rear wheel and two wheels of equal size, had replaced the tall penny-farthing. "
    "Pneumatic tyres, invented by John Boyd Dunlop in 1888, made riding far more comfortable. Today there "
    "are more than a billion bicycles in the world, used for commuting, sport, delivery and recreation. "
    "def add(a, b):\n    return a + b\n\nprint(add(2, 40))  # 42\n"
)


def field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


ARCHITECTURES = ("llama", "qwen2")


def read_config(reader) -> lo.LlamaConfig:
    arch = field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise SystemExit(f"unsupported architecture {arch!r} (supported: {', '.join(ARCHITECTURES)})")
    names = {t.name for t in reader.tensors}
    p = arch + "."
    hidden = int(field(reader, p + "embedding_length"))
    n_heads = int(field(reader, p + "attention.head_count"))
    tokens = reader.fields["tokenizer.ggml.tokens"]
    vocab = int(field(reader, p + "vocab_size", len(tokens.data)))
    eps = float(field(reader, p + "attention.layer_norm_rms_epsilon"))
    return lo.LlamaConfig(
        n_layers=int(field(reader, p + "block_count")),
        hidden=hidden,
        n_heads=n_heads,
        n_kv_heads=int(field(reader, p + "attention.head_count_kv", n_heads)),
        head_dim=int(field(reader, p + "rope.dimension_count", hidden // n_heads)),
        ffn=int(field(reader, p + "feed_forward_length")),
        vocab=vocab,
        rope_theta=float(field(reader, p + "rope.freq_base", 10000.0)),
        # GGUF stores eps as float32 (9.9999997e-06); keep the decimal the model was trained with.
        rms_eps=float(np.format_float_positional(np.float32(eps), unique=True)) if eps else 1e-5,
        max_pos=int(field(reader, p + "context_length")),
        arch=arch,
        tied="output.weight" not in names,
        qkv_bias="blk.0.attn_q.bias" in names,
    )


def unpermute_rows(a: np.ndarray, n_head: int) -> np.ndarray:
    """Undoes llama.cpp's Q/K row permutation (interleaved RoPE pairs -> rotate-half halves).

    convert_hf_to_gguf does w.reshape(n_head, 2, hd/2, ...).swapaxes(1, 2); rows are whole
    output features, so this works on quantized rows (blocks never cross rows) as well.
    """
    n = a.shape[0]
    hd = n // n_head
    return a.reshape(n_head, hd // 2, 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape)


def q4_1_to_nbits(raw: np.ndarray, k: int) -> lo.Q4Linear:
    """GGUF Q4_1 rows [n, nb*20 bytes] -> MatMulNBits blobs + exact correction."""
    n = raw.shape[0]
    nb = k // 32
    blocks = raw.reshape(n, nb, 20)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    qs = blocks[..., 4:20]
    # Q4_1 byte j holds element j (low nibble) and element j+16 (high nibble);
    # MatMulNBits wants element 2i in the low nibble and 2i+1 in the high one.
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
    blob = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(d > 0, np.clip(np.rint(-m / d), 0, 15), 0).astype(np.uint8)
    corr = (m + d * z.astype(np.float32)).astype(np.float32)
    if nb % 2:
        z = np.concatenate([z, np.zeros((n, 1), np.uint8)], axis=1)
    zp = (z[:, 0::2] | (z[:, 1::2] << 4)).astype(np.uint8)
    return lo.Q4Linear(n=n, k=k, blob=np.ascontiguousarray(blob), scales=d, zero_points=zp, correction=corr)


q4_dequant = lo.q4_dequant


def q8_0_table(raw: np.ndarray, k: int) -> lo.Q8Table:
    n = raw.shape[0]
    nb = k // 32
    blocks = raw.reshape(n, nb, 34)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    q = blocks[..., 2:34].copy().view(np.int8)
    u8 = (q.astype(np.int16) + 128).astype(np.uint8)
    # The LM head runs as MatMulNBits with int8 activations (accuracy_level 4).
    # Quantizing the final hidden state per 16 values instead of 32 (same weight
    # bytes, scales repeated) trims the head's share of the error: mean |logit
    # error| vs float32 0.152 -> 0.147 on a 1291-token prompt, at no measurable
    # speed cost. (A float32 head gets 0.140 but halves decode speed.)
    return lo.Q8Table(u8=np.ascontiguousarray(u8), scales=d, act_block=16)


def q5_0_table(raw: np.ndarray, k: int, act_block: int = 32) -> lo.Q8Table:
    """GGUF Q5_0 rows [n, nb*22 bytes] -> Q8Table, exactly: Q5_0 is d*(q-16) with
    q in [0, 31], so q-16 is an int8 under the same block scale."""
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize

    n = raw.shape[0]
    nb = k // 32
    d = raw.reshape(n, nb, 22)[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    w = dequantize(raw, T.Q5_0).reshape(n, nb, 32)
    # d may be negative (llama.cpp divides the block's extreme value by -16).
    q = np.rint(w / np.where(d != 0, d, 1.0)[..., None])
    u8 = (np.clip(q, -16, 15) + 128).astype(np.uint8)
    return lo.Q8Table(u8=np.ascontiguousarray(u8), scales=d, act_block=act_block)


def load_weights(reader, cfg: lo.LlamaConfig, variant: str, log=print) -> lo.ModelWeights:
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize

    tensors = {t.name: t for t in reader.tensors}
    # llama.cpp stores Llama's Q/K rows permuted for interleaved RoPE; Qwen2
    # (NeoX-style rotate-half RoPE) is stored as Hugging Face has it.
    permute = cfg.arch == "llama"
    requantized = {"count": 0, "err2": 0.0, "ref2": 0.0, "types": set()}

    def f32(name):
        t = tensors[name]
        # Rows are output features: [n, k] for matrices, [n] for norm weights.
        return np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32)

    def linear(name, permute_heads=None):
        t = tensors[name]
        k = int(t.shape[0])
        if not permute:
            permute_heads = None
        if variant == "q4" and t.tensor_type == T.Q4_1 and k % 32 == 0:
            raw = np.asarray(t.data)
            if permute_heads:
                raw = unpermute_rows(raw, permute_heads)
            return q4_1_to_nbits(raw, k)
        w = f32(name)
        if permute_heads:
            w = unpermute_rows(w, permute_heads)
        if variant == "q4" and k % 32 == 0:
            # Any other type (k-quants, Q5_0, Q8_0, F32) goes through float32
            # to 4-bit blocks of 32 with zero points.
            q = lo.quantize_q4(w)
            err = q4_dequant(q) - w
            requantized["count"] += 1
            requantized["err2"] += float(np.square(err, dtype=np.float64).sum())
            requantized["ref2"] += float(np.square(w, dtype=np.float64).sum())
            requantized["types"].add(t.tensor_type.name)
            return q
        return w

    def table(name, act_block):
        """An 8-bit table (embedding or LM head) for the q4 variant."""
        t = tensors[name]
        raw = np.asarray(t.data)
        if t.tensor_type == T.Q8_0:
            tab = q8_0_table(raw, cfg.hidden)
            tab.act_block = act_block
            return tab
        if t.tensor_type == T.Q5_0:
            return q5_0_table(raw, cfg.hidden, act_block)
        return lo.quantize_q8(f32(name), act_block)

    def fuse_ready(parts):
        # MatMulNBits and float parts cannot be fused; fall back to float for the group.
        if len({type(p) for p in parts}) == 1:
            return parts
        return [q4_dequant(p) if isinstance(p, lo.Q4Linear) else p for p in parts]

    emb = tensors["token_embd.weight"]
    lm_head = None
    if variant == "q4" and cfg.tied and emb.tensor_type == T.Q8_0 and cfg.hidden % 32 == 0:
        embed = q8_0_table(np.asarray(emb.data), cfg.hidden)
    elif variant == "q4" and not cfg.tied and cfg.hidden % 32 == 0:
        embed = table("token_embd.weight", 32)
        # Head activations in blocks of 16, as for the tied head (see q8_0_table).
        lm_head = table("output.weight", 16)
    else:
        embed = f32("token_embd.weight")
        if not cfg.tied:
            lm_head = f32("output.weight")

    layers = []
    for i in range(cfg.n_layers):
        b = f"blk.{i}."
        q, k, v = fuse_ready([
            linear(b + "attn_q.weight", cfg.n_heads),
            linear(b + "attn_k.weight", cfg.n_kv_heads),
            linear(b + "attn_v.weight"),
        ])
        gate, up = fuse_ready([linear(b + "ffn_gate.weight"), linear(b + "ffn_up.weight")])
        bias = None
        if cfg.qkv_bias:
            bias = np.concatenate([f32(b + "attn_q.bias"), f32(b + "attn_k.bias"), f32(b + "attn_v.bias")])
        layers.append(lo.LayerWeights(
            attn_norm=f32(b + "attn_norm.weight"), q=q, k=k, v=v, o=linear(b + "attn_output.weight"),
            ffn_norm=f32(b + "ffn_norm.weight"), gate=gate, up=up, down=linear(b + "ffn_down.weight"),
            qkv_bias=bias,
        ))
    w = lo.ModelWeights(embed=embed, layers=layers, final_norm=f32("output_norm.weight"), lm_head=lm_head)
    if requantized["count"]:
        rel = (requantized["err2"] / max(requantized["ref2"], 1e-30)) ** 0.5
        log(f"requantized {requantized['count']} matrices ({', '.join(sorted(requantized['types']))}) to 4 bits: "
            f"relative RMS weight error {rel * 100:.2f}%")

    if variant == "q4" and tensors["blk.0.attn_q.weight"].tensor_type == T.Q4_1:
        # The 4-bit rewrite must reproduce Q4_1's own dequantized values.
        t = tensors["blk.0.attn_q.weight"]
        ref = f32("blk.0.attn_q.weight")
        if permute:
            ref = unpermute_rows(ref, cfg.n_heads)
        got = q4_dequant(layers[0].q) if isinstance(layers[0].q, lo.Q4Linear) else layers[0].q
        err = float(np.abs(got - ref).max())
        if err > 1e-5 * max(1.0, float(np.abs(ref).max())):
            raise SystemExit(f"Q4_1 -> MatMulNBits self-check failed (max err {err}) on {t.name}")
    return w


def write_tokenizer(reader, cfg: lo.LlamaConfig, out_dir: str) -> None:
    model = field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise SystemExit(f"unsupported tokenizer model {model!r} (only byte-level BPE 'gpt2')")
    pre = field(reader, "tokenizer.ggml.pre", "smollm")
    if pre not in hf_files.PRE_TOKENIZERS:
        raise SystemExit(f"unsupported pre-tokenizer {pre!r} (supported: {', '.join(hf_files.PRE_TOKENIZERS)})")
    types = list(field(reader, "tokenizer.ggml.token_type"))
    # 5 = unused: padding rows of the embedding with placeholder names
    # ([PAD151665]); they have no text and stay out of the vocabulary.
    tokens = [None if ty == 5 else str(t) for t, ty in zip(field(reader, "tokenizer.ggml.tokens"), types)]
    merges = [str(m) for m in field(reader, "tokenizer.ggml.merges")]
    # 3 = control, 4 = user defined: both are matched verbatim and never split.
    special = [i for i, t in enumerate(types) if t in (3, 4)]
    bos = int(field(reader, "tokenizer.ggml.bos_token_id", 1))
    eos = int(field(reader, "tokenizer.ggml.eos_token_id", 2))
    pad = int(field(reader, "tokenizer.ggml.padding_token_id", eos))
    unk = int(field(reader, "tokenizer.ggml.unknown_token_id", 0))
    if field(reader, "tokenizer.ggml.unknown_token_id") is None and cfg.arch == "qwen2":
        # Qwen2 has no unknown token (byte-level BPE spells every text); name
        # the padding token rather than an ordinary one.
        unk = pad
    template = field(reader, "tokenizer.chat_template", hf_files.CHATML_TEMPLATE)
    generation_eos = [eos]
    if cfg.arch == "qwen2":
        # Qwen2 ends a turn with <|im_end|> and a document with <|endoftext|>;
        # its generation_config.json lists both.
        for text in ("<|im_end|>", "<|endoftext|>"):
            if text in tokens and tokens.index(text) not in generation_eos:
                generation_eos.append(tokens.index(text))
    hf_files.write_tokenizer_files(out_dir, tokens, merges, special, bos_id=bos, eos_id=eos, pad_id=pad,
                                   unk_id=unk, chat_template=template, max_len=cfg.max_pos, pre=pre)
    hf_files.write_config_files(out_dir, cfg, bos_id=bos, eos_id=eos, pad_id=pad, generation_eos=generation_eos)


def convert(gguf_path: str, out_dir: str, variant: str, keep: dict | None = None) -> str:
    """Writes the folder; with `keep` (a dict), leaves the config and weights
    in it for check() (requantizing a 0.5B model twice costs a minute)."""
    import gguf

    t0 = time.time()
    reader = gguf.GGUFReader(gguf_path)
    cfg = read_config(reader)
    print(f"{cfg.arch}: {cfg.n_layers} layers, hidden {cfg.hidden}, heads {cfg.n_heads}/{cfg.n_kv_heads}, "
          f"vocab {cfg.vocab}, {'tied' if cfg.tied else 'untied'} LM head{', q/k/v bias' if cfg.qkv_bias else ''}")
    os.makedirs(os.path.join(out_dir, "onnx"), exist_ok=True)
    write_tokenizer(reader, cfg, out_dir)
    weights = load_weights(reader, cfg, variant)
    print(f"weights ready in {time.time() - t0:.1f} s")
    model = lo.build_model(cfg, weights, "gqa")
    path = os.path.join(out_dir, "onnx", MODEL_FILES[variant])
    lo.save_model(model, path)
    del model
    size = sum(os.path.getsize(p) for p in (path, path + "_data") if os.path.exists(p))
    print(f"wrote {path} ({size / 1e6:.1f} MB{', weights in ' + os.path.basename(path) + '_data' if os.path.exists(path + '_data') else ''}) "
          f"in {time.time() - t0:.1f} s")
    if keep is not None:
        keep["weights"] = weights
    return path


# ---------------------------------------------------------------- checking

def _session(path):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def _forward(sess, cfg, ids, past=None, past_len=0):
    n = len(ids)
    if past is None:
        past = {f"past_key_values.{i}.{kv}": np.zeros((1, cfg.n_kv_heads, 0, cfg.head_dim), np.float32)
                for i in range(cfg.n_layers) for kv in ("key", "value")}
    feed = {
        "input_ids": np.array([ids], np.int64),
        "attention_mask": np.ones((1, past_len + n), np.int64),
        "position_ids": np.arange(past_len, past_len + n, dtype=np.int64)[None],
        **past,
    }
    names = [o.name for o in sess.get_outputs()]
    res = dict(zip(names, sess.run(names, feed)))
    new_past = {k.replace("present.", "past_key_values."): v for k, v in res.items() if k.startswith("present.")}
    return res["logits"][0], new_past


def check(gguf_path: str, out_dir: str, variant: str, weights: lo.ModelWeights | None = None) -> None:
    """Compares the written graph with a dequantized float32 standard-ops graph
    on CHECK_TEXT (every position's logits), then runs the smoke test."""
    import gc

    import gguf
    import tokenizers

    reader = gguf.GGUFReader(gguf_path)
    cfg = read_config(reader)
    tok = tokenizers.Tokenizer.from_file(os.path.join(out_dir, "tokenizer.json"))
    ids = tok.encode(CHECK_TEXT, add_special_tokens=False).ids
    print(f"[check] check text: {len(ids)} tokens")
    written, _ = _forward(_session(os.path.join(out_dir, "onnx", MODEL_FILES[variant])), cfg, ids)
    if written.shape[0] != 1:
        raise SystemExit(f"[check] FAILED: the written graph returns {written.shape[0]} rows of logits, not 1")

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.time()
        # The written graph computes the last row only; the same weights with
        # every row's logits are compared position by position.
        if weights is None:
            weights = load_weights(reader, cfg, variant)
        all_path = os.path.join(tmp, "all.onnx")
        lo.save_model(lo.build_model(cfg, weights, "gqa", last_logits=False), all_path)
        del weights
        gc.collect()
        target_logits, _ = _forward(_session(all_path), cfg, ids)
        last_diff = float(np.abs(target_logits[-1] - written[0]).max())
        w32 = load_weights(reader, cfg, "fp32")
        plain_path = os.path.join(tmp, "plain.onnx")
        lo.save_model(lo.build_model(cfg, w32, "plain", last_logits=False), plain_path)
        ref_logits, _ = _forward(_session(plain_path), cfg, ids)
        os.remove(plain_path)
        print(f"[check] built float32 standard-ops reference in {time.time() - t0:.1f} s")
        if variant == "q4":
            gqa_path = os.path.join(tmp, "gqa32.onnx")
            lo.save_model(lo.build_model(cfg, w32, "gqa", last_logits=False), gqa_path)
            del w32
            gc.collect()
            gqa_logits, _ = _forward(_session(gqa_path), cfg, ids)
        else:
            del w32
            gqa_logits = target_logits
    print(f"[check] last-position graph vs every-position graph, last row: max |logit diff| {last_diff:.2e}")
    diff = float(np.abs(gqa_logits - ref_logits).max())
    print(f"[check] float32 GQA graph vs standard-ops graph: max |logit diff| {diff:.2e}")
    agree = float((target_logits.argmax(-1) == ref_logits.argmax(-1)).mean())
    err = np.abs(target_logits - ref_logits)
    print(f"[check] top-1 agreement {variant} vs float32 reference: {agree * 100:.1f}% over {len(ids)} positions")
    print(f"[check] |logit diff| {variant} vs float32 reference: max {float(err.max()):.3f}, "
          f"mean {float(err.mean()):.4f} (logit std {float(ref_logits.std()):.2f})")

    failures = []
    if diff > 1e-3 * max(1.0, float(np.abs(ref_logits).max()) / 10):
        failures.append("GQA and standard-ops float32 graphs disagree (RoPE / un-permute?)")
    if last_diff > 1e-3:
        failures.append("the last-position graph disagrees with the every-position graph")
    if agree < (0.85 if variant == "q4" else 0.99):
        failures.append(f"top-1 agreement too low ({agree * 100:.1f}%)")
    if not smoke(out_dir, "onnx/" + MODEL_FILES[variant]):
        failures.append("the model does not know the capital of France")
    if failures:
        raise SystemExit("[check] FAILED: " + "; ".join(failures))
    print("[check] OK")


def smoke(model_dir: str, model_file: str) -> bool:
    """Quick sanity test of a converted folder (seconds): prints the greedy answer
    to "What is the capital of France?" and checks that " Paris" is the top token
    after the forced prefix "The capital of France is".

    The forced prefix is what passes or fails: the answer's first token is a
    near tie in float32 ("The" leads "L" by 0.08 logits), so on some CPUs 4-bit
    rounding can start a different, still fluent answer, while " Paris" after
    the prefix leads by about 5 logits.
    """
    import json

    import tokenizers

    import ort_greedy

    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    tok = tokenizers.Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    dec = ort_greedy.Decoder(ort_greedy.load_session(os.path.join(model_dir, model_file), 0), cfg)
    # The model's own default system turn (ChatML families differ only there).
    system = hf_files.QWEN2_DEFAULT_SYSTEM if cfg.get("model_type") == "qwen2" else hf_files.DEFAULT_SYSTEM
    prompt = hf_files.render_chatml([{"role": "system", "content": system},
                                     {"role": "user", "content": "What is the capital of France?"}])
    ids = tok.encode(prompt, add_special_tokens=False).ids
    t0 = time.time()
    out = ort_greedy.generate(dec, ids, 40, ort_greedy.eos_ids(model_dir, cfg))
    answer = tok.decode(out, skip_special_tokens=True)
    print(f"[check] greedy answer ({len(out)} tokens, {time.time() - t0:.2f} s): {answer!r}")
    dec.reset()
    logits = dec.step(tok.encode(prompt + "The capital of France is", add_special_tokens=False).ids)
    top = int(np.argmax(logits))
    paris = tok.encode(" Paris", add_special_tokens=False).ids[0]
    margin = float(logits[paris] - np.max(np.delete(logits, paris)))
    print(f"[check] after 'The capital of France is': top token {tok.id_to_token(top)!r}, "
          f"' Paris' margin {margin:+.2f} logits")
    if "paris" not in answer.lower():
        print("[check] note: the greedy answer does not mention Paris (see smoke() for why this is not fatal)")
    return top == paris


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf")
    ap.add_argument("out_dir")
    ap.add_argument("--variant", choices=sorted(MODEL_FILES), default="q4")
    ap.add_argument("--check", action="store_true", help="validate against a float32 reference after converting")
    ap.add_argument("--check-only", action="store_true", help="validate an existing conversion, do not convert")
    ap.add_argument("--smoke", action="store_true",
                    help="only the quick capital-of-France test on an existing conversion (no GGUF needed)")
    args = ap.parse_args()
    if args.smoke:
        if not smoke(args.out_dir, "onnx/" + MODEL_FILES[args.variant]):
            raise SystemExit("[check] FAILED: the model does not know the capital of France")
        print("[check] OK")
        return
    keep = {} if args.check else None
    if not args.check_only:
        convert(args.gguf, args.out_dir, args.variant, keep)
    if args.check or args.check_only:
        check(args.gguf, args.out_dir, args.variant, (keep or {}).get("weights"))


if __name__ == "__main__":
    main()
