// Zero-copy GGUF reader (versions 2 and 3): metadata and tensor views over an mmapped file.
// Every field is validated against the bytes actually present; see docs/ARCHITECTURE.md.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/ggml_type.h"
#include "common/mapped_file.h"

namespace moe::gguf {

// Metadata value type ids (gguf.h enum gguf_type).
enum class ValueType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};

std::string_view value_type_name(ValueType t);
// Bytes of one value of a numeric type (BOOL: 1); 0 for STRING and ARRAY.
size_t value_type_size(ValueType t);

// An array value. Numeric elements stay in the file (little-endian, unaligned): read them with
// the typed accessors. String elements are indexed once at parse time.
struct ArrayValue {
  ValueType elem_type = ValueType::U8;
  uint64_t count = 0;
  const uint8_t* data = nullptr;          // first element (numeric arrays)
  std::vector<std::string_view> strings;  // elem_type == STRING

  // Element i converted; throws moe::Error if the element type does not convert or i >= count.
  int64_t int_at(uint64_t i) const;   // any integer type (and BOOL)
  double float_at(uint64_t i) const;  // F32/F64 and any integer type
  std::string_view string_at(uint64_t i) const;
};

struct Value {
  ValueType type = ValueType::U8;
  // Integers are widened: unsigned types to uint64_t, signed to int64_t; floats to double.
  std::variant<uint64_t, int64_t, double, bool, std::string_view, ArrayValue> v;
};

struct KeyValue {
  std::string_view key;
  Value value;
};

struct TensorInfo {
  std::string_view name;
  uint32_t type_id = 0;           // raw ggml type id (may be one we cannot compute with)
  uint32_t n_dims = 0;            // 1..4
  int64_t ne[4] = {1, 1, 1, 1};   // ne[0] fastest
  uint64_t offset = 0;            // relative to its file's data section
  uint64_t n_bytes = 0;           // exact size from type and shape
  const uint8_t* data = nullptr;  // points into the mapping
  uint32_t shard = 0;             // which split file holds it

  GgmlType type() const { return static_cast<GgmlType>(type_id); }
  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }  // validated not to overflow
};

class MappedFile;  // common/mapped_file.h

// A parsed GGUF model (one file or all shards of a split model). Immutable after open; safe to
// share across threads. Tensor data pointers stay valid for the object's lifetime.
class GgufFile {
 public:
  // Opens and validates a file. A name like "x-00001-of-00003.gguf" opens every shard.
  // Throws moe::Error with the path and the reason on any malformed input. `mode`: mapped, or
  // read into (huge-page) memory (llama.cpp's --no-mmap).
  static GgufFile open(const std::string& path, LoadMode mode = LoadMode::Mapped);
  // Bytes on disk of the model open() would read from `path` (every shard of a split name); 0
  // when a file is missing or unreadable (open() then says why).
  static uint64_t file_bytes(const std::string& path);

  // Parses an in-memory image (used by tests and the fuzzer). `bytes` must outlive the result.
  static GgufFile parse(std::span<const uint8_t> bytes, std::string name = "<memory>");
  // A temporary buffer would dangle: the result points into it.
  static GgufFile parse(std::vector<uint8_t>&& bytes, std::string name = "<memory>") = delete;

  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  ~GgufFile();

  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  const std::string& path() const { return path_; }
  size_t n_shards() const { return n_shards_; }

  const std::vector<KeyValue>& metadata() const { return kv_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }

  // Each shard's bytes in memory (empty for parse()), and whether they were read in
  // (LoadMode::Loaded) rather than mapped: the GPU page-locks read-in memory to copy experts.
  std::vector<std::span<const uint8_t>> shard_bytes() const;
  bool loaded() const;

  const Value* find(std::string_view key) const;               // nullptr if absent
  const TensorInfo* find_tensor(std::string_view name) const;  // nullptr if absent

  // Typed getters. The `require_*` forms throw moe::Error naming the key when it is absent or has
  // an incompatible type; integer getters accept any integer width (writers differ) and check
  // range.
  std::string_view require_string(std::string_view key) const;
  uint64_t require_uint(std::string_view key) const;
  double require_float(std::string_view key) const;  // float or integer
  bool require_bool(std::string_view key) const;
  const ArrayValue& require_array(std::string_view key) const;
  std::string_view get_string(std::string_view key, std::string_view fallback) const;
  uint64_t get_uint(std::string_view key, uint64_t fallback) const;
  double get_float(std::string_view key, double fallback) const;
  bool get_bool(std::string_view key, bool fallback) const;

 private:
  GgufFile() = default;
  std::string path_;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  size_t n_shards_ = 1;
  std::vector<KeyValue> kv_;
  std::vector<TensorInfo> tensors_;
  std::vector<std::unique_ptr<MappedFile>> maps_;
  std::vector<std::string> owned_;  // key/name storage only where not pointing into a mapping
  // Indices into kv_ / tensors_ sorted by key / name, for binary-search lookups.
  std::vector<uint32_t> kv_by_key_;
  std::vector<uint32_t> tensor_by_name_;
  friend class GgufParser;
};

// Limits applied while parsing (realistic bounds, far below what could exhaust memory).
inline constexpr uint64_t kMaxStringBytes = 64ull << 20;    // one metadata string
inline constexpr uint64_t kMaxArrayElements = 64ull << 20;  // one metadata array
inline constexpr uint64_t kMaxAlignment = 1ull << 20;
inline constexpr uint64_t kMaxTensors = 1ull << 20;
inline constexpr uint64_t kMaxKeyValues = 1ull << 20;
inline constexpr uint64_t kMaxTensorNameBytes = 63;  // GGML_MAX_NAME - 1

}  // namespace moe::gguf
