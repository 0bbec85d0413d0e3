#!/usr/bin/env bash
# tools/make_test_certs.sh OUT_DIR
#
# Makes a throwaway PKI for tests and local TLS runs (never for production: the keys are
# unencrypted and the CA key sits next to the certificates). ECDSA P-256 keys, so the
# whole run takes well under a second. Layout of OUT_DIR (created if missing):
#
#   ca.pem ca.key                  the cluster CA (security.ca_file)
#   server.pem server.key          a shard certificate, signed by ca; also valid as a client
#                                  certificate, so shards can call each other with it
#   server_renewed.pem/.key        a second shard certificate from the same CA (reload tests)
#   client.pem client.key          a worker certificate, signed by ca
#   other_ca.pem other_ca.key      an unrelated CA
#   other_client.pem/.key          a worker certificate signed by other_ca
#   expired_client.pem/.key        a worker certificate signed by ca, valid only in 2020
#   token                          a random job token (64 hex digits and a newline)
#
# Shard certificates carry these subjectAltNames (the client checks the name it dialled,
# the host part of the shard's host:port in the config, against them):
#   DNS:localhost, IP:127.0.0.1, IP:::1, DNS:*.gcomp-shard, DNS:*.gcomp-shard.default.svc
# Real deployments must put every name or IP that workers use in `shards` into the SAN.
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 OUT_DIR" >&2
  exit 2
fi
command -v openssl >/dev/null || { echo "$0: openssl not found (tools/bootstrap.sh installs it)" >&2; exit 1; }
out=$1
mkdir -p "$out"
cd "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

# ca NAME SUBJECT
ca() {
  key "$1.key"
  openssl req -x509 -new -key "$1.key" -sha256 -days 3650 -subj "/CN=$2" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$1.pem"
}

# leaf NAME CA SUBJECT EXTENSIONS  (valid from now for 825 days)
leaf() {
  key "$1.key"
  openssl req -new -key "$1.key" -subj "/CN=$3" -out "$work/$1.csr"
  printf '%s\n' "$4" >"$work/$1.ext"
  openssl x509 -req -in "$work/$1.csr" -CA "$2.pem" -CAkey "$2.key" -set_serial "0x$(openssl rand -hex 16)" \
    -sha256 -days 825 -extfile "$work/$1.ext" -out "$1.pem" 2>/dev/null
}

server_ext='basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1,DNS:*.gcomp-shard,DNS:*.gcomp-shard.default.svc'
client_ext='basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth'

ca ca "gcomp test CA"
ca other_ca "unrelated test CA"
leaf server ca "gcomp shard" "$server_ext"
leaf server_renewed ca "gcomp shard (renewed)" "$server_ext"
leaf client ca "gcomp worker" "$client_ext"
leaf other_client other_ca "gcomp worker" "$client_ext"

# `openssl x509` in OpenSSL 3.0 cannot back-date a certificate; `openssl ca` can.
key expired_client.key
openssl req -new -key expired_client.key -subj "/CN=gcomp worker (expired)" -out "$work/expired.csr"
touch "$work/index.txt"
cat >"$work/ca.cnf" <<EOF
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
[client]
$client_ext
EOF
openssl rand -hex 16 >"$work/serial"
openssl ca -batch -config "$work/ca.cnf" -extensions client -notext \
  -startdate 20200101000000Z -enddate 20200201000000Z \
  -in "$work/expired.csr" -out expired_client.pem 2>/dev/null

openssl rand -hex 32 >token
chmod 600 ./*.key token
