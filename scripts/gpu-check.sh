#!/usr/bin/env bash
# GPU checks of fmha, in two halves: build here (no GPU needed), run on the GPU machine (no Rust needed).
#
#   scripts/gpu-check.sh build
#       On the build machine (Debian 12 with scripts/setup-toolchains.sh done): builds the cuda backend
#       (CUDA_HOME from `scripts/setup-toolchains.sh --env`; CARGO_TARGET_DIR=target/cuda cargo build
#       --release --features cuda) and the cuda Rust test executables (cargo test --release --features cuda
#       --no-run), and fills the git-ignored .devbuild/ with what the GPU machine runs:
#         libfmha.so.0            the cuda cdylib
#         runtime_api, async_prepare, attention_api, forward, backward, hardening, kvcache, merge, …,
#                                 unittests (the lib's unit tests): Rust test executables, named by test target (the source
#                                 checks header_drift, kernel_abi and layers need the build tree and are
#                                 left out)
#         quickstart              the Rust example (varlen causal GQA forward + deterministic backward)
#         fmha-bench              the benchmark tool (tools/fmha-bench), cuda backend
#         00_version ... 04_*     the C examples, gcc -I include against libfmha.so.0, rpath $ORIGIN, -lm
#         wheels/                 pytest and its pure-Python dependencies (the GPU machine has no registry)
#         native_autograd-<v>.so  the C++ autograd operator for torch <v> (python/fmha/_native.py), when
#                                 python3 imports torch here or TORCH_DIR names a torch package folder
#         MANIFEST, BUILD_INFO    what is there and what it was built from (commit, date, toolchain)
#       Executables are stripped; the folder must stay under 60 MB (it travels with the working tree).
#
#   scripts/gpu-check.sh run [--bench] [--bench-only] [--quick]
#       On the GPU machine, from the repo root: prints GPU, driver, CUDA and torch versions; runs the Rust
#       test executables, the quickstart and the C examples from .devbuild; then
#         FMHA_LIBRARY=.devbuild/libfmha.so.0 python3 -m pytest -q tests/python
#       (all failures reported, JUnit XML and the log under $OUT when set); with --bench the benchmark
#       (python3 bench/attention.py --backward, results into $OUT); prints a summary table last and exits
#       non-zero when anything failed. --quick: the Python tests on their small (CPU-sized) grid and the
#       benchmark on its quick grid. --bench-only: just the versions and the benchmark (to split a long
#       check over two calls of a machine with a per-command time limit).
#       $OUT unset: the logs go to a fresh folder under /tmp (printed).
#
# Environment:
#   build: FMHA_CUDA_TARGET_DIR (default target/cuda), FMHA_CUDA_ARCHS (default 90a), CC (default gcc), TORCH_DIR,
#          FMHA_GPU_TESTS (space-separated test targets to carry; default all but the source checks)
#   run:   FMHA_GPU_CHECK_TIMEOUT (seconds per stage, default 900), FMHA_GPU_TEST_TIMEOUT (seconds per Rust
#          test and per Python test, default 180), PYTEST_ADDOPTS (extra pytest options)
#
# Typical use with this workplace's device tool: `scripts/gpu-check.sh build` here, then on the device
# `scripts/gpu-check.sh run --bench` carrying .devbuild.
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
devbuild=$repo/.devbuild
size_limit_mb=60

usage() {
    sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
}

log() { printf '\n== %s\n' "$*"; }
die() {
    printf 'gpu-check: %s\n' "$*" >&2
    exit 1
}

# --- build ---------------------------------------------------------------------------------------------

