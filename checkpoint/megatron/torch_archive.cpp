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

// A persistent id ('storage', torch.FloatStorage, key, location, numel): its entry, dtype and size.
TorchArchive::StorageRef TorchArchive::storage_ref(const PyRef& id, const std::string& what) const {
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
  return {record, *dtype, numel};
}

// The storage as a flat tensor.
torch::Tensor TorchArchive::storage(const PyRef& id, const std::string& what) const {
  const StorageRef ref = storage_ref(id, what);
  auto out = torch::empty({ref.numel}, torch::TensorOptions().dtype(ref.dtype));
  const size_t bytes = size_t(ref.numel) * out.element_size();
  auto [data, size] = this->record(ref.record, what);
  if (size != bytes)
    throw DamagedCheckpoint(strprintf("%s: entry %s of %s holds %zu bytes, its %lld elements need %zu", source_.c_str(),
                              ref.record.c_str(), what.c_str(), size, (long long)ref.numel, bytes));
  std::memcpy(out.data_ptr(), data.get(), bytes);
  return out;
}

TorchArchive::TensorView TorchArchive::view_of(const PyRef& v, const std::string& what) const {
  if (is_call_of(v, "torch._utils", "_rebuild_parameter") && v->args && !v->args->items.empty())
    return view_of(v->args->items[0], what);
  // A tensor that carries Python attributes (Megatron's main weights keep `shared` and the like):
  // _rebuild_from_type_v2(rebuild, type, rebuild's args, attributes). The tensor is rebuild(*args).
  if (is_call_of(v, "torch._tensor", "_rebuild_from_type_v2") && v->args && v->args->items.size() >= 3 &&
      v->args->items[2] && v->args->items[2]->kind == PyValue::Kind::Tuple) {
    auto inner = make_value(PyValue::Kind::Call);
    inner->callable = v->args->items[0];
    inner->args = v->args->items[2];
    return view_of(inner, what);
  }
  if (!is_call_of(v, "torch._utils", "_rebuild_tensor_v2") || !v->args || v->args->items.size() < 4)
    throw UserError(source_ + ": " + what + " is not a tensor but " + describe(v));
  const auto& a = v->args->items;
  TensorView view{a[0], 0, {}, {}};
  if (!a[0] || a[0]->kind != PyValue::Kind::PersistentId || !as_int(a[1], view.offset) || !as_int_list(a[2], view.size) ||
      !as_int_list(a[3], view.stride) || view.size.size() != view.stride.size())
    throw DamagedCheckpoint(source_ + ": " + what + " is a malformed tensor " + describe(v));
  return view;
}

torch::Tensor TorchArchive::tensor(const PyRef& v, const std::string& what) const {
  const TensorView view = view_of(v, what);
  const torch::Tensor flat = storage(view.storage, what);
  int64_t last = view.offset;
  for (size_t d = 0; d < view.size.size(); ++d) {
    if (view.size[d] == 0) return torch::empty(view.size, flat.options());
    last += (view.size[d] - 1) * view.stride[d];
  }
  if (view.offset < 0 || last >= flat.numel())
    throw UserError(source_ + ": " + what + " reaches past the end of its storage");
  return flat.as_strided(view.size, view.stride, view.offset).clone(at::MemoryFormat::Contiguous);
}

int64_t TorchArchive::contiguous_numel(const TensorView& view) {
  int64_t numel = 1;
  for (size_t d = view.size.size(); d-- > 0;) {
    if (view.size[d] != 1 && view.stride[d] != numel) return -1;
    numel *= view.size[d];
  }
  return numel;
}

namespace {

// Box [offsets, offsets + sizes) of a row-major tensor of `shape` held flat by `record`, reading
// only its bytes where the box is one run of elements or one run per index of the first
// dimension (a matrix's rows, or part of each row); a box cut along a third dimension reads the
// rows of the first that it spans.
torch::Tensor read_box(const FlatRecord& record, const std::vector<int64_t>& shape, const std::vector<int64_t>& offsets,
                       const std::vector<int64_t>& sizes) {
  const auto dtype = torch::TensorOptions().dtype(record.dtype());
  if (shape.empty()) return record.read(0, 1).view({});
  for (int64_t s : sizes)
    if (s == 0) return torch::empty(sizes, dtype);
  // inner[d]: the elements of one index of dimension d; cut: the last dimension the box does not span whole.
  std::vector<int64_t> inner(shape.size(), 1);
  for (size_t d = shape.size() - 1; d-- > 0;) inner[d] = inner[d + 1] * shape[d + 1];
  size_t cut = 0;
  for (size_t d = 0; d < shape.size(); ++d)
    if (offsets[d] != 0 || sizes[d] != shape[d]) cut = d;
  if (cut == 0) return record.read(offsets[0] * inner[0], sizes[0] * inner[0]).view(sizes);
  if (cut == 1)
    return record.read_blocks(offsets[0] * inner[0] + offsets[1] * inner[1], sizes[1] * inner[1], inner[0], sizes[0])
        .view(sizes);
  std::vector<int64_t> rows = shape;
  rows[0] = sizes[0];
  torch::Tensor box = record.read(offsets[0] * inner[0], sizes[0] * inner[0]).view(rows);
  for (size_t d = 1; d < shape.size(); ++d) box = box.narrow(int64_t(d), offsets[d], sizes[d]);
  return box.contiguous();
}

}  // namespace

