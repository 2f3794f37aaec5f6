// GGUF parsing and validation. Every size, count and offset read from the file is untrusted: each
// read is bounded by the bytes left, every size computation is overflow-checked, and the tensor
// layout must match exactly what llama.cpp/gguf-py write (formats.md §1.5, engineering.md B.4).
#include "common/gguf.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <unordered_set>

#include "common/checked_math.h"
#include "common/error.h"
#include "common/mapped_file.h"

namespace moe::gguf {

static_assert(std::endian::native == std::endian::little,
              "the GGUF reader assumes a little-endian host (files are little-endian)");

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as little-endian u32
constexpr uint32_t kMaxValueType = static_cast<uint32_t>(ValueType::F64);

// Smallest possible encodings, used to reject header counts the file cannot possibly hold before
// reserving memory for them.
constexpr uint64_t kMinKvBytes = 8 + 1 + 4 + 1;  // key len, 1-byte key, type, u8 value
constexpr uint64_t kMinTensorInfoBytes =
    8 + 1 + 4 + 8 + 4 + 8;  // name, n_dims, ne[0], type, offset

}  // namespace

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

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

std::string shape_string(const TensorInfo& t) {
  std::string s;
  for (uint32_t d = 0; d < t.n_dims; ++d) {
    if (d) s += 'x';
    s += std::to_string(t.ne[d]);
  }
  return s;
}

