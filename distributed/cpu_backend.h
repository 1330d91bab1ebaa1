// The CPU backend's wire format over the TCP star (every rank -> rank 0: a header and its input;
// rank 0 -> every rank: a reply and the result). Internal to distributed/; public so tests can
// play a misbehaving peer.
#pragma once

#include <cstdint>

namespace mg::dist::detail {

enum class CpuOp : uint32_t { AllReduce = 1, Broadcast, AllGather, ReduceScatter, Barrier };

struct CpuHeader {
  uint32_t op = 0;
  uint32_t dtype = 0;
  uint64_t seq = 0;
  uint64_t nbytes = 0;  // of the rank's input
  int32_t arg = 0;      // root (broadcast) or ReduceOp
  int32_t pad = 0;
};

struct CpuReply {
  uint32_t status = 0;  // 0 ok (payload = the result), 1 error (payload = the message)
  uint32_t pad = 0;
  uint64_t nbytes = 0;
};

}  // namespace mg::dist::detail
