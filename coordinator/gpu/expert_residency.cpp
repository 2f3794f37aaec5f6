#include "coordinator/gpu/expert_residency.h"

#include <algorithm>
#include <numeric>

#include "common/error.h"
#include "experts/tensor_table.h"
#include "kernels/cuda/cuda_check.h"

namespace moe::gpu {
namespace {

// Sub-matrices start on 256-byte boundaries so device loads of any width stay aligned.
size_t align_up(size_t n) { return (n + 255) & ~size_t{255}; }

std::vector<bool> cpu_layers(const std::vector<bool>& gpu_home) {
  std::vector<bool> cpu(gpu_home.size());
  for (size_t l = 0; l < gpu_home.size(); ++l) cpu[l] = !gpu_home[l];
  return cpu;
}

}  // namespace

int64_t ExpertResidency::pool_slots_for(const std::vector<model::ExpertLayerTensors>& layers,
                                        const std::vector<bool>& gpu_home, int64_t n_expert,
                                        uint64_t pool_bytes) {
  const uint64_t slot = slot_bytes_for(layers, gpu_home);
  if (slot == 0 || pool_bytes < slot) return 0;
  const auto n_cpu = std::count(gpu_home.begin(), gpu_home.end(), false);
  // No point in more slots than there are CPU-homed experts.
  return std::min<int64_t>(static_cast<int64_t>(pool_bytes / slot), n_cpu * n_expert);
}

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
                                 uint64_t pool_bytes, model::Grouping grouping)
    : budget_(budget),
      layers_(layers),
      gpu_home_(gpu_home),
      n_expert_(n_expert),
      policy_(cpu_layers(gpu_home), n_expert,
              pool_slots_for(layers, gpu_home, n_expert, pool_bytes), grouping, kHalfLifeTokens) {
  const auto n_layer = static_cast<int64_t>(layers.size());
  if (gpu_home_.size() != layers.size()) throw Error("expert residency: layer count mismatch");
  table_.assign(static_cast<size_t>(n_layer * n_expert), ResidentExpert{});
  direct_.assign(table_.size(), ResidentExpert{});
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

  // Every layer's table (a CPU-homed layer's lists its pool slots, synced_table()).
  std::vector<const void*> host(table_.size() * 3, nullptr);
  for (size_t i = 0; i < table_.size(); ++i) {
    host[3 * i] = table_[i].gate;
    host[3 * i + 1] = table_[i].up;
    host[3 * i + 2] = table_[i].down;
  }
  tables_ = budget.allocate(host.size() * sizeof(void*), VramUse::Experts, "expert tables");
  MOE_CUDA_CHECK(
      cudaMemcpy(tables_.get(), host.data(), host.size() * sizeof(void*), cudaMemcpyHostToDevice));
  table_stale_.assign(layers.size(), 0);

  n_slots_ = policy_.n_slots();
  if (n_slots_ > 0) {
    pool_ = budget.allocate(static_cast<size_t>(n_slots_) * slot_bytes_, VramUse::Pool,
                            "resident expert pool (" + std::to_string(n_slots_) + " slots)");
    slot_owner_.assign(static_cast<size_t>(n_slots_), -1);
  }
}

ResidentExpert ExpertResidency::slot_view(int64_t layer, unsigned char* dst) const {
  const SlotLayout& lay = layout_[static_cast<size_t>(layer)];
  return {dst, dst + lay.up, dst + lay.down};
}

ResidentExpert ExpertResidency::chunk_view(int64_t layer, unsigned char* chunk, int64_t capacity,
                                           int64_t at) const {
  const model::ExpertLayerTensors& t = layers_[static_cast<size_t>(layer)];
  const auto cap = static_cast<size_t>(capacity), i = static_cast<size_t>(at);
  unsigned char* up = chunk + cap * t.gate.expert_bytes();
  unsigned char* down = up + cap * t.up.expert_bytes();
  return {chunk + i * t.gate.expert_bytes(), up + i * t.up.expert_bytes(),
          down + i * t.down.expert_bytes()};
}

