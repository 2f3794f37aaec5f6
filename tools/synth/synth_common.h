// Pieces shared by the random-weight model generators (qwen3moe_synth, qwen35moe_synth): the
// quantization-mix enum and llama-quantize helpers, the built-in byte-level tokenizer, the
// deterministic per-row random generator and the threaded tensor fill.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/ggml_type.h"

namespace moe::gguf {
class GgufWriter;
}

namespace moe::synth {

// Uniform: every matrix is the spec's wtype. KQuantM: llama-quantize's Q4_K_M/Q5_K_M rules on top
// of wtype (each generator's header says which tensors get more bits).
enum class QuantMix { Uniform, KQuantM };

// general.file_type llama.cpp would record for this weight type and mix (e.g. 15 = Q4_K_M).
uint32_t file_type_of(GgmlType wtype, QuantMix mix);

// One tensor of a planned model: what the file's tensor table will say.
struct PlannedTensor {
  std::string name;
  GgmlType type;
  std::vector<int64_t> ne;
  uint64_t n_bytes;
};

namespace detail {

// llama-quantize's use_more_bits(i, n): the first and last eighth of the layers and every third
// between.
bool use_more_bits(int layer, int n_layer);

// llama-quantize's fallbacks for rows a K-quant block (256) does not divide (Q5_1 is written as
// Q8_0, which we can quantize), then F16 for rows no 32-wide block divides.
GgmlType row_fallback(GgmlType t, int64_t ne0);

// Byte tokens (GPT-2 alphabet), <|endoftext|> <|im_start|> <|im_end|> (256..258), then [PAD]
// up to a multiple of 64 and at least n_min; `pre` is tokenizer.ggml.pre. Returns the size.
int64_t write_byte_tokenizer(gguf::GgufWriter& w, int64_t n_min, const std::string& pre);

// Copies every tokenizer.* key of another GGUF; returns its vocabulary size.
int64_t copy_tokenizer(gguf::GgufWriter& w, const std::string& path);

// A random popularity rank for every expert of every layer.
std::vector<std::vector<int>> expert_ranks(uint64_t seed, int n_layer, int n_expert);

// Expert-popularity skew: every token embedding gets a constant "massive activation" in dimension
// 0 (as real LLMs have), so the normalized hidden state has a consistent positive component
// there; router row e then gets a weight in dimension 0 that adds -skew*ln(1 + rank(e)) to that
// expert's logit.
constexpr float kMassive = 8.0f;
// The expected normalized value of dimension 0 for rows n_embd wide (embedding noise std 0.5).
float massive_norm(int64_t n_embd);
// Router weight of dimension 0 for an expert of popularity rank `rank`.
float skew_router_weight(float skew, int rank, int64_t n_embd);

// Deterministic per-row generator (splitmix64 seeding + xorshift), so rows can be generated in
// parallel and the file does not depend on the thread count.
struct RowRng {
  uint64_t s;
  RowRng(uint64_t seed, uint64_t tensor, uint64_t row) {
    s = seed ^ (tensor * 0x9E3779B97F4A7C15ull) ^ (row * 0xD1B54A32D192ED03ull);
    for (int i = 0; i < 2; ++i) s = mix(s);
    if (s == 0) s = 1;
  }
  static uint64_t mix(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  // Approximately N(0,1): the sum of four 16-bit uniforms (Irwin-Hall), centred and scaled.
  // Cheap enough for the billions of weights of a full-size model; the tails stop at +-3.46.
  float normal() {
    const uint64_t r = next();
    const float sum =
        static_cast<float>((r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) + (r >> 48));
    return (sum * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
  }
  // Uniform in [0, 1).
  float uniform() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }
};

// Fills row `row` (ne[0] values) of a tensor; `rng` is that row's own generator.
using RowFn = std::function<void(int64_t row, RowRng& rng, float* values)>;

// Generates every row of a tensor of shape `ne` with `row_fn` (rows spread over `threads`
// threads, 0 = every core) and encodes them as `type` into dst. `index` seeds the rows with
// `seed`. Types the weight quantizers cannot write are left as zeros.
void fill_tensor(GgmlType type, const std::vector<int64_t>& ne, uint64_t seed, size_t index,
                 int threads, const RowFn& row_fn, uint8_t* dst);

}  // namespace detail
}  // namespace moe::synth
