// The TCP rendezvous and the CPU backend's wire protocol against hostile or broken peers, all in
// one process on loopback: rank 0 (or a real peer) runs in a thread, the attacker is a raw
// socket or a Star speaking the protocol wrongly. Bad hellos must be dropped without ending the
// job, a silent client must not delay real peers, and no announced size may be trusted.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <future>
#include <thread>

#include "distributed/cpu_backend.h"
#include "distributed/process_group.h"
#include "distributed/tcp_rendezvous.h"

namespace mg::dist {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using detail::Hello;
using detail::make_hello;
using detail::Star;

const std::string kToken = "the-job-secret";

ProcessGroupOptions opts(int rank, int world, int port, std::chrono::milliseconds timeout = 20s,
                         const std::string& addr = "127.0.0.1") {
  return {.backend = Backend::Cpu,
          .rank = rank,
          .world_size = world,
          .local_rank = rank,
          .master_addr = addr,
          .master_port = port,
          .token = kToken,
          .timeout = timeout};
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A raw client of rank 0's port (retried until rank 0 listens).
struct RawPeer {
  int fd = -1;
  RawPeer(int port, const std::string& addr = "127.0.0.1") {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, addr.c_str(), &a.sin_addr);
    const auto until = Clock::now() + 10s;
    while (Clock::now() < until) {
      fd = ::socket(AF_INET, SOCK_STREAM, 0);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) return;
      ::close(fd);
      fd = -1;
      std::this_thread::sleep_for(10ms);
    }
  }
  ~RawPeer() {
    if (fd >= 0) ::close(fd);
  }
  void send_bytes(const void* p, size_t n) { ASSERT_EQ(::send(fd, p, n, MSG_NOSIGNAL), static_cast<ssize_t>(n)); }
  void hello(int rank, int world, const std::string& token) {
    Hello h = make_hello(rank, world, token);
    send_bytes(&h, sizeof(h));
  }
  // Rank 0's answer: "" = admitted (the acknowledgement), the refusal text, or "<closed>".
  std::string reply(std::chrono::milliseconds wait = 10s) {
    uint64_t n = 0;
    if (!read_exact(&n, sizeof(n), wait)) return "<closed>";
    std::string s(n, '\0');
    if (n && !read_exact(s.data(), n, wait)) return "<closed>";
    return s;
  }
  bool read_exact(void* p, size_t n, std::chrono::milliseconds wait) {
    char* c = static_cast<char*>(p);
    while (n) {
      pollfd q{fd, POLLIN, 0};
      if (::poll(&q, 1, static_cast<int>(wait.count())) <= 0) return false;
      ssize_t k = ::recv(fd, c, n, 0);
      if (k <= 0) return false;
      c += k;
      n -= static_cast<size_t>(k);
    }
    return true;
  }
};

std::future<std::unique_ptr<Star>> start(const ProcessGroupOptions& o) {
  return std::async(std::launch::async, [o] { return Star::connect(o); });
}

// ---------------- the rendezvous ----------------

TEST(Rendezvous, BadWorldSizeOrRankDoesNotKillRankZero) {
  const int port = detail::free_tcp_port();
  auto r0 = start(opts(0, 2, port));
  for (auto [rank, world] : {std::pair{1, 3}, {5, 2}, {0, 2}, {-1, 2}}) {
    RawPeer bad(port);
    bad.hello(rank, world, kToken);
    const std::string why = bad.reply();  // a peer with the token is told why
    EXPECT_NE(why.find("rendezvous refused by rank 0"), std::string::npos) << why;
    EXPECT_NE(why.find(world != 2 ? "WORLD_SIZE 3" : "outside [1, 2)"), std::string::npos) << why;
  }
  auto r1 = Star::connect(opts(1, 2, port));  // the real rank 1 still gets in
  auto s0 = r0.get();
  ASSERT_TRUE(s0);
  // And the two really talk.
  s0->send_string(1, "hi", "test");
  EXPECT_EQ(r1->recv_string(0, "test"), "hi");
}

TEST(Rendezvous, ForgedHelloWithoutTheTokenIsDropped) {
  const int port = detail::free_tcp_port();
  auto r0 = start(opts(0, 2, port));
  RawPeer forged(port), garbage(port), empty_token(port);
  forged.hello(1, 2, "guessed-secret");
  empty_token.hello(1, 2, "");
  const char junk[sizeof(Hello)] = "GET / HTTP/1.0\r\n\r\n";
  garbage.send_bytes(junk, sizeof(junk));
  EXPECT_NE(forged.reply().find("wrong MG_DIST_TOKEN"), std::string::npos);
  EXPECT_NE(empty_token.reply().find("wrong MG_DIST_TOKEN"), std::string::npos);
  EXPECT_EQ(garbage.reply(), "<closed>");  // not one of ours: closed without a word
  auto r1 = Star::connect(opts(1, 2, port));
  auto s0 = r0.get();
  r1->send_string(0, "from the real rank 1", "test");
  EXPECT_EQ(s0->recv_string(1, "test"), "from the real rank 1");
}

