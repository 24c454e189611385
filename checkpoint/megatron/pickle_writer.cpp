#include "checkpoint/megatron/pickle_writer.h"

#include <cstring>

#include "core/error.h"

namespace fp8tron::checkpoint::megatron {
namespace {

class Writer {
 public:
  std::string run(const PyRef& root) {
    out_ += "\x80\x02";  // PROTO 2, as torch.save
    value(root);
    out_ += '.';
    return std::move(out_);
  }

 private:
  void le(uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out_ += char((v >> (8 * i)) & 0xff);
  }

  void integer(int64_t v) {
    if (v >= 0 && v < 256) {
      out_ += 'K';  // BININT1
      le(uint64_t(v), 1);
    } else if (v >= 0 && v < 65536) {
      out_ += 'M';  // BININT2
      le(uint64_t(v), 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      out_ += 'J';  // BININT
      le(uint64_t(uint32_t(int32_t(v))), 4);
    } else {
      // LONG1: the fewest bytes of little-endian two's complement that hold v, as CPython writes.
      int n = 1;
      while (n < 8 && (v < -(int64_t(1) << (8 * n - 1)) || v >= (int64_t(1) << (8 * n - 1)))) ++n;
      out_ += '\x8a';
      le(uint64_t(n), 1);
      le(uint64_t(v), n);
    }
  }

  void text(const std::string& s) {
    out_ += 'X';  // BINUNICODE: UTF-8
    le(s.size(), 4);
    out_ += s;
  }

  void items(const std::vector<PyRef>& values) {
    for (const PyRef& v : values) value(v);
  }

  void tuple(const std::vector<PyRef>& values) {
    if (values.empty()) {
      out_ += ')';
      return;
    }
    if (values.size() <= 3) {
      items(values);
      out_ += char(0x84 + values.size());  // TUPLE1..3
      return;
    }
    out_ += '(';
    items(values);
    out_ += 't';
  }

  void set_items(const std::vector<std::pair<PyRef, PyRef>>& entries) {
    if (entries.empty()) return;
    out_ += '(';
    for (const auto& [k, v] : entries) {
      value(k);
      value(v);
    }
    out_ += 'u';  // SETITEMS
  }

  void appends(const std::vector<PyRef>& values) {
    if (values.empty()) return;
    out_ += '(';
    items(values);
    out_ += 'e';  // APPENDS
  }

  void value(const PyRef& v) {
    using K = PyValue::Kind;
    if (!v || v->kind == K::None) {
      out_ += 'N';
      return;
    }
    switch (v->kind) {
      case K::Bool: out_ += v->boolean ? '\x88' : '\x89'; return;
      case K::Int: integer(v->integer); return;
      case K::BigInt:
        out_ += '\x8a';
        le(v->text.size(), 1);
        out_ += v->text;
        return;
      case K::Float: {
        uint64_t u = 0;
        std::memcpy(&u, &v->real, 8);
        out_ += 'G';  // BINFLOAT, big-endian
        for (int i = 7; i >= 0; --i) out_ += char((u >> (8 * i)) & 0xff);
        return;
      }
      case K::Str: text(v->text); return;
      case K::List:
        out_ += ']';
        appends(v->items);
        return;
      case K::Tuple: tuple(v->items); return;
      case K::Dict:
        out_ += '}';
        set_items(v->entries);
        return;
      case K::Global:
        out_ += 'c';  // GLOBAL module\nname\n
        out_ += v->text + "\n" + v->name + "\n";
        return;
      case K::Call:
        value(v->callable);
        value(v->args ? v->args : py_tuple({}));
        out_ += v->new_object ? '\x81' : 'R';  // NEWOBJ or REDUCE
        appends(v->items);
        set_items(v->entries);
        if (v->state) {
          value(v->state);
          out_ += 'b';  // BUILD
        }
        return;
      case K::PersistentId:
        value(v->state);
        out_ += 'Q';  // BINPERSID
        return;
      case K::Bytes: case K::Set: case K::None: break;
    }
    FP8TRON_CHECK(false, "writing a pickle value of a kind the writer does not support");
  }

  std::string out_;
};

}  // namespace

PyRef py_none() { return make_value(PyValue::Kind::None); }

PyRef py_bool(bool b) {
  auto v = make_value(PyValue::Kind::Bool);
  v->boolean = b;
  return v;
}

PyRef py_float(double d) {
  auto v = make_value(PyValue::Kind::Float);
  v->real = d;
  return v;
}

PyRef py_str(std::string s) {
  auto v = make_value(PyValue::Kind::Str);
  v->text = std::move(s);
  return v;
}

PyRef py_list(std::vector<PyRef> items) {
  auto v = make_value(PyValue::Kind::List);
  v->items = std::move(items);
  return v;
}

PyRef py_tuple(std::vector<PyRef> items) {
  auto v = make_value(PyValue::Kind::Tuple);
  v->items = std::move(items);
  return v;
}

PyRef py_int_tuple(const std::vector<int64_t>& values) {
  std::vector<PyRef> items;
  for (int64_t x : values) items.push_back(py_int(x));
  return py_tuple(std::move(items));
}

PyRef py_dict(std::vector<std::pair<std::string, PyRef>> entries) {
  auto v = make_value(PyValue::Kind::Dict);
  for (auto& [k, value] : entries) v->entries.emplace_back(py_str(k), std::move(value));
  return v;
}

PyRef py_global(std::string module, std::string name) {
  auto v = make_value(PyValue::Kind::Global);
  v->text = std::move(module);
  v->name = std::move(name);
  return v;
}

PyRef py_call(PyRef callable, std::vector<PyRef> args) {
  auto v = make_value(PyValue::Kind::Call);
  v->callable = std::move(callable);
  v->args = py_tuple(std::move(args));
  return v;
}

PyRef py_object(PyRef cls, PyRef state) {
  auto v = make_value(PyValue::Kind::Call);
  v->callable = std::move(cls);
  v->args = py_tuple({});
  v->new_object = true;
  v->state = std::move(state);
  return v;
}

PyRef py_persistent(PyRef id) {
  auto v = make_value(PyValue::Kind::PersistentId);
  v->state = std::move(id);
  return v;
}

std::string write_pickle(const PyRef& root) { return Writer().run(root); }

}  // namespace fp8tron::checkpoint::megatron
