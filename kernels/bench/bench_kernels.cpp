// moe-bench-kernels: effective weight bandwidth of the quantized GEMV per type, beside the plain
// memory read bandwidth measured in the same run with the same threads (docs/performance-log.md).
#include <immintrin.h>
#include <sys/mman.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/act_quant.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/random_blocks.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/weight_prefetch.h"

namespace {

using moe::GgmlType;
using namespace moe::cpu;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The plain read bandwidth ceiling: 256-bit loads summed into four independent accumulators.
__attribute__((target("avx2"))) uint64_t read_chunk_avx2(const uint8_t* p, size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 128 <= n; i += 128) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  const __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

uint64_t read_chunk_scalar(const uint8_t* p, size_t n) {
  uint64_t s0 = 0, s1 = 0;
  for (size_t i = 0; i + 16 <= n; i += 16) {
    uint64_t a, b;
    std::memcpy(&a, p + i, 8);
    std::memcpy(&b, p + i + 8, 8);
    s0 += a;
    s1 += b;
  }
  return s0 + s1;
}

// One pass of plain 256-bit reads over the buffer with the pool; returns seconds.
double read_pass_s(const uint8_t* buf, size_t bytes, ThreadPool& pool,
                   std::vector<uint64_t>& sink) {
  constexpr size_t kChunk = 1 << 20;
  const int64_t n_tasks = static_cast<int64_t>(bytes / kChunk);
  const bool avx2 = isa_supported(Isa::Avx2);
  const auto t0 = std::chrono::steady_clock::now();
  pool.parallel_for(n_tasks, [&](int64_t t, int th) {
    const uint8_t* p = buf + static_cast<size_t>(t) * kChunk;
    sink[static_cast<size_t>(th) * 8] +=
        avx2 ? read_chunk_avx2(p, kChunk) : read_chunk_scalar(p, kChunk);
  });
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Bytes of this process's anonymous memory on transparent huge pages (/proc/self/smaps_rollup), 0
// where the kernel does not say.
size_t anon_huge_bytes() {
  std::FILE* f = std::fopen("/proc/self/smaps_rollup", "r");
  if (!f) return 0;
  char line[256];
  size_t kib = 0;
  while (std::fgets(line, sizeof line, f)) {
    if (std::sscanf(line, "AnonHugePages: %zu kB", &kib) == 1) break;
  }
  std::fclose(f);
  return kib * 1024;
}

// Fills `bytes` with valid blocks of `type`: a 16 MiB random pattern repeated (content does not
// matter for bandwidth, only that scales are finite).
void fill_weights(GgmlType type, uint8_t* buf, size_t bytes, size_t row_bytes, int64_t n_in) {
  std::mt19937 rng(42);
  std::vector<uint8_t> pattern;
  while (pattern.size() < (16u << 20)) {
    const auto row = moe::test::random_row(type, n_in, rng);
    pattern.insert(pattern.end(), row.begin(), row.end());
  }
  const size_t pat = pattern.size() / row_bytes * row_bytes;
  for (size_t off = 0; off < bytes; off += pat) {
    std::memcpy(buf + off, pattern.data(), std::min(pat, bytes - off));
  }
}

// Settles the process's weight prefetch distance (weight_prefetch.h) before anything is timed, on
// the GEMVs a Q4_K_M model's experts make: one activation row over 64 MiB slices of Q4_K and Q6_K
// weights (half of the buffer each), alternating the types and walking through the whole buffer
// so that every slice comes from DRAM.
void tune_prefetch(uint8_t* buf, size_t bytes, ThreadPool& pool, MatmulScratch& scratch, Isa isa) {
  constexpr int64_t kNIn = 2048;
  constexpr size_t kSlice = size_t{64} << 20;
  const size_t half = bytes / 2;
  const GgmlType types[2] = {GgmlType::Q4_K, GgmlType::Q6_K};
  std::vector<WeightMatrix> slices[2];
  for (int h = 0; h < 2; ++h) {
    const auto row_bytes = static_cast<size_t>(*moe::ggml_row_bytes(types[h], kNIn));
    uint8_t* base = buf + static_cast<size_t>(h) * half;
    const int64_t rows = static_cast<int64_t>(std::min(kSlice, half) / row_bytes);
    const size_t slice_bytes = static_cast<size_t>(rows) * row_bytes;
    if (rows < 1) return;  // a buffer too small to tune on: the default stays
    fill_weights(types[h], base, half / slice_bytes * slice_bytes, row_bytes, kNIn);
    for (size_t off = 0; off + slice_bytes <= half; off += slice_bytes) {
      slices[h].push_back(make_weight_matrix(types[h], base + off, kNIn, rows));
    }
  }
  std::mt19937 rng(11);
  const auto x = moe::test::random_floats(kNIn, rng);
  std::vector<float> y;
  for (size_t i = 0; i < 1000 && !prefetch_tuned(); ++i) {
    const std::vector<WeightMatrix>& of_type = slices[i % 2];
    const WeightMatrix& w = of_type[(i / 2) % of_type.size()];
    y.resize(static_cast<size_t>(w.n_out));
    matmul(w, x.data(), 1, y.data(), pool, scratch, isa);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Quantized GEMV weight bandwidth vs plain memory read bandwidth"};
  int threads = 2;
  double gib = 1.0;
  int reps = 7;
  std::vector<std::string> type_names = {"q4_K", "q5_K", "q6_K", "q8_0", "q2_0", "bf16"};
  std::vector<int> act_rows = {1};
  std::string isa_arg;
  std::string pages = "huge";
  app.add_option("-t,--threads", threads, "threads (the caller counts as one)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--gib", gib, "weight bytes per type, GiB")->check(CLI::Range(0.01, 64.0));
  app.add_option("-r,--reps", reps, "timed repetitions (median reported)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--types", type_names, "weight types");
  app.add_option("--act-rows", act_rows, "activation rows per GEMV (1-8; >8 runs the GEMM)")
      ->check(CLI::Range(1, 4096));
  app.add_option("--isa", isa_arg, "scalar|avx2|avx512 (default: best supported)");
  app.add_option("--pages", pages,
                 "huge: ask the kernel for 2 MiB pages (madvise); small: forbid them. Left to "
                 "chance, a run mixes both as khugepaged collapses pages, and reads change speed "
                 "mid-run")
      ->check(CLI::IsMember({"huge", "small"}));
  CLI11_PARSE(app, argc, argv);

  Isa isa = best_isa();
  if (!isa_arg.empty()) {
    bool found = false;
    for (Isa i : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
      if (isa_arg == isa_name(i)) {
        isa = i;
        found = true;
      }
    }
    if (!found || !isa_supported(isa)) {
      std::fprintf(stderr, "moe-bench-kernels: error: ISA '%s' is not available here\n",
                   isa_arg.c_str());
      return 2;
    }
  }
  std::vector<GgmlType> types;
  for (const auto& name : type_names) {
    bool found = false;
    for (GgmlType t : moe::test::computable_types()) {
      if (moe::ggml_type_info_or_throw(t).name == name) {
        types.push_back(t);
        found = true;
      }
    }
    if (!found) {
      std::fprintf(stderr, "moe-bench-kernels: error: unknown or unsupported type '%s'\n",
                   name.c_str());
      return 2;
    }
  }

  const size_t bytes = static_cast<size_t>(gib * (1ull << 30)) & ~size_t{(1u << 20) - 1};
  auto* buf = static_cast<uint8_t*>(std::aligned_alloc(1 << 21, bytes));
  if (!buf) {
    std::fprintf(stderr, "moe-bench-kernels: error: cannot allocate %zu bytes\n", bytes);
    return 1;
  }
  if (madvise(buf, bytes, pages == "huge" ? MADV_HUGEPAGE : MADV_NOHUGEPAGE) != 0) {
    std::fprintf(stderr, "moe-bench-kernels: warning: madvise(%s pages) failed: %s\n",
                 pages.c_str(), std::strerror(errno));
  }
  std::memset(buf, 1, bytes);  // fault the pages in before timing
  ThreadPool pool(threads);
  MatmulScratch scratch;

  std::vector<uint64_t> sink(static_cast<size_t>(pool.size()) * 8);
  read_pass_s(buf, bytes, pool, sink);  // warm-up
  tune_prefetch(buf, bytes, pool, scratch, isa);
  std::printf(
      "moe-bench-kernels: %d threads, ISA %s, %.2f GiB per type (%s pages: %.0f%% of it on 2 MiB "
      "pages), median of %d\n"
      "weight prefetch distance: %s\n",
      threads, std::string(isa_name(isa)).c_str(), static_cast<double>(bytes) / (1ull << 30),
      pages.c_str(), 100.0 * static_cast<double>(anon_huge_bytes()) / static_cast<double>(bytes),
      reps, prefetch_summary().c_str());
  std::printf(
      "Each repetition times a plain read pass of the same buffer right before the GEMV; the "
      "ratio\n"
      "is taken per repetition (the machine's bandwidth drifts), and medians are reported.\n\n");
  std::printf(
      "| type | act rows | weight GB | median ms | weight GB/s | read GB/s | %% of read BW |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|\n");
  constexpr int64_t kNIn = 4096;
  for (GgmlType type : types) {
    const auto row_bytes = static_cast<size_t>(*moe::ggml_row_bytes(type, kNIn));
    const int64_t n_out = static_cast<int64_t>(bytes / row_bytes);
    const size_t used = static_cast<size_t>(n_out) * row_bytes;
    fill_weights(type, buf, used, row_bytes, kNIn);
    const WeightMatrix w = make_weight_matrix(type, buf, kNIn, n_out);
    for (int rows : act_rows) {
      std::mt19937 rng(7);
      const auto x = moe::test::random_floats(kNIn * rows, rng);
      std::vector<float> y(static_cast<size_t>(n_out) * static_cast<size_t>(rows));
      matmul(w, x.data(), rows, y.data(), pool, scratch, isa);  // warm-up
      std::vector<double> t_gemv, bw_read, ratio;
      for (int r = 0; r < reps; ++r) {
        const double tr = read_pass_s(buf, bytes, pool, sink);
        const auto t0 = std::chrono::steady_clock::now();
        matmul(w, x.data(), rows, y.data(), pool, scratch, isa);
        const double tg =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        t_gemv.push_back(tg);
        bw_read.push_back(static_cast<double>(bytes) / tr / 1e9);
        ratio.push_back((static_cast<double>(used) / tg) / (static_cast<double>(bytes) / tr));
      }
      const double s = median(t_gemv);
      std::printf("| %s | %d | %.3f | %.2f | %.2f | %.2f | %.1f%% |\n",
                  std::string(moe::ggml_type_info_or_throw(type).name).c_str(), rows,
                  static_cast<double>(used) / 1e9, s * 1e3, static_cast<double>(used) / s / 1e9,
                  median(bw_read), 100.0 * median(ratio));
    }
  }
  std::free(buf);
  return 0;
}
