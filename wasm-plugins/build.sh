#!/bin/sh
# Builds the example filters into built/, byte for byte what is committed there:
# - the Rust ones with Debian's rustc 1.63 and its wasm32 standard library (rustup's
#   toolchain may come first on PATH: Debian's tools are called by their full paths);
# - the C one with clang 14 and wasm-ld.
# Needs: apt-get install -y rustc libstd-rust-dev-wasm32 lld cargo clang-14
set -eu
cd "$(dirname "$0")"
here=$(pwd)
# Paths in panic messages name the sources relative to this directory, so the modules are
# the same wherever the checkout is.
# (WASM_RUSTC and WASM_CARGO name other tools; RUSTC and CARGO are not read, as cargo sets
# them for what it runs.)
RUSTFLAGS="-C link-arg=-zstack-size=65536 --remap-path-prefix=$here=wasm-plugins" \
    RUSTC="${WASM_RUSTC:-/usr/bin/rustc}" "${WASM_CARGO:-/usr/bin/cargo}" build --release --locked --quiet
mkdir -p built
for module in drop_by_header redact_json route_by_amount drop_duplicates; do
    cp "target/wasm32-unknown-unknown/release/$module.wasm" "built/$module.wasm"
done
"${CLANG:-clang-14}" --target=wasm32 -O2 -nostdlib -fno-builtin -Wall -Wextra -Werror \
    -Wl,--no-entry -Wl,-zstack-size=65536 -Wl,--strip-all \
    -o built/tag_or_drop_empty.wasm c/tag_or_drop_empty.c
ls -l built
