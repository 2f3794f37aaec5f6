// moe-bench-cuda-kernels: what each kernel of a decode step costs on this GPU, as the step sees it
// (docs/performance-log.md). Every case is `--launches` dependent launches captured in one CUDA
// graph, replayed `--repeats` times; the median replay over the launch count is the time per
// launch, gaps included. Weight matrices rotate over copies that together exceed the L2 cache
// (`--rotate-mib`), so each launch reads its weights from DRAM as a decode step does; the
// device-to-device copy bandwidth measured in the same run is the ceiling they are read against.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/ggml_type.h"
#include "kernels/cpu/random_blocks.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/device_matrix.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/expert_matmul.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/qk_norm_rope.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/router.h"

namespace {

using moe::GgmlType;
using moe::cuda::DeviceBuffer;

struct Options {
  int launches = 100;
  int repeats = 7;
  int64_t rotate_mib = 512;
  std::string only;  // --only: one group of cases
};

// A decode step's shapes (qwen3-30b-a3b): n_embd, an expert's n_ff, experts, experts per token.
constexpr int64_t E = 2048, F = 768, X = 128, K = 8;

// Median time of one launch of `enqueue(stream, i)` (i = the launch's index), in microseconds.
double time_per_launch(const Options& o, const std::function<void(cudaStream_t, int)>& enqueue) {
  cudaStream_t s = nullptr;
  MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g = nullptr;
  cudaGraphExec_t ge = nullptr;
  cudaEvent_t a = nullptr, b = nullptr;
  MOE_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < o.launches; ++i) enqueue(s, i);
  MOE_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  MOE_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  MOE_CUDA_CHECK(cudaEventCreate(&a));
  MOE_CUDA_CHECK(cudaEventCreate(&b));
  MOE_CUDA_CHECK(cudaGraphLaunch(ge, s));  // warm-up
  std::vector<double> t;
  for (int r = 0; r < o.repeats; ++r) {
    MOE_CUDA_CHECK(cudaEventRecord(a, s));
    MOE_CUDA_CHECK(cudaGraphLaunch(ge, s));
    MOE_CUDA_CHECK(cudaEventRecord(b, s));
    MOE_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    MOE_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(static_cast<double>(ms) * 1000.0 / o.launches);
  }
  (void)cudaEventDestroy(a);
  (void)cudaEventDestroy(b);
  (void)cudaGraphExecDestroy(ge);
  (void)cudaGraphDestroy(g);
  (void)cudaStreamDestroy(s);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// `bytes` of valid random blocks of type t (rows of n_in), repeated on the device into enough
// copies to exceed the rotation size; copy c starts at base + c * bytes.
struct Rotated {
  DeviceBuffer buf;
  size_t bytes = 0;
  int copies = 1;
  const uint8_t* copy(int i) const { return buf.as<uint8_t>() + (i % copies) * bytes; }
};

Rotated rotated_matrices(GgmlType t, int64_t n_in, int64_t rows, const Options& o,
                         std::mt19937& rng) {
  Rotated r;
  std::vector<uint8_t> host;
  for (int64_t i = 0; i < rows; ++i) {
    const auto row = moe::test::random_row(t, n_in, rng);
    host.insert(host.end(), row.begin(), row.end());
  }
  r.bytes = (host.size() + 255) / 256 * 256;  // every copy as aligned as cudaMalloc's
  r.copies =
      static_cast<int>(std::max<int64_t>(1, (o.rotate_mib << 20) / static_cast<int64_t>(r.bytes)));
  r.buf = DeviceBuffer(r.bytes * static_cast<size_t>(r.copies));
  for (int c = 0; c < r.copies; ++c) {
    MOE_CUDA_CHECK(cudaMemcpy(r.buf.as<uint8_t>() + c * r.bytes, host.data(), host.size(),
                              cudaMemcpyHostToDevice));
  }
  return r;
}

void report(const char* name, double us, double bytes, double ceiling_gbps) {
  if (bytes > 0) {
    const double gbps = bytes / us / 1e3;
    std::printf("%-44s %8.2f us %8.0f GB/s %5.0f%%\n", name, us, gbps, 100.0 * gbps / ceiling_gbps);
  } else {
    std::printf("%-44s %8.2f us\n", name, us);
  }
}

// What the cases share: the flags, the random data's generator, the copy ceiling they are read
// against, and the activations (random floats as input, scratch output, a norm's gains).
struct Bench {
  explicit Bench(const Options& opt) : o(opt) {}
  Options o;
  std::mt19937 rng{42};
  double ceiling = 0;
  std::vector<float> x_host;
  DeviceBuffer x, y, norm;
};

void add_options(CLI::App& app, Options& o) {
  app.add_option("--launches", o.launches, "dependent launches per graph (default 100)")
      ->check(CLI::Range(1, 10000));
  app.add_option("--repeats", o.repeats, "graph replays; the median is reported (default 7)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--rotate-mib", o.rotate_mib,
                 "weight copies rotated through per case, in MiB (default 512, beyond the L2 "
                 "cache; 0: one copy, read from L2)")
      ->check(CLI::Range(int64_t{0}, int64_t{65536}));
  app.add_option("--only", o.only, "run one group of cases only")
      ->check(CLI::IsMember(
          {"norms", "gemv", "router", "experts", "attention", "depth", "combine", "gemm"}));
}

// The ceiling: a device-to-device copy reads and writes each byte once.
double device_copy_ceiling(const Options& o) {
  const size_t copy_bytes = size_t{1} << 30;
  DeviceBuffer src(copy_bytes), dst(copy_bytes);
  const double copy_us = time_per_launch(o, [&](cudaStream_t s, int) {
    MOE_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), copy_bytes, cudaMemcpyDeviceToDevice, s));
  });
  const double ceiling = 2.0 * static_cast<double>(copy_bytes) / copy_us / 1e3;
  std::printf("device copy: %.0f GB/s read + write (the ceiling below)\n", ceiling);
  return ceiling;
}

