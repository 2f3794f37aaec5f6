// RoutedExpertsGpu's batches grouped by expert on the device: a layer whose experts are all in
// VRAM routes a batch of more than kDeviceRoutingMaxTokens tokens (prefill, several sequences, a
// draft's verification) on the GPU, groups its items by expert there (each expert's weights read
// once for all its tokens, as the host's grouping did) and combines them, with no host round trip:
// the host used to copy the router logits back, synchronise the stream, route and upload the expert
// lists on every such layer while the GPU waited (issue 30).
#include <string>
#include <vector>

#include "common/error.h"
#include "coordinator/gpu/routed_experts_gpu.h"
#include "coordinator/gpu/routed_experts_gpu_internal.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/expert_lists.h"
#include "kernels/cuda/router.h"

namespace moe::gpu {

bool RoutedExpertsGpu::groups_on_device(int64_t l, int64_t n,
                                        const model::ForwardHooks* hooks) const {
  const bool host_hooks = hooks && (hooks->force_experts || hooks->observe_layer);
  return device_groups_ && residency_->layer_on_gpu(l) && n > kDeviceRoutingMaxTokens &&
         !host_hooks;
}

void RoutedExpertsGpu::reserve_groups(int64_t n) {
  const int64_t X = cfg_.n_expert, K = cfg_.n_expert_used, items = n * K;
  const size_t bytes =
      static_cast<size_t>(n * X + items) * 4 +                              // probs, weights
      static_cast<size_t>(5 * items + X + 1 + items + 1 + n + 1 + X) * 4 +  // lists
      static_cast<size_t>(3 * X) * sizeof(void*) + 16 * 16;                 // pointers, padding
  dg_.buf = VramBuffer();  // the old lists go first: the stream is idle between forwards
  dg_.buf = budget_.allocate(bytes, VramUse::Scratch, "device expert groups");
  routed_internal::MetaWriter w(dg_.buf.as<unsigned char>());
  dg_.probs = w.take<float>(n * X);
  dg_.weights = w.take<float>(items);
  dg_.ids = w.take<int32_t>(items);
  dg_.x_rows = w.take<int32_t>(items);
  dg_.row_expert = w.take<int32_t>(items);
  dg_.pos = w.take<int32_t>(items);
  dg_.offsets = w.take<int32_t>(X + 1);
  dg_.ident = w.take<int32_t>(items + 1);
  dg_.tok_off = w.take<int32_t>(n + 1);
  dg_.experts = w.take<int32_t>(X);
  dg_.gate = w.take<const void*>(X);
  dg_.up = w.take<const void*>(X);
  dg_.down = w.take<const void*>(X);
  if (w.size() > bytes) throw Error("device expert groups: layout overflow");
  // The constant lists: rows in order (the down projection's inputs), token t's items at t * K,
  // and every expert's id (its pointers gathered from the residency table).
  std::vector<int32_t> v(static_cast<size_t>(items + 1));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int32_t>(i);
  MOE_CUDA_CHECK(cudaMemcpy(dg_.ident, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
  MOE_CUDA_CHECK(
      cudaMemcpy(dg_.experts, v.data(), static_cast<size_t>(X) * 4, cudaMemcpyHostToDevice));
  for (int64_t t = 0; t <= n; ++t) v[static_cast<size_t>(t)] = static_cast<int32_t>(t * K);
  MOE_CUDA_CHECK(
      cudaMemcpy(dg_.tok_off, v.data(), static_cast<size_t>(n + 1) * 4, cudaMemcpyHostToDevice));
}

void RoutedExpertsGpu::run_grouped_on_device(int64_t l, int64_t n, const float* xn,
                                             const float* rlogits, float* out,
                                             cudaStream_t stream) {
  const int64_t X = cfg_.n_expert, K = cfg_.n_expert_used, E = cfg_.n_embd, F = cfg_.n_ff_exp;
  const int64_t items = n * K;
  cuda::router_topk(rlogits, n, X, K, dg_.probs, dg_.ids, dg_.weights, stream, softmax_weight());
  cuda::group_items_by_expert(dg_.ids, items, K, X, dg_.offsets, dg_.x_rows, dg_.row_expert,
                              dg_.pos, stream);
  cuda::gather_expert_pointers(dg_.experts, X, residency_->device_table(l), X, dg_.gate, dg_.up,
                               dg_.down, stream);
  // One group per expert (most empty in a short batch); n rows at most in any of them.
  const model::ExpertLayerTensors& et = tensors_[static_cast<size_t>(l)];
  const auto groups = static_cast<int32_t>(X);
  float* dg = d_g_.as<float>();
  float* du = d_u_.as<float>();
  float* dh = d_h_.as<float>();
  float* dy = d_y_.as<float>();
  batch_.grouped_matmul(et.gate.type(), E, F, et.gate.row_bytes, dg_.gate, dg_.offsets, groups,
                        dg_.x_rows, items, n, xn, E, dg);
  batch_.grouped_matmul(et.up.type(), E, F, et.up.row_bytes, dg_.up, dg_.offsets, groups,
                        dg_.x_rows, items, n, xn, E, du);
  record_activation(l, dg, du, dh, items, dg_.row_expert);
  batch_.grouped_matmul(et.down.type(), F, E, et.down.row_bytes, dg_.down, dg_.offsets, groups,
                        dg_.ident, items, n, dh, F, dy);
  record_down_bias(l, dy, items, dg_.row_expert);
  // Token t's k rows in routing order, as the host-routed layer adds them.
  batch_.combine_rows(dy, dg_.tok_off, dg_.pos, dg_.weights, n, E, /*accumulate=*/true, out);
  submit(stream);
  count_grouped_layer(l, n);
}

void RoutedExpertsGpu::count_grouped_layer(int64_t l, int64_t n) {
  const int64_t items = n * cfg_.n_expert_used;
  if (l == 0) residency_->tick(n);  // a forward's tokens: the clock routing scores decay with
  stats_.resident += static_cast<uint64_t>(items);
  cpu_experts_->note_split(l, n, items, 0);
}

}  // namespace moe::gpu
