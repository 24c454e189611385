// Muon's update direction (Emerging-Optimizers' newton_schulz and get_muon_scale_factor, Megatron's
// TensorParallelMuon.orthogonalize): the momentum matrix orthogonalised by a few Newton-Schulz
// steps, scaled by its shape. Tensor-parallel weights (--muon-tp-mode duplicated or distributed,
// the same result) are orthogonalised whole: the shards are gathered, and since the iteration
// commutes with row and column permutations the gathered order does not matter; blockwise
// orthogonalises each shard on its own with its own shape. The fused QKV weight is split into its
// query, key and value rows first (unless --muon-no-split-qkv).
#pragma once
#include <torch/torch.h>

#include "core/config/training_config.h"
#include "parallel/communicator.h"
#include "parallel/sharding.h"

namespace fp8tron {

// Newton-Schulz on a 2-D fp32 matrix: transposed to the wide side, normalised by its Frobenius
// norm (eps 1e-15), `steps` iterations X <- aX + (bA + cA^2)X with A = XX^T, coefficients of
// `coefficients` (quintic, simple, polar_express, cans, aol); in bf16 when `bf16` (Megatron's
// default --muon-fp32-matmul-prec medium), else fp32. Returns fp32.
torch::Tensor newton_schulz(const torch::Tensor& x, int64_t steps, const std::string& coefficients, bool bf16);

// Emerging-Optimizers' get_muon_scale_factor.
double muon_scale_factor(int64_t out, int64_t in, const std::string& mode);

struct MuonParam {
  ParamInfo info;
  bool qkv = false;                // split into Q, K, V rows
  std::vector<int64_t> qkv_rows;   // rows of Q, K, V per query group
};

// The scaled orthogonalised update of one parameter shard from its momentum direction `u` (this
// rank's tensor-parallel shard, fp32). Every rank of the tensor-parallel group calls it together.
torch::Tensor muon_update(const torch::Tensor& u, const MuonParam& param, const MuonConfig& config, Communicator& tp);

}  // namespace fp8tron
