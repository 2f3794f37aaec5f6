// Streaming GGUF (v3) writer: metadata and tensor infos first, then each tensor's bytes produced
// on demand, so multi-gigabyte synthetic models never sit in memory at once.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/ggml_type.h"
#include "common/gguf.h"

namespace moe::gguf {

class GgufWriter {
 public:
  explicit GgufWriter(uint32_t alignment = 32);

  void set_u32(const std::string& key, uint32_t v);
  void set_i32(const std::string& key, int32_t v);
  void set_u64(const std::string& key, uint64_t v);
  void set_f32(const std::string& key, float v);
  void set_bool(const std::string& key, bool v);
  void set_string(const std::string& key, const std::string& v);
  void set_strings(const std::string& key, const std::vector<std::string>& v);
  void set_i32s(const std::string& key, const std::vector<int32_t>& v);
  void set_f32s(const std::string& key, const std::vector<float>& v);
  // A value read from another file, re-encoded with its original type (arrays of arrays are
  // rejected with moe::Error).
  void copy_value(const std::string& key, const Value& v);

  // ne[0] is the fastest dimension; throws moe::Error for a bad shape or duplicate name.
  void add_tensor(const std::string& name, GgmlType type, const std::vector<int64_t>& ne);

  size_t n_tensors() const { return tensors_.size(); }
  uint64_t tensor_bytes(size_t i) const { return tensors_.at(i).n_bytes; }

  // Writes the file: fill(i, dst, n) must write the n bytes of tensor i. The file appears under
  // `path` only when complete (written to a temporary name, then renamed).
  using FillFn = std::function<void(size_t index, uint8_t* dst, uint64_t n_bytes)>;
  void write(const std::string& path, const FillFn& fill) const;

 private:
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> ne;
    uint64_t n_bytes;
  };
  void add_kv(const std::string& key, ValueType type, std::vector<uint8_t> payload);

  uint32_t alignment_;
  std::vector<std::string> keys_;
  std::vector<uint8_t> kv_bytes_;  // encoded key/value pairs
  std::vector<Tensor> tensors_;
};

}  // namespace moe::gguf
