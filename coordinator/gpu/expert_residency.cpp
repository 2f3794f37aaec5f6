#include "coordinator/gpu/expert_residency.h"

#include <algorithm>
#include <numeric>

#include "common/error.h"
#include "coordinator/model/tensor_table.h"
#include "kernels/cuda/cuda_check.h"

namespace moe::gpu {
namespace {

// Sub-matrices start on 256-byte boundaries so device loads of any width stay aligned.
size_t align_up(size_t n) { return (n + 255) & ~size_t{255}; }

}  // namespace

uint64_t ExpertResidency::slot_bytes_for(const std::vector<model::ExpertLayerTensors>& layers,
                                         const std::vector<bool>& gpu_home) {
  uint64_t bytes = 0;
  for (size_t l = 0; l < layers.size() && l < gpu_home.size(); ++l) {
    if (gpu_home[l]) continue;
    const model::ExpertLayerTensors& t = layers[l];
    bytes =
        std::max<uint64_t>(bytes, align_up(t.gate.expert_bytes()) + align_up(t.up.expert_bytes()) +
                                      align_up(t.down.expert_bytes()));
  }
  return bytes;
}

ExpertResidency::ExpertResidency(VramBudget& budget,
                                 const std::vector<model::ExpertLayerTensors>& layers,
                                 const std::vector<bool>& gpu_home, int64_t n_expert,
                                 uint64_t pool_bytes)
    : layers_(layers), gpu_home_(gpu_home), n_expert_(n_expert) {
  const auto n_layer = static_cast<int64_t>(layers.size());
  if (gpu_home_.size() != layers.size()) throw Error("expert residency: layer count mismatch");
  table_.assign(static_cast<size_t>(n_layer * n_expert), ResidentExpert{});
  counts_.assign(table_.size(), 0);
  layout_.resize(layers.size());
  slot_bytes_ = slot_bytes_for(layers, gpu_home);

  for (int64_t l = 0; l < n_layer; ++l) {
    const model::ExpertLayerTensors& t = layers[static_cast<size_t>(l)];
    const size_t g = t.gate.expert_bytes(), u = t.up.expert_bytes();
    if (!gpu_home_[static_cast<size_t>(l)]) {
      ++n_cpu_layers_;
      layout_[static_cast<size_t>(l)] = {align_up(g), align_up(g) + align_up(u)};
      continue;
    }
    // The whole layer in VRAM, in the file's layout (gate and up may share one fused tensor).
    const std::string p = "layer " + std::to_string(l) + " experts";
    const std::vector<const gguf::TensorInfo*> tensors = t.tensors();
    std::vector<const unsigned char*> base(tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      VramBuffer b = budget.allocate(tensors[i]->n_bytes, VramUse::Experts,
                                     p + " (" + std::string(tensors[i]->name) + ")");
      MOE_CUDA_CHECK(
          cudaMemcpy(b.get(), tensors[i]->data, tensors[i]->n_bytes, cudaMemcpyHostToDevice));
      base[i] = b.as<unsigned char>();
      layer_bufs_.push_back(std::move(b));
    }
    const auto on_device = [&](const model::ExpertProjection& proj, int64_t e) -> const void* {
      const auto it = std::find(tensors.begin(), tensors.end(), proj.tensor);
      return base[static_cast<size_t>(it - tensors.begin())] + proj.offset(e);
    };
    for (int64_t e = 0; e < n_expert; ++e) {
      table_[static_cast<size_t>(l * n_expert + e)] = {on_device(t.gate, e), on_device(t.up, e),
                                                       on_device(t.down, e)};
    }
  }

  if (n_cpu_layers_ < n_layer) {
    std::vector<const void*> host(table_.size() * 3, nullptr);
    for (size_t i = 0; i < table_.size(); ++i) {
      host[3 * i] = table_[i].gate;
      host[3 * i + 1] = table_[i].up;
      host[3 * i + 2] = table_[i].down;
    }
    tables_ = budget.allocate(host.size() * sizeof(void*), VramUse::Experts, "expert tables");
    MOE_CUDA_CHECK(cudaMemcpy(tables_.get(), host.data(), host.size() * sizeof(void*),
                              cudaMemcpyHostToDevice));
  }

  if (n_cpu_layers_ > 0 && pool_bytes >= slot_bytes_ && slot_bytes_ > 0) {
    // No point in more slots than there are CPU-homed experts.
    n_slots_ =
        std::min<int64_t>(static_cast<int64_t>(pool_bytes / slot_bytes_), n_cpu_layers_ * n_expert);
    pool_ = budget.allocate(static_cast<size_t>(n_slots_) * slot_bytes_, VramUse::Pool,
                            "resident expert pool (" + std::to_string(n_slots_) + " slots)");
    slot_owner_.assign(static_cast<size_t>(n_slots_), -1);
  }
}

ResidentExpert ExpertResidency::slot_view(int64_t layer, unsigned char* dst) const {
  const SlotLayout& lay = layout_[static_cast<size_t>(layer)];
  return {dst, dst + lay.up, dst + lay.down};
}

ResidentExpert ExpertResidency::stage(int64_t layer, int64_t expert, unsigned char* dst,
                                      cudaStream_t stream) const {
  const model::ExpertLayerTensors& t = layers_[static_cast<size_t>(layer)];
  const SlotLayout& lay = layout_[static_cast<size_t>(layer)];
  MOE_CUDA_CHECK(cudaMemcpyAsync(dst, t.gate.data(expert), t.gate.expert_bytes(),
                                 cudaMemcpyHostToDevice, stream));
  MOE_CUDA_CHECK(cudaMemcpyAsync(dst + lay.up, t.up.data(expert), t.up.expert_bytes(),
                                 cudaMemcpyHostToDevice, stream));
  MOE_CUDA_CHECK(cudaMemcpyAsync(dst + lay.down, t.down.data(expert), t.down.expert_bytes(),
                                 cudaMemcpyHostToDevice, stream));
  return slot_view(layer, dst);
}

int64_t ExpertResidency::pool_filled() const {
  return std::count_if(slot_owner_.begin(), slot_owner_.end(), [](int64_t o) { return o >= 0; });
}

void ExpertResidency::upload(int64_t layer, int64_t expert, int64_t slot) {
  const model::ExpertLayerTensors& t = layers_[static_cast<size_t>(layer)];
  const SlotLayout& lay = layout_[static_cast<size_t>(layer)];
  unsigned char* base = pool_.as<unsigned char>() + static_cast<size_t>(slot) * slot_bytes_;
  MOE_CUDA_CHECK(
      cudaMemcpy(base, t.gate.data(expert), t.gate.expert_bytes(), cudaMemcpyHostToDevice));
  MOE_CUDA_CHECK(
      cudaMemcpy(base + lay.up, t.up.data(expert), t.up.expert_bytes(), cudaMemcpyHostToDevice));
  MOE_CUDA_CHECK(cudaMemcpy(base + lay.down, t.down.data(expert), t.down.expert_bytes(),
                            cudaMemcpyHostToDevice));
  table_[static_cast<size_t>(layer * n_expert_ + expert)] = {base, base + lay.up, base + lay.down};
}

void ExpertResidency::set_counts(const std::vector<uint64_t>& counts) {
  if (counts.size() != counts_.size()) {
    throw Error("expert residency: a profile of " + std::to_string(counts.size()) + " counts for " +
                std::to_string(counts_.size()) + " experts");
  }
  counts_ = counts;
  routed_ = std::accumulate(counts_.begin(), counts_.end(), uint64_t{0});
}

int64_t ExpertResidency::refill() {
  if (n_slots_ == 0) return 0;
  // Rank the CPU-homed experts by routing count.
  std::vector<int64_t> cand;
  for (int64_t i = 0; i < static_cast<int64_t>(table_.size()); ++i) {
    if (!gpu_home_[static_cast<size_t>(i / n_expert_)]) cand.push_back(i);
  }
  const auto keep = static_cast<size_t>(std::min<int64_t>(n_slots_, std::ssize(cand)));
  std::stable_sort(cand.begin(), cand.end(), [&](int64_t a, int64_t b) {
    return counts_[static_cast<size_t>(a)] > counts_[static_cast<size_t>(b)];
  });
  std::vector<char> wanted(table_.size(), 0);
  for (size_t i = 0; i < keep; ++i) wanted[static_cast<size_t>(cand[i])] = 1;
  // Free the slots whose owner is no longer wanted, then place the newcomers.
  std::vector<int64_t> free_slots;
  for (int64_t s = 0; s < n_slots_; ++s) {
    const int64_t o = slot_owner_[static_cast<size_t>(s)];
    if (o >= 0 && wanted[static_cast<size_t>(o)]) {
      wanted[static_cast<size_t>(o)] = 0;  // already resident
      continue;
    }
    if (o >= 0) table_[static_cast<size_t>(o)] = ResidentExpert{};
    slot_owner_[static_cast<size_t>(s)] = -1;
    free_slots.push_back(s);
  }
  int64_t copied = 0;
  for (size_t i = 0; i < keep; ++i) {
    const int64_t id = cand[i];
    if (!wanted[static_cast<size_t>(id)]) continue;
    const int64_t s = free_slots[static_cast<size_t>(copied)];
    upload(id / n_expert_, id % n_expert_, s);
    slot_owner_[static_cast<size_t>(s)] = id;
    ++copied;
  }
  return copied;
}

std::string ExpertResidency::summary() const {
  const auto n_layer = static_cast<int64_t>(layers_.size());
  std::string s = std::to_string(n_layer - n_cpu_layers_) + "/" + std::to_string(n_layer) +
                  " layers' experts in VRAM";
  if (n_cpu_layers_ > 0) {
    s += ", " + std::to_string(n_cpu_layers_) + " on the CPU";
    s += n_slots_ > 0
             ? " with a pool of " + std::to_string(n_slots_) + " expert slots (" +
                   std::to_string(mib(slot_bytes_ * static_cast<uint64_t>(n_slots_))) + " MiB)"
             : " (no VRAM pool)";
  }
  return s;
}

}  // namespace moe::gpu