void upload_activations(Bench& b) {
  b.x_host = moe::test::random_floats(K * E * 2, b.rng);
  b.x = DeviceBuffer(b.x_host.size() * sizeof(float));
  b.y = DeviceBuffer(size_t{16384} * K * sizeof(float));
  b.norm = DeviceBuffer(E * sizeof(float));
  MOE_CUDA_CHECK(
      cudaMemcpy(b.x.get(), b.x_host.data(), b.x_host.size() * 4, cudaMemcpyHostToDevice));
  MOE_CUDA_CHECK(cudaMemcpy(b.norm.get(), b.x_host.data(), E * 4, cudaMemcpyHostToDevice));
}

void bench_norms(Bench& b) {
  const Options& o = b.o;
  const double ceiling = b.ceiling;
  DeviceBuffer &x = b.x, &y = b.y, &norm = b.norm;
  report("rmsnorm 1 x 2048",
         time_per_launch(o,
                         [&](cudaStream_t s, int) {
                           moe::cuda::rmsnorm(x.as<float>(), norm.as<float>(), y.as<float>(), 1, E,
                                              1e-6f, s);
                         }),
         0, ceiling);
  report("residual add + rmsnorm fused 1 x 2048",
         time_per_launch(o,
                         [&](cudaStream_t s, int) {
                           moe::cuda::add_rmsnorm(y.as<float>() + E, x.as<float>(),
                                                  norm.as<float>(), y.as<float>(), 1, E, 1e-6f, s);
                         }),
         0, ceiling);
  report(
      "residual add 2048",
      time_per_launch(o, [&](cudaStream_t s,
                             int) { moe::cuda::add_inplace(y.as<float>(), x.as<float>(), E, s); }),
      0, ceiling);
}

