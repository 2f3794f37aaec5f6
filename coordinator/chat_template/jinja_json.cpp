#include "coordinator/chat_template/jinja_json.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "coordinator/chat_template/jinja_error.h"
#include "coordinator/chat_template/jinja_limits.h"
#include "coordinator/chat_template/jinja_unicode.h"

namespace moe::jinja {

Value from_json(const nlohmann::ordered_json& j) {
  ValueDepthGuard guard;
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      // Python ints are unbounded; beyond int64 we fall back to a float.
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List l;
      l.reserve(j.size());
      for (const auto& e : j) l.push_back(from_json(e));
      return Value(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      d.entries.reserve(j.size());
      for (const auto& [k, e] : j.items()) d.set(k, from_json(e));
      return Value(std::move(d));
    }
    default:
      fail("unsupported JSON value in chat messages (binary or discarded)");
  }
}

namespace {

void append_u16(std::string& out, unsigned code) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "\\u%04x", code & 0xFFFFu);
  out += buf;
}

void dump_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (char32_t c : utf8_decode(s)) {
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
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          append_u16(out, static_cast<unsigned>(c));
        } else if (ensure_ascii && c >= 0x7F) {
          if (c >= 0x10000) {  // UTF-16 surrogate pair, as Python writes it
            const char32_t v = c - 0x10000;
            append_u16(out, 0xD800 + static_cast<unsigned>(v >> 10));
            append_u16(out, 0xDC00 + static_cast<unsigned>(v & 0x3FF));
          } else {
            append_u16(out, static_cast<unsigned>(c));
          }
        } else {
          utf8_append(out, c);
        }
    }
  }
  out += '"';
}

void dump(std::string& out, const Value& v, const DumpOptions& opt, size_t level) {
  ValueDepthGuard guard;
  charge_step();
  check_size(out.size());
  auto newline = [&](size_t lvl) {
    if (!opt.indent) return;
    out += '\n';
    for (size_t i = 0; i < lvl; ++i) out += *opt.indent;
  };
  switch (v.kind()) {
    case Value::Kind::None:
      out += "null";
      return;
    case Value::Kind::Bool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Value::Kind::Int:
      out += std::to_string(v.as_int());
      return;
    case Value::Kind::Float: {
      const double d = v.as_double();
      if (std::isnan(d)) {
        out += "NaN";
      } else if (std::isinf(d)) {
        out += d < 0 ? "-Infinity" : "Infinity";
      } else {
        out += format_float(d);
      }
      return;
    }
    case Value::Kind::String:
      dump_string(out, v.as_string(), opt.ensure_ascii);
      return;
    case Value::Kind::List: {
      const List& l = v.as_list();
      if (l.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < l.size(); ++i) {
        if (i) out += opt.item_separator;
        newline(level + 1);
        dump(out, l[i], opt, level + 1);
      }
      newline(level);
      out += ']';
      return;
    }
    case Value::Kind::Dict: {
      const Dict& d = v.as_dict();
      if (d.entries.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      items.reserve(d.entries.size());
      for (const auto& e : d.entries) items.push_back(&e);
      if (opt.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      }
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += opt.item_separator;
        newline(level + 1);
        dump_string(out, items[i]->first, opt.ensure_ascii);
        out += opt.key_separator;
        dump(out, items[i]->second, opt, level + 1);
      }
      newline(level);
      out += '}';
      return;
    }
    default:
      fail("Object of type " + v.type_name() + " is not JSON serializable");
  }
}

}  // namespace

std::string dumps(const Value& v, const DumpOptions& opt) {
  std::string out;
  dump(out, v, opt, 0);
  charge_string(out.size());
  return out;
}

}  // namespace moe::jinja
