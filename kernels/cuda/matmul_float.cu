// Weight-product kernels (matmul_kernels.cuh) for the float types.
#include "kernels/cuda/matmul_kernels.cuh"

namespace moe::cuda::detail {

template void launch_weight_product_typed<dq::F32>(const WeightProduct&, cudaStream_t);
template void launch_weight_product_typed<dq::F16>(const WeightProduct&, cudaStream_t);
template void launch_weight_product_typed<dq::BF16>(const WeightProduct&, cudaStream_t);

}  // namespace moe::cuda::detail
