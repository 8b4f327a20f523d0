#!/usr/bin/env bash
# Builds, on a development machine, one folder holding everything a run on a machine with AMX
# needs, for machines that have no Rust toolchain and no network: the release `moe`, the
# moe-kernels test binaries (debug info stripped), the goldens they read, and `run.sh`.
#
#   scripts/amx-bundle.sh [FOLDER]        # default target/amx-bundle, about 40 MB
#
# Then, on the AMX machine, from a copy of the repository with FOLDER beside it:
#
#   bash target/amx-bundle/run.sh [STEP...]   # steps: cpu tests w4a8 bf16 w8a8 w4a16 switch
#                                              # (default all; AMX_CPUS=2,3 pins other cores)
#
# `run.sh` writes its results under `$OUT` (default FOLDER/out): `cpu.txt`, `tests.txt`, one
# JSON file of `moe bench` rows per timed step, the switch-over report in `switch.txt` and every
# step's messages in `bench.err` (eight files in all, so a harness that returns at most eight brings every one back). The test binaries run with `MOE_EXPECT_ISA=amx`,
# so a machine whose AMX is hidden or not granted fails them instead of passing on the VNNI rung.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/amx-bundle}
goldens=${MOE_GOLDENS:-../shared/goldens}
rm -rf "$out"
mkdir -p "$out/bin" "$out/tests" "$out/goldens"

cargo build --release -p moe-cli
# `strip` comes with binutils, which a Rust toolchain on Linux needs for linking anyway.
strip --strip-debug -o "$out/bin/moe" target/release/moe

# Every test executable of moe-kernels (unit tests and integration tests), as cargo names them:
# moe-kernels has no binaries, so every artifact with an executable is a test.
cargo test -p moe-kernels --no-run --message-format=json-render-diagnostics \
    | grep -o '"executable":"[^"]*"' | sed 's/^"executable":"//; s/"$//' \
    | while read -r exe; do
        name=$(basename "$exe")
        strip --strip-debug -o "$out/tests/${name%-*}" "$exe"
    done

for dir in w4a8 int8 marlin; do
    cp -r "$goldens/$dir" "$out/goldens/"
done
cp scripts/amx-run.sh "$out/run.sh"
du -sh "$out"
