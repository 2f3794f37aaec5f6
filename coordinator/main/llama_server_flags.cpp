#include "coordinator/main/llama_server_flags.h"

#include <filesystem>
#include <system_error>

#include "common/error.h"

namespace moe::server {

namespace {

constexpr const char* kGroup = "llama-server compatibility";

}  // namespace

void add_llama_server_flags(CLI::App& app, LlamaServerFlags& f) {
  f.sampling.add_options(app);
  app.add_option("-n,--n-predict", f.n_predict,
                 "tokens to generate at most when a request sets no limit (-1: none)")
      ->group(kGroup);
  app.add_option(
         "--parallel", f.n_parallel,
         "-np: parallel slots, decoded together (continuous batching); -c is shared among them")
      ->check(CLI::Range(1, 256))
      ->group(kGroup);
  app.add_option("--ubatch-size", f.ubatch,
                 "-ub: prompt tokens per forward (default: -b's); the smaller of -b and -ub is "
                 "used")
      ->check(CLI::Range(int64_t{1}, int64_t{8192}))
      ->group(kGroup);
  app.add_flag("--jinja")
      ->description("chat templates always run through the Jinja engine; accepted")
      ->group(kGroup);
  app.add_option("--flash-attn", f.flash_attn,
                 "-fa on|off|auto: accepted; attention here always streams over the cache with an "
                 "online softmax (flash-style)")
      ->check(CLI::IsMember({"on", "off", "auto", "1", "0"}))
      ->group(kGroup);
  // One option, so that the last of the two on a command line wins.
  app.add_flag("--context-shift,!--no-context-shift", f.context_shift,
               "--context-shift: a full context drops the older half of a sequence's tokens after "
               "the request's n_keep and generation goes on (not for models with recurrent "
               "layers, such as qwen35moe: a warning, then as --no-context-shift); "
               "--no-context-shift (the default): a full context ends the generation "
               "(finish_reason length)")
      ->group(kGroup);
  app.add_flag("--metrics")
      ->description("/metrics is always served with the HTTP API; accepted")
      ->group(kGroup);
  app.add_flag("--mlock", f.mlock, "lock the model's memory in RAM (mlockall)")->group(kGroup);
  app.add_option("--moe-resident", f.moe_resident,
                 "auto (default): a VRAM pool of the hottest CPU-homed experts sized by what the "
                 "budget leaves (--moe-resident-mib sets it); off: no pool")
      ->check(CLI::IsMember({"auto", "off"}))
      ->group(kGroup);
  app.add_option("--slot-save-path", f.slot_save_path,
                 "folder for POST /slots/{id}?action=save|restore files (a slot's tokens and "
                 "state); created when missing; without it slot actions answer 501")
      ->group(kGroup);
}

void check_llama_server_flags(const LlamaServerFlags& f) {
  if (!f.unsupported.empty()) throw Error(f.unsupported);
  if (!f.slot_save_path.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(f.slot_save_path, ec);
    if (ec || !std::filesystem::is_directory(f.slot_save_path, ec)) {
      throw Error("--slot-save-path " + f.slot_save_path + ": not a folder that can be created (" +
                  (ec ? ec.message() : "a file is in the way") + ")");
    }
  }
}

}  // namespace moe::server
