// Hand-built blocks for every computable type. Each test ENCODES chosen codes and scales into the
// block layout of formats.md §2.2-2.4 (an encoder written independently of the decoder) and checks
// the decoded values. Scales are chosen so that every product is exact, so the expected values do
// not depend on the order of float operations (the goldens check that) except for the sign of
// zero, which follows ggml's (d * scale) * q.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/fp16.h"
#include "common/ggml_type.h"
#include "kernels/cpu/dequant.h"

namespace {

using moe::GgmlType;
using Bytes = std::vector<uint8_t>;

constexpr int kIq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                            1,    13,   25,  38,  53,  69,  89,  113};

void put_u16(Bytes& b, size_t off, uint16_t v) {
  b[off] = static_cast<uint8_t>(v & 0xFF);
  b[off + 1] = static_cast<uint8_t>(v >> 8);
}
void put_f16(Bytes& b, size_t off, float v) {
  const uint16_t h = moe::fp32_to_fp16(v);
  ASSERT_EQ(moe::fp16_to_fp32(h), v) << "test scale must be exact in fp16";
  put_u16(b, off, h);
}

// Decodes `bytes` placed at an odd address (block fields are read unaligned).
std::vector<float> decode(GgmlType type, const Bytes& bytes, int64_t n) {
  std::vector<uint8_t> buf(bytes.size() + 1);
  std::memcpy(buf.data() + 1, bytes.data(), bytes.size());
  std::vector<float> out(static_cast<size_t>(n), -12345.0f);
  moe::cpu::dequantize_row(type, buf.data() + 1, out.data(), n);
  return out;
}

void expect_bits_eq(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
        << "element " << i << ": got " << got[i] << ", want " << want[i];
  }
}

size_t block_bytes(GgmlType t) { return moe::ggml_type_info_or_throw(t).type_size; }

TEST(DequantUnit, F32F16BF16) {
  const std::vector<float> f = {1.5f, -0.0f, 3.0e38f, -1.0e-40f};
  Bytes b(f.size() * 4);
  std::memcpy(b.data(), f.data(), b.size());
  expect_bits_eq(decode(GgmlType::F32, b, 4), f);

  // fp16: 1, -2, 65504 (max), 2^-24 (smallest subnormal), -0, +inf.
  const uint16_t h[] = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x8000, 0x7C00};
  Bytes hb(12);
  for (size_t i = 0; i < 6; ++i) put_u16(hb, 2 * i, h[i]);
  expect_bits_eq(decode(GgmlType::F16, hb, 6),
                 {1.0f, -2.0f, 65504.0f, std::ldexp(1.0f, -24), -0.0f, INFINITY});

  // bf16: the top half of a float32.
  const uint16_t bh[] = {0x3F80, 0x4049, 0xC2F7, 0x0001};
  Bytes bb(8);
  for (size_t i = 0; i < 4; ++i) put_u16(bb, 2 * i, bh[i]);
  expect_bits_eq(decode(GgmlType::BF16, bb, 4),
                 {1.0f, 3.140625f, -123.5f, std::bit_cast<float>(uint32_t{0x00010000})});
}

TEST(DequantUnit, Q8_0) {
  // Two blocks: d = 0.5 and d = -3; codes -128..127 spread over both.
  Bytes b(2 * 34);
  std::vector<float> want;
  const float ds[2] = {0.5f, -3.0f};
  for (int blk = 0; blk < 2; ++blk) {
    put_f16(b, 34 * blk, ds[blk]);
    for (int j = 0; j < 32; ++j) {
      const int q = (blk == 0) ? (j * 8 - 128) : (127 - j * 7);
      b[34 * blk + 2 + j] = static_cast<uint8_t>(static_cast<int8_t>(q));
      want.push_back(static_cast<float>(q) * ds[blk]);
    }
  }
  expect_bits_eq(decode(GgmlType::Q8_0, b, 64), want);
}

