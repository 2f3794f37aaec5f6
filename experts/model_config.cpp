#include "experts/model_config.h"

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

// The recurrent/attention pattern of a hybrid model's main layers: attention.recurrent_layers
// when present (one flag per block), else every full_attention_interval-th layer is attention.
std::vector<uint8_t> recurrent_pattern(const gguf::GgufFile& f, const std::string& a,
                                       int64_t n_block, int64_t n_layer) {
  std::vector<uint8_t> out(static_cast<size_t>(n_layer));
  const std::string rkey = a + "attention.recurrent_layers";
  if (const gguf::Value* v = f.find(rkey)) {
    const auto* arr = std::get_if<gguf::ArrayValue>(&v->v);
    if (!arr || (arr->count != static_cast<uint64_t>(n_block) &&
                 arr->count != static_cast<uint64_t>(n_layer))) {
      throw Error(rkey + ": expected an array of " + std::to_string(n_block) + " per-layer flags");
    }
    for (int64_t l = 0; l < n_layer; ++l) out[static_cast<size_t>(l)] = arr->int_at(l) != 0;
    return out;
  }
  const std::string ikey = a + "full_attention_interval";
  const uint64_t interval = f.get_uint(ikey, 4);
  if (interval == 0 || interval > static_cast<uint64_t>(kMaxDim)) {
    throw Error(ikey + ": invalid value " + std::to_string(interval));
  }
  for (int64_t l = 0; l < n_layer; ++l) {
    out[static_cast<size_t>(l)] = (static_cast<uint64_t>(l) + 1) % interval != 0;
  }
  return out;
}

// qwen35moe's gated DeltaNet, shared-expert and IMROPE keys.
void read_hybrid_keys(const gguf::GgufFile& f, const std::string& a, ModelConfig& c) {
  c.ssm_conv_kernel = require_dim(f, a + "ssm.conv_kernel");
  c.ssm_head_k = require_dim(f, a + "ssm.state_size");
  c.ssm_n_k_heads = require_dim(f, a + "ssm.group_count");
  c.ssm_n_v_heads = require_dim(f, a + "ssm.time_step_rank");
  c.ssm_inner = require_dim(f, a + "ssm.inner_size");
  if (c.ssm_inner % c.ssm_n_v_heads != 0) {
    throw Error(a + "ssm.inner_size: " + std::to_string(c.ssm_inner) + " is not a multiple of " +
                a + "ssm.time_step_rank " + std::to_string(c.ssm_n_v_heads));
  }
  // Value head h reads key head h mod n_k_heads (the converter's tiled order).
  if (c.ssm_n_v_heads % c.ssm_n_k_heads != 0) {
    throw Error(a + "ssm.time_step_rank: " + std::to_string(c.ssm_n_v_heads) +
                " value heads are not a multiple of " + a + "ssm.group_count " +
                std::to_string(c.ssm_n_k_heads));
  }
  const std::string shkey = a + "expert_shared_feed_forward_length";
  if (f.find(shkey)) {
    c.n_ff_shexp = require_dim(f, shkey);
  } else if (f.find(a + "feed_forward_length")) {  // llama.cpp's fallback
    c.n_ff_shexp = require_dim(f, a + "feed_forward_length");
  } else {
    throw Error("missing metadata key " + shkey);
  }
  const std::string skey = a + "rope.dimension_sections";
  const gguf::Value* sv = f.find(skey);
  if (!sv) throw Error("missing metadata key " + skey);
  const auto* arr = std::get_if<gguf::ArrayValue>(&sv->v);
  if (!arr || arr->count < 1 || arr->count > 4) {
    throw Error(skey + ": expected an array of up to 4 integers");
  }
  int64_t sum = 0;
  for (uint64_t i = 0; i < arr->count; ++i) {
    const int64_t s = arr->int_at(i);
    if (s < 0 || s > kMaxDim) throw Error(skey + ": invalid value " + std::to_string(s));
    c.rope_sections[i] = s;
    sum += s;
  }
  if (sum == 0) throw Error(skey + ": all sections are zero");
}

