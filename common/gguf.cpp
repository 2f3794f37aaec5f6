// GGUF model files: value types and array accessors, opening a file or every shard of a split
// model, the lookup indices (with the checks across shards) and the typed metadata getters.
// Parsing one image is in gguf_parser.cpp (header, metadata) and gguf_tensors.cpp (tensor layout).
#include "common/gguf.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <optional>

#include "common/error.h"
#include "common/gguf_internal.h"
#include "common/mapped_file.h"

namespace moe::gguf {

using detail::excerpt;
using detail::load;

size_t value_type_size(ValueType t) {
  switch (t) {
    case ValueType::U8:
    case ValueType::I8:
    case ValueType::BOOL:
      return 1;
    case ValueType::U16:
    case ValueType::I16:
      return 2;
    case ValueType::U32:
    case ValueType::I32:
    case ValueType::F32:
      return 4;
    case ValueType::U64:
    case ValueType::I64:
    case ValueType::F64:
      return 8;
    case ValueType::STRING:
    case ValueType::ARRAY:
      return 0;
  }
  return 0;
}

namespace {

bool is_unsigned(ValueType t) {
  return t == ValueType::U8 || t == ValueType::U16 || t == ValueType::U32 || t == ValueType::U64;
}
bool is_signed(ValueType t) {
  return t == ValueType::I8 || t == ValueType::I16 || t == ValueType::I32 || t == ValueType::I64;
}
bool is_float(ValueType t) { return t == ValueType::F32 || t == ValueType::F64; }

// "x-00002-of-00003.gguf" -> {"x", 2, 3}.
struct SplitName {
  std::string prefix;
  uint32_t index;  // 1-based
  uint32_t count;
};

std::optional<SplitName> parse_split_name(const std::string& path) {
  static constexpr std::string_view kSuffix = ".gguf";
  static constexpr size_t kTail = 1 + 5 + 4 + 5;  // "-NNNNN-of-MMMMM"
  if (path.size() < kTail + kSuffix.size() + 1 || !path.ends_with(kSuffix)) return std::nullopt;
  const std::string_view tail =
      std::string_view(path).substr(path.size() - kSuffix.size() - kTail, kTail);
  auto digits = [](std::string_view d, uint32_t& out) {
    out = 0;
    for (char c : d) {
      if (c < '0' || c > '9') return false;
      out = out * 10 + static_cast<uint32_t>(c - '0');
    }
    return true;
  };
  SplitName s;
  if (tail[0] != '-' || tail.substr(6, 4) != "-of-" || !digits(tail.substr(1, 5), s.index) ||
      !digits(tail.substr(10, 5), s.count)) {
    return std::nullopt;
  }
  if (s.count == 0 || s.index == 0 || s.index > s.count) return std::nullopt;
  s.prefix = path.substr(0, path.size() - kSuffix.size() - kTail);
  return s;
}

std::string shard_path(const SplitName& s, uint32_t index) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "-%05u-of-%05u.gguf", index, s.count);
  return s.prefix + buf;
}

}  // namespace

std::string_view value_type_name(ValueType t) {
  switch (t) {
    case ValueType::U8:
      return "u8";
    case ValueType::I8:
      return "i8";
    case ValueType::U16:
      return "u16";
    case ValueType::I16:
      return "i16";
    case ValueType::U32:
      return "u32";
    case ValueType::I32:
      return "i32";
    case ValueType::F32:
      return "f32";
    case ValueType::BOOL:
      return "bool";
    case ValueType::STRING:
      return "string";
    case ValueType::ARRAY:
      return "array";
    case ValueType::U64:
      return "u64";
    case ValueType::I64:
      return "i64";
    case ValueType::F64:
      return "f64";
  }
  return "unknown";
}

// ---------------------------------------------------------------------------------------------
// ArrayValue accessors

namespace {

void check_index(const ArrayValue& a, uint64_t i) {
  if (i >= a.count) {
    throw Error("array index " + std::to_string(i) + " out of range (array of " +
                std::to_string(a.count) + " " + std::string(value_type_name(a.elem_type)) +
                " elements)");
  }
}

[[noreturn]] void bad_conversion(const ArrayValue& a, const char* wanted) {
  throw Error("array of " + std::string(value_type_name(a.elem_type)) + " elements has no " +
              wanted + " elements");
}

}  // namespace

int64_t ArrayValue::int_at(uint64_t i) const {
  check_index(*this, i);
  const size_t size = value_type_size(elem_type);
  const uint8_t* p = data + i * size;
  switch (elem_type) {
    case ValueType::U8:
      return load<uint8_t>(p);
    case ValueType::I8:
      return load<int8_t>(p);
    case ValueType::U16:
      return load<uint16_t>(p);
    case ValueType::I16:
      return load<int16_t>(p);
    case ValueType::U32:
      return load<uint32_t>(p);
    case ValueType::I32:
      return load<int32_t>(p);
    case ValueType::I64:
      return load<int64_t>(p);
    case ValueType::BOOL:
      return load<uint8_t>(p) != 0;
    case ValueType::U64: {
      const auto v = load<uint64_t>(p);
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        throw Error("array element " + std::to_string(i) + " = " + std::to_string(v) +
                    " does not fit a signed 64-bit integer");
      }
      return static_cast<int64_t>(v);
    }
    default:
      bad_conversion(*this, "integer");
  }
}

