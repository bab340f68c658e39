// The TCP rendezvous of a process group (rendezvous.h) and pick_free_tcp_port. Trainer layer
// (host code, POSIX sockets).
#include "train/rendezvous.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>

namespace sciattn::train {
namespace {

using Clock = std::chrono::steady_clock;

// The first bytes each connecting rank sends, then its rank and world size (int32 each); rank 0
// answers with the same magic and an int32 0 (accepted) or 1 (refused, and closes).
constexpr char kHello[8] = {'S', 'C', 'I', 'A', 'R', 'D', 'V', '1'};
constexpr int64_t kHelloBytes = sizeof kHello + 2 * sizeof(int32_t);
// How long a connecting rank waits between attempts while rank 0 is not listening yet.
constexpr auto kRetryPause = std::chrono::milliseconds(100);

std::string errno_text(int err) {
  return std::strerror(err);
}

std::string where(const ProcessEnv& env) {
  return "MASTER_ADDR=" + env.master_addr + " MASTER_PORT=" + std::to_string(env.master_port);
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// Milliseconds left until `deadline` (0 when past), for poll().
int ms_left(Clock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
}

// Sends or receives exactly `bytes`, retrying on EINTR; with a deadline, poll()s before each
// piece and fails when it passes. Returns "" on success, else what went wrong.
std::string transfer(int fd, void* data, size_t bytes, bool sending,
                     const Clock::time_point* deadline) {
  auto* p = static_cast<unsigned char*>(data);
  while (bytes > 0) {
    if (deadline != nullptr) {
      pollfd pfd{fd, static_cast<short>(sending ? POLLOUT : POLLIN), 0};
      const int ready = ::poll(&pfd, 1, ms_left(*deadline));
      if (ready == 0) return "timed out";
      if (ready < 0 && errno != EINTR) return errno_text(errno);
      if (ready < 0) continue;
    }
    const ssize_t n = sending ? ::send(fd, p, bytes, MSG_NOSIGNAL) : ::recv(fd, p, bytes, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_text(errno);
    if (n == 0) return "the connection was closed (did that process fail or exit?)";
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return "";
}

void set_nodelay(int fd) {
  // Collectives send small messages and wait for the answer: no Nagle delay.
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// Rank 0's listening socket on every interface (IPv6 with IPv4 mapped where the host has IPv6,
// else IPv4), or an error naming the port.
Status listen_on(const ProcessEnv& env, int backlog, int* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* list = nullptr;
  const std::string port = std::to_string(env.master_port);
  if (int rc = ::getaddrinfo(nullptr, port.c_str(), &hints, &list); rc != 0) {
    return Status::invalid_argument("rank 0 cannot listen on MASTER_PORT=" + port + ": " +
                                    ::gai_strerror(rc));
  }
  std::string last = "no address to listen on";
  int fd = -1;
  for (addrinfo* a = list; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last = errno_text(errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (a->ai_family == AF_INET6) {
      int zero = 0;
      ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    }
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, backlog) != 0) {
      last = errno_text(errno);
      close_fd(fd);
    }
  }
  ::freeaddrinfo(list);
  if (fd < 0) {
    return Status::invalid_argument("rank 0 cannot listen on MASTER_PORT=" + port + ": " + last +
                                    " (choose another port, or end the program that holds it)");
  }
  *out = fd;
  return Status::ok_status();
}

// One attempt to connect to rank 0: a connected socket, or -1 and the reason in *why.
int try_connect(const ProcessEnv& env, std::string* why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  const std::string port = std::to_string(env.master_port);
  if (int rc = ::getaddrinfo(env.master_addr.c_str(), port.c_str(), &hints, &list); rc != 0) {
    *why = std::string("cannot resolve MASTER_ADDR: ") + ::gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  for (addrinfo* a = list; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      *why = errno_text(errno);
      continue;
    }
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      *why = errno_text(errno);
      close_fd(fd);
    }
  }
  ::freeaddrinfo(list);
  return fd;
}

}  // namespace

TcpRendezvous::~TcpRendezvous() {
  for (int& fd : fds_) close_fd(fd);
}

int TcpRendezvous::fd(int peer) const {
  if (rank_ == 0) {
    return peer > 0 && peer < world_size_ ? fds_[static_cast<size_t>(peer)] : -1;
  }
  return peer == 0 ? fds_[0] : -1;
}

Status TcpRendezvous::open(const ProcessEnv& env, const RendezvousOptions& options,
                           std::unique_ptr<TcpRendezvous>* out) {
  if (env.world_size < 1 || env.rank < 0 || env.rank >= env.world_size) {
    return Status::invalid_argument("the rendezvous needs 0 <= rank < world_size; got rank " +
                                    std::to_string(env.rank) + " of " +
                                    std::to_string(env.world_size));
  }
  std::unique_ptr<TcpRendezvous> r(new TcpRendezvous(env.rank, env.world_size));
  if (env.world_size == 1) {
    *out = std::move(r);
    return Status::ok_status();
  }
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(std::max(0.0, options.timeout_seconds)));
  const std::string timeout = std::to_string(static_cast<int64_t>(options.timeout_seconds)) + " s";
  const int32_t world32 = env.world_size;

  if (env.rank == 0) {
    r->fds_.assign(static_cast<size_t>(env.world_size), -1);
    int listener = -1;
    Status s = listen_on(env, env.world_size, &listener);
    if (!s.ok()) return s;
    int connected = 0;
    std::string problem;
    while (connected < env.world_size - 1 && problem.empty()) {
      pollfd pfd{listener, POLLIN, 0};
      const int ready = ::poll(&pfd, 1, ms_left(deadline));
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) {
        std::string missing;
        for (int q = 1; q < env.world_size; ++q) {
          if (r->fds_[static_cast<size_t>(q)] < 0) missing += " " + std::to_string(q);
        }
        problem = ready == 0 ? "rank 0 waited " + timeout + " on " + where(env) + ": " +
                                   std::to_string(connected) + " of " +
                                   std::to_string(env.world_size - 1) +
                                   " other ranks connected (missing:" + missing + ")"
                             : "rank 0's wait for connections failed: " + errno_text(errno);
        break;
      }
      int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;  // the peer gave up already; it will try again
      char magic[sizeof kHello];
      int32_t peer_rank = -1, peer_world = -1;
      std::string err = transfer(fd, magic, sizeof magic, false, &deadline);
      if (err.empty()) err = transfer(fd, &peer_rank, sizeof peer_rank, false, &deadline);
      if (err.empty()) err = transfer(fd, &peer_world, sizeof peer_world, false, &deadline);
      if (!err.empty() || std::memcmp(magic, kHello, sizeof kHello) != 0) {
        // Not one of ours (a port scanner, another program): ignore it.
        close_fd(fd);
        continue;
      }
      int32_t verdict = 0;
      if (peer_world != world32) {
        problem = "rank " + std::to_string(peer_rank) + " connected to " + where(env) +
                  " with world size " + std::to_string(peer_world) + ", rank 0 has " +
                  std::to_string(env.world_size) + " (two jobs on one port?)";
      } else if (peer_rank < 1 || peer_rank >= env.world_size) {
        problem = "a process with rank " + std::to_string(peer_rank) + " connected to " +
                  where(env) + "; ranks other than 0 must be in [1, " +
                  std::to_string(env.world_size) + ")";
      } else if (r->fds_[static_cast<size_t>(peer_rank)] >= 0) {
        problem = "two processes connected to " + where(env) + " as rank " +
                  std::to_string(peer_rank) + " (check RANK of each process)";
      }
      verdict = problem.empty() ? 0 : 1;
      err = transfer(fd, const_cast<char*>(kHello), sizeof kHello, true, &deadline);
      if (err.empty()) err = transfer(fd, &verdict, sizeof verdict, true, &deadline);
      if (!problem.empty() || !err.empty()) {
        close_fd(fd);
        continue;
      }
      set_nodelay(fd);
      r->fds_[static_cast<size_t>(peer_rank)] = fd;
      ++connected;
    }
    close_fd(listener);
    if (!problem.empty()) return Status::invalid_argument(problem);
  } else {
    // Rank 0 may start later, or still be busy: retry until the deadline.
    int fd = -1;
    std::string why;
    for (;;) {
      fd = try_connect(env, &why);
      if (fd >= 0) {
        const int32_t me = env.rank;
        char magic[sizeof kHello];
        int32_t verdict = 1;
        std::string err = transfer(fd, const_cast<char*>(kHello), sizeof kHello, true, &deadline);
        if (err.empty()) err = transfer(fd, const_cast<int32_t*>(&me), sizeof me, true, &deadline);
        if (err.empty()) err = transfer(fd, const_cast<int32_t*>(&world32), 4, true, &deadline);
        if (err.empty()) err = transfer(fd, magic, sizeof magic, false, &deadline);
        if (err.empty()) err = transfer(fd, &verdict, sizeof verdict, false, &deadline);
        if (err.empty() && std::memcmp(magic, kHello, sizeof kHello) == 0 && verdict == 0) break;
        close_fd(fd);
        if (err.empty()) {
          return Status::invalid_argument(
              "rank 0 at " + where(env) + " refused rank " + std::to_string(env.rank) + " of " +
              std::to_string(env.world_size) + " (its error message says why)");
        }
        why = "the handshake failed: " + err;
      }
      if (Clock::now() + kRetryPause >= deadline) {
        return Status::invalid_argument(
            "rank " + std::to_string(env.rank) + " could not reach rank 0 at " + where(env) +
            " within " + timeout + ": " + why +
            " (is rank 0 running, and is that address and port reachable from this node?)");
      }
      std::this_thread::sleep_for(kRetryPause);
    }
    set_nodelay(fd);
    r->fds_.assign(1, fd);
  }
  static_assert(kHelloBytes == 16, "the hello is 16 bytes");
  *out = std::move(r);
  return Status::ok_status();
}

Status TcpRendezvous::send(int peer, const void* data, size_t bytes) {
  const int f = fd(peer);
  if (f < 0) {
    return Status::invalid_argument("rank " + std::to_string(rank_) +
                                    " has no connection to rank " + std::to_string(peer));
  }
  std::string err = transfer(f, const_cast<void*>(data), bytes, true, nullptr);
  if (err.empty()) return Status::ok_status();
  return Status(StatusCode::kInternal, "rank " + std::to_string(rank_) +
                                           " could not send to rank " + std::to_string(peer) +
                                           ": " + err);
}

Status TcpRendezvous::recv(int peer, void* data, size_t bytes) {
  const int f = fd(peer);
  if (f < 0) {
    return Status::invalid_argument("rank " + std::to_string(rank_) +
                                    " has no connection to rank " + std::to_string(peer));
  }
  std::string err = transfer(f, data, bytes, false, nullptr);
  if (err.empty()) return Status::ok_status();
  return Status(StatusCode::kInternal, "rank " + std::to_string(rank_) +
                                           " could not receive from rank " + std::to_string(peer) +
                                           ": " + err);
}

Status TcpRendezvous::broadcast_blob(std::string* blob) {
  if (rank_ == 0) {
    const uint64_t n = blob->size();
    for (int q = 1; q < world_size_; ++q) {
      Status s = send(q, &n, sizeof n);
      if (s.ok() && n > 0) s = send(q, blob->data(), n);
      if (!s.ok()) return s;
    }
    return Status::ok_status();
  }
  uint64_t n = 0;
  Status s = recv(0, &n, sizeof n);
  if (!s.ok()) return s;
  // A blob is an id or a small message; a huge length means a stray connection.
  constexpr uint64_t kMaxBlob = uint64_t{1} << 30;
  if (n > kMaxBlob) {
    return Status(StatusCode::kInternal, "rank 0 announced a blob of " + std::to_string(n) +
                                             " bytes (the stream is out "
                                             "of step)");
  }
  blob->assign(static_cast<size_t>(n), '\0');
  return n > 0 ? recv(0, blob->data(), static_cast<size_t>(n)) : Status::ok_status();
}

Status pick_free_tcp_port(int* port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status(StatusCode::kInternal, "socket(): " + errno_text(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    close_fd(fd);
    return Status(StatusCode::kInternal, "no free TCP port on 127.0.0.1: " + errno_text(err));
  }
  *port = ntohs(addr.sin_port);
  close_fd(fd);
  return Status::ok_status();
}

}  // namespace sciattn::train
