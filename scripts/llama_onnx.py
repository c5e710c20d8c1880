"""Builds Llama-style decoder graphs (Llama, Qwen2) as ONNX, with numpy and the onnx package only.

Used by make_tiny_model.py (random weights) and convert_gguf.py (GGUF weights).
The graph keeps the Optimum / onnx-community input and output names so the same
folder loads in the Rust runtime, onnxruntime-genai and Transformers.js:

  inputs : input_ids [batch, seq] int64, attention_mask [batch, past+seq] int64,
           position_ids [batch, seq] int64,
           past_key_values.{i}.key / .value [batch, kv_heads, past, head_dim] f32
  outputs: logits [batch, 1, vocab] f32 (the last position only; [batch, seq, vocab]
           with last_logits=False, which the reference checks use),
           present.{i}.key / .value [batch, kv_heads, past+seq, head_dim] f32

The LM head runs on the last position only: a prefill of n tokens needs one
row of logits to pick the next token, and the head (vocab x hidden) is the
largest single matrix, about a fifth of a long prefill when every row is
computed. Consumers that take the last row of the output (the Rust runtime,
onnxruntime-genai, scripts/ort_greedy.py) read both shapes alike.

Qwen2 is the same network plus a bias on the q/k/v projections (added after
the fused projection, before attention) and an LM head of its own (untied).

Two attention flavours:
  "plain" - standard ONNX ops only; RoPE from position_ids, causal mask built
            from attention_mask so that new tokens see every past position and
            each other causally (chunked prefill gives the same logits).
  "gqa"   - com.microsoft GroupQueryAttention with rotary inside the op; it
            derives positions from attention_mask (no left padding), so
            position_ids is accepted but unused.

Weights for each linear layer are either a float32 array in Hugging Face
layout [out, in] or a Q4Linear (4-bit blocks for MatMulNBits, with an exact
per-block correction term when the source was Q4_1, see Q4Linear;
quantize_q4 makes one from float weights).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Union

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
# IR 8 pairs with opset 17 and keeps the file loadable by older runtimes.
IR_VERSION = 8
NEG_INF = float(np.finfo(np.float32).min)


@dataclasses.dataclass
class LlamaConfig:
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    rope_theta: float
    rms_eps: float
    max_pos: int
    # "llama" or "qwen2": what config.json names the model.
    arch: str = "llama"
    # The LM head is the embedding table (True) or a matrix of its own.
    tied: bool = True
    # q/k/v projections carry a bias (Qwen2).
    qkv_bias: bool = False


@dataclasses.dataclass
class Q4Linear:
    """A linear layer y = x @ W^T stored as MatMulNBits 4-bit blocks of 32.

    The source format (GGUF Q4_1) is w = d*q + m per block. MatMulNBits computes
    w' = scale*(q - zp) with an integer zero point, so with zp = round(-m/d)
    clipped to [0, 15] the remainder c = m + d*zp is a per-block constant:
    y = MatMulNBits(x) + blocksum(x) @ c^T, which is exact. Weights quantized
    here (quantize_q4) have integer zero points and no correction (None).
    """

    n: int  # output features
    k: int  # input features
    blob: np.ndarray  # uint8 [n, k/32, 16]
    scales: np.ndarray  # float32 [n, k/32]
    zero_points: np.ndarray  # uint8 [n, ceil((k/32)/2)], two 4-bit values per byte
    correction: Optional[np.ndarray]  # float32 [n, k/32], or None when the zero points are exact
    act_block: int = 32  # MatMulNBits block size in the graph (16 or 32)


@dataclasses.dataclass
class Q8Table:
    """Token embedding or LM head as 8-bit blocks of 32.

    Stored once as uint8 q+128 [vocab, hidden/32, 32]: the embedding gathers rows
    from it and the LM head feeds it to MatMulNBits(bits=8, zero point 128); a
    tied model uses the one table for both.
    """

    u8: np.ndarray  # uint8 [vocab, hidden/32, 32]
    scales: np.ndarray  # float32 [vocab, hidden/32]
    act_block: int = 32  # LM head MatMulNBits block size (16 or 32)


Linear = Union[np.ndarray, Q4Linear]


@dataclasses.dataclass
class LayerWeights:
    attn_norm: np.ndarray
    q: Linear
    k: Linear
    v: Linear
    o: Linear
    ffn_norm: np.ndarray
    gate: Linear
    up: Linear
    down: Linear
    # Qwen2: bias of the fused q/k/v projection, float32 [(heads + 2*kv_heads) * head_dim].
    qkv_bias: Optional[np.ndarray] = None


@dataclasses.dataclass
class ModelWeights:
    embed: Union[np.ndarray, Q8Table]  # float32 [vocab, hidden] or Q8Table
    layers: list
    final_norm: np.ndarray
    # Untied models: the LM head [vocab, hidden] (float32 or Q8Table); None = the embedding.
    lm_head: Union[np.ndarray, Q8Table, None] = None


def concat_linears(parts: list) -> Linear:
    """Fuses linears sharing an input (q/k/v, gate/up) into one along the output axis."""
    if all(isinstance(p, np.ndarray) for p in parts):
        return np.concatenate(parts, axis=0)
    if all(isinstance(p, Q4Linear) for p in parts):
        corrections = [p.correction for p in parts]
        if any(c is None for c in corrections):
            if not all(c is None for c in corrections):
                # A part without a correction has an exact zero point: its correction is 0.
                corrections = [np.zeros_like(p.scales) if c is None else c for p, c in zip(parts, corrections)]
            else:
                corrections = None
        return Q4Linear(
            n=sum(p.n for p in parts),
            k=parts[0].k,
            blob=np.concatenate([p.blob for p in parts], axis=0),
            scales=np.concatenate([p.scales for p in parts], axis=0),
            zero_points=np.concatenate([p.zero_points for p in parts], axis=0),
            correction=None if corrections is None else np.concatenate(corrections, axis=0),
        )
    raise TypeError("cannot fuse linears of mixed kinds")


# Candidate clipping ranges for quantize_q4, as fractions of a block's
# [min, max]: (low end, high end). Clipping the extremes a little often lowers
# the block's squared error; the best candidate per block is kept. On
# Qwen2.5-Coder-0.5B's matrices these six get the relative RMS error from
# 8.4% (min/max only) to 8.09%; a grid of 25 gets 8.09% at four times the time.
_Q4_RANGES = [(1.0, 1.0), (0.95, 0.95), (0.9, 0.9), (1.0, 0.9), (0.9, 1.0), (0.8, 0.8)]


def quantize_q4(w: np.ndarray, chunk_rows: int = 1024) -> Q4Linear:
    """Float weights [n, k] -> MatMulNBits 4-bit blocks of 32 with zero points.

    Per block: w ~= scale * (q - zp), q and zp in [0, 15]. For each candidate
    range (_Q4_RANGES, the block's min/max possibly clipped) the zero point is
    rounded, the codes are rounded, and the scale is refitted by least squares
    for those codes; the candidate with the least squared error wins. All in
    numpy over whole row chunks (no Python loop per block).
    """
    n, k = w.shape
    if k % 32:
        raise ValueError(f"quantize_q4 needs k divisible by 32, got {k}")
    nb = k // 32
    blob = np.empty((n, nb, 16), np.uint8)
    scales = np.empty((n, nb), np.float32)
    zps = np.empty((n, nb), np.uint8)
    for r0 in range(0, n, chunk_rows):
        x = np.asarray(w[r0:r0 + chunk_rows], dtype=np.float32).reshape(-1, nb, 32)
        lo = np.minimum(x.min(-1), 0.0)
        hi = np.maximum(x.max(-1), 0.0)
        best_err = np.full(lo.shape, np.inf, np.float32)
        best_q = np.zeros(x.shape, np.uint8)
        best_s = np.zeros(lo.shape, np.float32)
        best_z = np.zeros(lo.shape, np.uint8)
        for a, b in _Q4_RANGES:
            span = hi * b - lo * a
            s = np.where(span > 0, span / 15.0, 1.0).astype(np.float32)
            z = np.clip(np.rint(-lo * a / s), 0, 15)
            q = np.clip(np.rint(x / s[..., None]) + z[..., None], 0, 15)
            c = q - z[..., None]
            # Least-squares scale for these codes: sum(w*c) / sum(c*c).
            cc = (c * c).sum(-1)
            s2 = np.where(cc > 0, (x * c).sum(-1) / np.maximum(cc, 1e-30), s).astype(np.float32)
            err = ((s2[..., None] * c - x) ** 2).sum(-1)
            better = err < best_err
            best_err = np.where(better, err, best_err)
            best_s = np.where(better, s2, best_s)
            best_z = np.where(better, z, best_z).astype(np.uint8)
            best_q = np.where(better[..., None], q, best_q).astype(np.uint8)
        rows = best_q.shape[0]
        blob[r0:r0 + rows] = best_q[..., 0::2] | (best_q[..., 1::2] << 4)
        scales[r0:r0 + rows] = best_s
        zps[r0:r0 + rows] = best_z
    if nb % 2:
        zps = np.concatenate([zps, np.zeros((n, 1), np.uint8)], axis=1)
    zp = (zps[:, 0::2] | (zps[:, 1::2] << 4)).astype(np.uint8)
    return Q4Linear(n=n, k=k, blob=blob, scales=scales, zero_points=np.ascontiguousarray(zp), correction=None)


def q4_dequant(ql: Q4Linear) -> np.ndarray:
    """Float weights [n, k] as the 4-bit graph computes them."""
    q = np.stack([ql.blob & 0x0F, ql.blob >> 4], axis=-1).reshape(ql.n, -1, 32).astype(np.float32)
    z = np.stack([ql.zero_points & 0x0F, ql.zero_points >> 4], axis=-1).reshape(ql.n, -1)[:, : q.shape[1]]
    w = ql.scales[..., None] * (q - z[..., None].astype(np.float32))
    if ql.correction is not None:
        w = w + ql.correction[..., None]
    return w.reshape(ql.n, -1)


def quantize_q8(w: np.ndarray, act_block: int = 32) -> Q8Table:
    """Float rows [n, k] -> symmetric 8-bit blocks of 32 (scale = absmax / 127)."""
    n, k = w.shape
    x = np.asarray(w, dtype=np.float32).reshape(n, k // 32, 32)
    d = np.abs(x).max(-1) / 127.0
    q = np.rint(x / np.where(d > 0, d, 1.0)[..., None])
    u8 = (np.clip(q, -127, 127) + 128).astype(np.uint8)
    return Q8Table(u8=u8, scales=d.astype(np.float32), act_block=act_block)


def q8_dequant(tab: Q8Table) -> np.ndarray:
    """Float rows [n, k] of an 8-bit table."""
    return ((tab.u8.astype(np.float32) - 128.0) * tab.scales[..., None]).reshape(tab.u8.shape[0], -1)


def dequantized(weights: ModelWeights) -> ModelWeights:
    """The same weights in float32, exactly as the 4-bit/8-bit graph computes
    them: a standard-ops graph of these is the reference for that graph's
    arithmetic (MatMulNBits layouts, zero points, corrections), apart from its
    int8 activations."""

    def f(x):
        if isinstance(x, Q4Linear):
            return q4_dequant(x)
        if isinstance(x, Q8Table):
            return q8_dequant(x)
        return x

    layers = [dataclasses.replace(lw, **{k: f(getattr(lw, k)) for k in ("q", "k", "v", "o", "gate", "up", "down")})
              for lw in weights.layers]
    return ModelWeights(embed=f(weights.embed), layers=layers, final_norm=weights.final_norm,
                        lm_head=None if weights.lm_head is None else f(weights.lm_head))


def rope_tables(cfg: LlamaConfig):
    """cos/sin of position*inv_freq, [max_pos, head_dim/2] (Hugging Face default RoPE)."""
    inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(0, cfg.head_dim, 2, dtype=np.float64) / cfg.head_dim))
    freqs = np.outer(np.arange(cfg.max_pos, dtype=np.float64), inv_freq)
    return np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32)


class GraphBuilder:
    def __init__(self):
        self.nodes = []
        self.inits = []
        self._n = 0
        self._consts = {}

    def name(self, hint: str) -> str:
        self._n += 1
        return f"{hint}_{self._n}"

    def init(self, name: str, arr: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def const(self, values, dtype=np.int64) -> str:
        arr = np.array(values, dtype=dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._consts:
            self._consts[key] = self.init(self.name("const"), arr)
        return self._consts[key]

    def op(self, op_type, inputs, hint=None, outputs=1, domain="", **attrs):
        if isinstance(outputs, int):
            outs = [self.name(hint or op_type.lower()) for _ in range(outputs)]
        else:
            outs = list(outputs)
        self.nodes.append(
            helper.make_node(op_type, list(inputs), outs, name=self.name("n_" + op_type), domain=domain or None, **attrs)
        )
        return outs[0] if len(outs) == 1 else outs


def _linear(g: GraphBuilder, x: str, w: Linear, hint: str, blocksum_cache: dict) -> str:
    if isinstance(w, np.ndarray):
        wt = g.init(hint + ".weight_t", w.T.astype(np.float32))
        return g.op("MatMul", [x, wt], hint)
    nb = w.k // 32
    blob, scales, zps, bs = w.blob, w.scales, w.zero_points, 32
    if w.act_block == 16:
        # Same weights split into blocks of 16: with accuracy_level 4 the activations
        # are quantized to int8 per block, so smaller blocks lose less precision.
        z = np.stack([zps & 0x0F, zps >> 4], axis=-1).reshape(w.n, -1)[:, :nb]
        z = np.repeat(z, 2, axis=1)
        zps = (z[:, 0::2] | (z[:, 1::2] << 4)).astype(np.uint8)
        blob = blob.reshape(w.n, nb * 2, 8)
        scales = np.repeat(scales, 2, axis=1)
        bs = 16
    b = g.init(hint + ".qweight", blob)
    s = g.init(hint + ".scales", scales.reshape(-1).astype(np.float32))
    z = g.init(hint + ".qzeros", zps.reshape(-1))
    y = g.op(
        "MatMulNBits", [x, b, s, z], hint, domain="com.microsoft",
        K=w.k, N=w.n, bits=4, block_size=bs, accuracy_level=4,
    )
    if w.correction is None:
        return y
    # Exact Q4_1 correction: sum of activations per 32-block times c. Computed once
    # per distinct input (q/k/v and gate/up share it) and kept tiny ([.., k/32]).
    key = (x, nb)
    if key not in blocksum_cache:
        r = g.op("Reshape", [x, g.const([0, 0, nb, 32])], hint + ".blocks")
        blocksum_cache[key] = g.op("ReduceSum", [r, g.const([-1])], hint + ".blocksum", keepdims=0)
    c = g.init(hint + ".correction_t", np.ascontiguousarray(w.correction.T.astype(np.float32)))
    corr = g.op("MatMul", [blocksum_cache[key], c], hint + ".corr")
    return g.op("Add", [y, corr], hint + ".out")


def _rms_norm(g: GraphBuilder, x: str, w: np.ndarray, eps: float, hint: str, fused: bool) -> str:
    wn = g.init(hint + ".weight", w.astype(np.float32))
    if fused:
        # ONNX-domain contrib op in onnxruntime (what its transformer optimizer emits).
        return g.op("SimplifiedLayerNormalization", [x, wn], hint, axis=-1, epsilon=float(eps), stash_type=1)
    sq = g.op("Mul", [x, x], hint + ".sq")
    ms = g.op("ReduceMean", [sq], hint + ".ms", axes=[-1], keepdims=1)
    eps_c = g.const(np.float32(eps), np.float32)
    rs = g.op("Sqrt", [g.op("Add", [ms, eps_c])], hint + ".rms")
    return g.op("Mul", [g.op("Div", [x, rs]), wn], hint)


def _q8_head(g: GraphBuilder, h: str, table: str, tab: Q8Table, vocab: int, hidden: int, name: str) -> None:
    """MatMulNBits(bits=8) over a Q8Table stored as [vocab, hidden/bs, bs] under `table`."""
    hb = tab.act_block
    zp = g.init(name + ".qzeros", np.full((vocab * (hidden // hb),), 128, dtype=np.uint8))
    lm_scales = np.repeat(tab.scales, 32 // hb, axis=1)
    lm_scales = g.init(name + ".scales", lm_scales.reshape(-1).astype(np.float32))
    g.op("MatMulNBits", [h, table, lm_scales, zp], outputs=["logits"], domain="com.microsoft",
         K=hidden, N=vocab, bits=8, block_size=hb, accuracy_level=4)


def build_model(cfg: LlamaConfig, weights: ModelWeights, attention: str = "plain", producer: str = "webmcp-agents",
                last_logits: bool = True) -> onnx.ModelProto:
    """The decoder graph. last_logits: the LM head sees only the last position
    (logits [batch, 1, vocab]); False computes every position's logits, as the
    reference checks that compare whole sequences need."""
    assert attention in ("plain", "gqa")
    gqa = attention == "gqa"
    g = GraphBuilder()
    L, H, NH, KVH, D = cfg.n_layers, cfg.hidden, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    f32, i64 = TensorProto.FLOAT, TensorProto.INT64

    inputs = [
        helper.make_tensor_value_info("input_ids", i64, ["batch_size", "sequence_length"]),
        helper.make_tensor_value_info("attention_mask", i64, ["batch_size", "total_sequence_length"]),
        helper.make_tensor_value_info("position_ids", i64, ["batch_size", "sequence_length"]),
    ]
    logits_len = 1 if last_logits else "sequence_length"
    outputs = [helper.make_tensor_value_info("logits", f32, ["batch_size", logits_len, cfg.vocab])]
    for i in range(L):
        for kv in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(
                f"past_key_values.{i}.{kv}", f32, ["batch_size", KVH, "past_sequence_length", D]))
            outputs.append(helper.make_tensor_value_info(
                f"present.{i}.{kv}", f32, ["batch_size", KVH, "total_sequence_length", D]))

    # ---- embedding
    if isinstance(weights.embed, Q8Table):
        tab = weights.embed
        nb = H // 32
        # Stored in the LM head's block layout ([vocab, hidden/bs, bs], same bytes).
        hb = tab.act_block
        table = g.init("model.embed_tokens.qweight", tab.u8.reshape(cfg.vocab, H // hb, hb))
        emb_scales = g.init("model.embed_tokens.scales", tab.scales.reshape(-1, nb, 1).astype(np.float32))
        rows = g.op("Gather", [table, "input_ids"], "embed.q", axis=0)
        if hb != 32:
            rows = g.op("Reshape", [rows, g.const([0, 0, nb, 32])])
        rows = g.op("Cast", [rows], "embed.qf", to=f32)
        rows = g.op("Sub", [rows, g.const(np.float32(128.0), np.float32)], "embed.centered")
        sc = g.op("Gather", [emb_scales, "input_ids"], "embed.s", axis=0)
        h = g.op("Reshape", [g.op("Mul", [rows, sc]), g.const([0, 0, H])], "embed")
    else:
        table = g.init("model.embed_tokens.weight", weights.embed.astype(np.float32))
        h = g.op("Gather", [table, "input_ids"], "embed", axis=0)

    # ---- shared per-step tensors
    total_len = g.op("Shape", ["attention_mask"], "total_len", start=1, end=2)  # [1]
    if gqa:
        mask_sum = g.op("ReduceSum", ["attention_mask", g.const([1])], "mask_sum", keepdims=0)
        seqlens_k = g.op("Cast", [g.op("Sub", [mask_sum, g.const(1)])], "seqlens_k", to=TensorProto.INT32)
        total_i32 = g.op("Cast", [g.op("Squeeze", [total_len, g.const([0])])], "total_seq_len", to=TensorProto.INT32)
        cos, sin = rope_tables(cfg)
        cos_c = g.init("cos_cache", cos)
        sin_c = g.init("sin_cache", sin)
    else:
        seq_len = g.op("Shape", ["input_ids"], "seq_len", start=1, end=2)
        past_len = g.op("Sub", [total_len, seq_len], "past_len")
        t_s = g.op("Squeeze", [total_len, g.const([0])])
        p_s = g.op("Squeeze", [past_len, g.const([0])])
        key_idx = g.op("Range", [g.const(0), t_s, g.const(1)], "key_idx")  # [T]
        q_idx = g.op("Range", [p_s, t_s, g.const(1)], "query_idx")  # [S], absolute positions
        q_col = g.op("Unsqueeze", [q_idx, g.const([1])])  # [S, 1]
        causal = g.op("LessOrEqual", [key_idx, q_col], "causal")  # [S, T]
        pad = g.op("Unsqueeze", [g.op("Cast", ["attention_mask"], to=TensorProto.BOOL), g.const([1, 2])], "pad")  # [B,1,1,T]
        attn_mask = g.op("And", [causal, pad], "attn_mask")  # [B,1,S,T]
        cos, sin = rope_tables(cfg)
        cos_full = g.init("rope.cos", np.concatenate([cos, cos], axis=1))
        sin_full = g.init("rope.sin", np.concatenate([sin, sin], axis=1))
        cos_b = g.op("Unsqueeze", [g.op("Gather", [cos_full, "position_ids"], axis=0), g.const([1])], "cos")  # [B,1,S,D]
        sin_b = g.op("Unsqueeze", [g.op("Gather", [sin_full, "position_ids"], axis=0), g.const([1])], "sin")
        half = g.const([D // 2, D // 2])

        def rope(x):
            x1, x2 = g.op("Split", [x, half], outputs=2, axis=-1)
            rot = g.op("Concat", [g.op("Neg", [x2]), x1], axis=-1)
            return g.op("Add", [g.op("Mul", [x, cos_b]), g.op("Mul", [rot, sin_b])], "rope")

    n_rep = NH // KVH
    scale = 1.0 / float(np.sqrt(D))

    for i, lw in enumerate(weights.layers):
        p = f"model.layers.{i}"
        bs_cache = {}
        x = _rms_norm(g, h, lw.attn_norm, cfg.rms_eps, p + ".input_layernorm", fused=gqa)
        qkv = _linear(g, x, concat_linears([lw.q, lw.k, lw.v]), p + ".attn.qkv_proj", bs_cache)
        if lw.qkv_bias is not None:
            # GroupQueryAttention takes no bias: it is added to the packed projection.
            qkv = g.op("Add", [qkv, g.init(p + ".attn.qkv_proj.bias", lw.qkv_bias.astype(np.float32))],
                       p + ".attn.qkv_biased")
        past_k, past_v = f"past_key_values.{i}.key", f"past_key_values.{i}.value"
        pres_k, pres_v = f"present.{i}.key", f"present.{i}.value"
        if gqa:
            # Packed QKV input: key and value inputs are left empty.
            attn = g.op(
                "GroupQueryAttention",
                [qkv, "", "", past_k, past_v, seqlens_k, total_i32, cos_c, sin_c],
                outputs=[g.name(p + ".attn.out"), pres_k, pres_v], domain="com.microsoft",
                num_heads=NH, kv_num_heads=KVH, do_rotary=1, rotary_interleaved=0, scale=scale,
                local_window_size=-1,
            )[0]
        else:
            q, k, v = g.op("Split", [qkv, g.const([NH * D, KVH * D, KVH * D])], outputs=3, axis=-1)
            q = g.op("Transpose", [g.op("Reshape", [q, g.const([0, 0, NH, D])])], perm=[0, 2, 1, 3])
            k = g.op("Transpose", [g.op("Reshape", [k, g.const([0, 0, KVH, D])])], perm=[0, 2, 1, 3])
            v = g.op("Transpose", [g.op("Reshape", [v, g.const([0, 0, KVH, D])])], perm=[0, 2, 1, 3])
            q, k = rope(q), rope(k)
            g.op("Concat", [past_k, k], outputs=[pres_k], axis=2)
            g.op("Concat", [past_v, v], outputs=[pres_v], axis=2)
            kk, vv = pres_k, pres_v
            if n_rep > 1:
                rep = g.const([1, 1, n_rep, 1, 1])
                kk = g.op("Reshape", [g.op("Expand", [g.op("Unsqueeze", [kk, g.const([2])]), rep]), g.const([0, NH, -1, D])])
                vv = g.op("Reshape", [g.op("Expand", [g.op("Unsqueeze", [vv, g.const([2])]), rep]), g.const([0, NH, -1, D])])
            q = g.op("Mul", [q, g.const(np.float32(scale), np.float32)])
            scores = g.op("MatMul", [q, g.op("Transpose", [kk], perm=[0, 1, 3, 2])], p + ".attn.scores")
            scores = g.op("Where", [attn_mask, scores, g.const(np.float32(NEG_INF), np.float32)])
            probs = g.op("Softmax", [scores], p + ".attn.probs", axis=-1)
            ctx = g.op("MatMul", [probs, vv])
            attn = g.op("Reshape", [g.op("Transpose", [ctx], perm=[0, 2, 1, 3]), g.const([0, 0, NH * D])], p + ".attn.out")
        h = g.op("Add", [h, _linear(g, attn, lw.o, p + ".attn.o_proj", bs_cache)], p + ".resid1")

        x = _rms_norm(g, h, lw.ffn_norm, cfg.rms_eps, p + ".post_attention_layernorm", fused=gqa)
        gu = _linear(g, x, concat_linears([lw.gate, lw.up]), p + ".mlp.gate_up_proj", bs_cache)
        gate, up = g.op("Split", [gu, g.const([cfg.ffn, cfg.ffn])], outputs=2, axis=-1)
        act = g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate])]), up], p + ".mlp.act")
        h = g.op("Add", [h, _linear(g, act, lw.down, p + ".mlp.down_proj", bs_cache)], p + ".resid2")

    if last_logits:
        # Only the last position goes on: [B, S, H] -> [B, 1, H].
        h = g.op("Gather", [h, g.const([-1])], "last_position", axis=1)
    h = _rms_norm(g, h, weights.final_norm, cfg.rms_eps, "model.norm", fused=gqa)

    # ---- LM head: the embedding table when tied (no second copy), else its own
    head = weights.embed if weights.lm_head is None else weights.lm_head
    if weights.lm_head is not None:
        if isinstance(head, Q8Table):
            table = g.init("lm_head.qweight", head.u8.reshape(cfg.vocab, H // head.act_block, head.act_block))
        else:
            table = g.init("lm_head.weight", head.astype(np.float32))
    if isinstance(head, Q8Table):
        _q8_head(g, h, table, head, cfg.vocab, H, "lm_head")
    else:
        flat = g.op("Reshape", [h, g.const([-1, H])])
        lg = g.op("Gemm", [flat, table], "lm_head", transB=1)
        if last_logits:
            out_shape = g.const([-1, 1, cfg.vocab])
        else:
            out_shape = g.op("Concat", [g.op("Shape", ["input_ids"]), g.const([cfg.vocab])], axis=0)
        g.op("Reshape", [lg, out_shape], outputs=["logits"])

    graph = helper.make_graph(g.nodes, cfg.arch, inputs, outputs, initializer=g.inits)
    opsets = [helper.make_opsetid("", OPSET)]
    if any(n.domain == "com.microsoft" for n in g.nodes):
        opsets.append(helper.make_opsetid("com.microsoft", 1))
    model = helper.make_model(graph, opset_imports=opsets, producer_name=producer)
    model.ir_version = IR_VERSION
    return model


def save_model(model: onnx.ModelProto, path: str) -> None:
    """Writes atomically (temp file + rename) so an interrupted run leaves no half file."""
    import os

    tmp = path + ".partial"
    # Protobuf cannot hold a message over 2 GiB (and cannot measure one
    # reliably): count the initializers' bytes instead of ByteSize().
    weight_bytes = sum(len(t.raw_data) for t in model.graph.initializer)
    if weight_bytes > 1_800_000_000:
        onnx.save_model(model, tmp, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=os.path.basename(path) + "_data")
    else:
        onnx.save_model(model, tmp)
    os.replace(tmp, path)
