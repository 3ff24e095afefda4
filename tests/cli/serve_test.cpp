// `tandem serve` failures a person can cause: a model that cannot be read, a port that is taken.
// Both end the process with a one-line reason instead of a server that never becomes ready.
// (Serving itself is tested from Node: tests/server/*.test.mjs.)
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cli_runner.h"
#include "test_support.h"

namespace tandem {
namespace {

TEST(Serve, AModelThatCannotBeReadEndsTheServerWithTheReason) {
  const CliResult r = run_tandem("serve /nonexistent/model.gguf --port 0");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("/nonexistent/model.gguf: cannot open"), std::string::npos) << r.output;
}

TEST(Serve, APortInUseIsAnErrorNamingTheAddress) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t length = sizeof address;
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const int port = ntohs(address.sin_port);
  const CliResult r = run_tandem("serve " + shell_quote(test::fixture("small-v2-Q4_K_M.gguf").string()) +
                                 " --port " + std::to_string(port));
  ::close(fd);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("cannot listen on 127.0.0.1:" + std::to_string(port)), std::string::npos) << r.output;
}

}  // namespace
}  // namespace tandem
