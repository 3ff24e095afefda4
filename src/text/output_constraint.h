#pragma once
// What constrained sampling asks of a reply's grammar (JSON of a schema, a tool call in a model's
// syntax): whether bytes can continue it, whether it is whole, and the fewest bytes that finish
// it. Implementations are value types behind this interface; the sampler tries each candidate
// token on a scratch copy (copy_from), so copying must be cheap.
#include <cstdint>
#include <memory>
#include <string_view>

namespace tandem {

class OutputConstraint {
 public:
  virtual ~OutputConstraint() = default;
  virtual std::unique_ptr<OutputConstraint> clone() const = 0;
  // Becomes a copy of `other`, an object of the same class.
  virtual void copy_from(const OutputConstraint& other) = 0;
  // Reads bytes; false when they cannot continue the reply (the object is then undefined).
  virtual bool feed(std::string_view bytes) = 0;
  virtual bool complete() const = 0;
  virtual int64_t min_remaining() const = 0;
  // Whether a control token's text (a tool-call marker) may come next; inside JSON it may not.
  virtual bool takes_control_tokens() const { return false; }
};

}  // namespace tandem
