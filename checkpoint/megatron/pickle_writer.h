// Python pickles written from a tree of values (pickle.h's PyValue), for the files Megatron-LM and
// PyTorch read: a distributed checkpoint's `.metadata` (DCP's dataclasses) and the data.pkl of
// torch.save archives (Megatron's common state: an argparse.Namespace, enums, dicts, tensors).
// LibTorch's pickler writes only TorchScript values, not instances of arbitrary Python classes,
// so fp8tron writes protocol 2 itself. Nothing is memoized: a value referred to twice is written
// twice (no value here depends on identity).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "checkpoint/megatron/pickle.h"

namespace fp8tron::checkpoint::megatron {

PyRef py_none();
PyRef py_bool(bool b);
// (py_int: pickle.h.)
PyRef py_float(double d);
PyRef py_str(std::string s);
PyRef py_list(std::vector<PyRef> items);
PyRef py_tuple(std::vector<PyRef> items);
PyRef py_int_tuple(const std::vector<int64_t>& values);
PyRef py_dict(std::vector<std::pair<std::string, PyRef>> entries);
PyRef py_global(std::string module, std::string name);
// callable(*args), e.g. torch.Size((2, 3)) or an enum member RerunMode('disabled').
PyRef py_call(PyRef callable, std::vector<PyRef> args);
// An instance made as Python unpickles dataclasses and argparse.Namespace: cls.__new__(cls),
// then its state (a dict of attributes, or what the class's __setstate__ takes) set by BUILD.
PyRef py_object(PyRef cls, PyRef state);
// A persistent id (torch.save's storages): `id` is the tuple torch.save's persistent_id returns.
PyRef py_persistent(PyRef id);

// The pickle (protocol 2) of `root`. Sets and byte strings are not written (no caller needs them).
std::string write_pickle(const PyRef& root);

}  // namespace fp8tron::checkpoint::megatron