// The attention block's dense projections, in each weight type a model may use for them.
void bench_dense_gemvs(Bench& b) {
  const Options& o = b.o;
  const double ceiling = b.ceiling;
  DeviceBuffer &x = b.x, &y = b.y;
  std::mt19937& rng = b.rng;
  struct Shape {
    int64_t n_in, n_out;
    const char* what;
  };
  for (const GgmlType t : {GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0}) {
    for (const Shape sh : {Shape{E, 4096, "q"}, Shape{E, 512, "k/v"}, Shape{E, 5120, "q+k+v"},
                           Shape{4096, E, "o"}}) {
      const Rotated w = rotated_matrices(t, sh.n_in, sh.n_out, o, rng);
      const size_t rb = *moe::ggml_row_bytes(t, static_cast<uint64_t>(sh.n_in));
      const double us = time_per_launch(o, [&](cudaStream_t s, int i) {
        const auto m = moe::cuda::make_device_matrix(t, w.copy(i), sh.n_in, sh.n_out);
        moe::cuda::matmul(m, x.as<float>(), 1, y.as<float>(), s);
      });
      const std::string name = std::string(moe::ggml_type_info_or_throw(t).name) + " GEMV " +
                               std::to_string(sh.n_in) + " x " + std::to_string(sh.n_out) + " (" +
                               sh.what + ")";
      report(name.c_str(), us, static_cast<double>(rb) * static_cast<double>(sh.n_out), ceiling);
    }
  }
}

// The router (plain GEMV, and fused with top-k and the expert pointers) and the output head.
void bench_router_and_head(Bench& b) {
  const Options& o = b.o;
  const double ceiling = b.ceiling;
  DeviceBuffer &x = b.x, &y = b.y;
  std::mt19937& rng = b.rng;
  {
    const Rotated w = rotated_matrices(GgmlType::F32, E, X, o, rng);
    const double us = time_per_launch(o, [&](cudaStream_t s, int i) {
      const auto m = moe::cuda::make_device_matrix(GgmlType::F32, w.copy(i), E, X);
      moe::cuda::matmul(m, x.as<float>(), 1, y.as<float>(), s);
    });
    report("F32 router GEMV 2048 x 128", us, 4.0 * E * X, ceiling);
    DeviceBuffer table(3 * X * sizeof(void*)), out(X * 8 + K * 40), counter(4);
    MOE_CUDA_CHECK(cudaMemset(table.get(), 0, table.size()));
    MOE_CUDA_CHECK(cudaMemset(counter.get(), 0, 4));
    auto* f = out.as<float>();
    const auto** pp = reinterpret_cast<const void**>(f + 2 * X + 2 * K);
    const moe::cuda::RouterDecodeOut ro{f,
                                        f + X,
                                        reinterpret_cast<int32_t*>(f + 2 * X),
                                        f + 2 * X + K,
                                        table.as<const void*>(),
                                        pp,
                                        pp + K,
                                        pp + 2 * K,
                                        static_cast<unsigned*>(counter.get())};
    const double fused = time_per_launch(o, [&](cudaStream_t s, int i) {
      const auto m = moe::cuda::make_device_matrix(GgmlType::F32, w.copy(i), E, X);
      moe::cuda::router_decode(m, x.as<float>(), K, ro, s);
    });
    report("router fused: F32 GEMV + top-8 + pointers", fused, 4.0 * E * X, ceiling);
  }
  {
    const int64_t V = 151936;  // the output head: the largest decode GEMV
    const Rotated w = rotated_matrices(GgmlType::Q6_K, E, V, o, rng);
    DeviceBuffer logits(V * sizeof(float));
    const double us = time_per_launch(o, [&](cudaStream_t s, int i) {
      const auto m = moe::cuda::make_device_matrix(GgmlType::Q6_K, w.copy(i), E, V);
      moe::cuda::matmul(m, x.as<float>(), 1, logits.as<float>(), s);
    });
    report("q6_K GEMV 2048 x 151936 (output head)", us,
           static_cast<double>(*moe::ggml_row_bytes(GgmlType::Q6_K, E)) * V, ceiling);
  }
}

