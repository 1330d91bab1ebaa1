// TCP star: listen/accept on rank 0, connect-with-retry on the others, a hello that checks
// rank and world size, and deadline-bounded send/recv that turn a dead or missing peer into
// an mg::Error instead of a hang.
#include "distributed/tcp_rendezvous.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/atomic_file.h"
#include "core/error.h"

namespace mg::dist::detail {

namespace {
using Clock = std::chrono::steady_clock;
constexpr uint32_t kMagic = 0x4d474432;  // "MGD2": the hello with a token

std::string seconds(std::chrono::milliseconds ms) {
  std::ostringstream os;
  os << ms.count() / 1000.0 << " s";
  return os.str();
}

int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(std::min<long long>(left, 1 << 30));
}

void set_nodelay(int fd) {
  int one = 1;
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Waits for `events` on fd until the deadline; false on timeout.
bool wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, remaining_ms(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) return false;
  }
}

// Resolves host:port to IPv4 addresses (the rendezvous is single-host or a plain LAN).
sockaddr_in resolve(const std::string& host, int port, const std::string& who) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  MG_CHECK(rc == 0 && res, DistributedError, who, ": cannot resolve MASTER_ADDR '", host, "': ", gai_strerror(rc));
  sockaddr_in a = *reinterpret_cast<sockaddr_in*>(res->ai_addr);
  freeaddrinfo(res);
  return a;
}

// One non-blocking connect attempt bounded by the deadline; returns -1 if it did not connect.
int try_connect(const sockaddr_in& addr, Clock::time_point deadline) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  if (rc != 0 && errno == EINPROGRESS) {
    if (wait_fd(fd, POLLOUT, deadline)) {
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err == 0 ? 0 : -1;
    }
  }
  if (rc != 0) {
    ::close(fd);
    return -1;
  }
  fcntl(fd, F_SETFL, flags);
  set_nodelay(fd);
  return fd;
}

bool read_init_file(const std::string& path, std::string* host, int* port) {
  std::ifstream f(path);
  std::string h;
  int p = 0;
  if (!(f >> h >> p) || p <= 0) return false;
  *host = h;
  *port = p;
  return true;
}

void send_all_fd(int fd, const void* data, size_t n, Clock::time_point deadline, const std::string& err_prefix) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    if (!wait_fd(fd, POLLOUT, deadline)) MG_THROW(DistributedError, err_prefix, ": timed out sending");
    ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k <= 0) MG_THROW(DistributedError, err_prefix, ": connection lost while sending (", std::strerror(errno), ")");
    p += k;
    n -= static_cast<size_t>(k);
  }
}

// Returns false on timeout; throws on a closed connection.
bool recv_all_fd(int fd, void* data, size_t n, Clock::time_point deadline, const std::string& err_prefix) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    if (!wait_fd(fd, POLLIN, deadline)) return false;
    ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k == 0) MG_THROW(DistributedError, err_prefix, ": the peer closed the connection (did it exit or crash?)");
    if (k < 0) MG_THROW(DistributedError, err_prefix, ": connection error (", std::strerror(errno), ")");
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}
}  // namespace

Socket::~Socket() {
  if (fd_ >= 0) ::close(fd_);
}

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

std::string Star::who() const { return "rank " + std::to_string(rank_) + " of " + std::to_string(world_); }

Socket& Star::sock(int peer, const char* fn) {
  if (rank_ == 0) {
    MG_CHECK(peer >= 1 && peer < world_, ValueError, "Star::", fn, ": rank 0 has no connection to rank ", peer);
    return peers_[peer];
  }
  MG_CHECK(peer == 0, ValueError, "Star::", fn, ": rank ", rank_, " only talks to rank 0, not ", peer);
  return peers_[0];
}

Hello make_hello(int rank, int world, const std::string& token) {
  Hello h{};
  h.magic = kMagic;
  h.rank = rank;
  h.world = world;
  h.token_len = static_cast<uint32_t>(std::min(token.size(), kMaxTokenBytes));
  std::memcpy(h.token, token.data(), h.token_len);
  return h;
}

