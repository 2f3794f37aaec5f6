#include "coordinator/engine/slot_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "common/ggml_type.h"

namespace moe::engine {

static_assert(std::endian::native == std::endian::little, "slot files are written little-endian");

namespace {

constexpr char kMagic[8] = {'M', 'O', 'E', 'S', 'L', 'O', 'T', '\0'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kMaxArch = 64;
constexpr size_t kMaxFilename = 255;

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<FILE, FileCloser>;

uint64_t fnv(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

template <typename T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

std::string header_of(const SlotFingerprint& fp, uint32_t n_tokens) {
  std::string h(kMagic, sizeof kMagic);
  put(h, kVersion);
  put(h, static_cast<uint32_t>(fp.arch.size()));
  h += fp.arch;
  put(h, fp.weights);
  for (uint32_t v : {fp.n_layer, fp.n_embd, fp.n_vocab, fp.head_dim_k, fp.head_dim_v,
                     fp.conv_floats, fp.ssm_floats}) {
    put(h, v);
  }
  for (const SlotFingerprint::Layer& L : fp.layers) {
    put(h, static_cast<uint8_t>(L.recurrent));
    put(h, static_cast<uint8_t>(L.k_type));
    put(h, static_cast<uint8_t>(L.v_type));
    put(h, uint8_t{0});
    put(h, L.n_head_kv);
    put(h, L.k_rot);
    put(h, L.v_rot);
  }
  put(h, n_tokens);
  return h;
}

// -ctk/-ctv's spelling of a cache type, as the user chose it.
std::string type_name(uint32_t id) {
  using model::KvType;
  for (KvType t : {KvType::F32, KvType::F16, KvType::BF16, KvType::Q8_0, KvType::Q5_0, KvType::Q5_1,
                   KvType::Q4_0, KvType::Q4_1, KvType::IQ4_NL}) {
    if (static_cast<uint32_t>(model::kv_ggml_type(t)) == id) return std::string(kv_type_name(t));
  }
  return ggml_type_label(id);
}

std::string rotation(uint32_t block) {
  return block == 0 ? "not rotated" : "rotated in blocks of " + std::to_string(block);
}

// The first difference between the file's fingerprint and this server's, for the error message;
// empty when they are equal.
std::string difference(const SlotFingerprint& file, const SlotFingerprint& ours) {
  const auto num = [](const char* what, uint64_t f, uint64_t o) {
    return f == o ? std::string()
                  : std::string(what) + " " + std::to_string(f) + " where this model has " +
                        std::to_string(o);
  };
  if (file.arch != ours.arch) {
    return "it was saved from a " + file.arch + " model; this server runs " + ours.arch;
  }
  for (const std::string& d :
       {num("n_layer", file.n_layer, ours.n_layer), num("n_embd", file.n_embd, ours.n_embd),
        num("n_vocab", file.n_vocab, ours.n_vocab),
        num("head_dim_k", file.head_dim_k, ours.head_dim_k),
        num("head_dim_v", file.head_dim_v, ours.head_dim_v),
        num("a recurrent conv window of", file.conv_floats, ours.conv_floats),
        num("a DeltaNet state of", file.ssm_floats, ours.ssm_floats)}) {
    if (!d.empty()) return "it has " + d;
  }
  if (file.weights != ours.weights) {
    return "it was saved with other weights (another model or quantization of the same shape)";
  }
  for (size_t l = 0; l < ours.layers.size(); ++l) {
    const SlotFingerprint::Layer &f = file.layers[l], &o = ours.layers[l];
    const std::string at = "layer " + std::to_string(l);
    if (f.recurrent != o.recurrent) {
      return at + " is " + (f.recurrent ? "recurrent" : "attention") + " in the file, " +
             (o.recurrent ? "recurrent" : "attention") + " in this model";
    }
    if (f.n_head_kv != o.n_head_kv) {
      return at + " has " + std::to_string(f.n_head_kv) + " KV heads where this model has " +
             std::to_string(o.n_head_kv);
    }
    for (const auto& [side, ft, ot, fr, orot] :
         {std::tuple{"K", f.k_type, o.k_type, f.k_rot, o.k_rot},
          std::tuple{"V", f.v_type, o.v_type, f.v_rot, o.v_rot}}) {
      if (ft != ot) {
        return at + "'s " + side + " cache is " + type_name(ft) + " in the file, " + type_name(ot) +
               " here (-ctk/-ctv and their per-layer overrides must match)";
      }
      if (fr != orot) {
        return at + "'s " + side + " rows are " + rotation(fr) + " in the file, " + rotation(orot) +
               " here (--no-kv-rotation must match)";
      }
    }
  }
  return {};
}

class Reader {
 public:
  Reader(FILE* f, std::string name) : f_(f), name_(std::move(name)) {}
  void read(void* dst, size_t n, const char* what) {
    if (n > 0 && std::fread(dst, 1, n, f_) != n) {
      if (std::ferror(f_)) {
        throw SlotFileError(SlotFileError::Io,
                            "slot file '" + name_ + "': read error: " + std::strerror(errno));
      }
      throw SlotFileError(SlotFileError::Invalid,
                          "slot file '" + name_ + "' is truncated (it ends in the " + what + ")");
    }
    pos_ += n;
  }
  template <typename T>
  T get(const char* what) {
    T v{};
    read(&v, sizeof v, what);
    return v;
  }
  uint64_t pos() const { return pos_; }

 private:
  FILE* f_;
  std::string name_;
  uint64_t pos_ = 0;
};

}  // namespace

SlotFingerprint SlotFingerprint::of(const model::ModelConfig& cfg, const model::KvCache& layout,
                                    uint64_t weights) {
  SlotFingerprint fp;
  fp.arch = cfg.arch;
  fp.weights = weights;
  fp.n_layer = static_cast<uint32_t>(cfg.n_layer);
  fp.n_embd = static_cast<uint32_t>(cfg.n_embd);
  fp.n_vocab = static_cast<uint32_t>(cfg.n_vocab);
  fp.head_dim_k = static_cast<uint32_t>(cfg.head_dim_k);
  fp.head_dim_v = static_cast<uint32_t>(cfg.head_dim_v);
  fp.conv_floats = static_cast<uint32_t>(layout.conv_floats());
  fp.ssm_floats = static_cast<uint32_t>(layout.ssm_floats());
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    Layer L;
    L.recurrent = cfg.is_recurrent(l);
    if (!L.recurrent) {
      L.k_type = static_cast<uint32_t>(model::kv_ggml_type(layout.k_type(l)));
      L.v_type = static_cast<uint32_t>(model::kv_ggml_type(layout.v_type(l)));
      L.n_head_kv = static_cast<uint32_t>(cfg.n_head_kv[static_cast<size_t>(l)]);
      L.k_rot = static_cast<uint32_t>(layout.k_rotation(l));
      L.v_rot = static_cast<uint32_t>(layout.v_rotation(l));
      L.k_row_bytes = layout.k_row_size(l);
      L.v_row_bytes = layout.v_row_size(l);
    }
    fp.layers.push_back(L);
  }
  return fp;
}

uint64_t SlotFingerprint::state_bytes(uint64_t n) const {
  uint64_t b = 0;
  for (const Layer& L : layers) {
    b += L.recurrent ? (uint64_t{conv_floats} + ssm_floats) * sizeof(float)
                     : n * (L.k_row_bytes + L.v_row_bytes);
  }
  return b;
}

uint64_t weights_hash(const gguf::GgufFile& file) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const gguf::TensorInfo& t : file.tensors()) {
    h = fnv(h, t.name.data(), t.name.size());
    h = fnv(h, &t.type_id, sizeof t.type_id);
    h = fnv(h, &t.n_dims, sizeof t.n_dims);
    h = fnv(h, t.ne, sizeof t.ne);
  }
  return h;
}