double ArrayValue::float_at(uint64_t i) const {
  check_index(*this, i);
  switch (elem_type) {
    case ValueType::F32:
      return load<float>(data + i * 4);
    case ValueType::F64:
      return load<double>(data + i * 8);
    case ValueType::U64:
      return static_cast<double>(load<uint64_t>(data + i * 8));
    default:
      if (is_unsigned(elem_type) || is_signed(elem_type) || elem_type == ValueType::BOOL) {
        return static_cast<double>(int_at(i));
      }
      bad_conversion(*this, "numeric");
  }
}

std::string_view ArrayValue::string_at(uint64_t i) const {
  check_index(*this, i);
  if (elem_type != ValueType::STRING) bad_conversion(*this, "string");
  return strings[i];
}

// ---------------------------------------------------------------------------------------------
// Lookup indices and checks across the shards of a split model

void GgufParser::finalize(GgufFile& f) {
  f.kv_by_key_.resize(f.kv_.size());
  for (uint32_t i = 0; i < f.kv_.size(); ++i) f.kv_by_key_[i] = i;
  std::sort(f.kv_by_key_.begin(), f.kv_by_key_.end(),
            [&](uint32_t a, uint32_t b) { return f.kv_[a].key < f.kv_[b].key; });

  f.tensor_by_name_.resize(f.tensors_.size());
  for (uint32_t i = 0; i < f.tensors_.size(); ++i) f.tensor_by_name_[i] = i;
  std::sort(f.tensor_by_name_.begin(), f.tensor_by_name_.end(), [&](uint32_t a, uint32_t b) {
    const std::string_view na = f.tensors_[a].name, nb = f.tensors_[b].name;
    return na != nb ? na < nb : a < b;  // ties in file order for the message below
  });
  for (size_t i = 1; i < f.tensor_by_name_.size(); ++i) {
    const TensorInfo& a = f.tensors_[f.tensor_by_name_[i - 1]];
    const TensorInfo& b = f.tensors_[f.tensor_by_name_[i]];
    if (a.name == b.name) {
      throw Error("GGUF '" + f.path_ + "': duplicate tensor name '" + excerpt(a.name) +
                  "' (in shards " + std::to_string(a.shard + 1) + " and " +
                  std::to_string(b.shard + 1) + ")");
    }
  }
}

uint64_t GgufFile::file_bytes(const std::string& path) {
  const auto split = parse_split_name(path);
  const uint32_t n = split ? split->count : 1;
  uint64_t total = 0;
  for (uint32_t k = 0; k < n; ++k) {
    std::error_code ec;
    const uintmax_t b = std::filesystem::file_size(split ? shard_path(*split, k + 1) : path, ec);
    if (ec) return 0;
    total += b;
  }
  return total;
}

void GgufParser::check_split_keys(const GgufFile& f, uint32_t index, uint32_t count, bool named) {
  const Value* c = f.find("split.count");
  if (c) {
    const uint64_t declared = f.require_uint("split.count");
    if (!named && declared > 1) {
      fail_file(f, "split.count = " + std::to_string(declared) +
                       ": this is one shard of a split model; open it by its shard file name "
                       "(<prefix>-NNNNN-of-MMMMM.gguf)");
    }
    if (named && declared != count) {
      fail_file(f, "split.count = " + std::to_string(declared) + " but the file name says " +
                       std::to_string(count) + " shards");
    }
  } else if (named && count > 1) {
    fail_file(
        f, "split.count is missing in a shard of a " + std::to_string(count) + "-file split model");
  }
  if (named && f.find("split.no")) {
    const uint64_t no = f.require_uint("split.no");
    if (no != index) {
      fail_file(f, "split.no = " + std::to_string(no) + " but the file name says shard " +
                       std::to_string(index) + " (0-based)");
    }
  }
}

void GgufParser::fail_file(const GgufFile& f, const std::string& msg) {
  throw Error("GGUF '" + f.path_ + "': " + msg);
}

// ---------------------------------------------------------------------------------------------
// GgufFile

GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;
GgufFile::~GgufFile() = default;

std::vector<std::span<const uint8_t>> GgufFile::shard_bytes() const {
  std::vector<std::span<const uint8_t>> out;
  for (const auto& m : maps_) out.push_back(m->bytes());
  return out;
}

bool GgufFile::loaded() const {
  return !maps_.empty() && std::all_of(maps_.begin(), maps_.end(),
                                       [](const auto& m) { return m->mode() == LoadMode::Loaded; });
}

GgufFile GgufFile::parse(std::span<const uint8_t> bytes, std::string name) {
  return GgufParser(bytes, name).parse();
}

