#include "cluster/optimizer.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace gcomp::cluster {
namespace {

TEST(Optimizer, NoneReturnsTheMean) {
  Optimizer o({}, 3);
  o.Step(std::vector<float>{1, -2, 3});
  EXPECT_EQ(std::vector<float>(o.value().begin(), o.value().end()), (std::vector<float>{1, -2, 3}));
}

TEST(Optimizer, NoneTakesAGivenBufferAfterTheFirstStep) {
  Optimizer o({}, 3);
  std::vector<float> g = {1, -2, 3};
  o.Step(&g);  // the first step copies into a value of its own
  EXPECT_EQ(g, (std::vector<float>{1, -2, 3}));
  g = {4, 5, 6};
  const float* given = g.data();
  o.Step(&g);
  EXPECT_EQ(o.value().data(), given);
  EXPECT_EQ(std::vector<float>(o.value().begin(), o.value().end()), (std::vector<float>{4, 5, 6}));
  EXPECT_EQ(g, (std::vector<float>{1, -2, 3}));  // the previous value's buffer, for reuse
  EXPECT_EQ(o.steps(), 2);
}

TEST(Optimizer, GivenBufferIsLeftAloneByOtherKinds) {
  OptimizerOptions opt{OptimizerKind::kSgd, 0.5};
  Optimizer o(opt, 2, {1, 1});
  for (int i = 0; i < 2; ++i) {
    std::vector<float> g = {2, -2};
    o.Step(&g);
    EXPECT_EQ(g, (std::vector<float>{2, -2}));
  }
  EXPECT_FLOAT_EQ(o.value()[0], -1.0f);
  EXPECT_FLOAT_EQ(o.value()[1], 3.0f);
}

TEST(Optimizer, SgdStepsAgainstTheGradient) {
  OptimizerOptions opt{OptimizerKind::kSgd, 0.5};
  Optimizer o(opt, 2, {1, 1});
  o.Step(std::vector<float>{2, -2});
  EXPECT_FLOAT_EQ(o.value()[0], 0.0f);
  EXPECT_FLOAT_EQ(o.value()[1], 2.0f);
}

TEST(Optimizer, MomentumAccumulatesVelocity) {
  OptimizerOptions opt{OptimizerKind::kMomentum, 1.0, 0.5};
  Optimizer o(opt, 1);
  o.Step(std::vector<float>{1});  // v = 1, p = -1
  o.Step(std::vector<float>{1});  // v = 1.5, p = -2.5
  EXPECT_FLOAT_EQ(o.value()[0], -2.5f);
}

TEST(Optimizer, AdamFirstStepIsLearningRateTimesSign) {
  OptimizerOptions opt{OptimizerKind::kAdam, 0.1};
  Optimizer o(opt, 2, {0, 0});
  o.Step(std::vector<float>{3, -0.001f});
  EXPECT_NEAR(o.value()[0], -0.1, 1e-6);
  EXPECT_NEAR(o.value()[1], 0.1, 1e-4);
}

TEST(Optimizer, ParsesAndValidates) {
  EXPECT_EQ(*ParseOptimizerKind("adam"), OptimizerKind::kAdam);
  EXPECT_FALSE(ParseOptimizerKind("lamb").ok());
  OptimizerOptions bad;
  bad.learning_rate = 0;
  EXPECT_EQ(ValidateOptimizerOptions(bad).code(), absl::StatusCode::kInvalidArgument);
}

TEST(Optimizer, StateRestoresIntoAnIdenticalOptimizer) {
  OptimizerOptions opt{OptimizerKind::kAdam, 0.1};
  Optimizer a(opt, 3, {1, 2, 3});
  a.Step(std::vector<float>{0.5f, -0.25f, 1e-3f});
  Optimizer b(opt, 3);
  ASSERT_TRUE(b.Restore(a.state()).ok());
  for (Optimizer* o : {&a, &b}) o->Step(std::vector<float>{0.1f, 0.2f, -0.3f});
  EXPECT_EQ(std::vector<float>(a.value().begin(), a.value().end()),
            std::vector<float>(b.value().begin(), b.value().end()));
  EXPECT_EQ(b.steps(), 2);
  OptimizerState wrong = a.state();
  wrong.m.push_back(0);
  EXPECT_EQ(b.Restore(wrong).code(), absl::StatusCode::kInvalidArgument);
  Optimizer sgd(OptimizerOptions{OptimizerKind::kSgd}, 3);
  EXPECT_EQ(sgd.Restore(a.state()).code(), absl::StatusCode::kInvalidArgument);  // has moments
  // A state that has taken steps lacks nothing its kind keeps (it would restart from zeros).
  for (std::vector<float> OptimizerState::*part :
       {&OptimizerState::value, &OptimizerState::m, &OptimizerState::v}) {
    OptimizerState lacking = a.state();
    (lacking.*part).clear();
    absl::Status s = b.Restore(lacking);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("lacks its"), absl::string_view::npos) << s;
  }
  OptimizerState fresh;  // no steps: nothing allocated yet is right
  EXPECT_TRUE(b.Restore(fresh).ok());
}

}  // namespace
}  // namespace gcomp::cluster
