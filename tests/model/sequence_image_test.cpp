// A sequence's state as host bytes (ModelArch::export_sequence / import_sequence, the CPU path)
// and through a slot file (coordinator/engine/slot_file.h), on the tiny qwen3moe and qwen35moe
// models with f16 and q4_0 (rotated) K/V:
//  * a sequence imported into another cache, one that held other tokens, continues as the
//    original does (the same logits within 1e-5), recurrent state included; an empty image
//    empties a cache;
//  * a slot file round trip gives the same bytes, and every bad file is refused with a message
//    saying why: another cache type, another model, truncated, trailing bytes, not a slot file,
//    another version, a token outside the vocabulary, more tokens than the context, missing;
//  * an image that does not fit leaves the cache as it was; llama-server's file name rule.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/gguf.h"
#include "coordinator/engine/slot_file.h"
#include "coordinator/model/model_arch.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/testdata.h"

namespace {

using namespace moe::model;
using moe::engine::SlotFileError;
using moe::engine::SlotFingerprint;
using Tokens = std::vector<int32_t>;
namespace fs = std::filesystem;

constexpr int64_t kCtx = 64;

std::string model_path(const std::string& arch) {
  const auto dir =
      arch == "qwen3moe" ? moe::test::testdata_dir() : moe::test::qwen35moe_testdata_dir();
  return (dir / "models" / ("tiny-" + arch + "-sv-Q8_0.gguf")).string();
}

struct Model {
  explicit Model(const std::string& arch)
      : file(moe::gguf::GgufFile::open(model_path(arch))), model(create_model_arch(file, pool)) {}
  std::vector<float> forward(const Tokens& t, KvCache& cache) {
    std::vector<float> out(static_cast<size_t>(model->config().n_vocab));
    model->forward(t, cache, LogitsMode::Last, out.data());
    return out;
  }
  SlotFingerprint fingerprint(const KvCache& cache) const {
    return SlotFingerprint::of(model->config(), cache, moe::engine::weights_hash(file));
  }
  moe::gguf::GgufFile file;
  moe::cpu::ThreadPool pool{2};
  std::unique_ptr<ModelArch> model;
};

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(double{a[i]} - b[i]));
  return d;
}

// Continues `a` and `b` with the same tokens (a chunk, then a decode step): equal logits.
void expect_same_continuation(Model& m, KvCache& a, KvCache& b, const std::string& what) {
  for (const Tokens& t : {Tokens{11, 12, 13}, Tokens{14}}) {
    const std::vector<float> la = m.forward(t, a), lb = m.forward(t, b);
    EXPECT_LE(max_abs_diff(la, lb), 1e-5) << what;
  }
  EXPECT_EQ(a.n_past(), b.n_past()) << what;
}

fs::path temp_file(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("moe_slot_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir / name;
}

std::string bytes_of(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}
void write_bytes(const fs::path& p, const std::string& b) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << b;
}

// read_slot_file's error for `path`, or "" when it reads.
std::string read_error(const fs::path& path, const SlotFingerprint& fp, int64_t n_ctx,
                       SlotFileError::Kind* kind = nullptr) {
  try {
    (void)moe::engine::read_slot_file(path, fp, n_ctx);
  } catch (const SlotFileError& e) {
    if (kind) *kind = e.kind();
    return e.what();
  }
  return "";
}