StoredTensor TorchArchive::stored(const PyRef& v, const std::string& what, std::shared_ptr<BytesRead> tally) const {
  const TensorView view = view_of(v, what);
  if (!bytes_.empty() || contiguous_numel(view) < 0) {
    torch::Tensor t = tensor(v, what);
    tally->stored += int64_t(t.nbytes()), tally->read += int64_t(t.nbytes());
    return t;
  }
  std::shared_ptr<const FlatRecord> record = flat_record(v, what, std::move(tally));
  return StoredTensor(view.size, record->dtype(), source_ + ":" + what,
                      [record, shape = view.size](const std::vector<int64_t>& offsets, const std::vector<int64_t>& sizes) {
                        return read_box(*record, shape, offsets, sizes);
                      });
}

std::shared_ptr<const FlatRecord> TorchArchive::flat_record(const PyRef& v, const std::string& what,
                                                            std::shared_ptr<BytesRead> tally) const {
  FP8TRON_CHECK(bytes_.empty(), "ranges are read from an archive in a file");
  const TensorView view = view_of(v, what);
  const StorageRef ref = storage_ref(view.storage, what);
  const int64_t numel = contiguous_numel(view);
  if (numel < 0)
    throw UserError(source_ + ": " + what + " is not a contiguous tensor; fp8tron reads such buffers only whole");
  const int64_t element = int64_t(c10::elementSize(ref.dtype));
  const int64_t entry_bytes = int64_t(guarded(source_, [&] { return reader_->getRecordSize(ref.record); }));
  if (entry_bytes != ref.numel * element)
    throw DamagedCheckpoint(strprintf("%s: entry %s of %s holds %lld bytes, not the %lld elements of its storage",
                                      source_.c_str(), ref.record.c_str(), what.c_str(), (long long)entry_bytes,
                                      (long long)ref.numel));
  if (view.offset < 0 || view.offset + numel > ref.numel)
    throw UserError(source_ + ": " + what + " reaches past the end of its storage");
  const int64_t data = int64_t(guarded(source_, [&] { return reader_->getRecordOffset(ref.record); }));
  auto crc = crcs_.find(ref.record);
  if (crc == crcs_.end())
    throw DamagedCheckpoint(source_ + ": entry " + ref.record + " (" + what + ") is not in the archive's directory");
  std::shared_ptr<EntryCrcCheck>& check = entry_checks_[ref.record];
  if (!check) check = std::make_shared<EntryCrcCheck>(crc->second, entry_bytes);
  tally->stored += numel * element;
  return std::make_shared<FlatRecord>(source_, ref.record, what, data, view.offset * element, ref.dtype, numel, check,
                                      std::move(tally));
}

FlatRecord::FlatRecord(std::string path, std::string entry, std::string what, int64_t entry_data, int64_t entry_offset,
                       torch::ScalarType dtype, int64_t numel, std::shared_ptr<EntryCrcCheck> check,
                       std::shared_ptr<BytesRead> tally)
    : path_(std::move(path)), entry_(std::move(entry)), what_(std::move(what)), entry_data_(entry_data),
      entry_offset_(entry_offset), dtype_(dtype), numel_(numel), check_(std::move(check)), tally_(std::move(tally)) {}

torch::Tensor FlatRecord::read(int64_t offset, int64_t n) const {
  FP8TRON_CHECK(offset >= 0 && n >= 0 && offset + n <= numel_, "a range inside the flat record");
  auto out = torch::empty({n}, torch::TensorOptions().dtype(dtype_));
  const int64_t element = int64_t(out.element_size());
  std::ifstream file(path_, std::ios::binary);
  read_entry_bytes(file, static_cast<char*>(out.data_ptr()), entry_offset_ + offset * element, n * element);
  return out;
}

torch::Tensor FlatRecord::read_blocks(int64_t first, int64_t block, int64_t stride, int64_t count) const {
  if (count <= 1 || block == stride) return read(first, block * count);
  FP8TRON_CHECK(first >= 0 && block >= 0 && stride > block && first + (count - 1) * stride + block <= numel_,
                "blocks inside the flat record");
  auto out = torch::empty({count * block}, torch::TensorOptions().dtype(dtype_));
  const int64_t element = int64_t(out.element_size());
  std::ifstream file(path_, std::ios::binary);
  char* to = static_cast<char*>(out.data_ptr());
  for (int64_t i = 0; i < count; ++i, to += block * element)
    read_entry_bytes(file, to, entry_offset_ + (first + i * stride) * element, block * element);
  return out;
}

void FlatRecord::read_entry_bytes(std::ifstream& file, char* to, int64_t begin, int64_t n) const {
  file.seekg(std::streamoff(entry_data_ + begin));
  file.read(to, std::streamsize(n));
  if (!file || file.gcount() != n)
    throw DamagedCheckpoint(path_ + ": entry " + entry_ + " (" + what_ + ") ends early: the file is truncated; copy it "
                            "again from the run that saved it");
  tally_->read += n;
  if (!check_->add(begin, to, n))
    throw DamagedCheckpoint(path_ + ": entry " + entry_ + " (" + what_ + ") fails its CRC-32 check: the file is "
                            "corrupted: copy it again from the run that saved it");
}

}  // namespace fp8tron::checkpoint::megatron
