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

class MappedFile {
 public:
  // Maps `path` read-only (MAP_PRIVATE). Throws moe::Error naming the path and the OS error. An
  // empty file maps to size() == 0 with a non-null data() that must not be dereferenced.
  static std::unique_ptr<MappedFile> open(const std::string& path);

  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size, bool mapped)
      : path_(std::move(path)), data_(data), size_(size), mapped_(mapped) {}

  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;  // false for an empty file (nothing to unmap)
};

}  // namespace moe::gguf
