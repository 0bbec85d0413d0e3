// Server-side optimizers over one chunk of f32 values. Not thread-safe: each chunk's
// StepAccumulator owns its Optimizer and calls it under its lock.
//
//   none:      value = mean gradient
//   sgd:       p -= lr * g
//   momentum:  v = mu * v + g;  p -= lr * v
//   adam:      m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//              p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
// Arithmetic is in f32 (the accumulators) with coefficients converted from double once.
#ifndef GCOMP_CLUSTER_OPTIMIZER_H_
#define GCOMP_CLUSTER_OPTIMIZER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace gcomp::cluster {

enum class OptimizerKind { kNone, kSgd, kMomentum, kAdam };

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kNone;
  double learning_rate = 0.01;
  double momentum = 0.9;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double epsilon = 1e-8;
};

// "none" | "sgd" | "momentum" | "adam"; InvalidArgument otherwise.
absl::StatusOr<OptimizerKind> ParseOptimizerKind(absl::string_view name);
// The first option out of its range: the option's name ("learning_rate", ...) and the rule
// it breaks ("must be > 0, got 0"). One definition of the ranges for this class and for the
// cluster config's `optimizer.*` fields.
struct OptimizerOptionError {
  std::string option;
  std::string rule;
};
std::optional<OptimizerOptionError> CheckOptimizerOptions(const OptimizerOptions& options);
// InvalidArgument "optimizer <option> <rule>" (CheckOptimizerOptions).
absl::Status ValidateOptimizerOptions(const OptimizerOptions& options);

// An optimizer's whole state, for checkpoints and moving a chunk between shards. Vectors
// are empty until allocated (value: before the first use; m: momentum/adam; v: adam).
struct OptimizerState {
  std::vector<float> value;
  std::vector<float> m;
  std::vector<float> v;
  int64_t steps = 0;
};

// State is allocated on first use (a declared chunk that is never pushed costs nothing).
class Optimizer {
 public:
  // `initial` is the starting parameter value (zeros when empty); ignored for kNone.
  Optimizer(const OptimizerOptions& options, size_t elements, std::vector<float> initial = {});

  // Bytes of state per element once allocated: the value plus moments.
  static size_t StateBytesPerElement(OptimizerKind kind);

  // Applies one step's mean gradient (size elements()).
  void Step(absl::Span<const float> mean_gradient);
  // The same with a buffer the caller gives up: after the first step, kNone takes it as the
  // new value instead of copying it and leaves the previous value's buffer (as long) in
  // *mean_gradient for reuse. Otherwise *mean_gradient is left as it was.
  void Step(std::vector<float>* mean_gradient);
  // Replaces the parameters (declare-time initial value).
  void SetValue(absl::Span<const float> value);
  // The mean gradient (kNone) or the parameters.
  absl::Span<const float> value() const;
  size_t elements() const { return elements_; }
  const OptimizerOptions& options() const { return options_; }
  int64_t steps() const { return steps_; }
  // A copy of the whole state; Restore(state()) gives back an identical optimizer.
  OptimizerState state() const;
  // Replaces the whole state. InvalidArgument (nothing changed) when a vector is neither
  // empty nor elements() long, a moment is present that the kind does not use, or steps < 0.
  absl::Status Restore(OptimizerState state);
  // Restore's checks alone, for an optimizer of `options` over `elements` elements.
  static absl::Status CheckState(const OptimizerOptions& options, size_t elements,
                                 const OptimizerState& state);

 private:
  void AllocateValue() const;

  OptimizerOptions options_;
  size_t elements_ = 0;
  mutable std::vector<float> value_;  // allocated by the first value(), SetValue or Step
  std::vector<float> m_;  // momentum / adam first moment
  std::vector<float> v_;  // adam second moment
  int64_t steps_ = 0;
};

}  // namespace gcomp::cluster

#endif  // GCOMP_CLUSTER_OPTIMIZER_H_
