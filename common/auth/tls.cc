#include "common/auth/tls.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/support/client_interceptor.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ds::auth {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what, const char* marker) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", what, " file ", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  if (!absl::StrContains(s, "-----BEGIN ") || !absl::StrContains(s, marker))
    return absl::InvalidArgumentError(
        absl::StrCat(what, " file ", path, " is not PEM (no '-----BEGIN ...", marker, "')"));
  return s;
}

std::string OpenSslError() {
  const unsigned long e = ERR_get_error();
  if (e == 0) return "unknown OpenSSL error";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  ERR_clear_error();
  return buf;
}

}  // namespace

absl::Status CheckCertificateAndKey(const std::string& cert_file, const std::string& key_file) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  if (!ctx) return absl::InternalError("SSL_CTX_new: " + OpenSslError());
  absl::Status s;
  if (SSL_CTX_use_certificate_chain_file(ctx, cert_file.c_str()) != 1) {
    s = absl::InvalidArgumentError(
        absl::StrCat("TLS certificate ", cert_file, " cannot be loaded: ", OpenSslError()));
  } else if (SSL_CTX_use_PrivateKey_file(ctx, key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    // OpenSSL checks the pair while loading the key ("key values mismatch").
    const std::string e = OpenSslError();
    s = absl::InvalidArgumentError(
        absl::StrContains(e, "mismatch")
            ? absl::StrCat("TLS key ", key_file, " does not match the certificate ", cert_file)
            : absl::StrCat("TLS key ", key_file, " cannot be loaded: ", e));
  } else if (SSL_CTX_check_private_key(ctx) != 1) {
    s = absl::InvalidArgumentError(
        absl::StrCat("TLS key ", key_file, " does not match the certificate ", cert_file));
  } else if (X509* leaf = SSL_CTX_get0_certificate(ctx)) {
    if (X509_cmp_current_time(X509_get0_notAfter(leaf)) <= 0)
      s = absl::FailedPreconditionError(
          absl::StrCat("TLS certificate ", cert_file, " has expired"));
    else if (X509_cmp_current_time(X509_get0_notBefore(leaf)) > 0)
      s = absl::FailedPreconditionError(
          absl::StrCat("TLS certificate ", cert_file, " is not valid yet"));
  }
  SSL_CTX_free(ctx);
  ERR_clear_error();
  return s;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsFiles& f) {
  if (!f.enabled()) {
    if (!f.client_ca_file.empty())
      return absl::InvalidArgumentError("a TLS client CA needs a TLS certificate and key");
    return grpc::InsecureServerCredentials();
  }
  if (f.cert_file.empty()) return absl::InvalidArgumentError("TLS key given without a certificate");
  if (f.key_file.empty()) return absl::InvalidArgumentError("TLS certificate given without a key");
  DS_ASSIGN_OR_RETURN(std::string cert,
                      ReadPem(f.cert_file, "TLS certificate", "CERTIFICATE-----"));
  DS_ASSIGN_OR_RETURN(std::string key, ReadPem(f.key_file, "TLS key", "PRIVATE KEY-----"));
  DS_RETURN_IF_ERROR(CheckCertificateAndKey(f.cert_file, f.key_file));
  grpc::SslServerCredentialsOptions opts;
  opts.pem_key_cert_pairs.push_back({key, cert});
  if (!f.client_ca_file.empty()) {
    DS_ASSIGN_OR_RETURN(opts.pem_root_certs,
                        ReadPem(f.client_ca_file, "TLS client CA", "CERTIFICATE-----"));
    opts.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(opts);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientTlsFiles& f) {
  if (!f.tls) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions opts;
  if (!f.ca_file.empty()) {
    DS_ASSIGN_OR_RETURN(opts.pem_root_certs, ReadPem(f.ca_file, "TLS CA", "CERTIFICATE-----"));
  }
  if (!f.cert_file.empty() || !f.key_file.empty()) {
    if (f.cert_file.empty() || f.key_file.empty())
      return absl::InvalidArgumentError("a TLS client certificate needs both cert and key");
    DS_ASSIGN_OR_RETURN(opts.pem_cert_chain,
                        ReadPem(f.cert_file, "TLS client certificate", "CERTIFICATE-----"));
    DS_ASSIGN_OR_RETURN(opts.pem_private_key,
                        ReadPem(f.key_file, "TLS client key", "PRIVATE KEY-----"));
  }
  return grpc::SslCredentials(opts);
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& address,
                                                           const ClientTlsFiles& files) {
  DS_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> creds,
                      MakeChannelCredentials(files));
  grpc::ChannelArguments args;
  if (files.tls && !files.server_name.empty()) args.SetSslTargetNameOverride(files.server_name);
  return grpc::CreateCustomChannel(address, creds, args);
}

namespace {

class BearerInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerInterceptor(const std::string* header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* m) override {
    if (m->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA))
      m->GetSendInitialMetadata()->insert({"authorization", *header_});
    m->Proceed();
  }

 private:
  const std::string* header_;  // owned by the factory, which the channel keeps alive
};

class BearerInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerInterceptorFactory(const std::string& token) : header_("Bearer " + token) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new BearerInterceptor(&header_);
  }

 private:
  const std::string header_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& address,
                                                           const ClientTlsFiles& files,
                                                           const std::string& bearer_token,
                                                           const grpc::ChannelArguments& args) {
  DS_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> creds,
                      MakeChannelCredentials(files));
  grpc::ChannelArguments a = args;
  if (files.tls && !files.server_name.empty()) a.SetSslTargetNameOverride(files.server_name);
  if (bearer_token.empty()) return grpc::CreateCustomChannel(address, creds, a);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> f;
  f.push_back(std::make_unique<BearerInterceptorFactory>(bearer_token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, creds, a, std::move(f));
}

}  // namespace ds::auth
