#include "data/tokenizer_null.h"

#include <cerrno>
#include <cstdlib>

#include "core/error.h"
#include "core/text.h"

namespace fp8tron::data {

NullTokenizer::NullTokenizer(int64_t vocab_size, std::optional<int64_t> eod_id, int64_t pad_id)
    : vocab_size_(vocab_size), eod_(eod_id.value_or(vocab_size - 1)), pad_(pad_id) {
  if (vocab_size <= 0) throw UserError("NullTokenizer needs --vocab-size N (a positive number of ids)");
}

// [int(x) for x in text.split(' ')]: every single space separates two numbers (so "1  2" or a
// trailing space is an error, as in Megatron); Python's int() allows surrounding whitespace.
std::vector<int64_t> NullTokenizer::tokenize(std::string_view text) const {
  std::vector<int64_t> ids;
  size_t start = 0;
  while (true) {
    const size_t end = std::min(text.find(' ', start), text.size());
    const std::string field(text.substr(start, end - start));
    char* stop = nullptr;
    errno = 0;
    const long long v = std::strtoll(field.c_str(), &stop, 10);
    while (stop && *stop && std::string_view("\t\n\r\v\f").find(*stop) != std::string_view::npos) ++stop;
    if (field.empty() || stop == field.c_str() || *stop != '\0' || errno == ERANGE)
      throw UserError(strprintf("NullTokenizer: '%s' is not an integer token id (its input is ids separated by "
                                "single spaces)", field.c_str()));
    ids.push_back(v);
    if (end == text.size()) break;
    start = end + 1;
  }
  return ids;
}

std::string NullTokenizer::detokenize(const std::vector<int64_t>& ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? " " : "") + std::to_string(ids[i]);
  return out;
}

}  // namespace fp8tron::data
