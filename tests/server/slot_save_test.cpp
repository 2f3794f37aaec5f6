// llama-server's slot files through the whole server (--slot-save-path, POST
// /slots/{id}?action=save|restore|erase): a slot's conversation saved, its slot erased (the same
// request then reuses nothing), and restored, after which the conversation's next request reuses
// the saved tokens and generates what it did before; on qwen3moe and on qwen35moe (recurrent
// state). Bad names, ids, actions, missing, truncated and other models' files, and a busy slot
// are refused with a status and a message saying why; without the flag the route answers 501,
// and it sits behind the API key like every route.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/server/coordinator_harness.h"
#include "tests/server/http_client.h"
#include "tests/testdata.h"

namespace moe::test {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

const std::string kQ8 = "models/tiny-qwen3moe-sv-Q8_0.gguf";

std::string qwen3moe(const std::string& rel) { return (testdata_dir() / rel).string(); }
std::string qwen35moe() {
  return (qwen35moe_testdata_dir() / "models/tiny-qwen35moe-sv-Q8_0.gguf").string();
}

// A folder of its own for each test's files, removed at the end.
struct TempDir {
  TempDir() {
    static int n = 0;
    path = fs::temp_directory_path() /
           ("moe_slot_save_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    fs::remove_all(path);
  }
  ~TempDir() { fs::remove_all(path); }
  fs::path path;
};

StreamResult generate(Coordinator& c, const std::vector<int32_t>& prompt, int max_tokens) {
  return run_stream(*c.gen, greedy(prompt, max_tokens));
}

// Erase takes any body; it sends one because httplib 0.11 answers a POST without Content-Length
// with its own 400 before any route sees it.
HttpReply slot_post(const std::string& base, const std::string& id, const std::string& action,
                    const std::string& body, const std::string& extra = "") {
  return curl("POST", base + "/slots/" + id + "?action=" + action, body, extra);
}
HttpReply slot_file(const std::string& base, int id, const std::string& action,
                    const std::string& filename) {
  return slot_post(base, std::to_string(id), action, json{{"filename", filename}}.dump());
}

// n_past of every slot (GET /slots), by id.
std::vector<int64_t> slots_n_past(const std::string& base) {
  std::vector<int64_t> out;
  for (const json& s : json::parse(curl("GET", base + "/slots").body)) {
    out.push_back(s["n_past"].get<int64_t>());
  }
  return out;
}

// The slot whose cache holds `n` tokens, or -1.
int slot_holding(const std::string& base, int64_t n) {
  const std::vector<int64_t> v = slots_n_past(base);
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] == n) return static_cast<int>(i);
  }
  return -1;
}

void save_erase_restore(const std::string& model) {
  TempDir dir;
  Coordinator c(
      model, {"--slot-save-path", dir.path.string(), "-np", "2", "-c", "2048", "--http-port", "0"});
  const std::string base = "http://" + c.http_addr();
  const std::vector<int32_t> p = tokenize(c, "The prompt cache keeps what was evaluated before.");
  const StreamResult first = generate(c, p, 4);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  ASSERT_EQ(first.tokens.size(), 4u);
  // The prompt and all but the last generated token (sampled, never evaluated).
  const auto held = static_cast<int64_t>(p.size() + 3);
  const int slot = slot_holding(base, held);
  ASSERT_GE(slot, 0) << curl("GET", base + "/slots").body;

  const HttpReply saved = slot_file(base, slot, "save", "conversation.bin");
  ASSERT_EQ(saved.status, 200) << saved.body;
  const json s = json::parse(saved.body);
  EXPECT_EQ(s["id_slot"], slot);
  EXPECT_EQ(s["filename"], "conversation.bin");
  EXPECT_EQ(s["n_saved"], held);
  EXPECT_EQ(s["n_written"], fs::file_size(dir.path / "conversation.bin"));
  EXPECT_GE(s["timings"]["save_ms"].get<double>(), 0.0);

  // The conversation's next request without save and restore: the reference.
  std::vector<int32_t> next = p;
  next.insert(next.end(), first.tokens.begin(), first.tokens.end());
  const std::vector<int32_t> more = tokenize(c, " And then some more words.");
  next.insert(next.end(), more.begin(), more.end());
  const StreamResult ref = generate(c, next, 3);
  ASSERT_TRUE(ref.status.ok()) << ref.status.error_message();
  EXPECT_EQ(ref.finish.cached_tokens(), held);

  // Erased (it ran in the same slot): /slots shows it empty, and the same request reuses nothing.
  const HttpReply erased = slot_post(base, std::to_string(slot), "erase", "{}");
  ASSERT_EQ(erased.status, 200) << erased.body;
  EXPECT_EQ(json::parse(erased.body),
            (json{{"id_slot", slot}, {"n_erased", static_cast<int64_t>(next.size() + 2)}}));
  EXPECT_EQ(slots_n_past(base)[static_cast<size_t>(slot)], 0);
  const StreamResult cold = generate(c, next, 3);
  ASSERT_TRUE(cold.status.ok());
  EXPECT_EQ(cold.finish.cached_tokens(), 0);
  // That request's slot is erased too, so that only the restored one shares anything with it.
  for (int i = 0; i < 2; ++i)
    ASSERT_EQ(slot_post(base, std::to_string(i), "erase", "{}").status, 200);

  const HttpReply restored = slot_file(base, slot, "restore", "conversation.bin");
  ASSERT_EQ(restored.status, 200) << restored.body;
  const json r = json::parse(restored.body);
  EXPECT_EQ(r["id_slot"], slot);
  EXPECT_EQ(r["filename"], "conversation.bin");
  EXPECT_EQ(r["n_restored"], held);
  EXPECT_EQ(r["n_read"], fs::file_size(dir.path / "conversation.bin"));
  EXPECT_GE(r["timings"]["restore_ms"].get<double>(), 0.0);
  EXPECT_EQ(slots_n_past(base)[static_cast<size_t>(slot)], held);

  const StreamResult again = generate(c, next, 3);
  ASSERT_TRUE(again.status.ok()) << again.status.error_message();
  EXPECT_EQ(again.finish.cached_tokens(), held);
  EXPECT_EQ(again.tokens, ref.tokens);
  EXPECT_TRUE(c.stop());
}

