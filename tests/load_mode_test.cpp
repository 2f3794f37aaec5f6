// How the tools open a model by default (coordinator/gpu/gpu_options.h choose_load_mode): read in
// when the GPU streams CPU-homed experts and the model fits, mapped otherwise or when a flag says
// so; and the facts it decides from (MemAvailable, the bytes of every shard).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/gguf.h"
#include "common/memory_info.h"
#include "coordinator/gpu/gpu_options.h"

namespace {

namespace fs = std::filesystem;
using moe::gguf::LoadMode;
using moe::gpu::choose_load_mode;
using moe::gpu::GpuOptions;

constexpr uint64_t kGiB = uint64_t{1} << 30;

GpuOptions hybrid() {
  GpuOptions o;
  o.n_gpu_layers = 99;
  o.cpu_moe = true;
  return o;
}

TEST(LoadMode, ReadsInAHybridModelThatFits) {
  std::string why;
  EXPECT_EQ(choose_load_mode(hybrid(), 20 * kGiB, 64 * kGiB, &why), LoadMode::Loaded);
  EXPECT_NE(why.find("read into memory (20.0 of 64.0 GiB available)"), std::string::npos) << why;
  GpuOptions ncmoe;
  ncmoe.n_gpu_layers = 99;
  ncmoe.n_cpu_moe = 4;
  EXPECT_EQ(choose_load_mode(ncmoe, 20 * kGiB, 64 * kGiB, nullptr), LoadMode::Loaded);
}

TEST(LoadMode, MapsWhatDoesNotFitOrIsUnknown) {
  std::string why;
  // 80% of the available memory at most: 20 of 24 GiB is too much.
  EXPECT_EQ(choose_load_mode(hybrid(), 20 * kGiB, 24 * kGiB, &why), LoadMode::Mapped);
  EXPECT_NE(why.find("20.0 GiB is more than 80% of the 24.0 GiB available"), std::string::npos) << why;
  EXPECT_EQ(choose_load_mode(hybrid(), 19 * kGiB, 24 * kGiB, nullptr), LoadMode::Loaded);
  EXPECT_EQ(choose_load_mode(hybrid(), 20 * kGiB, 0, &why), LoadMode::Mapped);
  EXPECT_NE(why.find("unknown"), std::string::npos) << why;
  EXPECT_EQ(choose_load_mode(hybrid(), 0, 64 * kGiB, &why), LoadMode::Mapped);
}

TEST(LoadMode, MapsWithoutCpuHomedExpertsOnAGpu) {
  std::string why = "stale";
  GpuOptions cpu_only;  // -ngl 0: the CPU reads the mapping as llama.cpp does
  cpu_only.cpu_moe = true;
  EXPECT_EQ(choose_load_mode(cpu_only, kGiB, 64 * kGiB, &why), LoadMode::Mapped);
  EXPECT_TRUE(why.empty()) << why;
  GpuOptions all_vram;
  all_vram.n_gpu_layers = 99;
  EXPECT_EQ(choose_load_mode(all_vram, kGiB, 64 * kGiB, &why), LoadMode::Mapped);
}

TEST(LoadMode, FlagsDecide) {
  std::string why = "stale";
  GpuOptions o = hybrid();
  o.mmap = 1;  // --mmap, -mmp 1
  EXPECT_EQ(choose_load_mode(o, kGiB, 64 * kGiB, &why), LoadMode::Mapped);
  EXPECT_TRUE(why.empty()) << why;
  o.mmap = 0;  // --no-mmap, -mmp 0: read in even when it looks too big
  EXPECT_EQ(choose_load_mode(o, 100 * kGiB, 64 * kGiB, &why), LoadMode::Loaded);
  GpuOptions cpu;
  cpu.mmap = 0;
  EXPECT_EQ(choose_load_mode(cpu, kGiB, 64 * kGiB, &why), LoadMode::Loaded);
}

TEST(MemoryInfo, ParsesMemAvailable) {
  EXPECT_EQ(moe::parse_mem_available("MemTotal:       32768 kB\nMemFree:  1 kB\n"
                                     "MemAvailable:   16384 kB\nBuffers: 2 kB\n"),
            uint64_t{16384} * 1024);
  EXPECT_EQ(moe::parse_mem_available("MemAvailable: 7 kB"), uint64_t{7} * 1024);
  EXPECT_EQ(moe::parse_mem_available("MemTotal: 5 kB\n"), 0u);
  EXPECT_EQ(moe::parse_mem_available("MemAvailable: kB\n"), 0u);
  EXPECT_EQ(moe::parse_mem_available("MemAvailable: 12 MB\n"), 0u);
  EXPECT_EQ(moe::parse_mem_available("MemAvailable: 99999999999999999999999 kB\n"), 0u);
  EXPECT_EQ(moe::parse_mem_available(""), 0u);
  // This machine says something.
  EXPECT_GT(moe::available_memory_bytes(), 0u);
}

TEST(GgufFileBytes, SumsEveryShard) {
  const fs::path dir = fs::temp_directory_path() / ("load_mode_test_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const auto write = [&](const std::string& name, size_t bytes) {
    std::ofstream(dir / name, std::ios::binary) << std::string(bytes, 'x');
  };
  write("one.gguf", 1000);
  write("m-00001-of-00002.gguf", 300);
  write("m-00002-of-00002.gguf", 200);
  EXPECT_EQ(moe::gguf::GgufFile::file_bytes((dir / "one.gguf").string()), 1000u);
  EXPECT_EQ(moe::gguf::GgufFile::file_bytes((dir / "m-00001-of-00002.gguf").string()), 500u);
  EXPECT_EQ(moe::gguf::GgufFile::file_bytes((dir / "missing.gguf").string()), 0u);
  fs::remove(dir / "m-00002-of-00002.gguf");
  EXPECT_EQ(moe::gguf::GgufFile::file_bytes((dir / "m-00001-of-00002.gguf").string()), 0u);
  fs::remove_all(dir);
}

}  // namespace
