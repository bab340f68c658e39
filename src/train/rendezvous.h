// The TCP rendezvous of a process group: rank 0 listens on MASTER_PORT, every other rank connects
// to MASTER_ADDR:MASTER_PORT, and the connections stay open for blobs sent between rank 0 and
// each rank (NCCL's unique id; the TCP communicator's collectives). Trainer layer (host code,
// POSIX sockets), private to src/train.
//
// The group is a star: rank 0 holds one connection per other rank, each other rank one
// connection to rank 0. Integers in the handshake and in the blobs' length prefixes are sent in
// the host's byte order (the ranks of a group run the same program on the same kind of machine).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "sciattn/status.h"
#include "sciattn/train/process_group.h"

namespace sciattn::train {

class TcpRendezvous {
 public:
  // Connects the group of `env`: rank 0 listens on env.master_port on every interface and waits
  // until each other rank has connected and said who it is (a duplicate rank, or a peer with
  // another world size, is an error); the other ranks connect to env.master_addr, retrying while
  // rank 0 is not listening yet. Both give up after options.timeout_seconds with a message that
  // names MASTER_ADDR / MASTER_PORT and what was missing. world_size 1 opens nothing.
  static Status open(const ProcessEnv& env, const RendezvousOptions& options,
                     std::unique_ptr<TcpRendezvous>* out);
  ~TcpRendezvous();
  TcpRendezvous(const TcpRendezvous&) = delete;
  TcpRendezvous& operator=(const TcpRendezvous&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }

  // Rank 0 sends *blob to every other rank (length first), which receives it into *blob.
  Status broadcast_blob(std::string* blob);

  // Exactly `bytes` bytes to or from `peer`: rank 0 with any other rank, the others with rank 0
  // only. Blocks until done; a closed connection or a socket error is an error naming the peer.
  Status send(int peer, const void* data, size_t bytes);
  Status recv(int peer, void* data, size_t bytes);

 private:
  TcpRendezvous(int rank, int world_size) : rank_(rank), world_size_(world_size) {}
  int fd(int peer) const;

  int rank_ = 0;
  int world_size_ = 1;
  // Rank 0: the socket of rank q at index q (index 0 unused); other ranks: index 0 is rank 0's.
  std::vector<int> fds_;
};

}  // namespace sciattn::train
