// GGUF parsing, part 1: the bounded reader and its error context, the header, the metadata
// key-value pairs and the checks on metadata (alignment, tokenizer arrays). Every size, count and
// offset read from the file is untrusted: each read is bounded by the bytes left and every size
// computation is overflow-checked (formats.md §1.5, engineering.md B.4). Tensor infos and the
// data layout are in gguf_tensors.cpp.
#include <bit>
#include <cstdio>
#include <optional>
#include <unordered_set>

#include "common/error.h"
#include "common/gguf.h"
#include "common/gguf_internal.h"

namespace moe::gguf {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as little-endian u32
constexpr uint32_t kMaxValueType = static_cast<uint32_t>(ValueType::F64);

// Smallest possible encodings, used to reject header counts the file cannot possibly hold before
// reserving memory for them.
constexpr uint64_t kMinKvBytes = 8 + 1 + 4 + 1;  // key len, 1-byte key, type, u8 value
constexpr uint64_t kMinTensorInfoBytes =
    8 + 1 + 4 + 8 + 4 + 8;  // name, n_dims, ne[0], type, offset

}  // namespace

namespace detail {

std::string excerpt(std::string_view s, size_t max) {
  std::string out;
  for (char c : s.substr(0, max)) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f || c == '\\' || c == '\'') {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  if (s.size() > max) out += "...";
  return out;
}

}  // namespace detail

using detail::excerpt;

GgufFile GgufParser::parse() {
  GgufFile f;
  f.path_ = name_;
  read_header(f);
  read_metadata(f);
  read_tensor_infos(f);
  place_tensors(f);
  finalize(f);
  check_tokenizer(f);
  return f;
}

// ----- error reporting -----

void GgufParser::fail(const std::string& msg) const { throw Error("GGUF '" + name_ + "': " + msg); }

// "tensor 3 ('blk.0.attn_q.weight') dims": built only when an error is reported.
std::string GgufParser::where(const char* field) const {
  std::string s = section_;
  if (section_ != std::string_view("header")) {
    s += ' ' + std::to_string(item_);
    if (!item_name_.empty()) s += " ('" + excerpt(item_name_) + "')";
  }
  s += ' ';
  s += field;
  if (elem_ != kNoElem) s += ' ' + std::to_string(elem_);
  return s;
}

void GgufParser::truncated(const char* field, uint64_t need) const {
  fail("truncated while reading " + where(field) + " at offset " + std::to_string(pos_) +
       " (needs " + std::to_string(need) + " bytes, " + std::to_string(remaining()) + " left)");
}

// ----- bounded reads -----

std::string_view GgufParser::read_string(const char* field) {
  const auto len = read<uint64_t>(field);
  if (len > kMaxStringBytes) {
    fail(where(field) + " at offset " + std::to_string(pos_ - 8) + ": string length " +
         std::to_string(len) + " exceeds the limit of " + std::to_string(kMaxStringBytes) +
         " bytes");
  }
  if (len > remaining()) truncated(field, len);
  const std::string_view s(reinterpret_cast<const char*>(base_ + pos_), len);
  pos_ += len;
  return s;
}

// ----- header -----

void GgufParser::read_header(GgufFile& f) {
  const auto magic = read<uint32_t>("magic");
  if (magic != kMagic) {
    char buf[96];
    std::snprintf(buf, sizeof buf,
                  "not a GGUF file: bad magic %02x %02x %02x %02x (expected \"GGUF\")", base_[0],
                  base_[1], base_[2], base_[3]);
    fail(buf);
  }
  f.version_ = read<uint32_t>("version");
  if (f.version_ != 0 && (f.version_ & 0xFFFF) == 0) {
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "version field reads 0x%08x: probably a big-endian GGUF file, which this "
                  "runtime does not support",
                  f.version_);
    fail(buf);
  }
  if (f.version_ < 2 || f.version_ > 3) {
    fail("unsupported GGUF version " + std::to_string(f.version_) + " (supported: 2 and 3)");
  }
  n_tensors_ = read<uint64_t>("n_tensors");
  n_kv_ = read<uint64_t>("n_kv");
  if (n_tensors_ > kMaxTensors) {
    fail("header declares " + std::to_string(n_tensors_) + " tensors, more than the limit of " +
         std::to_string(kMaxTensors));
  }
  if (n_kv_ > kMaxKeyValues) {
    fail("header declares " + std::to_string(n_kv_) + " key-value pairs, more than the limit of " +
         std::to_string(kMaxKeyValues));
  }
  // Both counts are <= 2^20, so this cannot overflow.
  const uint64_t min_bytes = n_kv_ * kMinKvBytes + n_tensors_ * kMinTensorInfoBytes;
  if (min_bytes > remaining()) {
    fail("header declares " + std::to_string(n_kv_) + " key-value pairs and " +
         std::to_string(n_tensors_) + " tensors, which need at least " + std::to_string(min_bytes) +
         " bytes, but only " + std::to_string(remaining()) +
         " bytes remain after the header (truncated or corrupt file)");
  }
}

