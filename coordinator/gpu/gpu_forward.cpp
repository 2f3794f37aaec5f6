// GpuForward: device and executor choice, the forward's commit-or-abandon, scratch growth.
#include "coordinator/gpu/gpu_forward.h"

#include <string>

#include "common/error.h"
#include "coordinator/gpu/gpu_executor_choice.h"
#include "coordinator/gpu/gpu_upload.h"
#include "coordinator/model/batch_routing.h"
#include "kernels/cuda/cuda_check.h"

namespace moe::gpu {
namespace {

// The engine's running request plus the one-token health probe it interleaves.
constexpr size_t kMaxSequences = 2;

}  // namespace

GpuForward::GpuForward(const gguf::GgufFile& f, const GpuOptions& opt)
    : cfg_(model::ModelConfig::from_gguf(f)),
      opt_(opt),
      vram_limit_(select_device(opt, device_name_)),
      executor_(make_gpu_executor(opt, vram_limit_)),
      budget_(vram_limit_, executor_->allocator()),
      seqs_(budget_, cfg_, kMaxSequences) {
  if (opt.n_gpu_layers < cfg_.n_layer) {
    throw Error("-ngl " + std::to_string(opt.n_gpu_layers) +
                ": partial offload is not supported; use -ngl " + std::to_string(cfg_.n_layer) +
                " or more (every layer's attention on the GPU) and keep experts on the CPU with "
                "-cmoe / -ncmoe N, or -ngl 0 for the CPU path");
  }
  MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  io_ = std::make_unique<TokenIoGpu>(budget_, f, cfg_.n_embd, cfg_.n_vocab, cfg_.rms_eps);
}

GpuForward::~GpuForward() {
  if (stream_) {
    (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
  }
}

void GpuForward::place_experts(const gguf::GgufFile& f, cpu::ThreadPool& pool,
                               std::unique_ptr<model::ExpertExecutor> cpu_experts) {
  experts_ = std::make_unique<RoutedExpertsGpu>(
      budget_, *executor_, f, cfg_, pool, std::move(cpu_experts), opt_,
      GpuSequenceStates::estimate_bytes(cfg_, opt_.n_ctx, opt_.kv));
}

float* GpuForward::scratch(VramBuffer& b, size_t floats, const char* what) {
  return grow_scratch(budget_, b, floats, what);
}

void GpuForward::reserve(int64_t n) {
  if (n <= scratch_tokens_) return;
  const auto rows = static_cast<size_t>(n) * static_cast<size_t>(cfg_.n_embd);
  scratch(d_x_, rows, "scratch x");
  scratch(d_xn_, rows, "scratch xn");
  reserve_layers(n);
  io_->reserve(n);
  experts_->reserve(n);
  scratch_tokens_ = n;
}

void GpuForward::run_batch(std::span<const int32_t> tokens, int64_t pos0,
                           GpuSequenceStates::Slot& seq, model::LogitsMode mode, float* logits,
                           const model::ForwardHooks* hooks) {
  const auto n = static_cast<int64_t>(tokens.size());
  io_->embed(tokens, x(), stream_);
  enqueue_layers(n, pos0, seq, hooks);
  experts_->finish();
  io_->logits(x(), mode == model::LogitsMode::All ? 0 : n - 1, n, xn(), logits, stream_);
}

void GpuForward::forward(std::span<const int32_t> tokens, model::KvCache& cache,
                         model::LogitsMode mode, float* logits, const model::ForwardHooks* hooks) {
  const auto n = static_cast<int64_t>(tokens.size());
  model::check_tokens(tokens, cfg_.n_vocab);
  cache.check_room(n);
  GpuSequenceStates::Slot& seq = seqs_.acquire(cache);
  reserve(n);
  try {
    run_batch(tokens, cache.n_past(), seq, mode, logits, hooks);
    MOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  } catch (...) {
    experts_->abandon();  // a CPU share still running reads the staging buffers too
    // Nothing enqueued may still read the staging buffers when the next call refills them; the
    // cache is not advanced and the recurrent state not committed, so the sequence is unchanged.
    (void)cudaStreamSynchronize(stream_);
    throw;
  }
  cache.advance(n);
  GpuSequenceStates::commit(seq, cache.n_past());
  experts_->after_forward();
}

void GpuForward::save_checkpoint(model::KvCache& cache) {
  seqs_.save_checkpoint(cache, stream_);
  MOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  cache.save_checkpoint();
}

bool GpuForward::restore_checkpoint(model::KvCache& cache) {
  if (!seqs_.restore_checkpoint(cache, stream_)) return false;
  MOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  cache.restore_checkpoint();
  return true;
}

std::string GpuForward::describe() const {
  return "GPU " + std::to_string(opt_.device) + " " + device_name_ + ": " + dense_summary() +
         " of all " + std::to_string(cfg_.n_layer) + " layers in VRAM; " + experts_->summary() +
         "; VRAM " + budget_.summary();
}

}  // namespace moe::gpu
