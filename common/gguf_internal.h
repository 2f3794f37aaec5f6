// Private to the gguf*.cpp sources (not an interface): the parser class they share and its helpers.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "common/gguf.h"

namespace moe::gguf {

static_assert(std::endian::native == std::endian::little,
              "the GGUF reader assumes a little-endian host (files are little-endian)");

namespace detail {

// Unaligned read of a little-endian value (the host is little-endian, checked above).
template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Printable excerpt of an untrusted name for error messages (defined in gguf_parser.cpp).
std::string excerpt(std::string_view s, size_t max = 64);

}  // namespace detail

// Parses and validates one GGUF image. Its members are split by concern: gguf_parser.cpp (bounded
// reads, header, metadata), gguf_tensors.cpp (tensor infos, data layout) and gguf.cpp (lookup
// indices and the checks across the shards of a split model).
class GgufParser {
 public:
  GgufParser(std::span<const uint8_t> bytes, const std::string& name)
      : base_(bytes.data()), size_(bytes.size()), name_(name) {}

  // Structure, layout and tokenizer checks of one image; builds the lookup indices.
  GgufFile parse();

  // Sorted lookup indices; also catches duplicate tensor names across split shards.
  static void finalize(GgufFile& f);

  // Split-model bookkeeping: shard `index` (0-based) of `count` must say so in its metadata.
  static void check_split_keys(const GgufFile& f, uint32_t index, uint32_t count, bool named);

  [[noreturn]] static void fail_file(const GgufFile& f, const std::string& msg);

 private:
  // ----- error reporting -----
  [[noreturn]] void fail(const std::string& msg) const;
  std::string where(const char* field) const;
  [[noreturn]] void truncated(const char* field, uint64_t need) const;

  // ----- bounded reads (inline: the tensor-info reader uses them too) -----
  size_t remaining() const { return size_ - pos_; }

  template <typename T>
  T read(const char* field) {
    if (remaining() < sizeof(T)) truncated(field, sizeof(T));
    const T v = detail::load<T>(base_ + pos_);
    pos_ += sizeof(T);
    return v;
  }
  std::string_view read_string(const char* field);

  // ----- header and metadata (gguf_parser.cpp) -----
  void read_header(GgufFile& f);
  void read_metadata(GgufFile& f);
  Value read_value(uint32_t type_id);
  ArrayValue read_array();
  uint32_t check_alignment(const Value& v) const;
  static void check_tokenizer(const GgufFile& f);
  static std::string type_description(const Value& v);

  // ----- tensor infos and data section (gguf_tensors.cpp) -----
  void read_tensor_infos(GgufFile& f);
  std::string describe(const TensorInfo& t) const;
  std::string layout_hint(const TensorInfo& t) const;
  void place_tensors(GgufFile& f);

  static constexpr uint64_t kNoElem = ~uint64_t{0};

  const uint8_t* base_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& name_;
  uint64_t n_tensors_ = 0;
  uint64_t n_kv_ = 0;
  // What is being read, for error messages.
  const char* section_ = "header";
  uint64_t item_ = 0;
  std::string_view item_name_;
  uint64_t elem_ = kNoElem;
};

}  // namespace moe::gguf
