#include "checkpoint/megatron/torch_archive.h"

#include <caffe2/serialize/inline_container.h>

#include <fstream>
#include <sstream>

#include "checkpoint/megatron/damage.h"
#include "checkpoint/megatron/zip_crc.h"
#include "core/error.h"
#include "core/text.h"

namespace fp8tron::checkpoint::megatron {
namespace {

// torch.save names a storage by its legacy typed class (torch.FloatStorage, ...).
std::optional<torch::ScalarType> storage_dtype(const PyRef& type) {
  static const std::pair<const char*, torch::ScalarType> kTypes[] = {
      {"FloatStorage", torch::kFloat32}, {"DoubleStorage", torch::kFloat64}, {"HalfStorage", torch::kFloat16},
      {"BFloat16Storage", torch::kBFloat16}, {"LongStorage", torch::kInt64}, {"IntStorage", torch::kInt32},
      {"ShortStorage", torch::kInt16}, {"CharStorage", torch::kInt8}, {"ByteStorage", torch::kUInt8},
      {"BoolStorage", torch::kBool}};
  if (!type || type->kind != PyValue::Kind::Global || type->text != "torch") return std::nullopt;
  for (const auto& [name, dtype] : kTypes)
    if (type->name == name) return dtype;
  return std::nullopt;
}

// LibTorch's zip errors (c10::Error, several lines) as one line naming the archive.
template <class F>
auto guarded(const std::string& source, F&& f) {
  try {
    return f();
  } catch (const c10::Error& e) {
    std::string what = e.what_without_backtrace();
    what = what.substr(0, what.find('\n'));
    throw DamagedCheckpoint(source + ": not a readable torch.save archive (" + escaped_bytes(what, 160) +
                            "); the file is truncated or corrupted: copy it again from the run that saved it");
  }
}

}  // namespace

TorchArchive::TorchArchive(const std::string& path) : source_(path) {
  reader_ = guarded(source_, [&] { return std::make_unique<caffe2::serialize::PyTorchStreamReader>(path); });
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  const uint64_t size = file ? uint64_t(file.tellg()) : 0;
  crcs_ = zip_entry_crcs(size, [&](uint64_t offset, size_t n) {
    std::string bytes(n, '\0');
    file.clear();
    file.seekg(std::streamoff(offset));
    file.read(bytes.data(), std::streamsize(n));
    bytes.resize(size_t(file.gcount()));
    return bytes;
  }, source_);
  open();
}

TorchArchive::TorchArchive(std::string bytes, std::string source) : source_(std::move(source)), bytes_(std::move(bytes)) {
  stream_ = std::make_unique<std::istringstream>(bytes_);
  reader_ = guarded(source_, [&] { return std::make_unique<caffe2::serialize::PyTorchStreamReader>(stream_.get()); });
  crcs_ = zip_entry_crcs(bytes_.size(), [&](uint64_t offset, size_t n) {
    return offset < bytes_.size() ? bytes_.substr(size_t(offset), n) : std::string();
  }, source_);
  open();
}

std::pair<at::DataPtr, size_t> TorchArchive::record(const std::string& name, const std::string& what) const {
  auto [data, size] = guarded(source_, [&] { return reader_->getRecord(name); });
  auto crc = crcs_.find(name);
  if (crc == crcs_.end() || crc32(data.get(), size) != crc->second)
    throw DamagedCheckpoint(source_ + ": entry " + name + " (" + what + ") fails its CRC-32 check: the file is "
                            "corrupted: copy it again from the run that saved it");
  return {std::move(data), size};
}

TorchArchive::~TorchArchive() = default;

void TorchArchive::open() {
  if (!reader_->hasRecord("data.pkl")) throw DamagedCheckpoint(source_ + ": a zip archive without data.pkl, not a torch.save file");
  auto [data, size] = record("data.pkl", "the pickled state");
  root_ = parse_pickle(std::string_view(static_cast<const char*>(data.get()), size), source_ + ", data.pkl");
}

// A persistent id ('storage', torch.FloatStorage, key, location, numel) as a flat tensor.
torch::Tensor TorchArchive::storage(const PyRef& id, const std::string& what) const {
  const PyRef t = id ? id->state : nullptr;
  std::string tag, key;
  int64_t numel = 0;
  if (!t || t->kind != PyValue::Kind::Tuple || t->items.size() < 5 || !as_string(t->items[0], tag) || tag != "storage" ||
      !as_string(t->items[2], key) || !as_int(t->items[4], numel))
    throw UserError(source_ + ": " + what + " refers to an unknown kind of storage " + describe(t));
  const auto dtype = storage_dtype(t->items[1]);
  if (!dtype) throw UserError(source_ + ": " + what + " is stored as " + describe(t->items[1]) + ", not a supported dtype");
  const std::string record = "data/" + key;
  if (!reader_->hasRecord(record)) throw DamagedCheckpoint(source_ + ": entry " + record + " of " + what + " is missing");
  auto out = torch::empty({numel}, torch::TensorOptions().dtype(*dtype));
  const size_t bytes = size_t(numel) * out.element_size();
  auto [data, size] = this->record(record, what);
  if (size != bytes)
    throw DamagedCheckpoint(strprintf("%s: entry %s of %s holds %zu bytes, its %lld elements need %zu", source_.c_str(),
                              record.c_str(), what.c_str(), size, (long long)numel, bytes));
  std::memcpy(out.data_ptr(), data.get(), bytes);
  return out;
}

torch::Tensor TorchArchive::tensor(const PyRef& v, const std::string& what) const {
  if (is_call_of(v, "torch._utils", "_rebuild_parameter") && v->args && !v->args->items.empty())
    return tensor(v->args->items[0], what);
  // A tensor that carries Python attributes (Megatron's main weights keep `shared` and the like):
  // _rebuild_from_type_v2(rebuild, type, rebuild's args, attributes). The tensor is rebuild(*args).
  if (is_call_of(v, "torch._tensor", "_rebuild_from_type_v2") && v->args && v->args->items.size() >= 3 &&
      v->args->items[2] && v->args->items[2]->kind == PyValue::Kind::Tuple) {
    auto inner = make_value(PyValue::Kind::Call);
    inner->callable = v->args->items[0];
    inner->args = v->args->items[2];
    return tensor(inner, what);
  }
  if (!is_call_of(v, "torch._utils", "_rebuild_tensor_v2") || !v->args || v->args->items.size() < 4)
    throw UserError(source_ + ": " + what + " is not a tensor but " + describe(v));
  const auto& a = v->args->items;
  int64_t offset = 0;
  std::vector<int64_t> size, stride;
  if (!a[0] || a[0]->kind != PyValue::Kind::PersistentId || !as_int(a[1], offset) || !as_int_list(a[2], size) ||
      !as_int_list(a[3], stride) || size.size() != stride.size())
    throw DamagedCheckpoint(source_ + ": " + what + " is a malformed tensor " + describe(v));
  const torch::Tensor flat = storage(a[0], what);
  int64_t last = offset;
  for (size_t d = 0; d < size.size(); ++d) {
    if (size[d] == 0) return torch::empty(size, flat.options());
    last += (size[d] - 1) * stride[d];
  }
  if (offset < 0 || last >= flat.numel())
    throw UserError(source_ + ": " + what + " reaches past the end of its storage");
  return flat.as_strided(size, stride, offset).clone(at::MemoryFormat::Contiguous);
}

}  // namespace fp8tron::checkpoint::megatron
