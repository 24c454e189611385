// The storage of a flat buffer emptied and refilled in place, for buffers whose memory comes and
// goes during a step (Megatron-FSDP's units: sharded weights gathered around their use, gradients
// reduced onto their owners). Emptying the StorageImpl rather than dropping the tensor keeps every
// view of the buffer (the parameters, their `.grad`) and every reference autograd saved to them
// pointing at it: they see the bytes again once the storage is refilled.
#pragma once
#include <torch/torch.h>

#include <cstdint>

namespace fp8tron {

// `buffer`'s storage holds `nbytes` fresh (uninitialised) bytes.
inline void refill_storage(torch::Tensor& buffer, int64_t nbytes) {
  c10::StorageImpl* storage = buffer.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(storage->allocator()->allocate(size_t(nbytes)));
  storage->set_nbytes(size_t(nbytes));
}

// `buffer`'s storage holds no memory: reading a view of it faults on the null address.
inline void empty_storage(torch::Tensor& buffer) {
  c10::StorageImpl* storage = buffer.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(c10::DataPtr(nullptr, buffer.device()));
  storage->set_nbytes(0);
}

}  // namespace fp8tron
