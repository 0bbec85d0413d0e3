// A test PKI (tools/make_test_certs.sh, see its header for the files) for tests that run
// the service with TLS on. The test target needs data = ["//tools:make_test_certs.sh"].
#ifndef GCOMP_TESTS_TEST_CERTS_H_
#define GCOMP_TESTS_TEST_CERTS_H_

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "proto/cluster_config.pb.h"

namespace gcomp::testing {

// Runs tools/make_test_certs.sh into TEST_TMPDIR/certs once per process; the directory.
inline const std::string& TestCertsDir() {
  static const std::string* dir = [] {
    const char* tmp = std::getenv("TEST_TMPDIR");
    auto* d = new std::string(absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/certs"));
    const std::string cmd = absl::StrCat("tools/make_test_certs.sh ", *d);
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return d;
  }();
  return *dir;
}

inline std::string TestCert(const std::string& name) { return TestCertsDir() + "/" + name; }

// Sets `config->security` to mutual TLS with the test CA, presenting the `identity`
// certificate ("server", "client", "other_client", ...), and the test token.
inline void UseTestTls(proto::ClusterConfig* config, const std::string& identity = "server") {
  proto::SecurityConfig* sec = config->mutable_security();
  sec->set_ca_file(TestCert("ca.pem"));
  sec->set_cert_file(TestCert(identity + ".pem"));
  sec->set_key_file(TestCert(identity + ".key"));
  sec->set_token_file(TestCert("token"));
}

// True when GCOMP_TEST_TLS=1: the service tests then run their whole suite over TLS.
inline bool TlsFromEnvironment() {
  const char* v = std::getenv("GCOMP_TEST_TLS");
  return v != nullptr && std::string(v) == "1";
}

}  // namespace gcomp::testing

#endif  // GCOMP_TESTS_TEST_CERTS_H_
