#include "coordinator/gpu/qwen3moe_gpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "common/error.h"
#include "coordinator/model/batch_routing.h"
#include "coordinator/model/tensor_table.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/expert_lists.h"
#include "kernels/cuda/expert_matmul.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/router.h"

namespace moe::gpu {
namespace {

using model::ExpertItem;
using model::KvCache;
using model::ModelConfig;

// Rows of logits computed per output-head call: bounds the logits scratch (rows x n_vocab).
constexpr int64_t kLogitRows = 32;

uint64_t resolve_budget(const GpuOptions& o, std::string& name) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    throw Error(std::string("-ngl needs a CUDA device, none is usable: ") +
                (err != cudaSuccess ? cudaGetErrorString(err) : "no device"));
  }
  if (o.device < 0 || o.device >= count) {
    throw Error("--main-gpu " + std::to_string(o.device) + ": only " + std::to_string(count) +
                " CUDA device(s)");
  }
  MOE_CUDA_CHECK(cudaSetDevice(o.device));
  cudaDeviceProp prop{};
  MOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, o.device));
  name = std::string(prop.name) + " (sm_" + std::to_string(prop.major) +
         std::to_string(prop.minor) + ")";
  size_t free_b = 0, total_b = 0;
  MOE_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  if (o.vram_budget_mib > 0) return static_cast<uint64_t>(o.vram_budget_mib) << 20;
  return free_b;
}

size_t kv_row_bytes(GgmlType t, int64_t elems, const char* which) {
  const auto b = ggml_row_bytes(t, static_cast<uint64_t>(elems));
  if (!b) {
    throw Error(std::string(which) + " cache row of " + std::to_string(elems) +
                " values does not split into " + ggml_type_label(static_cast<uint32_t>(t)) +
                " blocks");
  }
  return static_cast<size_t>(*b);
}

template <typename T>
T* grow(std::vector<T>& v, int64_t n) {
  if (v.size() < static_cast<size_t>(n)) v.resize(static_cast<size_t>(n));
  return v.data();
}

// Packs the per-layer expert lists into one pinned block so a single copy moves them.
class MetaWriter {
 public:
  explicit MetaWriter(unsigned char* base) : base_(base) {}
  template <typename T>
  T* take(int64_t n) {
    off_ = (off_ + 15) & ~size_t{15};
    T* p = reinterpret_cast<T*>(base_ + off_);
    off_ += static_cast<size_t>(n) * sizeof(T);
    return p;
  }
  size_t size() const { return off_; }

 private:
  unsigned char* base_;
  size_t off_ = 0;
};

}  // namespace

