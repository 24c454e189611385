#include "trainer/cli/flag_docs.h"

#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "trainer/cli/flag_table.h"

namespace fp8tron {
namespace {

// fp8tron's own flags (not Megatron's): left out of the table.
bool own_flag(const std::string& name) {
  static const std::set<std::string> own = {"config", "dry-run", "device", "builtin-data", "log-all-ranks", "fp8-min-features"};
  return own.count(name) != 0;
}

const char* level_name(Support s) {
  switch (s) {
    case Support::Yes: return "implemented";
    case Support::HintOnly: return "accepted, warns (performance hint)";
    case Support::NotYet: return "refused: not yet";
    case Support::Unsupported: return "refused";
  }
  return "";
}

std::string escape(std::string s) {
  std::string out;
  for (char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

}  // namespace

std::string megatron_flag_table_markdown() {
  // Rows in the order of first appearance: implemented first, then hints, not-yet, refused.
  const Support order[] = {Support::Yes, Support::HintOnly, Support::NotYet, Support::Unsupported};
  std::ostringstream os;
  std::map<Support, int> counts;
  for (const auto& f : flag_table())
    if (!own_flag(f.name)) ++counts[f.support];
  os << "| support | flags | why / what fp8tron does |\n| --- | --- | --- |\n";
  for (Support level : order) {
    std::vector<std::string> notes;
    std::map<std::string, std::vector<std::string>> flags;
    for (const auto& f : flag_table()) {
      if (own_flag(f.name) || f.support != level) continue;
      const std::string note = level == Support::Yes ? "Megatron's meaning (see `fp8tron --help`)" : f.note;
      if (!flags.count(note)) notes.push_back(note);
      flags[note].push_back(std::string("`--") + f.name + "`");
    }
    for (const auto& note : notes) {
      std::string list;
      for (const auto& name : flags[note]) list += (list.empty() ? "" : ", ") + name;
      os << "| " << level_name(level) << " (" << flags[note].size() << ") | " << list << " | " << escape(note) << " |\n";
    }
  }
  os << "\n" << counts[Support::Yes] << " implemented, " << counts[Support::HintOnly] << " hint-only, "
     << counts[Support::NotYet] << " not yet, " << counts[Support::Unsupported] << " refused.\n";
  return os.str();
}

}  // namespace fp8tron
