// TLS for gRPC listeners and channels from PEM files. The files are checked at start (readable,
// PEM, key matching the certificate, certificate not expired) so a misconfiguration is one clear
// error at startup instead of failed handshakes later.
#pragma once
#include <memory>
#include <string>

#include "common/util/status.h"

namespace grpc {
class ServerCredentials;
class ChannelCredentials;
class Channel;
class ChannelArguments;
}  // namespace grpc

namespace ds::auth {

struct ServerTlsFiles {
  std::string cert_file;       // PEM certificate chain (leaf first)
  std::string key_file;        // PEM private key of the leaf
  std::string client_ca_file;  // optional: require client certificates signed by this CA (mTLS)
  bool enabled() const { return !cert_file.empty() || !key_file.empty(); }
};

// Insecure credentials when `files` is empty; an error naming the file at fault when only one of
// cert/key is given or a file is unreadable, not PEM, expired or the key does not match.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsFiles& files);

struct ClientTlsFiles {
  std::string ca_file;  // PEM roots to verify the server; empty with tls=true: system roots
  std::string cert_file, key_file;  // optional client certificate (mTLS)
  std::string server_name;          // override of the name checked in the certificate
  bool tls = false;
};

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientTlsFiles& files);
// A channel to `address` with those credentials (and the server-name override, if any).
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& address,
                                                           const ClientTlsFiles& files);
// The same with the caller's channel arguments and, when `bearer_token` is not empty,
// `authorization: Bearer <token>` on every call. The token is added by a client interceptor, not
// call credentials: gRPC drops call credentials on plaintext channels, and the internal protocol
// may run without TLS on a private network.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& address,
                                                           const ClientTlsFiles& files,
                                                           const std::string& bearer_token,
                                                           const grpc::ChannelArguments& args);

// Checks a certificate / key pair with OpenSSL (what MakeServerCredentials runs).
absl::Status CheckCertificateAndKey(const std::string& cert_file, const std::string& key_file);

}  // namespace ds::auth
