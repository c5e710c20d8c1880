#!/usr/bin/env python3
"""Measures llama.cpp on a GGUF file, as a reference point for the runtime's
own benchmark. The ONNX folders are converted from these GGUF files, so
both runtimes run the same weights (SmolLM2's Q4_1 blocks exactly; the
Qwen2.5 GGUF's Q5_0/Q4_K/Q6_K matrices requantized to 4-bit, see
scripts/README.md).

    python scripts/bench_llamacpp.py GGUF [--workload agent-workload-4step.json]
        [--threads 2] [--repeat 3] [--ctx 4096] [--omp-wait-policy passive]

Prints one JSON line with the keys of scripts/bench_genai.py where they
apply: decode tok/s after a short prompt, prefill time for a 511-token
prompt and, with --workload, the total seconds to replay a multi-step agent
workload (each step: greedy from its prompt_ids, stop at an end-of-generation
token or max_new_tokens), once with llama.cpp's prompt cache off for every
step ("fresh") and once with it on ("reuse": one slot, `cache_prompt`, so a
step reuses the longest common prefix of the previous step's tokens).

llama.cpp runs in this process through the pinned `xllamacpp` package (as
scripts/serve_llamacpp.py starts it; scripts/install-peers.sh installs it)
with one slot, and is asked over its own HTTP `/completion` endpoint with
token ids as the prompt, so it sees exactly the tokens the other runtimes
see. Decode and prefill speed are llama.cpp's own `timings`; the workload
is wall time around the requests.

The pinned wheel's CPU build runs its threads with OpenMP, whose threads
spin while they wait for each other at the end of every operation. On a
machine whose cores are busy with other work, a spinning thread holds a
core the other thread needs: on the 2-core machine of docs/providers.md,
loaded with other work, decode ran at 2 to 7 tok/s instead of about 40;
`--omp-wait-policy passive` (OMP_WAIT_POLICY) makes them sleep instead. The
default leaves OpenMP's own policy; the JSON line says which was used.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
import urllib.request

PREFILL_TOKENS = 511
DECODE_TOKENS = 128
# The short prompt of the decode figure when there is no workload: the one
# scripts/bench_genai.py uses (ids modulo the vocabulary).
SHORT_PROMPT = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 30, 2, 198, 1, 4093, 198]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(gguf: str, threads: int, ctx: int):
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = gguf
    params.port = free_port()
    params.hostnames = ["127.0.0.1"]
    params.n_ctx = ctx
    params.n_parallel = 1
    params.endpoint_props = True
    # No host-memory copies of past prompts: with one slot, "reuse" is the
    # slot's own longest common prefix, and "fresh" really recomputes.
    params.cache_ram_mib = 0
    if threads:
        params.cpuparams.n_threads = threads
        params.cpuparams_batch.n_threads = threads
    server = xllamacpp.Server(params)
    return server, f"http://127.0.0.1:{params.port}", xllamacpp


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=60) as r:
        return json.load(r)


def wait_ready(base: str) -> None:
    deadline = time.monotonic() + 120
    while True:
        try:
            if get(base + "/health").get("status") == "ok":
                return
        except Exception:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.2)


def complete(base: str, ids: list, n_predict: int, cache: bool, ignore_eos: bool = False) -> dict:
    """One greedy /completion from token ids."""
    return post(base + "/completion", {
        "prompt": ids,
        "n_predict": n_predict,
        "cache_prompt": cache,
        "temperature": 0,
        "top_k": 1,
        "ignore_eos": ignore_eos,
        "return_tokens": True,
        "stream": False,
    })


def replay(base: str, steps: list, max_new: int, reuse: bool):
    outs, cached_tokens, prompt_tokens = [], 0, 0
    t0 = time.perf_counter()
    for i, step in enumerate(steps):
        # The first step starts from an empty cache in both modes (as the
        # other runtimes start each replay).
        resp = complete(base, step["prompt_ids"], max_new, cache=reuse and i > 0)
        t = resp.get("timings", {})
        cached_tokens += int(t.get("cache_n", 0))
        prompt_tokens += int(t.get("prompt_n", 0))
        # `tokens` ends with the end-of-generation token when generation
        # stopped on one, as the other runtimes count it. llama.cpp stops at
        # any of the model's end-of-generation tokens, not only the
        # workload's eos.
        outs.append(list(resp.get("tokens") or []))
    return time.perf_counter() - t0, outs, cached_tokens, prompt_tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf")
    ap.add_argument("--workload", help="agent workload JSON (steps[].prompt_ids, max_new_tokens, eos)")
    ap.add_argument("--threads", type=int, default=2, help="threads for prompt and decode (0: llama.cpp default)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per measurement; the median is reported")
    ap.add_argument("--ctx", type=int, default=4096, help="context size of the one slot")
    ap.add_argument("--omp-wait-policy", choices=["active", "passive"],
                    help="how llama.cpp's OpenMP threads wait (default: OMP_WAIT_POLICY as set, else OpenMP's own)")
    args = ap.parse_args()
    if not os.path.isfile(args.gguf):
        sys.exit(f"no GGUF at {args.gguf}")
    repeat = max(1, args.repeat)
    if args.omp_wait_policy:
        # Read by OpenMP when llama.cpp's library loads, so before the import.
        os.environ["OMP_WAIT_POLICY"] = args.omp_wait_policy.upper()

    workload = None
    if args.workload:
        with open(args.workload) as f:
            workload = json.load(f)

    server, base, xllamacpp = start_server(args.gguf, args.threads, args.ctx)
    wait_ready(base)
    props = get(base + "/props")
    vocab = None
    try:
        vocab = int(get(base + "/v1/models")["data"][0]["meta"]["n_vocab"])
    except Exception:
        pass
    result = {
        "runtime": "llama.cpp",
        "version": f"xllamacpp {getattr(xllamacpp, '__version__', '?')}",
        "model": os.path.basename(args.gguf),
        "threads": args.threads or None,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default").lower(),
        "n_ctx": props.get("default_generation_settings", {}).get("n_ctx"),
    }

    # Decode: a short prompt, then DECODE_TOKENS greedy tokens with eos
    # ignored, so every run times the same number of steps. llama.cpp's
    # `predicted_per_second` leaves the prompt out.
    if workload:
        short = workload["steps"][0]["prompt_ids"][:16]
    else:
        short = [t % vocab for t in SHORT_PROMPT] if vocab else SHORT_PROMPT
    complete(base, short, 8, cache=False, ignore_eos=True)  # warm-up, untimed
    rates = []
    for _ in range(repeat):
        resp = complete(base, short, DECODE_TOKENS + 1, cache=False, ignore_eos=True)
        rates.append(float(resp["timings"]["predicted_per_second"]))
    result["decode_tok_s"] = round(statistics.median(rates), 2)
    result["decode_prompt_tokens"] = len(short)

    # Prefill: PREFILL_TOKENS tokens from an empty cache, llama.cpp's own
    # prompt time.
    ids = list(range(1000, 1000 + PREFILL_TOKENS))
    if workload:
        longest = max(workload["steps"], key=lambda s: len(s["prompt_ids"]))["prompt_ids"]
        if len(longest) >= PREFILL_TOKENS:
            ids = longest[:PREFILL_TOKENS]
    times = []
    for _ in range(repeat):
        t = complete(base, ids, 1, cache=False)["timings"]
        if int(t["prompt_n"]) != len(ids):
            sys.exit(f"prefill processed {t['prompt_n']} of {len(ids)} tokens: the prompt cache was used")
        times.append(float(t["prompt_ms"]) / 1000)
    result["prefill_tokens"] = PREFILL_TOKENS
    result["prefill_s"] = round(statistics.median(times), 3)
    result["prefill_tok_s"] = round(PREFILL_TOKENS / statistics.median(times), 1)

    if workload:
        steps = workload["steps"]
        max_new = int(workload.get("max_new_tokens", 40))
        for mode, reuse in (("fresh", False), ("reuse", True)):
            runs = [replay(base, steps, max_new, reuse) for _ in range(repeat)]
            runs.sort(key=lambda r: r[0])
            dt, outs, cached, computed = runs[len(runs) // 2]
            result[f"workload_{mode}_s"] = round(dt, 3)
            ref = [s.get("reference_output_ids") for s in steps]
            result[f"workload_{mode}_steps_matching_reference"] = sum(
                1 for o, r in zip(outs, ref) if r and o == r)
            result[f"workload_{mode}_new_tokens"] = [len(o) for o in outs]
            result[f"workload_{mode}_cached_tokens"] = cached
            result[f"workload_{mode}_prompt_tokens_computed"] = computed
        result["workload_steps"] = len(steps)
    print(json.dumps(result), flush=True)
    del server


if __name__ == "__main__":
    main()
