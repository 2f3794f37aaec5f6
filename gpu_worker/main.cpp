// moe-gpu-worker: runs a coordinator's routed-expert kernel launches in a CUDA context of its own
// (DESIGN.md §2-§3). The coordinator starts it with one end of a socket pair as --channel-fd and
// maps every VRAM allocation into it at the coordinator's addresses (SharedVram); each batch of
// launches then runs on this process's stream between a wait for the coordinator's "go" flag and
// a write of "done" (SharedFlags), with no host in the hand-off. Without MPS the two contexts are
// time-sliced, which is why the launch script starts an MPS daemon first (scripts/with-mps).
// Exit status: 0 when the coordinator closed the channel, 1 on a failure (reported to the
// coordinator first), 2 on bad arguments.
#include <sys/prctl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "experts/gpu/kernel_batch.h"
#include "experts/gpu/shared_flags.h"
#include "experts/gpu/shared_vram.h"
#include "experts/gpu/worker_channel.h"
#include "kernels/cuda/cuda_check.h"

namespace {

using namespace moe;
using namespace moe::gpu;

// How often an idle worker looks at its stream for an asynchronous error (a fault in a kernel):
// the coordinator's stream waits for this worker's "done", so the error has to be reported.
constexpr int kIdleCheckMs = 100;

class Worker {
 public:
  Worker(int fd, int device) : ch_(fd), device_(device) {}

  int run() {
    MOE_CUDA_CHECK(cudaSetDevice(device_));
    MOE_CUDA_CHECK(cudaFree(nullptr));  // the context, before any address is reserved
    MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ch_.send(WorkerMsg::Hello, static_cast<uint64_t>(::getpid()), 0);
    ReceivedMsg m;
    for (;;) {
      while (!ch_.readable(kIdleCheckMs)) check_stream();
      if (!ch_.receive(m)) return 0;  // the coordinator is done (or gone)
      handle(m);
    }
  }

  void report(const std::string& what) {
    try {
      ch_.send_text(WorkerMsg::Failed, 0, what);
    } catch (const Error&) {
      // The coordinator is gone; stderr is all there is.
    }
  }

 private:
  void check_stream() const {
    const cudaError_t e = cudaStreamQuery(stream_);
    if (e != cudaSuccess && e != cudaErrorNotReady) MOE_CUDA_CHECK(e);
  }

  void handle(ReceivedMsg& m) {
    // A descriptor that came with the message is ours to close, whatever happens below.
    struct Fd {
      int fd;
      ~Fd() {
        if (fd >= 0) ::close(fd);
      }
    } fd{m.fd};
    switch (m.head.type) {
      case WorkerMsg::Reserve:
        reserve(m.head.a, m.head.b);
        return;
      case WorkerMsg::Flags:
        if (fd.fd < 0) throw Error("the flag page came without its descriptor");
        flags_ = std::make_unique<SharedFlags>(fd.fd);
        held_.clear();  // the range is agreed: the places proposed on the way are given back
        return;
      case WorkerMsg::Map:
        if (!vram_ || fd.fd < 0)
          throw Error("an allocation to map came before the range or without its descriptor");
        vram_->import(fd.fd, m.head.a, m.head.b);
        return;
      case WorkerMsg::Unmap:
        if (vram_) vram_->release(reinterpret_cast<void*>(vram_->base() + m.head.a));
        return;
      case WorkerMsg::Batch: {
        if (!flags_) throw Error("a batch came before the flag page");
        if (m.payload.size() % sizeof(KernelCall) != 0) throw Error("a batch of partial launches");
        const KernelBatch batch =
            KernelBatch::from({reinterpret_cast<const KernelCall*>(m.payload.data()),
                               m.payload.size() / sizeof(KernelCall)});
        const auto seq = static_cast<uint32_t>(m.head.a);
        flags_->wait(stream_, SharedFlags::Go, seq);
        batch.replay(stream_);
        flags_->write(stream_, SharedFlags::Done, seq);
        return;
      }
      default:
        throw Error("unexpected message " + std::to_string(static_cast<uint32_t>(m.head.type)));
    }
  }

  // The coordinator's proposal `at` if it is free here, else a range of our own (the last one
  // proposed is kept, so the next lies past it). Replies with the base taken, 0 on failure.
  void reserve(uint64_t at, uint64_t bytes) {
    if (vram_) held_.push_back(std::move(vram_));
    if (at != 0) {
      try {
        vram_ = std::make_unique<SharedVram>(device_, bytes, at);
      } catch (const Error&) {
        // Taken here: propose our own below.
      }
    }
    try {
      if (!vram_) vram_ = std::make_unique<SharedVram>(device_, bytes, 0);
      ch_.send(WorkerMsg::Reserved, vram_->base(), 0);
    } catch (const Error& e) {
      ch_.send_text(WorkerMsg::Reserved, 0, e.what());
    }
  }

  WorkerChannel ch_;
  int device_;
  std::vector<std::unique_ptr<SharedVram>> held_;  // proposed during the handshake
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<SharedVram> vram_;
  std::unique_ptr<SharedFlags> flags_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"moe-gpu-worker: runs a moe-coordinator's expert kernels (started by it)"};
  int fd = -1, device = 0;
  app.add_option("--channel-fd", fd, "the coordinator's socket (inherited)")->required();
  app.add_option("--device", device, "CUDA device ordinal")->check(CLI::NonNegativeNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  // Never outlive the coordinator, even if the channel's end were missed.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  Worker w(fd, device);
  try {
    return w.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe-gpu-worker: %s\n", e.what());
    w.report(e.what());
    return 1;
  }
}
