// What an epilogue visitor node (CUTLASS 3.x sm90 EVT) without a workspace or a producer load has in common: its
// Params are its Arguments, and its workspace and producer-load hooks do nothing. The nodes derive from it and keep
// only what is theirs (can_implement, the consumer callbacks).
#pragma once

#include <cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp>

namespace gemmbn::epilogue {

template <class NodeArguments>
struct NoWorkspaceNode {
  using Arguments = NodeArguments;
  using Params = NodeArguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }

  CUTLASS_DEVICE bool is_producer_load_needed() const { return false; }
  CUTLASS_DEVICE bool is_C_load_needed() const { return false; }

  template <class... Args>
  CUTLASS_DEVICE auto get_producer_load_callbacks(cutlass::epilogue::fusion::detail::ProducerLoadArgs<Args...> const&) {
    return cutlass::epilogue::fusion::detail::EmptyProducerLoadCallbacks{};
  }
};

}  // namespace gemmbn::epilogue
