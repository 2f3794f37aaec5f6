#include "coordinator/model/forced_routing.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "common/error.h"

namespace moe::model {
namespace {

std::vector<int32_t> read_i32(const std::filesystem::path& p, int64_t k) {
  std::ifstream f(p, std::ios::binary | std::ios::ate);
  if (!f) throw Error("cannot open " + p.string());
  const auto bytes = static_cast<int64_t>(f.tellg());
  if (bytes <= 0 || bytes % (4 * k) != 0) {
    throw Error(p.string() + ": size " + std::to_string(bytes) +
                " is not a whole number of rows of " + std::to_string(k) + " int32");
  }
  std::vector<int32_t> v(static_cast<size_t>(bytes / 4));
  f.seekg(0);
  f.read(reinterpret_cast<char*>(v.data()), bytes);
  if (!f) throw Error("cannot read " + p.string());
  return v;
}

}  // namespace

ForcedRouting::ForcedRouting(const std::string& dir, int64_t n_layer, int64_t n_expert_used)
    : k_(n_expert_used) {
  namespace fs = std::filesystem;
  for (int64_t l = 0; l < n_layer; ++l) {
    const std::string L = std::to_string(l);
    prompt_.push_back(read_i32(fs::path(dir) / ("moe_topk_" + L + ".i32"), k_));
    const int64_t rows = static_cast<int64_t>(prompt_.back().size()) / k_;
    if (l == 0) n_prompt_ = rows;
    if (rows != n_prompt_) throw Error(dir + ": moe_topk files disagree on the prompt length");
    const fs::path gen = fs::path(dir) / ("gen_moe_topk_" + L + ".i32");
    decode_.push_back(fs::exists(gen) ? read_i32(gen, k_) : std::vector<int32_t>{});
  }
}

bool ForcedRouting::lookup(int64_t layer, int64_t pos, int32_t* experts) const {
  if (layer < 0 || layer >= static_cast<int64_t>(prompt_.size()) || pos < 0) return false;
  const std::vector<int32_t>* src = &prompt_[static_cast<size_t>(layer)];
  int64_t row = pos;
  if (pos >= n_prompt_) {
    src = &decode_[static_cast<size_t>(layer)];
    row = pos - n_prompt_;
  }
  if ((row + 1) * k_ > static_cast<int64_t>(src->size())) return false;
  std::copy_n(src->begin() + row * k_, k_, experts);
  return true;
}

ForwardHooks ForcedRouting::hooks() const {
  ForwardHooks h;
  h.force_experts = [this](int64_t layer, int64_t pos, int32_t* experts) {
    return lookup(layer, pos, experts);
  };
  return h;
}

}  // namespace moe::model
