// `--master_port 0` (dscpp's, not DeepSpeed's): a rendezvous port the kernel reports free,
// held for the job's life so that nothing else is given it before rank 0 serves the store.
// The hold is a socket bound to 0.0.0.0:PORT with SO_REUSEADDR and never listening: the
// kernel hands the port to no other bind(port 0) or connect() while it is bound, yet rank 0's
// TCPStore, which binds with SO_REUSEADDR too (LibTorch's and libuv's both do), may bind and
// listen on it. The socket is close-on-exec, so the ranks do not inherit it.
#pragma once

namespace dscpp::launcher {

class PortReservation {
 public:
  // Throws UserError when no port can be had (no socket, or the kernel refuses the bind).
  PortReservation();
  ~PortReservation();
  PortReservation(const PortReservation&) = delete;
  PortReservation& operator=(const PortReservation&) = delete;

  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

}  // namespace dscpp::launcher