// Printable excerpt of an untrusted name for error messages.
std::string excerpt(std::string_view s, size_t max = 64) {
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
// Parser

class GgufParser {
 public:
  GgufParser(std::span<const uint8_t> bytes, const std::string& name)
      : base_(bytes.data()), size_(bytes.size()), name_(name) {}

  // Structure, layout and tokenizer checks of one image; builds the lookup indices.
  GgufFile parse() {
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

  // Sorted lookup indices; also catches duplicate tensor names across split shards.
  static void finalize(GgufFile& f) {
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

  // Split-model bookkeeping: shard `index` (0-based) of `count` must say so in its metadata.
  static void check_split_keys(const GgufFile& f, uint32_t index, uint32_t count, bool named) {
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
      fail_file(f, "split.count is missing in a shard of a " + std::to_string(count) +
                       "-file split model");
    }
    if (named && f.find("split.no")) {
      const uint64_t no = f.require_uint("split.no");
      if (no != index) {
        fail_file(f, "split.no = " + std::to_string(no) + " but the file name says shard " +
                         std::to_string(index) + " (0-based)");
      }
    }
  }

  [[noreturn]] static void fail_file(const GgufFile& f, const std::string& msg) {
    throw Error("GGUF '" + f.path_ + "': " + msg);
  }

 private:
  // ----- error reporting -----
  [[noreturn]] void fail(const std::string& msg) const {
    throw Error("GGUF '" + name_ + "': " + msg);
  }

  // "tensor 3 ('blk.0.attn_q.weight') dims": built only when an error is reported.
  std::string where(const char* field) const {
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

  [[noreturn]] void truncated(const char* field, uint64_t need) const {
    fail("truncated while reading " + where(field) + " at offset " + std::to_string(pos_) +
         " (needs " + std::to_string(need) + " bytes, " + std::to_string(remaining()) + " left)");
  }

  // ----- bounded reads -----
  size_t remaining() const { return size_ - pos_; }

  template <typename T>
  T read(const char* field) {
    if (remaining() < sizeof(T)) truncated(field, sizeof(T));
    const T v = load<T>(base_ + pos_);
    pos_ += sizeof(T);
    return v;
  }

  std::string_view read_string(const char* field) {
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
  void read_header(GgufFile& f) {
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
      fail("header declares " + std::to_string(n_kv_) +
           " key-value pairs, more than the limit of " + std::to_string(kMaxKeyValues));
    }
    // Both counts are <= 2^20, so this cannot overflow.
    const uint64_t min_bytes = n_kv_ * kMinKvBytes + n_tensors_ * kMinTensorInfoBytes;
    if (min_bytes > remaining()) {
      fail("header declares " + std::to_string(n_kv_) + " key-value pairs and " +
           std::to_string(n_tensors_) + " tensors, which need at least " +
           std::to_string(min_bytes) + " bytes, but only " + std::to_string(remaining()) +
           " bytes remain after the header (truncated or corrupt file)");
    }
  }

  // ----- metadata -----
  void read_metadata(GgufFile& f) {
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

  Value read_value(uint32_t type_id) {
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

  ArrayValue read_array() {
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

  uint32_t check_alignment(const Value& v) const {
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

  // ----- tensor infos -----
  void read_tensor_infos(GgufFile& f) {
    section_ = "tensor";
    item_name_ = {};
    f.tensors_.reserve(n_tensors_);
    std::unordered_set<std::string_view> seen;
    seen.reserve(n_tensors_);
    for (uint64_t i = 0; i < n_tensors_; ++i) {
      item_ = i;
      item_name_ = {};
      TensorInfo t;
      t.name = read_string("name");
      if (t.name.empty()) fail("tensor " + std::to_string(i) + " has an empty name");
      if (t.name.size() > kMaxTensorNameBytes) {
        fail("tensor " + std::to_string(i) + " name '" + excerpt(t.name) + "' is " +
             std::to_string(t.name.size()) + " bytes long, more than the limit of " +
             std::to_string(kMaxTensorNameBytes));
      }
      item_name_ = t.name;
      if (!seen.insert(t.name).second) {
        fail("duplicate tensor name '" + excerpt(t.name) + "' (tensor " + std::to_string(i) + ")");
      }
      t.n_dims = read<uint32_t>("n_dims");
      if (t.n_dims < 1 || t.n_dims > 4) {
        fail(where("n_dims") + " = " + std::to_string(t.n_dims) + " (must be 1..4)");
      }
      // Element count one dimension at a time: a product of four checked only at the end can
      // wrap around to a small positive number.
      uint64_t elements = 1;
      for (uint32_t d = 0; d < t.n_dims; ++d) {
        t.ne[d] = read<int64_t>("dims");
        if (t.ne[d] < 1) {
          fail(where("dims") + ": ne[" + std::to_string(d) + "] = " + std::to_string(t.ne[d]) +
               " (every dimension must be at least 1)");
        }
        const auto prod = checked_mul(elements, static_cast<uint64_t>(t.ne[d]));
        if (!prod || *prod > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          fail(where("dims") + ": element count overflows at ne[" + std::to_string(d) +
               "] = " + std::to_string(t.ne[d]));
        }
        elements = *prod;
      }
      t.type_id = read<uint32_t>("type");
      const auto info = ggml_type_info(t.type_id);
      if (!info) {
        fail("tensor " + std::to_string(i) + " ('" + excerpt(t.name) + "') has unknown ggml type " +
             ggml_type_label(t.type_id));
      }
      const auto row = ggml_row_bytes(t.type(), static_cast<uint64_t>(t.ne[0]));
      if (!row) {
        fail("tensor '" + excerpt(t.name) + "' (type " + ggml_type_label(t.type_id) + ", shape " +
             shape_string(t) + "): ne[0] = " + std::to_string(t.ne[0]) +
             " is not a multiple of the block size " + std::to_string(info->block_size));
      }
      const auto bytes = checked_mul(*row, elements / static_cast<uint64_t>(t.ne[0]));
      if (!bytes) {
        fail("tensor '" + excerpt(t.name) + "' (type " + ggml_type_label(t.type_id) + ", shape " +
             shape_string(t) + "): byte size overflows");
      }
      t.n_bytes = *bytes;
      t.offset = read<uint64_t>("offset");
      f.tensors_.push_back(t);
    }
  }

  // ----- data section -----
  std::string describe(const TensorInfo& t) const {
    return "tensor '" + excerpt(t.name) + "' (type " + ggml_type_label(t.type_id) + ", shape " +
           shape_string(t) + ")";
  }

  std::string layout_hint(const TensorInfo& t) const {
    const auto info = ggml_type_info(t.type_id);
    return "not the layout this runtime knows for " + std::string(info ? info->name : "it");
  }

  void place_tensors(GgufFile& f) {
    if (f.tensors_.empty()) return;  // vocab-only files need no data section
    const uint64_t align = f.alignment_;
    const auto start = checked_align_up(pos_, align);
    if (!start || *start > size_) {
      fail("data section would start at offset " +
           (start ? std::to_string(*start) : std::string("(overflow)")) +
           ", past the end of the file (" + std::to_string(size_) + " bytes)");
    }
    const uint64_t data_start = *start;
    const uint64_t data_size = size_ - data_start;

    for (const TensorInfo& t : f.tensors_) {
      if (t.offset % align != 0) {
        fail(describe(t) + ": data offset " + std::to_string(t.offset) +
             " is not a multiple of the alignment " + std::to_string(align));
      }
      if (t.offset > data_size) {
        fail(describe(t) + ": data offset " + std::to_string(t.offset) +
             " is beyond the end of the file (the data section holds " + std::to_string(data_size) +
             " bytes)");
      }
    }

    // Files written by llama.cpp and gguf-py store tensors densely, each padded to the alignment.
    // Requiring exactly that catches overlaps, and a tensor whose bytes follow another block
    // layout under the same type id (which would otherwise be silently misread).
    std::vector<uint32_t> order(f.tensors_.size());
    for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
      const uint64_t oa = f.tensors_[a].offset, ob = f.tensors_[b].offset;
      return oa != ob ? oa < ob : a < b;
    });
    for (size_t k = 0; k < order.size(); ++k) {
      TensorInfo& t = f.tensors_[order[k]];
      const auto padded = checked_align_up(t.n_bytes, align);
      if (!padded) {
        fail(describe(t) + ": byte size " + std::to_string(t.n_bytes) +
             " overflows when padded to the alignment");
      }
      if (k + 1 < order.size()) {
        const TensorInfo& next = f.tensors_[order[k + 1]];
        const uint64_t gap = next.offset - t.offset;
        if (gap != *padded) {
          std::string msg = describe(t) + " needs " + std::to_string(t.n_bytes) +
                            " bytes but occupies " + std::to_string(gap) +
                            " bytes in the file: " + layout_hint(t) + " (next tensor '" +
                            excerpt(next.name) + "' at data offset " + std::to_string(next.offset);
          msg += gap < t.n_bytes ? ", overlapping it)" : ")";
          fail(msg);
        }
      } else {
        const uint64_t avail = data_size - t.offset;
        if (avail < t.n_bytes) {
          fail(describe(t) + " needs " + std::to_string(t.n_bytes) + " bytes but only " +
               std::to_string(avail) + " bytes remain in the file after its data offset " +
               std::to_string(t.offset) + ": truncated file, or " + layout_hint(t));
        }
      }
      t.data = base_ + data_start + t.offset;
    }
  }

  // ----- tokenizer consistency -----
  // Arrays the tokenizer reads with a fixed element type must declare it (llama.cpp PR #26690:
  // a float read of an array declared as u8 over-reads the heap), and must cover every token.
  static void check_tokenizer(const GgufFile& f) {
    std::optional<uint64_t> n_tokens;
    if (const Value* v = f.find("tokenizer.ggml.tokens")) {
      const ArrayValue* a = std::get_if<ArrayValue>(&v->v);
      if (!a || a->elem_type != ValueType::STRING) {
        fail_file(
            f, "tokenizer.ggml.tokens must be an array of strings, found " + type_description(*v));
      }
      n_tokens = a->count;
    }
    if (const Value* v = f.find("tokenizer.ggml.merges")) {
      const ArrayValue* a = std::get_if<ArrayValue>(&v->v);
      if (!a || a->elem_type != ValueType::STRING) {
        fail_file(
            f, "tokenizer.ggml.merges must be an array of strings, found " + type_description(*v));
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

  static std::string type_description(const Value& v) {
    if (const ArrayValue* a = std::get_if<ArrayValue>(&v.v)) {
      return "an array of " + std::string(value_type_name(a->elem_type));
    }
    return std::string(value_type_name(v.type));
  }

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
