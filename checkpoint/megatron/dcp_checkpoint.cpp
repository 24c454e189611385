#include "checkpoint/megatron/dcp_checkpoint.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>

#include "checkpoint/megatron/damage.h"
#include "core/error.h"
#include "core/text.h"

namespace fp8tron::checkpoint::megatron {
namespace {

std::string read_whole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DamagedCheckpoint(path + ": cannot be opened (" + std::strerror(errno) + "); is the checkpoint complete?");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

torch::ScalarType dtype_of(const PyRef& properties, const std::string& where) {
  // TensorProperties pickles its state as (dtype, layout, requires_grad, memory_format, pin_memory).
  PyRef dtype = attribute(properties, "dtype");
  if (!dtype && properties && properties->state && properties->state->kind == PyValue::Kind::Tuple &&
      !properties->state->items.empty())
    dtype = properties->state->items[0];
  static const std::pair<const char*, torch::ScalarType> kTypes[] = {
      {"float32", torch::kFloat32}, {"bfloat16", torch::kBFloat16}, {"float16", torch::kFloat16},
      {"float64", torch::kFloat64}, {"int64", torch::kInt64}, {"int32", torch::kInt32}, {"uint8", torch::kUInt8}};
  for (const auto& [name, type] : kTypes)
    if (is_global(dtype, "torch", name)) return type;
  throw UserError(where + " has dtype " + describe(dtype) + ", which fp8tron does not read");
}

// Megatron-Core before 0.14 prefixed the per-weight states of each optimizer of a chain (an MoE
// model's dense and expert parameters' optimizers) with chained_<i>.; the weights' names keep them
// apart without it. (Flat buffers, optimizer.distributed.*, keep it: their names repeat.)
std::string without_chain_prefix(const std::string& fqn) {
  static const std::regex kChained(R"(^chained_\d+\.(optimizer\.state\..*)$)");
  std::smatch m;
  return std::regex_match(fqn, m, kChained) ? m[1].str() : fqn;
}

std::string storage_key(const std::string& fqn, const std::vector<int64_t>& offsets) {
  std::string key = fqn + "@";
  for (int64_t o : offsets) key += std::to_string(o) + ",";
  return key;
}

// The chunks lie inside the tensor and hold as many elements as it: with box()'s checks (the
// chunks a box touches do not overlap and cover it), a gap or an overlap is found when a box
// touching it is read.
void check_tiling(const DcpTensor& t, const std::string& where) {
  int64_t numel = 1, held = 0;
  for (int64_t d : t.shape) numel *= d;
  for (const DcpChunk& c : t.chunks) {
    int64_t n = 1;
    for (size_t d = 0; d < t.shape.size(); ++d) {
      if (c.offsets[d] < 0 || c.sizes[d] < 0 || c.offsets[d] + c.sizes[d] > t.shape[d])
        throw DamagedCheckpoint(where + " has a chunk outside the tensor");
      n *= c.sizes[d];
    }
    held += n;
  }
  if (held != numel)
    throw DamagedCheckpoint(strprintf("%s: its chunks hold %lld elements, the tensor %lld", where.c_str(),
                                      (long long)held, (long long)numel));
}

}  // namespace

DcpCheckpoint::DcpCheckpoint(const std::string& dir, int64_t kept_chunk_bytes)
    : dir_(dir), kept_chunk_bytes_(kept_chunk_bytes) {
  const std::string path = dir + "/.metadata";
  const PyRef root = parse_pickle(read_whole(path), path);
  if (!is_call_of(root, "torch.distributed.checkpoint.metadata", "Metadata"))
    throw DamagedCheckpoint(path + ": holds " + describe(root) + ", not a distributed checkpoint's Metadata");

  // Where each chunk and object lies, by name and chunk offset.
  std::map<std::string, DcpStorage> where;
  const PyRef storage = attribute(root, "storage_data");
  if (!storage || storage->kind != PyValue::Kind::Dict) throw DamagedCheckpoint(path + ": no storage_data table");
  for (const auto& [index, info] : storage->entries) {
    std::string fqn;
    std::vector<int64_t> offsets;
    DcpStorage s;
    if (!as_string(attribute(index, "fqn"), fqn) || !as_string(attribute(info, "relative_path"), s.file) ||
        !as_int(attribute(info, "offset"), s.offset) || !as_int(attribute(info, "length"), s.length))
      throw DamagedCheckpoint(path + ": a malformed storage_data entry " + describe(index));
    if (!is_none(attribute(index, "offset")) && !as_int_list(attribute(index, "offset"), offsets))
      throw DamagedCheckpoint(path + ": a malformed chunk offset of " + fqn);
    where[storage_key(fqn, offsets)] = s;
  }

  const PyRef entries = attribute(root, "state_dict_metadata");
  if (!entries || entries->kind != PyValue::Kind::Dict) throw DamagedCheckpoint(path + ": no state_dict_metadata table");
  for (const auto& [key, meta] : entries->entries) {
    std::string fqn;
    if (!as_string(key, fqn)) throw DamagedCheckpoint(path + ": a state_dict_metadata key is not a string");
    if (is_call_of(meta, "torch.distributed.checkpoint.metadata", "BytesStorageMetadata")) {
      auto it = where.find(storage_key(fqn, {}));
      if (it == where.end()) throw DamagedCheckpoint(path + ": object " + fqn + " has no storage entry");
      objects_[fqn] = it->second;
      continue;
    }
    DcpTensor t;
    if (!as_int_list(attribute(meta, "size"), t.shape)) throw DamagedCheckpoint(path + ": tensor " + fqn + " has no size");
    t.dtype = dtype_of(attribute(meta, "properties"), path + ": tensor " + fqn);
    const PyRef chunks = attribute(meta, "chunks");
    if (!chunks || chunks->kind != PyValue::Kind::List) throw DamagedCheckpoint(path + ": tensor " + fqn + " has no chunk list");
    for (const PyRef& c : chunks->items) {
      DcpChunk chunk;
      if (!as_int_list(attribute(c, "offsets"), chunk.offsets) || !as_int_list(attribute(c, "sizes"), chunk.sizes) ||
          chunk.offsets.size() != t.shape.size() || chunk.sizes.size() != t.shape.size())
        throw DamagedCheckpoint(path + ": tensor " + fqn + " has a malformed chunk " + describe(c));
      auto it = where.find(storage_key(fqn, chunk.offsets));
      if (it == where.end()) throw DamagedCheckpoint(path + ": a chunk of tensor " + fqn + " has no storage entry");
      chunk.storage = it->second;
      t.chunks.push_back(std::move(chunk));
    }
    check_tiling(t, path + ": tensor " + fqn);
    const std::string name = without_chain_prefix(fqn);
    tensors_[tensors_.count(name) ? fqn : name] = std::move(t);  // two of a chain with one name: as saved
  }
  check_files();
  view_flattened_states_as_weights();
}

// A state optimizer.state.<state>.<key> stored with one axis more than the weight <key>, whose
// leading sizes divide the weight's and whose last is the elements of one such chunk, is stored
// flattened (Megatron's nd_flattened_tensor_reformulated_global_shape); the weight's chunk along
// each axis is its size over that count.
void DcpCheckpoint::view_flattened_states_as_weights() {
  static const std::string kState = "optimizer.state.";
  for (auto& [name, t] : tensors_) {
    if (!name.starts_with(kState)) continue;
    const size_t dot = name.find('.', kState.size());
    if (dot == std::string::npos) continue;
    auto weight = tensors_.find(name.substr(dot + 1));
    if (weight == tensors_.end() || !weight->second.chunk.empty()) continue;
    const std::vector<int64_t>& shape = weight->second.shape;
    if (t.shape.size() != shape.size() + 1) continue;
    std::vector<int64_t> chunk(shape.size());
    int64_t elements = 1;
    bool flattened = true;
    for (size_t d = 0; d < shape.size() && flattened; ++d) {
      flattened = t.shape[d] > 0 && shape[d] % t.shape[d] == 0;
      if (flattened) chunk[d] = shape[d] / t.shape[d], elements *= chunk[d];
    }
    if (!flattened || elements != t.shape.back()) continue;
    for (const DcpChunk& c : t.chunks)
      for (size_t d = 0; d < shape.size(); ++d)
        if (c.sizes[d] != 1)
          throw DamagedCheckpoint(dir_ + "/.metadata: " + name + " is stored flattened as Megatron's distributed "
                                  "optimizer stores it, but a chunk spans several of the weight's chunks");
    t.chunk = std::move(chunk);
    t.shape = shape;
  }
}

void DcpCheckpoint::check_present(const DcpStorage& s, const std::string& what) const {
  const std::string path = dir_ + "/" + s.file;
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) throw DamagedCheckpoint(path + ": missing (" + ec.message() + "); it holds " + what + ": copy the whole checkpoint");
  if (uint64_t(s.offset + s.length) > size)
    throw DamagedCheckpoint(strprintf("%s: truncated: %s lies at bytes [%lld, %lld) but the file has %llu bytes; copy the "
                              "checkpoint again", path.c_str(), what.c_str(), (long long)s.offset,
                              (long long)(s.offset + s.length), (unsigned long long)size));
}

