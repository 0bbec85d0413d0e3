#include "server/listener.h"

#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "base/testing/connection_flood.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/health.grpc.pb.h"

namespace gcomp::server {
namespace {

using ::gcomp::testing::ConnectionFlood;

class PingService final : public proto::Admin::Service {
  grpc::Status Ping(grpc::ServerContext*, const proto::PingRequest*,
                    proto::PingResponse* response) override {
    response->set_process("pong");
    return grpc::Status::OK;
  }
};

class ListenerTest : public ::testing::Test {
 protected:
  void Start(ListenerOptions options, const std::string& address = "127.0.0.1:0") {
    absl::StatusOr<std::unique_ptr<Listener>> l = Listener::Bind(address, options);
    ASSERT_TRUE(l.ok()) << l.status();
    listener_ = *std::move(l);
    grpc::ServerBuilder builder;
    builder.RegisterService(&service_);
    auto acceptor = builder.experimental().AddExternalConnectionAcceptor(
        grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD,
        grpc::InsecureServerCredentials());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    listener_->Start(std::move(acceptor));
  }
  void TearDown() override {
    if (listener_ != nullptr) listener_->Stop();
    if (server_ != nullptr) server_->Shutdown();
  }

  // A Ping on a new connection.
  grpc::Status Ping() {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto stub = proto::Admin::NewStub(
        grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(listener_->port()),
                                  grpc::InsecureChannelCredentials(), args));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    proto::PingResponse response;
    grpc::Status s = stub->Ping(&context, proto::PingRequest(), &response);
    if (s.ok()) {
      EXPECT_EQ(response.process(), "pong");
    }
    return s;
  }

  PingService service_;
  std::unique_ptr<Listener> listener_;
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(ListenerTest, HandsConnectionsToGrpc) {
  Start({});
  EXPECT_NE(listener_->port(), 0);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(Ping().ok());
  EXPECT_EQ(listener_->refused(), 0u);
}

// `admit` decides per connection: refused ones are closed before gRPC sees them.
TEST_F(ListenerTest, ConnectionsNotAdmittedAreClosed) {
  std::atomic<bool> open{true};
  ListenerOptions options;
  options.admit = [&open](int) {
    return open ? absl::OkStatus() : absl::ResourceExhaustedError("address refused");
  };
  Start(options);
  EXPECT_TRUE(Ping().ok());
  open = false;
  EXPECT_EQ(Ping().error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_GE(listener_->refused(), 1u);
  open = true;
  EXPECT_TRUE(Ping().ok());
}

TEST_F(ListenerTest, BindsEveryAddressOfAHostName) {
  Start({}, "localhost:0");  // 127.0.0.1, and ::1 where the host has IPv6
  EXPECT_TRUE(Ping().ok());  // on 127.0.0.1
}

TEST_F(ListenerTest, APortInUseOrABadAddressIsAnError) {
  Start({});
  absl::StatusOr<std::unique_ptr<Listener>> again =
      Listener::Bind("127.0.0.1:" + std::to_string(listener_->port()), {});
  EXPECT_EQ(again.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(again.status().message(), ::testing::HasSubstr("Address already in use"));
  EXPECT_EQ(Listener::Bind("no-port", {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Listener::Bind("no.such.host.invalid:7000", {}).status().code(),
            absl::StatusCode::kUnavailable);
}

// Past max_connections a new connection is closed at once; those already open stay, and
// once they close new connections are served again.
TEST_F(ListenerTest, ConnectionsPastTheCapAreClosed) {
  ListenerOptions options;
  options.max_connections = 16;
  Start(options);
  ConnectionFlood flood(listener_->port(), 64);
  const auto [closed, first_closed] = flood.Closed();
  // Descriptors gRPC opened after Start() count too, so "about" 16 stay open.
  EXPECT_GE(closed, 64 - 16);
  EXPECT_LE(closed, 64 - 8);
  EXPECT_FALSE(first_closed);
  EXPECT_EQ(listener_->refused(), static_cast<uint64_t>(closed));
  flood.Release();
  absl::SleepFor(absl::Milliseconds(200));  // gRPC sees the ends and frees the descriptors
  EXPECT_TRUE(Ping().ok());
}

// A flood that runs the process out of descriptors (reserve 0, so accept() itself fails
// with EMFILE) is waited out: gRPC's own listener stopped accepting for good here.
TEST_F(ListenerTest, RunningOutOfDescriptorsIsWaitedOut) {
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  ListenerOptions options;
  options.reserve_fds = 0;
  Start(options);
  // Leave this process 40 descriptors more than it holds now, then flood it.
  rlimit low = saved;
  const int probe = dup(0);
  low.rlim_cur = static_cast<rlim_t>(probe + 40);
  close(probe);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  {
    ConnectionFlood flood(listener_->port(), 300);
    const auto [closed, first_closed] = flood.Closed();
    EXPECT_EQ(closed, 0);  // the ones not accepted wait in the backlog
    ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  }
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_TRUE(Ping().ok());
}

}  // namespace
}  // namespace gcomp::server
