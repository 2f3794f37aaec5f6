// Whether the client of a request still listens. cpp-httplib 0.11 (Debian 12's) gives a handler
// no access to its connection's socket, and a whole (non-streamed) completion writes nothing until
// it is done, so a client that gave up would keep the engine busy until max_tokens. The socket is
// found once by its address pair; its peer's close is then seen by poll() without reading.
#pragma once

#include <string>

namespace moe::http {

class PeerSocket {
 public:
  // The connected socket whose local end is local_port and whose peer is remote_addr:remote_port,
  // or none (then closed() is always false).
  PeerSocket(const std::string& remote_addr, int remote_port, int local_port);

  bool found() const { return fd_ >= 0; }
  // True once the peer has closed or reset the connection.
  bool closed() const;

 private:
  int fd_ = -1;
};

}  // namespace moe::http
