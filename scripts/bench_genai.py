#!/usr/bin/env python3
"""Measures onnxruntime-genai on a model folder, as a reference point for the
runtime's own benchmark.

    python scripts/bench_genai.py MODEL_DIR [--model-file onnx/model_q4.onnx]
        [--workload agent-workload-4step.json] [--threads 2] [--repeat 3]

Prints one JSON line: decode tok/s, prefill time for a 511-token prompt and,
with --workload, the total seconds to replay a multi-step agent workload
(each step: greedy from its prompt_ids, stop at eos or max_new_tokens), once
with a new generator per step ("fresh") and once with one generator whose KV
cache keeps the longest common prefix between steps ("reuse").

onnxruntime-genai is installed into the running Python environment on first
use (pinned below, without dependencies: it only needs numpy and onnxruntime,
which scripts/requirements.txt already pins). The model folder is not
modified: a temporary copy made of links gets the genai_config.json it needs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

GENAI_VERSION = "0.18.0"
PREFILL_TOKENS = 511


def import_genai():
    try:
        import onnxruntime_genai as og

        return og
    except ImportError:
        pass
    print(f"[bench] installing onnxruntime-genai=={GENAI_VERSION} into {sys.prefix}", file=sys.stderr)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "-q",
         "--no-deps", f"onnxruntime-genai=={GENAI_VERSION}"],
        check=True, stdout=sys.stderr,
    )
    import onnxruntime_genai as og

    return og


def genai_config(cfg: dict, model_file: str, threads: int, max_length: int, shared_kv: bool) -> dict:
    session_options = {"log_id": "onnxruntime-genai", "provider_options": []}
    if threads:
        session_options["intra_op_num_threads"] = threads
    eos = cfg.get("eos_token_id", 2)
    return {
        "model": {
            "bos_token_id": cfg.get("bos_token_id", 1),
            "context_length": cfg.get("max_position_embeddings", max_length),
            "decoder": {
                "session_options": session_options,
                "filename": model_file,
                "head_size": cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"],
                "hidden_size": cfg["hidden_size"],
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    "position_ids": "position_ids",
                    "past_key_names": "past_key_values.%d.key",
                    "past_value_names": "past_key_values.%d.value",
                },
                "outputs": {
                    "logits": "logits",
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value",
                },
                "num_attention_heads": cfg["num_attention_heads"],
                "num_hidden_layers": cfg["num_hidden_layers"],
                "num_key_value_heads": cfg.get("num_key_value_heads", cfg["num_attention_heads"]),
            },
            "eos_token_id": eos,
            "pad_token_id": cfg.get("pad_token_id", eos if isinstance(eos, int) else eos[0]),
            "type": "llama",
            "vocab_size": cfg["vocab_size"],
        },
        "search": {
            "diversity_penalty": 0.0,
            "do_sample": False,
            "early_stopping": True,
            "length_penalty": 1.0,
            "max_length": max_length,
            "min_length": 0,
            "no_repeat_ngram_size": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            # One KV buffer of max_length, written in place: genai's fast path,
            # which needs GroupQueryAttention in the graph.
            "past_present_share_buffer": shared_kv,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "top_k": 1,
            "top_p": 1.0,
        },
    }


def prepare_folder(model_dir: str, model_file: str, threads: int, max_length: int, shared_kv: bool) -> str:
    """Temporary folder of symlinks to MODEL_DIR's files plus a genai_config.json."""
    tmp = tempfile.mkdtemp(prefix="genai-")
    src = os.path.abspath(model_dir)
    for name in os.listdir(src):
        if name != "genai_config.json" and not name.startswith("."):
            os.symlink(os.path.join(src, name), os.path.join(tmp, name))
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(tmp, "genai_config.json"), "w") as f:
        json.dump(genai_config(cfg, model_file, threads, max_length, shared_kv), f, indent=2)
    return tmp


class Runner:
    def __init__(self, og, folder: str, max_length: int):
        self.og = og
        config = og.Config(folder)
        config.clear_providers()
        self.model = og.Model(config)
        self.max_length = max_length

    def generator(self, min_length: int = 0):
        params = self.og.GeneratorParams(self.model)
        params.set_search_options(do_sample=False, max_length=self.max_length, min_length=min_length)
        return self.og.Generator(self.model, params)

    def decode(self, gen, max_new: int, eos: set) -> list:
        out = []
        while len(out) < max_new and not gen.is_done():
            gen.generate_next_token()
            tok = int(gen.get_next_tokens()[0])
            out.append(tok)
            if tok in eos:
                break
        return out


