#include "common/gguf_writer.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "common/checked_math.h"
#include "common/error.h"

namespace moe::gguf {
namespace {

template <typename T>
void put(std::vector<uint8_t>& b, T v) {
  // resize + memcpy rather than insert: GCC 12 misreports insert of a local's bytes as overflow.
  const size_t at = b.size();
  b.resize(at + sizeof(T));
  std::memcpy(b.data() + at, &v, sizeof(T));
}

void put_string(std::vector<uint8_t>& b, const std::string& s) {
  put<uint64_t>(b, s.size());
  b.insert(b.end(), s.begin(), s.end());
}

template <typename T>
std::vector<uint8_t> scalar(T v) {
  std::vector<uint8_t> b;
  put(b, v);
  return b;
}

struct FileCloser {
  void operator()(FILE* f) const {
    if (f) std::fclose(f);
  }
};

}  // namespace

GgufWriter::GgufWriter(uint32_t alignment) : alignment_(alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    throw Error("GGUF alignment must be a power of two, got " + std::to_string(alignment));
  }
  if (alignment != 32) set_u32("general.alignment", alignment);
}

void GgufWriter::add_kv(const std::string& key, ValueType type, std::vector<uint8_t> payload) {
  if (key.empty() || std::find(keys_.begin(), keys_.end(), key) != keys_.end()) {
    throw Error("GGUF writer: empty or duplicate key '" + key + "'");
  }
  keys_.push_back(key);
  put_string(kv_bytes_, key);
  put<uint32_t>(kv_bytes_, static_cast<uint32_t>(type));
  kv_bytes_.insert(kv_bytes_.end(), payload.begin(), payload.end());
}

void GgufWriter::set_u32(const std::string& k, uint32_t v) { add_kv(k, ValueType::U32, scalar(v)); }
void GgufWriter::set_i32(const std::string& k, int32_t v) { add_kv(k, ValueType::I32, scalar(v)); }
void GgufWriter::set_u64(const std::string& k, uint64_t v) { add_kv(k, ValueType::U64, scalar(v)); }
void GgufWriter::set_f32(const std::string& k, float v) { add_kv(k, ValueType::F32, scalar(v)); }
void GgufWriter::set_bool(const std::string& k, bool v) {
  add_kv(k, ValueType::BOOL, scalar<uint8_t>(v ? 1 : 0));
}
void GgufWriter::set_string(const std::string& k, const std::string& v) {
  std::vector<uint8_t> b;
  put_string(b, v);
  add_kv(k, ValueType::STRING, std::move(b));
}
void GgufWriter::set_strings(const std::string& k, const std::vector<std::string>& v) {
  std::vector<uint8_t> b;
  put<uint32_t>(b, static_cast<uint32_t>(ValueType::STRING));
  put<uint64_t>(b, v.size());
  for (const auto& s : v) put_string(b, s);
  add_kv(k, ValueType::ARRAY, std::move(b));
}
void GgufWriter::set_i32s(const std::string& k, const std::vector<int32_t>& v) {
  std::vector<uint8_t> b;
  put<uint32_t>(b, static_cast<uint32_t>(ValueType::I32));
  put<uint64_t>(b, v.size());
  for (int32_t x : v) put(b, x);
  add_kv(k, ValueType::ARRAY, std::move(b));
}
void GgufWriter::set_f32s(const std::string& k, const std::vector<float>& v) {
  std::vector<uint8_t> b;
  put<uint32_t>(b, static_cast<uint32_t>(ValueType::F32));
  put<uint64_t>(b, v.size());
  for (float x : v) put(b, x);
  add_kv(k, ValueType::ARRAY, std::move(b));
}

