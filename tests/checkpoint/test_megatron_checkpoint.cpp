// Reading checkpoints that Megatron-LM wrote (tests/fixtures/megatron_checkpoints: one small GPT
// saved at iteration 10 by the same run in both formats), and pickles made by CPython.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <set>

#include "checkpoint/megatron/dcp_checkpoint.h"
#include "checkpoint/megatron/dcp_writer.h"
#include "checkpoint/megatron/distributed_optimizer_buffers.h"
#include "checkpoint/megatron/legacy_model_parallel.h"
#include "checkpoint/megatron/megatron_checkpoint.h"
#include "checkpoint/megatron/pickle.h"
#include "checkpoint/megatron/pickle_writer.h"
#include "checkpoint/megatron/torch_archive.h"
#include "checkpoint/megatron/torch_save_writer.h"
#include "checkpoint/megatron/zip_crc.h"
#include "core/error.h"
#include "tests/checkpoint/error_text.h"

namespace fp8tron::checkpoint::megatron {
namespace {

using checkpoint::testing::error_of;

const std::string kFixtures = std::string(FP8TRON_SOURCE_DIR) + "/tests/fixtures/megatron_checkpoints";
const std::string kDist = kFixtures + "/gpt_torch_dist/ckpt/iter_0000010";
const std::string kLegacy = kFixtures + "/gpt_torch_legacy/ckpt/iter_0000010";

// A writable copy of a fixture directory that a test may damage (by the shell: LibTorch exports
// a std::filesystem::remove_all that crashes when called from here).
struct Scratch {
  explicit Scratch(const std::string& from) {
    const char* base = std::getenv("TMPDIR");
    path = std::string(base && *base ? base : "/tmp") + "/fp8tron_megatron_XXXXXX";
    if (!mkdtemp(path.data())) throw std::runtime_error("mkdtemp failed");
    path += "/ckpt";
    run("cp -r '" + from + "' '" + path + "' && chmod -R u+w '" + path + "'");
  }
  ~Scratch() { run("rm -rf '" + path.substr(0, path.rfind('/')) + "'"); }
  static void run(const std::string& command) {
    if (std::system(command.c_str()) != 0) throw std::runtime_error("failed: " + command);
  }
  std::string path;
};

TEST(Pickle, ReadsProtocolTwoAndFour) {
  // pickle.dumps({'a': [1, -2, 3.5], 'b': ('x', None, True), 'c': 2**40}, protocol=2)
  const std::string p2("\200\002}q\000(X\001\000\000\000aq\001]q\002(K\001J\376\377\377\377G@\014\000\000\000\000\000\000eX\001\000\000\000bq\003X\001\000\000\000xq\004N\210\207q\005X\001\000\000\000cq\006\212\006\000\000\000\000\000\001u.", 74);
  const PyRef v = parse_pickle(p2, "p2");
  int64_t i = 0;
  double d = 0;
  const PyRef a = attribute(v, "a");
  ASSERT_TRUE(a && a->items.size() == 3);
  EXPECT_TRUE(as_int(a->items[1], i) && i == -2);
  EXPECT_TRUE(as_double(a->items[2], d) && d == 3.5);
  EXPECT_TRUE(as_int(attribute(v, "c"), i) && i == (int64_t(1) << 40));
  EXPECT_TRUE(is_none(attribute(v, "b")->items[1]));
  EXPECT_EQ(describe(attribute(v, "b")), "('x', None, True)");

  // pickle.dumps(argparse.Namespace(lr=0.5), protocol=4)
  const std::string p4("\200\004\225/\000\000\000\000\000\000\000\214\010argparse\224\214\011Namespace\224\223\224)\201\224}\224\214\002lr\224G\077\340\000\000\000\000\000\000sb.", 58);
  const PyRef ns = parse_pickle(p4, "p4");
  EXPECT_TRUE(is_call_of(ns, "argparse", "Namespace"));
  EXPECT_TRUE(as_double(attribute(ns, "lr"), d) && d == 0.5);
}

TEST(Pickle, TruncatedInputIsOneLineNamingTheSource) {
  const std::string msg = error_of([] { parse_pickle(std::string_view("\200\002]q\000(K\001", 8), "some.pt"); });
  EXPECT_NE(msg.find("some.pt"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
}

TEST(PickleWriter, WritesWhatTheReaderAndCPythonRead) {
  // CPython: pickle.dumps(300, protocol=2) and pickle.dumps(-2**40, protocol=2).
  EXPECT_EQ(write_pickle(py_int(300)), std::string("\200\002M,\001.", 6));
  EXPECT_EQ(write_pickle(py_int(-(int64_t(1) << 40))), std::string("\200\002\212\006\000\000\000\000\000\377.", 11));
  EXPECT_EQ(write_pickle(py_int(int64_t(1) << 40)), std::string("\200\002\212\006\000\000\000\000\000\001.", 11));
  const PyRef ns = py_object(py_global("argparse", "Namespace"),
                             py_dict({{"lr", py_float(0.5)}, {"sizes", py_int_tuple({2, 3, 4, 5})},
                                      {"name", py_str("gpt")}, {"flags", py_list({py_bool(true), py_none()})},
                                      {"big", py_int(int64_t(1) << 40)}, {"neg", py_int(-70000)}}));
  const PyRef back = parse_pickle(write_pickle(ns), "written");
  EXPECT_TRUE(is_call_of(back, "argparse", "Namespace"));
  EXPECT_TRUE(back->new_object);
  double d = 0;
  int64_t i = 0;
  std::vector<int64_t> sizes;
  std::string name;
  EXPECT_TRUE(as_double(attribute(back, "lr"), d) && d == 0.5);
  EXPECT_TRUE(as_int_list(attribute(back, "sizes"), sizes) && sizes == std::vector<int64_t>({2, 3, 4, 5}));
  EXPECT_TRUE(as_string(attribute(back, "name"), name) && name == "gpt");
  EXPECT_EQ(describe(attribute(back, "flags")), "[True, None]");
  EXPECT_TRUE(as_int(attribute(back, "big"), i) && i == (int64_t(1) << 40));
  EXPECT_TRUE(as_int(attribute(back, "neg"), i) && i == -70000);
}

TEST(PickleWriter, TorchSaveArchiveReadsBack) {
  const torch::Tensor t = torch::arange(24, torch::kFloat32).reshape({2, 3, 4}).transpose(1, 2);
  TorchArchive archive(torch_save_tensor(t), "chunk");
  EXPECT_TRUE(torch::equal(archive.tensor(archive.root(), "chunk"), t));
  TorchSaveWriter w;
  const PyRef step = w.tensor(torch::tensor(7.0f).reshape({}));
  TorchArchive common(w.bytes(py_list({py_dict({{"common_step", step}})})), "common");
  const torch::Tensor back = common.tensor(attribute(common.root()->items.at(0), "common_step"), "step");
  EXPECT_EQ(back.dim(), 0);
  EXPECT_EQ(back.item<float>(), 7.0f);
}

TEST(DcpWriter, ChunksOfTwoRanksReadBackAsOneTensor) {
  Scratch dir(kDist);  // any directory to write into
  Scratch::run("rm -rf '" + dir.path + "' && mkdir '" + dir.path + "'");
  const torch::Tensor global = torch::randn({2, 6, 4});
  std::vector<std::string> entries;
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<DcpChunkToWrite> chunks;
    for (int64_t layer = 0; layer < 2; ++layer)
      chunks.push_back({"decoder.layers.w", {2, 6, 4}, {layer, 3 * rank, 0}, global[layer].narrow(0, 3 * rank, 3).unsqueeze(0)});
    std::vector<DcpObjectToWrite> objects;
    if (rank == 0) objects.push_back({"common_state/shard_0_1", TorchSaveWriter().bytes(py_list({py_int(10)}))});
    entries.push_back(write_dcp_file(dir.path, rank, objects, chunks));
  }
  write_dcp_metadata(dir.path, entries, dir.path);
  const DcpCheckpoint dcp(dir.path);
  ASSERT_EQ(dcp.tensors().size(), 1u);
  EXPECT_EQ(dcp.tensors().at("decoder.layers.w").chunks.size(), 4u);
  EXPECT_TRUE(torch::equal(dcp.tensor("decoder.layers.w"), global));
  int64_t value = 0;
  EXPECT_TRUE(as_int(dcp.object("common_state")->root()->items.at(0), value) && value == 10);

  // A box reads the chunks it overlaps, each once while boxes of the same tensor are asked for.
  const int64_t all = dcp.tensor_bytes(), before = dcp.bytes_read();
  EXPECT_TRUE(torch::equal(dcp.region("decoder.layers.w", {1, 1, 1}, {1, 2, 2}), global.narrow(0, 1, 1).narrow(1, 1, 2).narrow(2, 1, 2)));
  EXPECT_EQ(dcp.bytes_read() - before, all / 4);  // one of four equal chunks
  EXPECT_TRUE(torch::equal(dcp.region("decoder.layers.w", {1, 0, 0}, {1, 3, 4}), global.narrow(0, 1, 1).narrow(1, 0, 3)));
  EXPECT_EQ(dcp.bytes_read() - before, all / 4);
  EXPECT_TRUE(torch::equal(dcp.region("decoder.layers.w", {1, 2, 0}, {1, 2, 4}), global.narrow(0, 1, 1).narrow(1, 2, 2)));
  EXPECT_EQ(dcp.bytes_read() - before, all / 2);  // the box spans two ranks' chunks

  // Chunks that leave part of the tensor uncovered are refused before .metadata is written.
  entries.pop_back();
  std::string msg;
  try {
    write_dcp_metadata(dir.path, entries, dir.path);
  } catch (const std::exception& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("cover 24 of its 48 elements"), std::string::npos) << msg;
}

TEST(MegatronCheckpoint, DetectsTheFormats) {
  EXPECT_EQ(detect_format(kDist), "torch_dist");
  EXPECT_EQ(detect_format(kLegacy), "torch");
  EXPECT_EQ(format_refusal("torch_dist", "torch_dist", false, kDist), "");
  EXPECT_EQ(format_refusal("torch", "torch_dist", false, kLegacy), "");
  EXPECT_EQ(format_refusal("torch", "torch", false, kLegacy), "");
  EXPECT_EQ(format_refusal("torch_dist", "torch", true, kDist), "");
  EXPECT_NE(format_refusal("torch_dist", "torch", false, kDist).find("--auto-detect-ckpt-format"), std::string::npos);
  EXPECT_NE(format_refusal("zarr", "torch_dist", true, kDist).find("zarr"), std::string::npos);
}

TEST(MegatronCheckpoint, LegacyHoldsWeightsMomentsAndCounters) {
  const MegatronCheckpoint c = read_checkpoint(kLegacy, "torch");
  EXPECT_EQ(c.iteration, 10);
  EXPECT_EQ(c.consumed_train_samples, 80);
  ASSERT_TRUE(c.step && c.scheduler);
  EXPECT_EQ(*c.step, 10);
  EXPECT_EQ(c.scheduler->num_steps, 80);
  EXPECT_EQ(c.scheduler->lr_warmup_steps, 16);
  EXPECT_EQ(c.scheduler->lr_decay_style, "cosine");
  EXPECT_EQ(c.model_args.at("hidden_size"), 64);
  EXPECT_EQ(c.tensors.size(), 3u * 28u);  // 28 parameters, their two moments
  // Values Python's torch.load reads from the same file.
  EXPECT_FLOAT_EQ(c.tensors.at("decoder.final_layernorm.weight").read()[0].item<float>(), 0.9986070990562439f);
  EXPECT_FLOAT_EQ(c.tensors.at("decoder.layers.1.mlp.linear_fc1.weight").read()[5][7].item<float>(), -0.005036144983023405f);
  EXPECT_FLOAT_EQ(c.tensors.at("optimizer.state.exp_avg.embedding.word_embeddings.weight").read()[3][4].item<float>(),
                  -0.00016141110972967f);
  EXPECT_FLOAT_EQ(c.tensors.at("optimizer.state.exp_avg_sq.decoder.final_layernorm.bias").read()[1].item<float>(),
                  8.55655102327546e-09f);
  EXPECT_TRUE(c.tensors.count("decoder.layers.0.self_attention.linear_qkv.layer_norm_weight"));
  EXPECT_TRUE(c.tensors.count("decoder.layers.0.mlp.linear_fc1.layer_norm_bias"));
}

// Three optimizer parameter groups (--decoupled-lr's, MuP's): each group's first state entry
// (Megatron's own numbering, as Python's torch.load reads it) belongs to the first model parameter
// of the group's kind.
TEST(MegatronCheckpoint, LegacyGroupsOfDecoupledLrAndMupFindTheirParameters) {
  const auto moment = [](const MegatronCheckpoint& c, const std::string& which, const std::string& name, int64_t i) {
    return c.tensors.at("optimizer.state." + which + "." + name).read().flatten()[i].item<double>();
  };
  const std::string norm = "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight";
  const MegatronCheckpoint decoupled =
      read_checkpoint(kFixtures + "/gpt_decoupled_lr_torch_legacy/ckpt/iter_0000010", "torch");
  EXPECT_EQ(decoupled.tensors.size(), 3u * 29u);  // untied: the output layer too
  EXPECT_FLOAT_EQ(moment(decoupled, "exp_avg", "embedding.position_embeddings.weight", 5), -0.0004334464902058244);
  EXPECT_FLOAT_EQ(moment(decoupled, "exp_avg", "embedding.word_embeddings.weight", 5), -4.2031027987832204e-05);
  EXPECT_FLOAT_EQ(moment(decoupled, "exp_avg_sq", "embedding.word_embeddings.weight", 3), 5.243964984469329e-12);
  EXPECT_FLOAT_EQ(moment(decoupled, "exp_avg", norm, 5), 2.9442249797284603e-05);
  const MegatronCheckpoint mup = read_checkpoint(kFixtures + "/gpt_mup_torch_legacy/ckpt/iter_0000010", "torch");
  EXPECT_EQ(mup.tensors.size(), 3u * 28u);
  EXPECT_FLOAT_EQ(moment(mup, "exp_avg", "embedding.word_embeddings.weight", 5), 1.719141801004298e-05);
  EXPECT_FLOAT_EQ(moment(mup, "exp_avg", "decoder.layers.0.self_attention.linear_proj.weight", 5), 0.0003031012020073831);
  EXPECT_FLOAT_EQ(moment(mup, "exp_avg_sq", "decoder.layers.0.self_attention.linear_proj.weight", 3),
                  2.5741488940411728e-09);
  EXPECT_FLOAT_EQ(moment(mup, "exp_avg", norm, 5), 2.1228277091722703e-06);
}

TEST(MegatronCheckpoint, DistributedEqualsLegacy) {
  // Both fixtures come from identical runs: the same tensors under the same names.
  const MegatronCheckpoint dist = read_checkpoint(kDist, "torch_dist");
  const MegatronCheckpoint legacy = read_checkpoint(kLegacy, "torch");
  EXPECT_EQ(dist.iteration, 10);
  EXPECT_EQ(dist.consumed_train_samples, 80);
  ASSERT_TRUE(dist.step);
  EXPECT_EQ(*dist.step, 10);
  ASSERT_EQ(dist.tensors.size(), legacy.tensors.size());
  for (const auto& [name, t] : legacy.tensors) {
    ASSERT_TRUE(dist.tensors.count(name)) << name;
    EXPECT_TRUE(torch::equal(dist.tensors.at(name).read(), t.read())) << name;
  }
}

TEST(MegatronCheckpoint, DistributedTensorsAreReadWhenAskedForAndOnlyThere) {
  // Written by TP2 x PP2: a layer of stage 0 lies in stage 0's files; reading its tensor-parallel
  // half reads that rank's chunk and nothing else.
  const MegatronCheckpoint c = read_checkpoint(kFixtures + "/gpt_tp2pp2_torch_dist/ckpt/iter_0000010", "torch_dist");
  ASSERT_TRUE(c.dcp);
  EXPECT_EQ(c.dcp->bytes_read(), 0);
  const StoredTensor& fc1 = c.tensors.at("decoder.layers.0.mlp.linear_fc1.weight");
  ASSERT_EQ(fc1.shape(), (std::vector<int64_t>{256, 64}));
  const torch::Tensor half = fc1.read({0, 0}, {128, 64});
  EXPECT_TRUE(torch::equal(half, fc1.read().narrow(0, 0, 128)));
  const int64_t stacked = c.dcp->tensors().at("decoder.layers.mlp.linear_fc1.weight").chunks.front().storage.length;
  EXPECT_LE(c.dcp->bytes_read(), 2 * stacked);
  EXPECT_LT(c.dcp->bytes_read(), c.dcp->tensor_bytes() / 10);
}

TEST(MegatronCheckpoint, ExpertParallelMoeHoldsEveryExpertAndOneStep) {
  // Written by two expert-parallel ranks: each expert's weights lie in one rank's file, and the
  // optimizer state is a chained optimizer's (dense and expert Adam, one step count each).
  const MegatronCheckpoint c = read_checkpoint(kFixtures + "/moe_ep2_torch_dist/ckpt/iter_0000010", "torch_dist");
  ASSERT_TRUE(c.step);
  EXPECT_EQ(*c.step, 10);
  EXPECT_EQ(c.model_args.at("num_experts"), 4);
  for (int layer = 0; layer < 2; ++layer)
    for (int e = 0; e < 4; ++e) {
      const std::string fc1 = "decoder.layers." + std::to_string(layer) + ".mlp.experts.linear_fc1.weight" + std::to_string(e);
      ASSERT_TRUE(c.tensors.count(fc1)) << fc1;
      EXPECT_EQ(c.tensors.at(fc1).shape(), (std::vector<int64_t>{256, 64}));
      EXPECT_TRUE(c.tensors.count("optimizer.state.exp_avg_sq." + fc1)) << fc1;
    }
  // Values PyTorch's torch.distributed.checkpoint reads from the stacked tensors.
  EXPECT_FLOAT_EQ(c.tensors.at("decoder.layers.1.mlp.experts.linear_fc1.weight3").read()[200][5].item<float>(),
                  0.005540667567402124f);
  EXPECT_FLOAT_EQ(c.tensors.at("optimizer.state.exp_avg.decoder.layers.0.mlp.experts.linear_fc2.weight2").read()[10][100]
                      .item<float>(),
                  1.7187353478220757e-06f);
  EXPECT_FLOAT_EQ(c.tensors.at("decoder.layers.1.mlp.router.weight").read()[3][7].item<float>(), -0.012620589695870876f);
  EXPECT_FALSE(c.tensors.count("decoder.layers.0.mlp.experts.experts.linear_fc1.weight"));
}

TEST(MegatronCheckpoint, DistributedOptimizerBuffersHoldTheMomentsOfTheSameRun) {
  // Megatron's distributed optimizer over two data-parallel ranks stores flat per-bucket buffers;
  // the run is the one-rank fixture's (the same losses), so each parameter's moments, found in
  // the buffers, match that fixture's up to the order of the gradient reduction (1e-4 relative
  // in the q/k biases, whose gradients are tiny; a misplaced segment differs entirely).
  const MegatronCheckpoint flat =
      read_checkpoint(kFixtures + "/gpt_dp2_distopt_torch_dist/ckpt/iter_0000010", "torch_dist");
  const MegatronCheckpoint plain = read_checkpoint(kDist, "torch_dist");
  ASSERT_TRUE(flat.step);
  EXPECT_EQ(*flat.step, 10);
  ASSERT_EQ(flat.tensors.size(), plain.tensors.size());
  for (const auto& [name, t] : plain.tensors) {
    ASSERT_TRUE(flat.tensors.count(name)) << name;
    const torch::Tensor f = flat.tensors.at(name).read(), p = t.read();
    const double scale = p.abs().max().item<double>();
    EXPECT_LE((f - p).abs().max().item<double>(), 1e-3 * scale + 1e-12) << name;
  }
}

TEST(DcpCheckpoint, KeptChunksStayWithinTheirBudget) {
  // Four tensors of one 4 KiB chunk each, a budget of two chunks: boxes alternating between two
  // tensors read each chunk once; a third tensor drops the least recently used one.
  Scratch dir(kDist);
  Scratch::run("rm -rf '" + dir.path + "' && mkdir '" + dir.path + "'");
  std::vector<DcpChunkToWrite> chunks;
  std::map<std::string, torch::Tensor> values;
  for (const char* name : {"a", "b", "c", "d"}) {
    values[name] = torch::randn({1024});
    chunks.push_back({name, {1024}, {0}, values[name]});
  }
  write_dcp_metadata(dir.path, {write_dcp_file(dir.path, 0, {}, chunks)}, dir.path);
  const DcpCheckpoint dcp(dir.path, 2 * 4096);
  const int64_t chunk = dcp.tensors().at("a").chunks.front().storage.length;
  auto read = [&](const char* name, int64_t at) {
    EXPECT_TRUE(torch::equal(dcp.region(name, {at}, {8}), values[name].narrow(0, at, 8))) << name;
  };
  for (int64_t at = 0; at < 64; at += 8) read(at % 16 ? "a" : "b", at);
  EXPECT_EQ(dcp.bytes_read(), 2 * chunk);  // a and b, each once
  read("c", 0);                            // drops b, the least recently used
  read("a", 0);
  EXPECT_EQ(dcp.bytes_read(), 3 * chunk);
  read("b", 0);
  EXPECT_EQ(dcp.bytes_read(), 4 * chunk);
  // A single chunk larger than the budget is still read once while its boxes are asked for.
  const DcpCheckpoint small(dir.path, 16);
  small.region("d", {0}, {8});
  small.region("d", {8}, {8});
  EXPECT_EQ(small.bytes_read(), chunk);
}

TEST(MegatronCheckpoint, DistributedOptimizerStateIsLocatedForTheWeightsARankReads) {
  // Megatron's TP2 x PP2 distributed optimizer: a rank of the first of two pipeline stages reads
  // the state of layer 0 and the embeddings only, the same values as a read of everything, and
  // leaves the second stage's moments unread; a rank reading no state locates none.
  const std::string dir = kFixtures + "/llama_tp2pp2_distopt_torch_dist/ckpt/iter_0000010";
  const MegatronCheckpoint whole = read_checkpoint(dir, "torch_dist");
  std::set<std::string> first_stage;
  for (const auto& [name, t] : whole.tensors)
    if (name.starts_with("decoder.layers.0.") || name.starts_with("embedding.")) first_stage.insert(name);
  ASSERT_GT(first_stage.size(), 4u);
  const MegatronCheckpoint part = read_checkpoint(dir, "torch_dist", &first_stage);
  ASSERT_TRUE(part.step);
  EXPECT_EQ(*part.step, 10);
  for (const auto& [name, t] : part.tensors) {
    if (!name.starts_with("optimizer.state.")) continue;
    const std::string weight = name.substr(name.find('.', std::strlen("optimizer.state.")) + 1);
    EXPECT_TRUE(first_stage.count(weight)) << name;
    EXPECT_TRUE(torch::equal(t.read(), whole.tensors.at(name).read())) << name;
  }
  for (const std::string& w : first_stage) EXPECT_TRUE(part.tensors.count("optimizer.state.exp_avg_sq." + w)) << w;
  EXPECT_LT(part.dcp->bytes_read(), part.dcp->tensor_bytes() * 6 / 10);
  // One tensor-parallel rank's box of a column-parallel weight's moments: its own part only.
  const std::string qkv = "optimizer.state.exp_avg.decoder.layers.0.self_attention.linear_qkv.weight";
  const StoredTensor& moments = part.tensors.at(qkv);
  const int64_t rows = moments.shape()[0] / 2, before = part.dcp->bytes_read();
  part.dcp->forget_chunks();
  EXPECT_TRUE(torch::equal(moments.read({rows, 0}, {rows, moments.shape()[1]}),
                           whole.tensors.at(qkv).read().narrow(0, rows, rows)));
  int64_t one_bucket = 0;  // the largest chunk of a flat buffer
  for (const auto& [name, stored] : part.dcp->tensors())
    if (name.starts_with("optimizer.distributed."))
      for (const DcpChunk& c : stored.chunks) one_bucket = std::max(one_bucket, c.storage.length);
  EXPECT_LE(part.dcp->bytes_read() - before, 2 * one_bucket);

  const std::set<std::string> none;
  const MegatronCheckpoint weights_only = read_checkpoint(dir, "torch_dist", &none);
  EXPECT_EQ(weights_only.dcp->bytes_read(), 0);
  EXPECT_EQ(weights_only.optimizer, "adam");
  for (const auto& [name, t] : weights_only.tensors) EXPECT_FALSE(name.starts_with("optimizer.state.")) << name;
}

TEST(MegatronCheckpoint, LegacyDistributedOptimizerIsReadInRangesForTheWeightsARankReads) {
  // distrib_optim.pt holds a model-parallel rank's whole optimizer state: a rank reading one
  // weight's state scans the main weights' buffer (to find it, and the one-dimensional weights)
  // and reads that weight's two moment segments, no more; the values are those of a read of
  // everything, and a rank reading no state reads nothing of the file.
  const std::string dir = kFixtures + "/gpt_dp2_distopt_torch_legacy/ckpt/iter_0000010";
  const MegatronCheckpoint whole = read_checkpoint(dir, "torch");
  ASSERT_TRUE(whole.legacy_optimizer_reads);
  const int64_t stored = whole.legacy_optimizer_reads->stored;
  EXPECT_EQ(stored, 3 * 169728 * 4);  // param, exp_avg and exp_avg_sq of one fp32 buffer
  const std::string fc1 = "decoder.layers.1.mlp.linear_fc1.weight";
  const std::set<std::string> one{fc1};
  const MegatronCheckpoint part = read_checkpoint(dir, "torch", &one);
  ASSERT_TRUE(part.step);
  EXPECT_EQ(*part.step, 10);
  const int64_t searched = part.legacy_optimizer_reads->read;
  EXPECT_LE(searched, stored / 3);  // the main weights only
  for (const char* state : {"optimizer.state.exp_avg.", "optimizer.state.exp_avg_sq."})
    EXPECT_TRUE(torch::equal(part.tensors.at(state + fc1).read(), whole.tensors.at(state + fc1).read())) << state;
  const int64_t numel = part.tensors.at(fc1).read().numel();
  EXPECT_EQ(part.legacy_optimizer_reads->read - searched, 2 * numel * 4);
  EXPECT_FALSE(part.tensors.count("optimizer.state.exp_avg.decoder.layers.0.mlp.linear_fc1.weight"));

  const std::set<std::string> none;
  const MegatronCheckpoint weights_only = read_checkpoint(dir, "torch", &none);
  EXPECT_EQ(weights_only.legacy_optimizer_reads->read, 0);
  EXPECT_EQ(weights_only.optimizer, "adam");
}

TEST(MegatronCheckpoint, AFlippedByteInTheDistributedOptimizersStreamedBufferIsCaught) {
  // The main weights' buffer (entry data/0 of distrib_optim.pt) is streamed front to back by the
  // search, so its CRC-32 is checked; a load names the file and the entry.
  Scratch s(kFixtures + "/gpt_dp2_distopt_torch_legacy/ckpt/iter_0000010");
  std::fstream f(s.path + "/mp_rank_00/distrib_optim.pt", std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(300000);  // inside data/0, bytes 854 to 679,888 of the file
  f.write("garbage!", 8);
  f.close();
  const std::string msg = error_of([&] { read_checkpoint(s.path, "torch"); });
  EXPECT_NE(msg.find("distrib_optim.pt: entry data/0 ("), std::string::npos) << msg;
  EXPECT_NE(msg.find("fails its CRC-32 check"), std::string::npos) << msg;
}

TEST(MegatronCheckpoint, EqualWeightsAreOrderedAsMegatronsGradientBufferPlacesThem) {
  // The reverse of Megatron's registration order: the output layer, the multi-token-prediction
  // layers, the final norm, the decoder layers from the last, the embedding; in a layer the MLP
  // before its norm, the key (key-value) norm before the query norm, the input norm last.
  const std::vector<std::string> in_buffer_order = {
      "output_layer.weight",
      "mtp.layers.0.final_layernorm.weight",
      "mtp.layers.0.transformer_layer.mlp.linear_fc1.layer_norm_weight",
      "mtp.layers.0.enorm.weight",
      "decoder.final_layernorm.weight",
      "decoder.layers.1.mlp.linear_fc2.bias",
      "decoder.layers.1.mlp.linear_fc1.bias",
      "decoder.layers.1.pre_mlp_layernorm.weight",
      "decoder.layers.1.self_attention.k_layernorm.weight",
      "decoder.layers.1.self_attention.q_layernorm.weight",
      "decoder.layers.1.self_attention.linear_qkv.layer_norm_weight",
      "decoder.layers.0.self_attention.linear_kv_up_proj.layer_norm_weight",
      "decoder.layers.0.self_attention.linear_q_up_proj.layer_norm_weight",
      "decoder.layers.0.input_layernorm.weight",
      "embedding.word_embeddings.weight"};
  for (size_t i = 0; i + 1 < in_buffer_order.size(); ++i) {
    EXPECT_TRUE(placed_before_in_megatron_buffer(in_buffer_order[i], in_buffer_order[i + 1])) << in_buffer_order[i];
    EXPECT_FALSE(placed_before_in_megatron_buffer(in_buffer_order[i + 1], in_buffer_order[i])) << in_buffer_order[i];
  }
}

TEST(MegatronCheckpoint, LegacyRanksPutTogetherEqualTheDistributedCheckpointOfTheSameRun) {
  // Megatron saved the same TP2 x PP2 run in both formats (the same losses): the four legacy rank
  // files, put together, hold the global tensors the torch_dist checkpoint holds.
  const MegatronCheckpoint legacy =
      read_checkpoint(kFixtures + "/gpt_tp2pp2_torch_legacy/ckpt/iter_0000010", "torch");
  const MegatronCheckpoint dist = read_checkpoint(kFixtures + "/gpt_tp2pp2_torch_dist/ckpt/iter_0000010", "torch_dist");
  ASSERT_TRUE(legacy.step);
  EXPECT_EQ(*legacy.step, 10);
  EXPECT_EQ(legacy.iteration, 10);
  EXPECT_FALSE(legacy.tensors.count("output_layer.weight"));  // the last stage's copy of the embeddings
  ASSERT_EQ(legacy.tensors.size(), dist.tensors.size());
  for (const auto& [name, t] : dist.tensors) {
    ASSERT_TRUE(legacy.tensors.count(name)) << name;
    EXPECT_TRUE(torch::equal(legacy.tensors.at(name).read(), t.read())) << name;
  }
}

TEST(MegatronCheckpoint, LegacyTensorsAreReadAsTheBoxesARankHolds) {
  // Reading the four rank files of a TP2 x PP2 legacy checkpoint reads none of their tensors; a
  // rank then reads the bytes of the boxes it holds, no more, whether its layout is the saved one
  // (half of a tensor: one rank file's part) or another (a quarter: part of a part; rows of a
  // row-parallel weight cut along its columns), and the values are those of the same run's
  // torch_dist checkpoint.
  const MegatronCheckpoint legacy =
      read_checkpoint(kFixtures + "/gpt_tp2pp2_torch_legacy/ckpt/iter_0000010", "torch");
  const MegatronCheckpoint dist = read_checkpoint(kFixtures + "/gpt_tp2pp2_torch_dist/ckpt/iter_0000010", "torch_dist");
  ASSERT_TRUE(legacy.legacy_tensor_reads);
  const BytesRead& reads = *legacy.legacy_tensor_reads;
  EXPECT_EQ(reads.read, 0);
  int64_t held = 0;
  for (const auto& [name, t] : legacy.tensors) held += t.numel() * 4;  // fp32
  EXPECT_GT(reads.stored, held);  // and the last stage's copy of the embeddings, not put together
  struct Box {
    std::string name;
    std::vector<int64_t> offsets, sizes;
  };
  const std::string layer = "decoder.layers.1.";
  const std::vector<Box> boxes = {
      {layer + "self_attention.linear_qkv.weight", {96, 0}, {96, 64}},           // TP2 rank 1: one file's part
      {layer + "mlp.linear_fc1.weight", {64, 0}, {64, 64}},                      // TP4 rank 1: half of rank 0's
      {layer + "self_attention.linear_proj.weight", {0, 16}, {64, 16}},          // TP4 rank 1: its columns
      {"optimizer.state.exp_avg_sq." + layer + "mlp.linear_fc2.weight", {0, 32}, {64, 128}},  // TP2 rank 1
      {"optimizer.state.exp_avg." + layer + "mlp.linear_fc2.weight", {0, 0}, {64, 256}},      // the whole
      {layer + "self_attention.linear_qkv.layer_norm_weight", {0}, {64}},
  };
  for (const Box& box : boxes) {
    SCOPED_TRACE(box.name);
    const int64_t before = reads.read;
    const torch::Tensor t = legacy.tensors.at(box.name).read(box.offsets, box.sizes);
    EXPECT_EQ(reads.read - before, t.numel() * 4);
    EXPECT_TRUE(torch::equal(t, dist.tensors.at(box.name).read(box.offsets, box.sizes)));
  }
}

TEST(MegatronCheckpoint, LegacyRanksJoinGatedColumnsRowsAndStages) {
  // Two stages of one layer each, two tensor-parallel ranks: a SwiGLU fc1 is [gate; up] on each
  // rank, so the global one is both ranks' gates, then both ranks' ups.
  auto part = [](float base, bool last_stage) {
    MegatronCheckpoint c;
    c.iteration = 5;
    c.path = "rank";
    c.tensors["decoder.layers.0.mlp.linear_fc1.weight"] = torch::tensor({base, base + 1}).view({2, 1});
    c.tensors["optimizer.state.exp_avg.decoder.layers.0.mlp.linear_fc2.weight"] = torch::tensor({{base}});
    c.tensors["decoder.layers.0.mlp.linear_fc1.layer_norm_weight"] = torch::tensor({7.f});
    if (last_stage) c.tensors["output_layer.weight"] = torch::tensor({{base}});
    return c;
  };
  std::vector<std::vector<MegatronCheckpoint>> parts = {{part(0, false), part(10, false)},
                                                        {part(20, true), part(30, true)}};
  const MegatronCheckpoint out = merge_legacy_ranks(parts, /*gated_linear_unit=*/true, /*tied_embeddings=*/true);
  EXPECT_TRUE(torch::equal(out.tensors.at("decoder.layers.0.mlp.linear_fc1.weight").read().view({-1}),
                           torch::tensor({0.f, 10.f, 1.f, 11.f})));
  EXPECT_TRUE(torch::equal(out.tensors.at("decoder.layers.1.mlp.linear_fc1.weight").read().view({-1}),
                           torch::tensor({20.f, 30.f, 21.f, 31.f})));
  EXPECT_TRUE(torch::equal(out.tensors.at("optimizer.state.exp_avg.decoder.layers.1.mlp.linear_fc2.weight").read(),
                           torch::tensor({{20.f, 30.f}})));
  EXPECT_TRUE(torch::equal(out.tensors.at("decoder.layers.1.mlp.linear_fc1.layer_norm_weight").read(), torch::tensor({7.f})));
  EXPECT_FALSE(out.tensors.count("output_layer.weight"));
  // A box across the ranks' parts reads each part's piece of it: rows 1-2 are rank 1's gate row and
  // rank 0's up row.
  EXPECT_TRUE(torch::equal(out.tensors.at("decoder.layers.0.mlp.linear_fc1.weight").read({1, 0}, {2, 1}).view({-1}),
                           torch::tensor({10.f, 1.f})));
  const MegatronCheckpoint untied = merge_legacy_ranks(parts, false, /*tied_embeddings=*/false);
  EXPECT_TRUE(torch::equal(untied.tensors.at("output_layer.weight").read(), torch::tensor({{20.f}, {30.f}})));
  EXPECT_TRUE(torch::equal(untied.tensors.at("decoder.layers.0.mlp.linear_fc1.weight").read().view({-1}),
                           torch::tensor({0.f, 1.f, 10.f, 11.f})));
}

// A torch_dist checkpoint of one weight `w` whose optimizer state is the distributed optimizer's
// in `layout`, Adam's step 3 in its parameter groups.
void write_distributed_optimizer_checkpoint(const std::string& dir, const std::string& layout) {
  Scratch::run("rm -rf '" + dir + "' && mkdir -p '" + dir + "'");
  const PyRef args = py_object(py_global("argparse", "Namespace"), py_dict({{"num_layers", py_int(1)}}));
  const PyRef optimizer = py_dict({{"optimizer", py_dict({{"param_groups", py_list({py_dict({{"step", py_int(3)}}),
                                                                                    py_dict({{"step", py_float(3)}})})}})},
                                   {"param_state_sharding_type", py_str(layout)}});
  const PyRef common = py_dict({{"args", args}, {"iteration", py_int(3)}, {"optimizer", optimizer},
                                {"opt_param_scheduler", py_none()}});
  const torch::Tensor w = torch::arange(6, torch::kFloat32).view({2, 3});
  std::vector<DcpChunkToWrite> chunks = {{"w", {2, 3}, {0, 0}, w}, {"optimizer.state.param.w", {2, 3}, {0, 0}, w},
                                         {"optimizer.state.exp_avg.w", {2, 3}, {0, 0}, w * 2},
                                         {"optimizer.state.exp_avg_sq.w", {2, 3}, {0, 0}, w * 3}};
  const std::string entries = write_dcp_file(
      dir, 0, {{"common_state/shard_0_1", TorchSaveWriter().bytes(py_list({common}))}}, chunks);
  write_dcp_metadata(dir, {entries}, dir);
  std::ofstream(dir + "/metadata.json") << R"({"sharded_backend": "torch_dist", "sharded_backend_version": 1})";
}

TEST(MegatronCheckpoint, DistributedOptimizerInItsFullyReshardableLayoutAndOthersRefused) {
  Scratch dir(kDist);  // any directory to write into
  write_distributed_optimizer_checkpoint(dir.path, "fully_reshardable");
  const MegatronCheckpoint c = read_checkpoint(dir.path, "torch_dist");
  ASSERT_TRUE(c.step);
  EXPECT_EQ(*c.step, 3);
  EXPECT_TRUE(torch::equal(c.tensors.at("optimizer.state.fp32_param.w").read(), c.tensors.at("w").read()));
  EXPECT_TRUE(torch::equal(c.tensors.at("optimizer.state.exp_avg_sq.w").read(), c.tensors.at("w").read() * 3));
  // Another layout: the weights still load (--no-load-optim); a load of the optimizer state is
  // refused with this line.
  write_distributed_optimizer_checkpoint(dir.path, "dp_zero_gather_scatter");
  const MegatronCheckpoint other = read_checkpoint(dir.path, "torch_dist");
  const std::string& msg = other.optimizer_refusal;
  EXPECT_NE(msg.find("in Megatron's dp_zero_gather_scatter layout, which fp8tron does not read"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("--no-load-optim"), std::string::npos) << msg;
  EXPECT_FALSE(other.step);
  EXPECT_EQ(other.tensors.size(), 1u);
  EXPECT_TRUE(torch::equal(other.tensors.at("w").read(), c.tensors.at("w").read()));
}

TEST(MegatronCheckpoint, MegatronCore013sCommonFileAndFlattenedDistributedOptimizerStateAreRead) {
  // gpt_torch_dist's state as Megatron-Core 0.13 saves it from TP2 x DP2 ranks with the
  // distributed optimizer: the common state in common.pt, each weight's fp32 copy and moments
  // stored flattened per data-parallel rank (fully_sharded_model_space, chunks of shape (layers,
  // tensor-parallel parts, ..., elements of a part)). Read as the weights' shapes, they are the
  // tensors of the run it came from.
  const std::string dir = kFixtures + "/gpt_tp2dp2_distopt_core_0_13/ckpt/iter_0000010";
  const MegatronCheckpoint c = read_checkpoint(dir, "torch_dist");
  const MegatronCheckpoint source = read_checkpoint(kDist, "torch_dist");
  EXPECT_EQ(c.iteration, 10);
  ASSERT_TRUE(c.step);
  EXPECT_EQ(*c.step, 10);
  EXPECT_EQ(c.optimizer, "adam");
  EXPECT_EQ(c.optimizer_refusal, "");
  EXPECT_EQ(c.model_args.at("num_layers"), 2);
  int compared = 0;
  for (const auto& [name, t] : source.tensors) {
    ASSERT_TRUE(c.tensors.count(name)) << name;
    EXPECT_TRUE(torch::equal(c.tensors.at(name).read(), t.read())) << name;
    ++compared;
    if (name.starts_with("optimizer.")) continue;
    const std::string main = "optimizer.state.fp32_param." + name;
    ASSERT_TRUE(c.tensors.count(main)) << main;
    EXPECT_TRUE(torch::equal(c.tensors.at(main).read(), t.read())) << main;
  }
  EXPECT_EQ(compared, 84);  // 28 weights and their two moments
  // A box across two tensor-parallel parts of a layer's QKV weight (rows 96 on are rank 1's), cut
  // along both axes, reads each part's piece.
  const std::string qkv = "optimizer.state.exp_avg.decoder.layers.1.self_attention.linear_qkv.weight";
  EXPECT_TRUE(torch::equal(c.tensors.at(qkv).read({90, 5}, {12, 30}),
                           source.tensors.at(qkv).read().narrow(0, 90, 12).narrow(1, 5, 30)));
}

TEST(MegatronCheckpoint, MegatronCore013sChainedOptimizersStatesLoseTheirChainPrefix) {
  // An MoE model's optimizer before Megatron-Core 0.14 is a chain whose states are named
  // chained_<i>.optimizer.state...: the dense weight w's in chain 0 as saved, the expert weight
  // v's in chain 1 flattened (fully_sharded_model_space: v's two row chunks, each whole).
  Scratch dir(kDist);  // any directory to write into
  Scratch::run("rm -rf '" + dir.path + "' && mkdir -p '" + dir.path + "'");
  const PyRef args = py_object(py_global("argparse", "Namespace"), py_dict({{"num_layers", py_int(1)}}));
  const PyRef groups = py_dict({{"optimizer", py_dict({{"param_groups", py_list({py_dict({{"step", py_int(3)}})})}})},
                                {"param_state_sharding_type", py_str("fully_sharded_model_space")}});
  PyRef chain = make_value(PyValue::Kind::Dict);
  chain->entries.emplace_back(py_int(0), groups);
  chain->entries.emplace_back(py_int(1), groups);
  const PyRef common = py_dict({{"args", args}, {"iteration", py_int(3)}, {"optimizer", chain}});
  const torch::Tensor w = torch::arange(6, torch::kFloat32).view({2, 3}), v = w + 10;
  const std::vector<DcpChunkToWrite> chunks = {
      {"w", {2, 3}, {0, 0}, w},
      {"v", {2, 3}, {0, 0}, v},
      {"chained_0.optimizer.state.exp_avg.w", {2, 3}, {0, 0}, w * 2},
      {"chained_0.optimizer.state.exp_avg_sq.w", {2, 3}, {0, 0}, w * 3},
      {"chained_1.optimizer.state.exp_avg.v", {2, 1, 3}, {0, 0, 0}, (v * 2).narrow(0, 0, 1).view({1, 1, 3})},
      {"chained_1.optimizer.state.exp_avg.v", {2, 1, 3}, {1, 0, 0}, (v * 2).narrow(0, 1, 1).view({1, 1, 3})},
      {"chained_1.optimizer.state.exp_avg_sq.v", {2, 1, 3}, {0, 0, 0}, (v * 3).narrow(0, 0, 1).view({1, 1, 3})},
      {"chained_1.optimizer.state.exp_avg_sq.v", {2, 1, 3}, {1, 0, 0}, (v * 3).narrow(0, 1, 1).view({1, 1, 3})}};
  const std::string entries = write_dcp_file(dir.path, 0, {}, chunks);
  write_dcp_metadata(dir.path, {entries}, dir.path);
  std::ofstream(dir.path + "/metadata.json") << R"({"sharded_backend": "torch_dist", "sharded_backend_version": 1})";
  std::ofstream(dir.path + "/common.pt", std::ios::binary) << TorchSaveWriter().bytes(common);
  const MegatronCheckpoint c = read_checkpoint(dir.path, "torch_dist");
  EXPECT_EQ(c.optimizer_refusal, "");
  ASSERT_TRUE(c.step);
  EXPECT_EQ(*c.step, 3);
  EXPECT_TRUE(torch::equal(c.tensors.at("optimizer.state.exp_avg_sq.w").read(), w * 3));
  EXPECT_TRUE(torch::equal(c.tensors.at("optimizer.state.exp_avg.v").read(), v * 2));
  EXPECT_TRUE(torch::equal(c.tensors.at("optimizer.state.exp_avg_sq.v").read({1, 1}, {1, 2}), (v * 3).narrow(0, 1, 1).narrow(1, 1, 2)));
}

TEST(MegatronCheckpoint, TruncatedDistcpNamesTheFile) {
  Scratch s(kDist);
  ASSERT_EQ(::truncate((s.path + "/__0_0.distcp").c_str(), 1000000), 0);
  const std::string msg = error_of([&] { read_checkpoint(s.path, "torch_dist"); });
  EXPECT_NE(msg.find("__0_0.distcp"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
}

TEST(MegatronCheckpoint, CorruptedLegacyFileNamesTheFile) {
  Scratch s(kLegacy);
  const std::string file = s.path + "/mp_rank_00/model_optim_rng.pt";
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(0);
  f.write("garbage!", 8);
  f.close();
  const std::string msg = error_of([&] { read_checkpoint(s.path, "torch"); });
  EXPECT_NE(msg.find("model_optim_rng.pt"), std::string::npos) << msg;
}

TEST(MegatronCheckpoint, AFlippedByteInATensorIsCaughtByItsEntrysCrc) {
  Scratch s(kLegacy);
  const std::string file = s.path + "/mp_rank_00/model_optim_rng.pt";
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(60000);  // inside data/0, the word embeddings
  f.write("garbage!", 8);
  f.close();
  const MegatronCheckpoint c = read_checkpoint(s.path, "torch");  // reads no tensor yet
  const std::string msg = error_of([&] { c.tensors.at("embedding.word_embeddings.weight").read(); });
  EXPECT_NE(msg.find("model_optim_rng.pt: entry data/0 (embedding.word_embeddings.weight) fails its CRC-32 check"),
            std::string::npos)
      << msg;
}

TEST(MegatronCheckpoint, AFlippedByteInAStorageSharedByTensorsIsCaughtOnceTheyAreRead) {
  // A legacy distributed optimizer's model_optim_rng.pt stores the weights as views of one
  // parameter buffer (entry data/0): read tensor by tensor, in no particular order, they cover the
  // entry, whose CRC-32 is then checked.
  Scratch s(kFixtures + "/gpt_dp2_distopt_torch_legacy/ckpt/iter_0000010");
  const MegatronCheckpoint intact = read_checkpoint(s.path, "torch");
  for (const auto& [name, t] : intact.tensors)
    if (!name.starts_with("optimizer.")) t.read();
  std::fstream f(s.path + "/mp_rank_00/model_optim_rng.pt", std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(400000);  // inside data/0, bytes 46,8xx to 725,7xx of the file
  f.write("garbage!", 8);
  f.close();
  const std::string msg = error_of([&] {  // the search for the weights in distrib_optim.pt reads them all
    const MegatronCheckpoint c = read_checkpoint(s.path, "torch");
    for (const auto& [name, t] : c.tensors)
      if (!name.starts_with("optimizer.")) t.read();
  });
  EXPECT_NE(msg.find("model_optim_rng.pt: entry data/0 ("), std::string::npos) << msg;
  EXPECT_NE(msg.find("fails its CRC-32 check"), std::string::npos) << msg;
}

TEST(ZipCrc, CombinedCrcIsTheCrcOfTheBytesJoined) {
  std::string bytes;
  for (int i = 0; i < 1000; ++i) bytes.push_back(char((i * 7919) % 251));
  for (size_t cut : {size_t(0), size_t(1), size_t(3), size_t(500), size_t(999), size_t(1000)})
    EXPECT_EQ(crc32_combine(crc32(bytes.data(), cut), crc32(bytes.data() + cut, bytes.size() - cut), bytes.size() - cut),
              crc32(bytes.data(), bytes.size()))
        << cut;
  // Ranges counted out of order, one twice, complete the entry; a wrong stored CRC is caught.
  const uint32_t whole = crc32(bytes.data(), bytes.size());
  EntryCrcCheck good(whole, 1000), bad(whole ^ 1, 1000);
  for (EntryCrcCheck* check : {&good, &bad}) {
    EXPECT_TRUE(check->add(600, bytes.data() + 600, 300));
    EXPECT_TRUE(check->add(0, bytes.data(), 200));
    EXPECT_TRUE(check->add(650, bytes.data() + 650, 10));  // already counted
    EXPECT_TRUE(check->add(900, bytes.data() + 900, 100));
  }
  EXPECT_TRUE(good.add(200, bytes.data() + 200, 400));
  EXPECT_FALSE(bad.add(200, bytes.data() + 200, 400));
}

TEST(ZipCrc, Crc32IsZipsAndContinues) {
  const std::string check = "123456789";  // the CRC-32 check value of this string is 0xCBF43926
  EXPECT_EQ(crc32(check.data(), check.size()), 0xCBF43926u);
  EXPECT_EQ(crc32(check.data() + 4, 5, crc32(check.data(), 4)), 0xCBF43926u);
  EXPECT_EQ(crc32(nullptr, 0), 0u);
}

// A zip whose end record defers to zip64's (as archives over 4 GiB or 65,535 entries have): one
// central-directory entry, the zip64 end record, its locator, then the end record.
std::string zip64_directory(uint32_t crc, const std::string& name) {
  auto put = [](std::string& b, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) b.push_back(char((v >> (8 * i)) & 0xFF));
  };
  std::string b(100, 'x');  // where local headers and data would be
  const uint64_t directory_at = b.size();
  put(b, 0x02014b50, 4), put(b, 0, 12), put(b, crc, 4), put(b, 0, 8), put(b, name.size(), 2), put(b, 0, 16);
  b += name;
  const uint64_t directory_size = b.size() - directory_at, zip64_at = b.size();
  put(b, 0x06064b50, 4), put(b, 44, 8), put(b, 0, 20), put(b, 1, 8), put(b, directory_size, 8), put(b, directory_at, 8);
  put(b, 0x07064b50, 4), put(b, 0, 4), put(b, zip64_at, 8), put(b, 1, 4);
  put(b, 0x06054b50, 4), put(b, 0, 4), put(b, 0xFFFF, 2), put(b, 0xFFFF, 2), put(b, 0xFFFFFFFF, 4), put(b, 0xFFFFFFFF, 4);
  put(b, 0, 2);
  return b;
}

TEST(ZipCrc, ReadsTheDirectoryOfAZip64ArchiveAndNamesADamagedOne) {
  const std::string zip = zip64_directory(0xCBF43926u, "archive/data/7");
  auto read = [&](const std::string& bytes) {
    return [&bytes](uint64_t offset, size_t n) { return offset < bytes.size() ? bytes.substr(offset, n) : std::string(); };
  };
  const auto crcs = zip_entry_crcs(zip.size(), read(zip), "x.pt");
  ASSERT_EQ(crcs.size(), 1u);
  EXPECT_EQ(crcs.at("data/7"), 0xCBF43926u);
  std::string damaged = zip;
  damaged[100] = 'y';  // the directory entry's signature
  EXPECT_NE(error_of([&] { zip_entry_crcs(damaged.size(), read(damaged), "x.pt"); }).find("x.pt: its zip directory has a "
                                                                                          "damaged entry 0"),
            std::string::npos);
  const std::string cut = zip.substr(0, zip.size() - 5);
  EXPECT_NE(error_of([&] { zip_entry_crcs(cut.size(), read(cut), "x.pt"); }).find("has no end record"), std::string::npos);
}

TEST(MegatronCheckpoint, MissingMetadataNamesTheFile) {
  Scratch s(kDist);
  ASSERT_EQ(std::remove((s.path + "/.metadata").c_str()), 0);
  const std::string msg = error_of([&] { read_checkpoint(s.path, "torch_dist"); });
  EXPECT_NE(msg.find(".metadata"), std::string::npos) << msg;
}

}  // namespace
}  // namespace fp8tron::checkpoint::megatron
