#include "core/cuda/cuda_device_memory.h"

#include <algorithm>

#include <cuda.h>
#include <cuda_runtime.h>

#include "core/cuda/check.h"
#include "core/device_runtime.h"

namespace mg::cuda {

using namespace allocator;  // this backend serves the caching allocator (core/allocator/)

namespace {
// Driver entry points fetched at run time, so binaries never link libcuda.so directly
// (they must start on machines without a driver).
struct DriverApi {
  decltype(&cuMemCreate) mem_create = nullptr;
  decltype(&cuMemRelease) mem_release = nullptr;
  decltype(&cuMemMap) mem_map = nullptr;
  decltype(&cuMemUnmap) mem_unmap = nullptr;
  decltype(&cuMemSetAccess) mem_set_access = nullptr;
  decltype(&cuMemAddressReserve) addr_reserve = nullptr;
  decltype(&cuMemAddressFree) addr_free = nullptr;
  decltype(&cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&cuDeviceGetAttribute) device_attr = nullptr;
  bool ok = false;
};

template <class F>
bool load(const char* sym, F* out) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion(sym, &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess || !p) {
    (void)cudaGetLastError();
    return false;
  }
  *out = reinterpret_cast<F>(p);
  return true;
}

const DriverApi& driver() {
  static DriverApi api = [] {
    DriverApi a;
    a.ok = load("cuMemCreate", &a.mem_create) && load("cuMemRelease", &a.mem_release) && load("cuMemMap", &a.mem_map) &&
           load("cuMemUnmap", &a.mem_unmap) && load("cuMemSetAccess", &a.mem_set_access) &&
           load("cuMemAddressReserve", &a.addr_reserve) && load("cuMemAddressFree", &a.addr_free) &&
           load("cuMemGetAllocationGranularity", &a.granularity) && load("cuDeviceGetAttribute", &a.device_attr);
    return a;
  }();
  return api;
}

void drv_check(CUresult r, const char* call) {
  MG_CHECK(r == CUDA_SUCCESS, CudaError, call, " failed with CUresult ", static_cast<int>(r));
}

CUmemAllocationProp prop_for(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}
}  // namespace

CudaDeviceMemory::CudaDeviceMemory(int device, std::size_t map_unit) : device_(device) {
  name_ = get_device_properties(device).name;
  const DriverApi& d = driver();
  if (d.ok) {
    int vmm = 0;
    if (d.device_attr(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device) == CUDA_SUCCESS && vmm) {
      CUmemAllocationProp prop = prop_for(device);
      size_t g = 0;
      if (d.granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) == CUDA_SUCCESS && g > 0) {
        granularity_ = (std::max(map_unit, g) + g - 1) / g * g;
        vm_ok_ = true;
      }
    }
    (void)cudaGetLastError();
  }
}

void* CudaDeviceMemory::malloc(std::size_t bytes) {
  DeviceGuard g(device_);
  void* p = nullptr;
  // A captured graph's pool may need a new segment during the capture. cudaMalloc is not a
  // stream operation (the graph only records the address), but the default capture mode
  // rejects it as potentially unsafe: allow it for this one call.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  MG_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  cudaError_t e = cudaMalloc(&p, bytes);
  MG_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return nullptr;
  }
  MG_CUDA_CHECK(e);
  return p;
}

void CudaDeviceMemory::free(void* ptr) {
  DeviceGuard g(device_);
  MG_CUDA_CHECK(cudaFree(ptr));
}

void CudaDeviceMemory::mem_get_info(std::size_t* free_bytes, std::size_t* total_bytes) {
  DeviceGuard g(device_);
  MG_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
}

EventId CudaDeviceMemory::record_event(StreamId stream) {
  DeviceGuard g(device_);
  cudaEvent_t e = nullptr;
  MG_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  MG_CUDA_CHECK(cudaEventRecord(e, reinterpret_cast<cudaStream_t>(stream)));
  return reinterpret_cast<EventId>(e);
}

bool CudaDeviceMemory::event_query(EventId event) {
  return MG_CUDA_QUERY(cudaEventQuery(reinterpret_cast<cudaEvent_t>(event)));
}