TEST(DequantUnit, Q4_0NibbleOrder) {
  // Element e < 16 is the low nibble of qs[e], element e >= 16 the high nibble of qs[e-16].
  Bytes b(18);
  put_f16(b, 0, 2.0f);
  std::vector<float> want(32);
  for (int e = 0; e < 32; ++e) {
    const int code = (e * 5 + 3) % 16;
    b[2 + e % 16] |= static_cast<uint8_t>(code << (4 * (e / 16)));
    want[e] = static_cast<float>(code - 8) * 2.0f;
  }
  expect_bits_eq(decode(GgmlType::Q4_0, b, 32), want);
  // A single low nibble set: only element 0 changes.
  Bytes c(18);
  put_f16(c, 0, 1.0f);
  for (int j = 0; j < 16; ++j) c[2 + j] = 0x88;  // all codes 8 -> 0
  c[2] = 0x8F;                                   // element 0 = 15-8 = 7
  std::vector<float> w(32, 0.0f);
  w[0] = 7.0f;
  expect_bits_eq(decode(GgmlType::Q4_0, c, 32), w);
}

TEST(DequantUnit, Q4_1) {
  Bytes b(20);
  put_f16(b, 0, 0.25f);
  put_f16(b, 2, -1.5f);
  std::vector<float> want(32);
  for (int e = 0; e < 32; ++e) {
    const int code = (e * 7 + 1) % 16;
    b[4 + e % 16] |= static_cast<uint8_t>(code << (4 * (e / 16)));
    want[e] = static_cast<float>(code) * 0.25f - 1.5f;
  }
  expect_bits_eq(decode(GgmlType::Q4_1, b, 32), want);
}

