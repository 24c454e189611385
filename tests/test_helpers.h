// Shared helpers for tests: building argv, a minimal valid flag set, temporary files.
#pragma once
#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

#include <unistd.h>

#include "core/error.h"
#include "trainer/cli/config_builder.h"
#include "trainer/cli/flags.h"

namespace fp8tron::testing {

inline FlagValues parse(std::vector<std::string> args) {
  args.insert(args.begin(), "fp8tron");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return parse_command_line(int(argv.size()), argv.data()).values;
}

// The smallest flag set that makes a valid configuration.
// `a` followed by `b`: a flag list with more flags.
inline std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

inline std::vector<std::string> tiny_args(std::initializer_list<std::string> extra = {}) {
  std::vector<std::string> a = {"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
                                "--seq-length", "16", "--micro-batch-size", "2", "--lr", "1e-3",
                                "--train-iters", "10", "--vocab-size", "64", "--builtin-data"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

inline Config build(const std::vector<std::string>& args, int world_size = 1) {
  LaunchEnv env;
  env.world_size = world_size;
  return build_config(parse(args), env, /*gpu_available=*/false);
}

inline std::string temp_file(const std::string& name, const std::string& content) {
  std::string path = "/tmp/fp8tron_test_" + std::to_string(getpid()) + "_" + name;
  std::ofstream(path) << content;
  return path;
}

}  // namespace fp8tron::testing

// Expects `statement` to throw UserError whose message contains `needle`.
#define EXPECT_USER_ERROR(statement, needle)                                                   \
  do {                                                                                         \
    try {                                                                                      \
      statement;                                                                               \
      ADD_FAILURE() << "expected a UserError containing: " << (needle);                       \
    } catch (const ::fp8tron::UserError& e) {                                                  \
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what(); \
    }                                                                                          \
  } while (0)