void CudaDeviceMemory::event_synchronize(EventId event) {
  MG_CUDA_CHECK(cudaEventSynchronize(reinterpret_cast<cudaEvent_t>(event)));
}

void CudaDeviceMemory::destroy_event(EventId event) {
  MG_CUDA_CHECK(cudaEventDestroy(reinterpret_cast<cudaEvent_t>(event)));
}

bool CudaDeviceMemory::supports_virtual_memory() const { return vm_ok_; }

void* CudaDeviceMemory::reserve_address(std::size_t bytes) {
  CUdeviceptr p = 0;
  if (driver().addr_reserve(&p, bytes, granularity_, 0, 0) != CUDA_SUCCESS) return nullptr;
  return reinterpret_cast<void*>(p);
}

// One physical handle per granularity page, because the allocator may later unmap any page on
// its own (a free hole inside an expandable segment). The access rights are set with one call
// for the whole range: cuMemSetAccess accepts a range spanning many mappings, and it is as
// expensive per call as the create and map together.
bool CudaDeviceMemory::map(void* addr, std::size_t bytes) {
  const DriverApi& d = driver();
  CUmemAllocationProp prop = prop_for(device_);
  const auto base = reinterpret_cast<std::uintptr_t>(addr);
  for (std::size_t off = 0; off < bytes; off += granularity_) {
    CUmemGenericAllocationHandle h = 0;
    const CUresult r = d.mem_create(&h, granularity_, &prop, 0);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
      release_pages(base, off);  // all or nothing; no kernel has seen these pages
      return false;
    }
    drv_check(r, "cuMemCreate");
    const CUresult m = d.mem_map(static_cast<CUdeviceptr>(base + off), granularity_, 0, h, 0);
    if (m != CUDA_SUCCESS) {
      (void)d.mem_release(h);
      release_pages(base, off);
      drv_check(m, "cuMemMap");
    }
    page_handles_[base + off] = h;
  }
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const CUresult a = d.mem_set_access(static_cast<CUdeviceptr>(base), bytes, &access, 1);
  if (a != CUDA_SUCCESS) {
    release_pages(base, bytes);
    drv_check(a, "cuMemSetAccess");
  }
  return true;
}

// A segment can outlive the Stream it was made for (its blocks were freed, then the stream was
// destroyed): the handle is then invalid, and the work it had queued is only reachable through
// the device, so wait for that instead.
void CudaDeviceMemory::synchronize_stream(StreamId stream) {
  DeviceGuard g(device_);
  const cudaError_t e = cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream));
  if (e == cudaErrorInvalidResourceHandle) {
    (void)cudaGetLastError();
    MG_CUDA_CHECK(cudaDeviceSynchronize());
    return;
  }
  MG_CUDA_CHECK(e);
}

// cuMemUnmap does not wait for queued kernels that may still read the pages: the allocator
// synchronizes the stream that last used them first (CachingAllocator::wait_before_unmap), so
// no device-wide synchronization happens here.
void CudaDeviceMemory::unmap(void* addr, std::size_t bytes) {
  release_pages(reinterpret_cast<std::uintptr_t>(addr), bytes);
}

void CudaDeviceMemory::release_pages(std::uintptr_t base, std::size_t bytes) {
  const DriverApi& d = driver();
  for (std::size_t off = 0; off < bytes; off += granularity_) {
    auto it = page_handles_.find(base + off);
    MG_CHECK(it != page_handles_.end(), CudaError, "unmap: page at ", base + off, " was not mapped");
    drv_check(d.mem_unmap(static_cast<CUdeviceptr>(base + off), granularity_), "cuMemUnmap");
    drv_check(d.mem_release(it->second), "cuMemRelease");
    page_handles_.erase(it);
  }
}

void CudaDeviceMemory::release_address(void* addr, std::size_t bytes) {
  drv_check(driver().addr_free(reinterpret_cast<CUdeviceptr>(addr), bytes), "cuMemAddressFree");
}

}  // namespace mg::cuda
