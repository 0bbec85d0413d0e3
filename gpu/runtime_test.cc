#include "gpu/runtime.h"

#include <unistd.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace gcomp::gpu {
namespace {

// Tagged `gpu`: on machines without a device every test skips with the reason.
#define GCOMP_REQUIRE_GPU()                                              \
  do {                                                                   \
    if (!Available()) {                                                  \
      GTEST_SKIP() << "no GPU: " << AvailabilityStatus().message();      \
    }                                                                    \
  } while (0)

TEST(GpuRuntime, AvailabilityIsConsistentAndNeverAborts) {
  EXPECT_EQ(Available(), AvailabilityStatus().ok());
  if (!Available()) {
    EXPECT_EQ(AvailabilityStatus().code(), absl::StatusCode::kUnavailable);
    // Without a driver it says so, not that the driver is too old.
    if (access("/proc/driver/nvidia/version", F_OK) != 0) {
      EXPECT_NE(AvailabilityStatus().message().find("no NVIDIA driver is loaded"),
                std::string::npos)
          << AvailabilityStatus().message();
    }
    EXPECT_FALSE(CudaStream::Create().ok());
    EXPECT_FALSE(DeviceBuffer::Allocate(16).ok());
  }
  int host = 0;
  EXPECT_FALSE(IsDevicePointer(&host));
  EXPECT_FALSE(IsDevicePointer(nullptr));
}

TEST(GpuRuntime, IsDevicePointerTellsDeviceFromHost) {
  GCOMP_REQUIRE_GPU();
  auto buffer = DeviceBuffer::Allocate(64);
  ASSERT_TRUE(buffer.ok());
  EXPECT_TRUE(IsDevicePointer(buffer->data()));
  std::vector<int> host(4);
  EXPECT_FALSE(IsDevicePointer(host.data()));
}

TEST(GpuRuntime, MaxAbsFiniteMatchesHost) {
  GCOMP_REQUIRE_GPU();
  std::vector<float> host(1 << 20);
  for (size_t i = 0; i < host.size(); ++i) {
    host[i] = std::sin(static_cast<float>(i)) * static_cast<float>(i % 1000);
  }
  host[12345] = -2500.5f;
  host[777] = std::numeric_limits<float>::infinity();
  host[778] = std::numeric_limits<float>::quiet_NaN();
  auto stream = CudaStream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status();
  auto in = DeviceBuffer::Allocate(host.size() * sizeof(float));
  auto out = DeviceBuffer::Allocate(sizeof(float));
  ASSERT_TRUE(in.ok() && out.ok());
  ASSERT_EQ(cudaMemcpy(in->data(), host.data(), host.size() * sizeof(float),
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_TRUE(MaxAbsFinite(static_cast<const float*>(in->data()), host.size(),
                           static_cast<float*>(out->data()), stream->get())
                  .ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  float got = 0;
  ASSERT_EQ(cudaMemcpy(&got, out->data(), sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(got, 2500.5f);
}

}  // namespace
}  // namespace gcomp::gpu
