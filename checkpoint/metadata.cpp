#include "checkpoint/metadata.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/text.h"
#include "checkpoint/checksum.h"
#include "checkpoint/megatron/damage.h"

namespace fp8tron::checkpoint {

using ojson = nlohmann::ordered_json;

// ---- base64 ----------------------------------------------------------------------------------

namespace {
constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int b64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}
}  // namespace

std::string base64_encode(const std::string& bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    uint32_t v = uint32_t(uint8_t(bytes[i])) << 16 | uint32_t(uint8_t(bytes[i + 1])) << 8 |
                 uint32_t(uint8_t(bytes[i + 2]));
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += kB64[v & 63];
  }
  if (size_t rest = bytes.size() - i) {
    uint32_t v = uint32_t(uint8_t(bytes[i])) << 16;
    if (rest == 2) v |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += rest == 2 ? kB64[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

bool base64_decode(const std::string& text, std::string& bytes) {
  bytes.clear();
  if (text.size() % 4 != 0) return false;
  bytes.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    bool last = i + 4 == text.size();
    int pad = 0;
    if (last && text[i + 3] == '=') pad = text[i + 2] == '=' ? 2 : 1;
    int v[4];
    for (int k = 0; k < 4 - pad; ++k)
      if ((v[k] = b64_value(text[i + k])) < 0) return false;
    for (int k = 4 - pad; k < 4; ++k) v[k] = 0;
    uint32_t w = uint32_t(v[0]) << 18 | uint32_t(v[1]) << 12 | uint32_t(v[2]) << 6 | uint32_t(v[3]);
    // Canonical form only: the bits a padded group drops must be zero.
    if ((pad == 1 && (w & 0xff)) || (pad == 2 && (w & 0xffff))) return false;
    bytes += char(w >> 16);
    if (pad < 2) bytes += char((w >> 8) & 0xff);
    if (pad < 1) bytes += char(w & 0xff);
  }
  return true;
}

// ---- JSON reading helpers ---------------------------------------------------------------------

namespace {

class Reader {
 public:
  explicit Reader(const std::string& source) : src_(source) {}

  // A metadata file that does not read as one is damaged (the newer-version refusal is not).
  [[noreturn]] void fail(const std::string& message) const {
    throw DamagedCheckpoint(src_ + ": " + message);
  }

  const ojson& field(const ojson& obj, const std::string& path, const char* key) const {
    auto it = obj.find(key);
    if (it == obj.end()) fail("missing field '" + join_key(path, key) + "'");
    return *it;
  }
  const ojson& object(const ojson& obj, const std::string& path, const char* key) const {
    const ojson& v = field(obj, path, key);
    if (!v.is_object()) fail(strprintf("field '%s' must be an object", join_key(path, key).c_str()));
    return v;
  }
  const ojson& array(const ojson& obj, const std::string& path, const char* key) const {
    const ojson& v = field(obj, path, key);
    if (!v.is_array()) fail(strprintf("field '%s' must be a list", join_key(path, key).c_str()));
    return v;
  }
  int64_t integer(const ojson& v, const std::string& name) const {
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)))
      fail(strprintf("field '%s' must be an integer, not %s", name.c_str(), shown(v).c_str()));
    return v.get<int64_t>();
  }
  int64_t integer(const ojson& obj, const std::string& path, const char* key) const {
    return integer(field(obj, path, key), join_key(path, key));
  }
  int small_int(const ojson& obj, const std::string& path, const char* key) const {
    int64_t v = integer(obj, path, key);
    if (v < INT32_MIN || v > INT32_MAX) fail("field '" + join_key(path, key) + "' is out of range");
    return int(v);
  }
  double number(const ojson& obj, const std::string& path, const char* key) const {
    const ojson& v = field(obj, path, key);
    if (!v.is_number()) fail(strprintf("field '%s' must be a number, not %s", join_key(path, key).c_str(), shown(v).c_str()));
    return v.get<double>();
  }
  bool boolean(const ojson& obj, const std::string& path, const char* key) const {
    const ojson& v = field(obj, path, key);
    if (!v.is_boolean()) fail(strprintf("field '%s' must be true or false", join_key(path, key).c_str()));
    return v.get<bool>();
  }
  std::string string(const ojson& v, const std::string& name) const {
    if (!v.is_string()) fail(strprintf("field '%s' must be a string, not %s", name.c_str(), shown(v).c_str()));
    return v.get<std::string>();
  }
  std::string string(const ojson& obj, const std::string& path, const char* key) const {
    return string(field(obj, path, key), join_key(path, key));
  }
  std::vector<int64_t> int_list(const ojson& obj, const std::string& path, const char* key) const {
    const ojson& v = array(obj, path, key);
    std::vector<int64_t> out;
    for (const auto& x : v) out.push_back(integer(x, join_key(path, key) + "[]"));
    return out;
  }
  std::string bytes(const ojson& v, const std::string& name) const {
    std::string out;
    if (!base64_decode(string(v, name), out)) fail("field '" + name + "' is not valid base64");
    return out;
  }

  static std::string join_key(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }

 private:
  static std::string shown(const ojson& v) {
    std::string s = v.dump();
    return s.size() > 40 ? s.substr(0, 40) + "..." : s;
  }
  const std::string& src_;
};

