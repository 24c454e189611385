#include "trainer/cli/moe_layer_freq.h"

#include <cctype>

#include "core/error.h"
#include "core/text.h"

namespace fp8tron {
namespace {

// A Python value of the pattern language: an int or a list of values.
struct Value {
  bool is_list = false;
  int64_t number = 0;
  std::vector<Value> items;
};

// Recursive descent over Python's grammar restricted to the pattern alphabet:
//   expr   := term ('+' term)*
//   term   := factor ('*' factor)*          ('*' here never starts '**')
//   factor := '+' factor | power
//   power  := atom ['**' factor]
//   atom   := INT | '[' [expr (',' expr)* [',']] ']' | '(' expr ')'
// A parenthesised expression with a top-level comma would be a tuple, which is not a list.
class PatternParser {
 public:
  explicit PatternParser(const std::string& text) : s_(text) {}

  Value parse() {
    Value v = expr();
    if (pos_ != s_.size()) fail("unexpected '" + std::string(1, s_[pos_]) + "'");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw UserError("--moe-layer-freq '" + s_ + "': " + why + " (at character " + std::to_string(pos_ + 1) + ")");
  }
  bool at(char c) const { return pos_ < s_.size() && s_[pos_] == c; }
  bool at_power() const { return pos_ + 1 < s_.size() && s_[pos_] == '*' && s_[pos_ + 1] == '*'; }

  Value expr() {
    Value v = term();
    while (at('+')) {
      ++pos_;
      v = add(v, term());
    }
    return v;
  }
  Value term() {
    Value v = factor();
    while (at('*') && !at_power()) {
      ++pos_;
      v = multiply(v, factor());
    }
    return v;
  }
  Value factor() {
    if (!at('+')) return power();
    ++pos_;
    Value v = factor();
    if (v.is_list) fail("unary + of a list");
    return v;
  }
  Value power() {
    Value base = atom();
    if (!at_power()) return base;
    pos_ += 2;
    Value exponent = factor();
    if (base.is_list || exponent.is_list) fail("** of a list");
    int64_t result = 1;
    for (int64_t i = 0; i < exponent.number; ++i) {
      result *= base.number;
      if (result > (int64_t(1) << 40)) fail("number too large");
    }
    return Value{false, result, {}};
  }
  Value atom() {
    if (at('[')) return list();
    if (at('(')) {
      ++pos_;
      Value v = expr();
      if (at(',')) fail("a parenthesised expression with a comma is a tuple, not a list");
      if (!at(')')) fail("expected ')'");
      ++pos_;
      return v;
    }
    return integer();
  }
  Value list() {
    ++pos_;  // '['
    Value v{true, 0, {}};
    while (!at(']')) {
      v.items.push_back(expr());
      if (at(',')) {
        ++pos_;
        continue;
      }
      if (!at(']')) fail("expected ',' or ']'");
    }
    ++pos_;
    return v;
  }
  Value integer() {
    const size_t start = pos_;
    while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    if (pos_ == start) fail(pos_ < s_.size() ? "unexpected '" + std::string(1, s_[pos_]) + "'" : "unexpected end");
    const std::string digits = s_.substr(start, pos_ - start);
    // Python 3 refuses leading zeros in a decimal literal (except for zero itself).
    if (digits.size() > 1 && digits[0] == '0' && digits.find_first_not_of('0') != std::string::npos)
      fail("leading zeros in '" + digits + "'");
    if (digits.size() > 12) fail("number too large");
    return Value{false, std::stoll(digits), {}};
  }
  Value add(const Value& a, const Value& b) {
    if (a.is_list != b.is_list) fail("+ of a list and an int");
    if (!a.is_list) return Value{false, a.number + b.number, {}};
    Value v = a;
    v.items.insert(v.items.end(), b.items.begin(), b.items.end());
    return v;
  }
  Value multiply(const Value& a, const Value& b) {
    if (a.is_list && b.is_list) fail("* of two lists");
    if (!a.is_list && !b.is_list) return Value{false, a.number * b.number, {}};
    const Value& list = a.is_list ? a : b;
    const int64_t times = a.is_list ? b.number : a.number;
    if (times * int64_t(list.items.size()) > 1000000) fail("list too long");
    Value v{true, 0, {}};
    for (int64_t i = 0; i < times; ++i) v.items.insert(v.items.end(), list.items.begin(), list.items.end());
    return v;
  }

  const std::string& s_;
  size_t pos_ = 0;
};

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

}  // namespace

std::vector<bool> parse_moe_layer_freq(const std::string& value, int64_t num_layers) {
  const std::string flag = "--moe-layer-freq '" + value + "'";
  if (value.find('[') == std::string::npos) {
    if (!all_digits(value))
      throw UserError(flag + ": expected an int N (every N-th layer is an MoE layer) or a list pattern such as "
                      "\"([0]*1+[1]*3)*2\"");
    const int64_t n = value.size() > 12 ? 0 : std::stoll(value);
    if (n < 1) throw UserError(flag + ": the frequency must be at least 1");
    std::vector<bool> pattern(static_cast<size_t>(num_layers));
    for (int64_t i = 0; i < num_layers; ++i) pattern[size_t(i)] = i % n == 0;
    return pattern;
  }
  // Megatron's alphabet check before its eval(): nothing but , digits [ ] ( ) + *.
  for (char c : value)
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == ',' || c == '[' || c == ']' || c == '(' || c == ')' ||
          c == '+' || c == '*'))
      throw UserError(flag + ": invalid pattern: only digits and , [ ] ( ) + * are allowed (no spaces)");
  const Value v = PatternParser(value).parse();
  if (!v.is_list) throw UserError(flag + ": the pattern must evaluate to a list");
  std::vector<bool> pattern;
  for (const Value& item : v.items) {
    if (item.is_list || (item.number != 0 && item.number != 1))
      throw UserError(flag + ": the pattern must be a flat list of 0 (dense layer) and 1 (MoE layer)");
    pattern.push_back(item.number == 1);
  }
  if (int64_t(pattern.size()) != num_layers)
    throw UserError(strprintf("%s: the pattern has %zu entries but --num-layers is %lld", flag.c_str(), pattern.size(),
                              (long long)num_layers));
  return pattern;
}

}  // namespace fp8tron
