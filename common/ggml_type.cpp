#include "common/ggml_type.h"

#include <array>

#include "common/checked_math.h"
#include "common/error.h"

namespace moe {
namespace {

struct Entry {
  uint32_t id;
  GgmlTypeInfo info;
};

// Block geometry from ggml-common.h; `computable` marks what our kernels implement.
constexpr std::array kTypes = {
    Entry{0, {"f32", 1, 4, true}},          Entry{1, {"f16", 1, 2, true}},
    Entry{2, {"q4_0", 32, 18, true}},       Entry{3, {"q4_1", 32, 20, true}},
    Entry{6, {"q5_0", 32, 22, true}},       Entry{7, {"q5_1", 32, 24, true}},
    Entry{8, {"q8_0", 32, 34, true}},       Entry{9, {"q8_1", 32, 36, false}},
    Entry{10, {"q2_K", 256, 84, true}},     Entry{11, {"q3_K", 256, 110, true}},
    Entry{12, {"q4_K", 256, 144, true}},    Entry{13, {"q5_K", 256, 176, true}},
    Entry{14, {"q6_K", 256, 210, true}},    Entry{15, {"q8_K", 256, 292, false}},
    Entry{16, {"iq2_xxs", 256, 66, false}}, Entry{17, {"iq2_xs", 256, 74, false}},
    Entry{18, {"iq3_xxs", 256, 98, false}}, Entry{19, {"iq1_s", 256, 50, false}},
    Entry{20, {"iq4_nl", 32, 18, true}},    Entry{21, {"iq3_s", 256, 110, false}},
    Entry{22, {"iq2_s", 256, 82, false}},   Entry{23, {"iq4_xs", 256, 136, true}},
    Entry{24, {"i8", 1, 1, false}},         Entry{25, {"i16", 1, 2, false}},
    Entry{26, {"i32", 1, 4, false}},        Entry{27, {"i64", 1, 8, false}},
    Entry{28, {"f64", 1, 8, false}},        Entry{29, {"iq1_m", 256, 56, false}},
    Entry{30, {"bf16", 1, 2, true}},        Entry{34, {"tq1_0", 256, 54, false}},
    Entry{35, {"tq2_0", 256, 66, false}},   Entry{39, {"mxfp4", 32, 17, true}},
    Entry{40, {"nvfp4", 64, 36, false}},    Entry{41, {"q1_0", 128, 18, false}},
    Entry{42, {"q2_0", 64, 18, true}},
};

}  // namespace

std::optional<GgmlTypeInfo> ggml_type_info(uint32_t id) {
  for (const auto& e : kTypes) {
    if (e.id == id) return e.info;
  }
  return std::nullopt;
}

std::string ggml_type_label(uint32_t id) {
  const auto info = ggml_type_info(id);
  return std::string(info ? info->name : "unknown") + " (id " + std::to_string(id) + ")";
}

const GgmlTypeInfo& ggml_type_info_or_throw(GgmlType type) {
  for (const auto& e : kTypes) {
    if (e.id == static_cast<uint32_t>(type)) return e.info;
  }
  throw Error("unknown ggml type " + ggml_type_label(static_cast<uint32_t>(type)));
}

std::optional<uint64_t> ggml_row_bytes(GgmlType type, uint64_t n) {
  const auto info = ggml_type_info(static_cast<uint32_t>(type));
  if (!info || n % info->block_size != 0) return std::nullopt;
  return checked_mul(n / info->block_size, info->type_size);
}

}  // namespace moe
