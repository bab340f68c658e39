// `sciattn train --nproc-per-node N`: starts N ranks of this program on this machine, as torchrun
// would, and waits for them. Tools layer.
#pragma once

namespace sciattn::tools {

// The variable the launcher sets in its ranks, so that a rank knows it was started here (and not
// by torchrun, srun or mpirun).
inline constexpr const char* kLocalLaunchVariable = "SCIATTN_LOCAL_LAUNCH";

// Runs this program again (/proc/self/exe with /proc/self/cmdline's arguments) as ranks
// 0 .. nproc - 1 with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1,
// MASTER_PORT (a free port) and kLocalLaunchVariable set; the standard output of ranks above 0
// goes to /dev/null (their errors still reach stderr). Waits for all of them. When one fails, the
// others are stopped (SIGTERM, then SIGKILL after a grace period) and its exit status is
// returned (128 + the signal for a rank killed by one); 0 when every rank succeeded. Prints what
// went wrong to stderr.
int launch_local_ranks(int nproc);

}  // namespace sciattn::tools
