// Weight-product kernels (matmul_kernels.cuh) for the 32- and 64-element block types.
#include "kernels/cuda/matmul_kernels.cuh"

namespace moe::cuda::detail {

template void launch_weight_product_typed<dq::Q8_0>(const WeightProduct&, cudaStream_t);
template void launch_weight_product_typed<dq::Q4_0>(const WeightProduct&, cudaStream_t);
template void launch_weight_product_typed<dq::Q4_1>(const WeightProduct&, cudaStream_t);
template void launch_weight_product_typed<dq::Q5_0>(const WeightProduct&, cudaStream_t);
template void launch_weight_product_typed<dq::Q5_1>(const WeightProduct&, cudaStream_t);
template void launch_weight_product_typed<dq::IQ4_NL>(const WeightProduct&, cudaStream_t);
template void launch_weight_product_typed<dq::MXFP4>(const WeightProduct&, cudaStream_t);
template void launch_weight_product_typed<dq::Q2_0>(const WeightProduct&, cudaStream_t);

}  // namespace moe::cuda::detail
