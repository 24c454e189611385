// An optimizer state stored in fp16 or FP8 (E4M3) with one fp32 scale per parameter, as
// Transformer Engine's FusedAdam keeps its states for Megatron's --use-precision-aware-optimizer:
// Adam's moments (--exp-avg-dtype / --exp-avg-sq-dtype fp16 and fp8) and the main weights
// (--main-params-dtype fp16). The update reads a parameter's state back to fp32, steps in fp32 and
// stores it again with a scale chosen from the new values' absolute maximum, so each parameter's
// largest value lands on the top of the storage type's range:
//  - fp16: scale = amax / 32752 (half of fp16's largest finite value, TE's headroom); stored
//    values are v x (1 / scale) rounded to nearest-even, read back as stored x scale;
//  - fp8: stored values are v x (1 / scale) with scale = amax / 448, rounded to nearest-even and
//    saturated to +-448 (E4M3's finite range), read back as stored x (1 / (1 / scale)), the
//    dequantization factor TE's Float8Tensor keeps.
// A parameter whose values are all zero stores zeros and reads back zeros (TE's FP8 path would
// multiply 0 by an infinite scale there).
// "Parameter" means this rank's part of it: with the distributed optimizer the part inside the
// rank's shard, as Megatron hands FusedAdam its shards.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "core/config/training_config.h"
#include "optim/scaled_adamw_kernels.h"

namespace fp8tron {

class ScaledState {
 public:
  // Whether states of `dtype` are stored scaled per parameter (fp16, fp8).
  static bool scaled(StateDtype dtype) { return dtype == StateDtype::Fp16 || dtype == StateDtype::Fp8; }

  // `pieces`: each parameter's (offset, numel) in the moment's elements, ascending and disjoint;
  // elements outside every piece (padding) stay zero. All values start at zero.
  ScaledState(StateDtype dtype, int64_t numel, std::vector<std::pair<int64_t, int64_t>> pieces,
               const torch::TensorOptions& device);

  const torch::Tensor& stored() const { return stored_; }  // fp16 or float8_e4m3fn
  const std::vector<std::pair<int64_t, int64_t>>& pieces() const { return pieces_; }

  // Pieces [first, second), adjacent: read and stored together, a handful of device operations for
  // the group whatever its number of parameters.
  using Group = std::pair<size_t, size_t>;
  // [first, last) cut into groups of adjacent pieces of at most `max_elements` elements (a larger
  // piece is a group of its own).
  std::vector<Group> groups(size_t first, size_t last, int64_t max_elements) const;
  int64_t begin(const Group& g) const { return pieces_[g.first].first; }
  int64_t numel(const Group& g) const;
  // The group's values in fp32 (a new tensor of numel(g) elements).
  torch::Tensor unscaled(const Group& g) const;
  // Elements [offset, offset + numel) in fp32 on the state's device, read back as stored (zeros
  // outside the pieces); one device operation per piece it touches.
  torch::Tensor unscaled_range(int64_t offset, int64_t numel) const;
  // Stores `values` (fp32, numel(g) elements) with a new scale per piece from its absolute maximum;
  // where `skip` (a 0-dim device tensor, optional) is nonzero, keeps the stored values and scales
  // instead. Never waits for the device.
  void store(const Group& g, const torch::Tensor& values, const torch::Tensor& skip = {});
  // The whole moment in fp32 on `device` (zeros outside the pieces), one piece at a time on the
  // moment's own device, for checkpoints; and the reverse, every piece rescaled. A piece's values
  // read back as stored, except that those stored at its largest magnitude read back as the
  // absolute maximum its scale came from: storing the copy again then chooses the same scales
  // and the same stored values (an exact resume), where values read back as stored would move a
  // scale by a rounding in one piece of ten for FP8.
  torch::Tensor unscaled_copy(const torch::Device& device) const;
  void store_all(const torch::Tensor& values);

  // For the fused step (optim/scaled_adamw_kernels.h), on a CUDA device: the buffers, with the
  // scratch maxima of pieces [first, last) zeroed; and those pieces cut into chunks of at most
  // 64K elements (int64 [chunks, 3]: begin, end, piece; cached).
  kernels::StateBuffers kernel_buffers(size_t first, size_t last);
  const torch::Tensor& kernel_chunks(size_t first, size_t last) const;

 private:
  // Per piece of `g`, a value for each of its elements (one piece: the 0-dim value itself).
  torch::Tensor per_element(const Group& g, const torch::Tensor& per_piece) const;
  const torch::Tensor& lengths(const Group& g) const;  // the pieces' sizes, int64 on the device
  torch::Tensor checkpoint_values(size_t i) const;     // see unscaled_copy

  StateDtype dtype_;
  torch::Tensor stored_;
  std::vector<std::pair<int64_t, int64_t>> pieces_;
  torch::Tensor factors_;  // fp32 [pieces]: what a stored value is multiplied by when read
  torch::Tensor amaxes_;   // fp32 [pieces]: the absolute maximum each piece's scale came from
  mutable std::map<Group, torch::Tensor> lengths_;  // by group: its pieces' sizes on the device
  torch::Tensor new_amaxes_;                        // the fused step's scratch, fp32 [pieces]
  mutable std::map<Group, torch::Tensor> chunks_;   // kernel_chunks(), by piece range
};

}  // namespace fp8tron
