/* Device discovery, and the mapping from CUDA runtime errors to prism_status that every .cu
 * file reaches through PRISM_CUDA_CHECK. */
#include "prism/cuda.h"

#include <string.h>

/* The errors that mean "no usable GPU here" rather than "this call was wrong": a process on a
 * machine without a driver or device must be able to tell the two apart and fall back to the
 * CPU kernels. */
static prism_status status_of(cudaError_t rc)
{
    switch (rc) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInitializationError:
    case cudaErrorStubLibrary:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemNotReady:
        return PRISM_ERR_UNAVAILABLE;
    case cudaErrorMemoryAllocation:
        return PRISM_ERR_NOMEM;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidConfiguration:
        return PRISM_ERR_INVALID;
    default:
        return PRISM_ERR_STATE;
    }
}

prism_status prism_cuda_error(prism_error *err, cudaError_t rc, const char *call, const char *file,
                              int line)
{
    const char *base = strrchr(file, '/');
    (void)cudaGetLastError();
    return prism_error_set(err, status_of(rc), "%s:%d: %s: %s (%s)", base ? base + 1 : file, line,
                           call, cudaGetErrorString(rc), cudaGetErrorName(rc));
}

prism_status prism_cuda_device_count(int *count, prism_error *err)
{
    if (!count)
        return prism_error_set(err, PRISM_ERR_INVALID, "prism_cuda_device_count: count is NULL");
    *count = 0;
    int n = 0;
    PRISM_CUDA_CHECK(cudaGetDeviceCount(&n));
    if (n <= 0)
        return prism_error_set(err, PRISM_ERR_UNAVAILABLE, "no CUDA device is visible");
    *count = n;
    return PRISM_OK;
}

prism_status prism_cuda_device_name(int device, char *buf, size_t len, prism_error *err)
{
    if (!buf || len == 0)
        return prism_error_set(err, PRISM_ERR_INVALID,
                               "prism_cuda_device_name: no room for the name");
    buf[0] = '\0';
    if (device < 0)
        return prism_error_set(err, PRISM_ERR_INVALID, "CUDA device %d does not exist", device);
    cudaDeviceProp prop;
    PRISM_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    size_t n = strnlen(prop.name, sizeof prop.name);
    if (n >= len)
        n = len - 1;
    memcpy(buf, prop.name, n);
    buf[n] = '\0';
    return PRISM_OK;
}
