// The mixture-of-experts token exchanges as paired autograd functions (as tensor_parallel.h for
// tensor parallelism): each forward collective is differentiated by its partner collective.
// Tensors are rows [n, ...] (tokens); counts are host values, known after the dispatcher's one
// device-to-host copy.
//
//   all_to_all_rows          forward all-to-all-v (send_rows -> recv_rows)    backward: the
//                            reverse all-to-all-v (recv_rows -> send_rows)
//   all_gather_rows_v        forward all-gather-v of rows_per_rank            backward: reduce-scatter-v
//   reduce_scatter_rows_v    forward reduce-scatter-v (sum) of rows_per_rank  backward: all-gather-v
//   gather_rows              forward all-gather of equal row counts           backward: reduce-scatter
//   reduce_scatter_rows      forward reduce-scatter of equal row counts       backward: all-gather
//   all_gather_no_grad       all-gather of equal rows outside autograd (routing maps, counts)
// Groups of one rank return their input (no communication, no autograd node). Under a
// NoGradGuard they are plain collectives of any dtype (the FP8 dispatch moves uint8 rows so).
#pragma once
#include <torch/torch.h>

#include <vector>

#include "parallel/communicator.h"

namespace fp8tron {

// `bytes_to_peers`, when given, receives the bytes this rank's forward exchange hands to the other
// ranks of the group (its own block stays local): the rows sent to each peer times the row's bytes
// in the dtype sent (0 for a group of one).
torch::Tensor all_to_all_rows(const torch::Tensor& x, Communicator& group, const std::vector<int64_t>& send_rows,
                              const std::vector<int64_t>& recv_rows, int64_t* bytes_to_peers = nullptr);
torch::Tensor all_gather_rows_v(const torch::Tensor& x, Communicator& group, const std::vector<int64_t>& rows_per_rank);
torch::Tensor reduce_scatter_rows_v(const torch::Tensor& x, Communicator& group, const std::vector<int64_t>& rows_per_rank);
torch::Tensor gather_rows(const torch::Tensor& x, Communicator& group);
torch::Tensor reduce_scatter_rows(const torch::Tensor& x, Communicator& group);
torch::Tensor all_gather_no_grad(const torch::Tensor& x, Communicator& group);

}  // namespace fp8tron
