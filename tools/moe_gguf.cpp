// moe-gguf: inspect GGUF files.
//   moe-gguf info FILE [--json]          metadata and tensor table
//   moe-gguf dequant FILE TENSOR [--first N]   dequantized values, one per line
// Errors go to stderr prefixed "moe-gguf: error: " with exit code 1; usage errors exit 2.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/ggml_type.h"
#include "common/gguf.h"
#include "kernels/cpu/dequant.h"

namespace {

using moe::gguf::ArrayValue;
using moe::gguf::GgufFile;
using moe::gguf::TensorInfo;
using moe::gguf::Value;
using moe::gguf::ValueType;
using Json = nlohmann::ordered_json;

constexpr uint64_t kShownElements = 8;     // array elements shown
constexpr size_t kShownStringBytes = 160;  // longer strings are cut in text output

// Control characters, quotes and backslashes escaped (token strings contain them); UTF-8 passes
// through. Strings longer than `max` are cut, with their length appended.
std::string escape(std::string_view s, size_t max) {
  std::string out;
  for (char c : s.substr(0, max)) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned char>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  if (s.size() > max) out += "...(" + std::to_string(s.size()) + " bytes)";
  return out;
}

std::string quote(std::string_view s) { return '"' + escape(s, kShownStringBytes) + '"'; }

std::string format_float(double v, bool single) {
  char buf[40];
  std::snprintf(buf, sizeof buf, single ? "%.9g" : "%.17g", v);
  return buf;
}

std::string format_element(const ArrayValue& a, uint64_t i) {
  switch (a.elem_type) {
    case ValueType::STRING:
      return quote(a.string_at(i));
    case ValueType::F32:
    case ValueType::F64:
      return format_float(a.float_at(i), a.elem_type == ValueType::F32);
    case ValueType::BOOL:
      return a.int_at(i) ? "true" : "false";
    case ValueType::U64: {  // int_at would reject values above INT64_MAX
      uint64_t v;
      std::memcpy(&v, a.data + i * 8, 8);
      return std::to_string(v);
    }
    default:
      return std::to_string(a.int_at(i));
  }
}

std::string format_value(const Value& v) {
  switch (v.type) {
    case ValueType::STRING:
      return quote(std::get<std::string_view>(v.v));
    case ValueType::BOOL:
      return std::get<bool>(v.v) ? "true" : "false";
    case ValueType::F32:
    case ValueType::F64:
      return format_float(std::get<double>(v.v), v.type == ValueType::F32);
    case ValueType::U8:
    case ValueType::U16:
    case ValueType::U32:
    case ValueType::U64:
      return std::to_string(std::get<uint64_t>(v.v));
    case ValueType::I8:
    case ValueType::I16:
    case ValueType::I32:
    case ValueType::I64:
      return std::to_string(std::get<int64_t>(v.v));
    case ValueType::ARRAY: {
      const auto& a = std::get<ArrayValue>(v.v);
      std::string s = "[";
      const uint64_t shown = std::min(a.count, kShownElements);
      for (uint64_t i = 0; i < shown; ++i) {
        if (i) s += ", ";
        s += format_element(a, i);
      }
      if (shown < a.count) s += ", ...";
      return s + "]";
    }
  }
  return "?";
}

std::string type_string(const Value& v) {
  if (const auto* a = std::get_if<ArrayValue>(&v.v)) {
    return "[" + std::to_string(a->count) + " x " + std::string(value_type_name(a->elem_type)) +
           "]";
  }
  return std::string(value_type_name(v.type));
}

std::string shape_string(const TensorInfo& t) {
  std::string s;
  for (uint32_t d = 0; d < t.n_dims; ++d) {
    if (d) s += " x ";
    s += std::to_string(t.ne[d]);
  }
  return s;
}

std::string type_name(uint32_t id) {
  const auto info = moe::ggml_type_info(id);
  return info ? std::string(info->name) : "unknown(" + std::to_string(id) + ")";
}

// JSON strings must be valid UTF-8; token strings of byte-level vocabularies are, but do not rely
// on it: invalid bytes become U+FFFD at dump time (error_handler_t::replace).
Json element_json(const ArrayValue& a, uint64_t i) {
  switch (a.elem_type) {
    case ValueType::STRING:
      return std::string(a.string_at(i));
    case ValueType::F32:
    case ValueType::F64:
      return a.float_at(i);
    case ValueType::BOOL:
      return a.int_at(i) != 0;
    case ValueType::U64: {
      uint64_t v;
      std::memcpy(&v, a.data + i * 8, 8);
      return v;
    }
    default:
      return a.int_at(i);
  }
}

Json value_json(const Value& v) {
  switch (v.type) {
    case ValueType::STRING:
      return std::string(std::get<std::string_view>(v.v));
    case ValueType::BOOL:
      return std::get<bool>(v.v);
    case ValueType::F32:
    case ValueType::F64:
      return std::get<double>(v.v);
    case ValueType::U8:
    case ValueType::U16:
    case ValueType::U32:
    case ValueType::U64:
      return std::get<uint64_t>(v.v);
    default:
      return std::get<int64_t>(v.v);
  }
}

uint64_t total_bytes(const GgufFile& f) {
  uint64_t total = 0;
  for (const auto& t : f.tensors()) total += t.n_bytes;  // each fits the file: no overflow
  return total;
}

void info_text(const GgufFile& f) {
  std::printf("file: %s\n", f.path().c_str());
  std::printf("version: %u\nalignment: %u\nshards: %zu\n", f.version(), f.alignment(),
              f.n_shards());
  std::printf("metadata: %zu keys\n", f.metadata().size());
  for (const auto& kv : f.metadata()) {
    std::printf("  %s %s = %s\n", escape(kv.key, 256).c_str(), type_string(kv.value).c_str(),
                format_value(kv.value).c_str());
  }
  std::printf("tensors: %zu\n", f.tensors().size());
  size_t name_w = 4, type_w = 4, shape_w = 5;
  for (const auto& t : f.tensors()) {
    name_w = std::max(name_w, t.name.size());
    type_w = std::max(type_w, type_name(t.type_id).size());
    shape_w = std::max(shape_w, shape_string(t).size());
  }
  std::printf("  %-*s  %-*s  %-*s  %12s  %12s%s\n", static_cast<int>(name_w), "name",
              static_cast<int>(type_w), "type", static_cast<int>(shape_w), "shape", "offset",
              "bytes", f.n_shards() > 1 ? "  shard" : "");
  for (const auto& t : f.tensors()) {
    std::printf("  %-*.*s  %-*s  %-*s  %12" PRIu64 "  %12" PRIu64, static_cast<int>(name_w),
                static_cast<int>(t.name.size()), t.name.data(), static_cast<int>(type_w),
                type_name(t.type_id).c_str(), static_cast<int>(shape_w), shape_string(t).c_str(),
                t.offset, t.n_bytes);
    if (f.n_shards() > 1) std::printf("  %5u", t.shard + 1);
    std::printf("\n");
  }
  std::printf("total: %zu tensors, %" PRIu64 " bytes\n", f.tensors().size(), total_bytes(f));
}

void info_json(const GgufFile& f) {
  Json j;
  j["file"] = f.path();
  j["version"] = f.version();
  j["alignment"] = f.alignment();
  j["shards"] = f.n_shards();
  Json meta = Json::object();
  for (const auto& kv : f.metadata()) {
    Json e;
    if (const auto* a = std::get_if<ArrayValue>(&kv.value.v)) {
      e["type"] = "array";
      e["element_type"] = value_type_name(a->elem_type);
      e["count"] = a->count;
      Json values = Json::array();
      for (uint64_t i = 0; i < std::min(a->count, kShownElements); ++i) {
        values.push_back(element_json(*a, i));
      }
      e["values"] = std::move(values);
    } else {
      e["type"] = value_type_name(kv.value.type);
      e["value"] = value_json(kv.value);
    }
    meta[std::string(kv.key)] = std::move(e);
  }
  j["metadata"] = std::move(meta);
  Json tensors = Json::array();
  for (const auto& t : f.tensors()) {
    Json e;
    e["name"] = t.name;
    e["type"] = type_name(t.type_id);
    e["type_id"] = t.type_id;
    e["shape"] = std::vector<int64_t>(t.ne, t.ne + t.n_dims);
    e["offset"] = t.offset;
    e["bytes"] = t.n_bytes;
    e["shard"] = t.shard;
    tensors.push_back(std::move(e));
  }
  j["tensors"] = std::move(tensors);
  j["n_tensors"] = f.tensors().size();
  j["total_bytes"] = total_bytes(f);
  std::printf("%s\n", j.dump(2, ' ', false, Json::error_handler_t::replace).c_str());
}

void dequant(const GgufFile& f, const std::string& name, uint64_t first) {
  const TensorInfo* t = f.find_tensor(name);
  if (!t) throw moe::Error("no tensor named '" + name + "' in '" + f.path() + "'");
  const auto info = moe::ggml_type_info(t->type_id);
  if (!info || !info->computable) {
    throw moe::Error("tensor '" + name + "' has type " + moe::ggml_type_label(t->type_id) +
                     ", which this runtime cannot dequantize");
  }
  // The reader validated the shape, so these cannot fail or overflow.
  const uint64_t row_elems = static_cast<uint64_t>(t->ne[0]);
  const uint64_t row_bytes = *moe::ggml_row_bytes(t->type(), row_elems);
  const uint64_t n = std::min(first, static_cast<uint64_t>(t->n_elements()));
  std::vector<float> row(row_elems);
  uint64_t printed = 0;
  for (uint64_t r = 0; printed < n; ++r) {
    moe::cpu::dequantize_row(t->type(), t->data + r * row_bytes, row.data(),
                             static_cast<int64_t>(row_elems));
    for (uint64_t i = 0; i < row_elems && printed < n; ++i, ++printed) {
      std::printf("%.9g\n", static_cast<double>(row[i]));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Inspect GGUF model files", "moe-gguf"};
  app.require_subcommand(1);

  std::string file, tensor;
  bool json = false;
  uint64_t first = std::numeric_limits<uint64_t>::max();

  auto* info = app.add_subcommand("info", "Print metadata and the tensor table");
  info->add_option("FILE", file, "GGUF file (first shard of a split model)")->required();
  info->add_flag("--json", json, "Print one JSON object");

  auto* deq = app.add_subcommand("dequant", "Print a tensor's dequantized values, one per line");
  deq->add_option("FILE", file, "GGUF file")->required();
  deq->add_option("TENSOR", tensor, "Tensor name")->required();
  deq->add_option("--first", first, "Print only the first N values (file order)")
      // CLI11 would otherwise wrap "-3" into a huge unsigned count.
      ->check(CLI::Validator(
          [](std::string& s) {
            return s.find('-') == std::string::npos ? std::string()
                                                    : "must be a non-negative integer";
          },
          "N>=0"));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints help or the usage error
    return rc == 0 ? 0 : 2;
  }

  try {
    const GgufFile f = GgufFile::open(file);
    if (info->parsed()) {
      json ? info_json(f) : info_text(f);
    } else {
      dequant(f, tensor, first);
    }
    if (std::fflush(stdout) != 0) throw moe::Error("cannot write to stdout");
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "moe-gguf: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
