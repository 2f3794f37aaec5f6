#include "experts/gpu/remote_gpu_executor.h"

#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/checked_math.h"
#include "common/error.h"
#include "kernels/cuda/cuda_check.h"

extern char** environ;

namespace moe::gpu {
namespace {

constexpr int kStartTimeoutMs = 60000;  // a cold CUDA context under MPS takes seconds
constexpr uint64_t kAlign = 256;        // what cudaMalloc guarantees
constexpr int kReserveRounds = 8;       // proposals each way before giving up

}  // namespace

RemoteGpuExecutor::RemoteGpuExecutor(const std::string& worker_path, int device,
                                     uint64_t address_bytes, std::string mps_note)
    : mps_note_(std::move(mps_note)) {
  start(worker_path, device);
  try {
    handshake(device, address_bytes);
  } catch (...) {
    stop_worker();
    throw;
  }
  watcher_ = std::thread([this] { watch(); });
}

RemoteGpuExecutor::~RemoteGpuExecutor() {
  stopping_ = true;
  if (ch_) ::shutdown(ch_->fd(), SHUT_RDWR);  // wakes the watcher
  if (watcher_.joinable()) watcher_.join();
  stop_worker();
  for (auto& c : chunks_) vram_->release(c->mem.ptr);
}

void RemoteGpuExecutor::start(const std::string& worker_path, int device) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    throw Error(std::string("socketpair for the GPU worker failed: ") + std::strerror(errno));
  }
  ch_ = std::make_unique<WorkerChannel>(sv[0]);
  // The worker's end becomes its fd 3 (dup2 clears close-on-exec).
  constexpr int kChildFd = 3;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, sv[1], kChildFd);
  const std::string fd_arg = std::to_string(kChildFd), dev_arg = std::to_string(device);
  const char* argv[] = {worker_path.c_str(), "--channel-fd",  fd_arg.c_str(),
                        "--device",          dev_arg.c_str(), nullptr};
  const int rc = ::posix_spawn(&pid_, worker_path.c_str(), &fa, nullptr,
                               const_cast<char* const*>(argv), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(sv[1]);
  if (rc != 0) {
    pid_ = -1;
    throw Error("cannot start " + worker_path + ": " + std::strerror(rc));
  }
}

void RemoteGpuExecutor::expect(ReceivedMsg& m, WorkerMsg type, const char* what) {
  if (!ch_->readable(kStartTimeoutMs)) {
    throw Error(std::string("moe-gpu-worker did not answer (") + what + ") within " +
                std::to_string(kStartTimeoutMs / 1000) + " s");
  }
  if (!ch_->receive(m)) {
    throw Error(std::string("moe-gpu-worker exited during start (") + what + ")");
  }
  if (m.fd >= 0) ::close(m.fd);
  const std::string text(m.payload.begin(), m.payload.end());
  if (m.head.type == WorkerMsg::Failed) throw Error("moe-gpu-worker failed: " + text);
  if (m.head.type != type) {
    throw Error(std::string("moe-gpu-worker sent an unexpected message (") + what + ")");
  }
}

void RemoteGpuExecutor::handshake(int device, uint64_t address_bytes) {
  ReceivedMsg m;
  expect(m, WorkerMsg::Hello, "start");
  // A common base for the shared range. Each side proposes a range it holds; the other takes it
  // if the place is free there, else proposes one of its own. A side keeps every range it
  // proposed until the end, so each new proposal lies past the places the other side lacked.
  ch_->send(WorkerMsg::Reserve, 0, address_bytes);
  expect(m, WorkerMsg::Reserved, "address range");
  std::vector<std::unique_ptr<SharedVram>> held;
  std::string why;
  for (int round = 0; round < kReserveRounds && !vram_; ++round) {
    if (m.head.a == 0) {
      throw Error(
          "moe-gpu-worker cannot reserve " + std::to_string(address_bytes >> 20) +
          " MiB of device address space: " + std::string(m.payload.begin(), m.payload.end()));
    }
    try {
      vram_ = std::make_unique<SharedVram>(device, address_bytes, m.head.a);
      break;
    } catch (const Error& e) {
      why = e.what();
    }
    auto mine = std::make_unique<SharedVram>(device, address_bytes, 0);
    ch_->send(WorkerMsg::Reserve, mine->base(), address_bytes);
    expect(m, WorkerMsg::Reserved, "address range");
    if (m.head.a == mine->base()) {
      vram_ = std::move(mine);
    } else {
      held.push_back(std::move(mine));
    }
  }
  if (!vram_) {
    throw Error("no device address range of " + std::to_string(address_bytes >> 20) +
                " MiB is free at the same place in the coordinator and moe-gpu-worker after " +
                std::to_string(kReserveRounds) + " proposals (" + why + ")");
  }
  flags_ = std::make_unique<SharedFlags>();
  ch_->send(WorkerMsg::Flags, 0, 0, {}, flags_->fd());
}

