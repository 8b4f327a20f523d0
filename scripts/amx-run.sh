#!/usr/bin/env bash
# Runs on a machine with AMX, from the folder `scripts/amx-bundle.sh` built (copied there as
# run.sh): the CPU report, the kernel tests on the hardware tile unit, and the prefill rows of
# `moe bench` on two pinned cores, each rung on the same weights in one process, and the rows per
# expert from which each format's tiles beat the VNNI kernels.
#
# `AMX_CPUS` names the two cores (default 0,1). On shared hosts the cores differ: tile loads have
# been seen to run at a quarter of the rate on some cores of an instance and at full rate on
# others, and a two-thread figure follows the slower core; pin to the same cores for every step
# that is compared.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$here/out}
mkdir -p "$out"
# The bundle's payload, unpacked once beside this script.
if [ ! -x "$here/bin/moe" ]; then
    tar -C "$here" -xJf "$here/payload.tar.xz"
fi
moe="$here/bin/moe"
steps=${*:-cpu tests w4a8 bf16 w8a8 w4a16 switch}
cpus=${AMX_CPUS:-0,1}
# Two cores, as the development machines have; the rows name their rung.
bench() {
    local name=$1
    shift
    echo "== $name: moe bench $*"
    timeout 240 taskset -c "$cpus" "$moe" --json bench --threads 2 --iters 4 --warmup-ms 200 \
        --batch-sizes 16,256,1024 "$@" > "$out/$name.json" 2>> "$out/bench.err"
    echo "   exit $? ($(wc -c < "$out/$name.json") bytes)"
}
# Rows per expert equal to M (every token goes to all 8 experts), the tile bodies forced on
# from one row, so each row of the table is one switch-over candidate; the human report, one
# step per format, appended to one file.
switch() {
    local name=$1
    shift
    echo "== switch $name: moe bench $*" | tee -a "$out/switch.txt"
    MOE_KERNELS_AMX_MIN_M=1 MOE_KERNELS_AMX_BF16_MIN_M=1 timeout 120 taskset -c "$cpus" \
        "$moe" bench --experts-only --threads 2 --iters 5 --warmup-ms 100 --min-bytes 1G \
        --shape e8-k8-h2048-i768 --isa amx,avx512-vnni "$@" >> "$out/switch.txt" \
        2>> "$out/bench.err"
    echo "   exit $?"
}
for step in $steps; do
    case $step in
        cpu)
            { lscpu; echo; "$moe" cpu; } > "$out/cpu.txt" 2>&1
            grep -E "Model name|^Flags" "$out/cpu.txt" | cut -c1-200
            grep -E "^(selected|  amx)" "$out/cpu.txt"
            ;;
        tests)
            # Run from the bundle, whose goldens and fixtures the variables name.
            export MOE_GOLDENS="$here/goldens" MOE_FIXTURES="$here/fixtures"
            for t in "$here"/tests/kernels/* "$here"/tests/layer/*; do
                echo "== $(basename "$(dirname "$t")")/$(basename "$t")"
                MOE_EXPECT_ISA=${AMX_EXPECT_ISA:-amx} timeout 300 "$t" --test-threads 8 2>&1 \
                    | grep -E "^test result|FAILED|panicked" | head -20
            done > "$out/tests.txt"
            cat "$out/tests.txt"
            ;;
        w4a8) bench w4a8 --experts-only --isa amx,avx512-vnni ;;
        bf16) bench w4a8-bf16 --experts-only --isa amx,avx512-vnni --w4a8-prefill bf16 ;;
        w8a8) bench w8a8 --experts-only --format w8a8 --isa amx,avx512-vnni ;;
        w4a16) bench w4a16 --experts-only --format w4a16 --group-size 128 --isa amx,avx512-vnni ;;
        switch)
            switch w4a8-g32 --batch-sizes 8,16,24,32,48,64
            switch w4a8-g128 --group-size 128 --batch-sizes 16,24,32,48,64
            switch w8a8 --format w8a8 --batch-sizes 4,8,12,16,24
            switch w4a16-g128 --format w4a16 --group-size 128 --batch-sizes 2,4,8,12,16
            ;;
        *) echo "unknown step $step (cpu tests w4a8 bf16 w8a8 w4a16 switch)" >&2 ;;
    esac
done
