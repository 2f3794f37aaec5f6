// GGUF parsing, part 2: tensor infos (names, shapes, types, exact byte sizes) and the data
// section. Shapes are overflow-checked one dimension at a time, and the tensor layout must match
// exactly what llama.cpp/gguf-py write (formats.md §1.5, engineering.md B.4).
#include <algorithm>
#include <limits>
#include <unordered_set>

#include "common/checked_math.h"
#include "common/gguf.h"
#include "common/gguf_internal.h"

namespace moe::gguf {

using detail::excerpt;

namespace {

std::string shape_string(const TensorInfo& t) {
  std::string s;
  for (uint32_t d = 0; d < t.n_dims; ++d) {
    if (d) s += 'x';
    s += std::to_string(t.ne[d]);
  }
  return s;
}

}  // namespace

// ----- tensor infos -----

void GgufParser::read_tensor_infos(GgufFile& f) {
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

std::string GgufParser::describe(const TensorInfo& t) const {
  return "tensor '" + excerpt(t.name) + "' (type " + ggml_type_label(t.type_id) + ", shape " +
         shape_string(t) + ")";
}

std::string GgufParser::layout_hint(const TensorInfo& t) const {
  const auto info = ggml_type_info(t.type_id);
  return "not the layout this runtime knows for " + std::string(info ? info->name : "it");
}

void GgufParser::place_tensors(GgufFile& f) {
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

}  // namespace moe::gguf
