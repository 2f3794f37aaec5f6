#include "common/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
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

// Anonymous memory on a huge-page boundary, advised to use huge pages, filled from the file,
// then made read-only like a mapping.
struct Loaded {
  uint8_t* data;
  void* region;
  size_t region_size;
};

Loaded load_file(const std::string& path, int fd, size_t size) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t region_size = (size + kHuge - 1) / kHuge * kHuge + kHuge;
  void* region =
      ::mmap(nullptr, region_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (region == MAP_FAILED) fail(path, "allocate memory to load", errno);
  const auto base = reinterpret_cast<uintptr_t>(region);
  auto* data = reinterpret_cast<uint8_t*>((base + kHuge - 1) / kHuge * kHuge);
  (void)::madvise(data, size, MADV_HUGEPAGE);  // a hint: without THP it still works
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, data + done, std::min<size_t>(size - done, size_t{1} << 30),
                              static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::munmap(region, region_size);
      fail(path, "read", err);
    }
    done += static_cast<size_t>(n);
  }
  (void)::mprotect(data, size, PROT_READ);
  return {data, region, region_size};
}

}  // namespace

std::unique_ptr<MappedFile> MappedFile::open(const std::string& path, LoadMode mode) {
  FdGuard guard{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (guard.fd < 0) fail(path, "open", errno);

  struct stat st {};
  if (::fstat(guard.fd, &st) != 0) fail(path, "stat", errno);
  // Directories, pipes and devices have no meaningful size to map.
  if (!S_ISREG(st.st_mode)) throw Error("cannot map '" + path + "': not a regular file");

  const auto size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    return std::unique_ptr<MappedFile>(new MappedFile(path, kEmpty, 0, nullptr, 0, mode));
  }
  if (mode == LoadMode::Loaded) {
    const Loaded l = load_file(path, guard.fd, size);
    return std::unique_ptr<MappedFile>(
        new MappedFile(path, l.data, size, l.region, l.region_size, LoadMode::Loaded));
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, guard.fd, 0);
  if (p == MAP_FAILED) fail(path, "mmap", errno);
  return std::unique_ptr<MappedFile>(
      new MappedFile(path, static_cast<const uint8_t*>(p), size, p, size, LoadMode::Mapped));
}

MappedFile::~MappedFile() {
  if (region_) ::munmap(region_, region_size_);
}

}  // namespace moe::gguf
