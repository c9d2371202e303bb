#!/usr/bin/env sh
# Makes a throwaway CA and two certificates in ./certs for the TLS example:
# tollgate.crt (server, named `tollgate`) and envoy.crt (client, with the SPIFFE
# ID Tollgate is told to accept). For a demo only: use your cluster's issuer
# (cert-manager, SPIRE, …) for real deployments.
set -eu
cd "$(dirname "$0")"
mkdir -p certs
cd certs
ec="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
# shellcheck disable=SC2086
openssl req -x509 $ec -keyout ca.key -out ca.crt -days 30 -subj /CN=tollgate-example-ca
issue() {
    # shellcheck disable=SC2086
    openssl req $ec -keyout "$1.key" -out "$1.csr" -subj "/CN=$1"
    printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$2" > "$1.ext"
    openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial \
        -out "$1.crt" -days 30 -extfile "$1.ext"
    rm "$1.csr" "$1.ext"
}
issue tollgate DNS:tollgate
issue envoy URI:spiffe://example.org/envoy
# The containers read the keys as non-root users.
chmod 644 ./*.key
echo "certificates in $(pwd)"
