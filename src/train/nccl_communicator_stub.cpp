// The NCCL communicator's entry points in a build without NCCL (SCIATTN_WITH_NCCL off or NCCL not
// found): they say so and how to get a build that has it. Trainer layer (host code).
#include "sciattn/train/process_group.h"

namespace sciattn::train {

bool nccl_available() {
  return false;
}

Status make_nccl_communicator(const ProcessEnv& env, int, Stream, const RendezvousOptions&,
                              std::unique_ptr<Communicator>*) {
  return Status::not_supported(
      "training on " + std::to_string(env.world_size) +
      " GPU ranks needs NCCL, and this build has none: configure a CUDA build (the cuda or gpu "
      "preset) where NCCL is found (pip install nvidia-nccl-cu13 puts it in site-packages/nvidia/"
      "nccl, which CMake looks in; or -DNCCL_ROOT=<folder with include/nccl.h and "
      "lib/libnccl.so*>), "
      "with -DSCIATTN_WITH_NCCL=ON to make a missing NCCL an error; or train on the CPU "
      "(--device cpu)");
}

}  // namespace sciattn::train