TEST(Rendezvous, SilentClientDoesNotDelayRealPeers) {
  const int port = detail::free_tcp_port();
  const auto t0 = Clock::now();
  auto r0 = start(opts(0, 3, port));
  RawPeer silent(port), half(port);
  Hello h = make_hello(1, 3, kToken);
  half.send_bytes(&h, sizeof(h) / 2);  // and then nothing
  auto r2 = start(opts(2, 3, port));
  auto r1 = Star::connect(opts(1, 3, port));
  r2.get();
  r0.get();
  // A serial accept loop would wait out the silent clients' hello deadlines (10 s each); every
  // connection's hello is read at once, so the job forms as soon as the real peers are in.
  EXPECT_LT(seconds_since(t0), 5.0);
}

TEST(Rendezvous, DuplicateRankIsDropped) {
  const int port = detail::free_tcp_port();
  auto r0 = start(opts(0, 3, port));
  RawPeer first(port), second(port);
  first.hello(1, 3, kToken);
  second.hello(1, 3, kToken);
  std::this_thread::sleep_for(200ms);  // both hellos are in before rank 2 completes the job
  auto r2 = Star::connect(opts(2, 3, port));
  auto s0 = r0.get();
  const std::string a = first.reply(), b = second.reply();
  // Exactly one of them holds rank 1 (the acknowledgement is empty); the other was refused.
  EXPECT_TRUE((a.empty() && b.find("rank 1 is already taken") != std::string::npos) ||
              (b.empty() && a.find("rank 1 is already taken") != std::string::npos))
      << "first: '" << a << "', second: '" << b << "'";
}

TEST(Rendezvous, ListensOnMasterAddrOnly) {
  // 127.0.0.2 is loopback too; a listener on INADDR_ANY would also answer on 127.0.0.1.
  const int port = detail::free_tcp_port();
  auto r0 = start(opts(0, 2, port, 20s, "127.0.0.2"));
  auto r1 = Star::connect(opts(1, 2, port, 20s, "127.0.0.2"));  // waits until rank 0 listens
  r0.get();
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  EXPECT_NE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << "rank 0 listened beyond MASTER_ADDR";
  ::close(fd);
}

