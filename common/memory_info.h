// What the operating system says about memory, for choices that depend on it (whether a model is
// read into memory or mapped).
#pragma once

#include <cstdint>
#include <string_view>

namespace moe {

// MemAvailable of a /proc/meminfo text, in bytes; 0 when the line is missing or malformed.
uint64_t parse_mem_available(std::string_view meminfo);
// MemAvailable of this machine (/proc/meminfo), in bytes; 0 when unknown.
uint64_t available_memory_bytes();

}  // namespace moe