namespace {
// Constant time in the token's content: every byte is looked at whatever the first difference.
bool token_matches(const Hello& h, const std::string& token) {
  Hello want = make_hello(0, 0, token);
  unsigned diff = h.token_len ^ want.token_len;
  for (size_t i = 0; i < kMaxTokenBytes; ++i) diff |= static_cast<unsigned char>(h.token[i] ^ want.token[i]);
  return diff == 0;
}

std::string peer_name(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return "?";
  char buf[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &a.sin_addr, buf, sizeof(buf));
  return std::string(buf) + ":" + std::to_string(ntohs(a.sin_port));
}

// A connection whose hello has not fully arrived yet.
struct Pending {
  Socket sock;
  Clock::time_point deadline;
  Hello hello{};
  size_t got = 0;
};

// Rank 0's side of the rendezvous: binds MASTER_ADDR, publishes the port when asked, and fills
// peers[1..world) with authenticated connections.
void accept_peers(const ProcessGroupOptions& o, const std::string& who, Clock::time_point deadline,
                  std::vector<Socket>& peers) {
  Socket listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  MG_CHECK(listener.valid(), DistributedError, who, ": socket() failed: ", std::strerror(errno));
  int one = 1;
  setsockopt(listener.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const bool by_file = !o.init_file.empty();
  sockaddr_in addr = resolve(o.master_addr, by_file ? 0 : o.master_port, who);
  MG_CHECK(::bind(listener.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0, DistributedError, who,
           ": cannot listen on ", o.master_addr, ":", by_file ? 0 : o.master_port, ": ", std::strerror(errno),
           errno == EADDRNOTAVAIL ? " (MASTER_ADDR is not an address of this host: rank 0 must run where it points)"
                                  : " (another job on this port? choose another MASTER_PORT)");
  MG_CHECK(::listen(listener.fd(), 128) == 0, DistributedError, who, ": listen() failed: ", std::strerror(errno));
  socklen_t len = sizeof(addr);
  getsockname(listener.fd(), reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  if (by_file) {
    // Through an unpredictable temporary file, then rename: a reader never sees half a line,
    // and nobody can plant a link at the temporary name.
    const std::string line = o.master_addr + " " + std::to_string(port) + "\n";
    write_file_atomically(o.init_file, [&](const ByteSink& sink) { sink(line.data(), line.size()); });
  }

  // Every connection's hello is read as it arrives, so a silent or slow client holds only its
  // own slot (at most kMaxPending of them) until its own deadline.
  constexpr size_t kMaxPending = 64;
  const auto hello_time = std::min<std::chrono::milliseconds>(o.timeout, std::chrono::seconds(10));
  std::vector<Pending> pending;
  std::vector<std::string> dropped;
  auto drop = [&](Pending& p, const std::string& reason, bool tell) {
    const std::string line = "a connection from " + peer_name(p.sock.fd()) + ": " + reason;
    std::fprintf(stderr, "%s: rendezvous dropped %s\n", who.c_str(), line.c_str());
    if (dropped.size() < 8) dropped.push_back(line);
    if (tell) {
      const std::string msg = "rendezvous refused by rank 0: " + reason;
      uint64_t n = msg.size();
      try {  // best effort: the reply fits in the socket buffer
        const auto d = Clock::now() + std::chrono::milliseconds(200);
        send_all_fd(p.sock.fd(), &n, sizeof(n), d, who);
        send_all_fd(p.sock.fd(), msg.data(), n, d, who);
      } catch (const Error&) {
      }
    }
    p.sock = Socket();
  };
  // Checks a complete hello; admits it into peers or drops it.
  auto judge = [&](Pending& p) {
    const Hello& h = p.hello;
    if (h.magic != kMagic) return drop(p, "not a memgrad hello", false);
    if (!token_matches(h, o.token)) return drop(p, "wrong MG_DIST_TOKEN", true);
    if (h.world != o.world_size)
      return drop(p,
                  "rank " + std::to_string(h.rank) + " has WORLD_SIZE " + std::to_string(h.world) + ", rank 0 has " +
                      std::to_string(o.world_size),
                  true);
    if (h.rank < 1 || h.rank >= o.world_size)
      return drop(p, "rank " + std::to_string(h.rank) + " is outside [1, " + std::to_string(o.world_size) + ")", true);
    if (peers[h.rank].valid())
      return drop(p, "rank " + std::to_string(h.rank) + " is already taken by another process", true);
    const int fd = p.sock.fd();
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL, 0) & ~O_NONBLOCK);
    peers[h.rank] = std::move(p.sock);
  };

  auto joined = [&] {
    int n = 0;
    for (int r = 1; r < o.world_size; ++r) n += peers[r].valid();
    return n;
  };
  while (joined() < o.world_size - 1) {
    const auto now = Clock::now();
    if (now >= deadline) {
      std::ostringstream missing, why;
      for (int r = 1; r < o.world_size; ++r)
        if (!peers[r].valid()) missing << (missing.tellp() ? ", " : "") << r;
      for (const auto& d : dropped) why << "; dropped " << d;
      MG_THROW(DistributedError, who, ": rendezvous timed out after ", seconds(o.timeout), " waiting for rank(s) ",
               missing.str(), " of world size ", o.world_size, " to connect to ", o.master_addr, ":", port,
               " (a missing peer: did every rank start, with the same MASTER_ADDR/MASTER_PORT or MG_DIST_INIT_FILE ",
               "and MG_DIST_TOKEN?)", why.str());
    }
    auto wake = deadline;
    std::vector<pollfd> fds = {{listener.fd(), POLLIN, 0}};
    for (auto& p : pending) {
      fds.push_back({p.sock.fd(), POLLIN, 0});
      wake = std::min(wake, p.deadline);
    }
    int rc = ::poll(fds.data(), fds.size(), remaining_ms(wake));
    if (rc < 0 && errno != EINTR)
      MG_THROW(DistributedError, who, ": rendezvous: poll() failed: ", std::strerror(errno));
    for (size_t i = 0; rc > 0 && i < pending.size(); ++i) {
      Pending& p = pending[i];
      if (!(fds[i + 1].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t k = ::recv(p.sock.fd(), reinterpret_cast<char*>(&p.hello) + p.got, sizeof(Hello) - p.got, 0);
      if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (k <= 0) {
        drop(p, "closed before its hello was complete", false);
        continue;
      }
      p.got += static_cast<size_t>(k);
      if (p.got == sizeof(Hello)) judge(p);
    }
    const auto after = Clock::now();
    for (auto& p : pending)
      if (p.sock.valid() && after >= p.deadline) drop(p, "sent no complete hello within " + seconds(hello_time), false);
    std::erase_if(pending, [](const Pending& p) { return !p.sock.valid(); });
    if (rc > 0 && (fds[0].revents & POLLIN)) {
      for (;;) {
        int fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) break;
        Pending p{Socket(fd), std::min(deadline, after + hello_time)};
        set_nodelay(fd);
        if (pending.size() >= kMaxPending) {
          drop(p, "too many connections without a hello", false);
          continue;
        }
        pending.push_back(std::move(p));
      }
    }
  }
}
}  // namespace

std::unique_ptr<Star> Star::connect(const ProcessGroupOptions& o) {
  std::unique_ptr<Star> s(new Star(o.rank, o.world_size, o.timeout));
  if (o.world_size == 1) return s;
  const std::string who = s->who();
  const auto deadline = Clock::now() + o.timeout;

  if (o.rank == 0) {
    s->peers_.resize(o.world_size);
    accept_peers(o, who, deadline, s->peers_);
    for (int r = 1; r < o.world_size; ++r) s->send_string(r, "", "rendezvous acknowledgement");
    return s;
  }

  // Ranks 1..N-1: find rank 0 (the init file may not exist yet), connect, say hello.
  s->peers_.resize(1);
  std::string host = o.master_addr;
  int port = o.master_port;
  int fd = -1;
  while (fd < 0) {
    bool have_addr = o.init_file.empty() || read_init_file(o.init_file, &host, &port);
    if (have_addr)
      fd = try_connect(resolve(host, port, who), std::min(deadline, Clock::now() + std::chrono::seconds(2)));
    if (fd >= 0) break;
    if (Clock::now() >= deadline) {
      if (!have_addr)
        MG_THROW(DistributedError, who, ": rendezvous timed out after ", seconds(o.timeout),
                 " waiting for rank 0 to write ", "MG_DIST_INIT_FILE '", o.init_file,
                 "' (a missing peer: is rank 0 running?)");
      MG_THROW(DistributedError, who, ": rendezvous timed out after ", seconds(o.timeout), " connecting to rank 0 at ",
               host, ":", port, " (a missing peer: is rank 0 running, with the same MASTER_ADDR/MASTER_PORT?)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  s->peers_[0] = Socket(fd);
  const Hello h = make_hello(o.rank, o.world_size, o.token);
  send_all_fd(fd, &h, sizeof(h), deadline, who + ": rendezvous hello to rank 0");
  uint64_t n = 0;
  if (!recv_all_fd(fd, &n, sizeof(n), deadline, who + ": rendezvous with rank 0"))
    MG_THROW(DistributedError, who, ": rendezvous timed out after ", seconds(o.timeout), ": connected to rank 0 at ",
             host, ":", port, " but not every one of the ", o.world_size, " ranks joined (a missing peer)");
  MG_CHECK(n <= kMaxControlBytes, DistributedError, who, ": rendezvous: rank 0 at ", host, ":", port,
           " sent a reply of ", n, " bytes (at most ", kMaxControlBytes, "): not a memgrad rank 0");
  if (n > 0) {
    std::string msg(n, '\0');
    recv_all_fd(fd, msg.data(), n, deadline, who + ": rendezvous with rank 0");
    MG_THROW(DistributedError, who, ": ", msg);
  }
  return s;
}

void Star::send(int peer, const void* data, size_t n, const std::string& what) {
  Socket& so = sock(peer, "send");
  send_all_fd(so.fd(), data, n, Clock::now() + timeout(),
              who() + ": " + what + ": sending to rank " + std::to_string(peer));
}

void Star::recv(int peer, void* data, size_t n, const std::string& what) {
  Socket& so = sock(peer, "recv");
  const std::string prefix = who() + ": " + what + ": receiving from rank " + std::to_string(peer);
  if (!recv_all_fd(so.fd(), data, n, Clock::now() + timeout(), prefix)) {
    MG_THROW(DistributedError, who(), ": timed out after ", seconds(timeout()), " in ", what, " waiting for rank ",
             peer,
             rank_ == 0 ? " (did it call the same collective?)"
                        : " (rank 0 waits for every rank: some rank is missing, slow, or called another collective)");
  }
}

void Star::send_string(int peer, const std::string& s, const std::string& what) {
  uint64_t n = s.size();
  send(peer, &n, sizeof(n), what);
  if (n) send(peer, s.data(), n, what);
}

std::string Star::recv_string(int peer, const std::string& what, size_t max_bytes) {
  uint64_t n = 0;
  recv(peer, &n, sizeof(n), what);
  MG_CHECK(n <= max_bytes, DistributedError, who(), ": ", what, ": rank ", peer, " announced a message of ", n,
           " bytes, at most ", max_bytes, " are allowed (a corrupt stream or not a memgrad peer)");
  std::string s(n, '\0');
  if (n) recv(peer, s.data(), n, what);
  return s;
}

void Star::shutdown() {
  for (auto& p : peers_)
    if (p.valid()) ::shutdown(p.fd(), SHUT_RDWR);
}

void Star::broadcast_bytes(std::string& data, const std::string& what) {
  if (world_ == 1) return;
  if (rank_ == 0) {
    for (int r = 1; r < world_; ++r) send_string(r, data, what);
  } else {
    data = recv_string(0, what);
  }
}

void Star::barrier(const std::string& what) {
  if (world_ == 1) return;
  uint8_t token = 1;
  if (rank_ == 0) {
    for (int r = 1; r < world_; ++r) recv(r, &token, 1, what);
    for (int r = 1; r < world_; ++r) send(r, &token, 1, what);
  } else {
    send(0, &token, 1, what);
    recv(0, &token, 1, what);
  }
}

int free_tcp_port() {
  Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  MG_CHECK(s.valid(), Error, "free_tcp_port: socket() failed: ", std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  MG_CHECK(::bind(s.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0, Error,
           "free_tcp_port: bind failed: ", std::strerror(errno));
  socklen_t len = sizeof(addr);
  getsockname(s.fd(), reinterpret_cast<sockaddr*>(&addr), &len);
  return ntohs(addr.sin_port);
}

}  // namespace mg::dist::detail
