#!/usr/bin/env bash
# Builds the cargo-fuzz targets in fuzz/ and runs each for a few seconds; fails on any crash.
#
# With cargo-fuzz (installed here if missing): coverage-guided libFuzzer runs with AddressSanitizer.
# On a stable toolchain cargo-fuzz's nightly-only flags (-Zsanitizer, -Cpasses=sancov-module)
# are unlocked with RUSTC_BOOTSTRAP=1. If cargo-fuzz cannot be installed, the targets are still
# built with plain `cargo build` (which works on stable) and run uninstrumented for the same time:
# blind random inputs, a smoke test rather than fuzzing.
#
# Environment:
#   FUZZ_SECONDS   seconds per target (default 5)
#   FUZZ_TARGETS   space-separated targets (default: all of fuzz/Cargo.toml)
#   FUZZ_FALLBACK  1: skip cargo-fuzz, take the plain-build path (to test it)
set -euo pipefail
cd "$(dirname "$0")/.."

secs="${FUZZ_SECONDS:-5}"
manifest=fuzz/Cargo.toml
targets="${FUZZ_TARGETS:-$(sed -n 's/^name = "\(.*\)"$/\1/p' "$manifest" | grep -v '^ina-fuzz$')}"
echo "fuzz targets: $targets (${secs}s each)"

have_cargo_fuzz() { cargo fuzz --version >/dev/null 2>&1; }

use_cargo_fuzz=0
if [ "${FUZZ_FALLBACK:-0}" != 1 ]; then
    if have_cargo_fuzz; then
        use_cargo_fuzz=1
    else
        echo "cargo-fuzz is missing: installing it"
        if cargo install cargo-fuzz --locked && have_cargo_fuzz; then
            use_cargo_fuzz=1
        else
            echo "WARNING: cargo-fuzz could not be installed; building and smoke-running the" \
                "targets without coverage instrumentation instead" >&2
        fi
    fi
fi

if [ "$use_cargo_fuzz" = 1 ]; then
    # cargo-fuzz passes nightly-only flags; a stable toolchain accepts them with RUSTC_BOOTSTRAP=1.
    if ! rustc --version | grep -q nightly; then
        export RUSTC_BOOTSTRAP=1
    fi
    cargo fuzz --version
    (cd fuzz && cargo fuzz build)
    for t in $targets; do
        echo "== cargo fuzz run $t (${secs}s)"
        # A crash makes cargo fuzz exit non-zero; the input lands in fuzz/artifacts/$t/.
        (cd fuzz && cargo fuzz run "$t" -- -max_total_time="$secs")
    done
else
    cargo build --manifest-path "$manifest" --bins
    for t in $targets; do
        echo "== fuzz/target/debug/$t, uninstrumented (${secs}s)"
        corpus=()
        [ -d "fuzz/corpus/$t" ] && corpus=("fuzz/corpus/$t")
        mkdir -p "fuzz/artifacts/$t"
        log="fuzz/target/$t.log"
        rc=0
        # libFuzzer exits non-zero on a crash or panic.
        "fuzz/target/debug/$t" ${corpus[@]+"${corpus[@]}"} -max_total_time="$secs" \
            -artifact_prefix="fuzz/artifacts/$t/" >"$log" 2>&1 || rc=$?
        if [ "$rc" != 0 ]; then
            tail -n 40 "$log"
            echo "fuzz target $t failed (exit $rc); inputs in fuzz/artifacts/$t/" >&2
            exit "$rc"
        fi
        tail -n 1 "$log"
    done
fi
echo "fuzz: all targets ran without a crash"
