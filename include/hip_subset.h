/* The few HIP runtime declarations libvgpu_hip's C clients use (tests, benchmarks). Written from
 * ROCm 5.2's hip_runtime_api.h (Debian 12's libamdhip64-dev) and, for the 6.x additions
 * (hipGetProcAddress, hipGetDevicePropertiesR0600, the 6.x hipMemAllocationProp), from AMD's
 * documentation; no hipcc is needed. */
#ifndef VGPU_HIP_SUBSET_H
#define VGPU_HIP_SUBSET_H

#include <stddef.h>
#include <stdint.h>

typedef int hipError_t;
typedef int hipDevice_t;
typedef void *hipStream_t;
typedef void *hipMemPool_t;
typedef void *hipArray_t;
typedef unsigned long long hipMemGenericAllocationHandle_t; /* an opaque pointer in the header */
typedef struct { char bytes[16]; } hipUUID;

#define hipSuccess 0
#define hipErrorInvalidValue 1
#define hipErrorOutOfMemory 2
#define hipErrorNoDevice 100
#define hipErrorInvalidDevice 101
#define hipErrorNotFound 500

/* hipDeviceProp_t: ROCm 5.x (792 bytes, totalGlobalMem at 256); 6.x R0600 (totalGlobalMem at 288;
 * its full size is not in a header here, so callers pass a generous buffer). */
#define HIP_PROP_R0000_TOTAL 256
#define HIP_PROP_R0600_TOTAL 288
#define HIP_PROP_BUFFER 4096

typedef struct { int x, y, z, w, f; } hipChannelFormatDesc;
typedef struct { size_t width, height, depth; } hipExtent;
typedef struct { void *ptr; size_t pitch, xsize, ysize; } hipPitchedPtr;
typedef struct { size_t Width, Height; int Format; unsigned NumChannels; } HIP_ARRAY_DESCRIPTOR;
typedef struct { size_t Width, Height, Depth; int Format; unsigned NumChannels, Flags; } HIP_ARRAY3D_DESCRIPTOR;
#define HIP_AD_FORMAT_FLOAT 0x20
#define hipChannelFormatKindFloat 2

/* hipMemAllocationProp, 32 bytes: ROCm 5.x starts with unsigned char compressionType, then
 * hipMemLocation {int type; int id;} at 4; ROCm 6.x starts with int type, int
 * requestedHandleType, then the location at 8. */
typedef struct { unsigned char bytes[32]; } hipMemAllocationProp;
#define hipMemLocationTypeDevice 1
#define hipMemAllocationTypePinned 1

/* hipGetProcAddress (HIP 6.2): version = major*10000000 + minor*100000 + patch. */
#define HIP_GET_PROC_ADDRESS_DEFAULT 0
typedef enum {
    HIP_GET_PROC_ADDRESS_SUCCESS = 0,
    HIP_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
    HIP_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2
} hipDriverProcAddressQueryResult;

hipError_t hipInit(unsigned flags);
hipError_t hipRuntimeGetVersion(int *version);
hipError_t hipGetDeviceCount(int *count);
hipError_t hipGetDevice(int *device);
hipError_t hipSetDevice(int device);
hipError_t hipDeviceGetUuid(hipUUID *uuid, hipDevice_t device);
hipError_t hipMemGetInfo(size_t *free, size_t *total);
hipError_t hipDeviceTotalMem(size_t *bytes, hipDevice_t device);
hipError_t hipGetDeviceProperties(void *prop, int device);
hipError_t hipGetDevicePropertiesR0600(void *prop, int device);
hipError_t hipMalloc(void **ptr, size_t size);
hipError_t hipFree(void *ptr);
hipError_t hipExtMallocWithFlags(void **ptr, size_t size, unsigned flags);
hipError_t hipMallocManaged(void **ptr, size_t size, unsigned flags);
hipError_t hipMallocPitch(void **ptr, size_t *pitch, size_t width, size_t height);
hipError_t hipMemAllocPitch(void **ptr, size_t *pitch, size_t width, size_t height, unsigned element);
hipError_t hipMalloc3D(hipPitchedPtr *pitched, hipExtent extent);
hipError_t hipMallocAsync(void **ptr, size_t size, hipStream_t stream);
hipError_t hipMallocFromPoolAsync(void **ptr, size_t size, hipMemPool_t pool, hipStream_t stream);
hipError_t hipFreeAsync(void *ptr, hipStream_t stream);
hipError_t hipDeviceGetDefaultMemPool(hipMemPool_t *pool, int device);
hipError_t hipHostMalloc(void **ptr, size_t size, unsigned flags);
hipError_t hipHostFree(void *ptr);
hipError_t hipMallocArray(hipArray_t *array, const hipChannelFormatDesc *desc, size_t width, size_t height,
                          unsigned flags);