// ----- metadata -----

void GgufParser::read_metadata(GgufFile& f) {
  section_ = "key-value";
  f.kv_.reserve(n_kv_);
  std::unordered_set<std::string_view> seen;
  seen.reserve(n_kv_);
  for (uint64_t i = 0; i < n_kv_; ++i) {
    item_ = i;
    item_name_ = {};
    const std::string_view key = read_string("key");
    if (key.empty()) fail("key-value " + std::to_string(i) + " has an empty key");
    item_name_ = key;
    if (!seen.insert(key).second) {
      fail("duplicate key '" + excerpt(key) + "' (key-value " + std::to_string(i) + ")");
    }
    const auto type = read<uint32_t>("value type");
    KeyValue kv{key, read_value(type)};
    if (key == "general.alignment") f.alignment_ = check_alignment(kv.value);
    f.kv_.push_back(std::move(kv));
  }
}

Value GgufParser::read_value(uint32_t type_id) {
  Value val;
  if (type_id > kMaxValueType) {
    fail(where("value type") + ": unknown value type id " + std::to_string(type_id));
  }
  val.type = static_cast<ValueType>(type_id);
  switch (val.type) {
    case ValueType::U8:
      val.v = uint64_t{read<uint8_t>("value")};
      break;
    case ValueType::I8:
      val.v = int64_t{read<int8_t>("value")};
      break;
    case ValueType::U16:
      val.v = uint64_t{read<uint16_t>("value")};
      break;
    case ValueType::I16:
      val.v = int64_t{read<int16_t>("value")};
      break;
    case ValueType::U32:
      val.v = uint64_t{read<uint32_t>("value")};
      break;
    case ValueType::I32:
      val.v = int64_t{read<int32_t>("value")};
      break;
    case ValueType::U64:
      val.v = read<uint64_t>("value");
      break;
    case ValueType::I64:
      val.v = read<int64_t>("value");
      break;
    case ValueType::F32:
      val.v = double{read<float>("value")};
      break;
    case ValueType::F64:
      val.v = read<double>("value");
      break;
    case ValueType::BOOL:
      val.v = read<uint8_t>("value") != 0;
      break;
    case ValueType::STRING:
      val.v = read_string("value");
      break;
    case ValueType::ARRAY:
      val.v = read_array();
      break;
  }
  return val;
}

ArrayValue GgufParser::read_array() {
  ArrayValue a;
  const auto et = read<uint32_t>("array element type");
  if (et == static_cast<uint32_t>(ValueType::ARRAY)) {
    fail(where("value") + ": arrays of arrays are not supported");
  }
  if (et > kMaxValueType) {
    fail(where("value") + ": unknown array element type id " + std::to_string(et));
  }
  a.elem_type = static_cast<ValueType>(et);
  a.count = read<uint64_t>("array count");
  if (a.count > kMaxArrayElements) {
    fail(where("value") + ": array of " + std::to_string(a.count) +
         " elements exceeds the limit of " + std::to_string(kMaxArrayElements));
  }
  a.data = base_ + pos_;
  if (a.elem_type == ValueType::STRING) {
    // Every string needs at least its 8-byte length: bounds the reserve() below by the file.
    if (a.count > remaining() / 8) {
      fail("truncated: " + where("value") + " declares " + std::to_string(a.count) +
           " strings, which need at least " + std::to_string(a.count * 8) + " bytes, but only " +
           std::to_string(remaining()) + " bytes remain at offset " + std::to_string(pos_));
    }
    a.strings.reserve(a.count);
    for (uint64_t j = 0; j < a.count; ++j) {
      elem_ = j;
      a.strings.push_back(read_string("array element"));
    }
    elem_ = kNoElem;
  } else {
    const size_t size = value_type_size(a.elem_type);
    if (a.count > remaining() / size) {
      fail("truncated: " + where("value") + " declares " + std::to_string(a.count) + " " +
           std::string(value_type_name(a.elem_type)) + " elements (" +
           std::to_string(a.count * size) + " bytes), but only " + std::to_string(remaining()) +
           " bytes remain at offset " + std::to_string(pos_));
    }
    pos_ += a.count * size;
  }
  return a;
}