// A decode step's 8 routed experts: gate and up Q4_K 2048 -> 768, down Q6_K 768 -> 2048,
// 8 distinct experts per launch, rotating through the copies.
void bench_experts(Bench& b) {
  const Options& o = b.o;
  const double ceiling = b.ceiling;
  DeviceBuffer &x = b.x, &y = b.y;
  std::mt19937& rng = b.rng;
  const Rotated gate = rotated_matrices(GgmlType::Q4_K, E, F * 16, o, rng);  // 16 experts a copy
  const Rotated down = rotated_matrices(GgmlType::Q6_K, F, E * 16, o, rng);
  const size_t gb = gate.bytes / 16, db = down.bytes / 16;
  const int sets = std::max(1, std::min(gate.copies, down.copies));
  std::vector<const void*> ptrs;  // per set: 8 gate, 8 up, 8 down pointers
  for (int c = 0; c < sets; ++c) {
    for (int e = 0; e < K; ++e) ptrs.push_back(gate.copy(c) + e * gb);
    for (int e = 0; e < K; ++e) ptrs.push_back(gate.copy(c) + (K + e) * gb);
    for (int e = 0; e < K; ++e) ptrs.push_back(down.copy(c) + e * db);
  }
  DeviceBuffer dptrs(ptrs.size() * sizeof(void*));
  MOE_CUDA_CHECK(
      cudaMemcpy(dptrs.get(), ptrs.data(), ptrs.size() * sizeof(void*), cudaMemcpyHostToDevice));
  const auto* P = dptrs.as<const void*>();
  std::vector<int32_t> ident(K + 1), rows(K, 0);
  for (int i = 0; i <= K; ++i) ident[static_cast<size_t>(i)] = i;
  DeviceBuffer did((K + 1) * 4), drows(K * 4), h(K * F * 2 * sizeof(float));
  MOE_CUDA_CHECK(cudaMemcpy(did.get(), ident.data(), (K + 1) * 4, cudaMemcpyHostToDevice));
  MOE_CUDA_CHECK(cudaMemcpy(drows.get(), rows.data(), K * 4, cudaMemcpyHostToDevice));
  const auto* id = did.as<int32_t>();
  const auto* xr = drows.as<int32_t>();
  const size_t grb = gb / static_cast<size_t>(F), drb = db / static_cast<size_t>(E);
  report("expert gate, 8 items Q4_K 2048 x 768",
         time_per_launch(o,
                         [&](cudaStream_t s, int i) {
                           moe::cuda::grouped_matmul(GgmlType::Q4_K, E, F, grb,
                                                     P + (i % sets) * 3 * K, id, K, xr, K, 1,
                                                     x.as<float>(), E, h.as<float>(), s);
                         }),
         static_cast<double>(K * gb), ceiling);
  report("expert gate+up+SwiGLU fused, 8 items",
         time_per_launch(o,
                         [&](cudaStream_t s, int i) {
                           const auto* p = P + (i % sets) * 3 * K;
                           moe::cuda::grouped_gate_up_swiglu(GgmlType::Q4_K, E, F, grb, p, p + K,
                                                             id, K, xr, x.as<float>(), E,
                                                             h.as<float>(), s);
                         }),
         static_cast<double>(2 * K * gb), ceiling);
  {
    const Rotated down4 = rotated_matrices(GgmlType::Q4_K, F, E * K, o, rng);  // 8 experts a copy
    const size_t d4b = down4.bytes / K, d4rb = d4b / static_cast<size_t>(E);
    std::vector<const void*> p4;
    for (int c = 0; c < down4.copies; ++c) {
      for (int e = 0; e < K; ++e) p4.push_back(down4.copy(c) + e * d4b);
    }
    DeviceBuffer dp4(p4.size() * sizeof(void*));
    MOE_CUDA_CHECK(
        cudaMemcpy(dp4.get(), p4.data(), p4.size() * sizeof(void*), cudaMemcpyHostToDevice));
    report("expert down, 8 items Q4_K 768 x 2048",
           time_per_launch(o,
                           [&](cudaStream_t s, int i) {
                             moe::cuda::grouped_matmul(
                                 GgmlType::Q4_K, F, E, d4rb,
                                 dp4.as<const void*>() + (i % down4.copies) * K, id, K, id, K, 1,
                                 h.as<float>(), F, y.as<float>(), s);
                           }),
           static_cast<double>(K * d4b), ceiling);
  }
  report("expert down, 8 items Q6_K 768 x 2048",
         time_per_launch(o,
                         [&](cudaStream_t s, int i) {
                           moe::cuda::grouped_matmul(GgmlType::Q6_K, F, E, drb,
                                                     P + (i % sets) * 3 * K + 2 * K, id, K, id, K,
                                                     1, h.as<float>(), F, y.as<float>(), s);
                         }),
         static_cast<double>(K * db), ceiling);
}