hipError_t hipMalloc3DArray(hipArray_t *array, const hipChannelFormatDesc *desc, hipExtent extent, unsigned flags);
hipError_t hipArrayCreate(hipArray_t *array, const HIP_ARRAY_DESCRIPTOR *desc);
hipError_t hipArray3DCreate(hipArray_t *array, const HIP_ARRAY3D_DESCRIPTOR *desc);
hipError_t hipFreeArray(hipArray_t array);
typedef void *hipMipmappedArray_t;
hipError_t hipMallocMipmappedArray(hipMipmappedArray_t *array, const hipChannelFormatDesc *desc, hipExtent extent,
                                   unsigned levels, unsigned flags);
hipError_t hipMipmappedArrayCreate(hipMipmappedArray_t *array, HIP_ARRAY3D_DESCRIPTOR *desc, unsigned levels);
hipError_t hipFreeMipmappedArray(hipMipmappedArray_t array);
hipError_t hipMipmappedArrayDestroy(hipMipmappedArray_t array);
hipError_t hipArrayDestroy(hipArray_t array);
hipError_t hipMemCreate(hipMemGenericAllocationHandle_t *handle, size_t size, const hipMemAllocationProp *prop,
                        unsigned long long flags);
hipError_t hipMemRelease(hipMemGenericAllocationHandle_t handle);
hipError_t hipMemAddressReserve(void **ptr, size_t size, size_t alignment, void *addr, unsigned long long flags);
hipError_t hipMemAddressFree(void *ptr, size_t size);
hipError_t hipMemMap(void *ptr, size_t size, size_t offset, hipMemGenericAllocationHandle_t handle,
                     unsigned long long flags);
hipError_t hipMemUnmap(void *ptr, size_t size);
hipError_t hipMemRetainAllocationHandle(hipMemGenericAllocationHandle_t *handle, void *ptr);
typedef struct { uint32_t x, y, z; } dim3;
typedef void *hipFunction_t;
typedef void *hipGraphExec_t;
hipError_t hipLaunchKernel(const void *function, dim3 grid, dim3 block, void **args, size_t shared, hipStream_t stream);
hipError_t hipModuleLaunchKernel(hipFunction_t f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                 unsigned bz, unsigned shared, hipStream_t stream, void **params, void **extra);
hipError_t hipGraphLaunch(hipGraphExec_t graph, hipStream_t stream);
hipError_t hipLaunchKernel_spt(const void *function, dim3 grid, dim3 block, void **args, size_t shared,
                               hipStream_t stream);
hipError_t hipLaunchCooperativeKernel(const void *function, dim3 grid, dim3 block, void **args, unsigned shared,
                                      hipStream_t stream);
hipError_t hipExtLaunchKernel(const void *function, dim3 grid, dim3 block, void **args, size_t shared,
                              hipStream_t stream, void *start, void *stop, int flags);