def common_prefix(a: list, b: list) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def replay(runner: Runner, steps: list, max_new: int, eos: set, reuse: bool):
    outs = []
    gen, cached = None, []
    t0 = time.perf_counter()
    for step in steps:
        prompt = step["prompt_ids"]
        if not reuse or gen is None:
            gen = runner.generator()
            gen.append_tokens(prompt)
        else:
            # The KV cache holds everything fed so far: the previous prompt and the
            # generated tokens except the last one, which was sampled but never fed
            # (true whether the step ended on eos or on the token limit).
            keep = common_prefix(cached, prompt)
            keep = min(keep, len(prompt) - 1)  # at least one new token must be fed
            gen.rewind_to(keep)
            gen.append_tokens(prompt[keep:])
        out = runner.decode(gen, max_new, eos)
        cached = list(prompt) + out[:-1]
        outs.append(out)
    return time.perf_counter() - t0, outs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("--model-file", default="onnx/model_q4.onnx", help="graph inside MODEL_DIR")
    ap.add_argument("--workload", help="agent workload JSON (steps[].prompt_ids, max_new_tokens, eos)")
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0: onnxruntime default)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per measurement; the median is reported")
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--max-length", type=int, default=2048, help="KV buffer length (prompt + new tokens)")
    ap.add_argument("--no-shared-kv", action="store_true", help="for graphs without GroupQueryAttention")
    args = ap.parse_args()

    og = import_genai()
    with open(os.path.join(args.model_dir, "config.json")) as f:
        cfg = json.load(f)
    eos_cfg = cfg.get("eos_token_id", 2)
    eos = set(eos_cfg if isinstance(eos_cfg, list) else [eos_cfg])
    folder = prepare_folder(args.model_dir, args.model_file, args.threads, args.max_length, not args.no_shared_kv)
    try:
        runner = Runner(og, folder, args.max_length)
        result = {
            "runtime": "onnxruntime-genai",
            "version": getattr(og, "__version__", GENAI_VERSION),
            "model": os.path.join(os.path.basename(os.path.abspath(args.model_dir)), args.model_file),
            "threads": args.threads or None,
        }

        # Decode: a short prompt, then decode_tokens greedy tokens; eos is not a
        # stop here so every run times the same number of steps.
        prompt = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 30, 2, 198, 1, 4093, 198]
        prompt = [t % cfg["vocab_size"] for t in prompt]
        rates = []
        for _ in range(args.repeat):
            gen = runner.generator(min_length=len(prompt) + args.decode_tokens + 1)
            gen.append_tokens(prompt)
            gen.generate_next_token()  # first token: excluded, it may include lazy set-up
            t0 = time.perf_counter()
            for _ in range(args.decode_tokens):
                gen.generate_next_token()
            rates.append(args.decode_tokens / (time.perf_counter() - t0))
        result["decode_tok_s"] = round(statistics.median(rates), 2)

        # Prefill: a fresh generator fed PREFILL_TOKENS tokens at once.
        ids = list(range(1000, 1000 + PREFILL_TOKENS))
        if args.workload:
            with open(args.workload) as f:
                workload = json.load(f)
            longest = max(workload["steps"], key=lambda s: len(s["prompt_ids"]))["prompt_ids"]
            if len(longest) >= PREFILL_TOKENS:
                ids = longest[:PREFILL_TOKENS]
        times = []
        for _ in range(args.repeat):
            gen = runner.generator()
            t0 = time.perf_counter()
            gen.append_tokens(ids)
            times.append(time.perf_counter() - t0)
        result["prefill_tokens"] = PREFILL_TOKENS
        result["prefill_s"] = round(statistics.median(times), 3)
        result["prefill_tok_s"] = round(PREFILL_TOKENS / statistics.median(times), 1)

        if args.workload:
            steps = workload["steps"]
            max_new = int(workload.get("max_new_tokens", 40))
            w_eos = {int(workload["eos"])} if "eos" in workload else eos
            for mode, reuse in (("fresh", False), ("reuse", True)):
                times, outs = [], None
                for _ in range(args.repeat):
                    dt, outs = replay(runner, steps, max_new, w_eos, reuse)
                    times.append(dt)
                result[f"workload_{mode}_s"] = round(statistics.median(times), 3)
                ref = [s.get("reference_output_ids") for s in steps]
                result[f"workload_{mode}_steps_matching_reference"] = sum(
                    1 for o, r in zip(outs, ref) if r is not None and o == r)
                result[f"workload_{mode}_new_tokens"] = [len(o) for o in outs]
            result["workload_steps"] = len(steps)
        print(json.dumps(result))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
