#include "common/shm/shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <boost/interprocess/exceptions.hpp>
#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/permissions.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <utility>

#include "common/error.h"

namespace moe::shm {
namespace bip = boost::interprocess;

namespace {

constexpr size_t kMaxNameBytes = 255;  // NAME_MAX of the /dev/shm file, without the '/'
constexpr size_t kMaxRoleBytes = 200;  // leaves room for "/moe-<pid>-"

std::string errno_text(int err) { return std::string(std::strerror(err)); }

// Boost reports the errno it saw as the native error; fall back to its own message.
std::string boost_text(const bip::interprocess_exception& e) {
  return e.get_native_error() != 0 ? errno_text(e.get_native_error()) : std::string(e.what());
}

void check_name(std::string_view name) {
  if (name.size() < 2 || name.front() != '/' || name.find('/', 1) != std::string_view::npos ||
      name.size() - 1 > kMaxNameBytes || name.find('\0') != std::string_view::npos) {
    throw Error("invalid shared-memory name '" + std::string(name) +
                "': expected '/name' with no other '/', at most 255 bytes");
  }
}

}  // namespace

struct ShmSegment::Impl {
  std::string name;
  bip::mapped_region region;
  bool owner = false;

  ~Impl() {
    // Unmapping is the region's job; only the creator unlinks. Errors cannot be reported here.
    if (owner) bip::shared_memory_object::remove(name.c_str());
  }
};

ShmSegment::ShmSegment(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ShmSegment::ShmSegment(ShmSegment&&) noexcept = default;
ShmSegment& ShmSegment::operator=(ShmSegment&&) noexcept = default;
ShmSegment::~ShmSegment() = default;

void* ShmSegment::data() const { return impl_ ? impl_->region.get_address() : nullptr; }
size_t ShmSegment::size() const { return impl_ ? impl_->region.get_size() : 0; }
bool ShmSegment::owner() const { return impl_ && impl_->owner; }
const std::string& ShmSegment::name() const {
  static const std::string empty;
  return impl_ ? impl_->name : empty;
}

ShmSegment ShmSegment::create(std::string_view name, size_t bytes) {
  check_name(name);
  if (bytes == 0) throw Error("shared-memory segment '" + std::string(name) + "': size 0");
  auto impl = std::make_unique<Impl>();
  impl->name = std::string(name);
  bip::shared_memory_object shm;
  try {
    shm = bip::shared_memory_object(bip::create_only, impl->name.c_str(), bip::read_write,
                                    bip::permissions(0600));
  } catch (const bip::interprocess_exception& e) {
    throw Error("cannot create shared-memory segment '" + impl->name + "': " + boost_text(e));
  }
  impl->owner = true;  // from here on, a throw unlinks the name again (Impl's destructor)
  try {
    shm.truncate(static_cast<bip::offset_t>(bytes));
  } catch (const bip::interprocess_exception& e) {
    throw Error("cannot size shared-memory segment '" + impl->name + "' to " +
                std::to_string(bytes) + " bytes: " + boost_text(e));
  }
  // tmpfs allocates pages on first touch and answers a full /dev/shm with SIGBUS; reserving them
  // now turns that into an error message.
  const int rc = ::posix_fallocate(shm.get_mapping_handle().handle, 0, static_cast<off_t>(bytes));
  if (rc != 0) {
    throw Error("cannot reserve " + std::to_string(bytes) + " bytes for shared-memory segment '" +
                impl->name + "': " + errno_text(rc));
  }
  try {
    impl->region = bip::mapped_region(shm, bip::read_write);
  } catch (const bip::interprocess_exception& e) {
    throw Error("cannot map shared-memory segment '" + impl->name + "': " + boost_text(e));
  }
  return ShmSegment(std::move(impl));
}

ShmSegment ShmSegment::open(std::string_view name) {
  check_name(name);
  auto impl = std::make_unique<Impl>();
  impl->name = std::string(name);
  try {
    bip::shared_memory_object shm(bip::open_only, impl->name.c_str(), bip::read_write);
    bip::offset_t size = 0;
    if (!shm.get_size(size) || size <= 0) {
      throw Error("shared-memory segment '" + impl->name + "' is empty (creator not done?)");
    }
    impl->region = bip::mapped_region(shm, bip::read_write);
  } catch (const bip::interprocess_exception& e) {
    throw Error("cannot open shared-memory segment '" + impl->name + "': " + boost_text(e));
  }
  return ShmSegment(std::move(impl));
}

std::string run_segment_name(std::string_view role) {
  bool ok = !role.empty() && role.size() <= kMaxRoleBytes;
  for (char c : role) {
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '_' || c == '.' || c == '-');
  }
  if (!ok) {
    throw Error("invalid shared-memory role '" + std::string(role) +
                "': expected 1-200 characters from [A-Za-z0-9_.-]");
  }
  return "/moe-" + std::to_string(::getpid()) + "-" + std::string(role);
}

bool remove_segment(std::string_view name) {
  return bip::shared_memory_object::remove(std::string(name).c_str());
}

size_t remove_stale_segments(std::string_view prefix) {
  DIR* dir = ::opendir("/dev/shm");
  if (!dir) throw Error("cannot list /dev/shm: " + errno_text(errno));
  std::unique_ptr<DIR, int (*)(DIR*)> closer(dir, &::closedir);
  size_t removed = 0;
  for (errno = 0; dirent* e = ::readdir(dir); errno = 0) {
    const std::string_view entry(e->d_name);
    if (!entry.starts_with(prefix)) continue;
    // "<prefix><pid>-<role>": anything else is not ours to judge.
    const std::string_view rest = entry.substr(prefix.size());
    pid_t pid = 0;
    const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), pid);
    if (ec != std::errc() || pid <= 0 || end == rest.data() + rest.size() || *end != '-') continue;
    // EPERM means the process exists (another user's); only ESRCH proves it is gone.
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;
    std::string path(1, '/');
    path += entry;
    if (::shm_unlink(path.c_str()) == 0) {
      ++removed;
    } else if (errno != ENOENT) {  // ENOENT: another cleaner was faster
      throw Error("cannot remove stale shared-memory segment '" + path + "' of dead pid " +
                  std::to_string(pid) + ": " + errno_text(errno));
    }
  }
  if (errno != 0) throw Error("cannot list /dev/shm: " + errno_text(errno));
  return removed;
}

}  // namespace moe::shm
