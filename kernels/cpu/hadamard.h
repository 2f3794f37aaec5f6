// The normalized Walsh-Hadamard transform that rotates K, V and q before a quantized KV cache
// (llama.cpp's default since b10587): spreading each head's outliers over its block lowers the
// quantization error, and the transform is orthogonal and its own inverse, so q·k is unchanged
// and a rotated V's attention output is rotated back by the same transform.
#pragma once

#include <cstdint>

namespace moe::cpu {

// x[0, n) in consecutive blocks of `block` values (a power of two dividing n), each multiplied by
// the Sylvester-ordered Hadamard matrix scaled by 1/sqrt(block). In place.
void hadamard_blocks(float* x, int64_t n, int64_t block);

// The block a K row of this head size is rotated in: the largest power of two >= 64 dividing it
// (0: not a multiple of 64, no rotation). V rows use 64 whenever the head size is a multiple of 64.
int64_t hadamard_block_k(int64_t head_dim);
int64_t hadamard_block_v(int64_t head_dim);

}  // namespace moe::cpu
