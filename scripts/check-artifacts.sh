#!/usr/bin/env bash
# Checks a built libfmha.so for what every release must satisfy:
#
#   all backends  only fmha_* symbols exported (nm -D --defined-only); soname libfmha.so.0
#   cuda          an sm_XX cubin for every arch of FMHA_CUDA_ARCHS (default 90a) (cuobjdump --list-elf)
#   rocm          a gfxNNN code object for every arch of FMHA_HIP_ARCHS (default gfx942,gfx950) in the
#                 .hip_fatbin section, and no scratch: every kernel has .private_segment_fixed_size 0
#                 and no SGPR/VGPR spills (llvm-readelf --notes on each extracted code object); forward
#                 and dq_dk_dv kernels for every arch, and MFMA instructions in the ISA (llvm-objdump -d);
#                 the fp8 kv-cache kernels' v_mfma_*fp8* instructions all inside a loop; and prints per
#                 arch and kernel: VGPRs, AGPRs, SGPRs, LDS bytes, workgroup size, the occupancy those
#                 allow (waves per SIMD, from the registers and the LDS alone), and its main loop's
#                 instruction mix: the v_mfma count against the loop's other instructions (a static
#                 bound on MFMA utilization, not a measurement)
#
# Usage: scripts/check-artifacts.sh host|cuda|rocm path/to/libfmha.so
#
# Tools: nm, readelf, objcopy (binutils); cuobjdump (CUDA; .toolchains/cuda or PATH);
# clang-offload-bundler-22 and llvm-readelf-22 (llvm-22 / clang-22), or their $ROCM_PATH/llvm versions.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
failures=0

ok() { printf '  ok    %s\n' "$*"; }
fail() {
    printf '  FAIL  %s\n' "$*" >&2
    failures=$((failures + 1))
}

find_tool() { # find_tool NAME CANDIDATE...: the first candidate that runs
    local name=$1 candidate
    shift
    for candidate in "$@"; do
        if [[ -n "$candidate" ]] && command -v "$candidate" >/dev/null 2>&1; then
            command -v "$candidate"
            return 0
        fi
    done
    echo "check-artifacts: $name not found (tried: $*); run scripts/setup-toolchains.sh" >&2
    return 1
}

# Only fmha_* symbols are exported.
check_exports() {
    local lib=$1 others
    others=$(nm -D --defined-only "$lib" | awk 'NF >= 3 { print $3 }' | grep -v '^fmha_' || true)
    if [[ -n "$others" ]]; then
        fail "exports symbols other than fmha_*: $(echo "$others" | head -n 10 | tr '\n' ' ')"
    else
        ok "exports only fmha_* ($(nm -D --defined-only "$lib" | grep -c ' fmha_') symbols)"
    fi
}

check_soname() {
    local lib=$1 soname
    soname=$(readelf -d "$lib" | sed -n 's/.*Library soname: \[\(.*\)\].*/\1/p')
    if [[ "$soname" == "libfmha.so.0" ]]; then
        ok "soname $soname"
    else
        fail "soname is '$soname', expected libfmha.so.0"
    fi
}

# An sm_<arch> cubin for every CUDA arch of the build.
check_cuda_cubins() {
    local lib=$1 cuobjdump listing arch
    cuobjdump=$(find_tool cuobjdump "${CUDA_HOME:+$CUDA_HOME/bin/cuobjdump}" \
        "$repo/.toolchains/cuda/nvidia/cu13/bin/cuobjdump" cuobjdump)
    listing=$("$cuobjdump" --list-elf "$lib" 2>&1 || true)
    for arch in $(echo "${FMHA_CUDA_ARCHS:-90a}" | tr ',' ' '); do
        if grep -q "\.sm_${arch}\.cubin" <<<"$listing"; then
            ok "cubin for sm_$arch: $(grep "\.sm_${arch}\.cubin" <<<"$listing" | head -n 1 | sed 's/^ *//')"
        else
            fail "no sm_$arch cubin in $lib; cuobjdump --list-elf says: $listing"
        fi
    done
}