TEST(SlotSave, Qwen3MoeSavesErasesAndRestoresASlot) { save_erase_restore(qwen3moe(kQ8)); }

TEST(SlotSave, Qwen35MoeRestoresItsRecurrentState) { save_erase_restore(qwen35moe()); }

TEST(SlotSave, BadRequestsAreRefusedWithTheReason) {
  TempDir dir;
  Coordinator c(qwen3moe(kQ8), {"--slot-save-path", dir.path.string(), "-np", "2", "-c", "4096",
                                "--http-port", "0"});
  const std::string base = "http://" + c.http_addr();
  for (const char* name : {"../x", "a/b", "", ".hidden"}) {
    expect_error(slot_file(base, 0, "save", name), 400, "invalid filename");
    expect_error(slot_file(base, 0, "restore", name), 400, "invalid filename");
  }
  expect_error(slot_post(base, "0", "save", "{}"), 400, "filename must be a string");
  expect_error(slot_post(base, "0", "save", "not json"), 400, "not valid JSON");
  expect_error(slot_file(base, 0, "restore", "missing.bin"), 404, "does not exist");
  expect_error(slot_file(base, 2, "save", "a.bin"), 400, "no slot 2");
  expect_error(slot_post(base, "x", "erase", "{}"), 400, "must be a number");
  expect_error(slot_post(base, "0", "delete", "{}"), 400, "action must be save, restore or erase");
  expect_error(curl("POST", base + "/slots/0", "{}"), 400, "action must be");

  // A truncated file: refused, and the slot keeps what it held.
  ASSERT_TRUE(generate(c, tokenize(c, "Something to keep."), 2).status.ok());
  const int slot =
      slot_holding(base, static_cast<int64_t>(tokenize(c, "Something to keep.").size() + 1));
  ASSERT_GE(slot, 0);
  ASSERT_EQ(slot_file(base, slot, "save", "cut.bin").status, 200);
  const fs::path cut = dir.path / "cut.bin";
  fs::resize_file(cut, fs::file_size(cut) - 3);
  const int64_t before = slots_n_past(base)[static_cast<size_t>(slot)];
  expect_error(slot_file(base, slot, "restore", "cut.bin"), 400, "is truncated");
  EXPECT_EQ(slots_n_past(base)[static_cast<size_t>(slot)], before);

  // A busy slot: 409 while its request runs.
  HttpReply busy;
  grpc::ClientContext ctx;
  ctx.set_deadline(in(std::chrono::seconds(120)));
  (void)run_stream(*c.gen, greedy(tokenize(c, "A long story."), 1500), ctx,
                   [&](const StreamResult& r) {
                     if (r.chunks != 1) return;
                     const json slots = json::parse(curl("GET", base + "/slots").body);
                     for (const json& s : slots) {
                       if (s["is_processing"].get<bool>())
                         busy = slot_file(base, s["id"].get<int>(), "save", "b.bin");
                     }
                     ctx.TryCancel();
                   });
  expect_error(busy, 409, "is processing a request");
  EXPECT_FALSE(fs::exists(dir.path / "b.bin"));
  EXPECT_TRUE(c.stop());
}

// A file restores only into the model (weights, architecture) and cache types it was saved
// from: another server's 400 names the difference.
TEST(SlotSave, AnotherModelsFileIsRefused) {
  TempDir dir;
  {
    Coordinator c(qwen3moe(kQ8), {"--slot-save-path", dir.path.string(), "--http-port", "0"});
    ASSERT_TRUE(generate(c, tokenize(c, "Saved on Q8_0."), 2).status.ok());
    ASSERT_EQ(slot_file("http://" + c.http_addr(), 0, "save", "q8.bin").status, 200);
    EXPECT_TRUE(c.stop());
  }
  const auto refused = [&](const std::string& model, std::vector<std::string> args,
                           const std::string& why) {
    args.insert(args.end(), {"--slot-save-path", dir.path.string(), "--http-port", "0"});
    Coordinator c(model, args);
    const std::string base = "http://" + c.http_addr();
    expect_error(slot_file(base, 0, "restore", "q8.bin"), 400, why);
    EXPECT_EQ(slots_n_past(base)[0], 0);
    EXPECT_TRUE(c.stop());
  };
  refused(qwen3moe("models/tiny-qwen3moe-sv-Q4_K_M.gguf"), {}, "other weights");
  refused(qwen35moe(), {}, "saved from a qwen3moe model; this server runs qwen35moe");
  refused(qwen3moe(kQ8), {"-ctk", "q8_0"}, "K cache is f16 in the file, q8_0 here");
}

// Without --slot-save-path the route answers 501 (llama-server's answer); like every route it
// needs the API key first.
TEST(SlotSave, OffWithoutTheFlagAndBehindTheApiKey) {
  Coordinator c(qwen3moe(kQ8), {"--http-port", "0", "--api-key", "k"});
  const std::string base = "http://" + c.http_addr();
  expect_error(slot_post(base, "0", "erase", "{}"), 401, "API key");
  expect_error(slot_post(base, "0", "erase", "{}", "-H 'Authorization: Bearer k'"), 501,
               "--slot-save-path");
  EXPECT_TRUE(c.stop());
}

}  // namespace
}  // namespace moe::test
