#include "base/npy.h"

#include <cstdio>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace gcomp {
namespace {

std::string Header(const std::string& dict) {
  std::string h("\x93NUMPY\x01\x00", 8);
  h.push_back(static_cast<char>(dict.size()));
  h.push_back(0);
  return h + dict;
}

TEST(Npy, RoundTripsThroughAFile) {
  const std::vector<float> data = {1.5f, -2.f, 0.f, 3e-20f, 7.f, 8.f};
  const std::vector<size_t> shape = {2, 3};
  const std::string path = ::testing::TempDir() + "/a.npy";
  ASSERT_TRUE(WriteNpyF32(path, data, shape).ok());
  absl::StatusOr<NpyArray> back = ReadNpyF32(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->shape, shape);
  EXPECT_EQ(back->data, data);
  std::remove(path.c_str());
}

TEST(Npy, ReadsOneDimensionalAndScalar) {
  const std::vector<float> one = {4.f};
  const std::vector<size_t> shape1 = {1};
  absl::StatusOr<NpyArray> a = ParseNpyF32(SerializeNpyF32(one, shape1));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->shape, shape1);
  absl::StatusOr<NpyArray> s = ParseNpyF32(SerializeNpyF32(one, {}));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->shape.empty());
  EXPECT_EQ(s->data.size(), 1u);
}

TEST(Npy, ClearErrors) {
  auto message = [](const std::string& bytes) {
    absl::StatusOr<NpyArray> a = ParseNpyF32(bytes);
    EXPECT_FALSE(a.ok());
    return std::string(a.status().message());
  };
  EXPECT_NE(message("hello world, not npy").find("bad magic"), std::string::npos);
  EXPECT_NE(message(Header("{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }") +
                    std::string(8, '\0'))
                .find("'<f8'"),
            std::string::npos);
  EXPECT_NE(message(Header("{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }") +
                    std::string(4, '\0'))
                .find("Fortran"),
            std::string::npos);
  EXPECT_NE(message(Header("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }") +
                    std::string(8, '\0'))
                .find("truncated"),
            std::string::npos);
  EXPECT_NE(message(std::string("\x93NUMPY\x01\x00\xff\x00{", 11)).find("truncated"),
            std::string::npos);
  EXPECT_EQ(ReadNpyF32("/nonexistent/x.npy").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace gcomp