void check_slot_filename(std::string_view name) {
  const auto bad = [&](const std::string& why) {
    throw SlotFileError(SlotFileError::Invalid, "invalid filename: " + why);
  };
  if (name.empty()) bad("it is empty");
  if (name.size() > kMaxFilename) {
    bad("it has " + std::to_string(name.size()) + " characters, at most " +
        std::to_string(kMaxFilename) + " are allowed");
  }
  for (const char c : name) {
    if (c < 0x20 || c > 0x7e) bad("only printable ASCII characters are allowed");
    if (std::strchr("/\\:*?\"<>|", c) != nullptr) {
      bad(std::string("'") + c + "' is not allowed (a bare file name, no path)");
    }
  }
  if (name.front() == '.') bad("it must not start with '.'");
  if (name.front() == ' ' || name.back() == ' ' || name.back() == '.') {
    bad("it must not start or end with a space, nor end with '.'");
  }
  if (name.find("..") != std::string_view::npos) bad("it must not contain \"..\"");
}

uint64_t write_slot_file(const std::filesystem::path& path, const SlotFingerprint& fp,
                         std::span<const int32_t> tokens, const model::SequenceImage& image) {
  // What a reader will expect from the header, so that no file is written it would refuse.
  bool fits = image.n_past == static_cast<int64_t>(tokens.size()) &&
              image.layers.size() == fp.layers.size();
  const uint64_t n = tokens.size();
  for (size_t l = 0; fits && l < fp.layers.size(); ++l) {
    const SlotFingerprint::Layer& L = fp.layers[l];
    const model::SequenceImage::Layer& I = image.layers[l];
    fits = L.recurrent ? I.conv.size() == fp.conv_floats && I.ssm.size() == fp.ssm_floats
                       : I.k.size() == n * L.k_row_bytes && I.v.size() == n * L.v_row_bytes;
  }
  if (!fits) throw Error("slot file: the sequence state does not match its tokens or the model");
  const std::string header = header_of(fp, static_cast<uint32_t>(tokens.size()));
  // Beside the target (the same file system, so the rename is atomic), under a name no request
  // can give (a leading '.').
  static std::atomic<uint64_t> counter{0};
  const std::string name = path.filename().string();
  std::string tmp_name = ".";
  tmp_name.append(name).append(".").append(std::to_string(::getpid()));
  tmp_name.append(".").append(std::to_string(counter++)).append(".tmp");
  const std::filesystem::path tmp = path.parent_path() / tmp_name;
  const auto io_error = [&](const std::string& what) {
    const std::string why = std::strerror(errno);
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    return SlotFileError(SlotFileError::Io, "cannot " + what + " slot file '" + name + "': " + why);
  };
  File f(std::fopen(tmp.c_str(), "wbx"));
  if (!f) throw io_error("create");
  uint64_t bytes = 0;
  const auto write = [&](const void* p, size_t n) {
    if (n > 0 && std::fwrite(p, 1, n, f.get()) != n) throw io_error("write");
    bytes += n;
  };
  write(header.data(), header.size());
  write(tokens.data(), tokens.size_bytes());
  for (size_t l = 0; l < fp.layers.size(); ++l) {
    if (fp.layers[l].recurrent) continue;
    write(image.layers[l].k.data(), image.layers[l].k.size());
    write(image.layers[l].v.data(), image.layers[l].v.size());
  }
  for (size_t l = 0; l < fp.layers.size(); ++l) {
    if (!fp.layers[l].recurrent) continue;
    write(image.layers[l].conv.data(), image.layers[l].conv.size() * sizeof(float));
    write(image.layers[l].ssm.data(), image.layers[l].ssm.size() * sizeof(float));
  }
  if (std::fflush(f.get()) != 0 || ::fsync(::fileno(f.get())) != 0) throw io_error("write");
  if (std::fclose(f.release()) != 0) throw io_error("write");
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw io_error("rename into place the");
  return bytes;
}

