// The coordinator <-> GPU worker channel: whole messages with payload and a passed descriptor,
// the peer's end seen as such, and malformed messages refused with a clear error.
#include "experts/gpu/worker_channel.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"

namespace {

using namespace moe::gpu;

struct Pair {
  Pair() {
    int sv[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    a = std::make_unique<WorkerChannel>(sv[0]);
    b_fd = sv[1];
    b = std::make_unique<WorkerChannel>(sv[1]);
  }
  std::unique_ptr<WorkerChannel> a, b;
  int b_fd;
};

TEST(WorkerChannel, CarriesPayloadAndDescriptor) {
  Pair p;
  std::mt19937 rng(7);
  std::vector<unsigned char> payload(5000);
  for (auto& c : payload) c = static_cast<unsigned char>(rng());
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  p.a->send(WorkerMsg::Map, 123, 456, payload, pipe_fds[1]);
  ::close(pipe_fds[1]);
  ReceivedMsg m;
  ASSERT_TRUE(p.b->readable(1000));
  ASSERT_TRUE(p.b->receive(m));
  EXPECT_EQ(m.head.type, WorkerMsg::Map);
  EXPECT_EQ(m.head.a, 123u);
  EXPECT_EQ(m.head.b, 456u);
  EXPECT_EQ(m.payload, payload);
  ASSERT_GE(m.fd, 0);
  // The received descriptor is the pipe's write end: what goes in comes out of the read end.
  ASSERT_EQ(::write(m.fd, "x", 1), 1);
  char c = 0;
  ASSERT_EQ(::read(pipe_fds[0], &c, 1), 1);
  EXPECT_EQ(c, 'x');
  ::close(m.fd);
  ::close(pipe_fds[0]);

  // A second message without descriptor or payload, into the same ReceivedMsg.
  p.b->send_text(WorkerMsg::Failed, 9, "kernel fault");
  ASSERT_TRUE(p.a->receive(m));
  EXPECT_EQ(m.head.type, WorkerMsg::Failed);
  EXPECT_EQ(std::string(m.payload.begin(), m.payload.end()), "kernel fault");
  EXPECT_EQ(m.fd, -1);
}

TEST(WorkerChannel, PeerEndIsNotAnError) {
  Pair p;
  EXPECT_FALSE(p.b->readable(10));
  p.a->close();
  ASSERT_TRUE(p.b->readable(1000));
  ReceivedMsg m;
  EXPECT_FALSE(p.b->receive(m));
  // Sending to a closed peer is an error, not a SIGPIPE.
  EXPECT_THROW(p.b->send(WorkerMsg::Batch, 1, 0), moe::Error);
}

TEST(WorkerChannel, RefusesMalformedMessages) {
  Pair p;
  ReceivedMsg m;
  // Shorter than a header.
  const char junk[5] = {1, 2, 3, 4, 5};
  ASSERT_EQ(::send(p.a->fd(), junk, sizeof junk, 0), 5);
  EXPECT_THROW(p.b->receive(m), moe::Error);
  // A header whose length does not match the message.
  WorkerMsgHeader h{WorkerMsg::Batch, 100, 1, 0};
  ASSERT_EQ(::send(p.a->fd(), &h, sizeof h, 0), static_cast<ssize_t>(sizeof h));
  try {
    p.b->receive(m);
    FAIL() << "a length mismatch was accepted";
  } catch (const moe::Error& e) {
    EXPECT_NE(std::string(e.what()).find("length"), std::string::npos) << e.what();
  }
  // Too large to send.
  std::vector<unsigned char> big(WorkerChannel::kMaxPayload + 1);
  EXPECT_THROW(p.a->send(WorkerMsg::Batch, 1, 0, big), moe::Error);
  // The channel still works afterwards.
  p.a->send(WorkerMsg::Unmap, 7, 0);
  ASSERT_TRUE(p.b->receive(m));
  EXPECT_EQ(m.head.type, WorkerMsg::Unmap);
  EXPECT_EQ(m.head.a, 7u);
}

}  // namespace
