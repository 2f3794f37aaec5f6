// The coordinator's side of a moe-gpu-worker process: starts the worker, maps every VRAM
// allocation of the coordinator into it at the same address (the allocator), and hands it each
// layer's expert launches. A batch's hand-off is GPU-side: the coordinator's stream writes "go"
// after the batch's inputs, the worker's stream waits for it, runs the launches and writes
// "done", which the coordinator's stream waits for. If the worker dies, a watcher thread writes
// "done" from the host so no stream hangs, and the next submit() fails with the worker's message.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "experts/gpu/gpu_executor.h"
#include "experts/gpu/range_list.h"
#include "experts/gpu/shared_flags.h"
#include "experts/gpu/shared_vram.h"
#include "experts/gpu/worker_channel.h"

namespace moe::gpu {

class RemoteGpuExecutor : public GpuExecutor, public VramAllocator {
 public:
  // Starts `worker_path` for `device` (current in this process) and reserves `address_bytes`
  // of device address space at the same base in both processes. Throws moe::Error when the
  // worker cannot start or fails, or when no common base is found.
  RemoteGpuExecutor(const std::string& worker_path, int device, uint64_t address_bytes,
                    std::string mps_note);
  // Stops the worker (end of its channel; killed after 2 s).
  ~RemoteGpuExecutor() override;

  void submit(const KernelBatch& batch, cudaStream_t stream) override;
  bool remote() const override { return true; }
  VramAllocator* allocator() override { return this; }
  std::string describe() const override;

  void* allocate(size_t bytes, std::string& why) override;
  void release(void* p) noexcept override;

  // Allocations are placed in chunks of at least this size: each chunk is one shared mapping
  // (granularity 2 MiB), so small buffers do not each cost a whole granule.
  static constexpr uint64_t kChunkBytes = 32ull << 20;

 private:
  struct Chunk {
    SharedVram::Export mem;
    RangeList free;
    int64_t live = 0;
  };
  struct Placed {
    Chunk* chunk;
    uint64_t offset, bytes;
  };
  void start(const std::string& worker_path, int device);
  void handshake(int device, uint64_t address_bytes);
  void expect(ReceivedMsg& m, WorkerMsg type, const char* what);
  void watch();
  void stop_worker() noexcept;
  std::string failure() const;

  pid_t pid_ = -1;
  std::string mps_note_;
  std::unique_ptr<WorkerChannel> ch_;
  std::unique_ptr<SharedVram> vram_;
  std::unique_ptr<SharedFlags> flags_;
  std::mutex send_mu_;  // sends come from the forward's thread and allocations' threads
  uint32_t seq_ = 0;
  std::atomic<uint32_t> issued_{0};
  std::thread watcher_;
  std::atomic<bool> dead_{false}, stopping_{false};
  mutable std::mutex fail_mu_;
  std::string failure_;
  std::mutex heap_mu_;
  std::vector<std::unique_ptr<Chunk>> chunks_;
  std::map<uintptr_t, Placed> placed_;
};

}  // namespace moe::gpu