SlotContents read_slot_file(const std::filesystem::path& path, const SlotFingerprint& expect,
                            int64_t n_ctx) {
  const std::string name = path.filename().string();
  const auto invalid = [&](const std::string& why) {
    return SlotFileError(SlotFileError::Invalid, "slot file '" + name + "' " + why);
  };
  File f(std::fopen(path.c_str(), "rb"));
  if (!f) {
    const int err = errno;
    if (err == ENOENT) {
      throw SlotFileError(SlotFileError::NotFound,
                          "slot file '" + name + "' does not exist in --slot-save-path");
    }
    throw SlotFileError(SlotFileError::Io,
                        "cannot open slot file '" + name + "': " + std::strerror(err));
  }
  struct stat st {};
  if (::fstat(::fileno(f.get()), &st) != 0 || !S_ISREG(st.st_mode)) {
    throw invalid("is not a regular file");
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  Reader r(f.get(), name);

  char magic[sizeof kMagic];
  r.read(magic, sizeof magic, "header");
  if (std::memcmp(magic, kMagic, sizeof magic) != 0) throw invalid("is not a slot file");
  const auto version = r.get<uint32_t>("header");
  if (version != kVersion) {
    throw invalid("has format version " + std::to_string(version) + "; this server reads " +
                  std::to_string(kVersion));
  }
  SlotFingerprint fp;
  const auto arch_len = r.get<uint32_t>("header");
  if (arch_len == 0 || arch_len > kMaxArch) throw invalid("has a corrupt header");
  fp.arch.resize(arch_len);
  r.read(fp.arch.data(), arch_len, "header");
  fp.weights = r.get<uint64_t>("header");
  for (uint32_t* v : {&fp.n_layer, &fp.n_embd, &fp.n_vocab, &fp.head_dim_k, &fp.head_dim_v,
                      &fp.conv_floats, &fp.ssm_floats}) {
    *v = r.get<uint32_t>("header");
  }
  // The layer table's length is checked against this model's before it is read.
  if (fp.n_layer != expect.n_layer || fp.arch != expect.arch) {
    throw invalid("does not fit this server: " + difference(fp, expect));
  }
  fp.layers.resize(fp.n_layer);
  for (SlotFingerprint::Layer& L : fp.layers) {
    L.recurrent = r.get<uint8_t>("layer table") != 0;
    L.k_type = r.get<uint8_t>("layer table");
    L.v_type = r.get<uint8_t>("layer table");
    (void)r.get<uint8_t>("layer table");
    L.n_head_kv = r.get<uint32_t>("layer table");
    L.k_rot = r.get<uint32_t>("layer table");
    L.v_rot = r.get<uint32_t>("layer table");
  }
  if (const std::string d = difference(fp, expect); !d.empty()) {
    throw invalid("does not fit this server: " + d);
  }
  const auto n = r.get<uint32_t>("token count");
  if (n > static_cast<uint64_t>(n_ctx)) {
    throw invalid("holds " + std::to_string(n) + " tokens; a slot holds at most " +
                  std::to_string(n_ctx));
  }
  // From this server's fingerprint (equal to the file's): nothing read so far sizes anything.
  const uint64_t want = r.pos() + uint64_t{n} * sizeof(int32_t) + expect.state_bytes(n);
  if (size != want) {
    throw invalid(std::string(size < want ? "is truncated" : "has trailing bytes") + ": " +
                  std::to_string(size) + " bytes where " + std::to_string(n) + " tokens take " +
                  std::to_string(want));
  }
  SlotContents out;
  out.bytes = size;
  out.tokens.resize(n);
  r.read(out.tokens.data(), out.tokens.size() * sizeof(int32_t), "tokens");
  for (size_t i = 0; i < out.tokens.size(); ++i) {
    if (out.tokens[i] < 0 || static_cast<uint32_t>(out.tokens[i]) >= expect.n_vocab) {
      throw invalid("has token id " + std::to_string(out.tokens[i]) + " at " + std::to_string(i) +
                    ", outside the vocabulary of " + std::to_string(expect.n_vocab));
    }
  }
  model::SequenceImage& img = out.image;
  img.n_past = n;
  img.layers.resize(expect.layers.size());
  for (size_t l = 0; l < expect.layers.size(); ++l) {
    const SlotFingerprint::Layer& L = expect.layers[l];
    if (L.recurrent) continue;
    img.layers[l].k.resize(n * L.k_row_bytes);
    img.layers[l].v.resize(n * L.v_row_bytes);
    r.read(img.layers[l].k.data(), img.layers[l].k.size(), "K/V rows");
    r.read(img.layers[l].v.data(), img.layers[l].v.size(), "K/V rows");
  }
  for (size_t l = 0; l < expect.layers.size(); ++l) {
    if (!expect.layers[l].recurrent) continue;
    img.layers[l].conv.resize(expect.conv_floats);
    img.layers[l].ssm.resize(expect.ssm_floats);
    r.read(img.layers[l].conv.data(), img.layers[l].conv.size() * sizeof(float), "recurrent state");
    r.read(img.layers[l].ssm.data(), img.layers[l].ssm.size() * sizeof(float), "recurrent state");
  }
  return out;
}

}  // namespace moe::engine
