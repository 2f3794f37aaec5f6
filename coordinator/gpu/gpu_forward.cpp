// GpuForward: device and executor choice, the forward's commit-or-abandon, scratch growth.
#include "coordinator/gpu/gpu_forward.h"

#include <algorithm>
#include <string>
#include <vector>

#include "common/error.h"
#include "coordinator/gpu/attention_gpu.h"
#include "coordinator/gpu/gpu_executor_choice.h"
#include "coordinator/gpu/gpu_upload.h"
#include "coordinator/model/batch_routing.h"
#include "coordinator/model/kv_shift.h"
#include "kernels/cuda/cuda_check.h"

namespace moe::gpu {
namespace {

// VRAM sequence slots: the -np sequences decoded together plus the one-token health probe the
// engine interleaves with them.
size_t sequence_slots(const GpuOptions& opt) {
  if (opt.n_seq < 1) throw Error("-np " + std::to_string(opt.n_seq) + ": at least 1 sequence");
  return static_cast<size_t>(opt.n_seq) + 1;
}

}  // namespace

GpuForward::GpuForward(const gguf::GgufFile& f, const GpuOptions& opt)
    : cfg_(model::ModelConfig::from_gguf(f)),
      opt_(opt),
      vram_limit_(select_device(opt, device_name_)),
      executor_(make_gpu_executor(opt, vram_limit_)),
      budget_(vram_limit_, executor_->allocator()),
      seqs_(budget_, cfg_, sequence_slots(opt)) {
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
  // Every one of the n_seq sequences may grow to n_ctx: the pool leaves room for all their
  // caches (the health probe's is a few rows).
  experts_ = std::make_unique<RoutedExpertsGpu>(
      budget_, *executor_, f, cfg_, pool, std::move(cpu_experts), opt_,
      static_cast<uint64_t>(opt_.n_seq) *
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
  ++scratch_epoch_;  // a recorded graph read the old buffers
}

bool GpuForward::graphable(int64_t n, const model::ForwardHooks* hooks) const {
  return opt_.cuda_graphs && graphs_supported() && n <= kGraphRows &&
         experts_->step_on_device(n, hooks);
}

void GpuForward::run_batch(std::span<const int32_t> tokens, int64_t pos0,
                           GpuSequenceStates::Slot& seq, model::LogitsMode mode, float* logits,
                           const model::ForwardHooks* hooks) {
  const auto n = static_cast<int64_t>(tokens.size());
  const SequenceRows rows{0, n, pos0, &seq};
  if (graphable(n, hooks)) {
    run_graphed(tokens, std::span<const SequenceRows>(&rows, 1), mode == model::LogitsMode::All,
                logits);
    return;
  }
  io_->embed(tokens, x(), stream_);
  enqueue_layers(std::span<const SequenceRows>(&rows, 1), nullptr, hooks);
  experts_->finish();
  io_->logits(x(), mode == model::LogitsMode::All ? 0 : n - 1, n, xn(), logits, stream_);
}

void GpuForward::run_graphed(std::span<const int32_t> tokens, std::span<const SequenceRows> seqs,
                             bool all_rows, float* logits) {
  // The step's inputs enter outside the graph: its embedding rows and its positions.
  io_->embed(tokens, x(), stream_);
  const int64_t rows_out =
      all_rows ? static_cast<int64_t>(tokens.size()) : static_cast<int64_t>(seqs.size());
  std::vector<DecodeGraphs::Part> parts;
  for (const SequenceRows& s : seqs) parts.push_back({s.seq, s.pos0, s.n});
  const auto prepare = [&] {
    // The attention scratch for any position: a graph that is kept was recorded with it at least
    // this large.
    size_t ws = 0;
    for (size_t l = 0; l < static_cast<size_t>(cfg_.n_layer); ++l) {
      for (const SequenceRows& s : seqs) {
        ws = std::max(ws, attention_workspace_bytes(cfg_, {cfg_.n_head[l], cfg_.n_head_kv[l]}, s.n,
                                                    s.pos0, true));
      }
    }
    if (ws > 0) grow_scratch(budget_, d_attn_ws_, (ws + 3) / 4, "attention scratch");
  };
  // Recording runs the host side of every layer once (the experts' accounting included).
  const auto record = [&] {
    enqueue_layers(seqs, graphs_.device_pos(), nullptr);
    if (!all_rows) gather_last_rows(seqs);
    io_->head_rows(x(), xn(), rows_out, stream_);
  };
  if (!graphs_.launch(parts, rows_out, scratch_epoch_, d_attn_ws_, stream_, prepare, record)) {
    experts_->count_device_step(static_cast<int64_t>(tokens.size()));
  }
  io_->copy_head_rows(logits, rows_out, stream_);
}

void GpuForward::gather_last_rows(std::span<const SequenceRows> seqs) {
  // Sequence i's last row is at least row i and above every earlier sequence's, so no copy
  // overwrites a row a later one still reads (the copies run in stream order).
  const int64_t E = cfg_.n_embd;
  const auto row_bytes = static_cast<size_t>(E) * sizeof(float);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int64_t last = seqs[i].row0 + seqs[i].n - 1;
    const auto dst = static_cast<int64_t>(i);
    if (last == dst) continue;
    MOE_CUDA_CHECK(cudaMemcpyAsync(x() + dst * E, x() + last * E, row_bytes,
                                   cudaMemcpyDeviceToDevice, stream_));
  }
}

void GpuForward::run_sequences(std::span<const int32_t> tokens, std::span<const SequenceRows> seqs,
                               float* logits) {
  if (graphable(static_cast<int64_t>(tokens.size()), nullptr)) {
    run_graphed(tokens, seqs, /*all_rows=*/false, logits);
    return;
  }
  io_->embed(tokens, x(), stream_);
  enqueue_layers(seqs, nullptr, nullptr);
  experts_->finish();
  // x is dead after the layers: the head runs once over one row per sequence.
  gather_last_rows(seqs);
  io_->logits(x(), 0, static_cast<int64_t>(seqs.size()), xn(), logits, stream_);
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

void GpuForward::forward_batch(std::span<const model::SequenceChunk> chunks, float* logits) {
  const int64_t n = model::check_chunks(chunks, cfg_.n_vocab);
  if (chunks.size() == 1) {
    // One sequence is a plain forward: the CUDA-graph decode step applies.
    forward(chunks[0].tokens, *chunks[0].cache, model::LogitsMode::Last, logits, nullptr);
    return;
  }
  std::vector<const model::KvCache*> caches;
  for (const model::SequenceChunk& c : chunks) caches.push_back(c.cache);
  // Every slot before anything is enqueued: acquire never hands one of them to another chunk.
  const std::vector<GpuSequenceStates::Slot*> slots = seqs_.acquire(caches);
  std::vector<SequenceRows> rows;
  std::vector<int32_t> tokens;
  tokens.reserve(static_cast<size_t>(n));
  for (size_t i = 0; i < chunks.size(); ++i) {
    const auto ni = static_cast<int64_t>(chunks[i].tokens.size());
    rows.push_back({static_cast<int64_t>(tokens.size()), ni, chunks[i].cache->n_past(), slots[i]});
    tokens.insert(tokens.end(), chunks[i].tokens.begin(), chunks[i].tokens.end());
  }
  reserve(n);
  try {
    run_sequences(tokens, rows, logits);
    MOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  } catch (...) {
    // As forward(): nothing may still read the staging buffers, and no cache or slot is
    // committed, so every sequence of the batch is as it was.
    experts_->abandon();
    (void)cudaStreamSynchronize(stream_);
    throw;
  }
  for (size_t i = 0; i < chunks.size(); ++i) {
    model::KvCache& cache = *chunks[i].cache;
    cache.advance(rows[i].n);
    GpuSequenceStates::commit(*slots[i], cache.n_past());
  }
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

void GpuForward::export_sequence(const model::KvCache& cache, model::SequenceImage& image) {
  seqs_.export_sequence(cache, image, stream_);
}

void GpuForward::import_sequence(model::KvCache& cache, const model::SequenceImage& image) {
  cache.check_image(image);  // a bad image changes nothing
  cache.clear();             // acquire's new sequence; a failed copy leaves it empty
  try {
    seqs_.import_sequence(cache, image, stream_);
  } catch (...) {
    (void)cudaStreamSynchronize(stream_);  // no copy may still read the image
    throw;
  }
  cache.restore(image.n_past);
}

void GpuForward::shift_context(model::KvCache& cache, int64_t n_keep, int64_t n_discard) {
  model::check_shift(cache, cfg_, n_keep, n_discard);  // before anything changes
  const std::vector<float> cs = model::shift_angles(cfg_, n_discard);
  seqs_.shift(cache, n_keep, n_discard, cs.data(), stream_);
  cache.drop_positions(n_keep, n_discard);
}

std::string GpuForward::describe() const {
  return "GPU " + std::to_string(opt_.device) + " " + device_name_ + ": " + dense_summary() +
         " of all " + std::to_string(cfg_.n_layer) + " layers in VRAM; " + experts_->summary() +
         "; VRAM " + budget_.summary();
}

}  // namespace moe::gpu
