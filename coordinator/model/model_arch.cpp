#include "coordinator/model/model_arch.h"

#include <string>
#include <utility>

#include "common/error.h"
#include "coordinator/model/qwen35moe.h"
#include "coordinator/model/qwen3moe.h"

namespace moe::model {

std::unique_ptr<ModelArch> create_model_arch(const gguf::GgufFile& file, cpu::ThreadPool& pool,
                                             std::unique_ptr<ExpertExecutor> experts) {
  const std::string_view arch = file.require_string("general.architecture");
  if (arch == "qwen3moe") return std::make_unique<Qwen3Moe>(file, pool, std::move(experts));
  if (arch == "qwen35moe") return std::make_unique<Qwen35Moe>(file, pool, std::move(experts));
  throw Error("unsupported model architecture '" + std::string(arch) +
              "' (supported: qwen3moe, qwen35moe)");
}

}  // namespace moe::model
