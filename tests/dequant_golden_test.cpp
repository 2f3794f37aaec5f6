// Dequantization against golden/dequant (testdata README §4): per model, the stored 2048 values of
// each listed tensor must match bit for bit, and the float64 sum / sum of squares of every tensor
// must match up to summation order.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/ggml_type.h"
#include "common/gguf.h"
#include "kernels/cpu/dequant.h"
#include "tests/testdata.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path dequant_dir() { return moe::test::testdata_dir() / "golden" / "dequant"; }

// Stems of golden/dequant/*.json; a sentinel when the folder is missing so that the test fails
// with testdata_dir()'s message instead of silently running nothing.
std::vector<std::string> golden_stems() {
  std::vector<std::string> stems;
  try {
    for (const auto& e : fs::directory_iterator(dequant_dir())) {
      if (e.path().extension() == ".json") stems.push_back(e.path().stem().string());
    }
  } catch (const std::exception&) {
    return {"missing_testdata"};
  }
  std::sort(stems.begin(), stems.end());
  if (stems.empty()) stems.push_back("missing_testdata");
  return stems;
}

std::string test_name(const testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  for (char& c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return s;
}

json read_json(const fs::path& p) {
  std::ifstream f(p);
  if (!f) throw std::runtime_error("cannot open " + p.string());
  return json::parse(f);
}

std::string upper(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return r;
}

// Dequantizes a whole tensor row by row (rows are ne[0] elements, stored back to back).
std::vector<float> dequantize_tensor(const moe::gguf::TensorInfo& t) {
  const int64_t n = t.n_elements();
  const int64_t row = t.ne[0];
  const auto row_bytes = moe::ggml_row_bytes(t.type(), static_cast<uint64_t>(row));
  if (!row_bytes) throw std::runtime_error("bad row size for " + std::string(t.name));
  std::vector<float> out(static_cast<size_t>(n));
  const int64_t n_rows = n / row;
  if (static_cast<uint64_t>(n_rows) * *row_bytes != t.n_bytes) {
    throw std::runtime_error("tensor byte size mismatch for " + std::string(t.name));
  }
  for (int64_t r = 0; r < n_rows; ++r) {
    moe::cpu::dequantize_row(t.type(), t.data + static_cast<size_t>(r) * *row_bytes,
                             out.data() + r * row, row);
  }
  return out;
}

struct Sums {
  double sum = 0;
  double sumsq = 0;
};

// Accumulated in long double so that the result is (nearly) independent of summation order.
Sums sums_of(const float* v, size_t n) {
  long double s = 0;
  long double q = 0;
  for (size_t i = 0; i < n; ++i) {
    const long double x = v[i];
    s += x;
    q += x * x;
  }
  return {static_cast<double>(s), static_cast<double>(q)};
}

// Relative 1e-9 (with an absolute floor of 1e-9 for values near zero).
void expect_close(double got, double want, const std::string& what) {
  const double tol = 1e-9 * std::max(1.0, std::fabs(want));
  EXPECT_NEAR(got, want, tol) << what;
}

class DequantGolden : public testing::TestWithParam<std::string> {};

TEST_P(DequantGolden, MatchesGoldenBitForBit) {
  const std::string stem = GetParam();
  const fs::path dir = dequant_dir();  // throws (test failure) when the data are missing
  const json meta = read_json(dir / (stem + ".json"));
  const std::vector<float> golden =
      moe::test::read_raw<float>(dir / meta.at("values_file").get<std::string>());
  const fs::path model_path =
      moe::test::testdata_dir() / "models" / meta.at("model").get<std::string>();
  const moe::gguf::GgufFile file = moe::gguf::GgufFile::open(model_path.string());

  size_t values_compared = 0;
  const auto& entries = meta.at("entries");
  ASSERT_FALSE(entries.empty());
  for (const auto& e : entries) {
    const std::string name = e.at("tensor").get<std::string>();
    SCOPED_TRACE(stem + ": " + name);
    const moe::gguf::TensorInfo* t = file.find_tensor(name);
    ASSERT_NE(t, nullptr) << "tensor missing from " << model_path;
    const auto info = moe::ggml_type_info(t->type_id);
    ASSERT_TRUE(info.has_value());
    ASSERT_EQ(upper(info->name), e.at("ggml_type").get<std::string>());
    const auto& ne = e.at("ne");
    for (size_t d = 0; d < 4; ++d) {
      const int64_t want = d < ne.size() ? ne[d].get<int64_t>() : 1;
      ASSERT_EQ(t->ne[d], want) << "ne[" << d << "]";
    }
    ASSERT_EQ(t->n_elements(), e.at("n_elements").get<int64_t>());

    const std::vector<float> values = dequantize_tensor(*t);

    // The stored values start at the slice's element offset for expert tensors.
    size_t start = 0;
    if (e.contains("slice")) {
      const auto& sl = e.at("slice");
      start = sl.at("element_offset_in_tensor").get<size_t>();
      const auto& shape = sl.at("slice_numpy_shape");
      size_t slice_n = 1;
      for (const auto& s : shape) slice_n *= s.get<size_t>();
      ASSERT_LE(start + slice_n, values.size());
      const Sums ss = sums_of(values.data() + start, slice_n);
      expect_close(ss.sum, sl.at("slice_sum_f64").get<double>(), "slice sum");
      expect_close(ss.sumsq, sl.at("slice_sumsq_f64").get<double>(), "slice sumsq");
    }
    const size_t off = e.at("values_offset_floats").get<size_t>();
    const size_t nv = e.at("n_values").get<size_t>();
    ASSERT_LE(off + nv, golden.size());
    ASSERT_LE(start + nv, values.size());

    // First 8 values inline must agree with the .f32 file (sanity of offsets).
    const auto& first8 = e.at("first_8_values");
    for (size_t i = 0; i < first8.size() && i < nv; ++i) {
      ASSERT_EQ(static_cast<float>(first8[i].get<double>()), golden[off + i]) << "first_8 " << i;
    }

    size_t mismatches = 0;
    for (size_t i = 0; i < nv; ++i) {
      const uint32_t got = std::bit_cast<uint32_t>(values[start + i]);
      const uint32_t want = std::bit_cast<uint32_t>(golden[off + i]);
      if (got != want) {
        if (++mismatches <= 5) {
          ADD_FAILURE() << "element " << (start + i) << ": got " << values[start + i] << " (0x"
                        << std::hex << got << "), want " << golden[off + i] << " (0x" << want
                        << std::dec << ")";
        }
      }
    }
    EXPECT_EQ(mismatches, 0u) << "of " << nv << " values";
    EXPECT_EQ(std::memcmp(values.data() + start, golden.data() + off, nv * sizeof(float)), 0);
    values_compared += nv;

    const Sums ts = sums_of(values.data(), values.size());
    expect_close(ts.sum, e.at("tensor_sum_f64").get<double>(), "tensor sum");
    expect_close(ts.sumsq, e.at("tensor_sumsq_f64").get<double>(), "tensor sumsq");
  }
  RecordProperty("golden_values_compared", static_cast<int>(values_compared));
  std::cout << "[ info     ] " << stem << ": " << values_compared
            << " golden values compared bit for bit\n";
}

TEST_P(DequantGolden, AllTensorSums) {
  const std::string stem = GetParam();
  const fs::path dir = dequant_dir();
  const json meta = read_json(dir / (stem + ".json"));
  const moe::gguf::GgufFile file = moe::gguf::GgufFile::open(
      (moe::test::testdata_dir() / "models" / meta.at("model").get<std::string>()).string());
  const auto& all = meta.at("all_tensors_sum_sumsq");

  size_t checked = 0;
  for (const auto& t : file.tensors()) {
    const std::string name(t.name);
    SCOPED_TRACE(stem + ": " + name);
    const auto info = moe::ggml_type_info(t.type_id);
    ASSERT_TRUE(info.has_value()) << moe::ggml_type_label(t.type_id);
    if (!info->computable) continue;
    ASSERT_TRUE(all.contains(name)) << "tensor not in all_tensors_sum_sumsq";
    const auto& g = all.at(name);
    ASSERT_EQ(upper(info->name), g.at("ggml_type").get<std::string>());
    const std::vector<float> values = dequantize_tensor(t);
    const Sums s = sums_of(values.data(), values.size());
    expect_close(s.sum, g.at("sum_f64").get<double>(), "sum");
    expect_close(s.sumsq, g.at("sumsq_f64").get<double>(), "sumsq");
    ++checked;
  }
  // Every tensor of these files has a computable type, so every JSON entry is checked.
  EXPECT_EQ(checked, all.size());
}

INSTANTIATE_TEST_SUITE_P(Models, DequantGolden, testing::ValuesIn(golden_stems()), test_name);

}  // namespace
