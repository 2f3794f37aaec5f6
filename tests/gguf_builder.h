// In-memory GGUF writer for tests and fuzz seeds. Writes valid files by default (tensors stored
// densely in info order, each padded to the alignment, as llama.cpp does) and has knobs to write
// every kind of corrupt field. Header-only; no test framework dependency.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/checked_math.h"
#include "common/ggml_type.h"
#include "common/gguf.h"

namespace moe::test {

class GgufBuilder {
 public:
  using ValueType = moe::gguf::ValueType;

  struct Tensor {
    std::string name;
    uint32_t type_id = 0;
    std::vector<int64_t> ne;             // written as given: its size is n_dims
    std::optional<uint32_t> n_dims;      // override the written n_dims (dims still from ne)
    std::optional<uint64_t> offset;      // override the data offset (no data is written for it)
    std::optional<uint64_t> data_bytes;  // bytes stored for it (default: exact size of type/shape)
  };

  // ----- header knobs -----
  GgufBuilder& magic(uint32_t m) {
    magic_ = m;
    return *this;
  }
  GgufBuilder& version(uint32_t v) {
    version_ = v;
    return *this;
  }
  GgufBuilder& n_kv_override(uint64_t n) {
    n_kv_override_ = n;
    return *this;
  }
  GgufBuilder& n_tensors_override(uint64_t n) {
    n_tensors_override_ = n;
    return *this;
  }
  // Adds general.alignment (u32) and lays tensors out with it.
  GgufBuilder& alignment(uint32_t a) {
    layout_alignment_ = a;
    return kv_u32("general.alignment", a);
  }
  // Only changes the layout (e.g. to write a file that disagrees with its general.alignment).
  GgufBuilder& layout_alignment(uint32_t a) {
    layout_alignment_ = a;
    return *this;
  }
  // Bytes appended after the data section, or removed from the end of the whole image.
  GgufBuilder& tail_bytes(uint64_t n) {
    tail_bytes_ = n;
    return *this;
  }
  GgufBuilder& truncate_end(uint64_t n) {
    truncate_end_ = n;
    return *this;
  }

  // ----- metadata -----
  // Any type id with an already-encoded payload: for unknown types and malformed values.
  GgufBuilder& kv_raw(std::string key, uint32_t type_id, std::vector<uint8_t> payload) {
    std::vector<uint8_t> b;
    put_string(b, key);
    put<uint32_t>(b, type_id);
    b.insert(b.end(), payload.begin(), payload.end());
    kvs_.push_back(std::move(b));
    return *this;
  }
  GgufBuilder& kv_u8(std::string k, uint8_t v) { return scalar(std::move(k), ValueType::U8, v); }
  GgufBuilder& kv_i8(std::string k, int8_t v) { return scalar(std::move(k), ValueType::I8, v); }
  GgufBuilder& kv_u16(std::string k, uint16_t v) { return scalar(std::move(k), ValueType::U16, v); }
  GgufBuilder& kv_i16(std::string k, int16_t v) { return scalar(std::move(k), ValueType::I16, v); }
  GgufBuilder& kv_u32(std::string k, uint32_t v) { return scalar(std::move(k), ValueType::U32, v); }
  GgufBuilder& kv_i32(std::string k, int32_t v) { return scalar(std::move(k), ValueType::I32, v); }
  GgufBuilder& kv_u64(std::string k, uint64_t v) { return scalar(std::move(k), ValueType::U64, v); }
  GgufBuilder& kv_i64(std::string k, int64_t v) { return scalar(std::move(k), ValueType::I64, v); }
  GgufBuilder& kv_f32(std::string k, float v) { return scalar(std::move(k), ValueType::F32, v); }
  GgufBuilder& kv_f64(std::string k, double v) { return scalar(std::move(k), ValueType::F64, v); }
  GgufBuilder& kv_bool(std::string k, bool v) {
    return scalar(std::move(k), ValueType::BOOL, static_cast<uint8_t>(v));
  }
  GgufBuilder& kv_string(std::string k, std::string_view v) {
    std::vector<uint8_t> p;
    put_string(p, v);
    return kv_raw(std::move(k), static_cast<uint32_t>(ValueType::STRING), std::move(p));
  }
  // Numeric array; T must match the size of `elem` (e.g. int32_t for I32, uint8_t for BOOL).
  template <typename T>
  GgufBuilder& kv_array(std::string k, ValueType elem, const std::vector<T>& v) {
    std::vector<uint8_t> p;
    put<uint32_t>(p, static_cast<uint32_t>(elem));
    put<uint64_t>(p, v.size());
    for (const T& x : v) put<T>(p, x);
    return kv_raw(std::move(k), static_cast<uint32_t>(ValueType::ARRAY), std::move(p));
  }
  GgufBuilder& kv_string_array(std::string k, const std::vector<std::string>& v) {
    std::vector<uint8_t> p;
    put<uint32_t>(p, static_cast<uint32_t>(ValueType::STRING));
    put<uint64_t>(p, v.size());
    for (const auto& s : v) put_string(p, s);
    return kv_raw(std::move(k), static_cast<uint32_t>(ValueType::ARRAY), std::move(p));
  }

