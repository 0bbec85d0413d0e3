#include "cluster/optimizer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace gcomp::cluster {

absl::StatusOr<OptimizerKind> ParseOptimizerKind(absl::string_view name) {
  if (name == "none") return OptimizerKind::kNone;
  if (name == "sgd") return OptimizerKind::kSgd;
  if (name == "momentum") return OptimizerKind::kMomentum;
  if (name == "adam") return OptimizerKind::kAdam;
  return absl::InvalidArgumentError(
      absl::StrCat("optimizer must be none, sgd, momentum or adam, got '", name, "'"));
}

std::optional<OptimizerOptionError> CheckOptimizerOptions(const OptimizerOptions& o) {
  // Steps run in float: each value must keep its meaning once cast (1e39 is +inf as a
  // float, 1e-46 is 0, and 1 - 1e-9 is 1).
  const auto f = [](double x) { return static_cast<float>(x); };
  if (!(o.learning_rate > 0) || !std::isfinite(f(o.learning_rate)) || !(f(o.learning_rate) > 0)) {
    return OptimizerOptionError{
        "learning_rate",
        absl::StrCat("must be > 0 and finite as a float (below 3.4e38), got ", o.learning_rate)};
  }
  for (auto [name, x] : {std::pair<const char*, double>{"momentum", o.momentum},
                         {"beta1", o.beta1},
                         {"beta2", o.beta2}}) {
    if (!(x >= 0 && x < 1 && f(x) < 1)) {
      return OptimizerOptionError{
          name, absl::StrCat("must be in [0, 1), and below 1 as a float, got ", x)};
    }
  }
  if (!(o.epsilon > 0) || !(f(o.epsilon) >= std::numeric_limits<float>::min()) ||
      !std::isfinite(f(o.epsilon))) {
    return OptimizerOptionError{
        "epsilon", absl::StrCat("must be a normal float (1.2e-38 to 3.4e38), got ", o.epsilon)};
  }
  return std::nullopt;
}

absl::Status ValidateOptimizerOptions(const OptimizerOptions& o) {
  if (std::optional<OptimizerOptionError> e = CheckOptimizerOptions(o)) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer ", e->option, " ", e->rule));
  }
  return absl::OkStatus();
}

size_t Optimizer::StateBytesPerElement(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kNone:
    case OptimizerKind::kSgd:
      return sizeof(float);
    case OptimizerKind::kMomentum:
      return 2 * sizeof(float);
    case OptimizerKind::kAdam:
      return 3 * sizeof(float);
  }
  return 3 * sizeof(float);
}

Optimizer::Optimizer(const OptimizerOptions& options, size_t elements, std::vector<float> initial)
    : options_(options), elements_(elements), value_(std::move(initial)) {
  if (!value_.empty()) value_.resize(elements_, 0.0f);
}

void Optimizer::AllocateValue() const {
  if (value_.size() != elements_) value_.assign(elements_, 0.0f);
}

absl::Span<const float> Optimizer::value() const {
  AllocateValue();
  return value_;
}

void Optimizer::SetValue(absl::Span<const float> value) {
  AllocateValue();
  std::copy(value.begin(), value.begin() + std::min(value.size(), value_.size()), value_.begin());
}

void Optimizer::Step(std::vector<float>* g) {
  // The first step allocates the value (a buffer of the optimizer's own, as its owner
  // accounts it); the swaps after it trade buffers of equal size.
  if (options_.kind != OptimizerKind::kNone || g->size() != elements_ ||
      value_.size() != elements_) {
    Step(absl::Span<const float>(*g));
    return;
  }
  ++steps_;
  value_.swap(*g);
}

void Optimizer::Step(absl::Span<const float> g) {
  ++steps_;
  AllocateValue();
  if (m_.empty() &&
      (options_.kind == OptimizerKind::kMomentum || options_.kind == OptimizerKind::kAdam)) {
    m_.assign(elements_, 0.0f);
  }
  if (v_.empty() && options_.kind == OptimizerKind::kAdam) v_.assign(elements_, 0.0f);
  const size_t n = value_.size();
  const float lr = static_cast<float>(options_.learning_rate);
  switch (options_.kind) {
    case OptimizerKind::kNone:
      std::copy(g.begin(), g.begin() + n, value_.begin());
      break;
    case OptimizerKind::kSgd:
      for (size_t i = 0; i < n; ++i) value_[i] -= lr * g[i];
      break;
    case OptimizerKind::kMomentum: {
      const float mu = static_cast<float>(options_.momentum);
      for (size_t i = 0; i < n; ++i) {
        m_[i] = mu * m_[i] + g[i];
        value_[i] -= lr * m_[i];
      }
      break;
    }
    case OptimizerKind::kAdam: {
      const float b1 = static_cast<float>(options_.beta1);
      const float b2 = static_cast<float>(options_.beta2);
      const float eps = static_cast<float>(options_.epsilon);
      const float c1 = static_cast<float>(1.0 / (1.0 - std::pow(options_.beta1, steps_)));
      const float c2 = static_cast<float>(1.0 / (1.0 - std::pow(options_.beta2, steps_)));
      for (size_t i = 0; i < n; ++i) {
        m_[i] = b1 * m_[i] + (1 - b1) * g[i];
        v_[i] = b2 * v_[i] + (1 - b2) * g[i] * g[i];
        value_[i] -= lr * (m_[i] * c1) / (std::sqrt(v_[i] * c2) + eps);
      }
      break;
    }
  }
}

OptimizerState Optimizer::state() const {
  return OptimizerState{value_, m_, v_, steps_};
}

absl::Status Optimizer::CheckState(const OptimizerOptions& options, size_t elements,
                                   const OptimizerState& state) {
  for (auto [name, vec] : {std::pair<const char*, const std::vector<float>*>{"value", &state.value},
                           {"first moment", &state.m},
                           {"second moment", &state.v}}) {
    if (!vec->empty() && vec->size() != elements) {
      return absl::InvalidArgumentError(absl::StrCat("optimizer ", name, " holds ", vec->size(),
                                                     " elements, expected ", elements));
    }
  }
  const bool uses_m =
      options.kind == OptimizerKind::kMomentum || options.kind == OptimizerKind::kAdam;
  if (!state.m.empty() && !uses_m) {
    return absl::InvalidArgumentError("optimizer state has a first moment its kind does not use");
  }
  if (!state.v.empty() && options.kind != OptimizerKind::kAdam) {
    return absl::InvalidArgumentError("optimizer state has a second moment its kind does not use");
  }
  if (state.steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer step count ", state.steps, " < 0"));
  }
  // A step allocates what the kind keeps: a state that has taken steps but lacks any of it
  // would restart it from zeros (a damaged or forged checkpoint).
  if (state.steps > 0 && elements > 0) {
    if (state.value.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer state of ", state.steps, " steps lacks its value"));
    }
    if (state.m.empty() && uses_m) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer state of ", state.steps, " steps lacks its first moment"));
    }
    if (state.v.empty() && options.kind == OptimizerKind::kAdam) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer state of ", state.steps, " steps lacks its second moment"));
    }
  }
  return absl::OkStatus();
}

absl::Status Optimizer::Restore(OptimizerState state) {
  if (absl::Status s = CheckState(options_, elements_, state); !s.ok()) return s;
  value_ = std::move(state.value);
  m_ = std::move(state.m);
  v_ = std::move(state.v);
  steps_ = state.steps;
  return absl::OkStatus();
}

}  // namespace gcomp::cluster
