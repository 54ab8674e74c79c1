#!/usr/bin/env bash
# nvcc, remembering what it compiled: the CUDA feature's check (scripts/check-cuda-build.sh)
# points cudaforge (candle-kernels' build helper) here through $NVCC. A kernel compile (`-c -o
# FILE` or `--ptx --output-directory DIR`) whose inputs were compiled before is answered from
# the cache; anything else, and every miss, runs the real nvcc, and only an output nvcc produced
# with success is kept. The key is nvcc's version, the arguments (output paths left out, as they
# hold the clone's target folder) and every file of the crate the kernel comes from (its
# headers), so a new candle-kernels, toolkit, architecture or flag compiles again; the toolkit's
# own headers are pinned by its version.
#
# Environment: PML_NVCC_REAL (the nvcc to run), PML_NVCC_CACHE (the cache folder).
set -euo pipefail
real="${PML_NVCC_REAL:?PML_NVCC_REAL names the real nvcc}"
cache="${PML_NVCC_CACHE:?PML_NVCC_CACHE names the cache folder}"

args=("$@")
mode="" out="" out_dir="" input=""
keyed=()
for ((i = 0; i < ${#args[@]}; i++)); do
    case "${args[i]}" in
        -c) mode=object ;;
        --ptx) mode=ptx ;;
        -o | --output-directory)
            [ "${args[i]}" = -o ] && out="${args[i + 1]:-}" || out_dir="${args[i + 1]:-}"
            keyed+=("${args[i]}" "<out>")
            i=$((i + 1))
            continue
            ;;
        *.cu) input="${args[i]}" ;;
    esac
    keyed+=("${args[i]}")
done
if [ -z "$mode" ] || [ -z "$input" ] || [ ! -f "$input" ]; then
    exec "$real" "$@"
fi
if [ "$mode" = ptx ]; then
    [ -n "$out_dir" ] || exec "$real" "$@"
    out="$out_dir/$(basename "${input%.cu}").ptx"
fi
[ -n "$out" ] || exec "$real" "$@"

# The crate folder: the nearest one above the kernel that holds a Cargo.toml.
crate="$(cd "$(dirname "$input")" && pwd)"
while [ "$crate" != / ] && [ ! -f "$crate/Cargo.toml" ]; do crate="$(dirname "$crate")"; done
key="$(
    {
        "$real" --version
        printf '%s\n' "${keyed[@]}"
        (cd "$crate" && find . -type f ! -name '.cargo-ok' -print0 | sort -z | xargs -0 sha256sum)
    } | sha256sum | cut -c1-64
)"
entry="$cache/$key"
if [ -f "$entry" ]; then
    cp "$entry" "$out"
    exit 0
fi
"$real" "$@"
mkdir -p "$cache"
cp "$out" "$entry.$$"
mv "$entry.$$" "$entry"
