#!/usr/bin/env bash
# scripts/check-layers passes on the tree and fails on each kind of violation planted in a copy:
# an include from a layer above, an include between processes, a cycle between folders, a
# CUDA-only include in a CUDA-free folder, and an over-long file.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
check="$src/scripts/check-layers"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$check" "$src" >/dev/null || { echo "FAIL: the tree itself violates the layers"; "$check" "$src"; exit 1; }

fresh() {  # a copy of the sources only (no build trees)
  rm -rf "$work/tree"
  mkdir -p "$work/tree"
  for d in common kernels experts tools coordinator cpu_worker gpu_worker tests scripts; do
    cp -r "$src/$d" "$work/tree/$d"
  done
}
# expect_refused NAME PATTERN: the check fails and its report matches PATTERN.
expect_refused() {
  local out rc=0
  out=$("$check" "$work/tree" 2>&1) || rc=$?
  if ((rc == 0)); then echo "FAIL: $1 was not refused"; exit 1; fi
  if ! grep -qE "$2" <<<"$out"; then echo "FAIL: $1: report does not match '$2':"; echo "$out"; exit 1; fi
  echo "ok: $1 refused"
}

fresh
echo '#include "coordinator/model/kv_cache.h"' >>"$work/tree/common/error.h"
expect_refused "common/ including coordinator/" 'common/error.h:[0-9]+: common/ may not include coordinator/model/kv_cache.h'

fresh
echo '#include "coordinator/engine/engine.h"' >>"$work/tree/cpu_worker/expert_server.h"
expect_refused "a worker including the coordinator" 'cpu_worker/expert_server.h:[0-9]+: cpu_worker/ may not include'

fresh
echo '#include "coordinator/http/http_server.h"' >>"$work/tree/coordinator/server/grpc_auth.h"
expect_refused "a cycle between folders" 'cycle between folders coordinator/http <-> coordinator/server'

fresh
echo '#include "kernels/cuda/matmul.h"' >>"$work/tree/kernels/cpu/matmul.h"
expect_refused "kernels/cpu including kernels/cuda" 'kernels/cpu/ builds without CUDA and may not include kernels/cuda/matmul.h'

fresh
seq 801 | sed 's|^|// filler |' >>"$work/tree/common/progress.cpp"
expect_refused "an over-long file" 'common/progress.cpp: [0-9]+ lines, above 800'

fresh
"$check" "$work/tree" >/dev/null || { echo "FAIL: an unchanged copy is refused"; exit 1; }
echo "ok: an unchanged copy passes"