// A double that may be NaN or inf (JSON numbers cannot be): "nan", "inf", "-inf" or %.17g.
std::string exact_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return strprintf("%.17g", v);
}

double parse_exact_number(const Reader& r, const ojson& obj, const std::string& path, const char* key) {
  const std::string text = r.string(obj, path, key);
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0') r.fail("field '" + Reader::join_key(path, key) + "' is not a number: '" + text + "'");
  return v;
}

ojson rerun_to_json(const rerun::RerunRecord& x) {
  ojson suspects = ojson::array();
  for (const auto& [rank, where] : x.suspects)
    suspects.push_back({{"rank", rank}, {"node", where.node}, {"device", where.device}});
  ojson large = ojson::object();
  for (const auto& [context, v] : x.large_values) large[context] = {{"count", v.first}, {"largest", exact_number(v.second)}};
  return {{"mode", x.mode},
          {"iteration", x.iteration},
          {"failed_call", x.failed_call},
          {"initial_result", exact_number(x.initial_result)},
          {"error_injection_rate", x.error_injection_rate},
          {"error_injection_type", x.error_injection_type},
          {"injected_error", x.injected_error},
          {"suspects", std::move(suspects)},
          {"large_values", std::move(large)}};
}

rerun::RerunRecord rerun_from_json(const Reader& r, const ojson& j) {
  const std::string path = "rerun";
  rerun::RerunRecord x;
  x.mode = r.string(j, path, "mode");
  x.iteration = r.integer(j, path, "iteration");
  x.failed_call = r.string(j, path, "failed_call");
  x.initial_result = parse_exact_number(r, j, path, "initial_result");
  x.error_injection_rate = r.integer(j, path, "error_injection_rate");
  x.error_injection_type = r.string(j, path, "error_injection_type");
  x.injected_error = r.string(j, path, "injected_error");
  const ojson& suspects = r.array(j, path, "suspects");
  for (size_t i = 0; i < suspects.size(); ++i) {
    const std::string where = path + ".suspects[" + std::to_string(i) + "]";
    if (!suspects[i].is_object()) r.fail("field '" + where + "' must be an object");
    rerun::Hardware h{r.string(suspects[i], where, "node"), r.small_int(suspects[i], where, "device")};
    x.suspects.emplace_back(r.small_int(suspects[i], where, "rank"), std::move(h));
  }
  const ojson& large = r.object(j, path, "large_values");
  for (auto it = large.begin(); it != large.end(); ++it) {
    const std::string where = path + ".large_values." + it.key();
    if (!it.value().is_object()) r.fail("field '" + where + "' must be an object");
    x.large_values[it.key()] = {r.integer(it.value(), where, "count"), parse_exact_number(r, it.value(), where, "largest")};
  }
  if (x.iteration < 1) r.fail("field 'rerun.iteration' must be at least 1");
  return x;
}

ojson table_to_json(const TensorTable& table) {
  ojson tensors = ojson::object();
  for (const auto& [name, t] : table) {
    ojson shards = ojson::array();
    for (const auto& s : t.shards) {
      ojson shard = {{"file", s.file},
                     {"key", s.key},
                     {"offset", s.offset},
                     {"shape", s.shape},
                     {"element_offset", s.element_offset},
                     {"replicas", s.replicas}};
      if (s.checksum) shard["xxh3_64"] = checksum_hex(*s.checksum);
      shards.push_back(std::move(shard));
    }
    tensors[name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"shards", std::move(shards)}};
  }
  return tensors;
}