TEST(Rendezvous, TimeoutNamesWhatWasDropped) {
  const int port = detail::free_tcp_port();
  auto r0 = start(opts(0, 2, port, 1500ms));
  RawPeer forged(port);
  forged.hello(1, 2, "nope");
  std::string msg;
  try {
    r0.get();
  } catch (const DistributedError& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("waiting for rank(s) 1 of world size 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dropped a connection from 127.0.0.1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("wrong MG_DIST_TOKEN"), std::string::npos) << msg;
}

// ---------------- message sizes ----------------

// Rank 0 and rank 1 as Stars in this process.
std::pair<std::unique_ptr<Star>, std::unique_ptr<Star>> star_pair(std::chrono::milliseconds timeout = 20s) {
  const int port = detail::free_tcp_port();
  auto r0 = start(opts(0, 2, port, timeout));
  auto s1 = Star::connect(opts(1, 2, port, timeout));
  return {r0.get(), std::move(s1)};
}

TEST(StarMessages, HugeAnnouncedLengthIsRefusedBeforeAllocating) {
  auto [s0, s1] = star_pair();
  const uint64_t n = uint64_t{1} << 39;  // 512 GiB: a std::string of it would fail or swap
  s1->send(0, &n, sizeof(n), "test");
  const auto t0 = Clock::now();
  try {
    s0->recv_string(1, "control message");
    FAIL() << "accepted a 2^39-byte message";
  } catch (const DistributedError& e) {
    EXPECT_NE(std::string(e.what()).find("announced a message of 549755813888 bytes, at most 4096"), std::string::npos)
        << e.what();
  }
  EXPECT_LT(seconds_since(t0), 1.0);
}

// A fake rank 0 for a real CPU-backend rank 1: reads rank 1's header and input, then replies
// with `reply` and `payload`. Returns what rank 1's collective raised.
std::string rank1_error_against(detail::CpuReply reply, const std::string& payload,
                                const std::function<void(ProcessGroup&)>& collective) {
  const int port = detail::free_tcp_port();
  auto fake0 = std::async(std::launch::async, [&] {
    auto s0 = Star::connect(opts(0, 2, port));
    detail::CpuHeader h;
    s0->recv(1, &h, sizeof(h), "fake rank 0");
    std::string input(h.nbytes, '\0');
    if (h.nbytes) s0->recv(1, input.data(), h.nbytes, "fake rank 0");
    s0->send(1, &reply, sizeof(reply), "fake rank 0");
    if (!payload.empty()) s0->send(1, payload.data(), payload.size(), "fake rank 0");
    std::this_thread::sleep_for(300ms);  // keep the connection open: the check, not EOF, must fire
    return 0;
  });
  auto pg = init_process_group(opts(1, 2, port));
  std::string msg = "(no error)";
  try {
    collective(*pg);
  } catch (const DistributedError& e) {
    msg = e.what();
  }
  fake0.get();
  return msg;
}

TEST(CpuWire, ReplyOfTheWrongSizeIsRefused) {
  // 13 bytes for three f64: not a multiple of the element size (used to overflow the heap).
  std::string msg = rank1_error_against({0, 0, 13}, std::string(13, 'x'),
                                        [](ProcessGroup& pg) { pg.all_reduce(ones({3}, {DType::f64})); });
  EXPECT_NE(msg.find("all_reduce #1: rank 0 replied with 13 bytes, expected exactly 24"), std::string::npos) << msg;
  // More than the output holds.
  msg = rank1_error_against({0, 0, 4096}, std::string(4096, 'x'), [](ProcessGroup& pg) {
    Tensor out = zeros({2, 4}, {DType::f32});
    pg.all_gather(out, ones({4}, {DType::f32}));
  });
  EXPECT_NE(msg.find("replied with 4096 bytes, expected exactly 32"), std::string::npos) << msg;
  // A barrier carries nothing back.
  msg = rank1_error_against({0, 0, 8}, std::string(8, 'x'), [](ProcessGroup& pg) { pg.barrier(); });
  EXPECT_NE(msg.find("replied with 8 bytes, expected exactly 0"), std::string::npos) << msg;
}

TEST(CpuWire, HugeErrorMessageOrBadStatusIsRefused) {
  std::string msg = rank1_error_against({1, 0, uint64_t{1} << 40}, "",
                                        [](ProcessGroup& pg) { pg.all_reduce(ones({3}, {DType::f64})); });
  EXPECT_NE(msg.find("error message of 1099511627776 bytes, at most 4096"), std::string::npos) << msg;
  msg = rank1_error_against({7, 0, 24}, std::string(24, 'x'),
                            [](ProcessGroup& pg) { pg.all_reduce(ones({3}, {DType::f64})); });
  EXPECT_NE(msg.find("replied with status 7"), std::string::npos) << msg;
}

TEST(CpuWire, RankZeroRefusesAHugeAnnouncedInput) {
  // A fake rank 1 announces 2^40 bytes for the all-reduce: rank 0 compares the header with its
  // own before receiving anything, reports the mismatch to rank 1 and stays bounded.
  const int port = detail::free_tcp_port();
  auto fake1 = std::async(std::launch::async, [&] {
    auto s1 = Star::connect(opts(1, 2, port));
    detail::CpuHeader h;
    h.op = static_cast<uint32_t>(detail::CpuOp::AllReduce);
    h.dtype = static_cast<uint32_t>(DType::f64);
    h.seq = 1;
    h.nbytes = uint64_t{1} << 40;
    s1->send(0, &h, sizeof(h), "fake rank 1");
    detail::CpuReply rep;
    s1->recv(0, &rep, sizeof(rep), "fake rank 1");
    return rep.status;
  });
  auto pg = init_process_group(opts(0, 2, port));
  std::string msg;
  const auto t0 = Clock::now();
  try {
    pg->all_reduce(ones({3}, {DType::f64}));
  } catch (const DistributedError& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("rank 1 passed 1099511627776 bytes of f64"), std::string::npos) << msg;
  EXPECT_LT(seconds_since(t0), 2.0);
  EXPECT_EQ(fake1.get(), 1u) << "rank 1 was told of the error";
  // The group is broken now, and says so at once.
  try {
    pg->all_reduce(ones({3}, {DType::f64}));
    ADD_FAILURE() << "a broken group accepted a collective";
  } catch (const DistributedError& e) {
    EXPECT_NE(std::string(e.what()).find("unusable after an earlier error"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mg::dist
