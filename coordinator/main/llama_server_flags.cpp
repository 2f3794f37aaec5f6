#include "coordinator/main/llama_server_flags.h"

#include "common/error.h"

namespace moe::server {

namespace {

constexpr const char* kGroup = "llama-server compatibility";

// A flag of a feature that does not exist yet: accepted by the parser, refused by the check.
void not_yet(CLI::App& app, LlamaServerFlags& f, const std::string& name, bool takes_value,
             const std::string& why) {
  const std::string flag = name.substr(0, name.find(','));
  if (takes_value) {
    app.add_option_function<std::string>(
           name,
           [&f, flag, why](const std::string&) {
             if (f.unsupported.empty()) f.unsupported = flag + ": " + why;
           },
           why)
        ->group(kGroup);
  } else {
    app.add_flag_callback(
           name,
           [&f, flag, why] {
             if (f.unsupported.empty()) f.unsupported = flag + ": " + why;
           },
           why)
        ->group(kGroup);
  }
}

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
  app.add_flag("--no-context-shift")
      ->description(
          "a full context ends the generation (finish_reason length); the "
          "default")
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
  not_yet(app, f, "--context-shift", false,
          "context shifting is not implemented; a full context ends the generation");
}

void check_llama_server_flags(const LlamaServerFlags& f) {
  if (!f.unsupported.empty()) throw Error(f.unsupported);
}

}  // namespace moe::server
