#include "trainer/cli/logging_args.h"

#include <cctype>
#include <climits>

#include "core/error.h"

namespace fp8tron {
namespace {
int saturate(long long v) { return v > INT_MAX ? INT_MAX : v < INT_MIN ? INT_MIN : int(v); }
}  // namespace

std::optional<int> parse_python_int(const std::string& text) {
  size_t begin = 0, end = text.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(text[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  bool negative = false;
  if (begin < end && (text[begin] == '+' || text[begin] == '-')) negative = text[begin++] == '-';
  if (begin == end) return std::nullopt;
  long long value = 0;
  bool previous_digit = false;
  for (size_t i = begin; i < end; ++i) {
    const char ch = text[i];
    if (ch == '_') {
      // Only between two digits (PEP 515).
      if (!previous_digit || i + 1 == end || !std::isdigit(static_cast<unsigned char>(text[i + 1]))) return std::nullopt;
      previous_digit = false;
      continue;
    }
    if (!std::isdigit(static_cast<unsigned char>(ch))) return std::nullopt;
    previous_digit = true;
    if (value < LLONG_MAX / 100) value = value * 10 + (ch - '0');  // saturated below anyway
  }
  return saturate(negative ? -value : value);
}

std::optional<int> resolve_logging_level(const FlagValues& flags, const EnvLookup& lookup) {
  if (const auto flag = flags.opt_int("logging-level")) return saturate(*flag);
  const char* env = lookup("MEGATRON_LOGGING_LEVEL");
  if (env == nullptr) return std::nullopt;
  const auto level = parse_python_int(env);
  if (!level)
    throw UserError(std::string("MEGATRON_LOGGING_LEVEL='") + env +
                    "' is not an integer logging level (Megatron reads it with int()): use e.g. 20 (INFO), 30 "
                    "(WARNING) or 40 (ERROR), or unset it");
  return level;
}

}  // namespace fp8tron
