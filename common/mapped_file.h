// Read-only memory mapping of a whole file (RAII). Model files are mapped rather than read so that
// tensor data is paged in on demand and shared with the page cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>

namespace moe::gguf {

// How a model file's bytes reach memory. Mapped (the default) pages them in on demand and shares
// them with the page cache. Loaded (llama.cpp's --no-mmap) reads the whole file into anonymous
// memory advised to use transparent huge pages: decode streams ~1 GB of scattered expert rows per
// token, and with 4 KiB file pages the CPU's prefetchers stop at every page boundary and every
// page costs a TLB entry.
enum class LoadMode { Mapped, Loaded };

class MappedFile {
 public:
  // Maps `path` read-only (MAP_PRIVATE), or reads it into read-only anonymous memory (Loaded).
  // Throws moe::Error naming the path and the OS error. An empty file maps to size() == 0 with a
  // non-null data() that must not be dereferenced.
  static std::unique_ptr<MappedFile> open(const std::string& path,
                                          LoadMode mode = LoadMode::Mapped);

  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }
  LoadMode mode() const { return mode_; }

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size, void* region, size_t region_size,
             LoadMode mode)
      : path_(std::move(path)),
        data_(data),
        size_(size),
        region_(region),
        region_size_(region_size),
        mode_(mode) {}

  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  void* region_ = nullptr;  // what to munmap (null for an empty file)
  size_t region_size_ = 0;
  LoadMode mode_ = LoadMode::Mapped;
};

}  // namespace moe::gguf
