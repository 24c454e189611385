#include "checkpoint/megatron/pickle.h"

#include <cstring>
#include <unordered_map>

#include "checkpoint/megatron/damage.h"
#include "core/error.h"
#include "core/text.h"

namespace fp8tron::checkpoint::megatron {
PyRef make_value(PyValue::Kind kind) {
  auto v = std::make_shared<PyValue>();
  v->kind = kind;
  return v;
}

PyRef py_int(int64_t i) {
  auto v = make_value(PyValue::Kind::Int);
  v->integer = i;
  return v;
}

namespace {

PyRef make_text(PyValue::Kind kind, std::string s) {
  auto v = make_value(kind);
  v->text = std::move(s);
  return v;
}

// A little-endian two's-complement integer (LONG1/LONG4): an Int when it fits in 64 bits.
PyRef make_long(std::string_view bytes) {
  if (bytes.size() > 8) return make_text(PyValue::Kind::BigInt, std::string(bytes));
  uint64_t u = 0;
  for (size_t i = 0; i < bytes.size(); ++i) u |= uint64_t(uint8_t(bytes[i])) << (8 * i);
  if (!bytes.empty() && bytes.size() < 8 && (uint8_t(bytes.back()) & 0x80)) u |= ~uint64_t(0) << (8 * bytes.size());
  return py_int(int64_t(u));
}

class Parser {
 public:
  Parser(std::string_view bytes, const std::string& source) : in_(bytes), source_(source) {}

  PyRef run() {
    while (true) {
      if (at_ >= in_.size()) fail("ends before its STOP opcode (truncated)");
      const size_t start = at_;
      const uint8_t op = uint8_t(in_[at_++]);
      if (op == '.') break;
      step(op, start);
    }
    if (stack_.size() != 1) fail(strprintf("leaves %zu values on its stack at STOP", stack_.size()));
    return stack_.back();
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw DamagedCheckpoint(strprintf("%s: not a readable pickle at byte %zu: %s", source_.c_str(), at_, what.c_str()));
  }

  std::string_view take(size_t n) {
    if (n > in_.size() - at_) fail(strprintf("a value of %zu bytes runs past the end (truncated)", n));
    std::string_view out = in_.substr(at_, n);
    at_ += n;
    return out;
  }
  uint64_t unsigned_le(size_t n) {
    std::string_view b = take(n);
    uint64_t u = 0;
    for (size_t i = 0; i < n; ++i) u |= uint64_t(uint8_t(b[i])) << (8 * i);
    return u;
  }
  std::string line() {
    const size_t end = in_.find('\n', at_);
    if (end == std::string_view::npos) fail("a text argument has no end of line (truncated)");
    std::string out(in_.substr(at_, end - at_));
    at_ = end + 1;
    return out;
  }
  int64_t line_int() {
    const std::string text = line();
    try {
      size_t used = 0;
      const int64_t v = std::stoll(text, &used);
      if (used + (text.size() > used && text.back() == 'L' ? 1 : 0) == text.size()) return v;
    } catch (const std::exception&) {
    }
    fail("'" + escaped_bytes(text) + "' is not an integer");
  }

  PyRef pop() {
    if (stack_.size() <= (marks_.empty() ? 0 : marks_.back())) fail("pops from an empty stack");
    PyRef v = stack_.back();
    stack_.pop_back();
    return v;
  }
  PyRef& top() {
    if (stack_.empty()) fail("reads an empty stack");
    return stack_.back();
  }
  // The values pushed since the last MARK, which is removed.
  std::vector<PyRef> pop_mark() {
    if (marks_.empty()) fail("no MARK for an opcode that needs one");
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<PyRef> out(stack_.begin() + ptrdiff_t(m), stack_.end());
    stack_.resize(m);
    return out;
  }
  PyRef tuple(std::vector<PyRef> items) {
    auto t = make_value(PyValue::Kind::Tuple);
    t->items = std::move(items);
    return t;
  }
  PyRef global(std::string module, std::string name) {
    auto g = make_text(PyValue::Kind::Global, std::move(module));
    g->name = std::move(name);
    return g;
  }
  PyRef call(PyRef callable, PyRef args) {
    auto c = make_value(PyValue::Kind::Call);
    c->callable = std::move(callable);
    c->args = std::move(args);
    return c;
  }
  void memo_put(int64_t key) { memo_[key] = top(); }
  PyRef memo_get(int64_t key) {
    auto it = memo_.find(key);
    if (it == memo_.end()) fail(strprintf("refers to memo entry %lld, never stored", (long long)key));
    return it->second;
  }
  // APPEND(S) on a list, or on an instance (a list subclass): its items.
  void append(PyRef& target, std::vector<PyRef> values) {
    if (target->kind != PyValue::Kind::List && target->kind != PyValue::Kind::Call) fail("appends to a non-list");
    for (auto& v : values) target->items.push_back(std::move(v));
  }
  void set_items(PyRef& target, std::vector<PyRef> kv) {
    if (target->kind != PyValue::Kind::Dict && target->kind != PyValue::Kind::Call) fail("sets items of a non-dict");
    if (kv.size() % 2) fail("SETITEMS with an odd number of values");
    for (size_t i = 0; i < kv.size(); i += 2) target->entries.emplace_back(kv[i], kv[i + 1]);
  }