TensorTable table_from_json(const ojson& tensors, const Reader& r, const std::string& path) {
  if (!tensors.is_object()) r.fail("field '" + path + "' must be an object");
  TensorTable table;
  for (auto it = tensors.begin(); it != tensors.end(); ++it) {
    const std::string where = path + "." + it.key();
    const ojson& jt = it.value();
    if (!jt.is_object()) r.fail("field '" + where + "' must be an object");
    TensorEntry t;
    std::string dt = r.string(jt, where, "dtype");
    auto dtype = parse_dtype(dt);
    if (!dtype) r.fail(strprintf("field '%s.dtype' is '%s', not one of %s", where.c_str(), dt.c_str(),
                                 join(dtype_names(), " ").c_str()));
    t.dtype = *dtype;
    t.shape = r.int_list(jt, where, "shape");
    const ojson& shards = r.array(jt, where, "shards");
    for (size_t i = 0; i < shards.size(); ++i) {
      const std::string sw = where + ".shards[" + std::to_string(i) + "]";
      const ojson& js = shards[i];
      if (!js.is_object()) r.fail("field '" + sw + "' must be an object");
      ShardEntry s;
      s.file = r.string(js, sw, "file");
      s.key = r.string(js, sw, "key");
      s.offset = r.int_list(js, sw, "offset");
      s.shape = r.int_list(js, sw, "shape");
      s.element_offset = js.contains("element_offset") ? r.integer(js, sw, "element_offset") : 0;
      s.replicas = js.contains("replicas") ? r.small_int(js, sw, "replicas") : 1;
      if (js.contains("xxh3_64")) {
        s.checksum = parse_checksum_hex(r.string(js, sw, "xxh3_64"));
        if (!s.checksum) r.fail("field '" + sw + ".xxh3_64' is not 16 hex digits");
      }
      t.shards.push_back(std::move(s));
    }
    table.emplace(it.key(), std::move(t));
  }
  return table;
}

void validate_table(const TensorTable& table, const std::string& source) {
  for (const auto& [name, t] : table) {
    const char* nm = name.c_str();
    if (name.empty()) throw UserError(source + ": a tensor has an empty name");
    if (!checked_numel(t.shape))
      throw UserError(strprintf("%s: tensor '%s' has an invalid shape %s", source.c_str(), nm,
                                shape_string(t.shape).c_str()));
    std::vector<Box> boxes;
    for (const auto& s : t.shards) {
      if (s.file.empty() || s.file == "." || s.file == ".." || s.file.find('/') != std::string::npos)
        throw UserError(strprintf("%s: tensor '%s' has a shard in file '%s'; shard files are plain "
                                  "names inside the checkpoint directory",
                                  source.c_str(), nm, s.file.c_str()));
      if (s.key.empty())
        throw UserError(strprintf("%s: tensor '%s' has a shard with an empty key", source.c_str(), nm));
      if (s.element_offset < 0 || s.replicas < 1)
        throw UserError(strprintf("%s: tensor '%s' has a shard with element_offset %lld and replicas "
                                  "%d (need >= 0 and >= 1)", source.c_str(), nm,
                                  (long long)s.element_offset, s.replicas));
      boxes.push_back(s.box());
    }
    try {
      (void)plan_copies(name, t.shape, boxes, whole(t.shape));
    } catch (const UserError& e) {
      throw UserError(source + ": " + e.what());
    }
  }
}

}  // namespace

// ---- metadata --------------------------------------------------------------------------------

