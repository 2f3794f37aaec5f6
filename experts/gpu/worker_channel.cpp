#include "experts/gpu/worker_channel.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"

namespace moe::gpu {

WorkerChannel::~WorkerChannel() { close(); }

void WorkerChannel::close() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void WorkerChannel::send(WorkerMsg type, uint64_t a, uint64_t b,
                         std::span<const unsigned char> payload, int pass_fd) {
  if (payload.size() > kMaxPayload) throw Error("GPU worker message too large");
  WorkerMsgHeader h{type, static_cast<uint32_t>(payload.size()), a, b};
  iovec iov[2] = {{&h, sizeof h}, {const_cast<unsigned char*>(payload.data()), payload.size()}};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = payload.empty() ? 1 : 2;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (pass_fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
  }
  ssize_t n = 0;
  do {
    n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) throw Error(std::string("GPU worker channel: send failed: ") + std::strerror(errno));
}

void WorkerChannel::send_text(WorkerMsg type, uint64_t a, const std::string& text) {
  send(type, a, 0,
       {reinterpret_cast<const unsigned char*>(text.data()), std::min(text.size(), kMaxPayload)});
}

bool WorkerChannel::receive(ReceivedMsg& m) {
  // One buffer for the channel's life: a message costs its own bytes, not a cleared 256 KiB.
  if (!buf_) buf_ = std::make_unique<unsigned char[]>(sizeof(WorkerMsgHeader) + kMaxPayload);
  iovec iov{buf_.get(), sizeof(WorkerMsgHeader) + kMaxPayload};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n = 0;
  do {
    n = ::recvmsg(fd_, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n == 0) return false;
  if (n < 0) {
    if (errno == ECONNRESET) return false;
    throw Error(std::string("GPU worker channel: receive failed: ") + std::strerror(errno));
  }
  m.fd = -1;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      std::memcpy(&m.fd, CMSG_DATA(c), sizeof(int));
    }
  }
  const auto got = static_cast<size_t>(n);
  if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0 || got < sizeof(WorkerMsgHeader)) {
    if (m.fd >= 0) ::close(m.fd);
    throw Error("GPU worker channel: malformed message (" + std::to_string(got) + " bytes)");
  }
  std::memcpy(&m.head, buf_.get(), sizeof m.head);
  if (m.head.payload_bytes != got - sizeof(WorkerMsgHeader)) {
    if (m.fd >= 0) ::close(m.fd);
    throw Error("GPU worker channel: message length does not match its header");
  }
  m.payload.assign(buf_.get() + sizeof(WorkerMsgHeader), buf_.get() + got);
  return true;
}

bool WorkerChannel::readable(int timeout_ms) const {
  pollfd p{fd_, POLLIN, 0};
  int rc = 0;
  do {
    rc = ::poll(&p, 1, timeout_ms);
  } while (rc < 0 && errno == EINTR);
  return rc > 0;
}

}  // namespace moe::gpu