  void step(uint8_t op, size_t start) {
    using K = PyValue::Kind;
    switch (op) {
      case 0x80: take(1); return;              // PROTO
      case 0x95: take(8); return;              // FRAME: framing only
      case '(': marks_.push_back(stack_.size()); return;
      case '0': pop(); return;
      case '1': pop_mark(); return;
      case '2': stack_.push_back(top()); return;
      case 'N': stack_.push_back(make_value(K::None)); return;
      case 0x88: case 0x89: {
        auto b = make_value(K::Bool);
        b->boolean = op == 0x88;
        stack_.push_back(b);
        return;
      }
      case 'I': {
        const std::string text = line();
        if (text == "00" || text == "01") {
          auto b = make_value(K::Bool);
          b->boolean = text == "01";
          stack_.push_back(b);
          return;
        }
        at_ -= text.size() + 1;
        stack_.push_back(py_int(line_int()));
        return;
      }
      case 'L': stack_.push_back(py_int(line_int())); return;
      case 'J': stack_.push_back(py_int(int32_t(uint32_t(unsigned_le(4))))); return;
      case 'K': stack_.push_back(py_int(int64_t(unsigned_le(1)))); return;
      case 'M': stack_.push_back(py_int(int64_t(unsigned_le(2)))); return;
      case 0x8a: stack_.push_back(make_long(take(unsigned_le(1)))); return;
      case 0x8b: stack_.push_back(make_long(take(unsigned_le(4)))); return;
      case 'F': {
        auto f = make_value(K::Float);
        f->real = std::strtod(line().c_str(), nullptr);
        stack_.push_back(f);
        return;
      }
      case 'G': {
        std::string_view b = take(8);
        uint64_t u = 0;
        for (int i = 0; i < 8; ++i) u = (u << 8) | uint8_t(b[size_t(i)]);  // big-endian
        auto f = make_value(K::Float);
        std::memcpy(&f->real, &u, 8);
        stack_.push_back(f);
        return;
      }
      case 'S': {  // a quoted Python 2 string: kept without its quotes
        std::string text = line();
        if (text.size() >= 2) text = text.substr(1, text.size() - 2);
        stack_.push_back(make_text(K::Str, text));
        return;
      }
      case 'V': stack_.push_back(make_text(K::Str, line())); return;
      case 'T': stack_.push_back(make_text(K::Str, std::string(take(unsigned_le(4))))); return;
      case 'U': stack_.push_back(make_text(K::Str, std::string(take(unsigned_le(1))))); return;
      case 'X': stack_.push_back(make_text(K::Str, std::string(take(unsigned_le(4))))); return;
      case 0x8c: stack_.push_back(make_text(K::Str, std::string(take(unsigned_le(1))))); return;
      case 0x8d: stack_.push_back(make_text(K::Str, std::string(take(unsigned_le(8))))); return;
      case 'B': stack_.push_back(make_text(K::Bytes, std::string(take(unsigned_le(4))))); return;
      case 'C': stack_.push_back(make_text(K::Bytes, std::string(take(unsigned_le(1))))); return;
      case 0x8e: case 0x96: stack_.push_back(make_text(K::Bytes, std::string(take(unsigned_le(8))))); return;
      case ']': stack_.push_back(make_value(K::List)); return;
      case 'l': {
        auto l = make_value(K::List);
        l->items = pop_mark();
        stack_.push_back(l);
        return;
      }
      case 'a': {
        PyRef v = pop();
        append(top(), {v});
        return;
      }
      case 'e': {
        auto values = pop_mark();
        append(top(), std::move(values));
        return;
      }
      case ')': stack_.push_back(tuple({})); return;
      case 't': stack_.push_back(tuple(pop_mark())); return;
      case 0x85: case 0x86: case 0x87: {
        const size_t n = op - 0x84;
        if (stack_.size() < n) fail("TUPLE of more values than the stack holds");
        std::vector<PyRef> items(stack_.end() - ptrdiff_t(n), stack_.end());
        stack_.resize(stack_.size() - n);
        stack_.push_back(tuple(std::move(items)));
        return;
      }
      case '}': stack_.push_back(make_value(K::Dict)); return;
      case 'd': {
        auto d = make_value(K::Dict);
        set_items(d, pop_mark());
        stack_.push_back(d);
        return;
      }
      case 's': {
        PyRef value = pop(), key = pop();
        set_items(top(), {key, value});
        return;
      }
      case 'u': {
        auto kv = pop_mark();
        set_items(top(), std::move(kv));
        return;
      }
      case 0x8f: stack_.push_back(make_value(K::Set)); return;
      case 0x90: {
        auto values = pop_mark();
        if (top()->kind != K::Set) fail("ADDITEMS to a non-set");
        for (auto& v : values) top()->items.push_back(std::move(v));
        return;
      }
      case 0x91: {
        auto s = make_value(K::Set);
        s->items = pop_mark();
        stack_.push_back(s);
        return;
      }
      case 'c': {
        std::string module = line();
        stack_.push_back(global(std::move(module), line()));
        return;
      }
      case 0x93: {
        PyRef name = pop(), module = pop();
        if (module->kind != K::Str || name->kind != K::Str) fail("STACK_GLOBAL of non-strings");
        stack_.push_back(global(module->text, name->text));
        return;
      }
      case 'R': case 0x81: {  // REDUCE, NEWOBJ: callable(*args)
        PyRef args = pop(), callable = pop();
        stack_.push_back(call(callable, args));
        stack_.back()->new_object = op == 0x81;
        return;
      }
      case 0x92: {  // NEWOBJ_EX: the keyword arguments are dropped (never used by the classes read)
        pop();
        PyRef args = pop(), callable = pop();
        stack_.push_back(call(callable, args));
        return;
      }
      case 'i': {  // INST module\nname\n over the marked arguments
        std::string module = line();
        PyRef g = global(std::move(module), line());
        stack_.push_back(call(g, tuple(pop_mark())));
        return;
      }
      case 'o': {
        auto values = pop_mark();
        if (values.empty()) fail("OBJ without a class");
        PyRef g = values.front();
        values.erase(values.begin());
        stack_.push_back(call(g, tuple(std::move(values))));
        return;
      }
      case 'b': {
        PyRef state = pop();
        PyRef& target = top();
        if (target->kind != K::Call) {
          // BUILD on something that is not an instance: keep its state in a wrapping call.
          target = call(target, tuple({}));
        }
        target->state = state;
        return;
      }
      case 'p': memo_put(line_int()); return;
      case 'q': memo_put(int64_t(unsigned_le(1))); return;
      case 'r': memo_put(int64_t(unsigned_le(4))); return;
      case 0x94: memo_put(int64_t(memo_.size())); return;
      case 'g': stack_.push_back(memo_get(line_int())); return;
      case 'h': stack_.push_back(memo_get(int64_t(unsigned_le(1)))); return;
      case 'j': stack_.push_back(memo_get(int64_t(unsigned_le(4)))); return;
      case 'P': {
        auto p = make_value(K::PersistentId);
        p->state = make_text(K::Str, line());
        stack_.push_back(p);
        return;
      }
      case 'Q': {
        auto p = make_value(K::PersistentId);
        p->state = pop();
        stack_.push_back(p);
        return;
      }
      default:
        at_ = start;
        fail(strprintf("opcode 0x%02x is not supported (protocols 2 to 5 without out-of-band buffers or "
                       "extension codes are)", op));
    }
  }