// A decode step's attention block, qwen3-30b-a3b shapes (32 q heads, 4 KV heads of 128, f16
// cache), at a device position as in the graphed step, at 3 context lengths.
void bench_attention(Bench& b) {
  const Options& o = b.o;
  const double ceiling = b.ceiling;
  DeviceBuffer& norm = b.norm;
  const std::vector<float>& x_host = b.x_host;
  const int64_t H = 32, HK = 4, hd = 128, n_ctx = 4096;
  moe::cuda::DeviceKvLayer kv{};
  kv.k_type = kv.v_type = GgmlType::F16;
  kv.k_elems = kv.v_elems = HK * hd;
  kv.k_row_bytes = kv.v_row_bytes = static_cast<size_t>(2 * HK * hd);
  kv.n_ctx = n_ctx;
  DeviceBuffer kc(kv.k_row_bytes * n_ctx), vc(kv.v_row_bytes * n_ctx), pos(4),
      qkv((H + 2 * HK) * hd * 4), out(H * hd * 4);
  MOE_CUDA_CHECK(cudaMemset(kc.get(), 0, kc.size()));
  MOE_CUDA_CHECK(cudaMemset(vc.get(), 0, vc.size()));
  MOE_CUDA_CHECK(cudaMemcpy(qkv.get(), x_host.data(), qkv.size(), cudaMemcpyHostToDevice));
  kv.k = kc.get();
  kv.v = vc.get();
  float* q = qkv.as<float>();
  const int64_t S = (H + 2 * HK) * hd;
  const auto* dpos = pos.as<int32_t>();
  const size_t ws_bytes = moe::cuda::attention_workspace_bytes(1, 0, H, HK, hd, true);
  DeviceBuffer ws(std::max<size_t>(ws_bytes, 4));
  for (const int32_t p : {63, 511, 2047}) {
    MOE_CUDA_CHECK(cudaMemcpy(pos.get(), &p, 4, cudaMemcpyHostToDevice));
    const std::string at = " at position " + std::to_string(p);
    report(("q/k norm + RoPE" + at).c_str(),
           time_per_launch(o,
                           [&](cudaStream_t s, int) {
                             moe::cuda::qk_norm_rope({q, S, H, norm.as<float>()},
                                                     {q + H * hd, S, HK, norm.as<float>()}, 1, hd,
                                                     1e-6f, hd, p, 1e6f, s, dpos);
                           }),
           0, ceiling);
    const moe::cuda::QkKvStoreF16 st{
        kc.get(), vc.get(), kv.k_row_bytes, kv.v_row_bytes, n_ctx, q + (H + HK) * hd, S, hd};
    report(("q/k norm + RoPE + f16 K/V store" + at).c_str(),
           time_per_launch(o,
                           [&](cudaStream_t s, int) {
                             moe::cuda::qk_norm_rope({q, S, H, norm.as<float>()},
                                                     {q + H * hd, S, HK, norm.as<float>()}, 1, hd,
                                                     1e-6f, hd, p, 1e6f, s, dpos, &st);
                           }),
           0, ceiling);
    report(("K/V store" + at).c_str(),
           time_per_launch(o,
                           [&](cudaStream_t s, int) {
                             moe::cuda::kv_store(kv, q + H * hd, q + (H + HK) * hd, 1, p, s, dpos,
                                                 S, S);
                           }),
           0, ceiling);
    report(("attention + merge" + at).c_str(),
           time_per_launch(o,
                           [&](cudaStream_t s, int) {
                             moe::cuda::attention(kv, q, S, 1, p, H, HK, hd, hd, 0.088f,
                                                  out.as<float>(), ws.get(), ws_bytes, s, dpos);
                           }),
           0, ceiling);
  }
}

