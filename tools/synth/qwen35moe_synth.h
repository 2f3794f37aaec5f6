// Random-weight qwen35moe GGUF models (Qwen3.5/3.6-35B-A3B family: Gated DeltaNet layers with a
// gated full-attention layer every `full_attn_interval`-th, routed experts plus a sigmoid-gated
// shared expert), for moe-synth, tests and benchmarks. Metadata keys, tensor names and shapes are
// those of ../shared/testdata-qwen35moe/README.md §3-§4; the weights are written directly in GGUF
// layout (norm gains with the +1 baked in, ssm_a = -exp(A_log) < 0, squeezed ssm_conv1d).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/ggml_type.h"
#include "tools/synth/synth_common.h"

namespace moe::synth {

struct Qwen35MoeSpec {
  // The defaults are the shapes of the shared tiny model (testdata-qwen35moe README §2).
  int n_layer = 4;
  int full_attn_interval = 4;  // layer i is full attention iff (i + 1) % interval == 0
  int n_embd = 256;
  int n_head = 4, n_head_kv = 2, head_dim = 64;  // full-attention layers; attn_q holds q and gate
  int n_rot = 16;                                // rotated dims of each head (IMROPE)
  std::array<int, 4> rope_sections = {3, 3, 2, 0};
  float rope_base = 1e7f;
  // Gated DeltaNet: key heads (ssm.group_count), value heads (ssm.time_step_rank), the head dim of
  // both (ssm.state_size; inner size = value heads * head dim) and the causal conv's taps.
  int ssm_n_k_heads = 4, ssm_n_v_heads = 8, ssm_head_dim = 64, ssm_conv_kernel = 4;
  int n_expert = 6, n_expert_used = 2, n_ff = 256, n_ff_shexp = 256;
  int n_ctx = 4096;
  // With a tokenizer: the byte-level vocabulary (pre-tokenizer qwen35) is padded to a multiple of
  // 64 and at least this. Without one: exactly this many embedding rows.
  int64_t n_vocab = 2112;
  bool with_tokenizer = true;
  GgmlType wtype = GgmlType::F16;  // matrices; norms, ssm_*, router and conv stay F32
  // KQuantM: llama-quantize's Q4_K_M/Q5_K_M rules with the Unsloth "UD" change to the routed
  // experts' down projection: output.weight Q6_K; attn_v, attn_qkv (GDN) and ffn_down_shexp Q6_K
  // on use_more_bits layers; ffn_down_exps one K-quant step above wtype on every layer (Q5_K in
  // Q4_K_M, Q6_K in Q5_K_M), as in Unsloth's Qwen3.6-35B-A3B-UD-Q4_K_M; the rest wtype.
  using Mix = QuantMix;
  Mix mix = Mix::Uniform;
  bool tied = false;  // no output.weight
  // A multi-token-prediction block after the main layers, as the real files carry it
  // (nextn_predict_layers 1, block_count n_layer + 1): a gated full-attention layer with routed
  // and shared experts behind nextn.eh_proj (embedding and hidden state, normed and concatenated).
  bool mtp = false;
  uint64_t seed = 1234;
  // Expert popularity, as Qwen3MoeSpec::skew.
  float skew = 0.0f;
  // Copy every tokenizer.* key from this GGUF (vocabulary sized by it); empty = byte vocabulary.
  std::string vocab_from;
  int threads = 0;  // weight generation threads; 0 = every core
  std::string name = "moe-synth";
  // Called for each tensor before it is written (set `skip` to leave it out). Types we cannot
  // generate are written as zeros.
  std::function<void(const std::string& name, GgmlType& type, std::vector<int64_t>& ne, bool& skip)>
      mutate;

  bool is_recurrent(int layer) const { return (layer + 1) % full_attn_interval != 0; }
  int64_t ssm_inner() const { return int64_t{ssm_n_v_heads} * ssm_head_dim; }
  int64_t ssm_conv_channels() const {
    return 2 * int64_t{ssm_n_k_heads} * ssm_head_dim + ssm_inner();
  }
};

// Named shapes: "tiny-qwen35moe" (the defaults above) and "qwen3.6-35b-a3b" (Qwen3.5/3.6-35B-A3B:
// 40 layers 2048 wide, full attention every 4th with 16/2 heads of 256, rope dims 64 with sections
// [11, 11, 10, 0] and base 1e7; GDN 16 key and 32 value heads of 128, conv 4; 256 experts of width
// 512, 8 used, a shared expert of width 512; 248320 tokens; context 262144; no MTP block).
// Throws for other names.
Qwen35MoeSpec qwen35moe_preset(const std::string& name);
bool is_qwen35moe_preset(const std::string& name);

// The type a matrix gets under the spec's mix. `layer` is -1 for token_embd and output.
GgmlType tensor_type_for(const Qwen35MoeSpec& spec, const std::string& name, int layer,
                         int64_t ne0);

// The tensor table write_qwen35moe would write (after `mutate`), without generating weights.
std::vector<PlannedTensor> plan_qwen35moe(const Qwen35MoeSpec& spec);

// Writes the model (temp file + rename); returns the number of tensors. Throws moe::Error.
size_t write_qwen35moe(const std::string& path, const Qwen35MoeSpec& spec);

}  // namespace moe::synth
