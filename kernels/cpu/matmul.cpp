#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "common/error.h"
#include "kernels/cpu/act_quant.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/vec_dot.h"
#include "kernels/cpu/weight_prefetch.h"

namespace moe::cpu {
namespace {

// A GEMV task covers total / (threads * kGemvTasksPerThread) weight bytes, at least
// kGemvMinTaskBytes. Each task is a separate stream that the prefetchers must pick up again, and
// that restart is what limited a GEMV: on a Zen 5 with 2 threads (~30 GB/s of DRAM per core),
// 64 KiB tasks held Q4_K/Q8_0/BF16 at 55-64% of the read bandwidth and 1 MiB tasks at 74-87%
// (an early measurement, not in docs/performance-log.md). A few tasks per thread still even out a
// slow thread; the floor keeps small matrices spread over every thread.
constexpr size_t kGemvMinTaskBytes = 64 << 10;
constexpr size_t kGemvTasksPerThread = 4;
// A GEMM task keeps this many weight bytes hot in L2 while every activation chunk passes over it.
constexpr size_t kGemmBlockBytes = 128 << 10;

int64_t rows_per_task(size_t row_bytes, size_t target) {
  return std::max<int64_t>(1, static_cast<int64_t>(target / std::max<size_t>(row_bytes, 1)));
}

// Runs a GEMV dispatch; one with a single activation row and enough weight bytes may be a trial of
// the weight prefetch distance (weight_prefetch.h), timed here.
template <class F>
void run_gemv(size_t weight_bytes, bool single_row, F&& dispatch) {
  const PrefetchTrial trial = single_row ? begin_prefetch_trial(weight_bytes) : PrefetchTrial{};
  if (trial.candidate < 0) {
    dispatch();
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  dispatch();
  const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
  end_prefetch_trial(trial, weight_bytes, dt.count());
}

size_t gemv_task_bytes(size_t total_bytes, const ThreadPool& pool) {
  const size_t tasks = static_cast<size_t>(std::max(pool.size(), 1)) * kGemvTasksPerThread;
  return std::max(kGemvMinTaskBytes, total_bytes / tasks);
}

}  // namespace

WeightMatrix make_weight_matrix(GgmlType type, const void* data, int64_t n_in, int64_t n_out) {
  const auto info = ggml_type_info(static_cast<uint32_t>(type));
  if (!info || !info->computable) {
    throw Error("matmul: weight type " + ggml_type_label(static_cast<uint32_t>(type)) +
                " is not supported");
  }
  const auto row = ggml_row_bytes(type, static_cast<uint64_t>(n_in));
  if (n_in <= 0 || n_out <= 0 || !row || n_in % act_block_size(act_format_for(type)) != 0) {
    throw Error("matmul: invalid shape " + std::to_string(n_in) + "x" + std::to_string(n_out) +
                " for " + ggml_type_label(static_cast<uint32_t>(type)));
  }
  return WeightMatrix{type, data, n_in, n_out, static_cast<size_t>(*row)};
}

void* MatmulScratch::reserve(size_t bytes) {
  if (buf_.size() < bytes) buf_.resize(bytes);
  return buf_.data();
}

void matmul(const WeightMatrix& w, const float* x, int64_t n_rows, float* y, ThreadPool& pool,
            MatmulScratch& scratch, Isa isa) {
  if (n_rows <= 0) return;
  const MatmulJob job{w, x, n_rows, y};
  matmul_batch(std::span<const MatmulJob>(&job, 1), pool, scratch, isa);
}

void matmul_batch(std::span<const MatmulJob> jobs, ThreadPool& pool, MatmulScratch& scratch,
                  Isa isa) {
  // Jobs that read the same activations (an expert's gate and up, every expert of one decode
  // token) share one converted copy: converting is serial work that otherwise grew with the job
  // count and cost as much as a third of a decode layer's expert time on 16 threads.
  for (const MatmulJob& j : jobs) {
    if (j.n_rows < 1) throw Error("matmul_batch: " + std::to_string(j.n_rows) + " rows");
  }
  std::vector<MatmulScratch::ActInput>& inputs = scratch.inputs_;
  std::vector<size_t>& input_of = scratch.input_of_;
  inputs.clear();
  input_of.assign(jobs.size(), 0);
  size_t act_total = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const MatmulJob& j = jobs[i];
    if (!vec_dot_kernel(j.w.type, isa)) {
      throw Error("matmul: no kernel for " + ggml_type_label(static_cast<uint32_t>(j.w.type)));
    }
    const ActFormat fmt = act_format_for(j.w.type);
    size_t k = 0;
    while (k < inputs.size() && !(inputs[k].x == j.x && inputs[k].n_rows == j.n_rows &&
                                  inputs[k].n_in == j.w.n_in && inputs[k].fmt == fmt)) {
      ++k;
    }
    if (k == inputs.size()) {
      inputs.push_back({j.x, j.n_rows, j.w.n_in, fmt, act_total});
      act_total += act_row_bytes(fmt, j.w.n_in) * static_cast<size_t>(j.n_rows);
    }
    input_of[i] = k;
  }
  auto* act = static_cast<unsigned char*>(scratch.reserve(act_total));
  // One conversion task per distinct activation row; several go to the pool in parallel.
  std::vector<std::pair<size_t, int64_t>>& rows = scratch.act_rows_;
  rows.clear();
  for (size_t k = 0; k < inputs.size(); ++k) {
    for (int64_t r = 0; r < inputs[k].n_rows; ++r) rows.push_back({k, r});
  }
  auto convert = [&](int64_t t, int) {
    const auto [k, r] = rows[static_cast<size_t>(t)];
    const MatmulScratch::ActInput& in = inputs[k];
    const size_t bytes = act_row_bytes(in.fmt, in.n_in);
    quantize_act_row(in.fmt, in.x + r * in.n_in, act + in.offset + static_cast<size_t>(r) * bytes,
                     in.n_in, isa);
  };
  if (rows.size() == 1) {
    convert(0, 0);
  } else {
    pool.parallel_for(static_cast<int64_t>(rows.size()), convert);
  }