void RemoteGpuExecutor::watch() {
  ReceivedMsg m;
  std::string why = "moe-gpu-worker exited";
  for (;;) {
    try {
      if (!ch_->receive(m)) break;
    } catch (const Error& e) {
      why = e.what();
      break;
    }
    if (m.fd >= 0) ::close(m.fd);
    if (m.head.type == WorkerMsg::Failed) {
      why = "moe-gpu-worker failed: " + std::string(m.payload.begin(), m.payload.end());
    }
  }
  if (stopping_) return;
  {
    const std::lock_guard lock(fail_mu_);
    failure_ = why + " (pid " + std::to_string(pid_) + ")";
  }
  dead_ = true;
  // Frees every stream waiting for a batch the worker will never finish.
  flags_->set(SharedFlags::Done, issued_.load());
  std::fprintf(stderr, "moe-coordinator: %s\n", failure().c_str());
}

std::string RemoteGpuExecutor::failure() const {
  const std::lock_guard lock(fail_mu_);
  return failure_;
}

void RemoteGpuExecutor::stop_worker() noexcept {
  if (ch_) ch_->close();
  if (pid_ <= 0) return;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  int status = 0;
  while (::waitpid(pid_, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid_, SIGKILL);
      (void)::waitpid(pid_, &status, 0);
      break;
    }
    ::usleep(10000);
  }
  pid_ = -1;
}

void RemoteGpuExecutor::submit(const KernelBatch& batch, cudaStream_t stream) {
  if (batch.empty()) return;
  if (dead_) throw Error(failure());
  const std::span<const KernelCall> calls = batch.calls();
  const std::lock_guard lock(send_mu_);
  const uint32_t seq = ++seq_;
  issued_.store(seq);
  try {
    ch_->send(WorkerMsg::Batch, seq, 0,
              {reinterpret_cast<const unsigned char*>(calls.data()), calls.size_bytes()});
  } catch (const Error&) {
    throw Error(dead_ ? failure() : "moe-gpu-worker is gone (pid " + std::to_string(pid_) + ")");
  }
  flags_->write(stream, SharedFlags::Go, seq);
  flags_->wait(stream, SharedFlags::Done, seq);
}

std::string RemoteGpuExecutor::describe() const {
  return "GPU executor in moe-gpu-worker (pid " + std::to_string(pid_) + ", " + mps_note_ + ")";
}

void* RemoteGpuExecutor::allocate(size_t bytes, std::string& why) {
  const std::optional<uint64_t> aligned = checked_align_up(bytes == 0 ? 1 : bytes, kAlign);
  if (!aligned) {
    why = "a size that overflows";
    return nullptr;
  }
  const uint64_t want = *aligned;
  const std::lock_guard lock(heap_mu_);
  if (dead_) {
    why = failure();
    return nullptr;
  }
  Chunk* chunk = nullptr;
  std::optional<uint64_t> off;
  for (auto& c : chunks_) {
    off = c->free.take(want);
    if (off) {
      chunk = c.get();
      break;
    }
  }
  if (!chunk) {
    auto c = std::make_unique<Chunk>(Chunk{{}, RangeList(0), 0});
    try {
      c->mem = vram_->create(std::max(want, kChunkBytes));
    } catch (const Error& e) {
      why = e.what();
      return nullptr;
    }
    try {
      const std::lock_guard send_lock(send_mu_);
      ch_->send(WorkerMsg::Map, c->mem.offset, c->mem.bytes, {}, c->mem.fd);
    } catch (const Error& e) {
      ::close(c->mem.fd);
      vram_->release(c->mem.ptr);
      why = std::string("moe-gpu-worker did not take the allocation: ") + e.what();
      return nullptr;
    }
    ::close(c->mem.fd);
    c->mem.fd = -1;
    c->free = RangeList(c->mem.bytes);
    off = c->free.take(want);
    chunk = c.get();
    chunks_.push_back(std::move(c));
  }
  ++chunk->live;
  const auto p = reinterpret_cast<uintptr_t>(chunk->mem.ptr) + *off;
  placed_[p] = {chunk, *off, want};
  return reinterpret_cast<void*>(p);
}

void RemoteGpuExecutor::release(void* p) noexcept {
  // As cudaFree: no kernel of either process may still use it. The coordinator's streams wait
  // for every batch the worker ran, so its device being idle means the worker's is too.
  (void)cudaDeviceSynchronize();
  const std::lock_guard lock(heap_mu_);
  const auto it = placed_.find(reinterpret_cast<uintptr_t>(p));
  if (it == placed_.end()) return;
  Chunk* c = it->second.chunk;
  c->free.give(it->second.offset, it->second.bytes);
  placed_.erase(it);
  if (--c->live > 0) return;
  try {
    const std::lock_guard send_lock(send_mu_);
    ch_->send(WorkerMsg::Unmap, c->mem.offset, 0);
  } catch (const Error&) {
    // The worker is gone: its mappings went with it.
  }
  vram_->release(c->mem.ptr);
  std::erase_if(chunks_, [c](const std::unique_ptr<Chunk>& x) { return x.get() == c; });
}

}  // namespace moe::gpu