// Decode attention deep in a chat: one query token against `pos + 1` cached positions, per model
// shape and cache type. The caches rotate over copies beyond the L2 cache (`--rotate-mib`), as the
// layers of a decode step do, and GB/s is the cache bytes read per launch against the copy ceiling.
void bench_attention_depth(Bench& b) {
  const Options& o = b.o;
  struct Shape {
    const char* name;
    int64_t H, HK, hd;
  };
  const Shape shapes[] = {{"qwen3.6", 16, 2, 256}, {"qwen3-30b", 32, 4, 128}};
  const int64_t n_ctx = 32768, tile_rows = 512;
  for (const Shape& sh : shapes) {
    for (const GgmlType t : {GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0}) {
      const int64_t elems = sh.HK * sh.hd;
      // Random valid rows, tiled to the whole context on the host once.
      std::vector<uint8_t> rows;
      for (int64_t i = 0; i < tile_rows; ++i) {
        const auto r = moe::test::random_row(t, elems, b.rng);
        rows.insert(rows.end(), r.begin(), r.end());
      }
      const size_t row_bytes = rows.size() / static_cast<size_t>(tile_rows);
      const size_t side = row_bytes * static_cast<size_t>(n_ctx);
      const int copies = static_cast<int>(
          std::max<int64_t>(1, ((o.rotate_mib << 20) + 2 * side - 1) / (2 * side)));
      DeviceBuffer cache(2 * side * static_cast<size_t>(copies));
      for (size_t off = 0; off < cache.size(); off += rows.size()) {
        MOE_CUDA_CHECK(cudaMemcpy(cache.as<uint8_t>() + off, rows.data(),
                                  std::min(rows.size(), cache.size() - off),
                                  cudaMemcpyHostToDevice));
      }
      // Launch i's cache: the copies rotate so each launch reads from DRAM, as a step's layers do.
      const auto layer = [&](int i) {
        moe::cuda::DeviceKvLayer kv{};
        kv.k_type = kv.v_type = t;
        kv.k_elems = kv.v_elems = elems;
        kv.k_row_bytes = kv.v_row_bytes = row_bytes;
        kv.n_ctx = n_ctx;
        uint8_t* c = cache.as<uint8_t>() + (i % copies) * 2 * side;
        kv.k = c;
        kv.v = c + side;
        return kv;
      };
      const int64_t S = (sh.H + 2 * sh.HK) * sh.hd;
      const auto q_host = moe::test::random_floats(S, b.rng);
      DeviceBuffer q(S * 4), out(sh.H * sh.hd * 4), pos(4);
      MOE_CUDA_CHECK(cudaMemcpy(q.get(), q_host.data(), S * 4, cudaMemcpyHostToDevice));
      const size_t ws_bytes = moe::cuda::attention_workspace_bytes(1, 0, sh.H, sh.HK, sh.hd, true);
      DeviceBuffer ws(std::max<size_t>(ws_bytes, 4));
      for (const int32_t p : {8191, 32767}) {
        MOE_CUDA_CHECK(cudaMemcpy(pos.get(), &p, 4, cudaMemcpyHostToDevice));
        const std::string name = std::string("attention ") + sh.name + " " +
                                 moe::ggml_type_label(static_cast<uint32_t>(t)) + " at " +
                                 std::to_string(p + 1);
        report(name.c_str(),
               time_per_launch(o,
                               [&](cudaStream_t s, int i) {
                                 const moe::cuda::DeviceKvLayer kv = layer(i);
                                 moe::cuda::attention(kv, q.as<float>(), S, 1, p, sh.H, sh.HK,
                                                      sh.hd, sh.hd, 0.0625f, out.as<float>(),
                                                      ws.get(), ws_bytes, s, pos.as<int32_t>());
                               }),
               2.0 * static_cast<double>(row_bytes) * (p + 1), b.ceiling);
      }
      // A chat's next turn: a 512-token prompt over the same depths (the tensor-core kernel).
      constexpr int64_t kPrompt = 512;
      const auto qp_host = moe::test::random_floats(kPrompt * S, b.rng);
      DeviceBuffer qp(kPrompt * S * 4), outp(kPrompt * sh.H * sh.hd * 4);
      MOE_CUDA_CHECK(
          cudaMemcpy(qp.get(), qp_host.data(), qp_host.size() * 4, cudaMemcpyHostToDevice));
      for (const int64_t p : {8191, 32767}) {
        const int64_t pos0 = p + 1 - kPrompt;
        const size_t wsp_bytes =
            moe::cuda::attention_workspace_bytes(kPrompt, pos0, sh.H, sh.HK, sh.hd, false);
        DeviceBuffer wsp(std::max<size_t>(wsp_bytes, 4));
        const std::string name = std::string("prompt attention ") + sh.name + " " +
                                 moe::ggml_type_label(static_cast<uint32_t>(t)) + ", 512 rows at " +
                                 std::to_string(p + 1);
        report(name.c_str(),
               time_per_launch(o,
                               [&](cudaStream_t s, int i) {
                                 const moe::cuda::DeviceKvLayer kv = layer(i);
                                 moe::cuda::attention(kv, qp.as<float>(), S, kPrompt, pos0, sh.H,
                                                      sh.HK, sh.hd, sh.hd, 0.0625f,
                                                      outp.as<float>(), wsp.get(), wsp_bytes, s);
                               }),
               2.0 * static_cast<double>(row_bytes) * (p + 1), b.ceiling);
      }
    }
  }
}

