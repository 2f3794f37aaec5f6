// qwen35moe (Qwen3.5 / Qwen3.6-35B-A3B, formats.md §4b): a hybrid of gated DeltaNet layers (causal
// conv1d, L2-normalised q/k, the delta-rule recurrence, a gated RMSNorm) and every
// full_attention_interval-th layer a gated full-attention layer (q and an output gate interleaved
// per head, partial IMROPE); every layer ends in softmax-gated top-k routed experts plus a shared
// expert scaled by a per-token sigmoid gate. A multi-token-prediction block after the main layers
// (nextn_predict_layers 1) drafts tokens for speculative decoding (mtp_forward).
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "coordinator/model/attention.h"
#include "coordinator/model/cpu_forward.h"

namespace moe::model {

class Qwen35Moe final : public CpuForward {
 public:
  // `experts`: who computes the routed experts; null = a CpuExpertExecutor on `pool`.
  Qwen35Moe(const gguf::GgufFile& file, cpu::ThreadPool& pool,
            std::unique_ptr<ExpertExecutor> experts = nullptr);

  std::string_view name() const override { return "qwen35moe"; }

  bool has_mtp() const override { return mtp_ != nullptr; }
  KvCache make_mtp_cache(int64_t n_ctx) const override;
  void mtp_forward(std::span<const int32_t> tokens, const float* h, KvCache& cache, float* h_out,
                   float* logits) override;

 private:
  struct Layer {
    bool recurrent = false;
    std::vector<float> attn_norm, post_norm;
    // Gated DeltaNet.
    cpu::WeightMatrix wqkv, wz, wbeta, walpha, wssm_out;
    std::vector<float> conv_w;  // [kernel][channels], tap-major (transposed from the file)
    std::vector<float> dt_bias, ssm_a, ssm_norm;
    // Full attention.
    cpu::WeightMatrix wq, wk, wv, wo;
    std::vector<float> q_norm, k_norm;
    int64_t n_head = 0, n_head_kv = 0;
    // FFN: router and shared expert (routed experts live in the executor).
    cpu::WeightMatrix router, sh_gate, sh_up, sh_down, sh_gate_inp;
  };
  void reserve_layers(int64_t n_tokens) override;
  void run_layers(int64_t n, std::span<const SequenceRows> seqs,
                  const ForwardHooks* hooks) override;
  void check_cache(const KvCache& cache) const override;
  // Mixer of layer l on xn_ (n tokens of the sequences `seqs`), output in mix_.
  void delta_net_layer(const Layer& L, int64_t l, int64_t n, std::span<const SequenceRows> seqs);
  void attention_layer(const Layer& L, int64_t l, int64_t n, std::span<const SequenceRows> seqs);
  // Routed (layer l of `moe`) + shared experts on xn_ (normalised h_); x_ = h_ + both.
  void ffn(const Layer& L, RoutedMoeCpu& moe, int64_t l, int64_t n, int64_t pos0,
           const ForwardHooks* hooks);
  // An attention layer's tensors under prefix p ("blk.N.") into L.
  void load_attention(const gguf::GgufFile& f, const std::string& p, int64_t n_head,
                      int64_t n_head_kv, Layer& L) const;
  void load_ffn(const gguf::GgufFile& f, const std::string& p, Layer& L) const;
  // The MTP block of blk.{n_layer}, when the file has one.
  void load_mtp(const gguf::GgufFile& f);

  std::vector<Layer> layers_;

  // The multi-token-prediction block: a gated attention layer whose cache is its own (mtp_cfg_:
  // that one layer), routed experts of its own (mtp_moe_, layer 0), and the projection of the
  // normed embedding and hidden state (eh_proj) in front; its head norm and head are
  // nextn.shared_head_* or the model's.
  struct Mtp {
    Layer layer;
    cpu::WeightMatrix eh_proj;
    std::vector<float> enorm, hnorm, head_norm;
    const cpu::WeightMatrix* head = nullptr;
    cpu::WeightMatrix own_head;
    EmbeddingTensors embed;  // token_embd is nextn.embed_tokens when the file has it, else null
  };
  std::unique_ptr<Mtp> mtp_;
  ModelConfig mtp_cfg_;
  RoutedMoeCpu mtp_moe_{mtp_cfg_};
  std::vector<float> mtp_in_;  // [n][2 * n_embd]: normed embedding | normed hidden state

  // Grow-only scratch: steady-state decoding allocates nothing.
  AttentionScratch attn_scratch_;
  std::vector<float> h_, mix_;
  std::vector<float> qkv_, conv_, z_, beta_, gate_, ssm_o_;     // DeltaNet
  std::vector<float> qg_, q_, ogate_, k_, v_, attn_, rope_cs_;  // attention
  std::vector<float> moe_out_, sh_g_, sh_u_, sh_out_, sh_s_;
};

}  // namespace moe::model