TEST(DequantUnit, Q4_1RoundingOrder) {
  // d and m with full fp16 mantissas: y must be the float product q*d rounded, plus m rounded.
  Bytes b(20);
  const uint16_t dh = 0x2E67;
  const uint16_t mh = 0xB9A5;
  put_u16(b, 0, dh);
  put_u16(b, 2, mh);
  for (int j = 0; j < 16; ++j) b[4 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const volatile float d = moe::fp16_to_fp32(dh);
  const volatile float m = moe::fp16_to_fp32(mh);
  std::vector<float> want(32);
  for (int e = 0; e < 32; ++e) {
    const int code = e < 16 ? e : 15 - (e - 16);
    const volatile float prod = static_cast<float>(code) * d;
    want[e] = prod + m;
  }
  expect_bits_eq(decode(GgmlType::Q4_1, b, 32), want);
}

// Q5_0 / Q5_1: 5-bit codes, low 4 bits as in Q4_x, bit 4 of element e in bit e of the LE u32 qh.
void encode_q5(Bytes& b, size_t qh_off, size_t qs_off, const int* codes) {
  uint32_t qh = 0;
  for (int e = 0; e < 32; ++e) {
    b[qs_off + e % 16] |= static_cast<uint8_t>((codes[e] & 0xF) << (4 * (e / 16)));
    qh |= static_cast<uint32_t>(codes[e] >> 4) << e;
  }
  for (int k = 0; k < 4; ++k) b[qh_off + k] = static_cast<uint8_t>(qh >> (8 * k));
}

TEST(DequantUnit, Q5_0) {
  int codes[32];
  for (int e = 0; e < 32; ++e) codes[e] = (e * 13 + 5) % 32;
  codes[0] = 0;
  codes[31] = 31;
  Bytes b(22);
  put_f16(b, 0, 0.125f);
  encode_q5(b, 2, 6, codes);
  std::vector<float> want(32);
  for (int e = 0; e < 32; ++e) want[e] = static_cast<float>(codes[e] - 16) * 0.125f;
  expect_bits_eq(decode(GgmlType::Q5_0, b, 32), want);
}

TEST(DequantUnit, Q5_1) {
  int codes[32];
  for (int e = 0; e < 32; ++e) codes[e] = (e * 11 + 7) % 32;
  Bytes b(24);
  put_f16(b, 0, 0.5f);
  put_f16(b, 2, -4.0f);
  encode_q5(b, 4, 8, codes);
  std::vector<float> want(32);
  for (int e = 0; e < 32; ++e) want[e] = static_cast<float>(codes[e]) * 0.5f - 4.0f;
  expect_bits_eq(decode(GgmlType::Q5_1, b, 32), want);
}

TEST(DequantUnit, IQ4_NL) {
  Bytes b(18);
  put_f16(b, 0, 0.5f);
  std::vector<float> want(32);
  for (int e = 0; e < 32; ++e) {
    const int code = (e * 3) % 16;
    b[2 + e % 16] |= static_cast<uint8_t>(code << (4 * (e / 16)));
    want[e] = static_cast<float>(kIq4nl[code]) * 0.5f;
  }
  expect_bits_eq(decode(GgmlType::IQ4_NL, b, 32), want);
}

TEST(DequantUnit, MXFP4Scales) {
  // E2M1 magnitudes {0,0.5,1,1.5,2,3,4,6}, sign in bit 3; scale 2^(e-127). ggml's doubled table
  // with scale 2^(e-128) is the same thing.
  const double e2m1[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (const int e : {0, 1, 2, 127, 128, 129, 200, 254, 255}) {
    SCOPED_TRACE("e = " + std::to_string(e));
    Bytes b(17);
    b[0] = static_cast<uint8_t>(e);
    std::vector<float> want(32);
    for (int k = 0; k < 32; ++k) {
      const int code = (k + e) % 16;
      b[1 + k % 16] |= static_cast<uint8_t>(code << (4 * (k / 16)));
      // ggml computes int8 table value * scale: code 8 ("-0") decodes to +0.
      const double v = e2m1[code] == 0 ? 0.0 : e2m1[code];
      want[k] = static_cast<float>(std::ldexp(v, e - 127));
    }
    expect_bits_eq(decode(GgmlType::MXFP4, b, 32), want);
  }
  // The scales themselves: e = 0 -> 2^-128 (subnormal 0x00200000), e = 1 -> 2^-127, e = 128 -> 1
  // (times the doubled value 2 of code 2 = E2M1 1.0), e = 254 -> 2^126.
  Bytes b(17);
  for (int j = 0; j < 16; ++j) b[1 + j] = 0x11;  // every element code 1 (doubled value 1)
  const std::pair<int, uint32_t> cases[] = {
      {0, 0x00200000u}, {1, 0x00400000u}, {2, 0x00800000u}, {128, 0x3F800000u}, {254, 0x7E800000u}};
  for (const auto& [e, bits] : cases) {
    b[0] = static_cast<uint8_t>(e);
    const auto y = decode(GgmlType::MXFP4, b, 32);
    EXPECT_EQ(std::bit_cast<uint32_t>(y[0]), bits) << "e = " << e;
    EXPECT_EQ(std::bit_cast<uint32_t>(y[31]), bits) << "e = " << e;
  }
}

TEST(DequantUnit, Q2_0) {
  // Codes {0,1,2,3} -> {-1,0,1,2}*d, element 0 in the two least significant bits.
  Bytes b(2 * 18);
  std::vector<float> want;
  const float ds[2] = {0.75f, -2.0f};
  for (int blk = 0; blk < 2; ++blk) {
    put_f16(b, 18 * blk, ds[blk]);
    for (int e = 0; e < 64; ++e) {
      const int code = (e + e / 4 + blk) % 4;
      b[18 * blk + 2 + e / 4] |= static_cast<uint8_t>(code << (2 * (e % 4)));
      want.push_back(static_cast<float>(code - 1) * ds[blk]);
    }
  }
  expect_bits_eq(decode(GgmlType::Q2_0, b, 128), want);

  Bytes c(18);
  put_f16(c, 0, 1.0f);
  c[2] = 0xE4;  // 0b11'10'01'00: elements 0..3 have codes 0,1,2,3
  const auto y = decode(GgmlType::Q2_0, c, 64);
  EXPECT_EQ(y[0], -1.0f);
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_EQ(y[2], 1.0f);
  EXPECT_EQ(y[3], 2.0f);
  EXPECT_EQ(y[4], -1.0f);  // code 0 in byte 1
}

TEST(DequantUnit, Q2_K) {
  // Element e = 128n + 32j + 16h + l: code in bits 2j of qs[32n + 16h + l]; sub-block e/16 uses
  // scales[e/16] (low nibble scale, high nibble min); d, dmin at bytes 80, 82.
  Bytes b(84);
  const float d = 0.5f;
  const float dmin = 0.25f;
  int sc[16];
  int mn[16];
  for (int i = 0; i < 16; ++i) {
    sc[i] = (i * 7 + 3) % 16;
    mn[i] = (i * 5 + 1) % 16;
    b[i] = static_cast<uint8_t>(sc[i] | (mn[i] << 4));
  }
  put_f16(b, 80, d);
  put_f16(b, 82, dmin);
  std::vector<float> want(256);
  for (int e = 0; e < 256; ++e) {
    const int n = e / 128;
    const int j = (e % 128) / 32;
    const int h = (e % 32) / 16;
    const int l = e % 16;
    const int code = (e * 3 + e / 7) % 4;
    b[16 + 32 * n + 16 * h + l] |= static_cast<uint8_t>(code << (2 * j));
    want[e] = d * static_cast<float>(sc[e / 16]) * static_cast<float>(code) -
              dmin * static_cast<float>(mn[e / 16]);
  }
  expect_bits_eq(decode(GgmlType::Q2_K, b, 256), want);
}

TEST(DequantUnit, Q3_K) {
  // 3-bit values v in [-4,3]: low 2 bits in qs (as Q2_K), hmask bit set = no -4; hmask[16h + l]
  // bit 4n+j. 16 signed 6-bit scales s in [-32,31] stored as s+32 across scales[12].
  Bytes b(110);
  int s[16];
  for (int i = 0; i < 16; ++i) s[i] = (i * 9 + 2) % 64 - 32;
  s[0] = -32;
  s[15] = 31;
  for (int i = 0; i < 16; ++i) {
    const int u = s[i] + 32;
    if (i < 8) {
      b[96 + i] |= static_cast<uint8_t>(u & 0xF);
    } else {
      b[96 + i - 8] |= static_cast<uint8_t>((u & 0xF) << 4);
    }
    b[96 + 8 + i % 4] |= static_cast<uint8_t>((u >> 4) << (2 * (i / 4)));
  }
  const float d = 0.5f;
  put_f16(b, 108, d);
  std::vector<float> want(256);
  for (int e = 0; e < 256; ++e) {
    const int n = e / 128;
    const int j = (e % 128) / 32;
    const int h = (e % 32) / 16;
    const int l = e % 16;
    const int v = (e * 5 + e / 3) % 8 - 4;
    const int low2 = v >= 0 ? v : v + 4;
    b[32 + 32 * n + 16 * h + l] |= static_cast<uint8_t>(low2 << (2 * j));
    if (v >= 0) b[16 * h + l] |= static_cast<uint8_t>(1u << (4 * n + j));
    want[e] = d * static_cast<float>(s[e / 16]) * static_cast<float>(v);
  }
  expect_bits_eq(decode(GgmlType::Q3_K, b, 256), want);
}

// Packs eight 6-bit scales and mins into Q4_K/Q5_K's 12 bytes.
void pack_k4_scales(uint8_t* s, const int* sc, const int* mn) {
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    s[j + 4] = static_cast<uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
    s[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4));
  }
}