void validate_metadata(const CheckpointMetadata& m, const std::string& source) {
  const char* src = source.c_str();
  if (m.format_version != kMetadataFormatVersion)
    throw UserError(strprintf("%s: format version %d cannot be written by this fp8tron (it writes %d)",
                              src, m.format_version, kMetadataFormatVersion));
  if (m.iteration < 0 || m.consumed_train_samples < 0 || m.consumed_valid_samples < 0 ||
      m.lr_scheduler_num_steps < 0)
    throw UserError(strprintf("%s: iteration, consumed samples and scheduler steps must be >= 0 "
                              "(got %lld, %lld, %lld, %lld)", src, (long long)m.iteration,
                              (long long)m.consumed_train_samples, (long long)m.consumed_valid_samples,
                              (long long)m.lr_scheduler_num_steps));
  const auto& p = m.parallel;
  if (p.tp < 1 || p.pp < 1 || p.dp < 1 || p.cp < 1 || p.ep < 1 || p.etp < 1 || p.vpp < 1 || p.world_size < 1)
    throw UserError(strprintf("%s: parallel sizes must be >= 1 (tp %d pp %d dp %d cp %d ep %d vpp %d "
                              "world %d)", src, p.tp, p.pp, p.dp, p.cp, p.ep, p.vpp, p.world_size));
  if (int64_t(p.tp) * p.pp * p.dp * p.cp != p.world_size)
    throw UserError(strprintf("%s: world size %d is not tp*pp*dp*cp = %d*%d*%d*%d", src,
                              p.world_size, p.tp, p.pp, p.dp, p.cp));
  if (!std::isfinite(m.loss_scaler.scale) || m.loss_scaler.scale <= 0)
    throw UserError(strprintf("%s: loss scale %g must be finite and positive", src, m.loss_scaler.scale));
  if (!std::isfinite(m.floating_point_operations_so_far) || m.floating_point_operations_so_far < 0)
    throw UserError(strprintf("%s: floating_point_operations_so_far must be finite and >= 0", src));
  std::set<std::pair<int, std::string>> rng_seen;
  for (const auto& r : m.rng) {
    if (r.rank < 0 || r.rank >= p.world_size)
      throw UserError(strprintf("%s: RNG state '%s' is for rank %d, outside world size %d", src,
                                r.name.c_str(), r.rank, p.world_size));
    if (r.name.empty()) throw UserError(strprintf("%s: an RNG state of rank %d has no name", src, r.rank));
    if (!rng_seen.insert({r.rank, r.name}).second)
      throw UserError(strprintf("%s: RNG state '%s' of rank %d appears twice", src, r.name.c_str(), r.rank));
  }
  validate_table(m.tensors, source);
}

std::string serialize_metadata(const CheckpointMetadata& m) {
  validate_metadata(m, "checkpoint metadata");
  ojson j;
  j["format"] = kMetadataFormat;
  j["format_version"] = m.format_version;
  j["fp8tron_version"] = m.fp8tron_version;
  j["fp8tron_commit"] = m.fp8tron_commit;
  j["iteration"] = m.iteration;
  j["release"] = m.release;
  j["consumed_train_samples"] = m.consumed_train_samples;
  j["consumed_valid_samples"] = m.consumed_valid_samples;
  if (m.skipped_train_samples) j["skipped_train_samples"] = m.skipped_train_samples;
  j["floating_point_operations_so_far"] = m.floating_point_operations_so_far;
  j["data_loader"] = ojson::object();
  for (const auto& [k, v] : m.data_loader) j["data_loader"][k] = v;
  const auto& p = m.parallel;
  j["parallel"] = {{"tp", p.tp}, {"pp", p.pp}, {"dp", p.dp}, {"cp", p.cp},
                   {"ep", p.ep}, {"etp", p.etp}, {"vpp", p.vpp}, {"world_size", p.world_size}};
  j["args"] = ojson::object();
  for (const auto& [k, v] : m.args) j["args"][k] = v;
  j["lr_scheduler"] = {{"num_steps", m.lr_scheduler_num_steps}};
  if (const auto& l = m.lr_scheduler) {
    ojson& js = j["lr_scheduler"];
    js["max_lr"] = l->max_lr;
    js["min_lr"] = l->min_lr;
    js["lr_warmup_steps"] = l->lr_warmup_steps;
    js["lr_decay_steps"] = l->lr_decay_steps;
    js["lr_decay_style"] = l->lr_decay_style;
    js["start_wd"] = l->start_wd;
    js["end_wd"] = l->end_wd;
    js["wd_incr_steps"] = l->wd_incr_steps;
    js["wd_incr_style"] = l->wd_incr_style;
  }
  j["loss_scaler"] = {{"scale", m.loss_scaler.scale},
                      {"growth_tracker", m.loss_scaler.growth_tracker},
                      {"hysteresis_tracker", m.loss_scaler.hysteresis_tracker}};
  j["rng"] = ojson::array();
  for (const auto& r : m.rng)
    j["rng"].push_back({{"rank", r.rank}, {"name", r.name}, {"state", base64_encode(r.state)}});
  j["fp8"] = ojson::object();
  for (const auto& [k, v] : m.fp8) {
    std::string raw(v.size() * sizeof(float), '\0');
    if (!v.empty()) std::memcpy(raw.data(), v.data(), raw.size());  // little-endian host
    j["fp8"][k] = base64_encode(raw);
  }
  if (m.rerun) j["rerun"] = rerun_to_json(*m.rerun);
  j["tensors"] = table_to_json(m.tensors);
  try {
    return j.dump(1) + "\n";
  } catch (const nlohmann::json::exception& e) {
    throw UserError(std::string("checkpoint metadata has a string that is not valid UTF-8 (") +
                    e.what() + ")");
  }
}

