// Training with one process per rank: where a process learns its rank (the environment that
// torchrun, srun and mpirun set), and the communicators that join the processes of a group (NCCL
// on GPUs; TCP on the CPU, for tests). Public API of the trainer (plain C++17).
//
// Launch: every process of the group is started with the same program and arguments and finds
// its place from the environment (read_process_env). Rank 0 listens on MASTER_ADDR:MASTER_PORT
// (TCP); every other rank connects to it. The NCCL communicator sends its unique id over that
// connection and then talks only through NCCL; the TCP communicator keeps the connections and
// runs every collective through rank 0.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "sciattn/device.h"
#include "sciattn/status.h"
#include "sciattn/train/communicator.h"

namespace sciattn::train {

// One process's place in the group.
struct ProcessEnv {
  int rank = 0;             // [0, world_size)
  int world_size = 1;       // processes in the group
  int local_rank = 0;       // index among the processes of this node: the CUDA device it uses
  std::string master_addr;  // rank 0's host name or address (needed when world_size > 1)
  int master_port = 0;      // rank 0's TCP port, [1, 65535] (needed when world_size > 1)
  // Which family of variables gave the rank: "RANK" (torchrun, the --nproc-per-node launcher),
  // "SLURM_PROCID" (srun), "OMPI_COMM_WORLD_RANK" (Open MPI's mpirun), or "" (none set: one
  // process alone).
  std::string source;
};

// Reads the place from `lookup` (getenv's contract: null when a variable is not set). Precedence:
//   1. RANK and WORLD_SIZE (torchrun's), LOCAL_RANK (default 0);
//   2. without RANK: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (srun's);
//   3. without those: OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK;
//   4. none of them: rank 0 of 1.
// MASTER_ADDR and MASTER_PORT are always those two variables (srun and mpirun do not set them:
// export them in the job script); they are required when the world size is above 1. A family
// must be complete (a rank without its world size is an error), values must be decimal integers
// in range, and each error names the variable and its value.
Status parse_process_env(const std::function<const char*(const char*)>& lookup, ProcessEnv* out);
// parse_process_env over this process's environment (std::getenv).
Status read_process_env(ProcessEnv* out);

struct RendezvousOptions {
  // How long rank 0 waits for every rank to connect, and each other rank keeps retrying to
  // connect (rank 0 may start later), in seconds.
  double timeout_seconds = 300.0;
};

// A TCP port on this machine that nobody listened on a moment ago (the kernel's choice for port 0,
// released again): for a launcher that starts rank 0 of a local group. Another program may take
// it in between; rank 0's listen then fails naming the port.
Status pick_free_tcp_port(int* port);

// The communicator of this process's group on the CPU: host buffers, each process one rank,
// every collective sent to rank 0 over TCP, computed there in rank order (the same bits as
// ThreadCommunicator) and sent back. A test back end for the multi-process paths (the launcher,
// the rendezvous, a trainer per process); rank 0 carries all the traffic, so it is not a back
// end for speed. world_size 1 gives a communicator that needs no connection.
Status make_tcp_communicator(const ProcessEnv& env, const RendezvousOptions& options,
                             std::unique_ptr<Communicator>* out);

// Whether this build has the NCCL communicator (SCIATTN_WITH_NCCL).
bool nccl_available();

// The communicator of this process's group on CUDA device `device` over NCCL: buffers are
// device memory of that device, and the work is queued on `stream` (the trainer's CUDA stream,
// CudaBackend::stream(); a null handle is the legacy default stream). Makes `device` current,
// exchanges NCCL's unique id through the rendezvous and creates the NCCL communicator (a
// collective: every rank of the group calls it). kNotSupported in a build without NCCL, with
// what to do about it; kDeviceError (naming the NCCL call and NCCL's message) when NCCL fails.
Status make_nccl_communicator(const ProcessEnv& env, int device, Stream stream,
                              const RendezvousOptions& options, std::unique_ptr<Communicator>* out);

}  // namespace sciattn::train