// The end of a routed layer: the fused combine + next norm, and the router's top-k kernel.
void bench_combine_and_topk(Bench& b) {
  const Options& o = b.o;
  const double ceiling = b.ceiling;
  DeviceBuffer &x = b.x, &y = b.y, &norm = b.norm;
  std::mt19937& rng = b.rng;
  {
    const auto wts = moe::test::random_floats(K, rng);
    DeviceBuffer dwts(K * 4), xr(E * 4);
    MOE_CUDA_CHECK(cudaMemcpy(dwts.get(), wts.data(), K * 4, cudaMemcpyHostToDevice));
    report("combine 8 items + rmsnorm fused 1 x 2048",
           time_per_launch(o,
                           [&](cudaStream_t s, int) {
                             moe::cuda::combine_rmsnorm(x.as<float>(), dwts.as<float>(), K,
                                                        xr.as<float>(), norm.as<float>(),
                                                        y.as<float>(), E, 1e-6f, s);
                           }),
           0, ceiling);
  }
  DeviceBuffer probs(X * 4), ids(K * 4), weights(K * 4);
  report("router softmax + top-8 of 128 (4 tokens' kernel, 1 token)",
         time_per_launch(o,
                         [&](cudaStream_t s, int) {
                           moe::cuda::router_topk(x.as<float>(), 1, X, K, probs.as<float>(),
                                                  ids.as<int32_t>(), weights.as<float>(), s);
                         }),
         0, ceiling);
}

