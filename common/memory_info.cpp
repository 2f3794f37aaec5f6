#include "common/memory_info.h"

#include <fstream>
#include <limits>
#include <sstream>
#include <string>

namespace moe {

uint64_t parse_mem_available(std::string_view meminfo) {
  static constexpr std::string_view kKey = "MemAvailable:";
  size_t at = 0;
  while (at < meminfo.size()) {
    const size_t end = std::min(meminfo.find('\n', at), meminfo.size());
    std::string_view line = meminfo.substr(at, end - at);
    at = end + 1;
    if (!line.starts_with(kKey)) continue;
    line.remove_prefix(kKey.size());
    while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    uint64_t kib = 0;
    size_t digits = 0;
    for (; digits < line.size() && line[digits] >= '0' && line[digits] <= '9'; ++digits) {
      if (kib > std::numeric_limits<uint64_t>::max() / 10240) return 0;  // no such machine
      kib = kib * 10 + static_cast<uint64_t>(line[digits] - '0');
    }
    if (digits == 0 || line.substr(digits) != " kB") return 0;
    return kib * 1024;
  }
  return 0;
}

uint64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  if (!in) return 0;
  std::ostringstream text;
  text << in.rdbuf();
  return parse_mem_available(text.str());
}

}  // namespace moe
