#include "engine/cuda_runtime.h"

#include <dlfcn.h>

#include <cstdlib>
#include <vector>

#include "engine/host_registration.h"

namespace stoker {
namespace {

template <typename Fn>
bool Bind(void* library, const char* name, Fn*& fn) {
  fn = reinterpret_cast<Fn*>(::dlsym(library, name));
  return fn != nullptr;
}

// Binds every call; the name of the first one missing, or nullptr.
const char* BindAll(void* h, CudaRuntime::Api& a) {
#define STOKER_BIND(name) \
  if (!Bind(h, #name, a.name)) return #name
  STOKER_BIND(cudaGetDeviceCount);
  STOKER_BIND(cudaGetDevice);
  STOKER_BIND(cudaSetDevice);
  STOKER_BIND(cudaHostRegister);
  STOKER_BIND(cudaHostUnregister);
  STOKER_BIND(cudaMalloc);
  STOKER_BIND(cudaFree);
  STOKER_BIND(cudaMemGetInfo);
  STOKER_BIND(cudaStreamCreateWithFlags);
  STOKER_BIND(cudaStreamDestroy);
  STOKER_BIND(cudaStreamSynchronize);
  STOKER_BIND(cudaStreamWaitEvent);
  STOKER_BIND(cudaMemcpyAsync);
  STOKER_BIND(cudaEventCreateWithFlags);
  STOKER_BIND(cudaEventDestroy);
  STOKER_BIND(cudaEventRecord);
  STOKER_BIND(cudaEventQuery);
  STOKER_BIND(cudaEventSynchronize);
  STOKER_BIND(cudaGetErrorString);
#undef STOKER_BIND
  return nullptr;
}

}  // namespace

Result<std::shared_ptr<const CudaRuntime>> CudaRuntime::Load() {
  std::vector<std::string> names;
  if (const char* forced = std::getenv("STOKER_CUDART"); forced != nullptr && *forced != '\0') {
    names.emplace_back(forced);
  } else {
    names = {"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11"};
  }
  std::string tried;
  for (const std::string& name : names) {
    void* handle = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = ::dlerror();
      tried += (tried.empty() ? "" : "; ") + (why != nullptr ? std::string(why) : name);
      continue;
    }
    std::shared_ptr<CudaRuntime> cuda(new CudaRuntime());
    if (const char* missing = BindAll(handle, cuda->api_); missing != nullptr) {
      return Unavailable("the CUDA runtime " + name + " lacks " + missing);
    }
    cuda->path_ = name;
    return std::shared_ptr<const CudaRuntime>(std::move(cuda));
  }
  return Unavailable("the CUDA runtime could not be loaded (" + tried +
                     "); install the CUDA runtime or set STOKER_CUDART to libcudart's path");
}

Result<int> CudaRuntime::Devices() const {
  int count = 0;
  if (Status st = Check(api_.cudaGetDeviceCount(&count), "cudaGetDeviceCount"); !st.ok()) {
    return st.WithContext("no usable CUDA device (" + path_ + ")");
  }
  return count;
}

Status CudaRuntime::Check(int rc, const std::string& call) const {
  if (rc == kSuccess) return Status::Ok();
  const char* text = api_.cudaGetErrorString(rc);
  std::string message = call + ": " + (text != nullptr ? text : "unknown error") + " (error " +
                        std::to_string(rc) + ")";
  if (rc == kErrorMemoryAllocation) return ResourceExhausted(std::move(message));
  if (rc == kErrorInsufficientDriver || rc == kErrorNoDevice) {
    message += ": no NVIDIA GPU and driver that CUDA can use on this machine";  // 35 says less
  }
  return Unavailable(std::move(message));
}

CudaDeviceGuard::CudaDeviceGuard(const CudaRuntime& cuda, int device) : cuda_(cuda) {
  if (cuda_.api().cudaGetDevice(&previous_) != CudaRuntime::kSuccess) previous_ = -1;
  if (previous_ == device) return;
  status_ = cuda_.Check(cuda_.api().cudaSetDevice(device),
                        "cudaSetDevice(" + std::to_string(device) + ")");
}

CudaDeviceGuard::~CudaDeviceGuard() {
  int now = -1;
  if (previous_ >= 0 && cuda_.api().cudaGetDevice(&now) == CudaRuntime::kSuccess &&
      now != previous_) {
    cuda_.api().cudaSetDevice(previous_);
  }
}

Result<std::shared_ptr<const CudaRuntime>> LoadCudaRuntime() { return CudaRuntime::Load(); }

Result<std::unique_ptr<HostRegistration>> HostRegistration::Make(
    std::shared_ptr<const CudaRuntime> cuda, void* addr, size_t bytes, const std::string& what) {
  STOKER_RETURN_IF_ERROR(
      cuda->Check(cuda->api().cudaHostRegister(addr, bytes, 0),
                  "cudaHostRegister of " + what + " (" + std::to_string(bytes) + " bytes)")
          .WithContext("option 'pin_memory'"));
  return std::unique_ptr<HostRegistration>(new HostRegistration(std::move(cuda), addr));
}

HostRegistration::~HostRegistration() { (void)cuda_->api().cudaHostUnregister(addr_); }

}  // namespace stoker
