// The real gateway (ds::gw::Gateway) with TLS and API keys from files: the public listener serves
// only TLS, refuses missing and wrong tokens with UNAUTHENTICATED, and the admin listener takes
// only its own token. No scheduler is needed: Tokenize runs in the gateway, and the admin call's
// authentication happens before it would reach the scheduler.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "common/auth/tls.h"
#include "deltaserve/v1/deltaserve.grpc.pb.h"
#include "gateway/gateway.h"
#include "tools/synth/synth.h"

namespace ds::gw {
namespace {

namespace v1 = deltaserve::v1;
const std::string kPublic = "public-0123456789abcdef0123456789";
const std::string kAdmin = "admin-0123456789abcdef01234567890";

class GatewayTls : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string t = ::testing::TempDir() + "gw_tls_XXXXXX";
    dir_ = mkdtemp(t.data());
    ASSERT_TRUE(SynthesizeGguf(SynthOptions::Tiny(), dir_ + "/tiny.gguf").ok());
    const std::string cmd =
        "cd " + dir_ +
        " && openssl req -x509 -newkey rsa:2048 -nodes -keyout key.pem -out cert.pem -days 2 "
        "-subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 >/dev/null 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << "openssl is required (tools/setup.sh)";
    for (auto [name, tok] : {std::pair{"keys", kPublic}, {"admin-keys", kAdmin}}) {
      std::ofstream(dir_ + "/" + name) << "# test\n" << tok << "\n";
      chmod((dir_ + "/" + name).c_str(), 0600);
    }
  }
  GatewayOptions Options() {
    GatewayOptions o;
    o.listen = "127.0.0.1:0";
    o.admin_listen = "127.0.0.1:0";
    o.scheduler = "127.0.0.1:1";  // nothing there: health NOT_SERVING, which Tokenize ignores
    o.model = dir_ + "/tiny.gguf";
    o.api_key_file = dir_ + "/keys";
    o.admin_key_file = dir_ + "/admin-keys";
    o.tls_cert = dir_ + "/cert.pem";
    o.tls_key = dir_ + "/key.pem";
    o.metrics_listen = "127.0.0.1:0";
    return o;
  }
  static std::string dir_;
};
std::string GatewayTls::dir_;

grpc::Status Tokenize(const std::shared_ptr<grpc::Channel>& ch, const std::string& token) {
  auto stub = v1::Generation::NewStub(ch);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  v1::TokenizeRequest req;
  req.set_text("hello world");
  v1::TokenizeResponse resp;
  grpc::Status s = stub->Tokenize(&ctx, req, &resp);
  if (s.ok()) EXPECT_GT(resp.ids_size(), 0);
  return s;
}

grpc::Status AdminStatus(const std::shared_ptr<grpc::Channel>& ch, const std::string& token) {
  auto stub = v1::Admin::NewStub(ch);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  v1::ClusterStatus resp;
  return stub->GetClusterStatus(&ctx, v1::GetClusterStatusRequest(), &resp);
}

TEST_F(GatewayTls, PublicListenerNeedsTlsAndItsToken) {
  auto gw = Gateway::Start(Options());
  ASSERT_TRUE(gw.ok()) << gw.status();
  EXPECT_GT((*gw)->metrics_port(), 0);
  auth::ClientTlsFiles tls;
  tls.tls = true;
  tls.ca_file = dir_ + "/cert.pem";
  auto ch = auth::MakeChannel("localhost:" + std::to_string((*gw)->port()), tls);
  ASSERT_TRUE(ch.ok());
  EXPECT_TRUE(Tokenize(*ch, kPublic).ok());
  EXPECT_EQ(Tokenize(*ch, "").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Tokenize(*ch, "wrong-0123456789abcdef0123456789").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Tokenize(*ch, kAdmin).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  auto plain = grpc::CreateChannel("127.0.0.1:" + std::to_string((*gw)->port()),
                                   grpc::InsecureChannelCredentials());
  EXPECT_EQ(Tokenize(plain, kPublic).error_code(), grpc::StatusCode::UNAVAILABLE)
      << "plaintext never reaches a handler of the TLS listener";

  // Admin: its own listener and token (plaintext on loopback).
  auto admin = grpc::CreateChannel("127.0.0.1:" + std::to_string((*gw)->admin_port()),
                                   grpc::InsecureChannelCredentials());
  EXPECT_EQ(AdminStatus(admin, "").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(AdminStatus(admin, kPublic).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // The right token passes authentication; with no scheduler the call then fails UNAVAILABLE.
  EXPECT_EQ(AdminStatus(admin, kAdmin).error_code(), grpc::StatusCode::UNAVAILABLE);
  (*gw)->Shutdown();
}

TEST_F(GatewayTls, BadFilesStopTheStartWithAClearError) {
  GatewayOptions o = Options();
  o.tls_key = "";
  auto gw = Gateway::Start(o);
  ASSERT_FALSE(gw.ok());
  EXPECT_NE(gw.status().message().find("without a key"), std::string::npos) << gw.status();

  o = Options();
  const std::string world = dir_ + "/world-keys";
  std::ofstream(world) << kPublic << "\n";
  chmod(world.c_str(), 0644);
  o.api_key_file = world;
  gw = Gateway::Start(o);
  ASSERT_FALSE(gw.ok());
  EXPECT_NE(gw.status().message().find("readable by everyone"), std::string::npos) << gw.status();
}

}  // namespace
}  // namespace ds::gw
