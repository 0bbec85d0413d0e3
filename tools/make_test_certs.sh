#!/usr/bin/env bash
# tools/make_test_certs.sh OUT_DIR
#
# Makes a throwaway PKI for tests and local TLS runs (never for production: the keys are
# unencrypted and the CA key sits next to the certificates). ECDSA P-256 keys and one
# openssl run per certificate: about half a second of CPU time. Layout of OUT_DIR
# (created if missing; existing files are replaced):
#
#   ca.pem ca.key                  the cluster CA (security.ca_file)
#   server.pem server.key          a shard certificate, signed by ca; also valid as a client
#                                  certificate, so shards can call each other with it
#   server_renewed.pem/.key        a second shard certificate from the same CA (reload tests)
#   client.pem client.key          a worker certificate, signed by ca
#   other_ca.pem other_ca.key      an unrelated CA
#   other_client.pem/.key          a worker certificate signed by other_ca
#   expired_client.pem/.key        a worker certificate signed by ca, valid only in January 2020
#   token                          a random job token (64 hex digits and a newline)
#
# Shard certificates carry these subjectAltNames (the client checks the name it dialled,
# the host part of the shard's host:port in the config, against them):
#   DNS:localhost, IP:127.0.0.1, IP:::1, DNS:gcomp-shard-K.gcomp-shard for K = 0..15,
#   DNS:*.gcomp-shard.default.svc
# (gRPC refuses a wildcard over a one-label suffix such as *.gcomp-shard: "Invalid toplevel
# subdomain"; hence the names one by one.) Real deployments must put every name or IP that
# workers use in `shards` into the SAN.
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 OUT_DIR" >&2
  exit 2
fi
command -v openssl >/dev/null || { echo "$0: openssl not found (tools/bootstrap.sh installs it)" >&2; exit 1; }
mkdir -p "$1"
cd "$1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

hex() { od -An -N"$1" -tx1 /dev/urandom | tr -d ' \n'; }

# One config for every certificate: without -config, `openssl req -x509` would take the
# system openssl.cnf's extensions, which make every certificate a CA.
SHARD_NAMES=$(for k in $(seq 0 15); do printf 'DNS:gcomp-shard-%d.gcomp-shard,' "$k"; done)
cat >"$work/req.cnf" <<CNF
[req]
distinguished_name = dn
prompt = no
[dn]
[ca_ext]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[server_ext]
basicConstraints = CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth,clientAuth
subjectAltName = DNS:localhost,IP:127.0.0.1,IP:::1,${SHARD_NAMES}DNS:*.gcomp-shard.default.svc
[client_ext]
basicConstraints = CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
CNF
newkey=(-newkey ec -pkeyopt ec_paramgen_curve:P-256 -noenc)

# ca NAME SUBJECT
ca() {
  openssl req -x509 -config "$work/req.cnf" -extensions ca_ext "${newkey[@]}" -keyout "$1.key" \
    -subj "/CN=$2" -sha256 -days 3650 -out "$1.pem" 2>/dev/null
}

# leaf NAME CA SUBJECT EXTENSION_SECTION: valid from now for 825 days. OpenSSL 3's
# `req -CA` makes the key and signs the certificate in one run.
leaf() {
  openssl req -x509 -config "$work/req.cnf" -extensions "$4" "${newkey[@]}" -keyout "$1.key" \
    -subj "/CN=$3" -CA "$2.pem" -CAkey "$2.key" -set_serial "0x$(hex 16)" -sha256 -days 825 \
    -out "$1.pem" 2>/dev/null
}

ca ca "gcomp test CA"
ca other_ca "unrelated test CA"
leaf server ca "gcomp shard" server_ext
leaf server_renewed ca "gcomp shard (renewed)" server_ext
leaf client ca "gcomp worker" client_ext
leaf other_client other_ca "gcomp worker" client_ext

# OpenSSL 3.0's `req` and `x509` cannot back-date a certificate; `openssl ca` can.
openssl req -new -config "$work/req.cnf" "${newkey[@]}" -keyout expired_client.key \
  -subj "/CN=gcomp worker (expired)" -out "$work/expired.csr" 2>/dev/null
touch "$work/index.txt"
hex 16 >"$work/serial"
cat >"$work/ca.cnf" <<CNF
[ca]
default_ca = test
[test]
database = $work/index.txt
new_certs_dir = $work
certificate = $PWD/ca.pem
private_key = $PWD/ca.key
default_md = sha256
policy = any
serial = $work/serial
[any]
commonName = supplied
[client_ext]
basicConstraints = CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
CNF
openssl ca -batch -config "$work/ca.cnf" -extensions client_ext -notext \
  -startdate 20200101000000Z -enddate 20200201000000Z \
  -in "$work/expired.csr" -out expired_client.pem 2>/dev/null

echo "$(hex 32)" >token
chmod 600 ./*.key token
