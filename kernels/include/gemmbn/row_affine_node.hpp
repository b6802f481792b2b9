// Epilogue visitor leaf (CUTLASS 3.x sm90 EVT): the per-column affine of the accumulator, rounded to Element.
//
//   y[m, n] = ((acc[m, n] u[n] + b[n]) s[n]) g[n] + h[n]   (u: the split GEMM's 2^-b[n] only; a null vector
//                                                           reads as 0 for b and h, 1 for s, g and u)
//
// The same arithmetic as a tree of one CUTLASS row broadcast per vector, in one node: a thread issues every
// vector's global load before its first shared-memory store, so a tile's epilogue waits for one load latency
// instead of one per vector, which short K exposes (perf/NOTES.md v26).
// Per epilogue subtile column a thread keeps each vector's values in registers, loaded when the subtile column
// starts (CUTLASS walks epi_m innermost), as the row broadcast does.
#pragma once

#include <cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp>
#include <cutlass/numeric_conversion.h>

#include "gemmbn/no_workspace_node.hpp"

namespace gemmbn::epilogue {

using namespace cute;
namespace fusion = cutlass::epilogue::fusion;

template <class Element>
struct RowAffineArguments {
  Element const* bias = nullptr;   // b[n]
  Element const* scale = nullptr;  // s[n]
  float const* gain = nullptr;     // g[n] (eval: folded BatchNorm)
  float const* shift = nullptr;    // h[n]
  float const* unscale = nullptr;  // u[n] (split GEMM: W's row scale 2^-b[n]); ignored elsewhere
};

template <class CtaTileShapeMNK, class Element, bool kUnscale>
struct Sm90RowAffine : NoWorkspaceNode<RowAffineArguments<Element>> {
  using Base = NoWorkspaceNode<RowAffineArguments<Element>>;
  using typename Base::Arguments;
  using typename Base::Params;
  static constexpr int kTileM = decltype(size<0>(CtaTileShapeMNK{}))::value;
  static constexpr int kTileN = decltype(size<1>(CtaTileShapeMNK{}))::value;
  // Float vectors: gain, shift and (split) unscale. b and s stay in Element, as the tree kept them (16-bit rows:
  // the same shared memory, so the same mainloop stages).
  static constexpr int kFloatVectors = kUnscale ? 3 : 2;
  enum FloatVector { kGain = 0, kShift = 1, kUnscaleVector = 2 };

  struct SharedStorage {
    alignas(16) Element bias_scale[2][kTileN];
    alignas(16) float gain_shift[kFloatVectors][kTileN];
  };

  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const&) {
    return true;
  }

  CUTLASS_HOST_DEVICE Sm90RowAffine() {}
  CUTLASS_HOST_DEVICE Sm90RowAffine(Params const& params, SharedStorage const& shared)
      : params(params), smem(const_cast<SharedStorage*>(&shared)) {}

  Params params;
  SharedStorage* smem = nullptr;

  // ElementView / FloatView: (CPY,CPY_M,CPY_N,EPI_M,EPI_N) shared-memory views of one vector, stride 0 along rows.
  // Registers: (CPY,CPY_M,CPY_N) float, one entry per column the thread visits in a subtile.
  template <class ElementView, class FloatView, class Registers, int kThreads>
  struct ConsumerStoreCallbacks : fusion::detail::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(Params const& params, SharedStorage* smem, ElementView bias_view,
                                          ElementView scale_view, cute::array<FloatView, kFloatVectors> float_views,
                                          int column0, int columns_left, int thread_idx)
        : params(params), smem(smem), bias_view(bias_view), scale_view(scale_view), float_views(float_views),
          column0(column0), columns_left(columns_left), thread_idx(thread_idx) {}

    Params const& params;
    SharedStorage* smem;
    ElementView bias_view, scale_view;
    cute::array<FloatView, kFloatVectors> float_views;
    int column0;       // the tile's first column
    int columns_left;  // columns of the problem from column0 on
    int thread_idx;
    Registers bias, scale;
    cute::array<Registers, kFloatVectors> floats;

