// An all-reduce over one group that must follow an operation of another group writing the same
// tensor: the partial distributed optimizer's cross-instance all-reduce of a bucket's shard after
// its reduce-scatter inside the instance (parallel/optimizer_instances.h), issued while backward
// still runs.
#pragma once
#include <torch/torch.h>

#include <memory>

#include "parallel/communicator.h"

namespace fp8tron {

// All-reduces (sums) `tensor` over `group` once `first`, an operation of `first_group`, has
// completed, and returns the handle of the all-reduce: waiting for it waits for both. On the GPU
// nothing on the caller's stream waits: a side stream waits for `first` and the all-reduce is
// issued behind it (Megatron's communication stream). On the CPU (MPI) the host waits for `first`,
// as MPI cannot order operations across groups: through `first_group`'s wait observer, as that
// stall is the caller's.
std::unique_ptr<CommWork> all_reduce_after(std::unique_ptr<CommWork> first, Communicator& first_group, Communicator& group,
                                           torch::Tensor& tensor);

}  // namespace fp8tron