  // ----- tensors -----
  // Returns the entry so a test can set overrides; the reference stays valid until the next call.
  Tensor& tensor(std::string name, uint32_t type_id, std::vector<int64_t> ne) {
    tensors_.push_back(Tensor{std::move(name), type_id, std::move(ne), {}, {}, {}});
    return tensors_.back();
  }
  GgufBuilder& add_tensor(std::string name, moe::GgmlType type, std::vector<int64_t> ne) {
    tensor(std::move(name), static_cast<uint32_t>(type), std::move(ne));
    return *this;
  }
  std::vector<Tensor>& tensors() { return tensors_; }

  // Tensors larger than this get no data unless data_bytes says so (overflow tests use huge
  // shapes).
  static constexpr uint64_t kMaxMaterializedBytes = 1ull << 30;

  // Exact byte size of a well-formed type/shape; 0 when it has none (bad shape, unknown type) or
  // when it is too large to write.
  static uint64_t exact_bytes(uint32_t type_id, const std::vector<int64_t>& ne) {
    if (ne.empty() || !moe::ggml_type_info(type_id)) return 0;
    uint64_t rows = 1;
    for (size_t d = 1; d < ne.size(); ++d) {
      if (ne[d] < 1) return 0;
      const auto r = moe::checked_mul(rows, static_cast<uint64_t>(ne[d]));
      if (!r) return 0;
      rows = *r;
    }
    if (ne[0] < 1) return 0;
    const auto row =
        moe::ggml_row_bytes(static_cast<moe::GgmlType>(type_id), static_cast<uint64_t>(ne[0]));
    if (!row) return 0;
    const auto total = moe::checked_mul(*row, rows);
    return total && *total <= kMaxMaterializedBytes ? *total : 0;
  }

  // Deterministic content of byte k of tensor i's data (lets tests check data pointers).
  static uint8_t data_byte(size_t tensor_index, uint64_t k) {
    return static_cast<uint8_t>((k * 131u + tensor_index * 17u + 5u) & 0xffu);
  }

  std::vector<uint8_t> build() const {
    std::vector<uint8_t> b;
    put<uint32_t>(b, magic_);
    put<uint32_t>(b, version_);
    put<uint64_t>(b, n_tensors_override_.value_or(tensors_.size()));
    put<uint64_t>(b, n_kv_override_.value_or(kvs_.size()));
    for (const auto& kv : kvs_) b.insert(b.end(), kv.begin(), kv.end());

    // Layout first: offsets are part of the tensor infos.
    std::vector<uint64_t> offsets, sizes;
    uint64_t running = 0, data_len = 0;
    for (const auto& t : tensors_) {
      const uint64_t size = t.data_bytes.value_or(exact_bytes(t.type_id, t.ne));
      sizes.push_back(size);
      if (t.offset) {
        offsets.push_back(*t.offset);
        continue;
      }
      offsets.push_back(running);
      data_len = running + size;  // the last tensor is not padded: the file ends with its data
      running = align(running + size);
    }

    for (size_t i = 0; i < tensors_.size(); ++i) {
      const Tensor& t = tensors_[i];
      put_string(b, t.name);
      put<uint32_t>(b, t.n_dims.value_or(static_cast<uint32_t>(t.ne.size())));
      for (int64_t x : t.ne) put<int64_t>(b, x);
      put<uint32_t>(b, t.type_id);
      put<uint64_t>(b, offsets[i]);
    }

    if (!tensors_.empty()) {
      b.resize(align(b.size()), 0);
      const size_t data_start = b.size();
      b.resize(data_start + data_len, 0);
      for (size_t i = 0; i < tensors_.size(); ++i) {
        if (tensors_[i].offset) continue;
        for (uint64_t k = 0; k < sizes[i]; ++k) b[data_start + offsets[i] + k] = data_byte(i, k);
      }
    }
    b.resize(b.size() + tail_bytes_, 0);
    b.resize(b.size() - std::min<uint64_t>(truncate_end_, b.size()));
    return b;
  }

  // ----- encoding helpers (public: tests build raw payloads with them) -----
  template <typename T>
  static void put(std::vector<uint8_t>& b, T v) {
    uint8_t raw[sizeof(T)];
    std::memcpy(raw, &v, sizeof(T));
    b.insert(b.end(), raw, raw + sizeof(T));
  }
  static void put_string(std::vector<uint8_t>& b, std::string_view s) {
    put<uint64_t>(b, s.size());
    b.insert(b.end(), s.begin(), s.end());
  }

 private:
  template <typename T>
  GgufBuilder& scalar(std::string k, ValueType t, T v) {
    std::vector<uint8_t> p;
    put<T>(p, v);
    return kv_raw(std::move(k), static_cast<uint32_t>(t), std::move(p));
  }
  uint64_t align(uint64_t x) const {
    const uint64_t a = layout_alignment_ ? layout_alignment_ : 1;  // tests may write alignment 0
    return (x + a - 1) / a * a;
  }

  uint32_t magic_ = 0x46554747;  // "GGUF"
  uint32_t version_ = 3;
  std::optional<uint64_t> n_kv_override_, n_tensors_override_;
  uint32_t layout_alignment_ = 32;
  uint64_t tail_bytes_ = 0, truncate_end_ = 0;
  std::vector<std::vector<uint8_t>> kvs_;
  std::vector<Tensor> tensors_;
};

}  // namespace moe::test
