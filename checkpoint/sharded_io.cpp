#include "checkpoint/sharded_io.h"

#include <filesystem>

#include "core/error.h"
#include "core/text.h"
#include "checkpoint/checksum.h"
#include "checkpoint/megatron/damage.h"
#include "checkpoint/other_iterations.h"

namespace fp8tron::checkpoint {

std::string rank_file_name(int rank) { return strprintf("rank_%05d.safetensors", rank); }

RankShardWriter::RankShardWriter(std::string file_name) : file_(std::move(file_name)) {}

std::string RankShardWriter::unique_key(const std::string& name) {
  int n = key_uses_[name]++;
  return n == 0 ? name : strprintf("%s#%d", name.c_str(), n);
}

void RankShardWriter::record(const std::string& name, DType dtype, const Shape& global_shape,
                             const Box& box, const std::string& key, int64_t element_offset,
                             int replicas) {
  ShardEntry s;
  s.file = file_;
  s.key = key;
  s.offset = box.offset;
  s.shape = box.shape;
  s.element_offset = element_offset;
  s.replicas = replicas;
  if (!add_shard(table_, name, dtype, global_shape, s))
    throw UserError(strprintf("tensor '%s': box %s is added twice to %s", name.c_str(),
                              box_string(box).c_str(), file_.c_str()));
}

void RankShardWriter::add(const std::string& name, DType dtype, const Shape& global_shape,
                          const Box& box, const void* data, int replicas) {
  std::string key = unique_key(name);
  record(name, dtype, global_shape, box, key, 0, replicas);
  tensors_.push_back(TensorToWrite{key, dtype, box.shape, data, {}});
}

void RankShardWriter::add(const std::string& name, DType dtype, const Shape& global_shape,
                          const Box& box, std::function<void(uint64_t, void*, size_t)> fill,
                          int replicas) {
  std::string key = unique_key(name);
  record(name, dtype, global_shape, box, key, 0, replicas);
  tensors_.push_back(TensorToWrite{key, dtype, box.shape, nullptr, std::move(fill)});
}

void RankShardWriter::add_flat_range(const std::string& name, DType dtype, const Shape& global_shape,
                                     const Box& box, int64_t begin, int64_t end, const void* data) {
  std::string key = unique_key(name);
  int64_t element = 0;
  for (const Box& piece : flat_range_to_boxes(box, begin, end)) {
    record(name, dtype, global_shape, piece, key, element, 1);
    element += box_volume(piece);
  }
  tensors_.push_back(TensorToWrite{key, dtype, {end - begin}, data, {}});
}

WriteStats RankShardWriter::write(const std::string& dir, const WriteOptions& options) const {
  // {"format": "pt"}: Hugging Face loaders reject safetensors metadata without a format.
  return write_safetensors((std::filesystem::path(dir) / file_).string(), tensors_,
                           {{"format", "pt"}}, options);
}

std::vector<std::string> RankShardWriter::keys() const {
  std::vector<std::string> out;
  for (const auto& t : tensors_) out.push_back(t.name);
  return out;
}

CheckpointReader::CheckpointReader(const CheckpointLocation& location, bool verify_checksums)
    : location_(location), metadata_(read_metadata(location.path)), verify_checksums_(verify_checksums) {}

bool CheckpointReader::has_checksums() const {
  for (const auto& [name, t] : metadata_.tensors)
    for (const auto& s : t.shards)
      if (s.checksum) return true;
  return false;
}

namespace {
// The directory a checkpoint is loaded from (--load, or the non-persistent one).
std::string directory_of(const CheckpointLocation& location) {
  return std::filesystem::path(location.path).parent_path().string();
}
}  // namespace

void CheckpointReader::verify(const SafetensorsFile& f, const TensorView& v, const ShardEntry& s,
                              const std::string& name) {
  if (!verify_checksums_ || !s.checksum || !verified_.insert({s.file, s.key}).second) return;
  const uint64_t found = checksum64(v.data, size_t(v.nbytes));
  if (found == *s.checksum) return;
  throw DamagedCheckpoint(with_other_iterations(
      strprintf("checkpoint %s is corrupt: in %s, tensor '%s'%s does not match the checksum recorded when it was saved "
                "(xxh3 %s recorded, %s read)",
                location_.path.c_str(), f.path().c_str(), name.c_str(),
                s.key == name ? "" : (" (stored as '" + s.key + "')").c_str(), checksum_hex(*s.checksum).c_str(),
                checksum_hex(found).c_str()),
      directory_of(location_), location_.iteration));
}

const SafetensorsFile& CheckpointReader::file(const std::string& name) {
  auto it = files_.find(name);
  if (it == files_.end()) {
    std::string path = (std::filesystem::path(location_.path) / name).string();
    std::error_code ec;
    if (!std::filesystem::exists(path, ec))
      throw DamagedCheckpoint(with_other_iterations(
          strprintf("checkpoint %s is incomplete: shard file %s is missing", location_.path.c_str(), name.c_str()),
          directory_of(location_), location_.iteration));
    it = files_.emplace(name, SafetensorsFile::open(path)).first;
  }
  return it->second;
}

void CheckpointReader::read(const std::string& name, DType dtype, const Shape& global_shape,
                            const Box& region, void* dst) {
  auto it = metadata_.tensors.find(name);
  if (it == metadata_.tensors.end()) {
    std::vector<std::string> names;
    for (const auto& [n, t] : metadata_.tensors) names.push_back(n);
    std::string hint = closest_match(name, names);
    throw UserError(strprintf("checkpoint %s has no tensor '%s'%s; was it saved from a different "
                              "model configuration?", location_.path.c_str(), name.c_str(),
                              hint.empty() ? "" : (" (did you mean '" + hint + "'?)").c_str()));
  }
  const TensorEntry& t = it->second;
  if (t.shape != global_shape)
    throw UserError(strprintf("tensor '%s' has shape %s in checkpoint %s but the model expects %s; "
                              "the model arguments differ from the saved ones",
                              name.c_str(), shape_string(t.shape).c_str(), location_.path.c_str(),
                              shape_string(global_shape).c_str()));
  if (t.dtype != dtype)
    throw UserError(strprintf("tensor '%s' is %s in checkpoint %s but the model expects %s",
                              name.c_str(), dtype_name(t.dtype), location_.path.c_str(),
                              dtype_name(dtype)));
  std::vector<Box> boxes;
  for (const auto& s : t.shards) boxes.push_back(s.box());
  std::vector<CopyOp> ops = plan_copies(name, t.shape, boxes, region);

  std::vector<SourceArray> sources(t.shards.size());
  const size_t esize = dtype_size(dtype);
  for (const auto& op : ops) {
    const ShardEntry& s = t.shards[op.source];
    if (sources[op.source].data) continue;
    const SafetensorsFile& f = file(s.file);
    const TensorView& v = f.at(s.key);
    if (v.dtype != t.dtype || s.element_offset + box_volume(s.box()) > v.numel())
      throw DamagedCheckpoint(strprintf("%s: tensor '%s' is %s %s but the metadata expects %s with at least "
                                        "%lld elements; the checkpoint is corrupt",
                                f.path().c_str(), s.key.c_str(), dtype_name(v.dtype),
                                shape_string(v.shape).c_str(), dtype_name(t.dtype),
                                (long long)(s.element_offset + box_volume(s.box()))));
    verify(f, v, s, name);
    sources[op.source] = SourceArray{v.data + size_t(s.element_offset) * esize, s.shape};
  }
  execute_copies(ops, sources, dst, region.shape, esize);
}

}  // namespace fp8tron::checkpoint
