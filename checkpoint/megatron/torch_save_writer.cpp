#include "checkpoint/megatron/torch_save_writer.h"

#include <caffe2/serialize/inline_container.h>

#include "core/error.h"

namespace fp8tron::checkpoint::megatron {
namespace {

// torch.save names a storage by its legacy typed class.
std::string storage_class(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat32: return "FloatStorage";
    case torch::kFloat64: return "DoubleStorage";
    case torch::kFloat16: return "HalfStorage";
    case torch::kBFloat16: return "BFloat16Storage";
    case torch::kInt64: return "LongStorage";
    case torch::kInt32: return "IntStorage";
    case torch::kInt8: return "CharStorage";
    case torch::kUInt8: return "ByteStorage";
    case torch::kBool: return "BoolStorage";
    default: break;
  }
  throw UserError(std::string("saving a tensor of dtype ") + c10::toString(t) +
                  " in torch.save's format, which fp8tron does not write");
}

}  // namespace

PyRef TorchSaveWriter::tensor(const torch::Tensor& t) {
  const torch::Tensor host = t.detach().to(torch::kCPU).contiguous();
  const std::string key = std::to_string(storages_.size());
  storages_.push_back(host);
  const PyRef storage = py_persistent(py_tuple(
      {py_str("storage"), py_global("torch", storage_class(host.scalar_type())), py_str(key), py_str("cpu"),
       py_int(host.numel())}));
  std::vector<int64_t> strides;
  int64_t stride = 1;
  for (int64_t d = host.dim() - 1; d >= 0; --d) {
    strides.insert(strides.begin(), stride);
    stride *= host.size(d);
  }
  return py_call(py_global("torch._utils", "_rebuild_tensor_v2"),
                 {storage, py_int(0), py_int_tuple(host.sizes().vec()), py_int_tuple(strides), py_bool(false),
                  py_call(py_global("collections", "OrderedDict"), {})});
}

std::string TorchSaveWriter::bytes(const PyRef& root) const {
  std::string out;
  caffe2::serialize::PyTorchStreamWriter writer([&out](const void* data, size_t n) {
    out.append(static_cast<const char*>(data), n);
    return n;
  });
  const std::string pickle = write_pickle(root);
  writer.writeRecord("data.pkl", pickle.data(), pickle.size());
  writer.writeRecord("byteorder", "little", 6);
  for (size_t i = 0; i < storages_.size(); ++i) {
    const torch::Tensor& s = storages_[i];
    writer.writeRecord("data/" + std::to_string(i), s.data_ptr(), size_t(s.numel()) * s.element_size());
  }
  writer.writeEndOfFile();
  return out;
}

std::string torch_save_tensor(const torch::Tensor& t) {
  TorchSaveWriter w;
  const PyRef root = w.tensor(t);
  return w.bytes(root);
}

}  // namespace fp8tron::checkpoint::megatron