TEST(DequantUnit, Q4_K) {
  Bytes b(144);
  int sc[8];
  int mn[8];
  for (int i = 0; i < 8; ++i) {
    sc[i] = (i * 23 + 5) % 64;
    mn[i] = (i * 37 + 60) % 64;
  }
  pack_k4_scales(b.data() + 4, sc, mn);
  const float d = 0.5f;
  const float dmin = 0.25f;
  put_f16(b, 0, d);
  put_f16(b, 2, dmin);
  // Element e = 64k + 32h + l: nibble h of qs[32k + l]; sub-block e/32.
  std::vector<float> want(256);
  for (int e = 0; e < 256; ++e) {
    const int k = e / 64;
    const int h = (e % 64) / 32;
    const int l = e % 32;
    const int q = (e * 7 + e / 5) % 16;
    b[16 + 32 * k + l] |= static_cast<uint8_t>(q << (4 * h));
    want[e] = d * static_cast<float>(sc[e / 32]) * static_cast<float>(q) -
              dmin * static_cast<float>(mn[e / 32]);
  }
  expect_bits_eq(decode(GgmlType::Q4_K, b, 256), want);
}

TEST(DequantUnit, Q5_K) {
  Bytes b(176);
  int sc[8];
  int mn[8];
  for (int i = 0; i < 8; ++i) {
    sc[i] = (i * 29 + 63) % 64;
    mn[i] = (i * 13 + 7) % 64;
  }
  pack_k4_scales(b.data() + 4, sc, mn);
  const float d = 0.25f;
  const float dmin = 0.5f;
  put_f16(b, 0, d);
  put_f16(b, 2, dmin);
  // As Q4_K, plus bit 4 of element e = 64k + 32h + l in bit 2k+h of qh[l].
  std::vector<float> want(256);
  for (int e = 0; e < 256; ++e) {
    const int k = e / 64;
    const int h = (e % 64) / 32;
    const int l = e % 32;
    const int q = (e * 11 + e / 3) % 32;
    b[48 + 32 * k + l] |= static_cast<uint8_t>((q & 0xF) << (4 * h));
    b[16 + l] |= static_cast<uint8_t>((q >> 4) << (2 * k + h));
    want[e] = d * static_cast<float>(sc[e / 32]) * static_cast<float>(q) -
              dmin * static_cast<float>(mn[e / 32]);
  }
  expect_bits_eq(decode(GgmlType::Q5_K, b, 256), want);
}

