// Package keyfile is the format of a gateway's private key file: an
// Ed25519 key in PKCS #8, in a PEM "PRIVATE KEY" block. mpi5k-gateway
// --gen-key writes one and the gateway's --key reads it (package gateway);
// mpi5k run makes one per site of a job and places it on the gateway host
// itself (package wrap).
package keyfile

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
)

// New makes an Ed25519 key pair and returns its public key and the text
// of the private key's file.
func New() (ed25519.PublicKey, []byte, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, nil, err
	}
	return pub, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// Parse reads the text of a key file.
func Parse(text []byte) (ed25519.PrivateKey, error) {
	b, _ := pem.Decode(text)
	if b == nil || b.Type != "PRIVATE KEY" {
		return nil, errors.New(`no PEM "PRIVATE KEY" block: not a key mpi5k-gateway --gen-key wrote`)
	}
	k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
	if err != nil {
		return nil, err
	}
	ek, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("a %T, want an Ed25519 key (mpi5k-gateway --gen-key)", k)
	}
	return ek, nil
}
