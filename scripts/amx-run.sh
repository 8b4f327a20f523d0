#!/usr/bin/env bash
# Runs on a machine with AMX, from the folder `scripts/amx-bundle.sh` built (copied there as
# run.sh): the CPU report, the kernel tests on the hardware tile unit, and the prefill rows of
# `moe bench` on two pinned cores, each rung on the same weights in one process.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$here/out}
mkdir -p "$out"
moe="$here/bin/moe"
steps=${*:-cpu tests w4a8 bf16 w8a8 w4a16}
# Two cores, as the development machines have; the rows name their rung.
bench() {
    local name=$1
    shift
    echo "== $name: moe bench $*"
    timeout 240 taskset -c 0,1 "$moe" --json bench --threads 2 --iters 4 --warmup-ms 200 \
        --batch-sizes 16,256,1024 "$@" > "$out/$name.json" 2>> "$out/bench.err"
    echo "   exit $? ($(wc -c < "$out/$name.json") bytes)"
}
for step in $steps; do
    case $step in
        cpu)
            { lscpu; echo; "$moe" cpu; } > "$out/cpu.txt" 2>&1
            grep -E "Model name|^Flags" "$out/cpu.txt" | cut -c1-200
            grep -E "^(selected|  amx)" "$out/cpu.txt"
            ;;
        tests)
            for t in "$here"/tests/*; do
                echo "== $(basename "$t")"
                MOE_GOLDENS="$here/goldens" MOE_EXPECT_ISA=amx timeout 300 "$t" --test-threads 8 2>&1 \
                    | grep -E "^test result|FAILED|panicked" | head -20
            done > "$out/tests.txt"
            cat "$out/tests.txt"
            ;;
        w4a8) bench w4a8 --experts-only --isa amx,avx512-vnni ;;
        bf16) bench w4a8-bf16 --experts-only --isa amx,avx512-vnni --w4a8-prefill bf16 ;;
        w8a8) bench w8a8 --experts-only --format w8a8 --isa amx,avx512-vnni ;;
        w4a16) bench w4a16 --experts-only --format w4a16 --group-size 128 --isa amx,avx512-vnni ;;
        *) echo "unknown step $step (cpu tests w4a8 bf16 w8a8 w4a16)" >&2 ;;
    esac
done