GgufFile GgufFile::open(const std::string& path, LoadMode mode) {
  const auto split = parse_split_name(path);
  const uint32_t count = split ? split->count : 1;

  GgufFile result;
  uint64_t total_tensors = 0;
  for (uint32_t k = 0; k < count; ++k) {
    const std::string p = split ? shard_path(*split, k + 1) : path;
    auto map = MappedFile::open(p, mode);
    GgufFile shard = GgufParser(map->bytes(), p).parse();
    shard.maps_.push_back(std::move(map));
    GgufParser::check_split_keys(shard, k, count, split.has_value());
    total_tensors += shard.tensors_.size();
    if (k == 0) {
      result = std::move(shard);
      result.path_ = path;
      continue;
    }
    for (TensorInfo t : shard.tensors_) {
      t.shard = k;
      result.tensors_.push_back(t);
    }
    // The shard's metadata (keys, strings) points into its mapping, which must stay alive too.
    for (auto& m : shard.maps_) result.maps_.push_back(std::move(m));
  }
  result.n_shards_ = count;
  if (count > 1) GgufParser::finalize(result);

  if (result.find("split.tensors.count")) {
    const uint64_t declared = result.require_uint("split.tensors.count");
    if (declared != total_tensors) {
      GgufParser::fail_file(result, "split.tensors.count = " + std::to_string(declared) +
                                        " but the file" + (count > 1 ? "s hold " : " holds ") +
                                        std::to_string(total_tensors) + " tensors");
    }
  }
  return result;
}

const Value* GgufFile::find(std::string_view key) const {
  const auto it = std::lower_bound(kv_by_key_.begin(), kv_by_key_.end(), key,
                                   [&](uint32_t i, std::string_view k) { return kv_[i].key < k; });
  if (it == kv_by_key_.end() || kv_[*it].key != key) return nullptr;
  return &kv_[*it].value;
}

const TensorInfo* GgufFile::find_tensor(std::string_view name) const {
  const auto it =
      std::lower_bound(tensor_by_name_.begin(), tensor_by_name_.end(), name,
                       [&](uint32_t i, std::string_view n) { return tensors_[i].name < n; });
  if (it == tensor_by_name_.end() || tensors_[*it].name != name) return nullptr;
  return &tensors_[*it];
}

namespace {

[[noreturn]] void key_error(const std::string& path, std::string_view key, const std::string& msg) {
  throw Error("GGUF '" + path + "': key '" + std::string(key) + "' " + msg);
}

[[noreturn]] void wrong_type(const std::string& path, std::string_view key, const Value& v,
                             const char* expected) {
  std::string actual(value_type_name(v.type));
  if (const ArrayValue* a = std::get_if<ArrayValue>(&v.v)) {
    actual = "array of " + std::string(value_type_name(a->elem_type));
  }
  key_error(path, key, "has type " + actual + ", expected " + expected);
}

}  // namespace

std::string_view GgufFile::require_string(std::string_view key) const {
  const Value* v = find(key);
  if (!v) key_error(path_, key, "is missing");
  if (v->type != ValueType::STRING) wrong_type(path_, key, *v, "string");
  return std::get<std::string_view>(v->v);
}

uint64_t GgufFile::require_uint(std::string_view key) const {
  const Value* v = find(key);
  if (!v) key_error(path_, key, "is missing");
  if (is_unsigned(v->type)) return std::get<uint64_t>(v->v);
  if (is_signed(v->type)) {
    const int64_t s = std::get<int64_t>(v->v);
    if (s < 0) key_error(path_, key, "= " + std::to_string(s) + " is negative");
    return static_cast<uint64_t>(s);
  }
  wrong_type(path_, key, *v, "an unsigned integer");
}

double GgufFile::require_float(std::string_view key) const {
  const Value* v = find(key);
  if (!v) key_error(path_, key, "is missing");
  if (is_float(v->type)) return std::get<double>(v->v);
  if (is_unsigned(v->type)) return static_cast<double>(std::get<uint64_t>(v->v));
  if (is_signed(v->type)) return static_cast<double>(std::get<int64_t>(v->v));
  wrong_type(path_, key, *v, "a number");
}

bool GgufFile::require_bool(std::string_view key) const {
  const Value* v = find(key);
  if (!v) key_error(path_, key, "is missing");
  if (v->type != ValueType::BOOL) wrong_type(path_, key, *v, "bool");
  return std::get<bool>(v->v);
}

const ArrayValue& GgufFile::require_array(std::string_view key) const {
  const Value* v = find(key);
  if (!v) key_error(path_, key, "is missing");
  if (v->type != ValueType::ARRAY) wrong_type(path_, key, *v, "array");
  return std::get<ArrayValue>(v->v);
}

// The get_* forms fall back only when the key is absent: a key present with the wrong type is a
// malformed file and still throws.
std::string_view GgufFile::get_string(std::string_view key, std::string_view fallback) const {
  return find(key) ? require_string(key) : fallback;
}
uint64_t GgufFile::get_uint(std::string_view key, uint64_t fallback) const {
  return find(key) ? require_uint(key) : fallback;
}
double GgufFile::get_float(std::string_view key, double fallback) const {
  return find(key) ? require_float(key) : fallback;
}
bool GgufFile::get_bool(std::string_view key, bool fallback) const {
  return find(key) ? require_bool(key) : fallback;
}

}  // namespace moe::gguf