void ExpertResidency::stage_run(int64_t layer, int64_t first, int64_t count, unsigned char* chunk,
                                int64_t capacity, int64_t at, cudaStream_t stream) const {
  const model::ExpertLayerTensors& t = layers_[static_cast<size_t>(layer)];
  // The three planes fit: slot_bytes_ is at least an expert's three matrices.
  if (at < 0 || count < 1 || at + count > capacity) {
    throw Error("stage_run: experts " + std::to_string(first) + "+" + std::to_string(count) +
                " do not fit a chunk of " + std::to_string(capacity) + " slots at " +
                std::to_string(at));
  }
  const ResidentExpert to = chunk_view(layer, chunk, capacity, at);
  // A fused gate_up tensor interleaves the experts' gates with their ups: a strided copy.
  const auto copy = [&](const void* dst, const model::ExpertProjection& p) {
    const size_t width = p.expert_bytes();
    const size_t pitch = static_cast<size_t>(p.rows_per_expert) * p.row_bytes;
    MOE_CUDA_CHECK(cudaMemcpy2DAsync(const_cast<void*>(dst), width, p.data(first), pitch, width,
                                     static_cast<size_t>(count), cudaMemcpyHostToDevice, stream));
  };
  copy(to.gate, t.gate);
  copy(to.up, t.up);
  copy(to.down, t.down);
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

int64_t ExpertResidency::reshape(uint64_t pool_bytes, model::Grouping g) {
  const int64_t slots = pool_slots_for(layers_, gpu_home_, n_expert_, pool_bytes);
  // Empty first: every resident expert goes back to the CPU, the old pool back to the budget.
  for (int64_t s = 0; s < n_slots_; ++s) assign(s, -1);
  policy_.reshape(0, g);
  slot_owner_.clear();
  n_slots_ = 0;
  pool_ = VramBuffer{};
  if (slots == 0) return 0;
  pool_ = budget_.allocate(static_cast<size_t>(slots) * slot_bytes_, VramUse::Pool,
                           "resident expert pool (" + std::to_string(slots) + " slots)");
  policy_.reshape(slots, g);
  slot_owner_.assign(static_cast<size_t>(slots), -1);
  n_slots_ = slots;
  return refill();
}

std::pair<int64_t, int64_t> ExpertResidency::resident_and_direct(int64_t layer) const {
  int64_t resident = 0, in_place = 0;
  for (int64_t e = 0; e < n_expert_; ++e) {
    if (find(layer, e) != nullptr) {
      ++resident;
    } else if (direct(layer, e)) {
      ++in_place;
    }
  }
  return {resident, in_place};
}

int64_t ExpertResidency::pool_filled() const {
  return std::count_if(slot_owner_.begin(), slot_owner_.end(), [](int64_t o) { return o >= 0; });
}

void ExpertResidency::assign(int64_t slot, int64_t key) {
  int64_t& owner = slot_owner_[static_cast<size_t>(slot)];
  // A re-plan may move a key to another slot before its old slot is reassigned: the old owner's
  // entry is cleared only while it still points here.
  if (owner >= 0 && table_[static_cast<size_t>(owner)].gate == slot_base(slot)) {
    table_[static_cast<size_t>(owner)] = ResidentExpert{};
  }
  if (owner >= 0) table_stale_[static_cast<size_t>(owner / n_expert_)] = 1;
  owner = key;
  if (key >= 0) {
    table_[static_cast<size_t>(key)] = slot_view(key / n_expert_, slot_base(slot));
    table_stale_[static_cast<size_t>(key / n_expert_)] = 1;
  }
}

const void* const* ExpertResidency::synced_table(int64_t layer, cudaStream_t stream) {
  const void** dev = tables_.as<const void*>() + layer * n_expert_ * 3;
  char& stale = table_stale_[static_cast<size_t>(layer)];
  if (stale) {
    std::vector<const void*>& row = table_row_;
    row.resize(static_cast<size_t>(n_expert_ * 3));
    for (int64_t e = 0; e < n_expert_; ++e) {
      const auto i = static_cast<size_t>(layer * n_expert_ + e);
      const ResidentExpert& r = table_[i].gate ? table_[i] : direct_[i];
      row[static_cast<size_t>(3 * e)] = r.gate;
      row[static_cast<size_t>(3 * e + 1)] = r.up;
      row[static_cast<size_t>(3 * e + 2)] = r.down;
    }
    // From pageable memory: the call stages the row before it returns, so it may change after.
    MOE_CUDA_CHECK(cudaMemcpyAsync(dev, row.data(), row.size() * sizeof(void*),
                                   cudaMemcpyHostToDevice, stream));
    stale = 0;
  }
  return dev;
}

void ExpertResidency::set_direct(int64_t layer, int64_t expert, const ResidentExpert& view) {
  if (layer_on_gpu(layer)) throw Error("expert residency: direct reads of a GPU-homed layer");
  ResidentExpert& d = direct_[static_cast<size_t>(layer * n_expert_ + expert)];
  if (d.gate == view.gate && d.up == view.up && d.down == view.down) return;
  d = view;
  table_stale_[static_cast<size_t>(layer)] = 1;
}

unsigned char* ExpertResidency::admit(int64_t layer, int64_t expert) {
  if (n_slots_ == 0) return nullptr;
  const int64_t key = layer * n_expert_ + expert;
  const int64_t slot = policy_.admit(layer, expert);
  if (slot < 0 || slot_owner_[static_cast<size_t>(slot)] == key) return nullptr;
  assign(slot, key);
  return slot_base(slot);
}

void ExpertResidency::upload(int64_t layer, int64_t expert, int64_t slot) {
  const model::ExpertLayerTensors& t = layers_[static_cast<size_t>(layer)];
  const SlotLayout& lay = layout_[static_cast<size_t>(layer)];
  unsigned char* base = slot_base(slot);
  MOE_CUDA_CHECK(
      cudaMemcpy(base, t.gate.data(expert), t.gate.expert_bytes(), cudaMemcpyHostToDevice));
  MOE_CUDA_CHECK(
      cudaMemcpy(base + lay.up, t.up.data(expert), t.up.expert_bytes(), cudaMemcpyHostToDevice));
  MOE_CUDA_CHECK(cudaMemcpy(base + lay.down, t.down.data(expert), t.down.expert_bytes(),
                            cudaMemcpyHostToDevice));
}

void ExpertResidency::set_counts(const std::vector<uint64_t>& counts) {
  if (counts.size() != counts_.size()) {
    throw Error("expert residency: a profile of " + std::to_string(counts.size()) + " counts for " +
                std::to_string(counts_.size()) + " experts");
  }
  counts_ = counts;
  routed_ = std::accumulate(counts_.begin(), counts_.end(), uint64_t{0});
  policy_.set_scores(counts);
}

int64_t ExpertResidency::refill() {
  if (n_slots_ == 0) return 0;
  int64_t copied = 0;
  for (const model::ResidencyPolicy::Assignment& a : policy_.plan()) {
    // The slot's old owner is computed on the CPU from now on; the newcomer from this copy.
    assign(a.slot, -1);
    if (a.key < 0) continue;
    upload(a.key / n_expert_, a.key % n_expert_, a.slot);
    assign(a.slot, a.key);
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
                   std::to_string(mib(slot_bytes_ * static_cast<uint64_t>(n_slots_))) + " MiB, " +
                   (policy_.grouping() == model::Grouping::Layout ? "per-layer ranges"
                                                                  : "one pool across layers") +
                   ")"
             : " (no VRAM pool)";
  }
  return s;
}

}  // namespace moe::gpu