# Splits the .hip_fatbin section into its clang offload bundles (one per translation unit) and
# unbundles every amdgcn code object into DIR as <n>-<arch>.co. Prints the bundle ids found.
extract_hip_code_objects() {
    local lib=$1 dir=$2 bundler offsets i start end size targets target n=0
    bundler=$(find_tool clang-offload-bundler "${ROCM_PATH:+$ROCM_PATH/llvm/bin/clang-offload-bundler}" \
        clang-offload-bundler-22 clang-offload-bundler)
    objcopy -O binary --only-section=.hip_fatbin "$lib" "$dir/fatbin.bin"
    [[ -s "$dir/fatbin.bin" ]] || { echo "no .hip_fatbin section" >&2; return 1; }
    mapfile -t offsets < <(grep -obUa '__CLANG_OFFLOAD_BUNDLE__' "$dir/fatbin.bin" | cut -d: -f1)
    [[ ${#offsets[@]} -gt 0 ]] || { echo "no offload bundle in .hip_fatbin" >&2; return 1; }
    size=$(stat -c %s "$dir/fatbin.bin")
    for i in "${!offsets[@]}"; do
        start=${offsets[$i]}
        end=${offsets[$((i + 1))]:-$size}
        tail -c +"$((start + 1))" "$dir/fatbin.bin" | head -c "$((end - start))" >"$dir/bundle$i.bin"
        targets=$("$bundler" --list --type=o --input="$dir/bundle$i.bin")
        for target in $targets; do
            echo "$target"
            case "$target" in
                hip*-amdgcn-amd-amdhsa--*)
                    n=$((n + 1))
                    "$bundler" --unbundle --type=o --input="$dir/bundle$i.bin" --targets="$target" \
                        --output="$dir/$i-${target##*--}.co"
                    ;;
            esac
        done
    done
}

# Per kernel of an AMD code object, from its metadata: "<name> <private_segment_fixed_size> <sgpr_spills>
# <vgpr_spills> <vgpr> <agpr> <sgpr> <lds bytes> <workgroup size>" (.vgpr_count is the unified total:
# arch VGPRs rounded to 4, then the AGPRs).
kernel_metadata() {
    local readelf
    readelf=$(find_tool llvm-readelf "${ROCM_PATH:+$ROCM_PATH/llvm/bin/llvm-readelf}" llvm-readelf-22 llvm-readelf)
    "$readelf" --notes "$1" | awk '
        function out() { if (name != "") print name, priv, sgpr_spill, vgpr_spill, vgpr, agpr, sgpr, lds, wg; name = "" }
        /^  - / { out(); priv = sgpr_spill = vgpr_spill = vgpr = agpr = sgpr = lds = wg = "?" }
        /^    \.name:/ { name = $2 }
        /^  - \.name:/ { name = $3 }
        /\.private_segment_fixed_size:/ { priv = $NF }
        /\.sgpr_spill_count:/ { sgpr_spill = $NF }
        /\.vgpr_spill_count:/ { vgpr_spill = $NF }
        /\.vgpr_count:/ { vgpr = $NF }
        /\.agpr_count:/ { agpr = $NF }
        /\.sgpr_count:/ { sgpr = $NF }
        /\.group_segment_fixed_size:/ { lds = $NF }
        /\.max_flat_workgroup_size:/ { wg = $NF }
        /^amdhsa\.target:/ { out() }
        END { out() }
    '
}

# No kernel uses scratch memory (register spills or stack): scratch is slow on every AMD GPU.
check_no_scratch() {
    local co=$1 line name priv sgpr vgpr kernels=0 bad=0
    while read -r name priv sgpr vgpr _; do
        kernels=$((kernels + 1))
        if [[ "$priv" != 0 || "$sgpr" != 0 || "$vgpr" != 0 ]]; then
            fail "$(basename "$co"): kernel $name uses scratch: private_segment_fixed_size=$priv sgpr_spill_count=$sgpr vgpr_spill_count=$vgpr"
            bad=$((bad + 1))
        fi
    done < <(kernel_metadata "$co")
    if [[ $kernels -eq 0 ]]; then
        fail "$(basename "$co"): no kernels found in the code object metadata"
    elif [[ $bad -eq 0 ]]; then
        ok "$(basename "$co"): $kernels kernel(s), no scratch, no spills"
    fi
}

check_hip_code_objects() {
    local lib=$1 dir ids arch co
    dir=$(mktemp -d)
    if ! ids=$(extract_hip_code_objects "$lib" "$dir"); then
        fail "cannot extract the HIP code objects of $lib"
        rm -rf "$dir"
        return
    fi
    for arch in $(echo "${FMHA_HIP_ARCHS:-gfx942,gfx950}" | tr ',' ' '); do
        if grep -q -- "-amdgcn-amd-amdhsa--$arch\$" <<<"$ids"; then
            ok "code object for $arch ($(grep -c -- "-amdgcn-amd-amdhsa--$arch\$" <<<"$ids") bundle(s))"
        else
            fail "no amdgcn-amd-amdhsa--$arch code object in .hip_fatbin; bundle ids: $(echo "$ids" | sort -u | tr '\n' ' ')"
        fi
    done
    for co in "$dir"/*.co; do
        [[ -e "$co" ]] && check_no_scratch "$co"
    done
    check_mfma "$dir"
    check_fp8_mfma "$dir"
    report_kernels "$dir"
    rm -rf "$dir"
}

# check_mfma DIR: every arch has the attention kernels on the matrix cores: forward and dq_dk_dv kernels
# in its code objects (kernel names from llvm-readelf --notes) and v_mfma instructions in their ISA.
check_mfma() {
    local dir=$1 arch objdump count co kernels forward backward
    objdump=$(find_tool llvm-objdump "${ROCM_PATH:+$ROCM_PATH/llvm/bin/llvm-objdump}" llvm-objdump-22 llvm-objdump)
    for arch in $(echo "${FMHA_HIP_ARCHS:-gfx942,gfx950}" | tr ',' ' '); do
        count=0
        kernels=""
        for co in "$dir"/*-"$arch".co; do
            [[ -e "$co" ]] || continue
            count=$((count + $("$objdump" -d --mcpu="$arch" "$co" | grep -c 'v_mfma' || true)))
            kernels+=$(kernel_metadata "$co" | cut -d' ' -f1)$'\n'
        done
        forward=$(grep -c 'forward_kernel_amd' <<<"$kernels" || true)
        backward=$(grep -c 'dq_dk_dv_kernel_amd' <<<"$kernels" || true)
        if [[ $count -gt 0 && $forward -gt 0 && $backward -gt 0 ]]; then
            ok "$arch: $forward forward and $backward dq_dk_dv kernels, $count v_mfma instructions"
        else
            fail "$arch: $forward forward and $backward dq_dk_dv kernels, $count v_mfma instructions (want all > 0)"
        fi
    done
}

# Per kernel of a disassembly (llvm-objdump -d) whose name matches the regex `pattern`, its instructions
# whose mnemonic matches `insn`: how many lie inside a loop (from a backward branch's target to the
# branch) and how many there are; and its main loop, the innermost holding the most of them (among
# loops with as many, the fewest instructions): how many it holds, and all its instructions. Prints
# "<name> <in_loops> <total> <main_loop> <main_loop_instructions>" per kernel (mawk: no strtonum, so hex
# is parsed by hand).
loop_counts() {
    awk -v pattern="$1" -v insn="$2" '
        function hex(s,   v, i) {
            v = 0; s = tolower(s)
            for (i = 1; i <= length(s); i++) v = v * 16 + index("0123456789abcdef", substr(s, i, 1)) - 1
            return v
        }
        function flush(   i, j, m, k, inside, total, best_m, best_k) {
            if (!active) return
            inside = 0; total = 0
            for (i = 0; i < n; i++) {
                if (!hit[i]) continue
                total++
                for (j = 0; j < loops; j++) if (at[i] >= lo[j] && at[i] <= hi[j]) { inside++; break }
            }
            best_m = 0; best_k = 0
            for (j = 0; j < loops; j++) {
                m = 0; k = 0
                for (i = 0; i < n; i++) if (at[i] >= lo[j] && at[i] <= hi[j]) { k++; if (hit[i]) m++ }
                if (m > best_m || (m == best_m && m > 0 && k < best_k)) { best_m = m; best_k = k }
            }
            print name, inside, total, best_m, best_k
            active = 0
        }
        /^[0-9a-f]+ <[^>]+>:$/ {
            flush()
            name = $2; gsub(/[<>:]/, "", name); start = hex($1); n = 0; loops = 0; active = (name ~ pattern)
            next
        }
        active && /\/\/ [0-9A-F]+:/ {
            match($0, /\/\/ [0-9A-F]+:/); addr = hex(substr($0, RSTART + 3, RLENGTH - 4))
            at[n] = addr; hit[n] = ($1 ~ insn); n++
            if ($1 ~ /^s_(c)?branch/ && match($0, /\+0x[0-9a-f]+>/)) {
                target = start + hex(substr($0, RSTART + 3, RLENGTH - 4))
                if (target < addr) { lo[loops] = target; hi[loops] = addr; loops++ }
            }
        }
        END { flush() }
    '
}

# report_kernels DIR: the table of every attention kernel (not the small fill/prepare/zeroing ones) of
# every arch. The metadata's .vgpr_count is the unified total (arch VGPRs rounded to 4, then the AGPRs).
# Occupancy, CDNA3/CDNA4 rules: a SIMD holds 512 registers per lane for its waves (each wave's total in
# granules of 8) and at most 8 waves; a workgroup's waves spread over the CU's 4 SIMDs, which share its
# LDS (64 KiB on gfx942, 160 KiB on gfx950).
report_kernels() {
    local dir=$1 arch objdump demangle co lds_total
    objdump=$(find_tool llvm-objdump "${ROCM_PATH:+$ROCM_PATH/llvm/bin/llvm-objdump}" llvm-objdump-22 llvm-objdump)
    demangle=$(find_tool llvm-cxxfilt "${ROCM_PATH:+$ROCM_PATH/llvm/bin/llvm-cxxfilt}" llvm-cxxfilt-22 llvm-cxxfilt c++filt)
    for arch in $(echo "${FMHA_HIP_ARCHS:-gfx942,gfx950}" | tr ',' ' '); do
        lds_total=65536
        [[ $arch == gfx950 ]] && lds_total=163840
        echo "  $arch kernels: registers and LDS bytes from the code object, the waves per SIMD they allow"
        echo "  (registers / LDS), and the main loop's v_mfma and other instructions (counts, not cycles)"
        printf '    %-5s %-5s %-5s %-7s %-4s %-12s %-16s %s\n' VGPR AGPR SGPR LDS WG "waves/SIMD" "loop mfma+other" kernel
        for co in "$dir"/*-"$arch".co; do
            [[ -e "$co" ]] || continue
            join <(kernel_metadata "$co" | sort) \
                <("$objdump" -d --mcpu="$arch" "$co" | loop_counts 'kernel_amd' '^v_mfma' | sort)
        done | sort -u | while read -r name _ _ _ vgpr agpr sgpr lds wg _ _ mfma total; do
            local regs waves_regs waves_per_wg wgs_lds waves_lds waves
            regs=$(( (vgpr + 7) / 8 * 8 ))
            waves_regs=$(( regs > 0 ? 512 / regs : 8 ))
            (( waves_regs > 8 )) && waves_regs=8
            waves_per_wg=$(( (wg + 63) / 64 ))
            if (( lds > 0 )); then
                wgs_lds=$(( lds_total / lds ))
                waves_lds=$(( wgs_lds * waves_per_wg / 4 ))
            else
                waves_lds=8
            fi
            waves=$(( waves_regs < waves_lds ? waves_regs : waves_lds ))
            printf '    %-5s %-5s %-5s %-7s %-4s %-12s %-16s %s\n' "$((vgpr - agpr))" "$agpr" "$sgpr" "$lds" "$wg" \
                "$waves ($waves_regs/$waves_lds)" "$mfma+$((total - mfma))" \
                "$("$demangle" "$name" | sed 's/^void //; s/fmha:://g; s/arch:://g; s/(.*$//')"
        done
    done
}

# check_fp8_mfma DIR: the fp8 kv-cache kernels (forward_kernel_amd<Fp8E4m3, ...>) of every arch compute
# on the 8-bit MFMA inside their mainloop: v_mfma_*fp8* instructions, all of them within a loop.
check_fp8_mfma() {
    local dir=$1 arch objdump co report kernels bad
    objdump=$(find_tool llvm-objdump "${ROCM_PATH:+$ROCM_PATH/llvm/bin/llvm-objdump}" llvm-objdump-22 llvm-objdump)
    for arch in $(echo "${FMHA_HIP_ARCHS:-gfx942,gfx950}" | tr ',' ' '); do
        report=""
        for co in "$dir"/*-"$arch".co; do
            [[ -e "$co" ]] || continue
            report+=$("$objdump" -d --mcpu="$arch" "$co" | loop_counts 'forward_kernel_amd.*Fp8E4m3' '^v_mfma.*fp8')
            report+=$'\n'
        done
        kernels=$(awk 'NF == 5' <<<"$report" | wc -l)
        bad=$(awk 'NF == 5 && ($3 == 0 || $2 != $3)' <<<"$report" | wc -l)
        if [[ $kernels -gt 0 && $bad -eq 0 ]]; then
            ok "$arch: $kernels fp8 kv-cache kernel(s), every one with its v_mfma fp8 instructions in a loop ($(awk 'NF == 5 { print $3; exit }' <<<"$report") each)"
        else
            fail "$arch: fp8 kv-cache kernels without fp8 MFMA in their loops (name in_loop total): $(tr '\n' ' ' <<<"$report")"
        fi
    done
}

main() {
    [[ $# -eq 2 ]] || { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 2; }
    local backend=$1 lib=$2
    [[ -f "$lib" ]] || { echo "check-artifacts: $lib does not exist" >&2; exit 2; }
    echo "check-artifacts: $backend: $lib"
    check_exports "$lib"
    check_soname "$lib"
    case "$backend" in
        host) ;;
        cuda) check_cuda_cubins "$lib" ;;
        rocm) check_hip_code_objects "$lib" ;;
        *) echo "check-artifacts: unknown backend $backend" >&2; exit 2 ;;
    esac
    if [[ $failures -gt 0 ]]; then
        echo "check-artifacts: $failures check(s) failed" >&2
        exit 1
    fi
}

main "$@"