void DcpCheckpoint::check_files() const {
  // The last entry of each file: a missing or truncated file is named before any rank reads.
  std::map<std::string, std::pair<DcpStorage, std::string>> last;
  auto note = [&](const DcpStorage& s, const std::string& what) {
    auto it = last.find(s.file);
    if (it == last.end() || it->second.first.offset + it->second.first.length < s.offset + s.length)
      last[s.file] = {s, what};
  };
  for (const auto& [name, t] : tensors_)
    for (const DcpChunk& c : t.chunks) note(c.storage, "a chunk of " + name);
  for (const auto& [name, s] : objects_) note(s, name);
  for (const auto& [file, entry] : last) check_present(entry.first, entry.second);
}

std::string DcpCheckpoint::read_range(const DcpStorage& s, const std::string& what) const {
  check_present(s, what);
  const std::string path = dir_ + "/" + s.file;
  std::ifstream in(path, std::ios::binary);
  std::string out(size_t(s.length), '\0');
  in.seekg(s.offset);
  in.read(out.data(), s.length);
  if (!in) throw DamagedCheckpoint(path + ": cannot read " + what);
  return out;
}

torch::Tensor DcpCheckpoint::read_chunk(const std::string& name, const DcpChunk& c) const {
  const std::string what = "a chunk of " + name;
  TorchArchive archive(read_range(c.storage, what), dir_ + "/" + c.storage.file + ", " + what);
  torch::Tensor part = archive.tensor(archive.root(), what);
  if (part.sizes().vec() != c.sizes || part.scalar_type() != tensors_.at(name).dtype)
    throw DamagedCheckpoint(dir_ + "/" + c.storage.file + ": " + what + " does not have the shape and dtype .metadata gives");
  bytes_read_ += c.storage.length;
  return part;
}

