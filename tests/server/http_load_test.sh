#!/usr/bin/env bash
# ctest: a CI-sized run of scripts/http-load-test (4 clients for 10 s, bad and cancelled requests
# mixed in) on the golden tiny model; it fails on an unexpected status, a crashed or unclean
# coordinator, or RSS growth over the bound.
#   tests/server/http_load_test.sh BIN_DIR TESTDATA_DEFAULT
# The model is found as the C++ tests find it: $MOE_TESTDATA, else the configured folder.
set -euo pipefail
export MOE_BIN_DIR=$1
testdata=${MOE_TESTDATA:-$2}
export WARMUP_SECONDS=${WARMUP_SECONDS:-2}
exec "$(dirname "$0")/../../scripts/http-load-test" 4 10 \
  "$testdata/models/tiny-qwen3moe-sv-Q8_0.gguf"
