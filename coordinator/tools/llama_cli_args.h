// llama.cpp spells some options as multi-letter short flags (-ctk, -ctv) that CLI11 cannot
// declare; the tools rewrite them to their long names before parsing.
#pragma once

#include <string>
#include <vector>

namespace moe::tools {

inline const std::vector<std::string> kKvCacheTypes = {"f32", "f16", "q8_0", "q4_0"};

// argv with llama.cpp's multi-letter short flags (-ctk, -ctv, -ngl, -cmoe, -ncmoe, -mmp, -np, -ub,
// -fa, -ctk-first, -ctk-last, -ctv-first, -ctv-last) replaced
// by their long names. `storage` owns the strings the returned pointers refer to.
inline std::vector<char*> llama_style_argv(int argc, char** argv,
                                           std::vector<std::string>& storage) {
  storage.assign(argv, argv + argc);
  for (auto& s : storage) {
    if (s == "-ctk") s = "--cache-type-k";
    if (s == "-ctv") s = "--cache-type-v";
    if (s == "-ngl") s = "--n-gpu-layers";
    if (s == "-cmoe") s = "--cpu-moe";
    if (s == "-ncmoe") s = "--n-cpu-moe";
    if (s == "-mmp") s = "--mmap";
    if (s == "-np") s = "--parallel";
    if (s == "-ub") s = "--ubatch-size";
    if (s == "-fa") s = "--flash-attn";
    if (s == "-ctk-first") s = "--cache-type-k-first";
    if (s == "-ctk-last") s = "--cache-type-k-last";
    if (s == "-ctv-first") s = "--cache-type-v-first";
    if (s == "-ctv-last") s = "--cache-type-v-last";
  }
  std::vector<char*> out;
  for (auto& s : storage) out.push_back(s.data());
  return out;
}

}  // namespace moe::tools
