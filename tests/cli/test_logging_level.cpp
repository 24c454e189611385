// --logging-level and MEGATRON_LOGGING_LEVEL (Megatron's setup_logging): precedence, Python's int()
// reading of the variable, and what the level hides (core/log.h: info/warning/error are filtered
// like Python logging records; print(), Megatron's print_rank_0/print_rank_last, never is).
#include <gtest/gtest.h>

#include <climits>
#include <functional>
#include <map>

#include "core/log.h"
#include "tests/test_helpers.h"
#include "trainer/cli/logging_args.h"

namespace fp8tron {
using namespace fp8tron::testing;

namespace {
EnvLookup env_of(const std::map<std::string, std::string>& env) {
  return [env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
}

// What `emit` writes to stdout and stderr with the logger at `level` (restored afterwards).
std::pair<std::string, std::string> captured(int level, const std::function<void()>& emit) {
  const int before = log::level();
  log::set_level(level);
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  emit();
  std::fflush(stdout);
  std::fflush(stderr);
  auto out = ::testing::internal::GetCapturedStdout();
  auto err = ::testing::internal::GetCapturedStderr();
  log::set_level(before);
  return {out, err};
}
}  // namespace

TEST(LoggingLevel, FlagWinsOverEnvironmentWhichWinsOverDefault) {
  EXPECT_EQ(resolve_logging_level(parse(tiny_args()), env_of({})), std::nullopt);
  EXPECT_EQ(resolve_logging_level(parse(tiny_args()), env_of({{"MEGATRON_LOGGING_LEVEL", "40"}})), 40);
  EXPECT_EQ(resolve_logging_level(parse(tiny_args({"--logging-level", "10"})), env_of({{"MEGATRON_LOGGING_LEVEL", "40"}})), 10);
  EXPECT_EQ(resolve_logging_level(parse(tiny_args({"--logging-level", "30"})), env_of({})), 30);
}

TEST(LoggingLevel, EnvironmentIsReadAsPythonsInt) {
  EXPECT_EQ(parse_python_int("30"), 30);
  EXPECT_EQ(parse_python_int("  25\n"), 25);
  EXPECT_EQ(parse_python_int("+20"), 20);
  EXPECT_EQ(parse_python_int("-5"), -5);
  EXPECT_EQ(parse_python_int("1_0"), 10);
  EXPECT_EQ(parse_python_int("99999999999999999999"), INT_MAX);
  for (const char* bad : {"", " ", "INFO", "20.0", "0x14", "1__0", "_10", "10_", "2 0", "+"})
    EXPECT_EQ(parse_python_int(bad), std::nullopt) << "'" << bad << "'";
  // Megatron fails on it (int() raises); fp8tron names the variable.
  EXPECT_USER_ERROR(resolve_logging_level(parse(tiny_args()), env_of({{"MEGATRON_LOGGING_LEVEL", "WARNING"}})),
                    "MEGATRON_LOGGING_LEVEL='WARNING' is not an integer logging level");
}

TEST(LoggingLevel, ConfigCarriesTheResolvedLevel) {
  EXPECT_EQ(build(tiny_args({"--logging-level", "40"})).logging.logging_level, 40);
  EXPECT_EQ(build(tiny_args()).logging.logging_level, std::nullopt);
}

TEST(LoggingLevel, LevelFiltersRecordsLikePythonLogging) {
  auto emit = [] {
    log::print("PRINTED");
    log::info("INFO-LINE");
    log::warning("WARN-LINE");
    log::error("ERROR-LINE");
  };
  auto [out, err] = captured(log::kInfo, emit);
  EXPECT_NE(out.find("PRINTED"), std::string::npos);
  EXPECT_NE(out.find("INFO-LINE"), std::string::npos);
  EXPECT_NE(err.find("WARN-LINE"), std::string::npos);
  std::tie(out, err) = captured(log::kWarning, emit);  // 30 hides info lines only
  EXPECT_NE(out.find("PRINTED"), std::string::npos);
  EXPECT_EQ(out.find("INFO-LINE"), std::string::npos);
  EXPECT_NE(err.find("WARN-LINE"), std::string::npos);
  EXPECT_NE(err.find("ERROR-LINE"), std::string::npos);
  std::tie(out, err) = captured(log::kError, emit);  // 40: errors only (the iteration line's print stays)
  EXPECT_NE(out.find("PRINTED"), std::string::npos);
  EXPECT_EQ(err.find("WARN-LINE"), std::string::npos);
  EXPECT_NE(err.find("ERROR-LINE"), std::string::npos);
  std::tie(out, err) = captured(log::kCritical, emit);
  EXPECT_NE(out.find("PRINTED"), std::string::npos);
  EXPECT_EQ(err.find("ERROR-LINE"), std::string::npos);
  std::tie(out, err) = captured(25, emit);  // any integer: records at or above it pass
  EXPECT_EQ(out.find("INFO-LINE"), std::string::npos);
  EXPECT_NE(err.find("WARN-LINE"), std::string::npos);
  std::tie(out, err) = captured(0, emit);  // NOTSET: everything
  EXPECT_NE(out.find("INFO-LINE"), std::string::npos);
}

}  // namespace fp8tron
