// llama.cpp spells some options as multi-letter short flags (-ctk, -ctv) that CLI11 cannot
// declare; the tools rewrite them to their long names before parsing.
#pragma once

#include <string>
#include <vector>

namespace moe::tools {

inline const std::vector<std::string> kKvCacheTypes = {"f32", "f16", "q8_0", "q4_0"};

// argv with llama.cpp's multi-letter short flags (-ctk, -ctv, -ngl, -cmoe, -ncmoe, -mmp) replaced
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
  }
  std::vector<char*> out;
  for (auto& s : storage) out.push_back(s.data());
  return out;
}

}  // namespace moe::tools
