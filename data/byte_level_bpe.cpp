#include "data/byte_level_bpe.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <queue>

#include "data/unicode.h"

namespace fp8tron::data {

// Printable bytes stand for themselves; the others (control characters, space, DEL, NBSP, soft
// hyphen) are moved to 256 + n in byte order, so every byte has a visible, non-space stand-in.
uint32_t byte_to_unicode(uint8_t b) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    uint32_t next = 256;
    for (int c = 0; c < 256; ++c) {
      const bool printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
      t[size_t(c)] = printable ? uint32_t(c) : next++;
    }
    return t;
  }();
  return table[b];
}

int unicode_to_byte(uint32_t cp) {
  static const auto inverse = [] {
    std::unordered_map<uint32_t, int> m;
    for (int b = 0; b < 256; ++b) m[byte_to_unicode(uint8_t(b))] = b;
    return m;
  }();
  auto it = inverse.find(cp);
  return it == inverse.end() ? -1 : it->second;
}

std::string ByteLevelBpe::to_stand_ins(std::string_view bytes) {
  std::string out;
  for (char c : bytes) append_utf8(out, byte_to_unicode(uint8_t(c)));
  return out;
}

namespace {

std::atomic<uint64_t> g_instances{0};

// Per-thread cache of piece -> ids for one tokenizer at a time. Bounded: cleared when it grows
// past kMaxEntries (a few tens of MB), which keeps the common words hot anyway.
struct PieceCache {
  static constexpr size_t kMaxEntries = 1 << 19;
  uint64_t owner = ~0ULL;
  std::unordered_map<std::string, std::vector<int32_t>> map;
};

}  // namespace

ByteLevelBpe::ByteLevelBpe(const std::unordered_map<std::string, int64_t>& vocab,
                           const std::vector<std::pair<std::string, std::string>>& merges, Options options)
    : options_(options), instance_(g_instances++) {
  for (int b = 0; b < 256; ++b) {
    std::string s;
    append_utf8(s, byte_to_unicode(uint8_t(b)));
    byte_symbol_[b] = intern(s);
  }
  // Later duplicates of a pair take the later rank, as Python's dict(zip(merges, ranks)) does.
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    if (merges[rank].first.empty() || merges[rank].second.empty()) continue;  // unusable line
    const int32_t left = intern(merges[rank].first), right = intern(merges[rank].second);
    const int32_t result = intern(merges[rank].first + merges[rank].second);
    merges_[uint64_t(uint32_t(left)) << 32 | uint32_t(right)] = Merge{int32_t(rank), result};
  }
  symbol_vocab_id_.resize(symbols_.size());
  for (size_t s = 0; s < symbols_.size(); ++s) {
    auto it = vocab.find(symbols_[s]);
    symbol_vocab_id_[s] = it == vocab.end() ? options_.unknown_id : it->second;
  }
  if (options_.ignore_merges) whole_piece_vocab_ = vocab;
}

int32_t ByteLevelBpe::intern(const std::string& symbol) {
  auto [it, inserted] = symbol_ids_.emplace(symbol, int32_t(symbols_.size()));
  if (inserted) symbols_.push_back(symbol);
  return it->second;
}

const ByteLevelBpe::Merge* ByteLevelBpe::find_merge(int32_t left, int32_t right) const {
  auto it = merges_.find(uint64_t(uint32_t(left)) << 32 | uint32_t(right));
  return it == merges_.end() ? nullptr : &it->second;
}

// The rounds of the reference algorithm. Each candidate pair sits in a min-heap keyed by
// (rank, position); a round pops every entry of the lowest rank, merges those still valid from
// left to right, and only then queues the pairs the merges created, so a round never sees pairs
// made within it (as the reference, which scans the word of the previous round).
void ByteLevelBpe::merge_symbols(std::vector<int32_t>& symbols) const {
  const int n = int(symbols.size());
  if (n < 2) return;
  thread_local std::vector<int> prev, next;
  prev.resize(size_t(n));
  next.resize(size_t(n));
  for (int i = 0; i < n; ++i) {
    prev[size_t(i)] = i - 1;
    next[size_t(i)] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    int32_t rank;
    int pos, left, right;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  const auto push_pair = [&](int pos) {
    if (pos < 0 || next[size_t(pos)] < 0) return;
    const int32_t l = symbols[size_t(pos)], r = symbols[size_t(next[size_t(pos)])];
    if (const Merge* m = find_merge(l, r)) heap.push({m->rank, pos, l, r});
  };
  const auto valid = [&](const Candidate& c) {
    return symbols[size_t(c.pos)] == c.left && next[size_t(c.pos)] >= 0 && symbols[size_t(next[size_t(c.pos)])] == c.right;
  };
  for (int i = 0; i + 1 < n; ++i) push_pair(i);
  std::vector<int> merged;
  while (!heap.empty()) {
    const int32_t rank = heap.top().rank;
    merged.clear();
    while (!heap.empty() && heap.top().rank == rank) {  // popped in position order
      const Candidate c = heap.top();
      heap.pop();
      if (!valid(c)) continue;  // stale, or overlapping a merge made earlier in this round
      const int right = next[size_t(c.pos)];
      symbols[size_t(c.pos)] = find_merge(c.left, c.right)->result;
      symbols[size_t(right)] = -1;
      next[size_t(c.pos)] = next[size_t(right)];
      if (next[size_t(right)] >= 0) prev[size_t(next[size_t(right)])] = c.pos;
      merged.push_back(c.pos);
    }
    for (int pos : merged) {
      push_pair(prev[size_t(pos)]);
      push_pair(pos);
    }
  }
  symbols.erase(std::remove(symbols.begin(), symbols.end(), -1), symbols.end());
}

void ByteLevelBpe::encode_uncached(std::string_view piece, std::vector<int32_t>& out) const {
  std::vector<int32_t> symbols;
  symbols.reserve(piece.size());
  for (char c : piece) symbols.push_back(byte_symbol_[uint8_t(c)]);
  merge_symbols(symbols);
  out = std::move(symbols);
}

void ByteLevelBpe::encode(std::string_view piece, std::vector<int64_t>& out) const {
  if (options_.ignore_merges) {
    auto it = whole_piece_vocab_.find(to_stand_ins(piece));
    if (it != whole_piece_vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  thread_local PieceCache cache;
  if (cache.owner != instance_ || cache.map.size() >= PieceCache::kMaxEntries) {
    cache.map.clear();
    cache.owner = instance_;
  }
  thread_local std::string key;
  key.assign(piece.data(), piece.size());
  auto it = cache.map.find(key);
  if (it == cache.map.end()) {
    std::vector<int32_t> symbols;
    encode_uncached(piece, symbols);
    it = cache.map.emplace(key, std::move(symbols)).first;
  }
  for (int32_t s : it->second) {
    const int64_t id = symbol_vocab_id_[size_t(s)];
    if (id >= 0) out.push_back(id);  // a negative unknown_id drops the symbol (HF without unk_token)
  }
}

}  // namespace fp8tron::data