cmd_build() {
    set -e
    local target_dir=${FMHA_CUDA_TARGET_DIR:-target/cuda}
    eval "$(scripts/setup-toolchains.sh --env)"
    command -v nvcc >/dev/null || die "nvcc not found (CUDA_HOME=$CUDA_HOME): run scripts/setup-toolchains.sh first"
    command -v python3 >/dev/null || die "python3 is needed to read cargo's JSON messages"
    local cc=${CC:-gcc}
    export CARGO_TARGET_DIR=$target_dir

    log "cargo build --release --features cuda (CARGO_TARGET_DIR=$target_dir, CUDA_HOME=$CUDA_HOME)"
    cargo build --release --features cuda --lib --example quickstart
    cargo build --release -p fmha-bench --features cuda

    log "cargo test --release --features cuda --no-run"
    local messages
    messages=$(mktemp)
    cargo test --release --features cuda --no-run --message-format=json-render-diagnostics >"$messages"

    rm -rf "$devbuild"
    mkdir -p "$devbuild/wheels"
    cp "$target_dir/release/libfmha.so" "$devbuild/libfmha.so.0"
    cp "$target_dir/release/examples/quickstart" "$devbuild/quickstart"
    cp "$target_dir/release/fmha-bench" "$devbuild/fmha-bench"
    # Test executables by target name: integration tests by their file name, the lib's as "unittests".
    FMHA_GPU_TESTS=${FMHA_GPU_TESTS:-} python3 - "$messages" "$devbuild" <<'EOF'
import json, os, shutil, sys
messages, out = sys.argv[1], sys.argv[2]
# Source checks (the generated headers against OUT_DIR, the module layering): they read the build tree
# and are backend-independent, so CI runs them and the GPU machine does not need them.
skip = {"header_drift", "kernel_abi", "layers"}
only = set(os.environ.get("FMHA_GPU_TESTS", "").split())
names = []
for line in open(messages):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable") or not m.get("profile", {}).get("test"):
        continue
    target = m["target"]
    if "test" in target["kind"]:
        name = target["name"]
    elif "lib" in target["kind"] or "cdylib" in target["kind"] or "rlib" in target["kind"]:
        name = "unittests"
    else:
        continue
    if name in skip or (only and name not in only):
        continue
    shutil.copy(m["executable"], f"{out}/{name}")
    names.append(name)
with open(f"{out}/MANIFEST", "a") as f:
    for name in sorted(set(names)):
        f.write(f"rust-test {name}\n")
print("test executables:", " ".join(sorted(set(names))))
EOF
    rm -f "$messages"
    echo "example quickstart" >>"$devbuild/MANIFEST"
    echo "tool fmha-bench" >>"$devbuild/MANIFEST"

    log "C examples ($cc, -I include, rpath \$ORIGIN)"
    local src name
    for src in c_examples/[0-9]*.c; do
        name=$(basename "$src" .c)
        "$cc" -std=c99 -O2 -Wall -Wextra -Werror -I include -I c_examples "$src" -o "$devbuild/$name" \
            -L"$devbuild" -l:libfmha.so.0 -Wl,-rpath,'$ORIGIN' -lm
        echo "c-example $name" >>"$devbuild/MANIFEST"
        echo "  $name"
    done

    if [[ -n ${TORCH_DIR:-} ]] || python3 -c 'import torch' 2>/dev/null; then
        log "the C++ autograd operator (scripts/build-native-autograd.sh, TORCH_DIR=${TORCH_DIR:-unset: the torch python3 imports})"
        scripts/build-native-autograd.sh "$devbuild"
        echo "native-autograd $(basename "$devbuild"/native_autograd-*.so)" >>"$devbuild/MANIFEST"
    else
        log "the C++ autograd operator: not built (no torch here; TORCH_DIR names a torch package folder)"
    fi

    log "pytest wheels (pure Python, for the GPU machine's python3)"
    python3 -m pip download -q --no-deps --only-binary=:all: -d "$devbuild/wheels" \
        pytest pluggy iniconfig packaging pytest-timeout
    ls "$devbuild/wheels"

    strip --strip-unneeded "$devbuild/libfmha.so.0"
    for name in $(awk '$1 != "c-example" {print $2}' "$devbuild/MANIFEST"); do
        strip --strip-debug "$devbuild/$name"
    done

    {
        echo "commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo -dirty)"
        echo "date=$(date -u '+%Y-%m-%d %H:%M UTC')"
        echo "archs=${FMHA_CUDA_ARCHS:-90a}"
        echo "rustc=$(rustc --version)"
        echo "nvcc=$(nvcc --version | tail -n 1)"
    } >"$devbuild/BUILD_INFO"

    local kb
    kb=$(du -sk "$devbuild" | cut -f1)
    log ".devbuild: $((kb / 1024)) MB (limit ${size_limit_mb} MB)"
    du -sh "$devbuild"/* | sort -h | tail -n 20
    cat "$devbuild/BUILD_INFO"
    if ((kb >= size_limit_mb * 1024)); then
        die ".devbuild is $((kb / 1024)) MB, over the ${size_limit_mb} MB the device transfer allows"
    fi
    echo "ok: carry .devbuild to the GPU machine and run scripts/gpu-check.sh run [--bench]"
}

# --- run ------------------------------------------------------------------------------------------------

summary_names=()
summary_results=()
summary_seconds=()
failed_tests=()
failures=0

# record NAME RESULT SECONDS
record() {
    summary_names+=("$1")
    summary_results+=("$2")
    summary_seconds+=("$3")
    case "$2" in
        pass* | skip*) ;;
        *) failures=$((failures + 1)) ;;
    esac
}

# stage NAME CMD...: runs CMD with a timeout, tees its output into the log, records pass/fail
# (exit 77 = skipped, as ctest's SKIP_RETURN_CODE in c_examples/).
stage() {
    local name=$1
    shift
    log "$name: $*"
    local started rc
    started=$(date +%s)
    timeout --kill-after=30 "${FMHA_GPU_CHECK_TIMEOUT:-900}" "$@"
    rc=$?
    local took=$(($(date +%s) - started))
    if ((rc == 0)); then
        record "$name" pass "$took"
    elif ((rc == 77)); then
        record "$name" "skip (77)" "$took"
    elif ((rc == 124 || rc == 137)); then
        record "$name" "FAIL (timeout)" "$took"
    else
        record "$name" "FAIL (exit $rc)" "$took"
    fi
    return 0
}

# rust_tests NAME: every test of the Rust test executable NAME in a process of its own, under a timeout,
# so that a hang is reported with the test's name; one summary line for the executable.
rust_tests() {
    local name=$1 bin=$devbuild/$1 limit=${FMHA_GPU_TEST_TIMEOUT:-180}
    log "rust test $name: each test alone, ${limit} s each"
    local tests started rc test failed=() count=0
    started=$(date +%s)
    tests=$("$bin" --list --format terse 2>/dev/null | sed -n 's/: test$//p')
    for test in $tests; do
        count=$((count + 1))
        timeout --kill-after=10 "$limit" "$bin" --exact "$test" --test-threads=1 --nocapture
        rc=$?
        if ((rc == 124 || rc == 137)); then
            failed+=("$test (hang: timeout ${limit} s)")
            echo "gpu-check: $name::$test did not finish within ${limit} s"
        elif ((rc != 0)); then
            failed+=("$test (exit $rc)")
        fi
    done
    local took=$(($(date +%s) - started))
    if ((${#failed[@]} == 0)); then
        record "rust test $name" "pass ($count tests)" "$took"
    else
        record "rust test $name" "FAIL ${#failed[@]}/$count" "$took"
        for test in "${failed[@]}"; do failed_tests+=("$name::$test"); done
    fi
}

print_versions() {
    log "versions"
    date -u
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    else
        echo "nvidia-smi: not found"
    fi
    command -v nvcc >/dev/null && nvcc --version | tail -n 1
    python3 - <<'EOF'
import platform
try:
    import torch
    cuda = torch.cuda.is_available()
    print(f"python {platform.python_version()}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"cuDNN {torch.backends.cudnn.version() if cuda else None}, GPU {torch.cuda.get_device_name() if cuda else None}")
except Exception as e:
    print(f"python {platform.python_version()}, torch: not usable ({e})")
try:
    import triton
    print(f"triton {triton.__version__}")
except Exception:
    print("triton: not installed")
EOF
    [[ -f "$devbuild/BUILD_INFO" ]] && sed 's/^/build: /' "$devbuild/BUILD_INFO"
    echo "C++ autograd operator: ${FMHA_NATIVE_AUTOGRAD:-none carried for this torch}"
    return 0
}

# pytest from the carried wheels when python3 has none.
ensure_pytest() {
    python3 -c 'import pytest' 2>/dev/null && return 0
    local site=/tmp/fmha-gpu-check-site
    if compgen -G "$devbuild/wheels/*.whl" >/dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
            "$devbuild"/wheels/*.whl || return 1
        export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
        python3 -c 'import pytest' 2>/dev/null && return 0
    fi
    echo "gpu-check: pytest is not installed and .devbuild/wheels has none (run scripts/gpu-check.sh build)"
    return 1
}

print_summary() {
    local i
    printf '\n== summary (%s)\n' "$(date -u '+%Y-%m-%d %H:%M UTC')"
    printf '| %-40s | %-16s | %7s |\n' "check" "result" "seconds"
    printf '|%s|%s|%s|\n' "------------------------------------------" "------------------" "---------"
    for i in "${!summary_names[@]}"; do
        printf '| %-40s | %-16s | %7s |\n' "${summary_names[$i]}" "${summary_results[$i]}" "${summary_seconds[$i]}"
    done
    for i in "${!failed_tests[@]}"; do
        printf '  failed: %s\n' "${failed_tests[$i]}"
    done
    if ((failures > 0)); then
        printf '%d check(s) FAILED\n' "$failures"
    else
        printf 'all checks passed\n'
    fi
}

cmd_run() {
    local bench=0 bench_only=0 quick=0 arg
    for arg in "$@"; do
        case "$arg" in
            --bench) bench=1 ;;
            --bench-only) bench=1 bench_only=1 ;;
            --quick) quick=1 ;;
            *) die "run: unknown argument $arg (use --bench, --bench-only, --quick)" ;;
        esac
    done
    [[ -f "$devbuild/libfmha.so.0" && -f "$devbuild/MANIFEST" ]] ||
        die "no .devbuild/libfmha.so.0 or MANIFEST: run 'scripts/gpu-check.sh build' on the build machine and carry .devbuild"

    local out=${OUT:-}
    if [[ -z "$out" ]]; then
        out=$(mktemp -d /tmp/gpu-check.XXXXXX)
    fi
    mkdir -p "$out" || die "cannot create $out"
    # Everything printed also goes to $out/gpu-check.log; the exit status is run_checks'.
    run_checks "$out" "$bench" "$bench_only" "$quick" 2>&1 | tee "$out/gpu-check.log"
    return "${PIPESTATUS[0]}"
}

# run_checks OUT BENCH BENCH_ONLY QUICK
run_checks() {
    local out=$1 bench=$2 bench_only=$3 quick=$4
    echo "gpu-check run: logs in $out"
    export PYTHONUNBUFFERED=1
    export FMHA_LIBRARY=$devbuild/libfmha.so.0
    # The C++ autograd operator carried for this machine's torch, if any (python/fmha/_native.py).
    local torch_version
    torch_version=$(python3 -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null)
    if [[ -n $torch_version && -f $devbuild/native_autograd-$torch_version.so ]]; then
        export FMHA_NATIVE_AUTOGRAD=$devbuild/native_autograd-$torch_version.so
    fi

    print_versions

    if ((bench_only == 0)); then
        local kind name
        while read -r kind name; do
            [[ "$kind" == rust-test ]] || continue
            rust_tests "$name"
        done <"$devbuild/MANIFEST"
        while read -r kind name; do
            case "$kind" in
                example) stage "example $name" "$devbuild/$name" ;;
                c-example) stage "C example $name" "$devbuild/$name" ;;
            esac
        done <"$devbuild/MANIFEST"

        if ensure_pytest; then
            local quick_env=()
            ((quick)) && quick_env=(env FMHA_TEST_QUICK=1)
            stage "pytest tests/python" "${quick_env[@]}" python3 -m pytest -q -p no:cacheprovider -rs --tb=short \
                --timeout "${FMHA_GPU_TEST_TIMEOUT:-180}" --junitxml="$out/pytest-junit.xml" -o junit_family=xunit2 \
                tests/python
        else
            record "pytest tests/python" "FAIL (no pytest)" 0
        fi
    fi

    if ((bench)); then
        local bargs=(--backward --out "$out")
        ((quick)) && bargs+=(--quick)
        stage "bench/attention.py --backward$( ((quick)) && echo ' --quick')" python3 bench/attention.py "${bargs[@]}"
    fi

    print_summary | tee "$out/summary.txt"
    ((failures == 0))
}

case "${1:-}" in
    build)
        shift
        (($# == 0)) || die "build takes no arguments"
        cmd_build
        ;;
    run)
        shift
        cmd_run "$@"
        ;;
    -h | --help | help)
        usage
        ;;
    *)
        usage
        exit 2
        ;;
esac
