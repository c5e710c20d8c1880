#!/usr/bin/env python3
"""Serves a GGUF model with llama.cpp's own OpenAI-compatible server, in
process (the pinned `xllamacpp` package), for the served-provider tests and
`wma eval` on a served model.

Usage: serve_llamacpp.py GGUF [--port N] [--ctx N] [--threads N] [--parallel N]

Port 0 (the default) picks a free loopback port. When the server answers,
one line goes to stdout:  ready http://127.0.0.1:PORT
It serves until the process is killed (SIGTERM/SIGINT) or, when stdin is a
pipe, until the pipe closes (so a test that dies takes its server with it).
"""

import argparse
import os
import signal
import socket
import stat
import sys
import threading


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ctx", type=int, default=2048, help="context size (n_ctx)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--parallel", type=int, default=1, help="slots (requests at once)")
    args = parser.parse_args()
    if not os.path.isfile(args.gguf):
        print(f"no GGUF at {args.gguf}", file=sys.stderr)
        return 2

    import xllamacpp  # imported late so that --help works without it

    params = xllamacpp.CommonParams()
    params.model.path = args.gguf
    params.port = args.port or free_port()
    params.hostnames = ["127.0.0.1"]
    params.n_ctx = args.ctx * args.parallel
    params.n_parallel = args.parallel
    # The model's own chat template (tools included) and llama.cpp's
    # extra endpoints: /props tells the context size, /tokenize counts.
    params.use_jinja = True
    params.endpoint_props = True
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    server = xllamacpp.Server(params)
    print(f"ready http://127.0.0.1:{params.port}", flush=True)

    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())

    def watch_stdin():
        # The parent closes stdin (or dies): stop serving.
        try:
            while sys.stdin.read(4096):
                pass
        except Exception:
            pass
        done.set()

    if stat.S_ISFIFO(os.fstat(0).st_mode):
        threading.Thread(target=watch_stdin, daemon=True).start()
    done.wait()
    del server
    return 0


if __name__ == "__main__":
    sys.exit(main())
