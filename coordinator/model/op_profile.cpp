#include "coordinator/model/op_profile.h"

#include <cstdio>

namespace moe::model {

const char* op_name(Op op) {
  switch (op) {
    case Op::kEmbed:
      return "embed";
    case Op::kNorm:
      return "norms";
    case Op::kAttnProj:
      return "attn q/k/v proj";
    case Op::kRopeStore:
      return "attn rope + kv store";
    case Op::kAttention:
      return "attn softmax(qK)V";
    case Op::kAttnOut:
      return "attn gate + out proj";
    case Op::kSsmProj:
      return "deltanet in proj + gates";
    case Op::kSsmConv:
      return "deltanet conv + l2norm";
    case Op::kSsmDelta:
      return "deltanet recurrence";
    case Op::kSsmOut:
      return "deltanet norm + out proj";
    case Op::kRoutedExperts:
      return "router + routed experts";
    case Op::kSharedExpert:
      return "shared expert + combine";
    case Op::kResidual:
      return "residual adds";
    case Op::kOutput:
      return "output norm + head";
    case Op::kCount:
      break;
  }
  return "?";
}

void OpProfile::add(Op op, double us, uint64_t bytes) {
  Entry& e = entries_[static_cast<size_t>(op)];
  e.us += us;
  e.bytes += bytes;
  ++e.calls;
}

void OpProfile::reset() {
  entries_ = {};
  tokens_ = 0;
}

std::string OpProfile::table() const {
  double total = 0;
  for (const Entry& e : entries_) total += e.us;
  const double tokens = tokens_ > 0 ? static_cast<double>(tokens_) : 1.0;
  std::string out =
      "| op | calls | ms/token | share | weights GB/s |\n| --- | ---: | ---: | ---: | ---: |\n";
  char line[160];
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    if (e.calls == 0) continue;
    char bw[32] = "—";
    if (e.bytes > 0 && e.us > 0) {
      std::snprintf(bw, sizeof bw, "%.1f", static_cast<double>(e.bytes) / (e.us * 1e3));
    }
    std::snprintf(line, sizeof line, "| %s | %llu | %.3f | %.1f%% | %s |\n",
                  op_name(static_cast<Op>(i)), static_cast<unsigned long long>(e.calls),
                  e.us / 1e3 / tokens, total > 0 ? 100.0 * e.us / total : 0.0, bw);
    out += line;
  }
  std::snprintf(line, sizeof line, "| all | | %.3f | 100%% | |\n", total / 1e3 / tokens);
  out += line;
  return out;
}

}  // namespace moe::model