TEST(DequantUnit, Q6_K) {
  // Element e = 128n + 32g + l (g 0..3): low 4 bits in ql[64n + 32(g%2) + l] nibble g/2, high 2
  // bits in qh[32n + l] bits 2g, value = code - 32; sub-block e/16 uses int8 scales[e/16].
  Bytes b(210);
  int sc[16];
  for (int i = 0; i < 16; ++i) sc[i] = (i % 2 ? -1 : 1) * (i * 17 % 128);
  sc[3] = -128;
  sc[4] = 127;
  for (int i = 0; i < 16; ++i) b[192 + i] = static_cast<uint8_t>(static_cast<int8_t>(sc[i]));
  const float d = 0.5f;
  put_f16(b, 208, d);
  std::vector<float> want(256);
  for (int e = 0; e < 256; ++e) {
    const int n = e / 128;
    const int g = (e % 128) / 32;
    const int l = e % 32;
    const int code = (e * 19 + e / 11) % 64;
    b[64 * n + 32 * (g % 2) + l] |= static_cast<uint8_t>((code & 0xF) << (4 * (g / 2)));
    b[128 + 32 * n + l] |= static_cast<uint8_t>((code >> 4) << (2 * g));
    want[e] = d * static_cast<float>(sc[e / 16]) * static_cast<float>(code - 32);
  }
  expect_bits_eq(decode(GgmlType::Q6_K, b, 256), want);
}

