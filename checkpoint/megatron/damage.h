// A checkpoint that is damaged (truncated, corrupt, malformed) or cannot be read, as opposed to
// one that is intact but does not fit this run, and what a load says about it. Loading turns it
// into a refusal that lists the other complete iterations --ckpt-step can load. It is declared
// here, in the lowest checkpoint library, because the Megatron readers throw it too.
#pragma once
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>

#include "core/error.h"

namespace fp8tron::checkpoint {

class DamagedCheckpoint : public UserError {
 public:
  using UserError::UserError;
};

// Bytes read from a damaged file, fit for a one-line message: printable ASCII as is, anything
// else as \xNN, at most `max_chars` characters of output ("..." marks a cut).
inline std::string escaped_bytes(std::string_view bytes, size_t max_chars = 40) {
  std::string out;
  for (size_t i = 0; i < bytes.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(bytes[i]);
    std::string piece(1, char(c));
    if (c == '\\') {
      piece = "\\\\";
    } else if (c < 0x20 || c >= 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", unsigned(c));
      piece = hex;
    }
    if (out.size() + piece.size() > max_chars) return out + "...";
    out += piece;
  }
  return out;
}

// A JSON parser's message about damaged bytes: it quotes what it read last, which is bounded and
// escaped like any other damaged bytes.
inline std::string escaped_parse_error(const std::string& what) {
  const std::string quote = "last read: ";
  const size_t at = what.find(quote);
  if (at == std::string::npos) return escaped_bytes(what, 240);
  return escaped_bytes(std::string_view(what).substr(0, at), 240) + quote +
         escaped_bytes(std::string_view(what).substr(at + quote.size()), 40);
}

// "could not read <path>: permission denied while opening it; ..." and friends: a failed read
// says what could not be read and why, never where to save (io_error_message is for writes).
inline std::string read_error_message(const char* doing, const std::string& path, int err) {
  std::string why;
  switch (err) {
    case EACCES:
    case EPERM:
      why = "permission denied while " + std::string(doing) + " it; give this user read permission on it (and "
            "search permission on its directories), or run as the user that owns it";
      break;
    case EIO:
      why = "I/O error (EIO) while " + std::string(doing) + " it; the storage device or network file system "
            "reported a failure: check it and retry";
      break;
    case ENOENT: why = "it does not exist"; break;
    default: why = std::strerror(err) + std::string(" while ") + doing + " it"; break;
  }
  return "could not read " + path + ": " + why;
}

}  // namespace fp8tron::checkpoint
