#include "tools/synth/synth_common.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include "common/error.h"
#include "common/gguf.h"
#include "common/gguf_writer.h"
#include "kernels/cpu/weight_quant.h"

namespace moe::synth {

uint32_t file_type_of(GgmlType t, QuantMix mix) {
  const bool m = mix == QuantMix::KQuantM;
  switch (t) {
    case GgmlType::F32:
      return 0;
    case GgmlType::F16:
      return 1;
    case GgmlType::Q8_0:
      return 7;
    case GgmlType::Q5_0:
      return 8;
    case GgmlType::Q4_K:
      return m ? 15 : 14;  // Q4_K_M : Q4_K_S
    case GgmlType::Q5_K:
      return m ? 17 : 16;  // Q5_K_M : Q5_K_S
    case GgmlType::Q6_K:
      return 18;
    case GgmlType::BF16:
      return 32;
    default:
      throw Error("moe-synth cannot write weights of type " +
                  ggml_type_label(static_cast<uint32_t>(t)));
  }
}

namespace detail {

bool use_more_bits(int layer, int n) {
  return layer >= 0 && (layer < n / 8 || layer >= 7 * n / 8 || (layer - n / 8) % 3 == 2);
}

GgmlType row_fallback(GgmlType t, int64_t ne0) {
  if (ne0 % 256 != 0) {  // K-quant blocks are 256 wide; llama-quantize's fallbacks
    if (t == GgmlType::Q4_K) t = GgmlType::Q5_0;
    if (t == GgmlType::Q5_K || t == GgmlType::Q6_K) t = GgmlType::Q8_0;
  }
  if (ne0 % 32 != 0 && t != GgmlType::F32 && t != GgmlType::F16 && t != GgmlType::BF16) {
    t = GgmlType::F16;
  }
  return t;
}

namespace {

// GPT-2 byte-level alphabet: printable bytes map to themselves, the rest to U+0100 onwards.
std::vector<std::string> byte_tokens() {
  std::vector<std::string> out(256);
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    const int cp = printable ? b : next++;
    std::string s;
    if (cp < 0x80) {
      s.push_back(static_cast<char>(cp));
    } else {
      s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    out[static_cast<size_t>(b)] = s;
  }
  return out;
}

}  // namespace

int64_t write_byte_tokenizer(gguf::GgufWriter& w, int64_t n_min, const std::string& pre) {
  auto tokens = byte_tokens();
  // NORMAL, as in real byte-level BPE vocabularies (llama.cpp reads BYTE as SentencePiece <0xXX>).
  std::vector<int32_t> types(tokens.size(), 1);
  for (const char* special : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    tokens.emplace_back(special);
    types.push_back(3);  // CONTROL
  }
  while (tokens.size() % 64 != 0 || static_cast<int64_t>(tokens.size()) < n_min) {
    tokens.push_back("[PAD" + std::to_string(tokens.size()) + "]");
    types.push_back(5);  // UNUSED
  }
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", pre);
  w.set_strings("tokenizer.ggml.tokens", tokens);
  w.set_i32s("tokenizer.ggml.token_type", types);
  w.set_strings("tokenizer.ggml.merges", {});
  w.set_u32("tokenizer.ggml.bos_token_id", 256);
  w.set_u32("tokenizer.ggml.eos_token_id", 258);
  w.set_u32("tokenizer.ggml.padding_token_id", 256);
  w.set_bool("tokenizer.ggml.add_bos_token", false);
  return static_cast<int64_t>(tokens.size());
}

int64_t copy_tokenizer(gguf::GgufWriter& w, const std::string& path) {
  const gguf::GgufFile src = gguf::GgufFile::open(path);
  for (const auto& kv : src.metadata()) {
    if (kv.key.starts_with("tokenizer.")) w.copy_value(std::string(kv.key), kv.value);
  }
  const gguf::Value* tokens = src.find("tokenizer.ggml.tokens");
  if (!tokens || tokens->type != gguf::ValueType::ARRAY) {
    throw Error(path + ": --vocab-from needs a file with tokenizer.ggml.tokens");
  }
  return static_cast<int64_t>(std::get<gguf::ArrayValue>(tokens->v).count);
}

std::vector<std::vector<int>> expert_ranks(uint64_t seed, int n_layer, int n_expert) {
  std::mt19937_64 rng(seed ^ 0x5EEDull);
  std::vector<std::vector<int>> rank(static_cast<size_t>(n_layer));
  for (auto& r : rank) {
    r.resize(static_cast<size_t>(n_expert));
    std::iota(r.begin(), r.end(), 0);
    std::shuffle(r.begin(), r.end(), rng);
  }
  return rank;
}

float massive_norm(int64_t n0) {
  return kMassive / std::sqrt((0.25f * static_cast<float>(n0 - 1) + kMassive * kMassive) /
                              static_cast<float>(n0));
}

float skew_router_weight(float skew, int rank, int64_t n_embd) {
  return -skew * std::log1p(static_cast<float>(rank)) / massive_norm(n_embd);
}

void fill_tensor(GgmlType type, const std::vector<int64_t>& ne, uint64_t seed, size_t index,
                 int threads, const RowFn& row_fn, uint8_t* dst) {
  const int64_t n0 = ne[0];
  int64_t rows = 1;
  for (size_t d = 1; d < ne.size(); ++d) rows *= ne[d];
  const uint64_t row_bytes = *ggml_row_bytes(type, static_cast<uint64_t>(n0));
  const bool quantizable = cpu::can_quantize_weight(type);
  unsigned n_threads = threads > 0 ? static_cast<unsigned>(threads)
                                   : std::max(1u, std::thread::hardware_concurrency());
  n_threads = static_cast<unsigned>(std::min<int64_t>(n_threads, std::max<int64_t>(1, rows / 64)));
  const auto work = [&](unsigned part) {
    std::vector<float> v(static_cast<size_t>(n0));
    for (int64_t r = part; r < rows; r += n_threads) {
      uint8_t* out = dst + static_cast<uint64_t>(r) * row_bytes;
      if (!quantizable) {
        std::memset(out, 0, row_bytes);  // only reached through `mutate` (tests of load errors)
        continue;
      }
      RowRng rng(seed, index, static_cast<uint64_t>(r));
      row_fn(r, rng, v.data());
      cpu::quantize_weight_row(type, v.data(), out, n0);
    }
  };
  std::vector<std::thread> pool;
  for (unsigned p = 1; p < n_threads; ++p) pool.emplace_back(work, p);
  work(0);
  for (auto& th : pool) th.join();
}

}  // namespace detail
}  // namespace moe::synth
