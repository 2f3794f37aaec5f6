// The coordinator <-> GPU worker control channel: one end of a SOCK_SEQPACKET socket pair, so
// each message arrives whole or not at all, and a message may carry one file descriptor (a
// shared allocation, the flag page). The coordinator is the only peer: a worker started by hand
// has no channel to speak on.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace moe::gpu {

enum class WorkerMsg : uint32_t {
  Hello = 1,  // worker -> coordinator: a = pid, once its CUDA context is up
  Reserve,    // coordinator -> worker: reserve b bytes of device address space at a (0 or taken:
              // anywhere); the previous range is kept until Flags
  Reserved,   // worker -> coordinator: a = the base it got (0: failed; the text says why)
  Flags,      // coordinator -> worker: the flag page (fd)
  Map,        // coordinator -> worker: map the allocation (fd) at offset a, b bytes
  Unmap,      // coordinator -> worker: unmap the allocation at offset a
  Batch,      // coordinator -> worker: a = sequence number, payload = KernelCall[]
  Failed,     // worker -> coordinator: the text says what failed; the worker then exits
};

struct WorkerMsgHeader {
  WorkerMsg type{};
  uint32_t payload_bytes = 0;
  uint64_t a = 0, b = 0;
};

struct ReceivedMsg {
  WorkerMsgHeader head;
  std::vector<unsigned char> payload;
  int fd = -1;  // owned by the receiver
};

class WorkerChannel {
 public:
  // Takes ownership of `fd`, one end of a SOCK_SEQPACKET socketpair().
  explicit WorkerChannel(int fd) : fd_(fd) {}
  ~WorkerChannel();
  WorkerChannel(const WorkerChannel&) = delete;
  WorkerChannel& operator=(const WorkerChannel&) = delete;

  // Sends one message (with `pass_fd` when >= 0). Throws moe::Error when the peer is gone.
  void send(WorkerMsg type, uint64_t a, uint64_t b, std::span<const unsigned char> payload = {},
            int pass_fd = -1);
  void send_text(WorkerMsg type, uint64_t a, const std::string& text);
  // Blocks for the next message; false at end of stream (the peer closed or died). Throws
  // moe::Error on a malformed message.
  bool receive(ReceivedMsg& m);
  // Waits up to timeout_ms for a message or the peer's end; false on timeout.
  bool readable(int timeout_ms) const;
  int fd() const { return fd_; }
  // Closes the socket: the peer sees the end of the stream.
  void close() noexcept;

  // The largest message: a batch of a few hundred launches.
  static constexpr size_t kMaxPayload = 256 * 1024;

 private:
  int fd_;
  std::unique_ptr<unsigned char[]> buf_;  // receive(): a whole message, header first
};

}  // namespace moe::gpu
