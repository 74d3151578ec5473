__global__ void gpudash_probe(float *x) { x[threadIdx.x] *= 2.0f; }
