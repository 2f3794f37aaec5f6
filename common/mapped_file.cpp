#include "common/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"

namespace moe::gguf {
namespace {

[[noreturn]] void fail(const std::string& path, const char* what, int err) {
  throw Error("cannot " + std::string(what) + " '" + path + "': " + std::strerror(err));
}

// Closes the descriptor on every path out of open(); the mapping outlives it.
struct FdGuard {
  int fd;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};

const uint8_t kEmpty[1] = {0};

}  // namespace

std::unique_ptr<MappedFile> MappedFile::open(const std::string& path) {
  FdGuard guard{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (guard.fd < 0) fail(path, "open", errno);

  struct stat st {};
  if (::fstat(guard.fd, &st) != 0) fail(path, "stat", errno);
  // Directories, pipes and devices have no meaningful size to map.
  if (!S_ISREG(st.st_mode)) throw Error("cannot map '" + path + "': not a regular file");

  const auto size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    return std::unique_ptr<MappedFile>(new MappedFile(path, kEmpty, 0, false));
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, guard.fd, 0);
  if (p == MAP_FAILED) fail(path, "mmap", errno);
  return std::unique_ptr<MappedFile>(
      new MappedFile(path, static_cast<const uint8_t*>(p), size, true));
}

MappedFile::~MappedFile() {
  if (mapped_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace moe::gguf
