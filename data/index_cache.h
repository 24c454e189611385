// On-disk cache for dataset indices that many processes may ask for at once.
//
// Files live in one directory as `<base>-<suffix>` plus `<base>-description.txt`, the
// human-readable parameters the indices were built from. The first process to miss takes an
// exclusive flock on `<base>.lock` and builds; the others block on the lock and, once it is
// released, find the files and map them. Every file is written under a temporary name and renamed
// into place, the description last, so a reader that sees a matching description sees complete
// files; a crashed builder leaves only temporaries behind. Where the file system has no flock
// (some network mounts) every process builds its own copy and the renames still keep readers safe.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace fp8tron::data {

struct CacheEntry {
  std::string dir;          // created if missing
  std::string base;         // e.g. "fp8tron-1a2b...-GPTDataset-train"
  std::string description;  // must match the stored description exactly for a hit
  std::vector<std::string> suffixes;  // e.g. {"document_index.npy", ...}

  std::string path(const std::string& suffix) const { return dir + "/" + base + "-" + suffix; }
};

// Builds the entry's files unless a complete, matching copy exists. `build` receives one
// temporary path per suffix and must write them all. Returns true when it built (cache miss).
bool ensure_cached(const CacheEntry& entry, const std::function<void(const std::vector<std::string>&)>& build);

// FNV-1a over the text, as 16 hex digits: names cache files after their parameters. Collisions
// are caught by comparing the stored description.
std::string hash_hex(const std::string& text);

}  // namespace fp8tron::data
