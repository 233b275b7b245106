// common/auth: bearer tokens (file rules, constant-time compare, UNAUTHENTICATED for missing and
// wrong tokens) and TLS credentials, both exercised through a real gRPC server on loopback.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "common/auth/bearer.h"
#include "common/auth/tls.h"
#include "deltaserve/v1/deltaserve.grpc.pb.h"

namespace ds::auth {
namespace {

namespace v1 = deltaserve::v1;
const std::string kGood = "0123456789abcdef0123456789abcdef";
const std::string kOther = "fedcba9876543210fedcba9876543210";

std::string Dir() {
  static const std::string d = [] {
    std::string t = ::testing::TempDir() + "auth_test_XXXXXX";
    return std::string(mkdtemp(t.data()));
  }();
  return d;
}

std::string WriteFile(const std::string& name, const std::string& text, mode_t mode) {
  const std::string p = Dir() + "/" + name;
  std::ofstream(p) << text;
  chmod(p.c_str(), mode);
  return p;
}

// The service under test: Tokenize answers [1, 2, 3] once the call is authenticated, which is
// exactly the first line every gateway handler runs.
class Echo final : public v1::Generation::Service {
 public:
  explicit Echo(const TokenSet* keys) : keys_(keys) {}
  grpc::Status Tokenize(grpc::ServerContext* ctx, const v1::TokenizeRequest*,
                        v1::TokenizeResponse* resp) override {
    if (grpc::Status s = Check(*ctx, *keys_); !s.ok()) return s;
    resp->add_ids(1);
    resp->add_ids(2);
    resp->add_ids(3);
    return grpc::Status::OK;
  }

 private:
  const TokenSet* keys_;
};

struct Server {
  std::unique_ptr<Echo> svc;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

Server StartServer(const TokenSet* keys, std::shared_ptr<grpc::ServerCredentials> creds) {
  Server s;
  s.svc = std::make_unique<Echo>(keys);
  grpc::ServerBuilder b;
  b.AddListeningPort("127.0.0.1:0", creds, &s.port);
  b.RegisterService(s.svc.get());
  s.server = b.BuildAndStart();
  return s;
}

grpc::Status CallTokenize(std::shared_ptr<grpc::Channel> ch, const std::string& authorization) {
  auto stub = v1::Generation::NewStub(ch);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  if (!authorization.empty()) ctx.AddMetadata("authorization", authorization);
  v1::TokenizeRequest req;
  req.set_text("hi");
  v1::TokenizeResponse resp;
  grpc::Status s = stub->Tokenize(&ctx, req, &resp);
  if (s.ok()) EXPECT_EQ(resp.ids_size(), 3);
  return s;
}

TEST(Tokens, FileRules) {
  auto ok = TokenSet::FromFile(
      WriteFile("keys", "# operators\n" + kGood + "\n\n  " + kOther + "  \n", 0640));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->size(), 2u);
  EXPECT_TRUE(ok->Matches(kOther));
  EXPECT_FALSE(ok->Matches(kOther.substr(1)));

