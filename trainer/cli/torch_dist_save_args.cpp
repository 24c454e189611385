#include "trainer/cli/torch_dist_save_args.h"

namespace fp8tron {

std::string torch_dist_unwritable_flag(const Config& c) {
  // fp8tron writes the distributed optimizer's layout with Adam's moments only.
  if (c.optimizer.optimizer == "sgd" && c.distributed.distributed_optimizer) return "--optimizer sgd with --use-distributed-optimizer";
  if (c.optimizer.optimizer != "adam" && c.optimizer.optimizer != "sgd") return "--optimizer " + c.optimizer.optimizer;
  // The distributed optimizer is written in Megatron's fully_reshardable layout; Megatron-FSDP's
  // checkpoints are its fsdp_dtensor format.
  if (c.distributed.dp_sharding != DataParallelSharding::None) return "--use-megatron-fsdp / --use-torch-fsdp2";
  return "";
}

void settle_torch_dist_save(Config& c) {
  if (!c.checkpoint.save_torch_dist || !c.checkpoint.convert_format.empty()) return;
  const std::string flag = torch_dist_unwritable_flag(c);
  if (flag.empty()) return;
  c.checkpoint.save_torch_dist = false;
  c.hint_warnings.push_back("--ckpt-format torch_dist: fp8tron does not write Megatron's torch_dist format with " + flag +
                            " yet, so it saves its own format (which --load resumes in any layout, and "
                            "--ckpt-convert-format torch_dist converts where it can)");
}

}  // namespace fp8tron
