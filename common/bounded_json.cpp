#include "common/bounded_json.h"

namespace moe {

nlohmann::ordered_json parse_bounded_json(std::string_view text, const JsonLimits& limits) {
  using Json = nlohmann::ordered_json;
  size_t values = 0;
  // The parser's callback sees every container as it opens, with the number of containers around
  // it, so the limit holds before a deeper level is ever built.
  auto check = [&](int depth, Json::parse_event_t event, Json&) {
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        if (depth >= limits.max_depth) {
          throw JsonLimitError("JSON nested deeper than " + std::to_string(limits.max_depth) +
                               " levels");
        }
        [[fallthrough]];
      case Json::parse_event_t::value:
        if (++values > limits.max_values) {
          throw JsonLimitError("JSON has more than " + std::to_string(limits.max_values) +
                               " values");
        }
        break;
      default:
        break;
    }
    return true;
  };
  return Json::parse(text, check);
}

std::string dump_lenient(const nlohmann::ordered_json& j, int indent) {
  return j.dump(indent, ' ', /*ensure_ascii=*/false, nlohmann::json::error_handler_t::replace);
}

}  // namespace moe
