// A torch.save file (PyTorch's zip archive: data.pkl, a protocol-2 pickle whose tensors are
// persistent ids naming the entries data/<key>), read without Python: the pickle as a value tree
// (pickle.h) and its tensors materialized on request. Megatron's legacy checkpoints
// (model_optim_rng.pt) are such files, and so is every chunk of a `.distcp` file. Every entry read
// whole is checked against the CRC-32 the archive stores for it (zip_crc.h); a contiguous tensor
// can also be read in ranges (FlatRecord) or as boxes (stored()), for files too large to hold
// whole and for ranks that hold only part of a tensor.
#pragma once
#include <torch/torch.h>

#include <iosfwd>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "checkpoint/megatron/pickle.h"
#include "checkpoint/megatron/stored_tensor.h"
#include "checkpoint/megatron/zip_crc.h"

namespace caffe2::serialize {
class PyTorchStreamReader;
}

namespace fp8tron::checkpoint::megatron {

// The bytes read of a set of FlatRecords and how many they hold in all (a load's account).
struct BytesRead {
  int64_t read = 0, stored = 0;
};

// A flat tensor of a torch.save file read in ranges straight from the file, never whole (the
// distributed optimizer's distrib_optim.pt holds a model-parallel rank's whole optimizer state).
// Its entry's CRC-32 is checked once the ranges read, of it and of the other tensors of the same
// entry (views of one storage), cover the entry, in whatever order (EntryCrcCheck).
class FlatRecord {
 public:
  // The tensor's `numel` elements of `dtype` start `entry_offset` bytes into entry `entry`, whose
  // data starts at byte `entry_data` of file `path`; `check` is the entry's CRC-32 check.
  FlatRecord(std::string path, std::string entry, std::string what, int64_t entry_data, int64_t entry_offset,
             torch::ScalarType dtype, int64_t numel, std::shared_ptr<EntryCrcCheck> check,
             std::shared_ptr<BytesRead> tally);
  int64_t numel() const { return numel_; }
  torch::ScalarType dtype() const { return dtype_; }
  // Elements [offset, offset + n), a contiguous tensor of its own; DamagedCheckpoint naming the file
  // and entry when the file is short or the entry, once read whole, fails its CRC-32.
  torch::Tensor read(int64_t offset, int64_t n) const;
  // `count` blocks of `block` elements, the first at element `first`, each `stride` after the one
  // before, in one tensor of count x block elements (a box of a matrix's columns: one block per row).
  torch::Tensor read_blocks(int64_t first, int64_t block, int64_t stride, int64_t count) const;

 private:
  // Reads bytes [begin, begin + n) of the entry into `to` and counts them towards its CRC-32 check.
  void read_entry_bytes(std::ifstream& file, char* to, int64_t begin, int64_t n) const;

  std::string path_, entry_, what_;
  int64_t entry_data_;    // the file offset of the entry's first byte
  int64_t entry_offset_;  // of the tensor's first element within its entry, in bytes
  torch::ScalarType dtype_;
  int64_t numel_;
  std::shared_ptr<EntryCrcCheck> check_;
  std::shared_ptr<BytesRead> tally_;
};

class TorchArchive {
 public:
  // The archive in file `path`; errors name it.
  explicit TorchArchive(const std::string& path);
  // The archive held in `bytes` (a chunk of a larger file); errors name `source`.
  TorchArchive(std::string bytes, std::string source);
  ~TorchArchive();

  const PyRef& root() const { return root_; }
  const std::string& source() const { return source_; }

  // The tensor `v` rebuilds (torch._utils._rebuild_tensor_v2, _rebuild_parameter or
  // torch._tensor._rebuild_from_type_v2 over a storage), as a contiguous CPU tensor that owns its
  // memory; UserError naming `what` otherwise.
  torch::Tensor tensor(const PyRef& v, const std::string& what) const;
  // The contiguous tensor `v` rebuilds, flat, to be read in ranges (an archive read from a file
  // only); `tally` counts its bytes. UserError naming `what` when it is not one.
  std::shared_ptr<const FlatRecord> flat_record(const PyRef& v, const std::string& what,
                                                std::shared_ptr<BytesRead> tally) const;
  // The tensor `v` rebuilds, its shape and dtype known now, its boxes read from the file when asked
  // (only the bytes of the box; the entry's CRC-32 is checked once the reads of it cover it);
  // a tensor that is not contiguous in its storage is read now. `tally` counts the bytes.
  StoredTensor stored(const PyRef& v, const std::string& what, std::shared_ptr<BytesRead> tally) const;

 private:
  void open();
  // A storage's entry ("data/<key>"), dtype and element count; UserError naming `what` otherwise.
  struct StorageRef {
    std::string record;
    torch::ScalarType dtype;
    int64_t numel;
  };
  StorageRef storage_ref(const PyRef& persistent_id, const std::string& what) const;
  torch::Tensor storage(const PyRef& persistent_id, const std::string& what) const;
  // _rebuild_tensor_v2's (storage, offset, size, stride), after the wrappers around it.
  struct TensorView {
    PyRef storage;
    int64_t offset;
    std::vector<int64_t> size, stride;
  };
  TensorView view_of(const PyRef& v, const std::string& what) const;
  // Its element count where it is contiguous (row-major) in its storage, else -1.
  static int64_t contiguous_numel(const TensorView& view);
  // Entry `record`'s bytes, checked against its stored CRC-32; DamagedCheckpoint naming `what`.
  std::pair<at::DataPtr, size_t> record(const std::string& record, const std::string& what) const;

  std::string source_;
  std::string bytes_;
  std::unique_ptr<std::istream> stream_;
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader_;
  std::map<std::string, uint32_t> crcs_;  // by entry name ("data.pkl", "data/0")
  // The CRC-32 checks of the entries read in ranges, shared by the tensors of each.
  mutable std::map<std::string, std::shared_ptr<EntryCrcCheck>> entry_checks_;
  PyRef root_;
};

}  // namespace fp8tron::checkpoint::megatron
