// Memory domains for direct writes: workers with equal domains can map each
// other's registered buffers (Backend::MemoryDomain).
#ifndef WSYNC_WORKER_PLANE_MEMORY_DOMAIN_H_
#define WSYNC_WORKER_PLANE_MEMORY_DOMAIN_H_

#include <string>

namespace wsync::plane {

// Host workers that see the same /dev/shm of the same boot ("shm:...").
// Empty when it cannot be determined (then no direct writes).
std::string HostMemoryDomain();
// GPU workers of the same boot and PID namespace (legacy CUDA IPC needs
// it, "cuda:...").
std::string GpuMemoryDomain();

}  // namespace wsync::plane

#endif  // WSYNC_WORKER_PLANE_MEMORY_DOMAIN_H_
