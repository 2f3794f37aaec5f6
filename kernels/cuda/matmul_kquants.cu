// Weight-product kernels (matmul_kernels.cuh) for the 256-element K-quant block types.
#include "kernels/cuda/matmul_kernels.cuh"

namespace moe::cuda::detail {

template void launch_weight_product_typed<dq::Q2_K>(const WeightProduct&, cudaStream_t);
template void launch_weight_product_typed<dq::Q3_K>(const WeightProduct&, cudaStream_t);
template void launch_weight_product_typed<dq::Q4_K>(const WeightProduct&, cudaStream_t);
template void launch_weight_product_typed<dq::Q5_K>(const WeightProduct&, cudaStream_t);
template void launch_weight_product_typed<dq::Q6_K>(const WeightProduct&, cudaStream_t);
template void launch_weight_product_typed<dq::IQ4_XS>(const WeightProduct&, cudaStream_t);

}  // namespace moe::cuda::detail