torch::Tensor DcpCheckpoint::box(const std::string& name, const std::vector<int64_t>& offsets,
                                 const std::vector<int64_t>& sizes, bool keep_chunks) const {
  auto it = tensors_.find(name);
  FP8TRON_CHECK(it != tensors_.end(), "reading tensor " + name + " absent from a distributed checkpoint");
  FP8TRON_CHECK(offsets.size() == it->second.shape.size() && sizes.size() == it->second.shape.size(),
                "a box of another rank");
  return it->second.chunk.empty() ? stored_box(name, offsets, sizes, keep_chunks)
                                  : model_space_box(name, offsets, sizes, keep_chunks);
}

torch::Tensor DcpCheckpoint::model_space_box(const std::string& name, const std::vector<int64_t>& offsets,
                                             const std::vector<int64_t>& sizes, bool keep_chunks) const {
  const DcpTensor& t = tensors_.at(name);
  const size_t rank = t.shape.size();
  auto out = torch::empty(sizes, torch::TensorOptions().dtype(t.dtype));
  if (out.numel() == 0) return out;
  int64_t chunk_elements = 1;
  for (int64_t n : t.chunk) chunk_elements *= n;
  // Every model-parallel chunk the box overlaps, its index counted up axis by axis from the first.
  std::vector<int64_t> first(rank), last(rank);
  for (size_t d = 0; d < rank; ++d)
    first[d] = offsets[d] / t.chunk[d], last[d] = (offsets[d] + sizes[d] - 1) / t.chunk[d];
  std::vector<int64_t> index = first;
  while (true) {
    std::vector<int64_t> at(index), extent(rank, 1);
    at.push_back(0), extent.push_back(chunk_elements);
    torch::Tensor from = stored_box(name, at, extent, keep_chunks).view(t.chunk), to = out;
    for (size_t d = 0; d < rank; ++d) {
      const int64_t lo = std::max(offsets[d], index[d] * t.chunk[d]);
      const int64_t hi = std::min(offsets[d] + sizes[d], (index[d] + 1) * t.chunk[d]);
      from = from.narrow(int64_t(d), lo - index[d] * t.chunk[d], hi - lo);
      to = to.narrow(int64_t(d), lo - offsets[d], hi - lo);
    }
    to.copy_(from);
    size_t d = rank;
    while (d > 0 && index[d - 1] == last[d - 1]) index[d - 1] = first[d - 1], --d;
    if (d == 0) return out;
    ++index[d - 1];
  }
}

