// llama.cpp spells some options as multi-letter short flags (-ctk, -ctv) that CLI11 cannot
// declare; the tools rewrite them to their long names before parsing.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moe::tools {

inline const std::vector<std::string> kKvCacheTypes = {"f32",  "f16",  "bf16", "q8_0",  "q5_0",
                                                       "q5_1", "q4_0", "q4_1", "iq4_nl"};

// argv with llama.cpp's multi-letter short flags (-ctk, -ctv, -ngl, -cmoe, -ncmoe, -mmp, -np, -ub,
// -fa, -ctk-first, -ctk-last, -ctv-first, -ctv-last) replaced
// by their long names. `storage` owns the strings the returned pointers refer to.
inline std::vector<char*> llama_style_argv(int argc, char** argv,
                                           std::vector<std::string>& storage) {
  static constexpr std::pair<std::string_view, std::string_view> kLongNames[] = {
      {"-ctk", "--cache-type-k"},
      {"-ctv", "--cache-type-v"},
      {"-ngl", "--n-gpu-layers"},
      {"-cmoe", "--cpu-moe"},
      {"-ncmoe", "--n-cpu-moe"},
      {"-mmp", "--mmap"},
      {"-np", "--parallel"},
      {"-npl", "--n-parallel-list"},
      {"-ub", "--ubatch-size"},
      {"-fa", "--flash-attn"},
      {"-ctk-first", "--cache-type-k-first"},
      {"-ctk-last", "--cache-type-k-last"},
      {"-ctv-first", "--cache-type-v-first"},
      {"-ctv-last", "--cache-type-v-last"}};
  storage.assign(argv, argv + argc);
  for (auto& s : storage) {
    for (const auto& [short_name, long_name] : kLongNames) {
      if (s == short_name) s = long_name;
    }
  }
  std::vector<char*> out;
  for (auto& s : storage) out.push_back(s.data());
  return out;
}

}  // namespace moe::tools
