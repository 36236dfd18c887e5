// Waiting for MegEngine's queued CPU work before a custom op reads its inputs, shared by the BN and conv
// CPU kernels. MegEngine 1.13 calls a CPU custom op's compute without waiting for the work still queued
// on the CPU comp node (imperative apply_on_physical_tensor has no sync; the graph CustomOpNode syncs
// only after compute): inputs written by previous ops, or by the asynchronous copy that makes a
// non-contiguous input contiguous, can be read before they are written. The library exports
// mgb::CompNode::sync_all() (MegEngine's own custom-op code calls it around compute); it is declared
// weak here so a MegEngine without it still loads (the Python side then syncs).
#pragma once

namespace mgb {
class CompNode {
public:
    static void sync_all() __attribute__((weak));
};
}  // namespace mgb

namespace basebn {

inline void wait_for_queued_work() {
    if (&mgb::CompNode::sync_all != nullptr)
        mgb::CompNode::sync_all();
}

}  // namespace basebn