torch::Tensor DcpCheckpoint::stored_box(const std::string& name, const std::vector<int64_t>& offsets,
                                        const std::vector<int64_t>& sizes, bool keep_chunks) const {
  const DcpTensor& t = tensors_.at(name);
  const size_t stored_rank = t.shape.size() + (t.chunk.empty() ? 0 : 1);  // a flattened state's extra axis
  FP8TRON_CHECK(offsets.size() == stored_rank && sizes.size() == stored_rank, "a box of a stored tensor");
  const int64_t use = ++uses_;
  auto out = torch::empty(sizes, torch::TensorOptions().dtype(t.dtype));
  int64_t covered = 0;
  std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> pieces;  // [lo, hi) of each chunk in the box
  for (size_t i = 0; i < t.chunks.size(); ++i) {
    const DcpChunk& c = t.chunks[i];
    std::vector<int64_t> lo(sizes.size()), hi(sizes.size());
    bool overlaps = true;
    for (size_t d = 0; d < sizes.size(); ++d) {
      lo[d] = std::max(offsets[d], c.offsets[d]);
      hi[d] = std::min(offsets[d] + sizes[d], c.offsets[d] + c.sizes[d]);
      overlaps = overlaps && lo[d] < hi[d];
    }
    if (!overlaps) continue;
    // With the count below, chunks that do not overlap one another cover the box exactly.
    for (const auto& [other_lo, other_hi] : pieces) {
      bool shared = true;
      for (size_t d = 0; d < sizes.size(); ++d) shared = shared && std::max(lo[d], other_lo[d]) < std::min(hi[d], other_hi[d]);
      if (shared) throw DamagedCheckpoint(dir_ + "/.metadata: chunks of " + name + " overlap");
    }
    pieces.emplace_back(lo, hi);
    torch::Tensor part;
    if (!keep_chunks) {
      part = read_chunk(name, c);
    } else {
      KeptChunk& kept = kept_chunks_[{name, i}];
      if (!kept.values.defined()) {
        kept.values = read_chunk(name, c);
        kept_bytes_ += kept.values.nbytes();
      }
      kept.last_use = use;
      part = kept.values;
    }
    torch::Tensor from = part, to = out;
    int64_t n = 1;
    for (size_t d = 0; d < sizes.size(); ++d) {
      from = from.narrow(int64_t(d), lo[d] - c.offsets[d], hi[d] - lo[d]);
      to = to.narrow(int64_t(d), lo[d] - offsets[d], hi[d] - lo[d]);
      n *= hi[d] - lo[d];
    }
    to.copy_(from);
    covered += n;
  }
  if (covered != out.numel())
    throw DamagedCheckpoint(dir_ + "/.metadata: the chunks of " + name + " do not cover the tensor once");
  if (keep_chunks) drop_unused_chunks(use);
  return out;
}