// gpt-oss: the sliding window and its layer pattern, YaRN, and the experts' gating, activation and
// biases (llama.cpp's LLM_ARCH_OPENAI_MOE).
void read_gpt_oss_keys(const gguf::GgufFile& f, const std::string& a, ModelConfig& c) {
  c.n_swa = require_dim(f, a + "attention.sliding_window");
  // sliding_window_pattern: a period n (layer l slides when l % n < n - 1; llama.cpp's default 2
  // makes the even layers sliding and the odd ones full) or one flag per layer.
  const std::string pkey = a + "attention.sliding_window_pattern";
  c.swa.assign(static_cast<size_t>(c.n_layer), 0);
  const gguf::Value* pv = f.find(pkey);
  if (const auto* arr = pv ? std::get_if<gguf::ArrayValue>(&pv->v) : nullptr) {
    if (arr->count != static_cast<uint64_t>(c.n_layer)) {
      throw Error(pkey + ": array has " + std::to_string(arr->count) + " entries, expected " +
                  std::to_string(c.n_layer) + " (one per layer)");
    }
    for (int64_t l = 0; l < c.n_layer; ++l) c.swa[static_cast<size_t>(l)] = arr->int_at(l) != 0;
  } else {
    const uint64_t period = pv ? f.require_uint(pkey) : 2;
    if (period > static_cast<uint64_t>(kMaxDim)) {
      throw Error(pkey + ": invalid value " + std::to_string(period));
    }
    for (int64_t l = 0; l < c.n_layer; ++l) {
      c.swa[static_cast<size_t>(l)] = period == 0 || static_cast<uint64_t>(l) % period < period - 1;
    }
  }
  const std::string tkey = a + "rope.scaling.type";
  const std::string type = f.find(tkey) ? std::string(f.require_string(tkey)) : "none";
  if (type == "none") {
    c.rope_scaling = RopeScaling::None;
  } else if (type == "linear") {
    c.rope_scaling = RopeScaling::Linear;
  } else if (type == "yarn") {
    c.rope_scaling = RopeScaling::Yarn;
  } else {
    throw Error(tkey + ": unsupported rope scaling '" + type + "' (supported: none, linear, yarn)");
  }
  if (c.rope_scaling != RopeScaling::None) {
    const std::string fkey = a + "rope.scaling.factor";
    const double factor = f.get_float(fkey, 1.0);
    if (!(factor >= 1.0 && factor <= 1e6)) {
      throw Error(fkey + ": invalid value " + std::to_string(factor) + " (expected >= 1)");
    }
    c.rope_scaling_factor = static_cast<float>(factor);
    const std::string okey = a + "rope.scaling.original_context_length";
    c.rope_n_ctx_orig = f.find(okey) ? require_dim(f, okey) : c.n_ctx_train;
    const std::string akey = a + "rope.scaling.attn_factor";
    const double attn = f.get_float(akey, 1.0);
    if (!(attn > 0 && attn < 1e3)) throw Error(akey + ": invalid value " + std::to_string(attn));
    c.rope_attn_factor = static_cast<float>(attn);
  }
  c.gating = ExpertGating::SoftmaxWeight;
  c.expert_act = ExpertActivation::SwigluOai;
  c.expert_bias = true;
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
  const bool hybrid = c.arch == "qwen35moe";
  const int64_t n_block = require_dim(f, a + "block_count");
  c.n_layer = n_block;
  if (hybrid) {
    const uint64_t nextn = f.get_uint(a + "nextn_predict_layers", 0);
    if (nextn >= static_cast<uint64_t>(n_block)) {
      throw Error(a + "nextn_predict_layers: " + std::to_string(nextn) +
                  " leaves no main layers of " + a + "block_count " + std::to_string(n_block));
    }
    c.n_nextn = static_cast<int64_t>(nextn);
    c.n_layer = n_block - c.n_nextn;
    c.recurrent = recurrent_pattern(f, a, n_block, c.n_layer);
  }
  c.n_embd = require_dim(f, a + "embedding_length");
  c.n_ctx_train = require_dim(f, a + "context_length");
  // Per-layer arrays cover every block (MTP blocks too); the forward reads the main layers.
  c.n_head = per_layer(f, a + "attention.head_count", n_block, hybrid);
  c.n_head_kv = f.find(a + "attention.head_count_kv")
                    ? per_layer(f, a + "attention.head_count_kv", n_block, hybrid)
                    : c.n_head;
  c.n_head.resize(static_cast<size_t>(c.n_layer));
  c.n_head_kv.resize(static_cast<size_t>(c.n_layer));
  int64_t first_attn = -1;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const auto i = static_cast<size_t>(l);
    if (c.is_recurrent(l)) continue;
    if (first_attn < 0) first_attn = l;
    if (c.n_head[i] == 0 || c.n_head_kv[i] == 0) {
      throw Error(a + "attention.head_count: layer " + std::to_string(l) +
                  " is a full-attention layer without heads");
    }
    if (c.n_head[i] % c.n_head_kv[i] != 0) {
      throw Error(a + "attention.head_count_kv: layer " + std::to_string(l) + " has " +
                  std::to_string(c.n_head[i]) + " query heads, not a multiple of " +
                  std::to_string(c.n_head_kv[i]) + " KV heads");
    }
  }
  const int64_t def_head = c.n_embd / (first_attn >= 0 ? c.n_head[static_cast<size_t>(first_attn)]
                                                       : std::max<int64_t>(1, c.n_head[0]));
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
  if (c.arch == "gpt-oss") read_gpt_oss_keys(f, a, c);
  if (hybrid) {
    read_hybrid_keys(f, a, c);
    if (c.head_dim_k != c.head_dim_v) {
      throw Error(a + "attention.value_length: " + std::to_string(c.head_dim_v) + " differs from " +
                  a + "attention.key_length " + std::to_string(c.head_dim_k) +
                  " (the attention output gate needs them equal)");
    }
  }
  return c;
}

}  // namespace moe::model