  std::string_view in_;
  const std::string& source_;
  size_t at_ = 0;
  std::vector<PyRef> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<int64_t, PyRef> memo_;
};

// The dicts that hold `v`'s attributes or items, in lookup order.
std::vector<const std::vector<std::pair<PyRef, PyRef>>*> dicts_of(const PyRef& v) {
  std::vector<const std::vector<std::pair<PyRef, PyRef>>*> out;
  if (!v) return out;
  if (v->kind == PyValue::Kind::Dict) out.push_back(&v->entries);
  if (v->kind != PyValue::Kind::Call) return out;
  out.push_back(&v->entries);  // an OrderedDict's items
  const PyRef& s = v->state;
  if (s && s->kind == PyValue::Kind::Dict) out.push_back(&s->entries);
  if (s && s->kind == PyValue::Kind::Tuple && s->items.size() == 2) {
    for (const auto& part : s->items)
      if (part && part->kind == PyValue::Kind::Dict) out.push_back(&part->entries);
  }
  return out;
}

}  // namespace

PyRef parse_pickle(std::string_view bytes, const std::string& source) { return Parser(bytes, source).run(); }

bool is_none(const PyRef& v) { return !v || v->kind == PyValue::Kind::None; }

bool is_global(const PyRef& v, std::string_view module, std::string_view name) {
  return v && v->kind == PyValue::Kind::Global && v->text == module && v->name == name;
}

bool is_call_of(const PyRef& v, std::string_view module, std::string_view name) {
  return v && v->kind == PyValue::Kind::Call && is_global(v->callable, module, name);
}

std::string qualified_name(const PyRef& v) {
  if (!v) return "";
  if (v->kind == PyValue::Kind::Global) return v->text + "." + v->name;
  if (v->kind == PyValue::Kind::Call) return qualified_name(v->callable);
  return "";
}

PyRef attribute(const PyRef& v, std::string_view key) {
  for (const auto* entries : dicts_of(v))
    for (const auto& [k, value] : *entries)
      if (k && k->kind == PyValue::Kind::Str && k->text == key) return value;
  return nullptr;
}

std::vector<std::pair<std::string, PyRef>> attributes(const PyRef& v) {
  std::vector<std::pair<std::string, PyRef>> out;
  for (const auto* entries : dicts_of(v))
    for (const auto& [k, value] : *entries)
      if (k && k->kind == PyValue::Kind::Str) out.emplace_back(k->text, value);
  return out;
}

bool as_int(const PyRef& v, int64_t& out) {
  if (!v) return false;
  if (v->kind == PyValue::Kind::Int) out = v->integer;
  else if (v->kind == PyValue::Kind::Bool) out = v->boolean ? 1 : 0;
  else return false;
  return true;
}

bool as_double(const PyRef& v, double& out) {
  if (!v) return false;
  if (v->kind == PyValue::Kind::Float) out = v->real;
  else if (v->kind == PyValue::Kind::Int) out = double(v->integer);
  else return false;
  return true;
}

bool as_string(const PyRef& v, std::string& out) {
  if (!v || v->kind != PyValue::Kind::Str) return false;
  out = v->text;
  return true;
}

bool as_int_list(const PyRef& v, std::vector<int64_t>& out) {
  if (!v) return false;
  if (is_call_of(v, "torch", "Size") && v->args && v->args->kind == PyValue::Kind::Tuple && v->args->items.size() == 1)
    return as_int_list(v->args->items[0], out);
  if (v->kind != PyValue::Kind::Tuple && v->kind != PyValue::Kind::List) return false;
  std::vector<int64_t> values;
  for (const auto& item : v->items) {
    int64_t i = 0;
    if (!as_int(item, i)) return false;
    values.push_back(i);
  }
  out = std::move(values);
  return true;
}

namespace {

void render(const PyRef& v, std::string& out, size_t max_chars) {
  using K = PyValue::Kind;
  if (out.size() > max_chars) return;
  if (!v) {
    out += "None";
    return;
  }
  auto sequence = [&](const char* open, const char* close, const std::vector<PyRef>& items) {
    out += open;
    for (size_t i = 0; i < items.size() && out.size() <= max_chars; ++i) {
      if (i) out += ", ";
      render(items[i], out, max_chars);
    }
    out += close;
  };
  switch (v->kind) {
    case K::None: out += "None"; return;
    case K::Bool: out += v->boolean ? "True" : "False"; return;
    case K::Int: out += std::to_string(v->integer); return;
    case K::BigInt: out += "<big int>"; return;
    case K::Float: out += strprintf("%g", v->real); return;
    case K::Str: out += "'" + v->text + "'"; return;
    case K::Bytes: out += strprintf("<%zu bytes>", v->text.size()); return;
    case K::List: sequence("[", "]", v->items); return;
    case K::Tuple: sequence("(", ")", v->items); return;
    case K::Set: sequence("{", "}", v->items); return;
    case K::Dict:
      out += "{";
      for (size_t i = 0; i < v->entries.size() && out.size() <= max_chars; ++i) {
        if (i) out += ", ";
        render(v->entries[i].first, out, max_chars);
        out += ": ";
        render(v->entries[i].second, out, max_chars);
      }
      out += "}";
      return;
    case K::Global: out += v->text + "." + v->name; return;
    case K::Call:
      out += qualified_name(v);
      sequence("(", ")", v->args ? v->args->items : std::vector<PyRef>{});
      return;
    case K::PersistentId: out += "<persistent id>"; return;
  }
}

}  // namespace

std::string describe(const PyRef& v, size_t max_chars) {
  std::string out;
  render(v, out, max_chars);
  if (out.size() > max_chars) out = out.substr(0, max_chars) + "...";
  return out;
}

}  // namespace fp8tron::checkpoint::megatron