TEST(DequantUnit, IQ4_XS) {
  // 8 sub-blocks of 32 with 6-bit scales ls (value ls - 32): low 4 bits in nibble ib%2 of
  // scales_l[ib/2] (bytes 4..7), high 2 bits in bits 2ib of the LE u16 scales_h (bytes 2..3).
  Bytes b(136);
  int ls[8];
  for (int ib = 0; ib < 8; ++ib) ls[ib] = (ib * 21 + 9) % 64;
  ls[0] = 0;
  ls[7] = 63;
  uint16_t scales_h = 0;
  for (int ib = 0; ib < 8; ++ib) {
    b[4 + ib / 2] |= static_cast<uint8_t>((ls[ib] & 0xF) << (4 * (ib % 2)));
    scales_h = static_cast<uint16_t>(scales_h | ((ls[ib] >> 4) << (2 * ib)));
  }
  put_u16(b, 2, scales_h);
  const float d = 0.5f;
  put_f16(b, 0, d);
  // Element e = 32ib + 16h + j: nibble h of qs[16ib + j].
  std::vector<float> want(256);
  for (int e = 0; e < 256; ++e) {
    const int ib = e / 32;
    const int h = (e % 32) / 16;
    const int j = e % 16;
    const int code = (e * 7 + e / 16) % 16;
    b[8 + 16 * ib + j] |= static_cast<uint8_t>(code << (4 * h));
    want[e] = d * static_cast<float>(ls[ib] - 32) * static_cast<float>(kIq4nl[code]);
  }
  expect_bits_eq(decode(GgmlType::IQ4_XS, b, 256), want);
}

TEST(DequantUnit, MultipleBlocksAndZeroLength) {
  // Three Q4_K-sized blocks of zeros decode to zeros; n = 0 writes nothing.
  Bytes b(3 * 144);
  const auto y = decode(GgmlType::Q4_K, b, 768);
  for (const float v : y) EXPECT_EQ(v, 0.0f);
  float sentinel = 7.0f;
  moe::cpu::dequantize_row(GgmlType::Q4_K, b.data(), &sentinel, 0);
  EXPECT_EQ(sentinel, 7.0f);
}

void expect_error_mentions(GgmlType type, int64_t n, const std::string& needle) {
  std::vector<uint8_t> buf(4096);
  std::vector<float> out(4096);
  try {
    moe::cpu::dequantize_row(type, buf.data(), out.data(), n);
    ADD_FAILURE() << "no error for " << moe::ggml_type_label(static_cast<uint32_t>(type))
                  << " n=" << n;
  } catch (const moe::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(DequantUnit, ErrorNonMultipleLength) {
  expect_error_mentions(GgmlType::Q4_0, 31, "q4_0");
  expect_error_mentions(GgmlType::Q4_K, 128, "q4_K");
  expect_error_mentions(GgmlType::Q2_0, 32, "q2_0");
  expect_error_mentions(GgmlType::MXFP4, 48, "mxfp4");
  expect_error_mentions(GgmlType::Q8_0, -32, "q8_0");
}

TEST(DequantUnit, ErrorNonComputableType) {
  expect_error_mentions(GgmlType::Q8_K, 256, "q8_K");
  expect_error_mentions(GgmlType::Q8_1, 32, "q8_1");
  expect_error_mentions(GgmlType::IQ2_XXS, 256, "iq2_xxs");
  expect_error_mentions(GgmlType::NVFP4, 64, "nvfp4");
  expect_error_mentions(GgmlType::Q1_0, 128, "q1_0");
  expect_error_mentions(GgmlType::I32, 4, "i32");
  expect_error_mentions(static_cast<GgmlType>(4), 32, "id 4");
  expect_error_mentions(static_cast<GgmlType>(77), 32, "id 77");
}

TEST(DequantUnit, EveryComputableTypeDecodes) {
  // Every id marked computable must have a decoder (a zero block decodes to zeros).
  for (uint32_t id = 0; id < 64; ++id) {
    const auto info = moe::ggml_type_info(id);
    if (!info || !info->computable) continue;
    SCOPED_TRACE(moe::ggml_type_label(id));
    Bytes b(info->type_size * 2);
    const auto y = decode(static_cast<GgmlType>(id), b, 2 * info->block_size);
    for (const float v : y) EXPECT_EQ(v, 0.0f);
  }
  EXPECT_EQ(block_bytes(GgmlType::Q2_0), 18u);
}

}  // namespace
