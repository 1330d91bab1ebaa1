// The TCP star every backend starts from: rank 0 listens on MASTER_ADDR (MASTER_PORT, or a free
// port it publishes through MG_DIST_INIT_FILE), every other rank connects to it and proves it
// belongs to the job with the token. NCCL uses it to hand out its unique id and for barriers;
// the CPU backend moves all its data through it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "distributed/process_group.h"

namespace mg::dist::detail {

inline constexpr size_t kMaxTokenBytes = 64;
// Control messages (rendezvous replies, error reports, the NCCL id) are at most this long.
inline constexpr size_t kMaxControlBytes = 4096;

// What a rank sends rank 0 first. The token is zero-padded; rank 0 compares all of it in
// constant time. (Exposed so tests can forge hellos.)
struct Hello {
  uint32_t magic;
  int32_t rank;
  int32_t world;
  uint32_t token_len;
  char token[kMaxTokenBytes];
};
Hello make_hello(int rank, int world, const std::string& token);

// A connected TCP socket; every read and write has a deadline.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket();
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

class Star {
 public:
  // Connects this rank to the others (opts must be resolved). Rank 0 reads hellos from all
  // connections at once, each within min(timeout, 10 s), and drops (with a line on stderr) a
  // connection that stays silent, sends no memgrad hello, a wrong token, a wrong world size, a
  // rank out of range, or a rank an authenticated peer already took; a peer with the token gets
  // the reason as its reply. Raises DistributedError naming rank, world size, the address, who is
  // missing and what was dropped when the timeout passes.
  static std::unique_ptr<Star> connect(const ProcessGroupOptions& opts);

  int rank() const { return rank_; }
  int size() const { return world_; }
  std::chrono::milliseconds timeout() const { return std::chrono::milliseconds(timeout_ms_.load()); }
  void set_timeout(std::chrono::milliseconds t) { timeout_ms_ = t.count(); }
  // "rank 1 of 4": prefix for error messages.
  std::string who() const;

  // Point-to-point along the star: rank 0 talks to `peer` (1..size-1); the others pass peer 0.
  // `what` names the operation in timeout / disconnect errors.
  void send(int peer, const void* data, size_t n, const std::string& what);
  void recv(int peer, void* data, size_t n, const std::string& what);
  void send_string(int peer, const std::string& s, const std::string& what);
  // Raises DistributedError (without allocating) when the announced length exceeds `max_bytes`.
  std::string recv_string(int peer, const std::string& what, size_t max_bytes = kMaxControlBytes);
  // Shuts every connection down, so the peers see end-of-stream at once instead of waiting for
  // their timeout (a group that broke calls it).
  void shutdown();

  // Rank 0's bytes to everyone (others' `data` is replaced).
  void broadcast_bytes(std::string& data, const std::string& what);
  // Every rank arrives before any leaves (bounded by the timeout).
  void barrier(const std::string& what);

 private:
  Star(int rank, int world, std::chrono::milliseconds timeout)
      : rank_(rank), world_(world), timeout_ms_(timeout.count()) {}
  Socket& sock(int peer, const char* fn);
  int rank_, world_;
  std::atomic<int64_t> timeout_ms_;
  std::vector<Socket> peers_;  // rank 0: index r = rank r (0 unused); others: index 0 = rank 0
};

// A port nobody listens on right now (bind to port 0, read it back).
int free_tcp_port();

}  // namespace mg::dist::detail
