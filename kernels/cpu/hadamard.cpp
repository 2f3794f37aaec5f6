// The fast Walsh-Hadamard transform: log2(block) butterfly passes, Sylvester (natural) order.
#include "kernels/cpu/hadamard.h"

#include <cmath>

#include "common/error.h"

namespace moe::cpu {

void hadamard_blocks(float* x, int64_t n, int64_t block) {
  if (block < 1 || (block & (block - 1)) != 0 || n % block != 0) {
    throw Error("hadamard_blocks: block " + std::to_string(block) +
                " is not a power of two dividing " + std::to_string(n));
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(block));
  for (float* b = x; b < x + n; b += block) {
    for (int64_t h = 1; h < block; h *= 2) {
      for (int64_t i = 0; i < block; i += 2 * h) {
        for (int64_t j = i; j < i + h; ++j) {
          const float a = b[j], c = b[j + h];
          b[j] = a + c;
          b[j + h] = a - c;
        }
      }
    }
    for (int64_t i = 0; i < block; ++i) b[i] *= scale;
  }
}

int64_t hadamard_block_k(int64_t head_dim) {
  if (head_dim < 64 || head_dim % 64 != 0) return 0;
  int64_t b = 64;
  while (head_dim % (2 * b) == 0) b *= 2;
  return b;
}

int64_t hadamard_block_v(int64_t head_dim) { return head_dim >= 64 && head_dim % 64 == 0 ? 64 : 0; }

}  // namespace moe::cpu