hipError_t hipDeviceSynchronize(void);
hipError_t hipDeviceReset(void);
#define hipMemcpyHostToDevice 1
#define hipMemcpyDeviceToHost 2
#define hipMemcpyDeviceToDevice 3
#define hipMemcpyDefault 4
typedef struct { size_t x, y, z; } hipPos;
typedef struct {
    hipArray_t srcArray;
    hipPos srcPos;
    hipPitchedPtr srcPtr;
    hipArray_t dstArray;
    hipPos dstPos;
    hipPitchedPtr dstPtr;
    hipExtent extent;
    int kind;
} hipMemcpy3DParms;
/* hip_Memcpy2D: the memory types are hipMemoryType values, which changed in ROCm 6.0 (device: 1 in
 * 5.x, 2 in 6.x). */
typedef struct {
    size_t srcXInBytes, srcY;
    int srcMemoryType;
    const void *srcHost;
    void *srcDevice;
    hipArray_t srcArray;
    size_t srcPitch;
    size_t dstXInBytes, dstY;
    int dstMemoryType;
    void *dstHost;
    void *dstDevice;
    hipArray_t dstArray;
    size_t dstPitch;
    size_t WidthInBytes, Height;
} hip_Memcpy2D;
/* HIP_MEMCPY3D (hipDrvMemcpy3D): its positions, pitches and sizes are unsigned int in ROCm 5.x (128
 * bytes) and size_t from 6.0 (184 bytes); memory types as in hip_Memcpy2D. */
#define HIP_MEMCPY3D_FIELDS(W)                                                                          \
    W srcXInBytes, srcY, srcZ, srcLOD;                                                                 \
    int srcMemoryType;                                                                                 \
    const void *srcHost;                                                                               \
    void *srcDevice;                                                                                   \
    hipArray_t srcArray;                                                                               \
    W srcPitch, srcHeight;                                                                             \
    W dstXInBytes, dstY, dstZ, dstLOD;                                                                 \
    int dstMemoryType;                                                                                 \
    void *dstHost;                                                                                     \
    void *dstDevice;                                                                                   \
    hipArray_t dstArray;                                                                               \
    W dstPitch, dstHeight;                                                                             \
    W WidthInBytes, Height, Depth;
typedef struct { HIP_MEMCPY3D_FIELDS(unsigned int) } HIP_MEMCPY3D_R5;
typedef struct { HIP_MEMCPY3D_FIELDS(size_t) } HIP_MEMCPY3D_R6;
/* Either layout, by the runtime's version. */
hipError_t hipDrvMemcpy3D(const void *p);
hipError_t hipDrvMemcpy3DAsync(const void *p, hipStream_t stream);
/* Copies to and from a symbol (a __device__ variable's address); ROCm 5.2 exports the synchronous
 * _spt forms, 6.x also the asynchronous ones. */
hipError_t hipMemcpyToSymbol(const void *symbol, const void *src, size_t size, size_t offset, int kind);
hipError_t hipMemcpyToSymbolAsync(const void *symbol, const void *src, size_t size, size_t offset, int kind,
                                  hipStream_t stream);
hipError_t hipMemcpyToSymbol_spt(const void *symbol, const void *src, size_t size, size_t offset, int kind);
hipError_t hipMemcpyToSymbolAsync_spt(const void *symbol, const void *src, size_t size, size_t offset, int kind,
                                      hipStream_t stream);
hipError_t hipMemcpyFromSymbol(void *dst, const void *symbol, size_t size, size_t offset, int kind);
hipError_t hipMemcpyFromSymbolAsync(void *dst, const void *symbol, size_t size, size_t offset, int kind,
                                    hipStream_t stream);
hipError_t hipMemcpyFromSymbol_spt(void *dst, const void *symbol, size_t size, size_t offset, int kind);
hipError_t hipMemcpyFromSymbolAsync_spt(void *dst, const void *symbol, size_t size, size_t offset, int kind,
                                        hipStream_t stream);
