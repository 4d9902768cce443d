/* A driver for test_missing_barrier: prism_relative_error_cuda of two 1M-element tensors on the
 * emulated device, printed. Linked twice, with the real kernels/cuda/relative_error.cu and with a
 * copy that lacks one __syncthreads. */
#include "prism/cuda.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

int main(void)
{
    enum { N = 1 << 20 };
    float *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b);
    if (!a || !b)
        return 2;
    for (int i = 0; i < N; i++) {
        a[i] = (float)(i % 1000) - 500.0f;
        b[i] = a[i] + (float)(i % 7) * 0.25f;
    }
    float *da = NULL, *db = NULL;
    double *dout = NULL, out = 0;
    if (cudaMalloc((void **)&da, N * sizeof *a) || cudaMalloc((void **)&db, N * sizeof *b) ||
        cudaMalloc((void **)&dout, sizeof out) || cudaMemcpy(da, a, N * sizeof *a, cudaMemcpyHostToDevice) ||
        cudaMemcpy(db, b, N * sizeof *b, cudaMemcpyHostToDevice))
        return 2;
    prism_tensor ta = {da, N, PRISM_DTYPE_F32}, tb = {db, N, PRISM_DTYPE_F32};
    prism_error err;
    if (prism_relative_error_cuda(&ta, &tb, dout, NULL, &err) != PRISM_OK) {
        fprintf(stderr, "%s\n", err.message);
        return 2;
    }
    if (cudaMemcpy(&out, dout, sizeof out, cudaMemcpyDeviceToHost))
        return 2;
    printf("relative error %.17g\n", out);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dout);
    free(a);
    free(b);
    return 0;
}