void GgufWriter::copy_value(const std::string& k, const Value& v) {
  std::vector<uint8_t> b;
  const auto scalar_bytes = [&](ValueType t) {
    switch (t) {
      case ValueType::U8:
        return put<uint8_t>(b, static_cast<uint8_t>(std::get<uint64_t>(v.v)));
      case ValueType::U16:
        return put<uint16_t>(b, static_cast<uint16_t>(std::get<uint64_t>(v.v)));
      case ValueType::U32:
        return put<uint32_t>(b, static_cast<uint32_t>(std::get<uint64_t>(v.v)));
      case ValueType::U64:
        return put<uint64_t>(b, std::get<uint64_t>(v.v));
      case ValueType::I8:
        return put<int8_t>(b, static_cast<int8_t>(std::get<int64_t>(v.v)));
      case ValueType::I16:
        return put<int16_t>(b, static_cast<int16_t>(std::get<int64_t>(v.v)));
      case ValueType::I32:
        return put<int32_t>(b, static_cast<int32_t>(std::get<int64_t>(v.v)));
      case ValueType::I64:
        return put<int64_t>(b, std::get<int64_t>(v.v));
      case ValueType::F32:
        return put<float>(b, static_cast<float>(std::get<double>(v.v)));
      case ValueType::F64:
        return put<double>(b, std::get<double>(v.v));
      case ValueType::BOOL:
        return put<uint8_t>(b, std::get<bool>(v.v) ? 1 : 0);
      case ValueType::STRING:
        return put_string(b, std::string(std::get<std::string_view>(v.v)));
      default:
        throw Error("GGUF writer: cannot copy key '" + k + "' of type " +
                    std::string(value_type_name(t)));
    }
  };
  if (v.type != ValueType::ARRAY) {
    scalar_bytes(v.type);
    return add_kv(k, v.type, std::move(b));
  }
  const auto& a = std::get<ArrayValue>(v.v);
  put<uint32_t>(b, static_cast<uint32_t>(a.elem_type));
  put<uint64_t>(b, a.count);
  if (a.elem_type == ValueType::STRING) {
    for (const auto s : a.strings) put_string(b, std::string(s));
  } else {
    const size_t elem = value_type_size(a.elem_type);
    if (elem == 0) {
      throw Error("GGUF writer: cannot copy array key '" + k + "' of element type " +
                  std::string(value_type_name(a.elem_type)));
    }
    // The parser validated count * elem against the file, so the raw bytes are all there.
    b.insert(b.end(), a.data, a.data + a.count * elem);
  }
  add_kv(k, ValueType::ARRAY, std::move(b));
}

void GgufWriter::add_tensor(const std::string& name, GgmlType type,
                            const std::vector<int64_t>& ne) {
  const std::string what = "GGUF writer: tensor '" + name + "'";
  if (name.empty() || name.size() > kMaxTensorNameBytes) throw Error(what + ": bad name length");
  for (const auto& t : tensors_) {
    if (t.name == name) throw Error(what + ": duplicate name");
  }
  if (ne.empty() || ne.size() > 4) throw Error(what + ": needs 1 to 4 dimensions");
  uint64_t rows = 1;
  for (size_t d = 1; d < ne.size(); ++d) {
    const auto r = ne[d] > 0 ? checked_mul(rows, static_cast<uint64_t>(ne[d])) : std::nullopt;
    if (!r) throw Error(what + ": bad dimension");
    rows = *r;
  }
  const auto row = ne[0] > 0 ? ggml_row_bytes(type, static_cast<uint64_t>(ne[0])) : std::nullopt;
  const auto bytes = row ? checked_mul(*row, rows) : std::nullopt;
  if (!bytes) {
    throw Error(what + ": shape does not fit type " + ggml_type_label(static_cast<uint32_t>(type)));
  }
  tensors_.push_back({name, type, ne, *bytes});
}

void GgufWriter::write(const std::string& path, const FillFn& fill) const {
  std::vector<uint8_t> head;
  put<uint32_t>(head, 0x46554747u);  // "GGUF"
  put<uint32_t>(head, 3);
  put<uint64_t>(head, tensors_.size());
  put<uint64_t>(head, keys_.size());
  head.insert(head.end(), kv_bytes_.begin(), kv_bytes_.end());
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    put_string(head, t.name);
    put<uint32_t>(head, static_cast<uint32_t>(t.ne.size()));
    for (int64_t n : t.ne) put<int64_t>(head, n);
    put<uint32_t>(head, static_cast<uint32_t>(t.type));
    put<uint64_t>(head, offset);
    offset = *checked_align_up(offset + t.n_bytes, alignment_);
  }
  head.resize(*checked_align_up(head.size(), alignment_), 0);

  const std::string tmp = path + ".partial";
  std::unique_ptr<FILE, FileCloser> f(std::fopen(tmp.c_str(), "wb"));
  if (!f) throw Error("cannot create '" + tmp + "': " + std::strerror(errno));
  auto write_all = [&](const void* p, size_t n) {
    if (n && std::fwrite(p, 1, n, f.get()) != n) {
      const std::string err = std::strerror(errno);
      f.reset();
      std::remove(tmp.c_str());
      throw Error("cannot write '" + tmp + "': " + err);
    }
  };
  write_all(head.data(), head.size());
  std::vector<uint8_t> buf;
  const std::vector<uint8_t> zeros(alignment_, 0);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    buf.assign(tensors_[i].n_bytes, 0);
    try {
      fill(i, buf.data(), buf.size());
    } catch (...) {
      f.reset();
      std::remove(tmp.c_str());
      throw;
    }
    write_all(buf.data(), buf.size());
    const uint64_t pad = *checked_align_up(buf.size(), alignment_) - buf.size();
    write_all(zeros.data(), pad);
  }
  if (std::fclose(f.release()) != 0 || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = std::strerror(errno);
    std::remove(tmp.c_str());
    throw Error("cannot finish '" + path + "': " + err);
  }
}

}  // namespace moe::gguf