  auto world = TokenSet::FromFile(WriteFile("world", kGood + "\n", 0644));
  ASSERT_FALSE(world.ok());
  EXPECT_NE(world.status().message().find("readable by everyone"), std::string::npos);
  auto shrt = TokenSet::FromFile(WriteFile("short", "abc\n", 0600));
  ASSERT_FALSE(shrt.ok());
  EXPECT_NE(shrt.status().message().find("at least 16"), std::string::npos);
  EXPECT_FALSE(TokenSet::FromFile(WriteFile("empty", "# nothing\n", 0600)).ok());
  EXPECT_FALSE(TokenSet::FromFile(Dir() + "/missing").ok());
}

TEST(Tokens, ClientTokenIsTheFirstOfAFileUnderTheSameRules) {
  auto first =
      ReadClientToken(WriteFile("client", "# scheduler\n  " + kOther + "\n" + kGood, 0600));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, kOther);
  EXPECT_FALSE(ReadClientToken(WriteFile("cworld", kGood + "\n", 0644)).ok());
  EXPECT_FALSE(ReadClientToken(WriteFile("cshort", "abc\n", 0600)).ok());
  EXPECT_FALSE(ReadClientToken(Dir() + "/missing").ok());
}

// The client side of the internal protocol: MakeChannel with a token adds it to every call, on a
// plaintext channel too (where gRPC would drop call credentials).
TEST(GrpcAuth, ChannelWithTokenAuthenticatesEveryCall) {
  auto keys = TokenSet::FromTokens({kGood});
  ASSERT_TRUE(keys.ok());
  Server s = StartServer(&*keys, grpc::InsecureServerCredentials());
  const std::string addr = "127.0.0.1:" + std::to_string(s.port);
  grpc::ChannelArguments args;
  auto with = MakeChannel(addr, ClientTlsFiles{}, kGood, args);
  ASSERT_TRUE(with.ok()) << with.status();
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(CallTokenize(*with, "").ok());
  auto wrong = MakeChannel(addr, ClientTlsFiles{}, kOther, args);
  ASSERT_TRUE(wrong.ok());
  EXPECT_EQ(CallTokenize(*wrong, "").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  auto none = MakeChannel(addr, ClientTlsFiles{}, "", args);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(CallTokenize(*none, "").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  s.server->Shutdown();
}

TEST(Tokens, ConstantTimeEqualsIsEquality) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abd", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("ab", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abcd", "abc"));
  EXPECT_FALSE(ConstantTimeEquals(std::string_view("ab\0", 3), "ab"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
}

TEST(Tokens, CheckBearerRefusesWithUnauthenticated) {
  auto keys = TokenSet::FromTokens({kGood});
  ASSERT_TRUE(keys.ok());
  auto check = [&](std::vector<std::string_view> v) { return CheckBearer(*keys, v).code(); };
  EXPECT_EQ(check({}), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(check({"Basic " + kGood}), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(check({"Bearer " + kOther}), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(check({"Bearer"}), absl::StatusCode::kUnauthenticated);
  const std::string good = "Bearer " + kGood, lower = "bearer " + kGood;
  EXPECT_EQ(check({good}), absl::StatusCode::kOk);
  EXPECT_EQ(check({lower}), absl::StatusCode::kOk);
  EXPECT_EQ(check({good, good}), absl::StatusCode::kUnauthenticated) << "one value only";
  EXPECT_TRUE(CheckBearer(TokenSet(), {}).ok()) << "an empty set is an open listener";
}

TEST(GrpcAuth, InsecureListenerRefusesMissingAndWrongTokens) {
  auto keys = TokenSet::FromTokens({kGood});
  ASSERT_TRUE(keys.ok());
  Server s = StartServer(&*keys, grpc::InsecureServerCredentials());
  ASSERT_GT(s.port, 0);
  auto ch = grpc::CreateChannel("127.0.0.1:" + std::to_string(s.port),
                                grpc::InsecureChannelCredentials());
  EXPECT_EQ(CallTokenize(ch, "").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(CallTokenize(ch, "Bearer " + kOther).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(CallTokenize(ch, kGood).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(CallTokenize(ch, "Bearer " + kGood).ok());
  s.server->Shutdown();
}

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // A self-signed certificate for localhost / 127.0.0.1 and an unrelated second key.
    const std::string d = Dir();
    const std::string cmd =
        "cd " + d +
        " && openssl req -x509 -newkey rsa:2048 -nodes -keyout key.pem -out cert.pem -days 2 "
        "-subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 >/dev/null 2>&1"
        " && openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out other.pem "
        ">/dev/null 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << "openssl is required (tools/setup.sh)";
  }
  std::string cert() { return Dir() + "/cert.pem"; }
  std::string key() { return Dir() + "/key.pem"; }
};

TEST_F(TlsTest, TlsListenerWithTokens) {
  auto creds = MakeServerCredentials({cert(), key(), ""});
  ASSERT_TRUE(creds.ok()) << creds.status();
  auto keys = TokenSet::FromTokens({kGood});
  ASSERT_TRUE(keys.ok());
  Server s = StartServer(&*keys, *creds);
  ASSERT_GT(s.port, 0);
  const std::string addr = "localhost:" + std::to_string(s.port);
  ClientTlsFiles tls;
  tls.tls = true;
  tls.ca_file = cert();
  auto ch = MakeChannel(addr, tls);
  ASSERT_TRUE(ch.ok()) << ch.status();
  EXPECT_TRUE(CallTokenize(*ch, "Bearer " + kGood).ok());
  EXPECT_EQ(CallTokenize(*ch, "").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(CallTokenize(*ch, "Bearer " + kOther).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // Plaintext against the TLS port never reaches the handler.
  auto plain = grpc::CreateChannel(addr, grpc::InsecureChannelCredentials());
  grpc::Status p = CallTokenize(plain, "Bearer " + kGood);
  EXPECT_FALSE(p.ok());
  EXPECT_EQ(p.error_code(), grpc::StatusCode::UNAVAILABLE) << p.error_message();
  // A client that does not trust the certificate fails the handshake.
  ClientTlsFiles untrusted;
  untrusted.tls = true;
  untrusted.ca_file = WriteFile("wrong-ca.pem", "", 0644);
  EXPECT_FALSE(MakeChannel(addr, untrusted).ok()) << "an empty CA file is not PEM";
  s.server->Shutdown();
}

TEST_F(TlsTest, StartupErrorsNameTheFileAtFault) {
  EXPECT_TRUE(MakeServerCredentials({}).ok()) << "no files: insecure (loopback default)";
  auto only_cert = MakeServerCredentials({cert(), "", ""});
  ASSERT_FALSE(only_cert.ok());
  EXPECT_NE(only_cert.status().message().find("without a key"), std::string::npos);
  auto mismatch = MakeServerCredentials({cert(), Dir() + "/other.pem", ""});
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(mismatch.status().message().find("does not match"), std::string::npos)
      << mismatch.status();
  auto not_pem = MakeServerCredentials({WriteFile("junk.pem", "hello\n", 0600), key(), ""});
  ASSERT_FALSE(not_pem.ok());
  EXPECT_NE(not_pem.status().message().find("junk.pem is not PEM"), std::string::npos);
  auto missing = MakeServerCredentials({Dir() + "/nope.pem", key(), ""});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("nope.pem"), std::string::npos);
  EXPECT_FALSE(MakeServerCredentials({"", "", cert()}).ok()) << "client CA without cert/key";
}

}  // namespace
}  // namespace ds::auth
