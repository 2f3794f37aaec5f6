// Copies a GGUF file with edits (keys dropped or replaced, tensors dropped, reshaped or added), for
// tests of real files' variations and of load errors. Header-only.
#pragma once

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "common/ggml_type.h"
#include "common/gguf.h"
#include "common/gguf_writer.h"

namespace moe::test {

struct GgufEdit {
  // True: leave the key out (set a replacement in add_keys).
  std::function<bool(const std::string& key)> drop_key;
  std::function<void(gguf::GgufWriter&)> add_keys;
  // Per source tensor: set `skip`, or change the type/shape (then the data is zero-filled).
  std::function<void(const std::string& name, GgmlType& type, std::vector<int64_t>& ne, bool& skip)>
      mutate;
  // Extra tensors, each a copy of an existing one: {new name, source name}.
  std::vector<std::pair<std::string, std::string>> copies;
  // Extra zero-filled F32 tensors: {name, shape}.
  std::vector<std::pair<std::string, std::vector<int64_t>>> zeros;
  // Extra tensors whose bytes `fill` writes (n = the tensor's size in bytes).
  struct Generated {
    std::string name;
    GgmlType type;
    std::vector<int64_t> ne;
    std::function<void(uint8_t* dst, uint64_t n)> fill;
  };
  std::vector<Generated> generated;
};

inline void rewrite_gguf(const std::string& src_path, const std::string& dst_path,
                         const GgufEdit& e) {
  const gguf::GgufFile src = gguf::GgufFile::open(src_path);
  gguf::GgufWriter w(src.alignment());
  for (const auto& kv : src.metadata()) {
    const std::string key(kv.key);
    if (key == "general.alignment" || (e.drop_key && e.drop_key(key))) continue;
    w.copy_value(key, kv.value);
  }
  if (e.add_keys) e.add_keys(w);
  std::vector<const gguf::TensorInfo*> data;  // source bytes per written tensor; null: zeros
  for (const auto& t : src.tensors()) {
    GgmlType type = t.type();
    std::vector<int64_t> ne(t.ne, t.ne + t.n_dims);
    bool skip = false;
    if (e.mutate) e.mutate(std::string(t.name), type, ne, skip);
    if (skip) continue;
    const bool same = type == t.type() && ne == std::vector<int64_t>(t.ne, t.ne + t.n_dims);
    w.add_tensor(std::string(t.name), type, ne);
    data.push_back(same ? &t : nullptr);
  }
  for (const auto& [name, from] : e.copies) {
    const gguf::TensorInfo* t = src.find_tensor(from);
    if (!t) throw std::runtime_error("rewrite_gguf: no tensor " + from);
    w.add_tensor(name, t->type(), std::vector<int64_t>(t->ne, t->ne + t->n_dims));
    data.push_back(t);
  }
  for (const auto& [name, ne] : e.zeros) {
    w.add_tensor(name, GgmlType::F32, ne);
    data.push_back(nullptr);
  }
  const size_t first_generated = data.size();
  for (const auto& g : e.generated) w.add_tensor(g.name, g.type, g.ne);
  w.write(dst_path, [&](size_t i, uint8_t* dst, uint64_t n) {
    if (i >= first_generated) {
      e.generated[i - first_generated].fill(dst, n);
    } else if (data[i] && data[i]->n_bytes == n) {
      std::memcpy(dst, data[i]->data, n);
    } else {
      std::memset(dst, 0, n);
    }
  });
}

}  // namespace moe::test
