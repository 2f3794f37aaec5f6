// The GGUF reader against the real test models: tensor lists and types as listed in models.json,
// hyper-parameters through the typed getters, and the real-vocabulary file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "common/error.h"
#include "common/ggml_type.h"
#include "common/gguf.h"
#include "tests/testdata.h"

namespace moe::gguf {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kVocabOnly = "qwen3-vocab-only.gguf";

json models_json() {
  std::ifstream in(moe::test::testdata_dir() / "models" / "models.json");
  return json::parse(in);
}

std::vector<fs::path> gguf_files() {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(moe::test::testdata_dir() / "models")) {
    if (e.path().extension() == ".gguf") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// models.json spells types upper-case ("Q4_K", "IQ4_XS"); ggml's names are mixed ("q4_K").
std::string upper(std::string_view s) {
  std::string u(s);
  for (char& c : u) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return u;
}

TEST(GgufTestdata, EveryModelMatchesModelsJson) {
  const json models = models_json();
  const auto files = gguf_files();
  ASSERT_EQ(files.size(), models.size() + 1) << "expected every model of models.json + vocab-only";

  for (const fs::path& path : files) {
    const std::string name = path.filename().string();
    if (name == kVocabOnly) continue;  // no entry in models.json; see VocabOnlyFile
    SCOPED_TRACE(name);
    ASSERT_TRUE(models.contains(name));
    const json& m = models[name];
    EXPECT_EQ(fs::file_size(path), m["bytes"].get<uint64_t>());

    const GgufFile f = GgufFile::open(path.string());
    EXPECT_EQ(f.version(), 3u);
    EXPECT_EQ(f.n_shards(), 1u);

    const json& types = m["tensor_types"];
    ASSERT_EQ(f.tensors().size(), types.size());
    std::map<std::string, uint64_t> counts;
    for (const TensorInfo& t : f.tensors()) {
      const auto info = moe::ggml_type_info(t.type_id);
      ASSERT_TRUE(info.has_value()) << t.name;
      ASSERT_TRUE(types.contains(std::string(t.name))) << t.name;
      EXPECT_EQ(upper(info->name), types[std::string(t.name)].get<std::string>()) << t.name;
      ++counts[upper(info->name)];
    }
    for (const auto& [type, n] : m["tensor_type_counts"].items()) {
      EXPECT_EQ(counts[type], n.get<uint64_t>()) << type;
    }
    for (const auto& [tname, type] : types.items()) {
      EXPECT_NE(f.find_tensor(tname), nullptr) << tname;
    }

    // Hyper-parameters through the typed getters.
    const json& hp = m["hparams"];
    EXPECT_EQ(f.require_string("general.architecture"), "qwen3moe");
    EXPECT_EQ(f.require_uint("general.file_type"), m["general.file_type"].get<uint64_t>());
    EXPECT_EQ(f.require_uint("qwen3moe.block_count"), 4u);
    EXPECT_EQ(f.require_uint("qwen3moe.block_count"), hp["n_layer"].get<uint64_t>());
    EXPECT_EQ(f.require_uint("qwen3moe.embedding_length"), hp["n_embd"].get<uint64_t>());
    EXPECT_EQ(f.require_uint("qwen3moe.attention.head_count"), hp["n_head"].get<uint64_t>());
    EXPECT_EQ(f.require_uint("qwen3moe.attention.head_count_kv"), hp["n_head_kv"].get<uint64_t>());
    EXPECT_EQ(f.require_uint("qwen3moe.attention.key_length"), hp["head_dim"].get<uint64_t>());
    EXPECT_EQ(f.require_uint("qwen3moe.expert_count"), hp["n_expert"].get<uint64_t>());
    EXPECT_EQ(f.require_uint("qwen3moe.expert_used_count"), hp["n_expert_used"].get<uint64_t>());
    EXPECT_EQ(f.require_uint("qwen3moe.expert_feed_forward_length"),
              hp["n_ff_exp"].get<uint64_t>());
    EXPECT_EQ(f.require_uint("qwen3moe.context_length"), hp["n_ctx_train"].get<uint64_t>());
    EXPECT_EQ(f.require_float("qwen3moe.rope.freq_base"), hp["rope_freq_base"].get<double>());
    EXPECT_EQ(f.require_float("qwen3moe.attention.layer_norm_rms_epsilon"),
              hp["rms_norm_eps"].get<double>());
    EXPECT_EQ(f.require_array("tokenizer.ggml.tokens").count, hp["n_vocab"].get<uint64_t>());
    EXPECT_EQ(f.require_array("tokenizer.ggml.merges").count, hp["n_merges"].get<uint64_t>());
    EXPECT_EQ(f.require_string("tokenizer.ggml.model"), "gpt2");
    EXPECT_EQ(f.require_bool("tokenizer.ggml.add_bos_token"), m["add_bos_token"].get<bool>());
    for (const auto& [which, id] : m["special_token_ids"].items()) {
      EXPECT_EQ(f.require_uint("tokenizer.ggml." + which + "_token_id"), id.get<uint64_t>())
          << which;
    }
    EXPECT_THROW(f.require_string("qwen3moe.block_count"), moe::Error);

    // Spot-check shapes from the README (ne, fastest first).
    const TensorInfo* exps = f.find_tensor("blk.0.ffn_down_exps.weight");
    ASSERT_NE(exps, nullptr);
    EXPECT_EQ(exps->n_dims, 3u);
    EXPECT_EQ(exps->ne[0], 256);
    EXPECT_EQ(exps->ne[1], 256);
    EXPECT_EQ(exps->ne[2], 16);
    const TensorInfo* embd = f.find_tensor("token_embd.weight");
    ASSERT_NE(embd, nullptr);
    EXPECT_EQ(embd->ne[0], 256);
    EXPECT_EQ(embd->ne[1], 2112);
  }
}

TEST(GgufTestdata, VocabOnlyFile) {
  const fs::path path = moe::test::testdata_dir() / "models" / kVocabOnly;
  // Best of three: the first open may include reading the file from disk.
  double best_ms = 1e9;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const GgufFile f = GgufFile::open(path.string());
    const auto t1 = std::chrono::steady_clock::now();
    best_ms = std::min(best_ms, std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::printf("parsed %s in %.1f ms\n", kVocabOnly, best_ms);
  // Generous bound (sanitizer builds are several times slower); catches quadratic behaviour.
  EXPECT_LT(best_ms, 1000.0);

  const GgufFile f = GgufFile::open(path.string());
  EXPECT_TRUE(f.tensors().empty());
  EXPECT_EQ(f.require_string("general.architecture"), "qwen3moe");
  const ArrayValue& tokens = f.require_array("tokenizer.ggml.tokens");
  EXPECT_EQ(tokens.count, 151936u);
  EXPECT_EQ(tokens.string_at(151643), "<|endoftext|>");
  EXPECT_EQ(tokens.string_at(151645), "<|im_end|>");
  EXPECT_EQ(tokens.string_at(151935), "[PAD151935]");
  EXPECT_EQ(f.require_array("tokenizer.ggml.merges").count, 151387u);
  const ArrayValue& types = f.require_array("tokenizer.ggml.token_type");
  EXPECT_EQ(types.count, 151936u);
  EXPECT_EQ(types.int_at(151643), 3);  // CONTROL
  EXPECT_EQ(types.int_at(151935), 5);  // UNUSED
  EXPECT_EQ(f.require_uint("tokenizer.ggml.bos_token_id"), 151643u);
  EXPECT_EQ(f.require_uint("tokenizer.ggml.eos_token_id"), 151645u);
  EXPECT_EQ(f.require_uint("tokenizer.ggml.padding_token_id"), 151643u);
  EXPECT_FALSE(f.require_bool("tokenizer.ggml.add_bos_token"));
  EXPECT_EQ(f.require_string("tokenizer.ggml.pre"), "qwen2");
  EXPECT_NE(f.require_string("tokenizer.chat_template").find("<|im_start|>"), std::string::npos);
}

// --no-mmap reads every file into memory: the same tensors, byte for byte, at addresses on a
// huge-page boundary; a missing file fails as when mapping.
TEST(GgufTestdata, LoadedFilesEqualMappedFiles) {
  for (const fs::path& p : gguf_files()) {
    SCOPED_TRACE(p.filename().string());
    const GgufFile mapped = GgufFile::open(p.string());
    const GgufFile loaded = GgufFile::open(p.string(), LoadMode::Loaded);
    ASSERT_EQ(loaded.tensors().size(), mapped.tensors().size());
    for (size_t i = 0; i < mapped.tensors().size(); ++i) {
      const TensorInfo& a = mapped.tensors()[i];
      const TensorInfo& b = loaded.tensors()[i];
      ASSERT_EQ(a.name, b.name);
      ASSERT_EQ(a.n_bytes, b.n_bytes);
      ASSERT_NE(a.data, b.data);
      ASSERT_EQ(std::memcmp(a.data, b.data, a.n_bytes), 0) << a.name;
    }
    EXPECT_EQ(loaded.require_string("general.architecture"),
              mapped.require_string("general.architecture"));
    // What the GPU path page-locks: the whole file, in memory it owns.
    EXPECT_FALSE(mapped.loaded());
    EXPECT_TRUE(loaded.loaded());
    const auto shards = loaded.shard_bytes();
    ASSERT_EQ(shards.size(), 1u);
    EXPECT_EQ(shards[0].size(), fs::file_size(p));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(shards[0].data()) % (uintptr_t{2} << 20), 0u);
    for (const TensorInfo& t : loaded.tensors()) {
      ASSERT_GE(t.data, shards[0].data());
      ASSERT_LE(t.data + t.n_bytes, shards[0].data() + shards[0].size()) << t.name;
    }
  }
  EXPECT_THROW(GgufFile::open("/nonexistent/model.gguf", LoadMode::Loaded), moe::Error);
}

}  // namespace
}  // namespace moe::gguf
