#include "parallel/chained_all_reduce.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

namespace fp8tron {

std::unique_ptr<CommWork> all_reduce_after(std::unique_ptr<CommWork> first, Communicator& first_group, Communicator& group,
                                           torch::Tensor& tensor) {
  if (!tensor.is_cuda()) {
    first_group.wait(*first);
    return group.all_reduce_async(tensor, ReduceOp::Sum);
  }
  // A communicator's operation waits for the current stream's work so far and its handle makes
  // the current stream wait: with a side stream current, the all-reduce follows `first` while the
  // compute stream runs on. A pool stream (low priority; the groups' own streams come from the
  // high-priority pool) that other work shares at most delays that work until `first` is done,
  // work which was issued after this point and so cannot be what `first` waits for. The side
  // stream's wait is no stall of the compute stream: no observer times it.
  c10::cuda::CUDAStreamGuard side(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, tensor.device().index()));
  first->wait();
  return group.all_reduce_async(tensor, ReduceOp::Sum);
}

}  // namespace fp8tron