uint32_t GgufParser::check_alignment(const Value& v) const {
  if (v.type != ValueType::U32) {
    fail("general.alignment must have type u32, found " + std::string(value_type_name(v.type)));
  }
  const uint64_t a = std::get<uint64_t>(v.v);
  if (a == 0 || !std::has_single_bit(a) || a > kMaxAlignment) {
    fail("general.alignment = " + std::to_string(a) +
         " is invalid (must be a power of two between 1 and " + std::to_string(kMaxAlignment) +
         ")");
  }
  return static_cast<uint32_t>(a);
}

// ----- tokenizer consistency -----
// Arrays the tokenizer reads with a fixed element type must declare it (llama.cpp PR #26690:
// a float read of an array declared as u8 over-reads the heap), and must cover every token.
void GgufParser::check_tokenizer(const GgufFile& f) {
  std::optional<uint64_t> n_tokens;
  if (const Value* v = f.find("tokenizer.ggml.tokens")) {
    const ArrayValue* a = std::get_if<ArrayValue>(&v->v);
    if (!a || a->elem_type != ValueType::STRING) {
      fail_file(f,
                "tokenizer.ggml.tokens must be an array of strings, found " + type_description(*v));
    }
    n_tokens = a->count;
  }
  if (const Value* v = f.find("tokenizer.ggml.merges")) {
    const ArrayValue* a = std::get_if<ArrayValue>(&v->v);
    if (!a || a->elem_type != ValueType::STRING) {
      fail_file(f,
                "tokenizer.ggml.merges must be an array of strings, found " + type_description(*v));
    }
  }
  const struct {
    const char* key;
    ValueType elem;
  } per_token[] = {{"tokenizer.ggml.token_type", ValueType::I32},
                   {"tokenizer.ggml.scores", ValueType::F32}};
  for (const auto& pt : per_token) {
    const Value* v = f.find(pt.key);
    if (!v) continue;
    const ArrayValue* a = std::get_if<ArrayValue>(&v->v);
    if (!a || a->elem_type != pt.elem) {
      fail_file(f, std::string(pt.key) + " must be an array of " +
                       std::string(value_type_name(pt.elem)) + ", found " + type_description(*v));
    }
    if (n_tokens && a->count < *n_tokens) {
      fail_file(f, std::string(pt.key) + " has " + std::to_string(a->count) +
                       " elements, fewer than the " + std::to_string(*n_tokens) + " tokens");
    }
  }
  for (const char* key : {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                          "tokenizer.ggml.padding_token_id", "tokenizer.ggml.unknown_token_id"}) {
    if (!f.find(key)) continue;
    const uint64_t id = f.require_uint(key);  // rejects non-integers and negative ids
    if (n_tokens && id >= *n_tokens) {
      fail_file(f, std::string(key) + " = " + std::to_string(id) +
                       " is out of range (the vocabulary has " + std::to_string(*n_tokens) +
                       " tokens)");
    }
  }
}

std::string GgufParser::type_description(const Value& v) {
  if (const ArrayValue* a = std::get_if<ArrayValue>(&v.v)) {
    return "an array of " + std::string(value_type_name(a->elem_type));
  }
  return std::string(value_type_name(v.type));
}

}  // namespace moe::gguf
