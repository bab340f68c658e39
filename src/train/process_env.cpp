// A process's rank, world size, local rank and rank 0's address from the variables that torchrun,
// srun and mpirun set (process_group.h). Trainer layer (host code).
#include <cerrno>
#include <cstdlib>
#include <string>

#include "sciattn/train/process_group.h"

namespace sciattn::train {
namespace {

// The variable names of one launcher's family.
struct Family {
  const char* rank;
  const char* world_size;
  const char* local_rank;
};
constexpr Family kTorchrun = {"RANK", "WORLD_SIZE", "LOCAL_RANK"};
constexpr Family kSlurm = {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"};
constexpr Family kOpenMpi = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                             "OMPI_COMM_WORLD_LOCAL_RANK"};

// Parses a whole decimal integer in [lo, hi], or says which variable holds what.
Status parse_int(const char* name, const char* text, long lo, long hi, int* out) {
  const std::string where = std::string(name) + "=\"" + text + "\"";
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || errno == ERANGE) {
    return Status::invalid_argument(where + " is not a decimal integer");
  }
  if (v < lo || v > hi) {
    return Status::invalid_argument(where + " is out of range: it must be in [" +
                                    std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  *out = static_cast<int>(v);
  return Status::ok_status();
}

}  // namespace

Status parse_process_env(const std::function<const char*(const char*)>& lookup, ProcessEnv* out) {
  ProcessEnv env;
  const Family* family = nullptr;
  for (const Family* f : {&kTorchrun, &kSlurm, &kOpenMpi}) {
    if (lookup(f->rank) != nullptr) {
      family = f;
      break;
    }
  }
  if (family == nullptr) {
    // WORLD_SIZE without RANK is a half-set torchrun environment: say so rather than run alone.
    if (const char* w = lookup(kTorchrun.world_size)) {
      return Status::invalid_argument(std::string("WORLD_SIZE=\"") + w +
                                      "\" is set but RANK is not; set both (or neither)");
    }
    *out = env;
    return Status::ok_status();
  }
  env.source = family->rank;
  constexpr long kMaxRanks = 1 << 20;
  const char* world = lookup(family->world_size);
  if (world == nullptr) {
    return Status::invalid_argument(std::string(family->rank) + "=\"" + lookup(family->rank) +
                                    "\" is set but " + family->world_size + " is not; set both");
  }
  Status s = parse_int(family->world_size, world, 1, kMaxRanks, &env.world_size);
  if (!s.ok()) return s;
  s = parse_int(family->rank, lookup(family->rank), 0, env.world_size - 1, &env.rank);
  if (!s.ok()) return s;
  if (const char* local = lookup(family->local_rank)) {
    s = parse_int(family->local_rank, local, 0, kMaxRanks - 1, &env.local_rank);
    if (!s.ok()) return s;
  }
  if (env.world_size > 1) {
    const char* addr = lookup("MASTER_ADDR");
    const char* port = lookup("MASTER_PORT");
    if (addr == nullptr || *addr == '\0' || port == nullptr) {
      return Status::invalid_argument(
          std::string(family->world_size) + "=" + std::to_string(env.world_size) +
          " needs rank 0's address in MASTER_ADDR and MASTER_PORT (" +
          (addr == nullptr || *addr == '\0' ? "MASTER_ADDR" : "MASTER_PORT") +
          " is not set; torchrun sets both, under srun or mpirun export them in the job script)");
    }
    env.master_addr = addr;
    s = parse_int("MASTER_PORT", port, 1, 65535, &env.master_port);
    if (!s.ok()) return s;
  }
  *out = env;
  return Status::ok_status();
}

Status read_process_env(ProcessEnv* out) {
  return parse_process_env([](const char* name) { return std::getenv(name); }, out);
}

}  // namespace sciattn::train