// Prefill products per weight type and tokens per weight matrix (1-8: the GEMV; more: the
// tensor-core kernel: FP16, or int8 with MOE_CUDA_MMQ=1): the q projection (2048 x 4096) as
// one matrix, and a layer's expert gate (2048 x 768 each) with that many tokens for each of
// min(128, 4096 / tokens) experts. TOPS counts 2 operations per weight and token.
void bench_gemm(Bench& b) {
  const Options& o = b.o;
  std::mt19937& rng = b.rng;
  std::printf("products on %s tensor cores beyond 8 tokens\n",
              moe::cuda::int8_products_enabled() ? "int8" : "FP16");
  constexpr int64_t kMaxRows = 4096;
  const std::vector<float> xh = moe::test::random_floats(kMaxRows * E, rng);
  DeviceBuffer x(xh.size() * sizeof(float)), y(size_t{kMaxRows} * 4096 * sizeof(float));
  MOE_CUDA_CHECK(cudaMemcpy(x.get(), xh.data(), xh.size() * 4, cudaMemcpyHostToDevice));
  std::vector<int32_t> ident(kMaxRows + 1);
  for (size_t i = 0; i < ident.size(); ++i) ident[i] = static_cast<int32_t>(i);
  DeviceBuffer did(ident.size() * 4);
  MOE_CUDA_CHECK(cudaMemcpy(did.get(), ident.data(), ident.size() * 4, cudaMemcpyHostToDevice));
  const auto tops = [](double us, int64_t rows, int64_t n_in, int64_t n_out) {
    return 2.0 * static_cast<double>(rows * n_in * n_out) / us / 1e6;
  };
  for (const GgmlType t : {GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q5_K, GgmlType::Q8_0,
                           GgmlType::Q4_0, GgmlType::IQ4_XS, GgmlType::MXFP4}) {
    const std::string tn(moe::ggml_type_info_or_throw(t).name);
    const Rotated q = rotated_matrices(t, E, 4096, o, rng);
    const Rotated experts =
        rotated_matrices(t, E, F * X, Options{o.launches, o.repeats, 0, ""}, rng);
    const size_t erb = *moe::ggml_row_bytes(t, static_cast<uint64_t>(E));
    const size_t eb = erb * static_cast<size_t>(F);  // one expert's matrix
    std::vector<const void*> ptrs;
    for (int e = 0; e < X; ++e) ptrs.push_back(experts.copy(0) + static_cast<size_t>(e) * eb);
    DeviceBuffer dptrs(ptrs.size() * sizeof(void*));
    MOE_CUDA_CHECK(
        cudaMemcpy(dptrs.get(), ptrs.data(), ptrs.size() * sizeof(void*), cudaMemcpyHostToDevice));
    for (const int64_t rows : {1, 2, 4, 8, 16, 32, 64, 512}) {
      const double us_q = time_per_launch(o, [&](cudaStream_t s, int i) {
        const auto m = moe::cuda::make_device_matrix(t, q.copy(i), E, 4096);
        moe::cuda::matmul(m, x.as<float>(), rows, y.as<float>(), s);
      });
      const int64_t groups = std::min<int64_t>(X, std::max<int64_t>(1, kMaxRows / rows));
      // Group g's rows are g * rows .. : offsets are the identity scaled by rows.
      std::vector<int32_t> offsets(static_cast<size_t>(groups + 1));
      for (int64_t g = 0; g <= groups; ++g)
        offsets[static_cast<size_t>(g)] = static_cast<int32_t>(g * rows);
      DeviceBuffer doff(offsets.size() * 4);
      MOE_CUDA_CHECK(
          cudaMemcpy(doff.get(), offsets.data(), offsets.size() * 4, cudaMemcpyHostToDevice));
      const double us_e = time_per_launch(o, [&](cudaStream_t s, int) {
        moe::cuda::grouped_matmul(t, E, F, erb, dptrs.as<const void*>(), doff.as<int32_t>(),
                                  static_cast<int32_t>(groups), did.as<int32_t>(), groups * rows,
                                  rows, x.as<float>(), E, y.as<float>(), s);
      });
      std::printf(
          "%-7s %4lld tokens: q 2048x4096 %9.2f us %7.1f TOPS | %3lld experts 2048x768 %9.2f us "
          "%7.1f TOPS\n",
          tn.c_str(), static_cast<long long>(rows), us_q, tops(us_q, rows, E, 4096),
          static_cast<long long>(groups), us_e, tops(us_e, groups * rows, E, F));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"moe-bench-cuda-kernels: time per launch of the decode step's CUDA kernels"};
  Options o;
  add_options(app, o);
  CLI11_PARSE(app, argc, argv);
  try {
    Bench b(o);
    b.ceiling = device_copy_ceiling(o);
    upload_activations(b);
    const auto run = [&](const char* group, void (*cases)(Bench&)) {
      if (o.only.empty() || o.only == group) cases(b);
    };
    run("norms", bench_norms);
    run("gemv", bench_dense_gemvs);
    run("router", bench_router_and_head);
    run("experts", bench_experts);
    run("attention", bench_attention);
    run("depth", bench_attention_depth);
    run("combine", bench_combine_and_topk);
    run("gemm", bench_gemm);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe-bench-cuda-kernels: %s\n", e.what());
    return 1;
  }
  return 0;
}
