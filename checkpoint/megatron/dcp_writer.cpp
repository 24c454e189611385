#include "checkpoint/megatron/dcp_writer.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "checkpoint/megatron/pickle_writer.h"
#include "checkpoint/megatron/torch_save_writer.h"
#include "core/error.h"
#include "core/text.h"

namespace fp8tron::checkpoint::megatron {
namespace {

constexpr const char* kDcp = "torch.distributed.checkpoint.metadata";

std::string int_list(const std::vector<int64_t>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out;
}

std::vector<int64_t> parse_int_list(const std::string& text) {
  std::vector<int64_t> out;
  std::istringstream in(text);
  for (std::string part; std::getline(in, part, ',');) out.push_back(std::stoll(part));
  return out;
}

const char* dtype_name(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat32: return "float32";
    case torch::kBFloat16: return "bfloat16";
    case torch::kFloat16: return "float16";
    case torch::kFloat64: return "float64";
    case torch::kInt64: return "int64";
    case torch::kInt32: return "int32";
    case torch::kUInt8: return "uint8";
    default: break;
  }
  throw UserError(std::string("saving a tensor of dtype ") + c10::toString(t) + " in a distributed checkpoint");
}

// One line of a rank's entries: what it wrote and where.
struct Entry {
  bool tensor = false;
  std::string fqn, file, dtype;
  int64_t offset = 0, length = 0;
  std::vector<int64_t> shape, offsets, sizes;  // tensors only
};

std::string format_entry(const Entry& e) {
  return std::string(e.tensor ? "T" : "O") + "\t" + e.fqn + "\t" + e.file + "\t" + std::to_string(e.offset) + "\t" +
         std::to_string(e.length) + "\t" + e.dtype + "\t" + int_list(e.shape) + "\t" + int_list(e.offsets) + "\t" +
         int_list(e.sizes) + "\n";
}

Entry parse_entry(const std::string& line) {
  std::vector<std::string> f;
  std::istringstream in(line);
  for (std::string part; std::getline(in, part, '\t');) f.push_back(part);
  while (f.size() < 9) f.emplace_back();  // trailing empty fields (objects, scalars)
  FP8TRON_CHECK(f[0] == "T" || f[0] == "O", "malformed distributed-checkpoint entry");
  Entry e;
  e.tensor = f[0] == "T";
  e.fqn = f[1], e.file = f[2], e.offset = std::stoll(f[3]), e.length = std::stoll(f[4]), e.dtype = f[5];
  e.shape = parse_int_list(f[6]), e.offsets = parse_int_list(f[7]), e.sizes = parse_int_list(f[8]);
  return e;
}

PyRef torch_size(const std::vector<int64_t>& v) { return py_call(py_global("torch", "Size"), {py_int_tuple(v)}); }

// TensorProperties pickles its state as (dtype, layout, requires_grad, memory_format, pin_memory).
PyRef tensor_properties(const std::string& dtype) {
  const PyRef layout = py_call(py_global("torch.serialization", "_get_layout"), {py_str("torch.strided")});
  const PyRef memory_format = py_call(py_global(kDcp, "_MEM_FORMAT_ENCODING"), {py_int(0)});  // contiguous
  return py_object(py_global(kDcp, "TensorProperties"),
                   py_tuple({py_global("torch", dtype), layout, py_bool(false), memory_format, py_bool(false)}));
}

PyRef metadata_index(const Entry& e) {
  std::vector<std::pair<std::string, PyRef>> state = {{"fqn", py_str(e.fqn)}};
  if (e.tensor) state.emplace_back("offset", torch_size(e.offsets));
  state.emplace_back("index", py_none());
  return py_object(py_global(kDcp, "MetadataIndex"), py_dict(std::move(state)));
}

PyRef storage_info(const Entry& e) {
  return py_object(py_global("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
                   py_dict({{"relative_path", py_str(e.file)}, {"offset", py_int(e.offset)}, {"length", py_int(e.length)}}));
}

// A random id, as PyTorch records one per save (uuid4's text form).
std::string save_id() {
  std::random_device rd;
  std::mt19937_64 gen((uint64_t(rd()) << 32) ^ rd());
  std::string hex;
  for (int i = 0; i < 32; ++i) hex += "0123456789abcdef"[gen() % 16];
  hex[12] = '4';
  return hex.substr(0, 8) + "-" + hex.substr(8, 4) + "-" + hex.substr(12, 4) + "-" + hex.substr(16, 4) + "-" + hex.substr(20);
}

void check_coverage(const std::string& fqn, const std::vector<int64_t>& shape, const std::vector<Entry>& chunks) {
  int64_t total = 1, covered = 0;
  for (int64_t d : shape) total *= d;
  for (const Entry& c : chunks) {
    int64_t n = 1;
    for (size_t d = 0; d < c.sizes.size(); ++d) {
      FP8TRON_CHECK(c.offsets[d] >= 0 && c.offsets[d] + c.sizes[d] <= shape[d], "a chunk of " + fqn + " lies outside the tensor");
      n *= c.sizes[d];
    }
    covered += n;
  }
  FP8TRON_CHECK(covered == total, strprintf("the chunks written of %s cover %lld of its %lld elements", fqn.c_str(),
                                           (long long)covered, (long long)total));
}

}  // namespace

std::string write_dcp_file(const std::string& dir, int rank, const std::vector<DcpObjectToWrite>& objects,
                           const std::vector<DcpChunkToWrite>& chunks) {
  const std::string file = "__" + std::to_string(rank) + "_0.distcp";
  const std::string path = dir + "/" + file;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw UserError(path + ": cannot be created (" + std::strerror(errno) + "); check --save");
  std::string entries;
  int64_t at = 0;
  auto put = [&](const std::string& bytes, Entry e) {
    out.write(bytes.data(), std::streamsize(bytes.size()));
    e.file = file, e.offset = at, e.length = int64_t(bytes.size());
    at += e.length;
    entries += format_entry(e);
  };
  for (const auto& o : objects) {
    Entry e;
    e.fqn = o.fqn;
    put(o.bytes, e);
  }
  for (const auto& c : chunks) {
    Entry e;
    e.tensor = true;
    e.fqn = c.fqn, e.dtype = dtype_name(c.data.scalar_type());
    e.shape = c.global_shape, e.offsets = c.offsets, e.sizes = c.data.sizes().vec();
    FP8TRON_CHECK(e.sizes.size() == e.shape.size() && e.offsets.size() == e.shape.size(),
                  "a chunk of " + c.fqn + " has another rank than its tensor");
    put(torch_save_tensor(c.data), e);
  }
  out.flush();
  if (!out) throw UserError(path + ": writing failed (" + std::strerror(errno) + "); is the disk full?");
  return entries;
}

void write_dcp_metadata(const std::string& dir, const std::vector<std::string>& rank_entries,
                        const std::string& checkpoint_id) {
  // Items by name, in the order the ranks wrote them.
  std::vector<std::string> order;
  std::map<std::string, std::vector<Entry>> by_name;
  for (const std::string& text : rank_entries) {
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      if (line.empty()) continue;
      Entry e = parse_entry(line);
      auto& list = by_name[e.fqn];
      if (list.empty()) order.push_back(e.fqn);
      if (!list.empty() && (!e.tensor || !list[0].tensor || e.dtype != list[0].dtype || e.shape != list[0].shape))
        throw UserError("saving " + e.fqn + " in a distributed checkpoint: two ranks wrote it differently");
      list.push_back(std::move(e));
    }
  }
  auto state_dict_metadata = py_dict({});
  auto storage_data = py_dict({});
  for (const std::string& fqn : order) {
    const std::vector<Entry>& list = by_name[fqn];
    for (const Entry& e : list) storage_data->entries.emplace_back(metadata_index(e), storage_info(e));
    if (!list[0].tensor) {
      state_dict_metadata->entries.emplace_back(py_str(fqn), py_object(py_global(kDcp, "BytesStorageMetadata"), nullptr));
      continue;
    }
    check_coverage(fqn, list[0].shape, list);
    std::vector<PyRef> chunks;
    for (const Entry& e : list)
      chunks.push_back(py_object(py_global(kDcp, "ChunkStorageMetadata"),
                                 py_dict({{"offsets", torch_size(e.offsets)}, {"sizes", torch_size(e.sizes)}})));
    state_dict_metadata->entries.emplace_back(
        py_str(fqn), py_object(py_global(kDcp, "TensorStorageMetadata"),
                               py_dict({{"properties", tensor_properties(list[0].dtype)},
                                        {"size", torch_size(list[0].shape)},
                                        {"chunks", py_list(std::move(chunks))}})));
  }
  const PyRef storage_meta = py_object(py_global(kDcp, "StorageMeta"),
                                       py_dict({{"checkpoint_id", py_str(checkpoint_id)}, {"save_id", py_str(save_id())},
                                                {"load_id", py_none()}, {"modules", py_list({})}}));
  const PyRef metadata = py_object(py_global(kDcp, "Metadata"),
                                   py_dict({{"state_dict_metadata", state_dict_metadata}, {"planner_data", py_none()},
                                            {"storage_data", storage_data}, {"storage_meta", storage_meta},
                                            {"version", py_str("1.0.0")}}));
  const std::string bytes = write_pickle(metadata);
  const std::string path = dir + "/.metadata";
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  out.flush();
  if (!out) throw UserError(path + ": writing failed (" + std::strerror(errno) + "); is the disk full?");
}

}  // namespace fp8tron::checkpoint::megatron