CheckpointMetadata parse_metadata(const std::string& text, const std::string& source) {
  Reader r(source);
  ojson j;
  try {
    j = ojson::parse(text);
  } catch (const nlohmann::json::exception& e) {
    // The parser quotes the bytes it stopped at; escaped, they cannot garble the terminal.
    r.fail("not valid JSON (" + escaped_parse_error(e.what()) + "); the file is corrupt or truncated");
  }
  if (!j.is_object()) r.fail("not a JSON object");
  if (!j.contains("format") || !j["format"].is_string() || j["format"].get<std::string>() != kMetadataFormat)
    r.fail(std::string("not an fp8tron checkpoint metadata file (its 'format' is not '") +
           kMetadataFormat + "')");
  CheckpointMetadata m;
  int64_t version = r.integer(j, "", "format_version");
  if (version > kMetadataFormatVersion)
    throw UserError(strprintf("%s: format version %lld is newer than this fp8tron reads (%d); upgrade fp8tron",
                              source.c_str(), (long long)version, kMetadataFormatVersion));
  if (version < 1) r.fail(strprintf("unknown format version %lld", (long long)version));
  m.format_version = int(version);
  if (j.contains("fp8tron_version")) m.fp8tron_version = r.string(j, "", "fp8tron_version");
  if (j.contains("fp8tron_commit")) m.fp8tron_commit = r.string(j, "", "fp8tron_commit");
  m.iteration = r.integer(j, "", "iteration");
  m.release = r.boolean(j, "", "release");
  m.consumed_train_samples = r.integer(j, "", "consumed_train_samples");
  m.consumed_valid_samples = r.integer(j, "", "consumed_valid_samples");
  if (j.contains("skipped_train_samples")) m.skipped_train_samples = r.integer(j, "", "skipped_train_samples");
  m.floating_point_operations_so_far = r.number(j, "", "floating_point_operations_so_far");
  const ojson& dl = r.object(j, "", "data_loader");
  for (auto it = dl.begin(); it != dl.end(); ++it)
    m.data_loader[it.key()] = r.integer(it.value(), "data_loader." + it.key());
  const ojson& p = r.object(j, "", "parallel");
  m.parallel.tp = r.small_int(p, "parallel", "tp");
  m.parallel.pp = r.small_int(p, "parallel", "pp");
  m.parallel.dp = r.small_int(p, "parallel", "dp");
  m.parallel.cp = r.small_int(p, "parallel", "cp");
  m.parallel.ep = r.small_int(p, "parallel", "ep");
  m.parallel.etp = p.contains("etp") ? r.small_int(p, "parallel", "etp") : 1;
  m.parallel.vpp = r.small_int(p, "parallel", "vpp");
  m.parallel.world_size = r.small_int(p, "parallel", "world_size");
  const ojson& args = r.object(j, "", "args");
  for (auto it = args.begin(); it != args.end(); ++it)
    m.args[it.key()] = r.string(it.value(), "args." + it.key());
  const ojson& lr = r.object(j, "", "lr_scheduler");
  m.lr_scheduler_num_steps = r.integer(lr, "lr_scheduler", "num_steps");
  if (lr.contains("max_lr")) {
    SchedulerState l;
    l.max_lr = r.number(lr, "lr_scheduler", "max_lr");
    l.min_lr = r.number(lr, "lr_scheduler", "min_lr");
    l.lr_warmup_steps = r.integer(lr, "lr_scheduler", "lr_warmup_steps");
    l.lr_decay_steps = r.integer(lr, "lr_scheduler", "lr_decay_steps");
    l.lr_decay_style = r.string(lr, "lr_scheduler", "lr_decay_style");
    l.start_wd = r.number(lr, "lr_scheduler", "start_wd");
    l.end_wd = r.number(lr, "lr_scheduler", "end_wd");
    l.wd_incr_steps = r.integer(lr, "lr_scheduler", "wd_incr_steps");
    l.wd_incr_style = r.string(lr, "lr_scheduler", "wd_incr_style");
    m.lr_scheduler = l;
  }
  const ojson& ls = r.object(j, "", "loss_scaler");
  m.loss_scaler.scale = r.number(ls, "loss_scaler", "scale");
  m.loss_scaler.growth_tracker = r.integer(ls, "loss_scaler", "growth_tracker");
  m.loss_scaler.hysteresis_tracker = r.integer(ls, "loss_scaler", "hysteresis_tracker");
  const ojson& rng = r.array(j, "", "rng");
  for (size_t i = 0; i < rng.size(); ++i) {
    const std::string where = "rng[" + std::to_string(i) + "]";
    if (!rng[i].is_object()) r.fail("field '" + where + "' must be an object");
    RngState s;
    s.rank = r.small_int(rng[i], where, "rank");
    s.name = r.string(rng[i], where, "name");
    s.state = r.bytes(r.field(rng[i], where, "state"), where + ".state");
    m.rng.push_back(std::move(s));
  }
  const ojson& fp8 = r.object(j, "", "fp8");
  for (auto it = fp8.begin(); it != fp8.end(); ++it) {
    std::string raw = r.bytes(it.value(), "fp8." + it.key());
    if (raw.size() % sizeof(float) != 0)
      r.fail("field 'fp8." + it.key() + "' is not a whole number of float32 values");
    std::vector<float> v(raw.size() / sizeof(float));
    if (!v.empty()) std::memcpy(v.data(), raw.data(), raw.size());
    m.fp8[it.key()] = std::move(v);
  }
  if (j.contains("rerun")) m.rerun = rerun_from_json(r, r.object(j, "", "rerun"));
  m.tensors = table_from_json(r.object(j, "", "tensors"), r, "tensors");
  validate_metadata(m, source);
  return m;
}

