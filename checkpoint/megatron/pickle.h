// Python pickles (protocols 2 to 5) read into a tree of values, without running anything.
//
// Megatron's and PyTorch's checkpoint files are pickles: torch.save writes protocol 2 (with
// tensors as persistent ids), PyTorch's distributed checkpoint writes its `.metadata` with
// Python's default protocol (4 or 5). LibTorch's own unpickler reads only protocol 2, only
// 8-byte LONG1 integers and refuses globals such as `torch.float32` (all three occur in
// Megatron's checkpoints), so fp8tron reads pickles itself. Nothing is imported or called: a
// global is a name, REDUCE/NEWOBJ record the callable and its arguments, BUILD records the state;
// the readers above (torch_archive.h, dcp_checkpoint.h, megatron_checkpoint.h) interpret the few
// classes they know (argparse.Namespace, enums, tensors, DCP's metadata dataclasses).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fp8tron::checkpoint::megatron {

struct PyValue;
using PyRef = std::shared_ptr<PyValue>;

// One value of the unpickled graph. Containers hold references: an object the pickle refers to
// twice (through its memo) is one shared value, as in Python.
struct PyValue {
  enum class Kind {
    None, Bool, Int, BigInt, Float, Str, Bytes, List, Tuple, Dict, Set,
    Global,        // module.name: a class or function, not looked up
    Call,          // callable(*args) (REDUCE, NEWOBJ): an instance, possibly built further
    PersistentId,  // a reference to something outside the pickle (torch.save's storages)
  };
  Kind kind = Kind::None;
  bool boolean = false;
  int64_t integer = 0;
  double real = 0;
  // Str, Bytes; BigInt: its little-endian two's-complement bytes; Global: the module.
  std::string text;
  std::string name;  // Global: the attribute
  // List, Tuple, Set; Call: what APPEND(S) added to the instance.
  std::vector<PyRef> items;
  // Dict, in insertion order; Call: what SETITEM(S) added (an OrderedDict's entries).
  std::vector<std::pair<PyRef, PyRef>> entries;
  PyRef callable, args;  // Call
  bool new_object = false;  // Call: made by NEWOBJ (cls.__new__(cls, *args)), not by calling it
  PyRef state;           // Call: BUILD's argument (null when never built); PersistentId: the id
};

// A fresh value of `kind` (its other fields empty), and an Int: the reader and the writer
// (pickle_writer.h) build their trees from these.
PyRef make_value(PyValue::Kind kind);
PyRef py_int(int64_t i);

// Parses one pickle. `source` (a file name, or "file, entry") starts every error message: a
// UserError naming the byte offset and what is wrong, for truncated or malformed input and for
// opcodes outside protocols 2-5 (out-of-band buffers, extension registry codes).
PyRef parse_pickle(std::string_view bytes, const std::string& source);

// ---- reading the tree (each returns null / nullopt / false when the shape does not match) ----

bool is_none(const PyRef& v);
bool is_global(const PyRef& v, std::string_view module, std::string_view name);
// A Call of the global module.name, e.g. is_call_of(v, "argparse", "Namespace").
bool is_call_of(const PyRef& v, std::string_view module, std::string_view name);
// "module.name" of a Global, or of a Call's callable; "" otherwise.
std::string qualified_name(const PyRef& v);

// The value under string key `key` of a Dict, or of the dict state of a built instance
// (argparse.Namespace, dataclasses): BUILD's dict, or the second item of a (dict, slots) state.
PyRef attribute(const PyRef& v, std::string_view key);
// Every (string key, value) of such a dict, in order.
std::vector<std::pair<std::string, PyRef>> attributes(const PyRef& v);

// Integers (Int, Bool), reals (Float, Int), strings; a torch.Size or tuple of ints as a vector.
bool as_int(const PyRef& v, int64_t& out);
bool as_double(const PyRef& v, double& out);
bool as_string(const PyRef& v, std::string& out);
bool as_int_list(const PyRef& v, std::vector<int64_t>& out);

// A short Python-like rendering for messages ("{'iteration': 10, ...}").
std::string describe(const PyRef& v, size_t max_chars = 120);

}  // namespace fp8tron::checkpoint::megatron
