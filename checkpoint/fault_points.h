// FOR TESTS ONLY. Named points in the checkpoint code (each step of a save, of its commit and of
// retention's deletions) where the fault-injection suite (tests/fault_injection_test.py) kills the
// process with SIGKILL, to check that a crash at any of them leaves the last committed checkpoint
// loadable. Armed only through the hidden test flag --fp8tron-test-kill-at NAME[@HIT]; unarmed,
// fault_point() costs one atomic load. Torch-free.
#pragma once
#include <string>
#include <vector>

namespace fp8tron::checkpoint {

// Every point fault_point() is called with, in the order a save reaches them.
const std::vector<std::string>& fault_point_names();

// "NAME" or "NAME@HIT" (HIT >= 1, default 1): the HIT-th time this process reaches NAME it is
// killed. UserError naming the known points for an unknown name.
void arm_fault_point(const std::string& spec);

// Called at each point (any thread).
void fault_point(const std::string& name);

}  // namespace fp8tron::checkpoint
