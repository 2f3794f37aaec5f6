// JSON from untrusted sources (HTTP bodies, gRPC fields that carry JSON text) parsed under one set
// of limits. nlohmann's parser itself is iterative, but dump(), copies and conversions recurse, so
// a value nested ~70,000 deep overflows the stack the first time anything walks it: the depth is
// refused while parsing, before any such walk.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/error.h"

namespace moe {

struct JsonLimits {
  // Arrays and objects inside each other. Tool schemas and arguments nest a few levels; 64 leaves
  // room for any real one and keeps every recursive walk shallow.
  int max_depth = 64;
  // Values of every kind (scalars, keys' values, arrays, objects) in the whole document.
  size_t max_values = size_t{1} << 20;
};

// The limits every request path uses (HTTP and gRPC alike).
inline constexpr JsonLimits kRequestJsonLimits{};

// What the limits refused; a bad request, never a server error.
class JsonLimitError : public Error {
 public:
  using Error::Error;
};

// Parses `text` (nlohmann::json::parse_error on malformed JSON, JsonLimitError over a limit).
nlohmann::ordered_json parse_bounded_json(std::string_view text,
                                          const JsonLimits& limits = kRequestJsonLimits);

// dump() for values that may hold text from a request: invalid UTF-8 is replaced (U+FFFD) instead
// of throwing, so an error message quoting bad input can always be sent.
std::string dump_lenient(const nlohmann::ordered_json& j, int indent = -1);

}  // namespace moe
