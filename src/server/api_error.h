#pragma once
// An error a client caused, in OpenAI's shape: HTTP status, error type, message, and the
// parameter at fault. Request parsing throws it; the HTTP layer turns it into
// {"error": {"message", "type", "param", "code"}} with the status.
#include <stdexcept>
#include <string>

namespace tandem::server {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = {},
           std::string type = "invalid_request_error")
      : std::runtime_error(std::move(message)), status_(status), param_(std::move(param)),
        type_(std::move(type)) {}

  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& type() const { return type_; }

 private:
  int status_;
  std::string param_, type_;
};

// The JSON body OpenAI sends with an error status.
std::string error_body(int status, const std::string& message, const std::string& param = {},
                       const std::string& type = "invalid_request_error");

}  // namespace tandem::server
