#!/usr/bin/env bash
# Builds, on a development machine, one folder holding everything a run on a machine with AMX
# needs, for machines that have no Rust toolchain and no network: the release `moe`, the
# release test binaries of moe-kernels and moe-layer (symbols stripped), the goldens and
# fixtures they read, all in one `payload.tar.xz`, and `run.sh`, which unpacks it on first use.
#
#   scripts/amx-bundle.sh [FOLDER]        # default target/amx-bundle, about 25 MB
#
# Then, on the AMX machine, from a copy of the repository with FOLDER beside it:
#
#   bash target/amx-bundle/run.sh [STEP...]   # steps: cpu tests w4a8 bf16 w8a8 w4a16 switch
#                                              # (default all; AMX_CPUS=2,3 pins other cores)
#
# `run.sh` writes its results under `$OUT` (default FOLDER/out): `cpu.txt`, `tests.txt`, one
# JSON file of `moe bench` rows per timed step, the switch-over report in `switch.txt` and
# every step's messages in `bench.err` (eight files in all, so a harness that returns at most
# eight brings every one back). The kernel tests run with `MOE_EXPECT_ISA=amx` (or
# `AMX_EXPECT_ISA`), so a machine whose AMX is hidden or not granted fails them instead of
# passing on the VNNI rung; the layer tests run on whatever rung the machine selects.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/amx-bundle}
goldens=${MOE_GOLDENS:-../shared/goldens}
fixtures=${MOE_FIXTURES:-../shared/fixtures}
stage="$out/stage"
rm -rf "$out"
mkdir -p "$stage/bin" "$stage/tests/kernels" "$stage/tests/layer"

cargo build --release -p moe-cli
# `strip` comes with binutils, which a Rust toolchain on Linux needs for linking anyway.
strip -o "$stage/bin/moe" target/release/moe

# Every test executable of a package (unit and integration tests), as cargo names them, built
# in release so the suites run in seconds there; examples are not tests.
tests_of() {
    cargo test --release -p "$1" --no-run --message-format=json-render-diagnostics \
        | grep -o '"executable":"[^"]*"' | sed 's/^"executable":"//; s/"$//' \
        | grep -v '/examples/' \
        | while read -r exe; do
            name=$(basename "$exe")
            strip -o "$2/${name%-*}" "$exe"
        done
}
tests_of moe-kernels "$stage/tests/kernels"
tests_of moe-layer "$stage/tests/layer"

cp -r "$goldens" "$stage/goldens"
cp -r "$fixtures" "$stage/fixtures"
tar -C "$stage" -cJf "$out/payload.tar.xz" .
rm -rf "$stage"
cp scripts/amx-run.sh "$out/run.sh"
du -sh "$out"