void round_trip(const std::string& arch, KvType kv) {
  SCOPED_TRACE(arch + " " + std::string(kv_type_name(kv)));
  Model m(arch);
  const Tokens prompt = {1, 5, 9, 33, 2, 7, 21, 40, 3, 8, 6, 4};
  KvCache a = m.model->make_cache(kCtx, kv, kv);
  m.forward(prompt, a);
  m.forward({17}, a);
  SequenceImage img;
  m.model->export_sequence(a, img);
  ASSERT_EQ(img.n_past, 13);

  // Into a cache that held something else (and had a checkpoint, for qwen35moe).
  KvCache b = m.model->make_cache(kCtx, kv, kv);
  m.forward({30, 31, 32, 33, 34}, b);
  m.model->save_checkpoint(b);
  m.model->import_sequence(b, img);
  EXPECT_EQ(b.n_past(), 13);
  EXPECT_EQ(b.checkpoint_pos(), -1);

  // Through a file: the same bytes back, and a third cache continues alike too.
  Tokens tokens = prompt;
  tokens.push_back(17);
  const SlotFingerprint fp = m.fingerprint(a);
  const fs::path path = temp_file(arch + "-" + std::string(kv_type_name(kv)) + ".bin");
  const uint64_t written = moe::engine::write_slot_file(path, fp, tokens, img);
  EXPECT_EQ(written, fs::file_size(path));
  const moe::engine::SlotContents c = moe::engine::read_slot_file(path, fp, kCtx);
  EXPECT_EQ(c.tokens, tokens);
  EXPECT_EQ(c.bytes, written);
  ASSERT_EQ(c.image.layers.size(), img.layers.size());
  for (size_t l = 0; l < img.layers.size(); ++l) {
    EXPECT_EQ(c.image.layers[l].k, img.layers[l].k) << l;
    EXPECT_EQ(c.image.layers[l].v, img.layers[l].v) << l;
    EXPECT_EQ(c.image.layers[l].conv, img.layers[l].conv) << l;
    EXPECT_EQ(c.image.layers[l].ssm, img.layers[l].ssm) << l;
  }
  KvCache from_file = m.model->make_cache(kCtx, kv, kv);
  m.model->import_sequence(from_file, c.image);

  // The comparison sees a state that differs: another token in the middle moves the logits.
  Tokens other = tokens;
  other[3] = 50;
  KvCache d = m.model->make_cache(kCtx, kv, kv), a3 = a;
  m.forward(other, d);
  EXPECT_GT(max_abs_diff(m.forward({11, 12, 13}, a3), m.forward({11, 12, 13}, d)), 1e-3);

  KvCache a2 = a;  // a copy continues as `a`
  expect_same_continuation(m, a, b, "imported");
  expect_same_continuation(m, a2, from_file, "from the file");

  // An empty image empties a cache: it continues as a fresh one.
  SequenceImage empty;
  m.model->export_sequence(m.model->make_cache(kCtx, kv, kv), empty);
  EXPECT_EQ(empty.n_past, 0);
  m.model->import_sequence(b, empty);
  EXPECT_EQ(b.n_past(), 0);
  KvCache fresh = m.model->make_cache(kCtx, kv, kv);
  expect_same_continuation(m, fresh, b, "emptied");
}

TEST(SequenceImage, Qwen3MoeContinuesAfterImport) {
  round_trip("qwen3moe", KvType::F16);
  round_trip("qwen3moe", KvType::Q4_0);
}

TEST(SequenceImage, Qwen35MoeContinuesAfterImportWithItsRecurrentState) {
  round_trip("qwen35moe", KvType::F16);
  round_trip("qwen35moe", KvType::Q4_0);
}

TEST(SequenceImage, AnImageThatDoesNotFitLeavesTheCacheAsItWas) {
  Model m("qwen3moe");
  KvCache a = m.model->make_cache(kCtx, KvType::F16, KvType::F16);
  m.forward({1, 2, 3, 4}, a);
  SequenceImage img;
  m.model->export_sequence(a, img);
  KvCache q = m.model->make_cache(kCtx, KvType::Q8_0, KvType::Q8_0);
  m.forward({5, 6}, q);
  EXPECT_THROW(m.model->import_sequence(q, img), moe::Error);  // rows of f16 size
  EXPECT_EQ(q.n_past(), 2);
  KvCache small = m.model->make_cache(2, KvType::F16, KvType::F16);
  EXPECT_THROW(m.model->import_sequence(small, img), moe::Error);  // 4 positions in 2
  img.layers.pop_back();
  EXPECT_THROW(m.model->import_sequence(a, img), moe::Error);
  EXPECT_EQ(a.n_past(), 4);
}