    // Global to shared: thread t takes columns t, t + kThreads, ...; every load before any store.
    CUTLASS_DEVICE void begin() {
      constexpr int kSteps = (kTileN + kThreads - 1) / kThreads;
      Element b[kSteps], s[kSteps];
      float f[kFloatVectors][kSteps];
      const float float_default[3] = {1.f, 0.f, 1.f};  // gain, shift, unscale
      float const* float_ptr[3] = {params.gain, params.shift, params.unscale};
      CUTLASS_PRAGMA_UNROLL
      for (int step = 0; step < kSteps; ++step) {
        const int n = step * kThreads + thread_idx;
        const bool inside = n < kTileN && n < columns_left;
        b[step] = inside && params.bias != nullptr ? params.bias[column0 + n] : Element(0.f);
        s[step] = inside && params.scale != nullptr ? params.scale[column0 + n] : Element(1.f);
        CUTLASS_PRAGMA_UNROLL
        for (int v = 0; v < kFloatVectors; ++v) {
          f[v][step] = inside && float_ptr[v] != nullptr ? float_ptr[v][column0 + n] : float_default[v];
        }
      }
      CUTLASS_PRAGMA_UNROLL
      for (int step = 0; step < kSteps; ++step) {
        const int n = step * kThreads + thread_idx;
        if (n < kTileN) {
          smem->bias_scale[0][n] = b[step];
          smem->bias_scale[1][n] = s[step];
          CUTLASS_PRAGMA_UNROLL
          for (int v = 0; v < kFloatVectors; ++v) smem->gain_shift[v][n] = f[v][step];
        }
      }
    }

    CUTLASS_DEVICE bool begin_sync_needed() const { return true; }  // the stores above, before begin_loop reads

    // Shared to registers, once per subtile column.
    CUTLASS_DEVICE void begin_loop(int epi_m, int epi_n) {
      if (epi_m != 0) return;
      load_columns(bias_view(_, _, _, epi_m, epi_n), bias);
      load_columns(scale_view(_, _, _, epi_m, epi_n), scale);
      CUTLASS_PRAGMA_UNROLL
      for (int v = 0; v < kFloatVectors; ++v) load_columns(float_views[v](_, _, _, epi_m, epi_n), floats[v]);
    }

    template <class View>
    CUTLASS_DEVICE static void load_columns(View const& view, Registers& registers) {
      Tensor from = filter_zeros(view);
      Tensor to = filter_zeros(registers);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(from); ++i) to(i) = static_cast<float>(from(i));
    }

    // The tree's arithmetic and rounding: (acc u + b) s g + h in float, rounded to nearest Element.
    template <class ElementAccumulator, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<Element, FragmentSize> visit(
        cutlass::Array<ElementAccumulator, FragmentSize> const& acc, int epi_v, int, int) {
      cutlass::Array<float, FragmentSize> out;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) {
        const int c = epi_v * FragmentSize + i;
        float v;
        if constexpr (kUnscale) {
          v = static_cast<float>(acc[i]) * floats[kUnscaleVector](c) + bias(c);
        } else {
          v = static_cast<float>(acc[i]) + bias(c);
        }
        v = v * scale(c);
        out[i] = v * floats[kGain](c) + floats[kShift](c);
      }
      return cutlass::NumericArrayConverter<Element, float, FragmentSize, cutlass::FloatRoundStyle::round_to_nearest>{}(
          out);
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(fusion::detail::ConsumerStoreArgs<Args...> const& args) {
    auto row_layout = make_layout(make_shape(Int<kTileM>{}, Int<kTileN>{}), make_stride(_0{}, _1{}));
    auto view_of = [&](auto* vector) {
      return fusion::sm90_partition_for_epilogue<ReferenceSrc>(make_tensor(make_smem_ptr(vector), row_layout),
                                                               args.epi_tile, args.tiled_copy, args.thread_idx);
    };
    auto bias_view = view_of(&smem->bias_scale[0][0]);
    auto scale_view = view_of(&smem->bias_scale[1][0]);
    using FloatView = decltype(view_of(&smem->gain_shift[0][0]));
    cute::array<FloatView, kFloatVectors> float_views;
    CUTLASS_PRAGMA_UNROLL
    for (int v = 0; v < kFloatVectors; ++v) float_views[v] = view_of(&smem->gain_shift[v][0]);
    using Registers = decltype(make_tensor_like<float>(take<0, 3>(bias_view)));

    auto [m_tile, n_tile, k_tile, l_tile] = args.tile_coord_mnkl;
    const int column0 = static_cast<int>(n_tile) * kTileN;
    const int columns_left = static_cast<int>(get<1>(args.problem_shape_mnkl)) - column0;
    constexpr int kThreads = decltype(size(args.tiled_copy))::value;
    return ConsumerStoreCallbacks<decltype(bias_view), FloatView, Registers, kThreads>(
        params, smem, bias_view, scale_view, float_views, column0, columns_left, args.thread_idx);
  }
};

}  // namespace gemmbn::epilogue