void write_metadata(const std::string& dir, const CheckpointMetadata& metadata,
                    const FaultInjection& fault) {
  write_file_atomically((std::filesystem::path(dir) / kMetadataFileName).string(),
                        serialize_metadata(metadata), fault);
}

CheckpointMetadata read_metadata(const std::string& dir) {
  std::string path = (std::filesystem::path(dir) / kMetadataFileName).string();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw UserError(strprintf("%s is missing: %s is not an fp8tron checkpoint (or it is incomplete)",
                              path.c_str(), dir.c_str()));
  return parse_metadata(read_file(path), path);
}

// ---- tensor tables ---------------------------------------------------------------------------

bool add_shard(TensorTable& table, const std::string& name, DType dtype,
               const std::vector<int64_t>& global_shape, const ShardEntry& shard) {
  auto [it, inserted] = table.try_emplace(name);
  TensorEntry& t = it->second;
  if (inserted) {
    t.dtype = dtype;
    t.shape = global_shape;
  } else if (t.dtype != dtype || t.shape != global_shape) {
    throw UserError(strprintf("tensor '%s' is saved as %s %s by one rank and %s %s by another; "
                              "every rank must agree on a tensor's global shape and dtype",
                              name.c_str(), dtype_name(t.dtype), shape_string(t.shape).c_str(),
                              dtype_name(dtype), shape_string(global_shape).c_str()));
  }
  for (auto& s : t.shards) {
    if (s.offset == shard.offset && s.shape == shard.shape) {
      s.replicas += shard.replicas;
      return false;
    }
  }
  t.shards.push_back(shard);
  return true;
}

void merge_tensor_tables(TensorTable& into, const TensorTable& from) {
  for (const auto& [name, t] : from)
    for (const auto& s : t.shards) add_shard(into, name, t.dtype, t.shape, s);
}

std::string serialize_tensor_table(const TensorTable& table) { return table_to_json(table).dump(); }

TensorTable parse_tensor_table(const std::string& text, const std::string& source) {
  Reader r(source);
  ojson j;
  try {
    j = ojson::parse(text);
  } catch (const nlohmann::json::exception& e) {
    r.fail(std::string("not valid JSON (") + e.what() + ")");
  }
  return table_from_json(j, r, "tensors");
}

}  // namespace fp8tron::checkpoint