TEST(SlotFile, BadFilesAreRefusedWithTheReason) {
  Model m("qwen3moe");
  KvCache a = m.model->make_cache(kCtx, KvType::F16, KvType::F16);
  const Tokens tokens = {1, 2, 3, 4, 5};
  m.forward(tokens, a);
  SequenceImage img;
  m.model->export_sequence(a, img);
  const SlotFingerprint fp = m.fingerprint(a);
  const fs::path path = temp_file("good.bin");
  moe::engine::write_slot_file(path, fp, tokens, img);
  const std::string good = bytes_of(path);
  EXPECT_EQ(read_error(path, fp, kCtx), "");

  const auto expect_refused = [&](const std::string& bytes, const std::string& part,
                                  const SlotFingerprint& want, int64_t n_ctx = kCtx) {
    const fs::path p = temp_file("bad.bin");
    write_bytes(p, bytes);
    SlotFileError::Kind kind = SlotFileError::Io;
    const std::string e = read_error(p, want, n_ctx, &kind);
    EXPECT_NE(e.find(part), std::string::npos) << "'" << e << "' lacks '" << part << "'";
    EXPECT_EQ(kind, SlotFileError::Invalid) << e;
  };
  // Another cache type, another rotation, other weights, another architecture.
  const SlotFingerprint q8 = m.fingerprint(m.model->make_cache(kCtx, KvType::Q8_0, KvType::F16));
  expect_refused(good, "K cache is f16 in the file, q8_0 here", q8);
  KvConfig norot = KvConfig::uniform(KvType::Q8_0, KvType::F16);
  norot.rotate = false;
  const SlotFingerprint unrotated = m.fingerprint(m.model->make_cache(kCtx, norot));
  moe::engine::write_slot_file(path, unrotated, tokens, [&] {
    SequenceImage i = img;  // rows of q8_0 size: any bytes
    for (size_t l = 0; l < i.layers.size(); ++l)
      i.layers[l].k.resize(5 * unrotated.layers[l].k_row_bytes);
    return i;
  }());
  expect_refused(bytes_of(path), "not rotated in the file, rotated in blocks of", q8);
  SlotFingerprint other = fp;
  other.weights ^= 1;
  expect_refused(good, "other weights", other);
  other = fp;
  other.arch = "qwen35moe";
  expect_refused(good, "saved from a qwen3moe model; this server runs qwen35moe", other);
  // Damaged files.
  expect_refused(good.substr(0, good.size() - 1), "is truncated", fp);
  expect_refused(good.substr(0, 20), "is truncated", fp);
  expect_refused(good + "x", "has trailing bytes", fp);
  expect_refused("GGUF" + good.substr(4), "is not a slot file", fp);
  std::string v2 = good;
  v2[8] = 2;
  expect_refused(v2, "format version 2", fp);
  expect_refused(good, "holds 5 tokens; a slot holds at most 4", fp, 4);
  // The first token id, after the header (which ends in n_tokens), set past the vocabulary.
  std::string bad_token = good;
  const size_t first = good.size() - 5 * sizeof(int32_t) - fp.state_bytes(5);
  const int32_t huge = 1 << 30;
  std::memcpy(bad_token.data() + first, &huge, sizeof huge);
  expect_refused(bad_token, "outside the vocabulary", fp);
  SlotFileError::Kind kind = SlotFileError::Io;
  EXPECT_NE(read_error(temp_file("missing.bin"), fp, kCtx, &kind).find("does not exist"),
            std::string::npos);
  EXPECT_EQ(kind, SlotFileError::NotFound);
  fs::remove_all(path.parent_path());
}

TEST(SlotFile, FileNamesFollowLlamaServersRule) {
  for (const char* ok : {"a.bin", "slot-0_v2.bin", "x", "name with space.bin"}) {
    EXPECT_NO_THROW(moe::engine::check_slot_filename(ok)) << ok;
  }
  for (const std::string& bad :
       {std::string(), std::string("../x"), std::string("a/b"), std::string("a\\b"),
        std::string(".hidden"), std::string("a..b"), std::string("x."), std::string(" x"),
        std::string("a\nb"), std::string("caf\xc3\xa9"), std::string(256, 'a'), std::string("a:b"),
        std::string("a*b")}) {
    EXPECT_THROW(moe::engine::check_slot_filename(bad), SlotFileError) << bad;
  }
  EXPECT_NO_THROW(moe::engine::check_slot_filename(std::string(255, 'a')));
}

}  // namespace
