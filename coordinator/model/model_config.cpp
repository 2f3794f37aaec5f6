#include "coordinator/model/model_config.h"

#include <algorithm>
#include <string>
#include <variant>

#include "common/error.h"

namespace moe::model {
namespace {

// Largest value any dimension may take: keeps every product of two dimensions far from overflow.
constexpr int64_t kMaxDim = int64_t{1} << 24;

int64_t require_dim(const gguf::GgufFile& f, const std::string& key) {
  const uint64_t v = f.require_uint(key);
  if (v == 0 || v > static_cast<uint64_t>(kMaxDim)) {
    throw Error(key + ": invalid value " + std::to_string(v));
  }
  return static_cast<int64_t>(v);
}

// A per-layer integer: either one scalar for every layer or an array of n_layer values.
std::vector<int64_t> per_layer(const gguf::GgufFile& f, const std::string& key, int64_t n_layer,
                               bool allow_zero) {
  const gguf::Value* v = f.find(key);
  if (!v) throw Error("missing metadata key " + key);
  std::vector<int64_t> out(static_cast<size_t>(n_layer));
  if (const auto* arr = std::get_if<gguf::ArrayValue>(&v->v)) {
    if (arr->count != static_cast<uint64_t>(n_layer)) {
      throw Error(key + ": array has " + std::to_string(arr->count) + " entries, expected " +
                  std::to_string(n_layer) + " (one per layer)");
    }
    for (int64_t l = 0; l < n_layer; ++l) out[static_cast<size_t>(l)] = arr->int_at(l);
  } else {
    std::fill(out.begin(), out.end(), static_cast<int64_t>(f.require_uint(key)));
  }
  for (int64_t x : out) {
    if (x < (allow_zero ? 0 : 1) || x > kMaxDim) {
      throw Error(key + ": invalid value " + std::to_string(x));
    }
  }
  return out;
}

}  // namespace

int64_t ModelConfig::max_n_head() const { return *std::max_element(n_head.begin(), n_head.end()); }
int64_t ModelConfig::max_n_head_kv() const {
  return *std::max_element(n_head_kv.begin(), n_head_kv.end());
}

ModelConfig ModelConfig::from_gguf(const gguf::GgufFile& f) {
  ModelConfig c;
  c.arch = std::string(f.require_string("general.architecture"));
  const std::string a = c.arch + ".";
  c.n_layer = require_dim(f, a + "block_count");
  c.n_embd = require_dim(f, a + "embedding_length");
  c.n_ctx_train = require_dim(f, a + "context_length");
  c.n_head = per_layer(f, a + "attention.head_count", c.n_layer, false);
  c.n_head_kv = f.find(a + "attention.head_count_kv")
                    ? per_layer(f, a + "attention.head_count_kv", c.n_layer, false)
                    : c.n_head;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const auto i = static_cast<size_t>(l);
    if (c.n_head[i] % c.n_head_kv[i] != 0) {
      throw Error(a + "attention.head_count_kv: layer " + std::to_string(l) + " has " +
                  std::to_string(c.n_head[i]) + " query heads, not a multiple of " +
                  std::to_string(c.n_head_kv[i]) + " KV heads");
    }
  }
  const int64_t def_head = c.n_embd / c.n_head[0];
  c.head_dim_k =
      f.find(a + "attention.key_length") ? require_dim(f, a + "attention.key_length") : def_head;
  c.head_dim_v = f.find(a + "attention.value_length") ? require_dim(f, a + "attention.value_length")
                                                      : def_head;
  if (c.head_dim_k <= 0 || c.head_dim_v <= 0) {
    throw Error(a + "attention.key_length: head dimension must be positive");
  }
  c.n_expert = require_dim(f, a + "expert_count");
  c.n_expert_used = require_dim(f, a + "expert_used_count");
  if (c.n_expert_used > c.n_expert) {
    throw Error(a + "expert_used_count: " + std::to_string(c.n_expert_used) + " exceeds " + a +
                "expert_count " + std::to_string(c.n_expert));
  }
  c.n_ff_exp = require_dim(f, a + "expert_feed_forward_length");
  const double eps = f.require_float(a + "attention.layer_norm_rms_epsilon");
  if (!(eps > 0 && eps < 1)) {
    throw Error(a + "attention.layer_norm_rms_epsilon: invalid value " + std::to_string(eps));
  }
  c.rms_eps = static_cast<float>(eps);
  const double base = f.get_float(a + "rope.freq_base", 10000.0);
  if (!(base > 1)) throw Error(a + "rope.freq_base: invalid value " + std::to_string(base));
  c.rope_freq_base = static_cast<float>(base);
  c.n_rot = f.find(a + "rope.dimension_count") ? require_dim(f, a + "rope.dimension_count")
                                               : c.head_dim_k;
  if (c.n_rot % 2 != 0 || c.n_rot > c.head_dim_k) {
    throw Error(a + "rope.dimension_count: " + std::to_string(c.n_rot) +
                " must be even and at most the head dimension " + std::to_string(c.head_dim_k));
  }
  const gguf::TensorInfo* embd = f.find_tensor("token_embd.weight");
  if (!embd) throw Error("missing tensor token_embd.weight");
  if (embd->n_dims != 2 || embd->ne[1] <= 0 || embd->ne[1] > (int64_t{1} << 31)) {
    throw Error("token_embd.weight: expected a 2-D tensor [n_embd, n_vocab]");
  }
  c.n_vocab = embd->ne[1];
  return c;
}

}  // namespace moe::model