hipError_t hipMemcpyWithStream(void *dst, const void *src, size_t size, int kind, hipStream_t stream);
hipError_t hipMemcpy_spt(void *dst, const void *src, size_t size, int kind);
hipError_t hipMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height, int kind);
hipError_t hipMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                            int kind, hipStream_t stream);
hipError_t hipMemcpy2D_spt(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                           int kind);
hipError_t hipMemcpy2DToArray(hipArray_t dst, size_t w_offset, size_t h_offset, const void *src, size_t spitch,
                              size_t width, size_t height, int kind);
hipError_t hipMemcpy2DFromArray(void *dst, size_t dpitch, hipArray_t src, size_t w_offset, size_t h_offset,
                                size_t width, size_t height, int kind);
hipError_t hipMemcpy3D(const hipMemcpy3DParms *p);
hipError_t hipMemcpy3DAsync(const hipMemcpy3DParms *p, hipStream_t stream);
hipError_t hipMemcpyParam2D(const hip_Memcpy2D *p);
hipError_t hipMemcpyPeer(void *dst, int dst_device, const void *src, int src_device, size_t size);
hipError_t hipMemset2D(void *dst, size_t pitch, int value, size_t width, size_t height);
hipError_t hipMemset2DAsync(void *dst, size_t pitch, int value, size_t width, size_t height, hipStream_t stream);
hipError_t hipMemset3D(hipPitchedPtr pitched, int value, hipExtent extent);
hipError_t hipMemset3DAsync(hipPitchedPtr pitched, int value, hipExtent extent, hipStream_t stream);
hipError_t hipMemsetD16(void *dst, unsigned short value, size_t count);
hipError_t hipMemcpy(void *dst, const void *src, size_t size, int kind);
hipError_t hipMemcpyAsync(void *dst, const void *src, size_t size, int kind, hipStream_t stream);
hipError_t hipMemcpyDtoD(void *dst, void *src, size_t size);
hipError_t hipMemcpyDtoDAsync(void *dst, void *src, size_t size, hipStream_t stream);
hipError_t hipMemset(void *dst, int value, size_t size);
hipError_t hipMemsetAsync(void *dst, int value, size_t size, hipStream_t stream);
hipError_t hipMemsetD8(void *dst, unsigned char value, size_t count);
hipError_t hipMemsetD8Async(void *dst, unsigned char value, size_t count, hipStream_t stream);
hipError_t hipMemsetD32(void *dst, int value, size_t count);
hipError_t hipMemsetD32Async(void *dst, int value, size_t count, hipStream_t stream);
/* Stream-ordered pools. hipMemPoolProps is 88 bytes in ROCm 5.x and 6.x: allocType, handleTypes,
 * then hipMemLocation {int type; int id;} at 8. */
typedef struct { unsigned char bytes[88]; } hipMemPoolProps;
#define hipMemPoolAttrReleaseThreshold 4
#define hipMemPoolAttrReservedMemCurrent 5
#define hipMemPoolAttrUsedMemCurrent 7
hipError_t hipDeviceGetMemPool(hipMemPool_t *pool, int device);
hipError_t hipDeviceSetMemPool(int device, hipMemPool_t pool);
hipError_t hipMemPoolCreate(hipMemPool_t *pool, const hipMemPoolProps *props);
hipError_t hipMemPoolDestroy(hipMemPool_t pool);
hipError_t hipMemPoolTrimTo(hipMemPool_t pool, size_t keep);
hipError_t hipMemPoolSetAttribute(hipMemPool_t pool, int attribute, void *value);
hipError_t hipMemPoolGetAttribute(hipMemPool_t pool, int attribute, void *value);
hipError_t hipStreamCreate(hipStream_t *stream);
hipError_t hipStreamDestroy(hipStream_t stream);
hipError_t hipStreamSynchronize(hipStream_t stream);
hipError_t hipGetLastError(void);
hipError_t hipPeekAtLastError(void);

hipError_t hipGetProcAddress(const char *symbol, void **pfn, int hipVersion, uint64_t flags,
                             hipDriverProcAddressQueryResult *symbolStatus);

#endif