Qwen3MoeGpu::Qwen3MoeGpu(const gguf::GgufFile& f, cpu::ThreadPool& pool,
                         std::unique_ptr<model::ExpertExecutor> cpu_experts, const GpuOptions& opt)
    : cfg_(ModelConfig::from_gguf(f)),
      pool_(pool),
      opt_(opt),
      budget_(resolve_budget(opt, device_name_)) {
  const int64_t E = cfg_.n_embd, V = cfg_.n_vocab, hk = cfg_.head_dim_k, hv = cfg_.head_dim_v;
  const int64_t X = cfg_.n_expert, F = cfg_.n_ff_exp;
  if (opt.n_gpu_layers < cfg_.n_layer) {
    throw Error("-ngl " + std::to_string(opt.n_gpu_layers) +
                ": partial offload is not supported; " + "use -ngl " +
                std::to_string(cfg_.n_layer) +
                " or more (every layer's attention on the GPU) and keep experts on the CPU with "
                "-cmoe / -ncmoe N, or -ngl 0 for the CPU path");
  }
  if (cfg_.n_rot != hk) {
    throw Error(cfg_.arch + ".rope.dimension_count: qwen3moe rotates the whole head (" +
                std::to_string(hk) + "), found " + std::to_string(cfg_.n_rot));
  }
  MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));

  emb_ = model::require_embedding_tensors(f, E, V);
  output_norm_ = upload_vector(*emb_.output_norm);
  output_ = upload_matrix(*emb_.output, output_buf_, VramUse::Weights);

  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    Layer L;
    L.n_head = cfg_.n_head[static_cast<size_t>(l)];
    L.n_head_kv = cfg_.n_head_kv[static_cast<size_t>(l)];
    L.attn_norm = upload_vector(model::require_tensor(f, p + "attn_norm.weight", {E}));
    L.q_norm = upload_vector(model::require_tensor(f, p + "attn_q_norm.weight", {hk}));
    L.k_norm = upload_vector(model::require_tensor(f, p + "attn_k_norm.weight", {hk}));
    L.ffn_norm = upload_vector(model::require_tensor(f, p + "ffn_norm.weight", {E}));
    L.wq = upload_matrix(model::require_tensor(f, p + "attn_q.weight", {E, L.n_head * hk}),
                         L.wq_buf, VramUse::Weights);
    L.wk = upload_matrix(model::require_tensor(f, p + "attn_k.weight", {E, L.n_head_kv * hk}),
                         L.wk_buf, VramUse::Weights);
    L.wv = upload_matrix(model::require_tensor(f, p + "attn_v.weight", {E, L.n_head_kv * hv}),
                         L.wv_buf, VramUse::Weights);
    L.wo = upload_matrix(model::require_tensor(f, p + "attn_output.weight", {L.n_head * hv, E}),
                         L.wo_buf, VramUse::Weights);
    L.router = upload_matrix(model::require_tensor(f, p + "ffn_gate_inp.weight", {E, X}),
                             L.router_buf, VramUse::Weights);
    expert_tensors_.push_back(model::require_expert_tensors(f, l, E, F, X));
    layers_.push_back(std::move(L));
  }

  // Expert homes: -cmoe all on the CPU, -ncmoe N the first N layers, else all in VRAM.
  std::vector<bool> gpu_home(static_cast<size_t>(cfg_.n_layer));
  uint64_t gpu_expert_bytes = 0;
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    const bool on_gpu = !opt.cpu_moe && l >= opt.n_cpu_moe;
    gpu_home[static_cast<size_t>(l)] = on_gpu;
    if (on_gpu) {
      const auto& t = expert_tensors_[static_cast<size_t>(l)];
      gpu_expert_bytes += t.gate->n_bytes + t.up->n_bytes + t.down->n_bytes;
    }
  }
  uint64_t pool_bytes = 0;
  if (opt.moe_resident_mib > 0) {
    pool_bytes = static_cast<uint64_t>(opt.moe_resident_mib) << 20;
  } else if (opt.moe_resident_mib < 0) {
    // Auto: what is left after the GPU-homed experts, an f16 KV cache for n_ctx and a reserve.
    uint64_t kv = 0;
    for (const Layer& L : layers_) {
      kv += static_cast<uint64_t>(L.n_head_kv * (hk + hv)) * 2u *
            static_cast<uint64_t>(std::max<int64_t>(opt.n_ctx, 1));
    }
    const uint64_t need = gpu_expert_bytes + kv + (uint64_t{kAutoPoolReserveMib} << 20);
    pool_bytes = budget_.available() > need ? budget_.available() - need : 0;
  }
  residency_ = std::make_unique<ExpertResidency>(budget_, expert_tensors_, gpu_home, X, pool_bytes);
  cpu_experts_ = cpu_experts ? std::move(cpu_experts) : model::cpu_experts_for(f, pool_);

  // Device routing buffers and the constant index lists of the one-group-per-item layout.
  const int64_t items = kDeviceRoutingMaxTokens * cfg_.n_expert_used;
  const size_t bytes = static_cast<size_t>(kDeviceRoutingMaxTokens * X + 2 * items) * 4 +
                       static_cast<size_t>(3 * items) * sizeof(void*) +
                       static_cast<size_t>(3 * items + kDeviceRoutingMaxTokens + 2) * 4 + 256;
  dr_.buf = budget_.allocate(bytes, VramUse::Scratch, "device routing");
  MetaWriter w(dr_.buf.as<unsigned char>());  // only offsets are computed here
  dr_.gate = w.take<const void*>(items);
  dr_.up = w.take<const void*>(items);
  dr_.down = w.take<const void*>(items);
  dr_.probs = w.take<float>(kDeviceRoutingMaxTokens * X);
  dr_.weights = w.take<float>(items);
  dr_.ids = w.take<int32_t>(items);
  dr_.ident = w.take<int32_t>(items + 1);
  dr_.x_rows = w.take<int32_t>(items);
  dr_.tok_off = w.take<int32_t>(kDeviceRoutingMaxTokens + 1);
  std::vector<int32_t> ident(static_cast<size_t>(items + 1)), x_rows(static_cast<size_t>(items)),
      tok_off(static_cast<size_t>(kDeviceRoutingMaxTokens + 1));
  for (int64_t i = 0; i <= items; ++i) ident[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  for (int64_t i = 0; i < items; ++i) {
    x_rows[static_cast<size_t>(i)] = static_cast<int32_t>(i / cfg_.n_expert_used);
  }
  for (int64_t t = 0; t <= kDeviceRoutingMaxTokens; ++t) {
    tok_off[static_cast<size_t>(t)] = static_cast<int32_t>(t * cfg_.n_expert_used);
  }
  MOE_CUDA_CHECK(cudaMemcpy(dr_.ident, ident.data(), ident.size() * 4, cudaMemcpyHostToDevice));
  MOE_CUDA_CHECK(cudaMemcpy(dr_.x_rows, x_rows.data(), x_rows.size() * 4, cudaMemcpyHostToDevice));
  MOE_CUDA_CHECK(
      cudaMemcpy(dr_.tok_off, tok_off.data(), tok_off.size() * 4, cudaMemcpyHostToDevice));
}