void DcpCheckpoint::drop_unused_chunks(int64_t in_use) const {
  while (kept_bytes_ > kept_chunk_bytes_) {
    auto oldest = kept_chunks_.end();
    for (auto it = kept_chunks_.begin(); it != kept_chunks_.end(); ++it)
      if (it->second.last_use != in_use && (oldest == kept_chunks_.end() || it->second.last_use < oldest->second.last_use))
        oldest = it;
    if (oldest == kept_chunks_.end()) return;  // every kept chunk is the box's own
    kept_bytes_ -= oldest->second.values.nbytes();
    kept_chunks_.erase(oldest);
  }
}

torch::Tensor DcpCheckpoint::chunk(const std::string& name, size_t index) const {
  auto it = tensors_.find(name);
  FP8TRON_CHECK(it != tensors_.end() && index < it->second.chunks.size(),
                "reading a chunk of tensor " + name + " absent from a distributed checkpoint");
  return read_chunk(name, it->second.chunks[index]);
}

torch::Tensor DcpCheckpoint::tensor(const std::string& name) const {
  auto it = tensors_.find(name);
  FP8TRON_CHECK(it != tensors_.end(), "reading tensor " + name + " absent from a distributed checkpoint");
  return box(name, std::vector<int64_t>(it->second.shape.size(), 0), it->second.shape, false);
}

torch::Tensor DcpCheckpoint::region(const std::string& name, const std::vector<int64_t>& offsets,
                                    const std::vector<int64_t>& sizes) const {
  return box(name, offsets, sizes, true);
}

void DcpCheckpoint::forget_chunks() const {
  kept_chunks_.clear();
  kept_bytes_ = 0;
}

int64_t DcpCheckpoint::tensor_bytes() const {
  int64_t total = 0;
  for (const auto& [name, t] : tensors_)
    for (const DcpChunk& c : t.chunks) total += c.storage.length;
  return total;
}

std::unique_ptr<TorchArchive> DcpCheckpoint::object(const std::string& prefix) const {
  for (const auto& [name, s] : objects_)
    if (name.rfind(prefix, 0) == 0)
      return std::make_unique<TorchArchive>(read_range(s, name), dir_ + "/" + s.file + ", " + name);
  throw UserError(dir_ + "/.metadata: names no " + prefix + " object; is this a Megatron torch_dist checkpoint?");
}

std::unique_ptr<TorchArchive> DcpCheckpoint::common_state() const {
  const std::string file = dir_ + "/common.pt";
  if (std::filesystem::exists(file)) return std::make_unique<TorchArchive>(file);
  return object("common_state");
}

PyRef DcpCheckpoint::common_state_dict(const TorchArchive& common) {
  PyRef root = common.root();
  if (root && root->kind == PyValue::Kind::List && root->items.size() == 1) root = root->items[0];
  return root;
}

std::vector<std::string> DcpCheckpoint::object_names() const {
  std::vector<std::string> names;
  for (const auto& [name, s] : objects_) names.push_back(name);
  return names;
}

}  // namespace fp8tron::checkpoint::megatron