  // Tasks over every job's weight rows, all in one dispatch: a prefill's CPU share is many
  // expert matrices of ~1 MiB, each too small to keep 16 threads busy as a matmul() of its own
  // (a 768-row Q4_K gate is 7 GEMM blocks). GEMV jobs get tasks sized from the batch's bytes,
  // GEMM jobs (more rows than a GEMV takes) blocks that stay in L2 while their rows pass.
  std::vector<MatmulScratch::BatchTask>& tasks = scratch.tasks_;
  tasks.clear();  // keeps its capacity: no allocation once the largest batch was seen
  size_t gemv_bytes = 0;
  for (const MatmulJob& j : jobs) {
    if (j.n_rows <= kMaxActRows) gemv_bytes += j.w.row_bytes * static_cast<size_t>(j.w.n_out);
  }
  const size_t task_bytes = gemv_task_bytes(gemv_bytes, pool);
  for (size_t i = 0; i < jobs.size(); ++i) {
    const MatmulJob& j = jobs[i];
    const int64_t per_task =
        rows_per_task(j.w.row_bytes, j.n_rows <= kMaxActRows ? task_bytes : kGemmBlockBytes);
    for (int64_t o = 0; o < j.w.n_out; o += per_task) {
      tasks.push_back({i, o, std::min(j.w.n_out, o + per_task), inputs[input_of[i]].offset});
    }
  }
  // Every output is the dot of one weight row with its chunk of at most kMaxActRows activation
  // rows, whichever task holds the row, so a job's bits do not depend on the batch around it.
  auto run_task = [&](int64_t t, int) {
    const MatmulScratch::BatchTask& task = tasks[static_cast<size_t>(t)];
    const MatmulJob& j = jobs[task.job];
    const VecDotFn dot = vec_dot_kernel(j.w.type, isa);
    const size_t act_bytes = act_row_bytes(act_format_for(j.w.type), j.w.n_in);
    const auto* wbytes = static_cast<const unsigned char*>(j.w.data);
    float out[kMaxActRows];
    for (int64_t r0 = 0; r0 < j.n_rows; r0 += kMaxActRows) {
      const int n_act = static_cast<int>(std::min<int64_t>(kMaxActRows, j.n_rows - r0));
      const unsigned char* a = act + task.act_offset + static_cast<size_t>(r0) * act_bytes;
      for (int64_t o = task.o_begin; o < task.o_end; ++o) {
        dot(j.w.n_in, wbytes + o * j.w.row_bytes, a, act_bytes, n_act, out);
        for (int r = 0; r < n_act; ++r) j.y[(r0 + r) * j.w.n_out + o] = out[r];
      }
    }
  };
  const auto n_tasks = static_cast<int64_t>(tasks.size());
  if (std::any_of(jobs.begin(), jobs.end(),
                  [](const MatmulJob& j) { return j.n_rows > kMaxActRows; })) {
    pool.parallel_for(n_tasks, run_task);  // a GEMM's weights come from L2: no prefetch trial
    return;
  }
  const bool single_row =
      std::all_of(jobs.begin(), jobs.end(), [](const MatmulJob& j) { return j.n_rows == 1; });
  run_gemv(gemv_bytes, single_row, [&] { pool.parallel_for(n_tasks, run_task); });
}

}  // namespace moe::cpu