Qwen3MoeGpu::~Qwen3MoeGpu() {
  if (stream_) {
    (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
  }
}

cuda::DeviceMatrix Qwen3MoeGpu::upload_matrix(const gguf::TensorInfo& t, VramBuffer& buf,
                                              VramUse use) {
  const cpu::WeightMatrix w = model::weight_matrix(t);
  if (!cuda::cuda_type_supported(t.type())) {
    throw Error(std::string(t.name) + ": type " + ggml_type_label(static_cast<uint32_t>(t.type())) +
                " is not supported on the GPU");
  }
  buf = budget_.allocate(t.n_bytes, use, std::string(t.name));
  MOE_CUDA_CHECK(cudaMemcpy(buf.get(), t.data, t.n_bytes, cudaMemcpyHostToDevice));
  return cuda::make_device_matrix(t.type(), buf.get(), w.n_in, w.n_out);
}

VramBuffer Qwen3MoeGpu::upload_vector(const gguf::TensorInfo& t) {
  const std::vector<float> v = model::vector_f32(t);
  VramBuffer b = budget_.allocate(v.size() * sizeof(float), VramUse::Weights, std::string(t.name));
  MOE_CUDA_CHECK(cudaMemcpy(b.get(), v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
  return b;
}

Qwen3MoeGpu::SeqSlot& Qwen3MoeGpu::ensure_kv(const KvCache& cache) {
  const GgmlType kt = model::kv_ggml_type(cache.k_type());
  const GgmlType vt = model::kv_ggml_type(cache.v_type());
  for (GgmlType t : {kt, vt}) {
    if (t != GgmlType::F32 && t != GgmlType::F16 && t != GgmlType::Q8_0) {
      throw Error("KV cache type " + ggml_type_label(static_cast<uint32_t>(t)) +
                  " is not supported on the GPU (f32, f16, q8_0)");
    }
  }
  ++use_clock_;
  SeqSlot* slot = nullptr;
  for (SeqSlot& s : seqs_) {
    if (s.owner == &cache) slot = &s;
  }
  if (cache.n_past() != 0) {
    // Continuing: only a sequence this model evaluated up to exactly here has its K/V in VRAM.
    if (!slot || slot->past != cache.n_past()) {
      throw Error(
          "GPU model: the positions of this KV cache are not in VRAM (a sequence must "
          "be evaluated from position 0 by this model, and at most " +
          std::to_string(kMaxSequences) + " sequences are kept)");
    }
    slot->last_use = use_clock_;
    return *slot;
  }
  // A new sequence: reuse its own slot, else a fresh one, else the least recently used.
  if (!slot && seqs_.size() < kMaxSequences) slot = &seqs_.emplace_back();
  if (!slot) {
    slot = &*std::min_element(seqs_.begin(), seqs_.end(), [](const SeqSlot& a, const SeqSlot& b) {
      return a.last_use < b.last_use;
    });
  }
  slot->owner = &cache;
  slot->past = 0;
  slot->last_use = use_clock_;
  if (!slot->layers.empty() && cache.n_ctx() <= slot->ctx && kt == slot->k_type &&
      vt == slot->v_type) {
    return *slot;
  }
  slot->layers.clear();  // free before allocating, so the budget sees only the new size
  slot->ctx = (cache.n_ctx() + 255) / 256 * 256;
  slot->k_type = kt;
  slot->v_type = vt;
  slot->layers.resize(layers_.size());
  for (size_t l = 0; l < layers_.size(); ++l) {
    const int64_t ke = layers_[l].n_head_kv * cfg_.head_dim_k;
    const int64_t ve = layers_[l].n_head_kv * cfg_.head_dim_v;
    const size_t kb = kv_row_bytes(kt, ke, "K"), vb = kv_row_bytes(vt, ve, "V");
    const auto rows = static_cast<size_t>(slot->ctx);
    KvLayer& k = slot->layers[l];
    k.k = budget_.allocate(kb * rows, VramUse::Kv, "K cache layer " + std::to_string(l));
    k.v = budget_.allocate(vb * rows, VramUse::Kv, "V cache layer " + std::to_string(l));
    k.view = {kt, vt, k.k.get(), k.v.get(), kb, vb, ke, ve, slot->ctx};
  }
  return *slot;
}

float* Qwen3MoeGpu::scratch(VramBuffer& b, size_t floats, const char* what) {
  const size_t bytes = std::max<size_t>(floats, 1) * sizeof(float);
  if (b.size() < bytes) {
    b = VramBuffer{};  // free first so the budget sees only the new size
    b = budget_.allocate(bytes, VramUse::Scratch, what);
  }
  return b.as<float>();
}

void Qwen3MoeGpu::ensure_scratch(int64_t n) {
  if (n <= scratch_tokens_) return;
  const auto E = static_cast<size_t>(cfg_.n_embd);
  const auto N = static_cast<size_t>(n);
  const auto H = static_cast<size_t>(cfg_.max_n_head());
  const auto HK = static_cast<size_t>(cfg_.max_n_head_kv());
  const auto hd = static_cast<size_t>(std::max(cfg_.head_dim_k, cfg_.head_dim_v));
  const auto K = static_cast<size_t>(cfg_.n_expert_used);
  const auto F = static_cast<size_t>(cfg_.n_ff_exp);
  const auto X = static_cast<size_t>(cfg_.n_expert);
  scratch(d_x_, N * E, "scratch x");
  scratch(d_xn_, N * E, "scratch xn");
  scratch(d_tmp_, N * E, "scratch tmp");
  scratch(d_moe_, N * E, "scratch moe");
  scratch(d_cpu_out_, N * E, "scratch cpu out");
  scratch(d_q_, N * H * hd, "scratch q");
  scratch(d_attn_, N * H * hd, "scratch attn");
  scratch(d_k_, N * HK * hd, "scratch k");
  scratch(d_v_, N * HK * hd, "scratch v");
  scratch(d_rlogits_, N * X, "scratch router");
  scratch(d_g_, N * K * F, "scratch gate");
  scratch(d_u_, N * K * F, "scratch up");
  scratch(d_h_, N * K * F, "scratch swiglu");
  scratch(d_y_, N * K * E, "scratch expert out");
  // Expert lists: 3 pointers per group, 6 ints per item, 2 offset arrays, alignment slack.
  const size_t meta = 3 * sizeof(void*) * X + (6 * N * K + N + X + 2) * 4 + 256;
  scratch(d_meta_, meta / sizeof(float) + 1, "scratch expert lists");
  scratch(d_logits_, static_cast<size_t>(kLogitRows) * static_cast<size_t>(cfg_.n_vocab),
          "scratch logits");
  h_x_.reserve(N * E * sizeof(float));
  h_xn_.reserve(N * E * sizeof(float));
  h_cpu_out_.reserve(N * E * sizeof(float));
  h_rlogits_.reserve(N * X * sizeof(float));
  h_meta_.reserve(meta);
  grow(rprobs_, n * cfg_.n_expert);
  grow(rweights_, n * cfg_.n_expert_used);
  grow(rids_, n * cfg_.n_expert_used);
  grow(forced_, cfg_.n_expert_used);
  scratch_tokens_ = n;
}

void Qwen3MoeGpu::run_experts(int64_t l, int64_t n, const model::ForwardHooks* hooks) {
  const int64_t E = cfg_.n_embd, X = cfg_.n_expert, K = cfg_.n_expert_used, F = cfg_.n_ff_exp;
  const bool cpu_layer = !residency_->layer_on_gpu(l);
  float* hl = h_rlogits_.get<float>();
  float* hxn = h_xn_.get<float>();
  MOE_CUDA_CHECK(cudaMemcpyAsync(hl, d_rlogits_.get(), static_cast<size_t>(n * X) * 4,
                                 cudaMemcpyDeviceToHost, stream_));
  if (cpu_layer) {
    MOE_CUDA_CHECK(cudaMemcpyAsync(hxn, d_xn_.get(), static_cast<size_t>(n * E) * 4,
                                   cudaMemcpyDeviceToHost, stream_));
  }
  MOE_CUDA_CHECK(cudaStreamSynchronize(stream_));

  // Routing on the host: the same function and hooks as the CPU path.
  model::route_batch(hl, n, X, K, l, pos0_, hooks, forced_.data(), rprobs_.data(), rids_.data(),
                     rweights_.data());

  // Split the items: experts with a VRAM copy run on the GPU, grouped by expert.
  cpu_items_.clear();
  std::vector<int32_t>& group_of = gpu_expert_of_item_;
  group_of.assign(static_cast<size_t>(n * K), -1);
  std::vector<int32_t> count(static_cast<size_t>(X), 0);
  int64_t total = 0;
  for (int64_t i = 0; i < n * K; ++i) {
    const int32_t e = rids_[static_cast<size_t>(i)];
    residency_->record(l, e);
    if (residency_->find(l, e)) {
      group_of[static_cast<size_t>(i)] = e;
      ++count[static_cast<size_t>(e)];
      ++total;
    } else {
      cpu_items_.push_back({static_cast<int32_t>(i / K), e, rweights_[static_cast<size_t>(i)]});
    }
  }

  if (total > 0) {
    int32_t n_groups = 0;
    int64_t max_rows = 0;
    for (int64_t e = 0; e < X; ++e) {
      if (count[static_cast<size_t>(e)] > 0) ++n_groups;
      max_rows = std::max<int64_t>(max_rows, count[static_cast<size_t>(e)]);
    }
    MetaWriter w(h_meta_.get<unsigned char>());
    const void** wg = w.take<const void*>(n_groups);
    const void** wu = w.take<const void*>(n_groups);
    const void** wd = w.take<const void*>(n_groups);
    int32_t* offsets = w.take<int32_t>(n_groups + 1);
    int32_t* x_rows = w.take<int32_t>(total);
    int32_t* ident = w.take<int32_t>(total);
    int32_t* tok_off = w.take<int32_t>(n + 1);
    int32_t* rows = w.take<int32_t>(total);
    float* weights = w.take<float>(total);
    // Groups in expert order; next_row[e] is where expert e's next item goes.
    std::vector<int32_t> next_row(static_cast<size_t>(X), 0);
    int32_t g = 0, acc = 0;
    offsets[0] = 0;
    for (int64_t e = 0; e < X; ++e) {
      if (count[static_cast<size_t>(e)] == 0) continue;
      const ResidentExpert* r = residency_->find(l, e);
      wg[g] = r->gate;
      wu[g] = r->up;
      wd[g] = r->down;
      next_row[static_cast<size_t>(e)] = acc;
      acc += count[static_cast<size_t>(e)];
      offsets[++g] = acc;
    }
    int32_t k = 0;
    for (int64_t t = 0; t < n; ++t) {
      tok_off[t] = k;
      for (int64_t j = 0; j < K; ++j) {
        const int32_t e = group_of[static_cast<size_t>(t * K + j)];
        if (e < 0) continue;
        const int32_t row = next_row[static_cast<size_t>(e)]++;
        x_rows[row] = static_cast<int32_t>(t);
        rows[k] = row;
        weights[k] = rweights_[static_cast<size_t>(t * K + j)];
        ++k;
      }
    }
    tok_off[n] = k;
    for (int32_t i = 0; i < total; ++i) ident[i] = i;

    unsigned char* hbase = h_meta_.get<unsigned char>();
    unsigned char* dbase = d_meta_.as<unsigned char>();
    auto dev = [&](const void* host_ptr) {
      return dbase + (static_cast<const unsigned char*>(host_ptr) - hbase);
    };
    MOE_CUDA_CHECK(cudaMemcpyAsync(dbase, hbase, w.size(), cudaMemcpyHostToDevice, stream_));

    const model::ExpertLayerTensors& et = expert_tensors_[static_cast<size_t>(l)];
    const auto rb = [](const gguf::TensorInfo* t, int64_t n_in) {
      return static_cast<size_t>(*ggml_row_bytes(t->type(), static_cast<uint64_t>(n_in)));
    };
    const auto* d_off = reinterpret_cast<const int32_t*>(dev(offsets));
    float* dg = d_g_.as<float>();
    float* du = d_u_.as<float>();
    float* dh = d_h_.as<float>();
    float* dy = d_y_.as<float>();
    cuda::grouped_matmul(et.gate->type(), E, F, rb(et.gate, E),
                         reinterpret_cast<const void* const*>(dev(wg)), d_off, n_groups,
                         reinterpret_cast<const int32_t*>(dev(x_rows)), total, max_rows,
                         d_xn_.as<float>(), E, dg, stream_);
    cuda::grouped_matmul(et.up->type(), E, F, rb(et.up, E),
                         reinterpret_cast<const void* const*>(dev(wu)), d_off, n_groups,
                         reinterpret_cast<const int32_t*>(dev(x_rows)), total, max_rows,
                         d_xn_.as<float>(), E, du, stream_);
    cuda::swiglu(dg, du, dh, total * F, stream_);
    cuda::grouped_matmul(et.down->type(), F, E, rb(et.down, F),
                         reinterpret_cast<const void* const*>(dev(wd)), d_off, n_groups,
                         reinterpret_cast<const int32_t*>(dev(ident)), total, max_rows, dh, F, dy,
                         stream_);
    cuda::combine_rows(dy, reinterpret_cast<const int32_t*>(dev(tok_off)),
                       reinterpret_cast<const int32_t*>(dev(rows)),
                       reinterpret_cast<const float*>(dev(weights)), n, E, /*accumulate=*/true,
                       d_x_.as<float>(), stream_);
  }

  // The CPU's share, computed while the GPU works on its own.
  if (!cpu_items_.empty()) {
    float* hout = h_cpu_out_.get<float>();
    cpu_experts_->run(l, hxn, n, cpu_items_, hout);
    MOE_CUDA_CHECK(cudaMemcpyAsync(d_cpu_out_.get(), hout, static_cast<size_t>(n * E) * 4,
                                   cudaMemcpyHostToDevice, stream_));
    cuda::add_inplace(d_x_.as<float>(), d_cpu_out_.as<float>(), n * E, stream_);
  }
}

bool Qwen3MoeGpu::routes_on_device(int64_t l, int64_t n, const model::ForwardHooks* hooks) const {
  // Hooks need the host's routing; prefill wants the host's grouping by expert (each expert's
  // weights read once for all its tokens), which one group per item would not give.
  const bool host_hooks = hooks && (hooks->force_experts || hooks->observe_layer);
  return residency_->layer_on_gpu(l) && n <= kDeviceRoutingMaxTokens && !host_hooks;
}

void Qwen3MoeGpu::run_experts_on_device(int64_t l, int64_t n) {
  const int64_t E = cfg_.n_embd, X = cfg_.n_expert, K = cfg_.n_expert_used, F = cfg_.n_ff_exp;
  const int64_t items = n * K;
  cuda::router_topk(d_rlogits_.as<float>(), n, X, K, dr_.probs, dr_.ids, dr_.weights, stream_);
  cuda::gather_expert_pointers(dr_.ids, items, residency_->device_table(l), X, dr_.gate, dr_.up,
                               dr_.down, stream_);
  const model::ExpertLayerTensors& et = expert_tensors_[static_cast<size_t>(l)];
  const auto rb = [](const gguf::TensorInfo* t, int64_t n_in) {
    return static_cast<size_t>(*ggml_row_bytes(t->type(), static_cast<uint64_t>(n_in)));
  };
  const auto ig = static_cast<int32_t>(items);
  float* dg = d_g_.as<float>();
  float* du = d_u_.as<float>();
  float* dh = d_h_.as<float>();
  float* dy = d_y_.as<float>();
  cuda::grouped_matmul(et.gate->type(), E, F, rb(et.gate, E), dr_.gate, dr_.ident, ig, dr_.x_rows,
                       items, 1, d_xn_.as<float>(), E, dg, stream_);
  cuda::grouped_matmul(et.up->type(), E, F, rb(et.up, E), dr_.up, dr_.ident, ig, dr_.x_rows, items,
                       1, d_xn_.as<float>(), E, du, stream_);
  cuda::swiglu(dg, du, dh, items * F, stream_);
  cuda::grouped_matmul(et.down->type(), F, E, rb(et.down, F), dr_.down, dr_.ident, ig, dr_.ident,
                       items, 1, dh, F, dy, stream_);
  cuda::combine_rows(dy, dr_.tok_off, dr_.ident, dr_.weights, n, E, /*accumulate=*/true,
                     d_x_.as<float>(), stream_);
}

void Qwen3MoeGpu::maybe_refill_pool() {
  // Refill at 1, 8, 64, ... routed items: early from the first prompt, then as the profile
  // settles; each refill copies only the experts that change.
  if (residency_->pool_slots() == 0 || residency_->routed() < refill_at_) return;
  residency_->refill();
  refill_at_ = std::max<uint64_t>(refill_at_ * 8, residency_->routed() + 1);
}

void Qwen3MoeGpu::forward(std::span<const int32_t> tokens, KvCache& cache, model::LogitsMode mode,
                          float* logits, const model::ForwardHooks* hooks) {
  const auto n = static_cast<int64_t>(tokens.size());
  model::check_tokens(tokens, cfg_.n_vocab);
  cache.check_room(n);
  SeqSlot& seq = ensure_kv(cache);
  ensure_scratch(n);
  const int64_t pos0 = cache.n_past();
  pos0_ = pos0;
  const int64_t E = cfg_.n_embd, hk = cfg_.head_dim_k, hv = cfg_.head_dim_v, V = cfg_.n_vocab;
  const float eps = cfg_.rms_eps;
  try {
    // Embeddings on the host, as llama.cpp keeps token_embd in RAM: it is big and read sparsely.
    float* hx = h_x_.get<float>();
    emb_.embed(tokens, hx);
    float* x = d_x_.as<float>();
    float* xn = d_xn_.as<float>();
    float* q = d_q_.as<float>();
    float* k = d_k_.as<float>();
    float* v = d_v_.as<float>();
    MOE_CUDA_CHECK(
        cudaMemcpyAsync(x, hx, static_cast<size_t>(n * E) * 4, cudaMemcpyHostToDevice, stream_));
    std::vector<float> l_out;
    for (int64_t l = 0; l < cfg_.n_layer; ++l) {
      const Layer& L = layers_[static_cast<size_t>(l)];
      const int64_t H = L.n_head, HK = L.n_head_kv;
      cuda::rmsnorm(x, L.attn_norm.as<float>(), xn, n, E, eps, stream_);
      cuda::matmul(L.wq, xn, n, q, stream_);
      cuda::matmul(L.wk, xn, n, k, stream_);
      cuda::matmul(L.wv, xn, n, v, stream_);
      cuda::rmsnorm(q, L.q_norm.as<float>(), q, n * H, hk, eps, stream_);
      cuda::rmsnorm(k, L.k_norm.as<float>(), k, n * HK, hk, eps, stream_);
      cuda::rope_neox(q, n, H * hk, H, hk, cfg_.n_rot, pos0, cfg_.rope_freq_base, stream_);
      cuda::rope_neox(k, n, HK * hk, HK, hk, cfg_.n_rot, pos0, cfg_.rope_freq_base, stream_);
      const cuda::DeviceKvLayer& kvl = seq.layers[static_cast<size_t>(l)].view;
      cuda::kv_store(kvl, k, v, n, pos0, stream_);
      // Decode splits the positions across blocks; its scratch comes from the budget too.
      const size_t ws = cuda::attention_workspace_bytes(n, pos0, H, HK, hv);
      if (ws > 0) scratch(d_attn_ws_, (ws + 3) / 4, "attention scratch");
      cuda::attention(kvl, q, H * hk, n, pos0, H, HK, hk, hv,
                      1.0f / std::sqrt(static_cast<float>(hk)), d_attn_.as<float>(),
                      ws > 0 ? d_attn_ws_.get() : nullptr, ws, stream_);
      cuda::matmul(L.wo, d_attn_.as<float>(), n, d_tmp_.as<float>(), stream_);
      cuda::add_inplace(x, d_tmp_.as<float>(), n * E, stream_);

      cuda::rmsnorm(x, L.ffn_norm.as<float>(), xn, n, E, eps, stream_);
      cuda::matmul(L.router, xn, n, d_rlogits_.as<float>(), stream_);
      if (routes_on_device(l, n, hooks)) {
        run_experts_on_device(l, n);
      } else {
        run_experts(l, n, hooks);
      }

      if (hooks && hooks->observe_layer) {
        l_out.resize(static_cast<size_t>(n * E));
        MOE_CUDA_CHECK(
            cudaMemcpyAsync(l_out.data(), x, l_out.size() * 4, cudaMemcpyDeviceToHost, stream_));
        MOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
        hooks->observe_layer(model::layer_trace(cfg_, l, pos0, n, h_rlogits_.get<float>(),
                                                rprobs_.data(), rids_.data(), rweights_.data(),
                                                l_out.data()));
      }
    }

    // Output head for the rows whose logits were asked for, a bounded chunk at a time.
    const int64_t first = mode == model::LogitsMode::All ? 0 : n - 1;
    const int64_t rows = n - first;
    cuda::rmsnorm(x + first * E, output_norm_.as<float>(), xn, rows, E, eps, stream_);
    for (int64_t r = 0; r < rows; r += kLogitRows) {
      const int64_t m = std::min(kLogitRows, rows - r);
      cuda::matmul(output_, xn + r * E, m, d_logits_.as<float>(), stream_);
      MOE_CUDA_CHECK(cudaMemcpyAsync(logits + r * V, d_logits_.get(),
                                     static_cast<size_t>(m * V) * 4, cudaMemcpyDeviceToHost,
                                     stream_));
    }
    MOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  } catch (...) {
    // Nothing enqueued may still read the pinned staging buffers when the next call refills
    // them; the cache is not advanced, so its positions are simply rewritten next time.
    (void)cudaStreamSynchronize(stream_);
    throw;
  }
  cache.advance(n);
  seq.past = cache.n_past();
  maybe_refill_pool();
}

std::string Qwen3MoeGpu::describe() const {
  return "GPU " + std::to_string(opt_.device) + " " + device_name_ + ": attention, norms, " +
         "router, output head and KV cache of all " + std::to_string(cfg_.n_layer) +
         " layers in VRAM; " + residency_->summary() + "; VRAM " + budget_.summary();
}

}  // namespace moe::gpu
